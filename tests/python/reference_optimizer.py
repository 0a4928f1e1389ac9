"""Independent pure-PyTorch reference of one muonshard optimizer step (Muon + AdamW, Paddle "NEW").

Written only from ``docs/reference/paddle_internals.md`` §3 (cited below as "§3.x") and the plan
semantics of the test brief; it deliberately shares no code with ``kernels/`` or ``worker/``.
Runs on the pinned torch (python/requirements.txt), CPU.  All arithmetic is fp32 unless stated otherwise.

Public API
==========

``ReferenceConfig(...)``                       hyper-parameters; defaults are §3.1 (see the dataclass).
``ReferenceOptimizer(tensors, kinds, config=None, holders=None, ns_blocks=None)``
    ``tensors``: list of ``(name, value)``, ``(name, value, layout)`` or ``(name, value, layout, dtype)``;
    the model dtype is ``dtype`` if given, else ``value.dtype`` (bf16 / fp16 / fp32); ``layout`` is
    ``"OUT_IN"`` (default, PyTorch nn.Linear ``[out, in]``) or ``"IN_OUT"`` (Paddle ``[in, out]``).
    ``kinds``: ``{name: "muon" | "adamw"}`` (the caller classifies; Muon tensors must be 2-D or 3-D).
    ``holders``: ``None`` (every rank of ``local_grads`` holds every tensor) or a callable
    ``name -> Holding`` (see ``average_over_holders``); ``paddle_ep_holders`` builds one.
    ``ns_blocks``: ``{name: spec}`` for fused Muon matrices orthogonalised block by block, a spec as
    ``manifest_from_module(ns_blocks=...)`` takes it: ``{"axis": "rows"|"cols", "sizes": [...],
    "groups": n}`` (groups default 1) or ``{"axis": "rows"|"cols", "stride": n}``.
  ``.step(local_grads)``        one step; ``local_grads`` is a list over ranks of ``{name: tensor}``
                                (full shape, cast to fp32), or one dict (= a single rank).
  ``.averaged_gradient(local_grads, name)``  the fp32 gradient the step would use for ``name``.
  ``.holding(name, world)``     the ``Holding`` used for ``name`` (all ``world`` ranks when ``holders`` is None).
  ``.masters``                  ``{name: fp32 tensor}`` (the fp32 master weights).
  ``.momentum``                 ``{name: fp32}`` Muon momentum (Paddle ``moment1_0`` of a Muon param).
  ``.moment1`` / ``.moment2``   ``{name: fp32}`` AdamW moments.
  ``.beta1_pow`` / ``.beta2_pow`` fp32 tensors of shape [1]: the ONE pair shared by all AdamW tensors.
  ``.step_count``               number of steps taken.
  ``.lr``                       python float, settable between steps (LR schedulers).
  ``.model_copy(name)``         master cast to the model dtype (round-to-nearest-even); ``.model_copies()``.
  ``.state_dict()``             plain ``{str: tensor}``: ``"<name>/master"``, ``"<name>/momentum"`` (Muon),
                                ``"<name>/moment1"``, ``"<name>/moment2"`` (AdamW), ``"beta1_pow"``,
                                ``"beta2_pow"`` (fp32 [1]), ``"step"`` (int64 0-d), ``"lr"`` (fp64 0-d).
  ``.load_state_dict(sd)``; ``ReferenceOptimizer.from_state_dict(tensors, kinds, sd, config, holders)``
                                (values in ``tensors`` are then only used for shape / dtype).

Building blocks (usable on their own):
``newton_schulz(X, steps=5, eps=1e-9, coefficients="simple", matmul="fp32")``   §3.3, 2-D or batched 3-D.
``in_out_dims(shape, layout) -> (din, dout)``;  ``scale_factor(shape, layout, version) -> float``  §3.4.
``orthogonalize(u, layout, config)``             NS + scaling (per expert for 3-D).
``muon_update(master, momentum, grad, lr, layout, with_decay, config, blocks=None) -> (master, momentum)``
                                                 §3.5 NEW; ``blocks``: per-block NS (below).
``block_indices(spec, length) -> [LongTensor]``  the index lists of a fused matrix's blocks along its axis.
``orthogonalize_blocked(u, layout, config, spec)``  NS + scaling of each block on its own (Paddle's qkv /
                                                 gate_up split modes: the scale from the block's own shape).
``adamw_update(master, m1, m2, grad, lr, beta1_pow, beta2_pow, with_decay, config) -> (master, m1, m2)`` §3.6.
``average_over_holders(local_grads, name, holding, shape) -> fp32``;
``paddle_ep_holders(world_size, ep=1, n_experts=None, expert_index=None, fused_stacks=()) -> callable``.

Resolved ambiguities / precision choices (each is a 1-ulp-level matter, written down so that a comparison
at ~1e-7 knows what it compares against):
* Scalars: every hyper-parameter enters the tensor arithmetic as an fp32 scalar.  Paddle's Muon does
  ``lerp(m, g, 1-beta)`` with ``1-beta`` computed by Python in double, so the Muon weights are
  ``f32(beta)`` and ``f32(1.0 - beta)``.  The AdamW kernel receives ``beta1/beta2`` as float attributes
  and computes ``1 - beta`` in fp32, so AdamW uses ``f32(1) - f32(beta)`` (note
  ``f32(1)-f32(0.9) != f32(0.1)``).  ``lr`` is an fp32 tensor in NEW (§3.5), so ``f32(lr)`` everywhere;
  decay factors are ``f32(1) - f32(lr)*f32(wd)`` evaluated in fp32.
* Momentum lerps (§3.5): default ``momentum_form="expanded"`` uses the doc's right-hand sides literally,
  ``m = beta*m + (1-beta)*g`` and ``u = (1-beta)*g + beta*m``.  ``momentum_form="lerp"`` uses
  ``torch.lerp(m, g, 1-beta)`` / ``torch.lerp(g, m, beta)`` (the two-branch lerp formula).
* Scaling (§3.4): ``U * scale * extra`` evaluated left to right, ``(U*f32(scale))*f32(extra)``, with
  ``scale`` computed in double by ``math.sqrt``.  ``din/dout`` are the block's own last two dims; for
  ``IN_OUT`` ``din=shape[-2], dout=shape[-1]``, for ``OUT_IN`` they swap.  Versions other than 1/2/3 raise.
* AdamW (§3.6): ``p -= lr * (m1/(1-b1p)) / (sqrt(m2)/sqrt(1-b2p) + eps)`` evaluated as written
  (Python precedence: ``(lr*(m1/(1-b1p))) / denom``); ``g^2`` as ``g*g``.  Beta pows start at
  ``f32(beta)`` and are multiplied by ``f32(beta)`` after the step.
* Muon and AdamW decay use ``with_decay(name)`` (NEW semantics); decay then update, both on the master.
* NS normalisation is ``X / max(||X||_F, eps)`` per matrix, in fp32 (the Frobenius-norm reduction order
  is torch's).  ``matmul="fp32"`` (default) runs every matmul in fp32; ``matmul="bf16"`` is an
  EMULATION (nice-to-have, approximate): X is rounded to bf16 after normalisation, every matmul takes
  bf16 inputs, accumulates in fp32, and each addmm result (``A``, ``B``, new ``X``) is rounded once to
  bf16 (cuBLAS-style fp32 epilogue); the result is returned as fp32 holding bf16 values and the
  scaling/update then run in fp32.  ``matmul="fp64"`` is a diagnostic mode (everything in float64,
  result rounded to fp32) for judging fp32 GEMM error.
* Gradient averaging: fp32 sum over the holders in ascending rank order, left to right
  ``((g0+g1)+g2)+...``, then a true IEEE division by the count (no reciprocal multiply).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

OUT_IN = "OUT_IN"
IN_OUT = "IN_OUT"
MUON = "muon"
ADAMW = "adamw"

_F32 = torch.float32
_MODEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# §3.3 coefficient sets (a, b, c), cycled as coeffs[i % len(coeffs)].
COEFFICIENT_SETS: dict[str, list[tuple[float, float, float]]] = {
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
    "aol": [
        (4.0098, -7.0585, 2.4635),
        (3.4585, -5.5479, 2.5959),
        (2.7573, -3.2939, 1.4254),
        (2.7215, -3.0494, 1.3169),
    ],
    "deepseekv4": [(3.4445, -4.7750, 2.0315)] * 8 + [(2.0, -1.5, 0.5)] * 2,
}

Coefficients = str | Sequence[tuple[float, float, float]]
# A tensor's holders: ascending ranks holding all of it, or, for a fused 3-D expert stack,
# [(start, stop, ranks), ...] expert ranges along dim 0, each averaged over its own ranks.
Holding = Sequence[int] | Sequence[tuple[int, int, Sequence[int]]]


def f32(x: float) -> torch.Tensor:
    """A python number as a 0-d fp32 tensor (round to nearest)."""
    return torch.tensor(x, dtype=_F32)


@dataclass
class ReferenceConfig:
    """Hyper-parameters; defaults are Paddle Muon's constructor defaults (§3.1)."""

    lr: float = 0.02  # one learning rate drives Muon and AdamW
    weight_decay: float = 0.01
    momentum: float = 0.95  # Muon beta
    nesterov: bool = True
    ns_steps: int = 5
    coefficients: Coefficients = "simple"  # a §3.3 name or a custom [(a, b, c), ...]
    eps: float = 1e-9  # adam_epsilon, ALSO the NS normalisation eps (§3.1)
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    scale_version: int = 1
    extra_scale: float = 0.2  # muon_extra_scale_factor
    with_decay: Callable[[str], bool] | None = None  # None: every tensor decays
    ns_matmul: str = "fp32"  # "fp32" | "bf16" (emulated, approximate) | "fp64" (diagnostic)
    momentum_form: str = "expanded"  # "expanded" | "lerp" (see module docstring)

    def decays(self, name: str) -> bool:
        return True if self.with_decay is None else bool(self.with_decay(name))


