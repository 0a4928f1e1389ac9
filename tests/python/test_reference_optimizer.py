"""Checks of tests/python/reference_optimizer.py against hand-derived values.

Run: .venv/bin/python -m pytest tests/python/test_reference_optimizer.py -q
Expected values are derived independently (python float64 scalar arithmetic, numpy float32 where the
rounding itself is the point), never by calling the function under test a second time.
"""

import math
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference_optimizer as ro
from reference_optimizer import (
    IN_OUT,
    OUT_IN,
    ReferenceConfig,
    ReferenceOptimizer,
    newton_schulz,
    paddle_ep_holders,
    scale_factor,
)

SIMPLE = (3.4445, -4.7750, 2.0315)


def poly(s, abc):
    a, b, c = abc
    return a * s + b * s**3 + c * s**5


def poly_chain(s, coeffs, steps):
    """NS acts on each singular value independently: s -> a s + b s^3 + c s^5, coefficients cycled."""
    for i in range(steps):
        s = poly(s, coeffs[i % len(coeffs)])
    return s


def orthonormal(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))
    return q


# ------------------------------------------------------------------------------------------ NS


def test_ns_single_iteration_row_vector_by_hand():
    # [[3, 4]] / 5 = [[0.6, 0.8]]; A = X X^T = [[1]]; B = b + c; X' = (a + b + c) X = 0.701 X.
    out = newton_schulz(torch.tensor([[3.0, 4.0]]), steps=1)
    factor = 3.4445 - 4.7750 + 2.0315
    assert factor == pytest.approx(0.701)
    torch.testing.assert_close(out, torch.tensor([[0.6 * factor, 0.8 * factor]]), rtol=0, atol=1e-6)


def test_ns_single_iteration_diagonal_by_hand():
    # diag(3, 4) / 5 = diag(0.6, 0.8); each diagonal entry s -> a s + b s^3 + c s^5.
    # 0.6: 2.0667 - 1.0314 + 0.15796944 = 1.19326944;  0.8: 2.7556 - 2.4448 + 0.66568192 = 0.97648192
    out = newton_schulz(torch.diag(torch.tensor([3.0, 4.0])), steps=1)
    torch.testing.assert_close(out, torch.diag(torch.tensor([1.19326944, 0.97648192])), rtol=0, atol=1e-6)


def test_ns_single_iteration_full_2x2_by_hand():
    # X = [[1, 1], [0, 1]], ||X||_F = sqrt(3), Xn = X / sqrt(3)
    # A = Xn Xn^T = [[2, 1], [1, 1]] / 3;  A^2 = [[5, 3], [3, 2]] / 9
    a, b, c = SIMPLE
    r = 1 / math.sqrt(3)
    B = [[2 * b / 3 + 5 * c / 9, b / 3 + 3 * c / 9], [b / 3 + 3 * c / 9, b / 3 + 2 * c / 9]]
    Xn = [[r, r], [0.0, r]]
    expect = [[a * Xn[i][j] + B[i][0] * Xn[0][j] + B[i][1] * Xn[1][j] for j in range(2)] for i in range(2)]
    out = newton_schulz(torch.tensor([[1.0, 1.0], [0.0, 1.0]]), steps=1)
    torch.testing.assert_close(out, torch.tensor(expect, dtype=torch.float32), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "name,steps", [("simple", 5), ("quintic", 5), ("polar_express", 8), ("aol", 4), ("deepseekv4", 10)]
)
def test_ns_controlled_singular_values(name, steps):
    # X = Q diag(s) V^T: NS keeps Q and V and maps s/||s|| through the scalar polynomial chain.
    s = np.linspace(0.2, 1.0, 6)
    Q, V = orthonormal(6, 6, 1), orthonormal(10, 6, 2)
    X = (Q @ torch.diag(torch.tensor(s)) @ V.T).float()
    out = newton_schulz(X, steps=steps, coefficients=name)
    sn = s / math.sqrt(float((s**2).sum()))
    coeffs = ro.COEFFICIENT_SETS[name]
    expect = Q @ torch.diag(torch.tensor([poly_chain(float(v), coeffs, steps) for v in sn], dtype=torch.float64)) @ V.T
    torch.testing.assert_close(out.double(), expect, rtol=0, atol=2e-5)
    if name == "simple":
        sv = torch.linalg.svdvals(out.double())
        assert sv.min() > 0.6 and sv.max() < 1.3, sv


