"""The models of the sharded-optimizer tests: deterministic parameters and
per-rank gradients, shared by the per-rank program (sharded_rank.py) and the
reference side of the tests, so both see the same numbers.

Kinds:
  dense   attention + SwiGLU MLP, two layers; layer 1 in bfloat16 (bf16 masters)
  moe     a router and 4 per-expert MLPs (`mlp.experts.N.*`) per layer
  stack   the experts as fused 3-D stacks (`mlp.experts.gate_up_proj` [4, 2I, H])

Under expert parallelism (ep > 1) a rank's module holds the dense tensors and
its own experts: per-expert tensors of experts [e·E/ep, (e+1)·E/ep), and that
slice of each stack (e = rank % ep, Paddle's layout with pp = 1).
"""

import zlib

import torch

HIDDEN = 32
VOCAB = 64
FFN = 48
EXPERTS = 4
EXPERT_FFN = 24


def _specs(kind):
    """(name, shape, dtype) of every tensor, in module order."""
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN), torch.float32)]
    for layer in range(2):
        dtype = torch.bfloat16 if (kind == "dense" and layer == 1) else torch.float32
        p = "model.layers.%d." % layer
        out += [
            (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN), dtype),
            (p + "self_attn.k_proj.weight", (HIDDEN // 2, HIDDEN), dtype),
            (p + "self_attn.v_proj.weight", (HIDDEN // 2, HIDDEN), dtype),
            (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN), dtype),
        ]
        if kind == "dense":
            out += [
                (p + "mlp.gate_proj.weight", (FFN, HIDDEN), dtype),
                (p + "mlp.up_proj.weight", (FFN, HIDDEN), dtype),
                (p + "mlp.down_proj.weight", (HIDDEN, FFN), dtype),
            ]
        elif kind == "moe":
            out.append((p + "mlp.gate.weight", (EXPERTS, HIDDEN), torch.float32))
            for e in range(EXPERTS):
                q = p + "mlp.experts.%d." % e
                out += [
                    (q + "gate_proj.weight", (EXPERT_FFN, HIDDEN), dtype),
                    (q + "up_proj.weight", (EXPERT_FFN, HIDDEN), dtype),
                    (q + "down_proj.weight", (HIDDEN, EXPERT_FFN), dtype),
                ]
        elif kind == "stack":
            out += [
                (p + "mlp.gate.weight", (EXPERTS, HIDDEN), torch.float32),
                (p + "mlp.experts.gate_up_proj", (EXPERTS, 2 * EXPERT_FFN, HIDDEN), dtype),
                (p + "mlp.experts.down_proj", (EXPERTS, HIDDEN, EXPERT_FFN), dtype),
            ]
        else:
            raise ValueError("unknown model kind %r" % kind)
        out += [
            (p + "input_layernorm.weight", (HIDDEN,), dtype),
            (p + "post_attention_layernorm.weight", (HIDDEN,), dtype),
        ]
    out += [("model.norm.weight", (HIDDEN,), torch.float32), ("lm_head.weight", (VOCAB, HIDDEN), torch.float32)]
    return out


def _generator(*key):
    g = torch.Generator()
    g.manual_seed(zlib.crc32(repr(key).encode()))
    return g


def initial_value(name, shape, dtype, seed):
    """The full tensor's initial value, in its dtype."""
    if name.endswith("norm.weight"):
        value = 1.0 + 0.1 * torch.randn(shape, generator=_generator("init", seed, name))
    else:
        value = torch.randn(shape, generator=_generator("init", seed, name)) / (shape[-1] ** 0.5)
    return value.to(dtype)


def gradient(name, shape, rank, step, seed):
    """Rank `rank`'s local fp32 gradient of the full tensor at `step`; None for
    the final norm on odd ranks at step 1 (a parameter without a gradient)."""
    if name == "model.norm.weight" and rank % 2 == 1 and step == 1:
        return None
    return torch.randn(shape, generator=_generator("grad", seed, name, rank, step)) * 0.1


def stacks(kind):
    return [n for n, s, _ in _specs(kind) if len(s) == 3]


def expert_of(name):
    """The expert index of a per-expert tensor, else None."""
    parts = name.split(".")
    if "experts" in parts:
        i = parts.index("experts")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def full_tensors(kind, seed):
    """[(name, initial value)] of the whole model (the reference's view)."""
    return [(n, initial_value(n, s, d, seed)) for n, s, d in _specs(kind)]


def local_slice(name, shape, rank, ep):
    """The [begin, end) experts of a stack this rank holds, or None for a whole tensor."""
    if len(shape) != 3 or ep == 1:
        return None
    per = shape[0] // ep
    e = rank % ep
    return e * per, (e + 1) * per


def holds(name, rank, ep):
    expert = expert_of(name)
    if expert is None or ep == 1:
        return True
    return expert // (EXPERTS // ep) == rank % ep


def local_parameters(kind, seed, rank, ep):
    """[(name, nn.Parameter)] of rank `rank`'s module."""
    out = []
    for name, shape, dtype in _specs(kind):
        if not holds(name, rank, ep):
            continue
        value = initial_value(name, shape, dtype, seed)
        part = local_slice(name, shape, rank, ep)
        if part is not None:
            value = value[part[0] : part[1]].clone()
        out.append((name, torch.nn.Parameter(value)))
    return out


def local_gradient(name, full_shape, rank, step, seed, ep):
    g = gradient(name, full_shape, rank, step, seed)
    part = local_slice(name, full_shape, rank, ep)
    if g is None or part is None:
        return g
    return g[part[0] : part[1]].clone()


def specs(kind):
    return _specs(kind)
