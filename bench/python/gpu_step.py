#!/usr/bin/python3
"""The optimizer step of `muonshard.torch` on one GPU against plain torch, measured (not a test).

Issue 34 (b): on one model in one process on one GPU, in one run,
  1. `ShardedMuonAdamW(backend="nccl")` at world 1 (NCCL refuses two ranks on one
     GPU): the parameters are CUDA tensors viewing the optimizer's fused buffers,
     Newton-Schulz runs as the project's CUDA kernels (bf16 by default, batched
     over a bucket's same-shape matrices);
  2. plain single-GPU torch: `torch.optim.Muon` (KellerJordan's Newton-Schulz in
     bf16, one matrix at a time) for the same Muon matrices, `torch.optim.AdamW`
     (fused) for the rest, with the same hyper-parameters.
Each step's wall time is `opt.step()` between two `torch.cuda.synchronize()`
(gradients copied in before, untimed); medians over the timed steps after the
warm-up. Also reports the host copies muonshard made in its steps (goal: 0).

Prints one JSON object (and a markdown line): device, model, tensors,
elements, muonshard_ms, torch_ms, ratio (muonshard / torch; goal <= 1),
host_copies_in_steps, and muonshard's own phases.

Usage: python3 bench/python/gpu_step.py [--config tests/importer/configs/gemma-3-1b-it.config.json]
         [--dtype bf16|fp32] [--steps 20] [--warmup 3]
Needs: a CUDA device, torch >= 2.9 (torch.optim.Muon), the package and binaries on
PYTHONPATH / MUONSHARD_BIN_DIR (scripts/gpu/bundle.sh run sets them).
"""

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

from step_overhead import set_grads  # this script's folder is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LR, WD, BETAS, EPS, MOMENTUM = 0.02, 0.1, (0.9, 0.95), 1e-8, 0.95


def manifest_of(config):
    """The manifest `muonshardctl import-hf` makes of a Hugging Face config."""
    import muonshard

    out = subprocess.run(
        [muonshard.find_binary("muonshardctl"), "import-hf", config],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def make_tensors(manifest, dtype, device):
    """Seeded parameters and gradients of every tensor, on `device`."""
    import torch

    g = torch.Generator(device=device).manual_seed(1)
    params, grads = [], []
    for t in manifest["tensors"]:
        shape = [int(d) for d in t["shape"]]
        p = torch.randn(shape, generator=g, device=device, dtype=torch.float32).mul_(0.02).to(dtype)
        params.append((t["name"], torch.nn.Parameter(p)))
        grads.append(torch.randn(shape, generator=g, device=device, dtype=torch.float32).mul_(0.01).to(dtype))
    return params, grads


def time_steps(step, params, grads, warmup, steps):
    """Median milliseconds of step() between CUDA synchronisations."""
    import torch

    times = []
    for i in range(warmup + steps):
        set_grads(params, grads)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_muonshard(manifest, args, device):
    """muonshard at world 1: (median ms, Muon tensor names, host copies in the steps, phase medians)."""

    import muonshard
    import muonshard.torch as mst

    params, grads = make_tensors(manifest, args.torch_dtype, device)
    with muonshard.LocalCoordinator(heartbeat_timeout=30) as coord:
        version = muonshard.Coordinator(coord.address).submit(manifest, world_size=1)
        opt = mst.ShardedMuonAdamW(
            params,
            coordinator=coord.address,
            job="gpu-step",
            plan_version=version,
            rank=0,
            backend="nccl",
            lr=LR,
            weight_decay=WD,
            betas=BETAS,
            eps=EPS,
            muon_momentum=MOMENTUM,
            nesterov=True,
            ns_coefficients="simple",
        )
        muon = {h["name"] for h in opt.held_tensors if h["optimizer"] == "MUON"}
        copies = opt.host_copies
        phases = []

        def step():
            opt.step()
            phases.append(opt.last_step_stats)

        ms = time_steps(step, params, grads, args.warmup, args.steps)
        copies = opt.host_copies - copies
        opt.close()
    timed = phases[args.warmup :]
    keys = ("reduce_seconds", "muon_seconds", "adamw_seconds", "sync_seconds", "total_seconds")
    medians = {k: statistics.median(s[k] for s in timed) * 1e3 for k in keys if all(k in s for s in timed)}
    return ms, muon, copies, medians


def run_torch(manifest, args, device, muon):
    """torch.optim.Muon (bf16 Newton-Schulz, per matrix) + fused AdamW: median ms."""
    import torch

    params, grads = make_tensors(manifest, args.torch_dtype, device)
    matrices = [p for n, p in params if n in muon and p.dim() == 2]
    if len(matrices) != len(muon):
        raise SystemExit("torch.optim.Muon takes 2-D matrices only: use a dense model (no 3-D expert stacks)")
    rest = [p for n, p in params if n not in muon]
    muon_opt = torch.optim.Muon(matrices, lr=LR, weight_decay=WD, momentum=MOMENTUM, nesterov=True)
    adamw = torch.optim.AdamW(rest, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)

    def step():
        muon_opt.step()
        adamw.step()

    ms = time_steps(step, params, grads, args.warmup, args.steps)
    return ms


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(ROOT, "tests", "importer", "configs", "gemma-3-1b-it.config.json"))
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_step: no CUDA device", file=sys.stderr)
        return 2
    args.torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    device = torch.device("cuda", 0)
    manifest = manifest_of(args.config)
    for t in manifest["tensors"]:
        t["dtype"] = args.dtype.upper()
    ours, muon, copies, phases = run_muonshard(manifest, args, device)
    gc.collect()
    torch.cuda.empty_cache()  # muonshard's buffers gone before torch's run
    theirs = run_torch(manifest, args, device, muon)
    elements = sum(math.prod(int(d) for d in t["shape"]) for t in manifest["tensors"])
    result = {
        "device": torch.cuda.get_device_name(device),
        "model": manifest["model"],
        "dtype": args.dtype,
        "tensors": len(manifest["tensors"]),
        "muon_matrices": len(muon),
        "elements": elements,
        "steps": args.steps,
        "muonshard_ms": round(ours, 3),
        "torch_ms": round(theirs, 3),
        "ratio": round(ours / theirs, 3),
        "host_copies_in_steps": copies,
        "muonshard_phases_ms": {k: round(v, 3) for k, v in phases.items()},
    }
    print(json.dumps(result))
    print(
        "| %s | %s | %s | %.1f | %.1f | %.2f | %d |"
        % (result["device"], result["model"], args.dtype, ours, theirs, result["ratio"], copies)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