def test_ns_custom_coefficients_cycle():
    coeffs = [(1.5, -0.5, 0.0), (2.0, -1.5, 0.5)]
    X = torch.diag(torch.tensor([1.0, 2.0, 2.0]))
    out = newton_schulz(X, steps=3, coefficients=coeffs)
    expect = [poly_chain(v / 3.0, coeffs, 3) for v in (1.0, 2.0, 2.0)]
    torch.testing.assert_close(out, torch.diag(torch.tensor(expect, dtype=torch.float32)), rtol=0, atol=1e-6)


def test_ns_tall_is_transpose_of_wide():
    g = torch.Generator().manual_seed(3)
    W = torch.randn(5, 12, generator=g)
    torch.testing.assert_close(newton_schulz(W.T.contiguous()), newton_schulz(W).T, rtol=0, atol=1e-6)
    S = torch.randn(3, 4, 9, generator=g)
    torch.testing.assert_close(
        newton_schulz(S.transpose(1, 2).contiguous()), newton_schulz(S).transpose(1, 2), rtol=0, atol=1e-6
    )


def test_ns_is_scale_invariant_and_zero_safe():
    g = torch.Generator().manual_seed(4)
    W = torch.randn(4, 7, generator=g)
    torch.testing.assert_close(newton_schulz(W * 1000.0), newton_schulz(W), rtol=0, atol=5e-6)
    assert torch.equal(newton_schulz(torch.zeros(3, 5)), torch.zeros(3, 5))  # X / max(0, eps) = 0


def test_ns_3d_normalises_each_expert():
    g = torch.Generator().manual_seed(5)
    S = torch.randn(3, 4, 6, generator=g) * torch.tensor([1.0, 100.0, 0.01]).view(3, 1, 1)
    out = newton_schulz(S)
    for e in range(3):
        torch.testing.assert_close(out[e], newton_schulz(S[e]), rtol=0, atol=1e-6)


