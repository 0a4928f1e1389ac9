"""FSDP2 + muonshard against FSDP2 + a plain Muon that all-gathers every matrix.

    PYTHONPATH=build/python MUONSHARD_BIN_DIR=build/bin .venv/bin/python bench/python/fsdp_muon.py

For each world size W (default 2 and 4) it runs examples/torch/train_gpt.py
--fsdp under torch.distributed.run twice, with the same model, data and
seed: `--optimizer muonshard` (each Muon matrix gathered to the one rank the
plan gives it, orthogonalised there, the shards of the update scattered
back: NOTE [Sharded parameters]) and `--optimizer muon-local` (what a user
writes without it: every rank all-gathers every Muon gradient with
full_tensor(), keeps the whole momentum and orthogonalises every matrix).
It prints, per run, the median optimizer step time over the steps after the
first, the bytes the optimizer's collectives moved per step (each rank's
sends plus receives, summed over the ranks; muonshard's are measured by its
counting communicator, the all-gathers' counted as 2 (W-1)/W of each
matrix), the largest rank's optimizer state, and the final loss, which
must agree between the two (the same math). Ratios are within one run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "torch", "train_gpt.py")


def run(world, optimizer, steps, work, extra):
    summary = os.path.join(work, "%s-%d.json" % (optimizer, world))
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(world),
        "--log-dir",
        os.path.join(work, "logs-%s-%d" % (optimizer, world)),
        SCRIPT,
        "--fsdp",
        "--optimizer",
        optimizer,
        "--steps",
        str(steps),
        "--log-every",
        str(steps),
        "--job",
        "bench-fsdp-%s-%d" % (optimizer, world),
        "--summary-json",
        summary,
        *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    done = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1200, check=False)
    if done.returncode != 0:
        sys.exit("%s at W=%d failed:\n%s" % (optimizer, world, done.stdout.decode(errors="replace")[-3000:]))
    with open(summary) as f:
        s = json.load(f)
    later = sorted(s["optimizer_seconds"], key=int)[1:]
    bytes_per_step = [sum(c[k] or 0 for c in s["comm_bytes"]) for k in later]
    return {
        "optimizer_ms": 1e3 * statistics.median(s["optimizer_seconds"][k] for k in later),
        "step_ms": 1e3 * statistics.median(s["step_seconds"][k] for k in later),
        "comm_mib": statistics.mean(bytes_per_step) / 2**20,
        "state_mib": max(m["optimizer_state"] for m in s["memory"]) / 2**20,
        "loss": s["losses"][max(s["losses"], key=int)],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-layers", type=int, default=4)
    a = ap.parse_args()
    extra = ["--d-model", str(a.d_model), "--n-layers", str(a.n_layers), "--batch-size", "4"]
    print(
        "| W | optimizer | optimizer step ms (median) | whole step ms | optimizer comm MiB/step (all ranks) "
        "| largest optimizer state MiB | final loss |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for world in [int(w) for w in a.worlds.split(",")]:
            rows = {o: run(world, o, a.steps, work, extra) for o in ("muonshard", "muon-local")}
            for o, r in rows.items():
                print(
                    "| %d | %s | %.1f | %.1f | %.2f | %.2f | %.4f |"
                    % (
                        world,
                        "FSDP2 + muonshard" if o == "muonshard" else "FSDP2 + all-gather Muon",
                        r["optimizer_ms"],
                        r["step_ms"],
                        r["comm_mib"],
                        r["state_mib"],
                        r["loss"],
                    )
                )
            ours, theirs = rows["muonshard"], rows["muon-local"]
            print(
                "|   | ratio all-gather / muonshard | %.2fx | %.2fx | %.2fx | %.2fx | |"
                % (
                    theirs["optimizer_ms"] / ours["optimizer_ms"],
                    theirs["step_ms"] / ours["step_ms"],
                    theirs["comm_mib"] / ours["comm_mib"],
                    theirs["state_mib"] / ours["state_mib"],
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
