"""bench/sim/validate_shaped_net.py on recorded inputs (tests/sim/data: the shaped-network benchmark's
summary lines at 1 and 2 Gbit/s, 4 and 2 ranks, and the kernels bench of the same session, 2026-12-06; and
nodes2_*: two nodes of two ranks, flat and hierarchical, with that session's calibration runs; epyc_*: the
same on 2026-12-07, medians of 3; epyc_c_*: rerun that afternoon with the kernels bench on one thread
throughout and the element-wise kernels timed; epyc_d_*: that evening, with two nodes of four ranks too): the
link fitted on the calibration model's comm-only figures reproduces them, every configuration gets a
prediction, the 2026-12-07 steps are within the issue's +-15 % (--goal passes there and fails on a miss), and
bad input exits 2 naming it. Usage: validate_shaped_net_test.py BIN_DIR"""

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "sim", "validate_shaped_net.py")
DATA = os.path.join(HERE, "data")
BYTES_ROW = re.compile(r"^\S+\s+\d+\s+(\S+)\s+inter_node_mb\s+([0-9.]+)\s+([0-9.]+)\s+([+-][0-9.]+)%")
ROW = re.compile(r"^(\S+)\s+\d+\s+(\S+)\s+(sequential|pipelined|comm|compute)\s+([0-9.]+)\s+([0-9.]+)\s+([+-][0-9.]+)%")


def run(bin_dir, *args):
    return subprocess.run(
        [sys.executable, SCRIPT, "--bin", bin_dir, *args], capture_output=True, text=True, timeout=300
    )


def bytes_ratios(log):
    """A --nodes log's hierarchical / flat inter-node bytes per model (the sequential mode's lines)."""
    with open(log) as f:
        return re.findall(r"flat vs hierarchical, sequential: .*hierarchical / flat = ([0-9.]+) \(goal", f.read())


def two_nodes_of_four(bin_dir):
    """epyc_d_*: 2026-12-07 evening, the per-rank runs and two nodes of two ranks again, and two nodes of four
    (shaped_net.py --nodes 2 --ranks 8: each expert group has two ranks on each node, so it too has a level
    inside the node). Inside each node first moves 48-49 % fewer bytes between the nodes for both models; the
    simulator books them to the byte, flat and hierarchical. Without a loopback figure of that session, a node's
    lo falls back to the link's CPU cap, which prices the hierarchical steps at four ranks per node 35-50 % high
    (epyc_e_* below has the loopback runs that fit it: docs/simulator.md, "Validation")."""
    log = os.path.join(DATA, "epyc_d_nodes2x4_shaped_net_1gbit.log")
    ratios = bytes_ratios(log)
    assert len(ratios) == 2 and all(float(x) <= 0.70 for x in ratios), ratios  # part 4's goal, both models
    args = []
    for name in ("1gbit_4ranks", "2gbit_4ranks", "1gbit_2ranks", "2gbit_2ranks"):
        args += ["--log", os.path.join(DATA, "epyc_d_shaped_net_%s.log" % name)]
    args += ["--log", os.path.join(DATA, "epyc_d_nodes2_shaped_net_1gbit.log")]
    args += ["--kernels", os.path.join(DATA, "epyc_d_kernels_1thread.txt"), "--host-cores", "2"]
    r = run(bin_dir, *args)  # two nodes of two: 23 of 24 steps within +-15 %
    assert r.returncode == 0 and "worst step error: 18.6 %" in r.stdout, (r.returncode, r.stdout, r.stderr)
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    steps = [row for row in rows if row[2] in ("sequential", "pipelined")]
    assert len(steps) == 24 and sum(abs(float(row[5])) > 15 for row in steps) == 2, steps
    r = run(bin_dir, *args, "--log", log)
    assert r.returncode == 0 and "worst step error: 49.5 %" in r.stdout, (r.returncode, r.stdout, r.stderr)
    inter = [m.groups() for m in map(BYTES_ROW.match, r.stdout.splitlines()) if m]
    assert len(inter) == 8, r.stdout  # 2 models x flat, hierarchical x 2 and 4 ranks per node
    for label, measured, predicted, error in inter:
        assert abs(float(error)) <= 0.1, (label, measured, predicted, error)
    four = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m and "@2x4-" in m.group(2)]
    assert len(four) == 16, r.stdout
    for model in ("Qwen3-30B-A3B", "Llama-3.1-8B"):  # measured: the step >= 25 % faster inside each node first
        seq = {row[1]: float(row[3]) for row in four if row[0] == model and row[2] == "sequential"}
        assert seq["1gbit@2x4-hier"] < 0.75 * seq["1gbit@2x4-flat"], (model, seq)


