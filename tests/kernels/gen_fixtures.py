#!/usr/bin/env python3
"""Writes the kernel test fixtures under tests/kernels/fixtures/.

An independent NumPy (float64) implementation of the published algorithms,
written from the formulas in docs/reference/paddle_internals.md §3 and not from the C++:

* Newton–Schulz: Paddle's `_zeropower_via_newtonschulz5` (Keller Jordan's
  iteration with a coefficient schedule cycled per step).
* Muon update: Paddle `_muon_update` with the update applied to the fp32 master.
* AdamW: Paddle's fused `adamw_` kernel (beta powers start at beta, advance
  after use).
* bf16: round-to-nearest-even, computed here from the neighbouring bf16 values
  rather than with the bit trick the C++ uses.

Inputs are float32 values (what the kernels read); references are computed in
float64 from those values. Coefficients and hyper-parameters are first rounded
to float32, the precision the kernels hold them in, so the fixtures differ
from the kernels only by fp32 arithmetic error.

Run with Debian's python3-numpy:  /usr/bin/python3 tests/kernels/gen_fixtures.py
The output is deterministic (fixed seeds); the C++ tests only read the files.
"""

import os

import numpy as np

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

COEFFS = {
    "simple": [(3.4445, -4.7750, 2.0315)],
    "quintic": [
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ],
    "polar_express": [
        (8.2051, -22.9019, 16.4607),
        (4.0664, -2.8612, 0.5184),
        (3.9096, -2.8234, 0.5250),
        (3.2856, -2.4153, 0.4853),
        (2.2779, -1.6198, 0.3985),
        (1.8726, -1.2307, 0.3585),
        (1.8564, -1.2132, 0.3568),
        (1.8750, -1.2500, 0.3750),
    ],
    "aol": [(4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254), (2.7215, -3.0494, 1.3169)],
    "deepseekv4": [(3.4445, -4.7750, 2.0315)] * 8 + [(2.0, -1.5, 0.5)] * 2,
}
CUSTOM = [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]


def f32(x):
    """The float32 value of x, as a float64."""
    return float(np.float32(x))


def f32_schedule(schedule):
    return [tuple(f32(v) for v in abc) for abc in schedule]


# ---------------------------------------------------------------- algorithms
def newton_schulz(g, steps, schedule, eps):
    """Orthogonalises one matrix (float64)."""
    x = np.array(g, dtype=np.float64)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / max(np.sqrt(np.sum(x * x)), eps)
    for i in range(steps):
        a, b, c = schedule[i % len(schedule)]
        gram = x @ x.T
        poly = b * gram + c * (gram @ gram)
        x = a * x + poly @ x
    return x.T if transposed else x


def muon_scale(rows, cols, layout, version, extra):
    dout, din = (rows, cols) if layout == "OUT_IN" else (cols, rows)
    if version == 1:
        s = np.sqrt(max(1.0, dout / din))
    elif version == 2:
        s = np.sqrt(dout / din)
    else:
        s = np.sqrt(max(dout, din))
    return s * extra


def muon_update(grad, mom, master, shape, layout, opt):
    batch, rows, cols = shape
    beta = opt["beta"]
    mom = beta * mom + (1 - beta) * grad
    u = (1 - beta) * grad + beta * mom if opt["nesterov"] else mom
    ortho = np.stack([newton_schulz(u[e], opt["steps"], opt["schedule"], opt["eps"]) for e in range(batch)])
    if opt["with_decay"]:
        master = master * (1 - opt["lr"] * opt["wd"])
    scale = muon_scale(rows, cols, layout, opt["version"], opt["extra"])
    master = master - opt["lr"] * scale * ortho
    return mom, master


def adamw_step(grad, master, m1, m2, b1p, b2p, opt):
    lr, b1, b2, eps = opt["lr"], opt["beta1"], opt["beta2"], opt["eps"]
    if opt["with_decay"]:
        master = master * (1 - lr * opt["wd"])
    m1 = b1 * m1 + (1 - b1) * grad
    m2 = b2 * m2 + (1 - b2) * grad * grad
    denom = np.sqrt(m2) / np.sqrt(1 - b2p) + eps
    master = master - lr / (1 - b1p) * m1 / denom
    return master, m1, m2, b1p * b1, b2p * b2