# --------------------------------------------------------------------------------------------
# Newton–Schulz (§3.3)
# --------------------------------------------------------------------------------------------


def resolve_coefficients(coefficients: Coefficients) -> list[tuple[float, float, float]]:
    if isinstance(coefficients, str):
        if coefficients not in COEFFICIENT_SETS:
            raise ValueError(f"unknown coefficient set {coefficients!r}")
        return list(COEFFICIENT_SETS[coefficients])
    out = [tuple(float(v) for v in abc) for abc in coefficients]
    if not out or any(len(abc) != 3 for abc in out):
        raise ValueError("custom coefficients must be a non-empty list of (a, b, c)")
    return out  # type: ignore[return-value]


def _bf16(x: torch.Tensor) -> torch.Tensor:
    """Round an fp32 tensor to bf16 (RNE) and back to fp32 (exact)."""
    return x.to(torch.bfloat16).to(_F32)


def newton_schulz(
    X: torch.Tensor,
    steps: int = 5,
    eps: float = 1e-9,
    coefficients: Coefficients = "simple",
    matmul: str = "fp32",
) -> torch.Tensor:
    """§3.3 ``_zeropower_via_newtonschulz5``.  X: [M, N] or a batch [E, M, N] (each matrix separately).

    Returns an fp32 tensor of X's shape.
    """
    if X.dim() not in (2, 3):
        raise ValueError(f"newton_schulz expects a 2-D or 3-D tensor, got shape {tuple(X.shape)}")
    if matmul not in ("fp32", "bf16", "fp64"):
        raise ValueError(f"unknown matmul mode {matmul!r}")
    coeffs = resolve_coefficients(coefficients)
    squeeze = X.dim() == 2
    X = X.to(_F32)
    if squeeze:
        X = X.unsqueeze(0)
    # "if rows > cols: X = X^T (last two dims); transposed = True"
    transposed = X.shape[-2] > X.shape[-1]
    if transposed:
        X = X.transpose(-2, -1)
    X = X.contiguous()
    # "X = X / max(||X||_F, eps)" per [M, N] slice, in the input dtype (fp32).
    norm = torch.linalg.vector_norm(X, ord=2, dim=(-2, -1), keepdim=True)
    denom = torch.maximum(norm, torch.full_like(norm, eps))
    X = X / denom.expand_as(X)

    if matmul == "fp32" or matmul == "fp64":
        if matmul == "fp64":
            X = X.to(torch.float64)
        for i in range(steps):
            a, b, c = coeffs[i % len(coeffs)]
            A = torch.matmul(X, X.transpose(-2, -1))  # A = X @ X^T
            B = b * A + c * torch.matmul(A, A)  # B = b*A + c*(A @ A)
            X = a * X + torch.matmul(B, X)  # X = a*X + B @ X
        X = X.to(_F32)
    else:
        # bf16 EMULATION (nice-to-have): "X = X.astype(bf16)"; bf16 operands, fp32 accumulation,
        # one rounding to bf16 per matmul/addmm output.
        X = _bf16(X)
        for i in range(steps):
            a, b, c = coeffs[i % len(coeffs)]
            A = _bf16(torch.matmul(X, X.transpose(-2, -1)))
            B = _bf16(b * A + c * torch.matmul(A, A))
            X = _bf16(a * X + torch.matmul(B, X))
    if transposed:
        X = X.transpose(-2, -1)
    X = X.contiguous()
    return X.squeeze(0) if squeeze else X


