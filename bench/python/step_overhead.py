#!/usr/bin/python3
"""The Python layer's cost on the optimizer step, measured (not a test).

On one model and one plan, in one run:
  1. `muonshard.torch.ShardedMuonAdamW` in W rank processes: the wall time of
     `opt.step()` as the training loop sees it, and inside it the C++ step's own
     time (`last_step_stats["total_seconds"]`); their difference is what the
     Python layer adds (gradient hand-off, lr, write-back, bindings).
  2. `muonshard-worker` (the C++ binary, synthetic workload) in W processes on
     the same plan: its optimizer step (the phases it logs).
  3. One process: `ShardedMuonAdamW` at world 1 against an unsharded torch
     Muon + AdamW (examples/torch/train_gpt.py's MuonAdamW) on the same
     parameters.
Prints a markdown table (medians over the timed steps, after warm-up steps).

Usage: .venv/bin/python bench/python/step_overhead.py [--manifest examples/manifests/tiny-moe.json]
         [--world 2] [--steps 30] [--warmup 3] [--dtype fp32|bf16|manifest] [--build build]
"""

import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPES = {"fp32": "FP32", "bf16": "BF16"}


def load_manifest(path, dtype):
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    if dtype != "manifest":
        for t in manifest["tensors"]:
            t["dtype"] = DTYPES[dtype]
    return manifest


def parameters(manifest):
    """Seeded random parameters and gradients for every tensor of the manifest."""
    import torch

    torch_dtype = {"FP32": torch.float32, "BF16": torch.bfloat16, "FP16": torch.float16}
    g = torch.Generator().manual_seed(1)
    params, grads = [], []
    for t in manifest["tensors"]:
        shape = [int(d) for d in t["shape"]]
        dtype = torch_dtype[t.get("dtype", "BF16")]
        params.append((t["name"], torch.nn.Parameter((torch.randn(shape, generator=g) * 0.02).to(dtype))))
        grads.append((torch.randn(shape, generator=g) * 0.01).to(dtype))
    return params, grads


def set_grads(params, grads):
    """Copies `grads` into the parameters' .grad (what backward would write)."""
    import torch

    with torch.no_grad():
        for (_, p), g in zip(params, grads, strict=True):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)


def time_steps(opt, params, grads, warmup, steps, stats_of=None):
    """Median wall seconds of opt.step() (grads copied in before each, untimed),
    and the median of stats_of(opt) when given."""
    walls, inner = [], []
    for i in range(warmup + steps):
        set_grads(params, grads)
        t0 = time.perf_counter()
        opt.step()
        wall = time.perf_counter() - t0
        if i >= warmup:
            walls.append(wall)
            if stats_of is not None:
                inner.append(stats_of(opt))
    return statistics.median(walls), (statistics.median(inner) if inner else None)


def rank_main(args):
    """One rank of phase 1 (or the single process of phase 3): prints a JSON line."""
    import muonshard.torch as mst

    manifest = load_manifest(args.manifest, args.dtype)
    params, grads = parameters(manifest)
    opt = mst.ShardedMuonAdamW(params, coordinator=args.coordinator, job=args.job, plan_version=args.version, lr=1e-4)
    wall, inner = time_steps(opt, params, grads, args.warmup, args.steps, lambda o: o.last_step_stats["total_seconds"])
    print(json.dumps({"rank": opt.rank, "wall": wall, "cpp": inner}), flush=True)
    opt.close()


def torch_main(args):
    """Phase 3's unsharded torch Muon + AdamW in one process: prints a JSON line."""
    import torch

    spec = importlib.util.spec_from_file_location("train_gpt", os.path.join(ROOT, "examples", "torch", "train_gpt.py"))
    train_gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_gpt)
    manifest = load_manifest(args.manifest, args.dtype)
    params, grads = parameters(manifest)
    torch.set_num_threads(os.cpu_count() or 1)
    opt = train_gpt.MuonAdamW(params, lr=1e-4)
    wall, _ = time_steps(opt, params, grads, args.warmup, args.steps)
    print(json.dumps({"wall": wall}), flush=True)