def test_ns_bf16_emulation_is_bf16_and_close():
    g = torch.Generator().manual_seed(6)
    W = torch.randn(8, 16, generator=g)
    out = newton_schulz(W, matmul="bf16")
    assert torch.equal(out, out.to(torch.bfloat16).float())
    assert (out - newton_schulz(W)).abs().max() < 0.05
    torch.testing.assert_close(newton_schulz(W, matmul="fp64"), newton_schulz(W), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------ scaling


def test_scale_factors_by_version_and_layout():
    # shape (4, 16): IN_OUT -> din 4, dout 16; OUT_IN -> din 16, dout 4
    assert scale_factor((4, 16), IN_OUT, 1) == pytest.approx(2.0)  # sqrt(max(1, 4))
    assert scale_factor((4, 16), IN_OUT, 2) == pytest.approx(2.0)  # sqrt(4)
    assert scale_factor((4, 16), IN_OUT, 3) == pytest.approx(4.0)  # sqrt(16)
    assert scale_factor((4, 16), OUT_IN, 1) == pytest.approx(1.0)  # sqrt(max(1, 1/4))
    assert scale_factor((4, 16), OUT_IN, 2) == pytest.approx(0.5)  # sqrt(1/4)
    assert scale_factor((4, 16), OUT_IN, 3) == pytest.approx(4.0)  # sqrt(max(4, 16))
    assert scale_factor((7, 4, 16), IN_OUT, 1) == pytest.approx(2.0)  # per expert block
    assert ro.in_out_dims((3, 5), IN_OUT) == (3, 5) and ro.in_out_dims((3, 5), OUT_IN) == (5, 3)
    with pytest.raises(ValueError):
        scale_factor((4, 16), OUT_IN, 4)


def test_defaults_match_doc():
    c = ReferenceConfig()
    assert (c.lr, c.weight_decay, c.momentum, c.nesterov, c.ns_steps, c.coefficients) == (
        0.02,
        0.01,
        0.95,
        True,
        5,
        "simple",
    )
    assert (c.eps, c.adamw_betas, c.scale_version, c.extra_scale) == (1e-9, (0.9, 0.95), 1, 0.2)
    assert c.decays("anything")


# --------------------------------------------------------------------------------------- Muon


def rank_one_grad():
    x = torch.tensor([1.0, 2.0, -1.0])
    y = torch.tensor([1.0, 0.0, 2.0, -1.0, 1.0, 1.0, -2.0, 0.5])
    g = torch.outer(x, y)  # exact in fp32
    return g, g.double() / (x.norm().double() * y.norm().double())  # unit-Frobenius direction, sigma 1


@pytest.mark.parametrize("layout,scale", [(OUT_IN, 1.0), (IN_OUT, math.sqrt(8 / 3))])
def test_muon_first_step_rank_one_closed_form(layout, scale):
    # Step 1: m = 0.05 g, u = 0.05 g + 0.95 m (positive multiple of g); NS(u) = p^5(1) * g/||g||.
    g, ghat = rank_one_grad()
    p0 = torch.linspace(-1, 1, 24).reshape(3, 8)
    ref = ReferenceOptimizer([("w", p0, layout)], {"w": "muon"})
    ref.step([{"w": g}])
    lr, wd = 0.02, 0.01
    p5 = poly_chain(1.0, [SIMPLE], 5)
    expect = p0.double() * (1 - lr * wd) - lr * 0.2 * scale * p5 * ghat
    torch.testing.assert_close(ref.masters["w"].double(), expect, rtol=0, atol=1e-6)
    torch.testing.assert_close(ref.momentum["w"].double(), 0.05 * g.double(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_second_step_nesterov_closed_form(nesterov):
    # g2 = -0.6 g1: m2 = 0.95*0.05 g1 - 0.05*0.6 g1 = 0.0175 g1 (> 0)
    # nesterov u2 = 0.05*(-0.6) g1 + 0.95*m2 = -0.013375 g1 (< 0): the update direction flips.
    g, ghat = rank_one_grad()
    p0 = torch.linspace(-1, 1, 24).reshape(3, 8)
    ref = ReferenceOptimizer([("w", p0)], {"w": "muon"}, ReferenceConfig(nesterov=nesterov))
    ref.step([{"w": g}])
    ref.step([{"w": -0.6 * g}])
    lr, wd, p5 = 0.02, 0.01, poly_chain(1.0, [SIMPLE], 5)
    sign2 = -1.0 if nesterov else 1.0
    p1 = p0.double() * (1 - lr * wd) - lr * 0.2 * p5 * ghat
    p2 = p1 * (1 - lr * wd) - lr * 0.2 * p5 * sign2 * ghat
    torch.testing.assert_close(ref.masters["w"].double(), p2, rtol=0, atol=1e-6)
    torch.testing.assert_close(ref.momentum["w"].double(), 0.0175 * g.double(), rtol=1e-5, atol=1e-8)


def test_muon_lerp_form_matches_expanded_form():
    g = torch.Generator().manual_seed(7)
    p0 = torch.randn(6, 10, generator=g)
    grads = [torch.randn(6, 10, generator=g) for _ in range(3)]
    runs = []
    for form in ("expanded", "lerp"):
        ref = ReferenceOptimizer([("w", p0)], {"w": "muon"}, ReferenceConfig(momentum_form=form))
        for gr in grads:
            ref.step({"w": gr})
        runs.append(ref)
    torch.testing.assert_close(runs[0].masters["w"], runs[1].masters["w"], rtol=0, atol=1e-6)
    torch.testing.assert_close(runs[0].momentum["w"], runs[1].momentum["w"], rtol=1e-6, atol=1e-7)


def test_muon_3d_stack_equals_each_expert_alone():
    g = torch.Generator().manual_seed(8)
    E = 3
    p0 = torch.randn(E, 4, 16, generator=g)
    scales = torch.tensor([1.0, 100.0, 0.01]).view(E, 1, 1)
    grads = [torch.randn(E, 4, 16, generator=g) * scales for _ in range(2)]
    stack = ReferenceOptimizer([("s", p0, IN_OUT)], {"s": "muon"})
    alone = ReferenceOptimizer([(f"s{e}", p0[e], IN_OUT) for e in range(E)], {f"s{e}": "muon" for e in range(E)})
    for gr in grads:
        stack.step({"s": gr})
        alone.step({f"s{e}": gr[e] for e in range(E)})
    for e in range(E):
        torch.testing.assert_close(stack.masters["s"][e], alone.masters[f"s{e}"], rtol=0, atol=1e-6)


# -------------------------------------------------------------------------------------- AdamW


def adamw_closed_form(p0, grads, lr=0.02, wd=0.01, b1=0.9, b2=0.95, eps=1e-9, decay=True):
    """float64 hand derivation: beta pows start at (b1, b2) and are multiplied AFTER each use."""
    p, m1, m2, b1p, b2p = p0, 0.0, 0.0, b1, b2
    for g in grads:
        if decay:
            p *= 1 - lr * wd
        m1 = b1 * m1 + (1 - b1) * g
        m2 = b2 * m2 + (1 - b2) * g * g
        p -= lr * (m1 / (1 - b1p)) / (math.sqrt(m2) / math.sqrt(1 - b2p) + eps)
        b1p, b2p = b1p * b1, b2p * b2
    return p, m1, m2


def test_adamw_scalar_closed_form_one_and_two_steps():
    p0, g1, g2 = 0.5, 0.3, -0.1
    ref = ReferenceOptimizer([("b", torch.tensor([p0]))], {"b": "adamw"})
    ref.step({"b": torch.tensor([g1])})
    p, m1, m2 = adamw_closed_form(p0, [g1])
    assert ref.masters["b"].item() == pytest.approx(p, rel=1e-6)
    assert ref.moment1["b"].item() == pytest.approx(m1, rel=1e-6)
    assert ref.moment2["b"].item() == pytest.approx(m2, rel=1e-6)
    f = np.float32
    assert ref.beta1_pow.item() == float(f(0.9) * f(0.9)) and ref.beta2_pow.item() == float(f(0.95) * f(0.95))
    ref.step({"b": torch.tensor([g2])})
    p, m1, m2 = adamw_closed_form(p0, [g1, g2])
    assert ref.masters["b"].item() == pytest.approx(p, rel=1e-6)
    assert ref.moment1["b"].item() == pytest.approx(m1, rel=1e-6)
    assert ref.moment2["b"].item() == pytest.approx(m2, rel=1e-6)
    # bias correction of step 2 uses 0.81 / 0.9025; the wrong order (0.729 / 0.857375) is far off
    wrong_p = 0.5 * (1 - 2e-4)
    assert abs(ref.masters["b"].item() - wrong_p) > 1e-3
    assert ref.beta1_pow.item() == pytest.approx(0.729, rel=1e-6)
    assert ref.step_count == 2


def test_adamw_denominator_form_at_tiny_gradient():
    # g = 1e-9 = eps: step 1 update = lr * g / (|g| + eps) = lr / 2 with the doc's denominator
    # sqrt(m2)/sqrt(1-b2p) + eps; (sqrt(m2) + eps)/sqrt(1-b2p) would give lr * 0.183.
    ref = ReferenceOptimizer(
        [("b", torch.tensor([1.0, -1.0]))], {"b": "adamw"}, ReferenceConfig(with_decay=lambda n: False)
    )
    ref.step({"b": torch.tensor([1e-9, -1e-9])})
    torch.testing.assert_close(
        ref.masters["b"].double(), torch.tensor([1.0 - 0.01, -1.0 + 0.01], dtype=torch.float64), rtol=0, atol=1e-6
    )


def test_adamw_vector_elementwise_and_lr_change():
    p0 = [0.25, -1.5, 2.0]
    g = [[0.1, 0.2, -0.3], [0.5, -0.05, 0.0]]
    ref = ReferenceOptimizer([("v", torch.tensor(p0))], {"v": "adamw"})
    ref.step({"v": torch.tensor(g[0])})
    ref.lr = 0.005  # scheduler: step 2 uses the new lr (for decay AND update)
    ref.step({"v": torch.tensor(g[1])})
    lr2 = 0.005
    for i in range(3):
        p, m1, m2 = adamw_closed_form(p0[i], [g[0][i]])  # step 1 at lr 0.02
        # step 2 by hand: new lr for decay and update, step-2 beta pows 0.81 / 0.9025
        p *= 1 - lr2 * 0.01
        m1 = 0.9 * m1 + 0.1 * g[1][i]
        m2 = 0.95 * m2 + 0.05 * g[1][i] ** 2
        p -= lr2 * (m1 / (1 - 0.81)) / (math.sqrt(m2) / math.sqrt(1 - 0.9025) + 1e-9)
        assert ref.masters["v"][i].item() == pytest.approx(p, rel=1e-6, abs=1e-7)


# ------------------------------------------------------------------------- decay, masters, dtypes


def test_weight_decay_skipped_when_with_decay_false():
    # zero gradients: AdamW update 0/(0+eps) = 0, Muon NS(0) = 0 -> only decay moves a master.
    tensors = [
        ("w", torch.full((4, 6), 0.75)),
        ("w_nd", torch.full((4, 6), 0.75)),
        ("b", torch.full((6,), -0.5)),
        ("b_nd", torch.full((6,), -0.5)),
    ]
    kinds = {"w": "muon", "w_nd": "muon", "b": "adamw", "b_nd": "adamw"}
    ref = ReferenceOptimizer(tensors, kinds, ReferenceConfig(with_decay=lambda n: not n.endswith("_nd")))
    ref.step({n: torch.zeros_like(t) for n, t in tensors})
    assert torch.equal(ref.masters["w_nd"], torch.full((4, 6), 0.75))
    assert torch.equal(ref.masters["b_nd"], torch.full((6,), -0.5))
    torch.testing.assert_close(
        ref.masters["w"].double(), torch.full((4, 6), 0.75 * (1 - 2e-4), dtype=torch.float64), rtol=1e-7, atol=0
    )
    torch.testing.assert_close(
        ref.masters["b"].double(), torch.full((6,), -0.5 * (1 - 2e-4), dtype=torch.float64), rtol=1e-7, atol=0
    )


def test_bf16_master_is_rounded_param_and_model_copy_rounds_to_nearest_even():
    v = torch.tensor([[1.0 + 2**-9, 3.14159265], [-0.1, 1e-3]])
    ref = ReferenceOptimizer(
        [("w", v, OUT_IN, torch.bfloat16), ("h", v.clone(), OUT_IN, torch.float16), ("f", v.clone())],
        {"w": "muon", "h": "muon", "f": "muon"},
    )
    m = ref.masters["w"]
    assert m.dtype == torch.float32
    assert torch.equal(m, m.to(torch.bfloat16).float())  # exactly representable in bf16
    assert m[0, 0].item() == 1.0 and m[0, 1].item() == 3.140625  # hand-rounded bf16 values
    assert torch.equal(ref.masters["h"], v.half().float()) and torch.equal(ref.masters["f"], v)
    # RNE ties: 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7 -> 1 (even);
    # 1 + 3*2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 -> 1 + 2^-6 (even)
    sd = ref.state_dict()
    sd["w/master"] = torch.tensor([[1 + 2**-8, 1 + 3 * 2**-8], [-(1 + 2**-8), 2.0]])
    ref.load_state_dict(sd)
    mc = ref.model_copy("w")
    assert mc.dtype == torch.bfloat16
    assert mc.float().tolist() == [[1.0, 1 + 2**-6], [-1.0, 2.0]]
    assert ref.model_copy("h").dtype == torch.float16 and ref.model_copy("f").dtype == torch.float32
    ref.step({"w": torch.ones(2, 2), "h": torch.ones(2, 2), "f": torch.ones(2, 2)})
    assert torch.equal(ref.model_copy("w"), ref.masters["w"].to(torch.bfloat16))
    assert not torch.equal(ref.masters["w"], ref.masters["w"].to(torch.bfloat16).float())  # master keeps fp32


# ---------------------------------------------------------------------------------- averaging


def test_averaging_sums_left_to_right_then_divides():
    f = np.float32
    loc = [{"x": torch.tensor([1e8, 1.0])}, {"x": torch.tensor([1.0, 1.0])}, {"x": torch.tensor([-1e8, 2.0])}]
    ref = ReferenceOptimizer([("x", torch.zeros(2))], {"x": "adamw"})
    g = ref.averaged_gradient(loc, "x")
    # ((1e8 + 1) + -1e8) = 0 in fp32 (1e8 + 1 rounds to 1e8); (1 + 1 + 2) / 3 as an fp32 division
    assert g.tolist() == [0.0, float(f(4.0) / f(3.0))]


def test_paddle_ep_holders_layout():
    h = paddle_ep_holders(4, ep=2, n_experts=4, fused_stacks=["mlp.experts_stack"], expert_index={"moe.w_special": 1})
    assert h("embed_tokens.weight") == [0, 1, 2, 3]
    # rank = ms*2 + e; expert j held by e == j // (4 // 2)
    assert h("layers.0.mlp.experts.0.up.weight") == [0, 2]
    assert h("layers.0.mlp.experts.1.up.weight") == [0, 2]
    assert h("layers.0.mlp.experts.3.up.weight") == [1, 3]
    assert h("moe.w_special") == [0, 2]
    assert h("mlp.experts_stack") == [(0, 2, [0, 2]), (2, 4, [1, 3])]
    assert paddle_ep_holders(4, ep=1, n_experts=4)("layers.0.mlp.experts.3.up.weight") == [0, 1, 2, 3]
    h8 = paddle_ep_holders(16, ep=8, n_experts=16)  # doc §4.3 example: e = r % 8
    assert h8("a.experts.5.w") == [2, 10]


def test_step_averages_expert_grads_over_holders_only():
    g = torch.Generator().manual_seed(9)
    names = ["dense.weight", "layers.0.mlp.experts.3.up.weight", "mlp.experts_stack", "norm.weight"]
    shapes = {names[0]: (6, 8), names[1]: (4, 6), names[2]: (4, 3, 5), names[3]: (8,)}
    kinds = {names[0]: "muon", names[1]: "muon", names[2]: "muon", names[3]: "adamw"}
    tensors = [(n, torch.randn(*shapes[n], generator=g)) for n in names]
    holders = paddle_ep_holders(4, ep=2, n_experts=4, fused_stacks=["mlp.experts_stack"])
    local = [{n: torch.randn(*shapes[n], generator=g) for n in names} for _ in range(4)]
    for r in (0, 2):  # non-holders of expert 3: garbage that must be ignored
        local[r][names[1]] = torch.full(shapes[names[1]], 1e6)
    local[3][names[2]] = local[3][names[2]][2:4].clone()  # a slice-shaped local grad is accepted too
    local_full3 = torch.cat([torch.full((2, 3, 5), 1e6), local[3][names[2]]])

    def mean(ts):  # fp32 numpy, left to right, true division
        acc = ts[0].numpy().astype(np.float32)
        for t in ts[1:]:
            acc = acc + t.numpy().astype(np.float32)
        return torch.from_numpy(acc / np.float32(len(ts)))

    expect = {
        names[0]: mean([local[r][names[0]] for r in range(4)]),
        names[1]: mean([local[1][names[1]], local[3][names[1]]]),
        names[2]: torch.cat(
            [
                mean([local[0][names[2]][0:2], local[2][names[2]][0:2]]),
                mean([local[1][names[2]][2:4], local_full3[2:4]]),
            ]
        ),
        names[3]: mean([local[r][names[3]] for r in range(4)]),
    }
    ref = ReferenceOptimizer(tensors, kinds, holders=holders)
    for n in names:
        assert torch.equal(ref.averaged_gradient(local, n), expect[n]), n
    single = ReferenceOptimizer(tensors, kinds)
    ref.step(local)
    single.step([expect])
    for n in names:
        assert torch.equal(ref.masters[n], single.masters[n]), n


def test_missing_holder_gradient_is_an_error():
    ref = ReferenceOptimizer(
        [("a.experts.1.w", torch.zeros(2, 2))],
        {"a.experts.1.w": "muon"},
        holders=paddle_ep_holders(2, ep=2, n_experts=2),
    )
    with pytest.raises(KeyError):
        ref.step([{"a.experts.1.w": torch.zeros(2, 2)}, {}])  # rank 1 holds expert 1 but sent nothing
    ref.step([{}, {"a.experts.1.w": torch.zeros(2, 2)}])  # rank 0 is not a holder: fine


# ------------------------------------------------------------------------------------ resume


def test_resume_from_state_dict_is_bitwise_identical():
    g = torch.Generator().manual_seed(10)
    tensors = [
        ("w", torch.randn(6, 4, generator=g), OUT_IN, torch.bfloat16),
        ("s", torch.randn(2, 3, 5, generator=g), IN_OUT),
        ("b", torch.randn(5, generator=g), OUT_IN, torch.float16),
    ]
    kinds = {"w": "muon", "s": "muon", "b": "adamw"}
    grads = [
        {"w": torch.randn(6, 4, generator=g), "s": torch.randn(2, 3, 5, generator=g), "b": torch.randn(5, generator=g)}
        for _ in range(5)
    ]
    lrs = [0.02, 0.02, 0.015, 0.01, 0.005]
    straight = ReferenceOptimizer(tensors, kinds)
    first = ReferenceOptimizer(tensors, kinds)
    for k in range(5):
        straight.lr = lrs[k]
        straight.step(grads[k])
    for k in range(3):
        first.lr = lrs[k]
        first.step(grads[k])
    sd = first.state_dict()
    assert set(sd) == {
        "w/master",
        "w/momentum",
        "s/master",
        "s/momentum",
        "b/master",
        "b/moment1",
        "b/moment2",
        "beta1_pow",
        "beta2_pow",
        "step",
        "lr",
    }
    assert int(sd["step"]) == 3 and float(sd["lr"]) == 0.015
    resumed = ReferenceOptimizer.from_state_dict(tensors, kinds, sd)
    assert resumed.step_count == 3 and resumed.lr == 0.015
    for k in range(3, 5):
        resumed.lr = lrs[k]
        resumed.step(grads[k])
    a, b = straight.state_dict(), resumed.state_dict()
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    for n in ("w", "s", "b"):
        assert torch.equal(straight.model_copy(n), resumed.model_copy(n))


def test_zero_dim_adamw_tensor_keeps_its_shape():
    ref = ReferenceOptimizer([("t", torch.tensor(0.5))], {"t": "adamw"})
    ref.step({"t": torch.tensor(0.3)})
    assert ref.masters["t"].shape == () and ref.masters["t"].item() == pytest.approx(
        adamw_closed_form(0.5, [0.3])[0], rel=1e-6
    )


def test_constructor_validation():
    with pytest.raises(ValueError):
        ReferenceOptimizer([("v", torch.zeros(3))], {"v": "muon"})  # Muon needs 2-D / 3-D
    with pytest.raises(ValueError):
        ReferenceOptimizer([("v", torch.zeros(3))], {})
    with pytest.raises(ValueError):
        ReferenceOptimizer([("v", torch.zeros(3, 3), "ROW")], {"v": "muon"})