SESSION_LOGS = ["shaped_net_%s_%dranks" % (rate, n) for rate in ("1gbit", "2gbit") for n in (4, 2)]
SESSION_LOGS += ["loopback_%dranks" % n for n in (2, 4, 8)] + ["nodes2_shaped_net_1gbit", "nodes2x4_shaped_net_1gbit"]


def session_args(prefix, names=SESSION_LOGS):
    """The harness's arguments for a recorded session's logs `names` (prefix_NAME.log) and kernels bench."""
    args = [x for name in names for x in ("--log", os.path.join(DATA, "%s_%s.log" % (prefix, name)))]
    return args + ["--kernels", os.path.join(DATA, "%s_kernels_1thread.txt" % prefix), "--host-cores", "2"]


def two_node_steps(stdout):
    """The (model, label, schedule, measured, predicted, error) rows of the two-node runs' steps."""
    rows = [m.groups() for m in map(ROW.match, stdout.splitlines()) if m]
    return [row for row in rows if row[2] in ("sequential", "pipelined") and "@2x" in row[1]]


def lo_from_loopback(bin_dir):
    """epyc_e_* (2026-12-07 21:40-21:59 UTC) and epyc_f_* (22:04-22:23): the per-rank runs, shaped_net.py
    --loopback-only at 2, 4 and 8 ranks (every rank on the machine's lo, the four modes) and two nodes of two and
    of four. The MoE model's comm-only figures on loopback fit what a rank's rings move over lo at each world
    size; a node of P ranks runs its rings as a machine of P ranks, at the cores a rank gets with all the host's
    ranks, and the link's CPU cap scales between world sizes as that fit does. With that, every hierarchical
    step on two nodes is predicted within +-12 % in both sessions, at two and at four ranks per node (part 4 of
    issue 36), and 31 of the 32 two-node steps within +-15 % (docs/simulator.md, "Validation")."""
    r = run(bin_dir, *session_args("epyc_e"))
    assert r.returncode == 0 and "worst step error: 24.6 %" in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert "0.3641 at 4 ranks, 0.1339 at 8 ranks GB/s per rank" in r.stdout, r.stdout
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    loopback = [row for row in rows if row[1] == "loopback"]
    assert len(loopback) == 24, r.stdout  # 2 models x 3 world sizes x 4 terms
    assert sum(row[0] == "Qwen3-30B-A3B" and row[2] == "comm" for row in loopback) == 3, loopback  # the lo fit
    for line in r.stdout.splitlines():  # the lo fit reproduces its figures
        m = ROW.match(line)
        if m and m.group(2) == "loopback" and m.group(3) == "comm" and m.group(1) == "Qwen3-30B-A3B":
            assert line.endswith("(calibration)") and abs(float(m.group(6))) <= 0.5, line
    steps = two_node_steps(r.stdout)
    assert len(steps) == 16, r.stdout  # 2 models x 2 layouts x flat, hierarchical x 2 schedules
    assert max(abs(float(row[5])) for row in steps) == 13.5, steps  # dense, flat, 2 x 4, pipelined
    assert all(abs(float(row[5])) <= 12 for row in steps if row[1].endswith("-hier")), steps
    inter = [m.groups() for m in map(BYTES_ROW.match, r.stdout.splitlines()) if m]
    assert len(inter) == 8 and all(abs(float(row[3])) <= 0.1 for row in inter), inter
    # The second session, the same model: the 2 x 4 steps within +-12.4 %, one flat step at 2 x 2 off.
    r = run(bin_dir, *session_args("epyc_f"))
    assert r.returncode == 0 and "0.3681 at 4 ranks, 0.1357 at 8 ranks" in r.stdout, (r.returncode, r.stdout)
    steps = two_node_steps(r.stdout)
    assert len(steps) == 16 and all(abs(float(row[5])) <= 12.5 for row in steps if "@2x4-" in row[1]), steps
    assert all(abs(float(row[5])) <= 9 for row in steps if row[1].endswith("-hier")), steps
    misses = [row[:3] for row in steps if abs(float(row[5])) > 15]
    assert misses == [("Qwen3-30B-A3B", "1gbit@2x2-flat", "pipelined")], misses  # -16.3 %
    # A third session with the two-node runs at 2 Gbit/s (epyc_g_*, 23:16-23:33; the per-rank runs at 4 ranks
    # only): inside each node first still within +-13.1 %, but the flat rings at four ranks per node come out
    # 17-30 % slow, the loopback-scaled cap binding where the measured rings ran faster.
    names = [name for name in SESSION_LOGS if "2ranks" not in name or name.startswith("loopback")]
    r = run(
        bin_dir,
        *session_args("epyc_g", [name.replace("_1gbit", "_2gbit") if "nodes2" in name else name for name in names]),
    )
    assert r.returncode == 0 and "worst step error: 30.1 %" in r.stdout, (r.returncode, r.stdout, r.stderr)
    steps = two_node_steps(r.stdout)
    assert len(steps) == 16 and all(abs(float(row[5])) <= 13.5 for row in steps if row[1].endswith("-hier")), steps
    assert {row[1] for row in steps if abs(float(row[5])) > 15} == {"2gbit@2x2-flat", "2gbit@2x4-flat"}, steps
    # The part 4 goal on the sessions' own runs: >= 30 % fewer bytes between the nodes.
    for prefix, rate in (("epyc_e", "1gbit"), ("epyc_f", "1gbit"), ("epyc_g", "2gbit")):
        ratios = bytes_ratios(os.path.join(DATA, "%s_nodes2x4_shaped_net_%s.log" % (prefix, rate)))
        assert len(ratios) == 2 and all(float(x) <= 0.70 for x in ratios), (prefix, ratios)
    # Without the loopback logs the node's lo is the link's cap again, and the cap scales with the cores a rank
    # gets: the 2 x 4 hierarchical steps are 24-44 % high.
    r = run(bin_dir, *session_args("epyc_e", [name for name in SESSION_LOGS if not name.startswith("loopback")]))
    assert r.returncode == 0 and "lo, fitted" not in r.stdout, r.stdout
    assert "worst step error: 43.9 %" in r.stdout, r.stdout
    # Loopback figures without the calibration model's: nothing fits lo (exit 2, naming what is missing).
    with open(os.path.join(DATA, "epyc_e_loopback_4ranks.log")) as f:
        text = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        dense_only = os.path.join(tmp, "loopback_dense.log")
        with open(dense_only, "w") as f:
            f.write(re.sub(r"  Qwen3-30B-A3B .*\n    loopback: .*\n", "", text))
        r = run(bin_dir, *session_args("epyc_e", SESSION_LOGS[:4]), "--log", dense_only)
    assert r.returncode == 2 and "Qwen3-30B-A3B's comm-only one on loopback" in r.stderr, (r.returncode, r.stderr)


