"""bench/sim/validate_kernels.py on the recorded H200 kernel bench (tests/sim/data/h200_kernels_gpu.txt): a
simulated Newton-Schulz per case through muonshardctl simulate, the batched stack at the rate ns_batched
records, the goal's exit code, and bad input exits 2 naming it. Usage: validate_kernels_test.py BIN_DIR"""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "sim", "validate_kernels.py")
DATA = os.path.join(HERE, "data", "h200_kernels_gpu.txt")
ROW = re.compile(r"^(\S+)\s+(\S+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([+-][0-9.]+)%$")


def run(bin_dir, *args):
    return subprocess.run(
        [sys.executable, SCRIPT, "--bin", bin_dir, *args], capture_output=True, text=True, timeout=120
    )


def main():
    bin_dir = sys.argv[1]
    r = run(bin_dir, "--kernels-gpu", DATA)
    assert r.returncode == 0, r.stderr
    rows = {m.group(1): m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m}
    assert len(rows) == 8, r.stdout
    for name, (_, _, _, predicted, _, predicted_ms, _) in rows.items():
        assert float(predicted) > 0 and float(predicted_ms) > 0, name
    # One batched call of 64 experts at ns_batched's efficiency (0.554 of 989 TFLOP/s), not 64 matrices at
    # the per-matrix table's 0.25.
    stack = rows["experts64x768x2048"]
    assert stack[1] == "64x768x2048", stack
    assert abs(float(stack[3]) - 0.554 * 989) < 1.0, stack
    assert re.search(r"^\d of 8 cases within \+-15 %; worst [0-9.]+ %$", r.stdout, re.M), r.stdout
    worst = float(re.search(r"worst ([0-9.]+) %", r.stdout).group(1))
    # --goal: exit 1 past it, 0 within.
    assert run(bin_dir, "--kernels-gpu", DATA, "--goal", "%.1f" % (worst / 2)).returncode == 1
    assert run(bin_dir, "--kernels-gpu", DATA, "--goal", "%.1f" % (worst + 1)).returncode == 0
    # Another cluster: another prediction (gb300's GEMM rate is 2.5x the H200's).
    r = run(bin_dir, "--kernels-gpu", DATA, "--cluster", "gb300")
    assert r.returncode == 0, r.stderr
    gb300 = {m.group(1): m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m}
    assert float(gb300["8192x8192"][3]) > 2 * float(rows["8192x8192"][3]), (gb300, rows)
    # Bad input: exit 2, naming it.
    r = run(bin_dir, "--kernels-gpu", os.path.join(HERE, "data", "missing.txt"))
    assert r.returncode == 2 and "missing.txt" in r.stderr, (r.returncode, r.stderr)
    r = run(bin_dir, "--kernels-gpu", os.path.join(HERE, "data", "kernels_skylakex.txt"))
    assert r.returncode == 2 and "no case= lines" in r.stderr, (r.returncode, r.stderr)
    r = run(bin_dir, "--kernels-gpu", DATA, "--cluster", "h300")
    assert r.returncode == 2 and "h300" in r.stderr, (r.returncode, r.stderr)
    r = run(bin_dir, "--kernels-gpu", DATA, "--goal", "-1")
    assert r.returncode == 2 and "--goal" in r.stderr, (r.returncode, r.stderr)
    print("validate_kernels_test: passed")


if __name__ == "__main__":
    main()