# --------------------------------------------------------------------------------------------
# Scaling (§3.4)
# --------------------------------------------------------------------------------------------


def in_out_dims(shape: Sequence[int], layout: str = OUT_IN) -> tuple[int, int]:
    """(din, dout) of a matrix block.  Paddle's formula is for [in, out] (IN_OUT): din = shape[-2],
    dout = shape[-1]; for OUT_IN (PyTorch [out, in]) the roles swap."""
    if layout == IN_OUT:
        return int(shape[-2]), int(shape[-1])
    if layout == OUT_IN:
        return int(shape[-1]), int(shape[-2])
    raise ValueError(f"unknown layout {layout!r}")


def scale_factor(shape: Sequence[int], layout: str = OUT_IN, version: int = 1) -> float:
    """§3.4 scale WITHOUT the extra factor: v1 sqrt(max(1, dout/din)); v2 sqrt(dout/din);
    v3 sqrt(max(dout, din))."""
    din, dout = in_out_dims(shape, layout)
    if version == 1:
        return math.sqrt(max(1.0, dout / din))
    if version == 2:
        return math.sqrt(dout / din)
    if version == 3:
        return math.sqrt(max(dout, din))
    raise ValueError(f"unsupported scale version {version}")


def orthogonalize(u: torch.Tensor, layout: str, config: ReferenceConfig) -> torch.Tensor:
    """NS + scaling of a Muon update.  2-D: one block.  3-D [E, r, c]: per expert (per-expert
    normalisation via the batched NS, per-expert scale from the [r, c] block shape)."""
    U = newton_schulz(u, config.ns_steps, config.eps, config.coefficients, config.ns_matmul)
    s = scale_factor(U.shape, layout, config.scale_version)  # uses shape[-2:], i.e. the block
    return (U * f32(s)) * f32(config.extra_scale)  # "U * scale * extra"