def main():
    bin_dir = sys.argv[1]
    logs = []
    for name in ("1gbit", "2gbit", "1gbit_2ranks", "2gbit_2ranks"):
        logs += ["--log", os.path.join(DATA, "shaped_net_%s.log" % name)]
    kernels = ["--kernels", os.path.join(DATA, "kernels_skylakex.txt"), "--host-cores", "2"]
    r = run(bin_dir, *logs, *kernels)
    assert r.returncode == 0, r.stderr
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    assert len(rows) == 32, r.stdout  # 2 models x 2 rates x 2 world sizes x 4 terms
    for line in r.stdout.splitlines():
        m = ROW.match(line)
        if m and line.endswith("(calibration)") and m.group(3) == "comm":  # the link fit: reproduced
            assert abs(float(m.group(5)) - float(m.group(4))) <= 0.005 * float(m.group(4)), line
    for model, rate, term, _, predicted, _ in rows:
        assert float(predicted) > 0, (model, rate, term)
    assert r.stdout.count("(calibration)") == 6, r.stdout  # comm at 4 ranks x 2 rates, compute x 4
    assert "cap 0.18" in r.stdout and "efficiency 0.90" in r.stdout, r.stdout
    # Two nodes of two ranks (shaped_net.py --nodes 2, flat and hierarchical collectives), predicted from the
    # per-rank network's calibration of the same session (the MoE model's comm and compute only).
    nodes2 = [
        os.path.join(DATA, "nodes2_%s.log" % n) for n in ("calibration_1gbit", "calibration_2gbit", "shaped_net_1gbit")
    ]
    r = run(
        bin_dir,
        *[x for path in nodes2 for x in ("--log", path)],
        "--kernels",
        os.path.join(DATA, "nodes2_kernels_skylakex.txt"),
        "--host-cores",
        "2",
    )
    assert r.returncode == 0, r.stderr
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    two_node = [row for row in rows if "@2x2-" in row[1]]
    assert len(two_node) == 16, r.stdout  # 2 models x flat, hierarchical x 4 terms
    assert {row[1] for row in two_node} == {"1gbit@2x2-flat", "1gbit@2x2-hier"}, r.stdout
    for model, label, term, measured, predicted, _ in two_node:
        assert float(measured) > 0 and float(predicted) > 0, (model, label, term)
    assert r.stdout.count("(calibration)") == 4, r.stdout  # comm and compute at 1 and 2 Gbit/s, per rank
    # 2026-12-07 on this project's AMD EPYC VM (medians of 3, the kernels bench on one BLAS thread with the
    # models' own shapes): every step within the issue's +-15 % (NOTE [Host CPU] in sim/cluster.h makes the
    # pipelined ones; the calibration's compute is reproduced by the fixed-point fit).
    epyc = []
    for name in ("1gbit_4ranks", "2gbit_4ranks", "1gbit_2ranks", "2gbit_2ranks"):
        epyc += ["--log", os.path.join(DATA, "epyc_shaped_net_%s.log" % name)]
    r = run(
        bin_dir, *epyc, "--kernels", os.path.join(DATA, "epyc_kernels_1thread.txt"), "--host-cores", "2", "--goal", "15"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    assert len(rows) == 32, r.stdout
    steps = [row for row in rows if row[2] in ("sequential", "pipelined")]
    assert len(steps) == 16 and all(abs(float(row[5])) <= 15 for row in steps), r.stdout
    for line in r.stdout.splitlines():  # the compute calibration, reproduced in the mean over the rates
        m = ROW.match(line)
        if m and line.endswith("(calibration)") and m.group(3) == "compute":
            assert abs(float(m.group(6))) < 12, line
    assert "kernels from 1 BLAS thread (" in r.stdout, r.stdout
    # Two nodes (--nodes 2, flat and hierarchical), calibrated on the per-rank 4-rank runs: every step within
    # +-15 % too (NOTE [Shared node links]: the MoE model's two expert groups take turns on a node's link);
    # --goal fails where a step is off by more (the MoE steps, -12.8 % and +12.8 %).
    nodes2 = [*epyc[:4], "--log", os.path.join(DATA, "epyc_nodes2_shaped_net_1gbit.log")]
    nodes2 += ["--kernels", os.path.join(DATA, "epyc_kernels_1thread.txt"), "--host-cores", "2"]
    r = run(bin_dir, *nodes2, "--goal", "10")
    assert r.returncode == 1 and "worst step error: 12.8 %" in r.stdout, (r.returncode, r.stdout, r.stderr)
    r = run(bin_dir, *nodes2, "--goal", "15")
    assert r.returncode == 0, r.stdout + r.stderr
    two_node = [row for row in map(ROW.match, r.stdout.splitlines()) if row and "@2x2-" in row.group(2)]
    assert len(two_node) == 16, r.stdout
    # The bytes between the nodes, flat and hierarchical, as the simulator's algorithms move them: the TCP payload
    # measured, to the byte (the flat Gloo collectives hop by hop: GlooFlatSent in sim/cost_model.h).
    inter = [m.groups() for m in map(BYTES_ROW.match, r.stdout.splitlines()) if m]
    assert len(inter) == 4, r.stdout  # 2 models x flat, hierarchical
    for label, measured, predicted, error in inter:
        assert float(measured) > 30 and abs(float(error)) <= 0.1, (label, measured, predicted, error)
    assert "worst inter-node bytes error: 0.0 %" in r.stdout, r.stdout
    # epyc_c_*: the same benchmark rerun at 16:04 the same day, after the sequential step's Muon batches across
    # buckets, with the kernels bench fixed to run its batched cases on its one thread (before, their matrix loop
    # took every hardware thread: the morning's experts case is a 2-thread figure) and timing the element-wise
    # kernels and a call. Those become the ranks' hbm_gb_s (Muon's 18.96 GB/s, a thread at half a core for 4
    # ranks on 2 cores), adamw_efficiency (AdamW's 7.01 over it) and call costs. Every one of the 24 steps
    # (per-rank and two-node) within +-15 % from the session's own inputs, and the dense model's compute, which
    # the morning's 2-thread expert rate put +22 to +50 % high, within 11 %.
    later = []
    for name in ("1gbit_4ranks", "2gbit_4ranks", "1gbit_2ranks", "2gbit_2ranks"):
        later += ["--log", os.path.join(DATA, "epyc_c_shaped_net_%s.log" % name)]
    later += ["--log", os.path.join(DATA, "epyc_c_nodes2_shaped_net_1gbit.log")]
    kernels_c = ["--kernels", os.path.join(DATA, "epyc_c_kernels_1thread.txt"), "--host-cores", "2"]
    r = run(bin_dir, *later, *kernels_c, "--goal", "15")
    assert r.returncode == 0 and "worst step error: 14.8 %" in r.stdout, (r.returncode, r.stdout, r.stderr)
    four = next(line for line in r.stdout.splitlines() if line.startswith("cluster for 4 ranks"))
    for field in ('"hbm_gb_s": 9.48', '"adamw_efficiency": 0.3697', '"ns_call_us": 6.704', '"kernel_launch_us": 0.128'):
        assert field in four, (field, four)
    rows = [m.groups() for m in map(ROW.match, r.stdout.splitlines()) if m]
    assert len([row for row in rows if row[2] in ("sequential", "pipelined")]) == 24, r.stdout
    dense_compute = [row for row in rows if row[0] == "Llama-3.1-8B" and row[2] == "compute"]
    assert len(dense_compute) == 6 and all(abs(float(row[5])) <= 11 for row in dense_compute), dense_compute
    two_nodes_of_four(bin_dir)
    lo_from_loopback(bin_dir)
    # Bad input: exit 2, naming it.
    r = run(bin_dir, "--log", os.path.join(DATA, "kernels_skylakex.txt"), *kernels)
    assert r.returncode == 2 and "kernels_skylakex.txt: no rate check" in r.stderr, (r.returncode, r.stderr)
    r = run(bin_dir, *logs, "--kernels", os.path.join(DATA, "missing.txt"))
    assert r.returncode == 2 and "missing.txt" in r.stderr, (r.returncode, r.stderr)
    print("validate_shaped_net_test: passed")


if __name__ == "__main__":
    main()