def bf16_bits(values):
    """Round-to-nearest-even float32 -> bf16 bits, from the two neighbours."""
    out = []
    for v in np.asarray(values, dtype=np.float32).reshape(-1):
        u = int(np.array(v, dtype=np.float32).view(np.uint32))
        if np.isnan(v):
            out.append((u >> 16) | 0x40)
            continue
        low = u >> 16  # Truncation: the neighbour towards zero.
        high = low + 1  # The next bf16 away from zero (may be infinity).
        x = abs(float(v))
        low_mag = abs(float(np.array(low << 16, dtype=np.uint32).view(np.float32)))
        if np.isinf(v) or x == low_mag:
            out.append(low)
            continue
        if (high & 0x7FFF) == 0x7F80:
            # Past the largest finite bf16 the next step is 2^128 (which then
            # overflows to infinity), not infinity itself.
            high_mag = 2.0**128
        else:
            high_mag = abs(float(np.array(high << 16, dtype=np.uint32).view(np.float32)))
        if x - low_mag < high_mag - x:
            out.append(low)
        elif x - low_mag > high_mag - x:
            out.append(high)
        else:
            out.append(low if low % 2 == 0 else high)
    return out


# -------------------------------------------------------------------- writer
class FixtureFile:
    def __init__(self, name):
        self.path = os.path.join(OUT_DIR, name)
        self.lines = ["# Generated by tests/kernels/gen_fixtures.py; do not edit."]

    def case(self, name, attrs, tensors):
        self.lines.append(f"case {name}")
        for key, value in attrs.items():
            self.lines.append(f"attr {key} {value}")
        for key, (kind, values) in tensors.items():
            flat = np.asarray(values).reshape(-1)
            self.lines.append(f"tensor {key} {flat.size}")
            if kind == "int":
                text = [str(int(v)) for v in flat]
            else:
                text = ["%.9g" % float(v) for v in flat]
            for i in range(0, len(text), 8):
                self.lines.append(" ".join(text[i : i + 8]))
        self.lines.append("end")

    def write(self):
        with open(self.path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def f32_array(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# --------------------------------------------------------------------- cases
def ns_fixtures():
    out = FixtureFile("newton_schulz.txt")
    rng = np.random.default_rng(20240401)
    eps = f32(1e-9)
    cases = [
        # name, batch, rows, cols, coefficient set, steps
        ("simple_square", 1, 8, 8, "simple", 5),
        ("simple_wide", 1, 5, 12, "simple", 5),
        ("simple_tall", 1, 13, 6, "simple", 5),
        ("simple_1x1", 1, 1, 1, "simple", 5),
        ("simple_row", 1, 1, 7, "simple", 5),
        ("simple_column", 1, 9, 1, "simple", 5),
        ("simple_batch", 3, 6, 10, "simple", 5),
        ("simple_tall_batch", 2, 11, 4, "simple", 5),
        ("simple_past_tile", 1, 66, 90, "simple", 5),
        ("simple_tall_past_tile", 1, 90, 66, "simple", 5),
        ("quintic", 1, 12, 20, "quintic", 5),
        ("polar_express", 1, 16, 16, "polar_express", 8),
        ("aol", 1, 10, 24, "aol", 4),
        ("deepseekv4", 1, 8, 8, "deepseekv4", 10),
        ("custom", 1, 7, 9, "custom", 3),
        ("zero_steps", 1, 4, 6, "simple", 0),
    ]
    for name, batch, rows, cols, coeff_name, steps in cases:
        schedule = f32_schedule(CUSTOM if coeff_name == "custom" else COEFFS[coeff_name])
        g = f32_array(rng, (batch, rows, cols))
        expected = np.stack([newton_schulz(g[e], steps, schedule, eps) for e in range(batch)])
        attrs = {"batch": batch, "rows": rows, "cols": cols, "coefficients": coeff_name, "steps": steps}
        if coeff_name == "custom":
            attrs["custom"] = ",".join("%r" % v for abc in CUSTOM for v in abc)
        out.case(name, attrs, {"input": ("float", g), "expected": ("float", expected)})
    out.write()


def muon_fixtures():
    out = FixtureFile("muon_update.txt")
    rng = np.random.default_rng(20240402)
    cases = [
        # name, batch, rows, cols, layout, version, nesterov, with_decay
        ("out_in_v1_nesterov", 1, 6, 10, "OUT_IN", 1, True, True),
        ("in_out_v1_nesterov", 1, 10, 6, "IN_OUT", 1, True, True),
        ("out_in_v1_tall", 1, 12, 5, "OUT_IN", 1, True, True),
        ("in_out_v2_plain_momentum", 1, 9, 4, "IN_OUT", 2, False, False),
        ("out_in_v3_experts", 3, 4, 7, "OUT_IN", 3, True, True),
    ]
    for name, batch, rows, cols, layout, version, nesterov, with_decay in cases:
        opt = {
            "beta": f32(0.95),
            "nesterov": nesterov,
            "lr": f32(0.02),
            "wd": f32(0.1),
            "with_decay": with_decay,
            "version": version,
            "extra": f32(0.2),
            "steps": 5,
            "schedule": f32_schedule(COEFFS["simple"]),
            "eps": f32(1e-9),
        }
        shape = (batch, rows, cols)
        grad = f32_array(rng, shape, 0.01)
        mom = f32_array(rng, shape, 0.01)
        master = f32_array(rng, shape, 0.05)
        mom_out, master_out = muon_update(
            grad.astype(np.float64), mom.astype(np.float64), master.astype(np.float64), shape, layout, opt
        )
        out.case(
            name,
            {
                "batch": batch,
                "rows": rows,
                "cols": cols,
                "layout": layout,
                "version": version,
                "nesterov": int(nesterov),
                "with_decay": int(with_decay),
                "beta": 0.95,
                "lr": 0.02,
                "weight_decay": 0.1,
                "extra_scale": 0.2,
            },
            {
                "grad": ("float", grad),
                "momentum": ("float", mom),
                "master": ("float", master),
                "expected_momentum": ("float", mom_out),
                "expected_master": ("float", master_out),
                "expected_model": ("int", bf16_bits(master_out.astype(np.float32))),
            },
        )
    out.write()


def adamw_fixtures():
    out = FixtureFile("adamw.txt")
    rng = np.random.default_rng(20240403)
    cases = [
        # name, n, steps, with_decay, fresh state
        ("decay_three_steps", 37, 3, True, True),
        ("no_decay_warm_state", 19, 2, False, False),
    ]
    for name, n, steps, with_decay, fresh in cases:
        opt = {
            "lr": f32(1e-3),
            "beta1": f32(0.9),
            "beta2": f32(0.95),
            "eps": f32(1e-9),
            "wd": f32(0.01),
            "with_decay": with_decay,
        }
        master = f32_array(rng, n, 0.1)
        if fresh:
            m1 = np.zeros(n, np.float32)
            m2 = np.zeros(n, np.float32)
            b1p, b2p = opt["beta1"], opt["beta2"]
        else:
            m1 = f32_array(rng, n, 0.01)
            m2 = np.abs(f32_array(rng, n, 1e-4))
            b1p, b2p = f32(0.9**6), f32(0.95**6)
        grads = f32_array(rng, (steps, n), 0.01)
        tensors = {
            "master": ("float", master),
            "moment1": ("float", m1),
            "moment2": ("float", m2),
            "grads": ("float", grads),
        }
        p, a, b = (x.astype(np.float64) for x in (master, m1, m2))
        bp1, bp2 = b1p, b2p
        for s in range(steps):
            p, a, b, bp1, bp2 = adamw_step(grads[s].astype(np.float64), p, a, b, bp1, bp2, opt)
        tensors.update(
            {
                "expected_master": ("float", p),
                "expected_moment1": ("float", a),
                "expected_moment2": ("float", b),
                "expected_model": ("int", bf16_bits(p.astype(np.float32))),
            }
        )
        out.case(
            name,
            {
                "n": n,
                "steps": steps,
                "with_decay": int(with_decay),
                "lr": 1e-3,
                "beta1": 0.9,
                "beta2": 0.95,
                "eps": 1e-9,
                "weight_decay": 0.01,
                "beta1_pow": "%.9g" % b1p,
                "beta2_pow": "%.9g" % b2p,
                "expected_beta1_pow": "%.9g" % np.float32(bp1),
                "expected_beta2_pow": "%.9g" % np.float32(bp2),
            },
            tensors,
        )
    out.write()


def bf16_fixtures():
    out = FixtureFile("bf16.txt")
    rng = np.random.default_rng(20240404)
    special_bits = [
        0x00000000,
        0x80000000,  # +-0
        0x3F800000,
        0xBF800000,  # +-1
        0x3F808000,  # 1 + half a bf16 ulp: tie, rounds to even (down)
        0x3F818000,  # tie with odd lower neighbour: rounds up
        0x3F808001,  # just above the tie: rounds up
        0x3F807FFF,  # just below the tie: rounds down
        0x7F7FFFFF,  # FLT_MAX rounds to +inf
        0x7F7F7FFF,  # largest float that stays finite
        0x7F800000,
        0xFF800000,  # +-inf
        0x7FC00000,
        0xFFC00001,  # quiet NaNs
        0x7F800001,  # signalling NaN with only a low mantissa bit
        0x00000001,
        0x00008000,
        0x00018000,
        0x007FFFFF,  # subnormals
        0x00800000,  # smallest normal
    ]
    specials = np.array(special_bits, dtype=np.uint32).view(np.float32)
    randoms = np.concatenate([f32_array(rng, 64), f32_array(rng, 32, 1e-30), f32_array(rng, 32, 1e30)])
    values = np.concatenate([specials, randoms]).astype(np.float32)
    out.case(
        "round_to_nearest_even",
        {},
        {
            "input_bits": ("int", values.view(np.uint32)),
            "expected_bits": ("int", bf16_bits(values)),
        },
    )
    out.write()


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    ns_fixtures()
    muon_fixtures()
    adamw_fixtures()
    bf16_fixtures()


if __name__ == "__main__":
    main()
