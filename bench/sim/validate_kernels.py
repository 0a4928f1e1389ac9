#!/usr/bin/env python3
"""The simulator's kernel terms against a GPU's kernel bench (issue 36, part 2b).

Reads the output of `muonshard-bench-kernels-gpu` (its `case=` lines: NS5 bf16 of one shape, plain and
symmetric, against the cuBLAS GEMM of the same run) and, for every case, simulates one Muon tensor of that
shape (a 3-D stack for a batched case) at world size 1 on the cluster, with `ns_call_us` 0: the bench times
the kernel alone, and `ns_call_us` is what the worker adds per call. Prints per case the measured
Newton-Schulz rate (the path the kernel picks, `auto=`) and time, and the simulated ones:

    python3 bench/sim/validate_kernels.py --kernels-gpu kernels-gpu.txt [--cluster h200] [--goal 15]

The GPU presets' `ns_efficiency` and `ns_batched` were made from the 2026-11-30 H200 run of this bench
(tests/sim/data/h200_kernels_gpu.txt): on that run the table says how closely one efficiency per smaller
dimension (interpolated in log2) and one batched point describe the shapes; on a later run, or another GPU,
the figures are predictions. --goal PCT: exit 1 when a case is off by more than PCT percent. Bad input exits
2 naming it.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASE_RE = re.compile(
    r"^case=(\S+) batch=(\d+) rows=(\d+) cols=(\d+) gemm_tflops=([0-9.]+) ns_plain_tflops=([0-9.]+) "
    r"ns_symmetric_tflops=([0-9.]+) .*auto=(plain|symmetric)"
)
NS_STEPS = 5  # the bench's NS5


class BadInput(Exception):
    pass


def ns_flops(batch, rows, cols):
    """kernels::NewtonSchulzFlops: full matmuls, NS_STEPS iterations."""
    m, n = min(rows, cols), max(rows, cols)
    return batch * NS_STEPS * (4.0 * m * m * n + 2.0 * m * m * m)


def parse_cases(path):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise BadInput("--kernels-gpu %s: %s" % (path, e.strerror)) from e
    cases = []
    for line in lines:
        m = CASE_RE.match(line)
        if not m:
            continue
        name, batch, rows, cols = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        tflops = float(m.group(6) if m.group(8) == "plain" else m.group(7))
        if batch < 1 or rows < 1 or cols < 1 or tflops <= 0:
            raise BadInput("--kernels-gpu %s: case %s has a zero size or rate" % (path, name))
        cases.append({"name": name, "batch": batch, "rows": rows, "cols": cols, "tflops": tflops})
    if not cases:
        raise BadInput("--kernels-gpu %s: no case= lines (muonshard-bench-kernels-gpu output?)" % path)
    return cases


def cluster_file(cluster, work):
    """The cluster (a preset name or a cluster file) with ns_call_us 0."""
    if os.path.isfile(cluster):
        try:
            with open(cluster) as f:
                spec = json.load(f)
        except (OSError, ValueError) as e:
            raise BadInput("--cluster %s: %s" % (cluster, e)) from e
        if not isinstance(spec, dict):
            raise BadInput("--cluster %s: not a JSON object" % cluster)
    else:
        spec = {"preset": cluster}
    spec["ns_call_us"] = 0
    path = os.path.join(work, "cluster.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def simulated_seconds(case, cluster, bin_dir, work):
    """The ns phase of rank 0 for one Muon tensor of the case's shape at world size 1."""
    shape = [case["rows"], case["cols"]]
    name = "model.layers.0.mlp.down_proj.weight"
    if case["batch"] > 1:
        shape = [case["batch"], *shape]
        name = "model.layers.0.mlp.experts.down_proj"
    manifest = os.path.join(work, case["name"] + ".json")
    with open(manifest, "w") as f:
        tensor = {"name": name, "shape": [str(d) for d in shape], "dtype": "BF16"}
        json.dump({"model": case["name"], "tensors": [tensor]}, f)
    argv = [os.path.join(bin_dir, "muonshardctl"), "simulate", "--cluster", cluster, "--manifest", manifest]
    argv += ["--world-size", "1", "--schedule", "sequential", "--format", "json"]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise BadInput("muonshardctl simulate (%s): %s" % (case["name"], r.stderr.strip()[-500:]))
    schedule = json.loads(r.stdout)["schedules"][0]
    return schedule["ranks"][0]["busy_seconds"]["ns"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels-gpu", required=True, help="muonshard-bench-kernels-gpu output")
    p.add_argument("--cluster", default="h200", help="a preset or a cluster file (default h200)")
    p.add_argument("--bin", default=os.environ.get("MUONSHARD_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    p.add_argument("--goal", type=float, help="exit 1 when a case is off by more than this many %%")
    a = p.parse_args()
    try:
        if a.goal is not None and not a.goal > 0:
            raise BadInput("--goal: must be > 0, got %s" % a.goal)
        cases = parse_cases(a.kernels_gpu)
        with tempfile.TemporaryDirectory() as work:
            cluster = cluster_file(a.cluster, work)
            rows = [(c, simulated_seconds(c, cluster, a.bin, work)) for c in cases]
    except BadInput as e:
        print("validate_kernels: %s" % e, file=sys.stderr)
        return 2
    print("kernel terms of cluster %s (ns_call_us 0) against %s" % (a.cluster, a.kernels_gpu))
    print("%-22s %-16s %10s %10s %10s %10s %8s" % ("case", "shape", "TFLOP/s", "predicted", "ms", "predicted", "error"))
    errors = []
    for c, predicted_s in rows:
        flops = ns_flops(c["batch"], c["rows"], c["cols"])
        measured_s = flops / (c["tflops"] * 1e12)
        error = 100.0 * (predicted_s - measured_s) / measured_s
        errors.append(abs(error))
        shape = "%dx%d" % (c["rows"], c["cols"]) if c["batch"] == 1 else "%dx%dx%d" % (c["batch"], c["rows"], c["cols"])
        print(
            "%-22s %-16s %10.1f %10.1f %10.3f %10.3f %+7.1f%%"
            % (c["name"], shape, c["tflops"], flops / predicted_s / 1e12, 1e3 * measured_s, 1e3 * predicted_s, error)
        )
    worst = max(errors)
    within = sum(1 for e in errors if e <= 15)
    print("%d of %d cases within +-15 %%; worst %.1f %%" % (within, len(rows), worst))
    if a.goal is not None and worst > a.goal:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