def spawn_ranks(args, world, job, version, coordinator, extra_env=None):
    procs = []
    for r in range(world):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(world),
            **(extra_env or {}),
        )
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--rank-mode",
            "--coordinator",
            coordinator,
            "--job",
            job,
            "--version",
            str(version),
            "--manifest",
            args.manifest,
            "--dtype",
            args.dtype,
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1200)
        if p.returncode != 0:
            raise RuntimeError("a rank process exited %d" % p.returncode)
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def worker_phase(args, world, version, coordinator):
    """muonshard-worker on the same plan: the median of rank 0's optimizer phases."""
    import muonshard

    worker = muonshard.find_binary("muonshard-worker")
    procs = []
    for r in range(world):
        cmd = [
            worker,
            "--coordinator",
            coordinator,
            "--job",
            "bench-worker",
            "--plan-version",
            str(version),
            "--rank",
            str(r),
            "--workload",
            "synthetic",
            "--steps",
            str(args.warmup + args.steps),
            "--lr",
            "1e-4",
            "--metrics-port",
            "-1",
            "--log-every",
            "1",
        ]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    logs = []
    for p in procs:
        _, err = p.communicate(timeout=1200)
        if p.returncode != 0:
            raise RuntimeError("muonshard-worker exited %d:\n%s" % (p.returncode, err[-2000:]))
        logs.append(err)
    line = re.compile(r"step (\d+)/\d+ .*\(reduce ([\d.]+), orthogonalise ([\d.]+), adamw ([\d.]+), sync ([\d.]+) ms\)")
    phases = []
    for log in logs:
        for m in line.finditer(log):
            if int(m.group(1)) > args.warmup:
                phases.append(sum(float(x) for x in m.groups()[1:]) / 1e3)
    return statistics.median(phases)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", default=os.path.join(ROOT, "examples", "manifests", "tiny-moe.json"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=["fp32", "bf16", "manifest"], default="fp32")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-mode", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--version", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(build, "python"), os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("MUONSHARD_BIN_DIR", os.path.join(build, "bin"))
    if args.rank_mode:
        return rank_main(args)
    if args.torch_mode:
        return torch_main(args)

    import muonshard
    import muonshard.torch as mst  # noqa: F401 (fail early without torch)

    manifest = load_manifest(args.manifest, args.dtype)
    n = sum(math.prod(int(d) for d in t["shape"]) for t in manifest["tensors"])
    with muonshard.LocalCoordinator(heartbeat_timeout=30) as coord:
        client = muonshard.Coordinator(coord.address)
        version = client.submit(manifest, world_size=args.world, policy="balanced")
        ranks = spawn_ranks(args, args.world, "bench-python", version, coord.address)
        worker = worker_phase(args, args.world, version, coord.address)
        solo_version = client.submit(manifest, world_size=1, policy="balanced")
        solo = spawn_ranks(args, 1, "bench-solo", solo_version, coord.address)[0]
    out = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--torch-mode",
            "--manifest",
            args.manifest,
            "--dtype",
            args.dtype,
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    torch_wall = json.loads(out.stdout.strip().splitlines()[-1])["wall"]
    r0 = ranks[0]
    overhead = max(r["wall"] - r["cpp"] for r in ranks)
    print(
        "model %s (%s, %d tensors, %s elements), %d timed steps after %d warm-up, medians, %d cores"
        % (
            manifest["model"],
            args.dtype,
            len(manifest["tensors"]),
            format(n, ","),
            args.steps,
            args.warmup,
            os.cpu_count() or 1,
        )
    )
    print()
    print("| measure | ms |")
    print("|---|---|")
    print("| W=%d: `opt.step()` wall, rank 0 (Python) | %.2f |" % (args.world, r0["wall"] * 1e3))
    print("| W=%d: C++ step inside it, rank 0 | %.2f |" % (args.world, r0["cpp"] * 1e3))
    print(
        "| W=%d: Python layer (wall - C++), worst rank | %.2f (%.1f%% of the step) |"
        % (args.world, overhead * 1e3, 100 * overhead / r0["wall"])
    )
    print(
        "| W=%d: `muonshard-worker` optimizer step, same plan | %.2f (Python/worker %.3f) |"
        % (args.world, worker * 1e3, r0["wall"] / worker)
    )
    print("| W=1: `ShardedMuonAdamW.step()` | %.2f |" % (solo["wall"] * 1e3))
    print(
        "| W=1: unsharded torch Muon + AdamW `step()` | %.2f (muonshard/torch %.3f) |"
        % (torch_wall * 1e3, solo["wall"] / torch_wall)
    )


if __name__ == "__main__":
    main()