def block_indices(spec: Mapping, length: int) -> list[torch.Tensor]:
    """The blocks of a fused matrix along its blocked axis (of ``length``), as index lists: ``sizes``
    consecutive blocks repeated ``groups`` times, or ``stride`` interleaved blocks (block j holds the
    indices i with i % stride == j)."""
    if "stride" in spec:
        stride = int(spec["stride"])
        if stride <= 0 or length % stride:
            raise ValueError(f"stride {stride} does not divide {length}")
        return [torch.arange(j, length, stride) for j in range(stride)]
    sizes = [int(x) for x in spec["sizes"]]
    groups = int(spec.get("groups", 1) or 1)
    if sum(sizes) * groups != length:
        raise ValueError(f"sizes {sizes} x {groups} do not tile {length}")
    blocks, at = [], 0
    for _ in range(groups):
        for size in sizes:
            blocks.append(torch.arange(at, at + size))
            at += size
    return blocks


def orthogonalize_blocked(u: torch.Tensor, layout: str, config: ReferenceConfig, spec: Mapping) -> torch.Tensor:
    """``orthogonalize`` of each block on its own (per expert for 3-D): the block's rows (axis "rows",
    dimension -2) or columns ("cols", dimension -1) taken out, orthogonalised and scaled by the
    block's own shape, and put back in place."""
    axis = str(spec["axis"]).lower()
    if axis not in ("rows", "cols"):
        raise ValueError(f"unknown axis {spec['axis']!r}")
    dim = u.dim() - 2 if axis == "rows" else u.dim() - 1
    out = torch.empty_like(u)
    for idx in block_indices(spec, u.shape[dim]):
        out.index_copy_(dim, idx, orthogonalize(u.index_select(dim, idx), layout, config))
    return out


