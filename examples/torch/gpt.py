"""A small GPT-style decoder in plain PyTorch, dense or mixture-of-experts.

The model is deliberately ordinary so that its tensors look like those of a
real HuggingFace Llama / Qwen-MoE checkpoint, which is what muonshard's planner
classifies (2-D and 3-D matrices go to Muon, embeddings / lm_head / norms /
router to AdamW):

    embed_tokens.weight                         [vocab, d_model]     AdamW
    embed_positions.weight                      [seq_len, d_model]   AdamW
    layers.0.input_layernorm.weight             [d_model]            AdamW
    layers.0.self_attn.{q,k,v,o}_proj.weight    [d_model, d_model]   Muon
    layers.0.post_attention_layernorm.weight    [d_model]            AdamW
    layers.0.mlp.{gate,up,down}_proj.weight     SwiGLU (dense)       Muon
    layers.0.mlp.gate.weight                    [n_experts, d_model] AdamW (MoE router)
    layers.0.mlp.experts.3.up_proj.weight       [d_ff, d_model]      Muon  (per-expert modules)
    layers.0.mlp.experts.gate_up_proj           [E, 2*d_ff, d_model] Muon  (stacked experts)
    layers.0.mlp.experts.down_proj              [E, d_model, d_ff]   Muon  (stacked experts)
    norm.weight                                 [d_model]            AdamW
    lm_head.weight                              [vocab, d_model]     AdamW

Every weight matrix is stored PyTorch-style as [out, in] (y = x @ W.T); the
stacked expert tensors are [E, out, in] per expert, like HF's fused experts.

The MoE routing is top-k (k = 2) with plain indexing and a loop over experts:
correct and deterministic, not fast. With d_ff meaning the per-expert
intermediate size, a MoE layer with E experts holds E times the MLP weights of
a dense one but computes only k of them per token.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class GPTConfig:
    vocab: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 344  # SwiGLU intermediate size (per expert when moe).
    seq_len: int = 64  # Longest sequence; the size of the position table.
    moe: bool = False
    n_experts: int = 4
    top_k: int = 2
    # MoE experts as one [E, ...] parameter per projection instead of E modules.
    stacked_experts: bool = False
    # Parameter dtype: torch.float32 (default) or torch.bfloat16.
    dtype: torch.dtype = torch.float32
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if self.moe and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k {self.top_k} must be in [1, n_experts {self.n_experts}]")


class RMSNorm(nn.Module):
    """RMS normalisation with a learned per-channel weight (Llama's)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the parameter dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q/k/v/o projections."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def heads(y):  # [b, t, d] -> [b, heads, t, head_dim]
            return y.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        probs = F.softmax(scores.float(), dim=-1).to(q.dtype)
        out = (probs @ v).transpose(1, 2).reshape(b, t, d)
        return self.o_proj(out)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): a dense MLP, and one expert of a MoE layer."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class StackedExperts(nn.Module):
    """All experts of a layer in two 3-D parameters (HF's fused layout).

    gate_up_proj [E, 2*d_ff, d_model] holds gate_proj and up_proj of expert e
    stacked along dim 1; down_proj [E, d_model, d_ff].
    """

    def __init__(self, n_experts: int, d_model: int, d_ff: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * d_ff, d_model))
        self.down_proj = nn.Parameter(torch.empty(n_experts, d_model, d_ff))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ self.gate_up_proj[e].t()).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ self.down_proj[e].t()


class MoE(nn.Module):
    """Top-k routed mixture of SwiGLU experts (Mixtral-style routing)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_experts = cfg.n_experts
        self.top_k = cfg.top_k
        self.gate = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)  # the router
        if cfg.stacked_experts:
            self.experts = StackedExperts(cfg.n_experts, cfg.d_model, cfg.d_ff)
        else:
            self.experts = nn.ModuleList(SwiGLU(cfg.d_model, cfg.d_ff) for _ in range(cfg.n_experts))

    def run_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.experts, StackedExperts):
            return self.experts.expert(e, x)
        return self.experts[e](x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # [T, d_model]
        logits = self.gate(tokens).float()  # [T, E]
        # Pick the top-k experts per token, then softmax over the chosen k.
        top_logits, top_experts = logits.topk(self.top_k, dim=-1)  # [T, k]
        weights = F.softmax(top_logits, dim=-1).to(x.dtype)
        out = torch.zeros_like(tokens)
        for e in range(self.n_experts):
            # Which tokens chose expert e, and in which of their k slots.
            token_idx, slot = (top_experts == e).nonzero(as_tuple=True)
            if token_idx.numel() == 0:
                continue  # Unused this batch: its parameters get no gradient.
            y = self.run_expert(e, tokens[token_idx]) * weights[token_idx, slot].unsqueeze(-1)
            out.index_add_(0, token_idx, y)
        return out.view(shape)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MoE(cfg) if cfg.moe else SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class GPT(nn.Module):
    """Token + learned position embeddings, pre-norm blocks, final norm, lm_head."""

    def __init__(self, cfg: GPTConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.d_model)
        self.embed_positions = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.reset_parameters(seed)
        self.to(cfg.dtype)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Deterministic init from `seed` alone (not torch's global RNG).

        Norm weights are 1; every other tensor is N(0, init_std), except the
        projections that write into the residual stream (o_proj, down_proj),
        which are scaled by 1/sqrt(2 * n_layers) as in GPT-2.
        """
        gen = torch.Generator().manual_seed(seed)
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.normal_(0.0, residual_std, generator=gen)
            else:
                p.normal_(0.0, self.cfg.init_std, generator=gen)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: [batch, t] token ids, t <= seq_len. Returns logits [batch, t, vocab]."""
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than seq_len {self.cfg.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.embed_tokens(idx) + self.embed_positions(pos)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (computed in fp32)."""
        logits = self(idx)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
