"""One rank of a per-block Newton-Schulz run (launched by test_ns_blocks_step.py
with RANK / WORLD_SIZE set, as torchrun would): a small model with a fused QKV
(GQA sizes) and fused expert gate_up stacks (gpt-oss's alternating columns,
gate | up rows), stepped by ShardedMuonAdamW on deterministic gradients; writes
its state_dict and parameters to OUT/rank-R.pt. The fixture (TENSORS,
NS_BLOCKS, initial values, gradients) is shared with the test."""

import argparse
import os
import sys
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, EXPERTS = 16, 4, 2, 4, 12, 4
QKV_ROWS = [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM]  # q | k | v, GQA

# (name, shape, dtype)
TENSORS = [
    ("layers.0.qkv_proj.weight", (sum(QKV_ROWS), HIDDEN), torch.float32),
    ("layers.0.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM), torch.bfloat16),
    ("layers.0.experts.gate_up_proj", (EXPERTS, HIDDEN, 2 * FFN), torch.float32),  # gpt-oss [E, H, 2I]
    ("layers.0.experts.w13", (EXPERTS, 2 * FFN, HIDDEN), torch.bfloat16),  # [gate | up] rows
    ("layers.0.experts.down_proj", (EXPERTS, HIDDEN, FFN), torch.float32),
    ("layers.0.norm.weight", (HIDDEN,), torch.float32),
]

NS_BLOCKS = {
    "layers.0.qkv_proj.weight": {"axis": "rows", "sizes": QKV_ROWS},
    "layers.0.experts.gate_up_proj": {"axis": "cols", "stride": 2},
    "layers.0.experts.w13": {"axis": "rows", "sizes": [FFN, FFN]},
}


def _generator(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def initial_value(name, shape, dtype, seed):
    return torch.randn(shape, generator=_generator("init", name, seed)).to(dtype)


def gradient(name, shape, rank, step, seed):
    """Rank `rank`'s fp32 gradient of `name` at `step`."""
    return torch.randn(shape, generator=_generator("grad", name, rank, step, seed))


def parameters(seed):
    return [(n, torch.nn.Parameter(initial_value(n, s, d, seed))) for n, s, d in TENSORS]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--version", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--save-dir")
    ap.add_argument("--save-at", type=int, default=-1)
    ap.add_argument("--resume-dir")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    import muonshard.torch as mst

    params = parameters(a.seed)
    opt = mst.ShardedMuonAdamW(
        params,
        coordinator=a.coordinator,
        job=a.job,
        plan_version=a.version,
        lr=0.02,
        blas_threads=1,
        comm_timeout=60,
        join_timeout=30,
    )
    start = opt.load_checkpoint(a.resume_dir) if a.resume_dir else 0
    for step in range(start, a.steps):
        for name, p in params:
            p.grad = gradient(name, tuple(p.shape), rank, step, a.seed).to(p.dtype)
        opt.step()
        opt.zero_grad()
        if step + 1 == a.save_at:
            opt.save_checkpoint(a.save_dir)
    result = {"state": opt.state_dict(), "params": {n: p.detach().clone() for n, p in params}, "rank": opt.rank}
    torch.save(result, os.path.join(a.out, "rank-%d.pt" % rank))
    opt.close()


if __name__ == "__main__":
    main()