# --------------------------------------------------------------------------------------------
# Muon update (§3.5, NEW) and AdamW (§3.6, NEW = fused adamw_ kernel)
# --------------------------------------------------------------------------------------------


def muon_update(
    master: torch.Tensor,
    momentum: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    layout: str,
    with_decay: bool,
    config: ReferenceConfig,
    blocks: Mapping | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Muon step on an fp32 master; returns (new master, new momentum). ``blocks``: a fused
    matrix's spec (``orthogonalize_blocked``); None orthogonalises each matrix whole."""
    beta = config.momentum
    g = grad.to(_F32)  # "g = grad.astype(fp32)"
    if config.momentum_form == "expanded":
        w_old, w_new = f32(beta), f32(1.0 - beta)
        m = w_old * momentum + w_new * g  # "m = lerp(m, g, 1-beta) = beta*m + (1-beta)*g"
        # "u = lerp(g, m, beta) = (1-beta)*g + beta*m if nesterov else m"
        u = (w_new * g + w_old * m) if config.nesterov else m
    elif config.momentum_form == "lerp":
        m = torch.lerp(momentum, g, 1.0 - beta)
        u = torch.lerp(g, m, beta) if config.nesterov else m
    else:
        raise ValueError(f"unknown momentum_form {config.momentum_form!r}")
    if blocks is None:
        U = orthogonalize(u, layout, config)  # "ortho(B) = _scaling_fn(NS(B), version, extra)"
    else:
        U = orthogonalize_blocked(u, layout, config, blocks)
    lr32 = f32(lr)
    p = master
    if with_decay:
        p = p * (f32(1.0) - lr32 * f32(config.weight_decay))  # "master *= 1-lr*wd"
    p = p - U * lr32  # "master -= U*lr"
    return p, m


def adamw_update(
    master: torch.Tensor,
    m1: torch.Tensor,
    m2: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    beta1_pow: torch.Tensor,
    beta2_pow: torch.Tensor,
    with_decay: bool,
    config: ReferenceConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step (Paddle adamw_ kernel semantics, §3.6) using the CURRENT beta pows (the
    caller multiplies them by the betas afterwards).  Returns (new master, new m1, new m2)."""
    one = f32(1.0)
    b1, b2 = f32(config.adamw_betas[0]), f32(config.adamw_betas[1])
    lr32 = f32(lr)  # "lr_eff = lr*lr_ratio" with lr_ratio = 1
    eps = f32(config.eps)
    g = grad.to(_F32)
    p = master
    if with_decay:
        p = p * (one - lr32 * f32(config.weight_decay))  # "p *= (1 - lr_eff*coeff) only if with_decay"
    m1 = b1 * m1 + (one - b1) * g  # "m1 = b1 m1 + (1-b1) g"
    m2 = b2 * m2 + (one - b2) * (g * g)  # "m2 = b2 m2 + (1-b2) g^2"
    denom = torch.sqrt(m2) / torch.sqrt(one - beta2_pow) + eps  # "(sqrt(m2)/sqrt(1-b2p) + eps)"
    p = p - lr32 * (m1 / (one - beta1_pow)) / denom  # "p -= lr * (m1/(1-b1p)) / (...)"
    return p.reshape(master.shape), m1, m2  # (a 0-d master must not pick up the [1] of the pows)


# --------------------------------------------------------------------------------------------
# Gradient averaging over holders
# --------------------------------------------------------------------------------------------


def _is_range_holding(holding: Holding) -> bool:
    return len(holding) > 0 and isinstance(holding[0], (tuple, list))


def _mean_in_rank_order(parts: list[torch.Tensor]) -> torch.Tensor:
    acc = parts[0].to(_F32).clone()
    for t in parts[1:]:
        acc = acc + t.to(_F32)  # ((g0 + g1) + g2) + ...
    return acc / torch.full_like(acc, float(len(parts)))  # true division by the count


def average_over_holders(
    local_grads: Sequence[Mapping[str, torch.Tensor]],
    name: str,
    holding: Holding,
    shape: Sequence[int],
) -> torch.Tensor:
    """Mean of ``name``'s local gradients over its holders (see ``Holding``).  For a range holding,
    a rank's gradient may be full-shape (its [start, stop) rows are used) or slice-shaped."""

    def local(rank: int) -> torch.Tensor:
        if rank < 0 or rank >= len(local_grads):
            raise KeyError(f"{name}: holder rank {rank} has no local gradients (world {len(local_grads)})")
        if name not in local_grads[rank]:
            raise KeyError(f"{name}: holder rank {rank} has no gradient for it")
        return local_grads[rank][name]

    shape = tuple(int(d) for d in shape)
    if not _is_range_holding(holding):
        ranks = list(holding)  # type: ignore[arg-type]
        if not ranks:
            raise ValueError(f"{name}: no holders")
        if ranks != sorted(set(ranks)):
            raise ValueError(f"{name}: holders must be ascending and distinct, got {ranks}")
        parts = [local(r) for r in ranks]
        for r, t in zip(ranks, parts, strict=True):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: rank {r} gradient shape {tuple(t.shape)} != {shape}")
        return _mean_in_rank_order(parts)

    out = torch.empty(shape, dtype=_F32)
    covered = 0
    for start, stop, ranks in sorted(holding, key=lambda h: h[0]):  # type: ignore[index]
        if start != covered or stop <= start:
            raise ValueError(f"{name}: expert ranges must tile [0, {shape[0]}) contiguously")
        ranks = list(ranks)
        if not ranks or ranks != sorted(set(ranks)):
            raise ValueError(f"{name}: holders of [{start}, {stop}) must be ascending, distinct, non-empty")
        parts = []
        for r in ranks:
            t = local(r)
            if tuple(t.shape) == shape:
                t = t[start:stop]
            elif tuple(t.shape) != (stop - start,) + shape[1:]:
                raise ValueError(
                    f"{name}: rank {r} gradient shape {tuple(t.shape)} fits neither the "
                    f"stack {shape} nor its slice [{start}, {stop})"
                )
            parts.append(t)
        out[start:stop] = _mean_in_rank_order(parts)
        covered = stop
    if covered != shape[0]:
        raise ValueError(f"{name}: expert ranges cover [0, {covered}) of {shape[0]}")
    return out


_EXPERT_RE = re.compile(r"experts\.(\d+)\.")


def paddle_ep_holders(
    world_size: int,
    ep: int = 1,
    n_experts: int | None = None,
    expert_index: Mapping[str, int] | None = None,
    fused_stacks: Sequence[str] | Mapping[str, int] = (),
) -> Callable[[str], Holding]:
    """Holders under Paddle's rank layout with pp = 1 (§4.3): rank = ms*ep + e.

    * non-expert tensor: all ``world_size`` ranks;
    * expert tensor of expert j (``expert_index[name]``, else ``experts.<j>.`` in the name):
      the ranks with ``e == j // (n_experts // ep)``;
    * fused stack ``[n, r, c]`` (``fused_stacks``: names, or {name: n}; n defaults to ``n_experts``):
      ``[(e*n/ep, (e+1)*n/ep, ranks with that e) for e in range(ep)]``.
    """
    if ep < 1 or world_size % ep != 0:
        raise ValueError(f"world_size {world_size} is not a multiple of ep {ep}")
    moe_sharding = world_size // ep
    all_ranks = list(range(world_size))
    stacks = dict(fused_stacks) if isinstance(fused_stacks, Mapping) else {s: n_experts for s in fused_stacks}

    def ranks_of(e: int) -> list[int]:
        return [ms * ep + e for ms in range(moe_sharding)]

    def holders(name: str) -> Holding:
        if name in stacks:
            n = stacks[name]
            if n is None or n % ep != 0:
                raise ValueError(f"{name}: expert count {n} not divisible by ep {ep}")
            per = n // ep
            return [(e * per, (e + 1) * per, ranks_of(e)) for e in range(ep)]
        j = expert_index.get(name) if expert_index is not None else None
        if j is None:
            m = _EXPERT_RE.search(name)
            j = int(m.group(1)) if m else None
        if j is None:
            return all_ranks
        if n_experts is None or n_experts % ep != 0:
            raise ValueError(f"{name}: n_experts {n_experts} must be given and divisible by ep {ep}")
        return ranks_of(j // (n_experts // ep))

    return holders


# --------------------------------------------------------------------------------------------
# The optimizer
# --------------------------------------------------------------------------------------------

TensorSpec = tuple[str, torch.Tensor] | tuple[str, torch.Tensor, str] | tuple[str, torch.Tensor, str, torch.dtype]


class ReferenceOptimizer:
    """See the module docstring."""

    def __init__(
        self,
        tensors: Sequence[TensorSpec],
        kinds: Mapping[str, str],
        config: ReferenceConfig | None = None,
        holders: Callable[[str], Holding] | None = None,
        ns_blocks: Mapping[str, Mapping] | None = None,
    ):
        self.config = config if config is not None else ReferenceConfig()
        self.holders = holders
        self.ns_blocks: dict[str, Mapping] = dict(ns_blocks or {})
        self.names: list[str] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.layouts: dict[str, str] = {}
        self.kinds: dict[str, str] = {}
        self.masters: dict[str, torch.Tensor] = {}
        self.momentum: dict[str, torch.Tensor] = {}
        self.moment1: dict[str, torch.Tensor] = {}
        self.moment2: dict[str, torch.Tensor] = {}
        for spec in tensors:
            name, value = spec[0], spec[1]
            layout = spec[2] if len(spec) > 2 else OUT_IN
            dtype = spec[3] if len(spec) > 3 else value.dtype
            if name in self.shapes:
                raise ValueError(f"duplicate tensor {name!r}")
            if dtype not in _MODEL_DTYPES:
                raise ValueError(f"{name}: unsupported dtype {dtype}")
            if layout not in (OUT_IN, IN_OUT):
                raise ValueError(f"{name}: unknown layout {layout!r}")
            kind = kinds.get(name)
            if kind not in (MUON, ADAMW):
                raise ValueError(f"{name}: kind must be 'muon' or 'adamw', got {kind!r}")
            if kind == MUON and value.dim() not in (2, 3):
                raise ValueError(f"{name}: a Muon tensor must be 2-D or 3-D, got {tuple(value.shape)}")
            self.names.append(name)
            self.shapes[name] = tuple(value.shape)
            self.dtypes[name] = dtype
            self.layouts[name] = layout
            self.kinds[name] = kind
            # Master = float32(param rounded to its dtype).
            self.masters[name] = value.detach().to(dtype).to(_F32).clone()
            zeros = torch.zeros(value.shape, dtype=_F32)
            if kind == MUON:
                self.momentum[name] = zeros
            else:
                self.moment1[name] = zeros.clone()
                self.moment2[name] = zeros.clone()
        for name in self.ns_blocks:
            if self.kinds.get(name) != MUON:
                raise ValueError(f"ns_blocks: {name!r} is not a Muon tensor")
        # ONE pair of beta pows, initialised to the betas, multiplied after use.
        self.beta1_pow = torch.full((1,), self.config.adamw_betas[0], dtype=_F32)
        self.beta2_pow = torch.full((1,), self.config.adamw_betas[1], dtype=_F32)
        self.step_count = 0
        self.lr = float(self.config.lr)

    # ---- views -------------------------------------------------------------------------------
    def model_copy(self, name: str) -> torch.Tensor:
        """What the model sees: the master cast to the tensor's dtype (RNE)."""
        return self.masters[name].to(self.dtypes[name])

    def model_copies(self) -> dict[str, torch.Tensor]:
        return {n: self.model_copy(n) for n in self.names}

    def holding(self, name: str, world: int) -> Holding:
        return list(range(world)) if self.holders is None else self.holders(name)

    def averaged_gradient(self, local_grads, name: str) -> torch.Tensor:
        local_grads = [local_grads] if isinstance(local_grads, Mapping) else list(local_grads)
        return average_over_holders(local_grads, name, self.holding(name, len(local_grads)), self.shapes[name])

    # ---- the step ------------------------------------------------------------------------------
    def step(self, local_grads) -> None:
        local_grads = [local_grads] if isinstance(local_grads, Mapping) else list(local_grads)
        grads = {n: self.averaged_gradient(local_grads, n) for n in self.names}
        cfg = self.config
        # Two passes (§3.6): all Muon params first, then all AdamW params.
        for n in self.names:
            if self.kinds[n] == MUON:
                self.masters[n], self.momentum[n] = muon_update(
                    self.masters[n],
                    self.momentum[n],
                    grads[n],
                    self.lr,
                    self.layouts[n],
                    cfg.decays(n),
                    cfg,
                    self.ns_blocks.get(n),
                )
        for n in self.names:
            if self.kinds[n] == ADAMW:
                self.masters[n], self.moment1[n], self.moment2[n] = adamw_update(
                    self.masters[n],
                    self.moment1[n],
                    self.moment2[n],
                    grads[n],
                    self.lr,
                    self.beta1_pow,
                    self.beta2_pow,
                    cfg.decays(n),
                    cfg,
                )
        self.beta1_pow = self.beta1_pow * f32(cfg.adamw_betas[0])
        self.beta2_pow = self.beta2_pow * f32(cfg.adamw_betas[1])
        self.step_count += 1

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        sd: dict[str, torch.Tensor] = {}
        for n in self.names:
            sd[f"{n}/master"] = self.masters[n].clone()
            if self.kinds[n] == MUON:
                sd[f"{n}/momentum"] = self.momentum[n].clone()
            else:
                sd[f"{n}/moment1"] = self.moment1[n].clone()
                sd[f"{n}/moment2"] = self.moment2[n].clone()
        sd["beta1_pow"] = self.beta1_pow.clone()
        sd["beta2_pow"] = self.beta2_pow.clone()
        sd["step"] = torch.tensor(self.step_count, dtype=torch.int64)
        sd["lr"] = torch.tensor(self.lr, dtype=torch.float64)
        return sd

    def load_state_dict(self, sd: Mapping[str, torch.Tensor]) -> None:
        def get(key: str, shape) -> torch.Tensor:
            if key not in sd:
                raise KeyError(f"state dict lacks {key!r}")
            t = sd[key].to(_F32).clone()
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"{key}: shape {tuple(t.shape)} != {tuple(shape)}")
            return t

        for n in self.names:
            self.masters[n] = get(f"{n}/master", self.shapes[n])
            if self.kinds[n] == MUON:
                self.momentum[n] = get(f"{n}/momentum", self.shapes[n])
            else:
                self.moment1[n] = get(f"{n}/moment1", self.shapes[n])
                self.moment2[n] = get(f"{n}/moment2", self.shapes[n])
        self.beta1_pow = get("beta1_pow", (1,))
        self.beta2_pow = get("beta2_pow", (1,))
        self.step_count = int(sd["step"]) if "step" in sd else 0
        if "lr" in sd:
            self.lr = float(sd["lr"])

    @classmethod
    def from_state_dict(
        cls,
        tensors: Sequence[TensorSpec],
        kinds: Mapping[str, str],
        sd: Mapping[str, torch.Tensor],
        config: ReferenceConfig | None = None,
        holders: Callable[[str], Holding] | None = None,
        ns_blocks: Mapping[str, Mapping] | None = None,
    ) -> ReferenceOptimizer:
        opt = cls(tensors, kinds, config=config, holders=holders, ns_blocks=ns_blocks)
        opt.load_state_dict(sd)
        return opt
