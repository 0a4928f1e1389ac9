#!/usr/bin/env python3
"""The step simulator against the shaped-network benchmark (issue 36, part 2a).

Reads the logs of `bench/worker/shaped_net.py` runs (each one --rate, any
models, the four modes) and the output of `muonshard-bench-kernels` from
the same session, derives the `cpu` cluster's inputs from measurements,
runs `muonshardctl simulate` on the same model, world size, ep and policy,
and prints per configuration (model x rate) the measured and predicted
sequential and pipelined step and the comm and compute terms:

    python3 bench/sim/validate_shaped_net.py --log sn-1gbit.log --log sn-2gbit.log \\
        --kernels kernels.txt [--calibrate Qwen3-30B-A3B] [--goal 15] [--cluster-out FILE]

Inputs, none fitted to the figures it validates:
- Element-wise rates and call costs: the kernels bench's elementwise lines
  (Muon's momentum + apply as hbm_gb_s, AdamW's rate over it as
  adamw_efficiency, their mean cost per call as kernel_launch_us, a whole
  Muon call of an 8 x 8 matrix as ns_call_us), a rank's share of them as of
  the GEMM rate (calls take 1 / the cores a rank gets); recordings without
  them keep the cpu preset's.
- GEMM rate and Newton-Schulz efficiency by shape: the kernels bench, best
  run as OPENBLAS_NUM_THREADS=1 (its header names its threads; without it
  the machine's cores). A rank runs 1 BLAS thread and the benchmark's
  ranks share the host's cores (--host-cores, default this machine's), so
  a rank's rate starts as the bench's / threads x min(1, cores / ranks),
  scaled per world size so that the --calibrate model's `compute`-only
  figure (the mean over the logs' rates and loopback; a world size without
  one takes the nearest's factor) is reproduced: how much of the host a
  rank's updates really get is measured, not assumed.
- The link: the run's rate check (one TCP flow's payload rate) times an
  efficiency, capped by a rate the ranks' CPUs allow (Gloo over TCP, ranks
  sharing the cores): both fitted on the `comm`-only mode of the
  --calibrate model at the logs' lowest and highest rate (efficiency from
  the lowest, the cap from the highest when it falls below efficiency x
  link). Those comm figures and the compute figure above are the
  calibration (marked in the table); every sequential and pipelined step,
  and the other models' terms, are predictions. The cap is
  CPU time: at another world size it scales as the loopback runs' fit of lo
  (below) does between the two world sizes, or without them with the cores
  a rank gets, min(1, cores / ranks); and it is what a rank's CPU moves for
  the collectives while compute waits (the cluster's host_collective_gb_s:
  NOTE [Host CPU] in sim/cluster.h), which the pipelined step pays.
- A node's lo (--nodes runs): the --calibrate model's comm-only figure on
  loopback (`shaped_net.py --loopback-only` logs: every rank on the
  machine's lo), at each world size there is one, fits what a rank's
  collectives move over lo. A node of P ranks runs its rings as a machine
  of P ranks does (the fit at P, or the nearest world size's scaled by the
  cores a rank gets), at the cores a rank gets with all the host's ranks
  moving bytes (every node's level inside it runs at once); without a
  loopback log the link's cap stands in. The loopback logs' other figures
  (the other model, the steps) are predictions too.
- Who moves bytes at once: all ranks, except in the cross level of a
  hierarchical reduce or broadcast, which runs in one column (one rank per
  node), so its cap is the CPU of one rank per node.

Predicted terms (of the sequential schedule, as the comm-only and
compute-only modes run them): comm = the slowest rank's busy time in
reduce, sync and TP exchange; compute = in Newton-Schulz and the
element-wise updates; with --nodes, inter_node_mb = the MB per step all
ranks send between nodes (the simulator's wire bytes; measured: the TCP
payload on the shaped links).
--goal PCT: exit 1 when a step prediction is off by more than PCT percent
(the issue asks +-15 %). Bad input exits 2 naming it.
"""

import argparse
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RATE_RE = re.compile(r"^rate check: .*?: ([0-9.]+) Gbit/s payload")
# shaped_net.py --muon-reduce scatter-rounds adds " (muon-reduce scatter-rounds)" after the policy.
WORKERS_RE = re.compile(r"^workers: (\d+) ranks, .*policy (\S+?)(?: \(muon-reduce (\S+)\))?;")
MODEL_RE = re.compile(r"^  (\S+) \(/(\d+), (\d+) layers, ep (\d+)[,)]")
SHAPED_RE = re.compile(
    r"^    shaped \((\S+) each way.*\): sequential ([0-9.nan/]+) \| pipelined ([0-9.nan/]+) \| "
    r"comm ([0-9.nan/]+) \| compute ([0-9.nan/]+)"
)
# shaped_net.py --nodes N: N namespaces as machines, a node's ranks on its own lo.
NODES_RE = re.compile(
    r"^    shaped over (\d+) nodes x (\d+) ranks, collectives (\S+) \((\S+) each way.*\): "
    r"sequential ([0-9.nan/]+) \| pipelined ([0-9.nan/]+) \| comm ([0-9.nan/]+) \| compute ([0-9.nan/]+)"
)

# The four step modes of a summary line, in its order.
MODES = ("sequential", "pipelined", "comm", "compute")
# shaped_net.py --loopback-only: every rank on the machine's unshaped lo, the four modes.
LOOPBACK_RE = re.compile(
    r"^    loopback: sequential ([0-9.nan/]+) \| pipelined ([0-9.nan/]+) \| comm ([0-9.nan/]+) \| "
    r"compute ([0-9.nan/]+);"
)
# Its inter-node bytes (the TCP payload between the nodes), of the sequential mode: the same in every mode.
NODES_BYTES_RE = re.compile(r"^    inter-node bytes, sequential, collectives (\S+): ([0-9.]+) MB/step measured")


def figure(text):
    return float("nan") if text == "n/a" else float(text)


KERNEL_RE = re.compile(
    r"^case=\S+ batch=\d+ rows=(\d+) cols=(\d+) sgemm_gflops=([0-9.]+) ns_symmetric_gflops=([0-9.]+)"
)
FIT_ROUNDS = 6  # fit_compute's fixed-point rounds: the factor settles to 0.1 % in three or four
THREADS_RE = re.compile(r"OpenBLAS \S+, (\d+) threads")
# The worker's element-wise kernels and a Muon call's fixed cost (absent from recordings before 2026-12-07).
ELEMENTWISE_RE = re.compile(r"^elementwise=(\w+) elements=\d+ bytes_per_element=\d+ gb_s=([0-9.]+) call_us=([0-9.]+)$")
MUON_CALL_RE = re.compile(r"^muon_call_us=([0-9.]+)$")
MODEL_CONFIGS = {"Qwen3-30B-A3B": "QWEN3_MOE", "Llama-3.1-8B": "LLAMA_DENSE"}


class BadInput(Exception):
    pass


def parse_log(path):
    """[{model, divisor, layers, ep, ranks, policy, rate, gbit_payload, measured{...}}] of one shaped_net log."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise BadInput("--log %s: %s" % (path, e.strerror)) from e
    payload = ranks = policy = None
    muon_reduce = "owner"
    configs, model = [], None
    in_summary = False
    for line in lines:
        if m := RATE_RE.match(line):
            payload = float(m.group(1))
        elif m := WORKERS_RE.match(line):
            ranks, policy, muon_reduce = int(m.group(1)), m.group(2), m.group(3) or "owner"
        elif line.startswith("summary"):
            in_summary = True
        elif in_summary and (m := MODEL_RE.match(line)):
            model = {"model": m.group(1), "divisor": int(m.group(2)), "layers": int(m.group(3)), "ep": int(m.group(4))}
        elif in_summary and model and (m := SHAPED_RE.match(line)):
            values = [figure(x) for x in m.groups()[1:]]
            configs.append(
                dict(
                    model,
                    rate=m.group(1),
                    nodes=0,
                    measured=dict(zip(MODES, values, strict=True)),
                )
            )
        elif in_summary and model and (m := LOOPBACK_RE.match(line)):
            values = [figure(x) for x in m.groups()]
            configs.append(
                dict(
                    model,
                    rate="loopback",
                    nodes=0,
                    loopback=True,
                    measured=dict(zip(MODES, values, strict=True)),
                )
            )
        elif in_summary and model and (m := NODES_BYTES_RE.match(line)):
            for c in configs:  # the model's config of these collectives
                if c["model"] == model["model"] and c.get("collectives") == m.group(1):
                    c["measured"]["inter_node_mb"] = float(m.group(2))
        elif in_summary and model and (m := NODES_RE.match(line)):
            values = [figure(x) for x in m.groups()[4:]]
            configs.append(
                dict(
                    model,
                    rate=m.group(4),
                    nodes=int(m.group(1)),
                    per_node=int(m.group(2)),
                    collectives=m.group(3),
                    measured=dict(zip(MODES, values, strict=True)),
                )
            )
    shaped = [c for c in configs if not c.get("loopback")]
    if not configs or (shaped and payload is None) or ranks is None:
        raise BadInput("--log %s: no rate check, workers line or shaped summary (a shaped_net.py log?)" % path)
    for c in configs:
        c.update(ranks=ranks, policy=policy, muon_reduce=muon_reduce, gbit_payload=payload)
    return configs


@functools.cache
def kernel_terms(path):
    """(gemm_tflops, ns_efficiency table, BLAS threads or None, element-wise terms or None) from
    muonshard-bench-kernels output: the largest sgemm rate, and NS5's rate over it by the smaller matrix
    dimension, on the threads its header names (OPENBLAS_NUM_THREADS=1 measures one rank's thread: small
    matrices gain little from a second); and {kernel: (GB/s, us per call)} of its elementwise lines with
    "ns_call_us" its muon_call_us, None when the output has none."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise BadInput("--kernels %s: %s" % (path, e.strerror)) from e
    threads = next((int(m.group(1)) for m in map(THREADS_RE.search, lines) if m), None)
    rows = [r for r in map(KERNEL_RE.match, lines) if r]
    if not rows:
        raise BadInput("--kernels %s: no case= lines (muonshard-bench-kernels output?)" % path)
    gemm = max(float(r.group(3)) for r in rows)
    by_dim = {}
    for r in rows:
        d = min(int(r.group(1)), int(r.group(2)))
        by_dim[d] = max(by_dim.get(d, 0.0), float(r.group(4)) / gemm)
    table = [{"min_dim": d, "efficiency": round(e, 4)} for d, e in sorted(by_dim.items())]
    elementwise = {m.group(1): (float(m.group(2)), float(m.group(3))) for m in map(ELEMENTWISE_RE.match, lines) if m}
    call = next((float(m.group(1)) for m in map(MUON_CALL_RE.match, lines) if m), None)
    if {"muon", "adamw"} <= elementwise.keys() and call is not None:
        elementwise["ns_call_us"] = call
    else:
        elementwise = None
    return gemm / 1000.0, table, threads, elementwise


@functools.cache
def shaped_net():
    """bench/worker/shaped_net.py as a module (its model configs), loaded once."""
    spec = importlib.util.spec_from_file_location("shaped_net", os.path.join(ROOT, "bench", "worker", "shaped_net.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def manifest_for(c, bin_dir, work):
    """The scaled manifest shaped_net.py trained (the same import and scaling)."""
    sn = shaped_net()
    name = MODEL_CONFIGS.get(c["model"])
    if name is None:
        raise BadInput("model %s: not one of shaped_net.py's (%s)" % (c["model"], ", ".join(MODEL_CONFIGS)))
    key = "%s-%d-%d" % (name, c["divisor"], c["layers"])
    out = os.path.join(work, key + ".json")
    if os.path.exists(out):
        return out
    cfg = os.path.join(work, key + ".config.json")
    with open(cfg, "w") as f:
        json.dump(getattr(sn, name), f)
    full = subprocess.run(
        [os.path.join(bin_dir, "muonshardctl"), "import-hf", cfg], check=True, capture_output=True, text=True
    ).stdout
    with open(os.path.join(work, key + ".full.json"), "w") as f:
        f.write(full)
    scaled = subprocess.run(
        [
            os.path.join(bin_dir, "muonshard-scale-manifest"),
            "--manifest",
            os.path.join(work, key + ".full.json"),
            "--divisor",
            str(c["divisor"]),
            "--layers",
            str(c["layers"]),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with open(out, "w") as f:
        f.write(scaled)
    return out


def plan_inputs(c, bin_dir, work):
    """`muonshardctl plan`'s flags for the model, world size, ep, policy and Muon reduce shaped_net.py ran."""
    return [
        "--manifest",
        manifest_for(c, bin_dir, work),
        "--world-size",
        str(c["ranks"]),
        "--ep",
        str(c["ep"]),
        "--policy",
        c["policy"],
        "--muon-reduce",
        c.get("muon_reduce", "owner"),
    ]


def plan_file(c, bin_dir, work):
    """A two-node config's plan, as shaped_net.py submitted it: with gpus_per_node, for the flat workers too
    (they run it with --collectives flat, as predict() does)."""
    path = os.path.join(
        work, "plan-%s-%d-%d-%s.json" % (c["model"], c["ranks"], c["per_node"], c.get("muon_reduce", "owner"))
    )
    if not os.path.exists(path):
        argv = [os.path.join(bin_dir, "muonshardctl"), "plan", *plan_inputs(c, bin_dir, work), "--output", "json"]
        argv += ["--gpus-per-node", str(c["per_node"])]
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise BadInput("muonshardctl plan: %s" % r.stderr.strip()[-500:])
        with open(path, "w") as f:
            f.write(r.stdout)
    return path


def predict(c, cluster_file, bin_dir, work, bandwidth_gb_s, intra_gb_s=None):
    """{schedule: ms, comm: ms, compute: ms} from muonshardctl simulate. One network namespace per rank
    (every rank a node of its own) unless the config ran on --nodes: then the node's ranks share its one
    link (inter_node_shared) and talk over its lo at `intra_gb_s`; on loopback all ranks are one node."""
    argv = [os.path.join(bin_dir, "muonshardctl"), "simulate", "--cluster", cluster_file]
    if c.get("loopback"):  # one machine: every rank on its lo at `intra_gb_s`
        argv += ["--gpus-per-node", str(c["ranks"]), *plan_inputs(c, bin_dir, work)]
        argv += ["--intra-bandwidth", "%.6f" % (bandwidth_gb_s if intra_gb_s is None else intra_gb_s)]
    elif c.get("nodes"):
        argv += ["--gpus-per-node", str(c["per_node"]), "--plan", plan_file(c, bin_dir, work)]
        argv += [
            "--intra-bandwidth",
            "%.6f" % intra_gb_s,
            "--collectives",
            "flat" if c["collectives"] == "flat" else "auto",
        ]
    else:  # shaped_net.py: one network namespace per rank
        argv += ["--gpus-per-node", "1", *plan_inputs(c, bin_dir, work)]
    argv += ["--inter-bandwidth", "%.6f" % bandwidth_gb_s, "--format", "json"]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise BadInput("muonshardctl simulate: %s" % r.stderr.strip()[-500:])
    out = {}
    for s in json.loads(r.stdout)["schedules"]:
        schedule = s["schedule"].split()[-1]
        out[schedule] = 1000.0 * s["step_seconds"]
        if schedule != "sequential":
            continue
        # The terms as the comm-only and compute-only modes run them: from the sequential schedule, where
        # the collectives take no CPU from compute (NOTE [Host CPU] in sim/cluster.h).
        busy = [rank["busy_seconds"] for rank in s["ranks"]]
        out["comm"] = 1000.0 * max(b["reduce"] + b["sync"] + b["tp"] for b in busy)
        out["compute"] = 1000.0 * max(b["ns"] + b["muon"] + b["adamw"] for b in busy)
        out["inter_node_mb"] = sum(rank["wire_bytes"]["inter_node"] for rank in s["ranks"]) / 1e6
    return out


def cluster_file(kernels, ranks, host_cores, work, scale=1.0, host_gb_s=None, tag=""):
    """The cpu preset with the kernels bench's rates, as one rank of `ranks` on `host_cores` cores gets them
    (times `scale`, the compute calibration), and the collective bytes a rank's CPU moves (`host_gb_s`, the
    link's CPU cap: NOTE [Host CPU] in sim/cluster.h; None: the preset's). `tag` names a variant's file."""
    gemm, table, threads, elementwise = kernel_terms(kernels)
    # A thread's rate, times the cores a rank gets (a rank runs one BLAS thread).
    core = core_share(ranks, host_cores)
    share = core / (threads or host_cores)
    # Every namespace of shaped_net.py has one link (a rank's, or with --nodes a node's, shared).
    cluster = {
        "preset": "cpu",
        "gemm_tflops": round(gemm * share * scale, 5),
        "ns_efficiency": table,
        "inter_node_shared": True,
    }
    if elementwise:  # the element-wise kernels as the GEMM rate, without the calibration; calls take 1 / core
        (muon_gb_s, muon_us), (adamw_gb_s, adamw_us) = elementwise["muon"], elementwise["adamw"]
        cluster["hbm_gb_s"] = round(muon_gb_s * share, 5)
        cluster["hbm_efficiency"] = 1.0
        cluster["adamw_efficiency"] = round(min(1.0, adamw_gb_s / muon_gb_s), 4)
        cluster["kernel_launch_us"] = round((muon_us + adamw_us) / 2 / core, 4)
        cluster["ns_call_us"] = round(elementwise["ns_call_us"] / core, 4)
    if host_gb_s is not None:
        cluster["host_collective_gb_s"] = round(host_gb_s, 5)
    path = os.path.join(work, "cpu-measured-%d%s.json" % (ranks, tag))
    with open(path, "w") as f:
        json.dump(cluster, f, indent=1)
    return path, cluster


def fit_compute(configs, model, ranks, kernels, host_cores, bin_dir, work):
    """The factor on the GEMM rate that makes `model`'s compute-only figure at `ranks` ranks (mean over the
    rates and loopback: compute-only touches no network) the predicted one; None when the logs have none.
    Only Newton-Schulz scales with the GEMM rate (the element-wise updates are bound by memory), so the
    factor is found by a few fixed-point rounds."""
    runs = [c for c in configs if c["model"] == model and c["ranks"] == ranks and not c["nodes"]]
    runs = [c for c in runs if c["measured"]["compute"] > 0]  # not nan
    if not runs:
        return None
    measured = sum(c["measured"]["compute"] for c in runs) / len(runs)
    scale = 1.0
    for _ in range(FIT_ROUNDS):
        path, _ = cluster_file(kernels, ranks, host_cores, work, scale)
        scale *= predict(runs[0], path, bin_dir, work, 1e4)["compute"] / measured
    return scale


def core_share(ranks, host_cores):
    """The cores one of `ranks` ranks on `host_cores` cores gets."""
    return min(1.0, host_cores / ranks)


def fit_link(configs, model, clusters, bin_dir, work):
    """(efficiency, cap GB/s, the world size it was fitted at) of the link from `model`'s comm-only figures
    at its largest world size in the logs (see the module's docstring)."""
    per_rank = [c for c in configs if not c["nodes"] and not c.get("loopback")]
    ranks = max((c["ranks"] for c in per_rank if c["model"] == model), default=None)
    points = []
    chosen = (c for c in per_rank if c["model"] == model and c["ranks"] == ranks)
    for c in sorted(chosen, key=lambda c: c["gbit_payload"]):
        b = c["gbit_payload"] / 8.0
        at_b = predict(c, clusters[c["ranks"]], bin_dir, work, b)["comm"]
        latency = predict(c, clusters[c["ranks"]], bin_dir, work, 1e4)["comm"]  # the bandwidth term gone
        measured = c["measured"]["comm"]
        if not measured > latency:
            raise BadInput(
                "%s at %s: comm %.1f ms is not above the model's latency %.1f" % (model, c["rate"], measured, latency)
            )
        points.append((b, b * (at_b - latency) / (measured - latency)))  # (link, effective rate)
    if not points:
        raise BadInput("--calibrate %s: no such model in the logs" % model)
    efficiency = points[0][1] / points[0][0]
    cap = min((r for b, r in points[1:] if r < efficiency * b), default=float("inf"))
    return efficiency, cap, ranks


def fit_lo(configs, model, kernels, host_cores, scales, bin_dir, work):
    """{world size: GB/s} a rank's collectives move over a machine's lo, from `model`'s comm-only figure on
    loopback (shaped_net.py --loopback-only) at each world size the logs have one for; {} without."""
    rates = {}
    for c in configs:
        if not (c.get("loopback") and c["model"] == model and c["measured"]["comm"] > 0):
            continue
        path, _ = cluster_file(kernels, c["ranks"], host_cores, work, scales[c["ranks"]])
        probe = 1.0
        at_probe = predict(c, path, bin_dir, work, probe, probe)["comm"]
        latency = predict(c, path, bin_dir, work, probe, 1e4)["comm"]
        if not c["measured"]["comm"] > latency:
            raise BadInput(
                "%s on loopback at %d ranks: comm %.1f ms is not above the model's latency %.1f"
                % (model, c["ranks"], c["measured"]["comm"], latency)
            )
        rates[c["ranks"]] = probe * (at_probe - latency) / (c["measured"]["comm"] - latency)
    return rates


def nearest(sizes, n):
    """The world size in `sizes` nearest to `n` (the larger of two as near)."""
    return min(sizes, key=lambda f: (abs(f - n), -f))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", action="append", default=[], help="a shaped_net.py log (repeat)")
    p.add_argument("--kernels", required=True, help="muonshard-bench-kernels output of the same session")
    p.add_argument("--calibrate", default="Qwen3-30B-A3B", help="the model whose comm-only figures fit the link")
    p.add_argument(
        "--host-cores", type=int, default=os.cpu_count(), help="cores the ranks share (default: this machine's)"
    )
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--goal", type=float, help="exit 1 when a step prediction is off by more than this many %%")
    p.add_argument("--cluster-out", help="also write the cluster file (the first world size's) here")
    a = p.parse_args()
    try:
        if not a.log:
            raise BadInput("--log: at least one shaped_net.py log")
        if a.host_cores is None or a.host_cores < 1:
            raise BadInput("--host-cores: must be >= 1")
        configs = [c for path in a.log for c in parse_log(path)]
        with tempfile.TemporaryDirectory(prefix="muonshard-validate-") as work:
            world_sizes = sorted({c["ranks"] for c in configs})
            scales = {
                n: fit_compute(configs, a.calibrate, n, a.kernels, a.host_cores, a.bin, work) for n in world_sizes
            }
            fitted = [n for n in world_sizes if scales[n] is not None]
            for n in world_sizes:  # no compute-only figure at this world size: the nearest one's factor
                if scales[n] is None:
                    scales[n] = scales[nearest(fitted, n)] if fitted else 1.0
            clusters, shown = {}, None
            threads = kernel_terms(a.kernels)[2]
            for ranks in world_sizes:
                clusters[ranks], cluster = cluster_file(a.kernels, ranks, a.host_cores, work, scales[ranks])
                shown = shown or cluster
                print(
                    "cluster for %d ranks on %d cores, kernels from %s BLAS thread%s (GEMM rate x %.3f, from %s's "
                    "compute-only figure%s): %s"
                    % (
                        ranks,
                        a.host_cores,
                        threads or a.host_cores,
                        "" if threads == 1 else "s",
                        scales[ranks],
                        a.calibrate,
                        "" if ranks in fitted else " at %s ranks" % (nearest(fitted, ranks) if fitted else "no"),
                        json.dumps(cluster),
                    )
                )
            if a.cluster_out:
                with open(a.cluster_out, "w") as f:
                    json.dump(shown, f, indent=1)
            efficiency, cap, fit_ranks = fit_link(configs, a.calibrate, clusters, a.bin, work)
            print(
                "link, fitted on %s's comm-only figures at %d ranks: efficiency %.3f of the payload rate, "
                "cap %s GB/s per rank"
                % (a.calibrate, fit_ranks, efficiency, "none" if cap == float("inf") else "%.4f" % cap)
            )
            lo = fit_lo(configs, a.calibrate, a.kernels, a.host_cores, scales, a.bin, work)
            if lo:
                print(
                    "lo, fitted on %s's comm-only figures on loopback: %s GB/s per rank"
                    % (a.calibrate, ", ".join("%.4f at %d ranks" % (lo[n], n) for n in sorted(lo)))
                )

            if any(c.get("loopback") for c in configs) and not lo:
                model = next(c["model"] for c in configs if c.get("loopback"))
                raise BadInput(
                    "%s on loopback: lo is fitted on --calibrate %s's comm-only one on loopback, and the logs have "
                    "none" % (model, a.calibrate)
                )

            def share(ranks, of):  # the CPU a rank moving bytes gets, with `ranks` of them, over the fit's
                return core_share(ranks, a.host_cores) / core_share(of, a.host_cores)

            def lo_rate(ranks):  # the fit at this world size, or the nearest one's for the cores a rank gets
                if not lo:
                    return cap * share(ranks, fit_ranks)  # no loopback figure: the link's cap stands in
                n = nearest(lo, ranks)
                return lo[n] * share(ranks, n)

            def cpu_scale(ranks):  # the cap with `ranks` rings' ranks moving bytes, over the fit's
                return lo_rate(ranks) / lo_rate(fit_ranks) if lo else share(ranks, fit_ranks)

            if cap != float("inf"):  # the cap is CPU time: what a rank's CPU moves (NOTE [Host CPU])
                for ranks in clusters:
                    host = cap * cpu_scale(ranks)
                    clusters[ranks], _ = cluster_file(a.kernels, ranks, a.host_cores, work, scales[ranks], host)
            print(
                "%-16s %5s %-18s %-10s %10s %10s %8s"
                % ("model", "ranks", "rate", "term", "measured", "predicted", "error")
            )
            worst = worst_bytes = 0.0
            for c in configs:
                if c.get("loopback"):
                    # Every rank on the machine's lo, bound by its CPU; the collectives take that CPU too.
                    rate = lo_rate(c["ranks"])
                    path, _ = cluster_file(a.kernels, c["ranks"], a.host_cores, work, scales[c["ranks"]], rate, "-lo")
                    pred = predict(c, path, a.bin, work, rate, rate)
                else:
                    link = efficiency * c["gbit_payload"] / 8.0
                    # The ranks moving bytes at once share the cores: all of them, but in the cross level of a
                    # hierarchical reduce or broadcast one per node (the root's column; a reduce-scatter's
                    # columns split the node's one link, below that).
                    crossing = c["nodes"] if c.get("collectives") == "hierarchical" else c["ranks"]
                    bandwidth = min(link, cap * cpu_scale(crossing))
                    # --nodes: a node's lo carries its ranks' rings as a machine's lo with that many ranks
                    # does (the fit on loopback at ranks per node, or without one the link's cap), at the
                    # cores a rank gets with all the host's ranks moving bytes (each node's level inside it
                    # runs at the same time).
                    per_node = c.get("per_node", c["ranks"])
                    intra = lo_rate(per_node) * share(c["ranks"], per_node)
                    pred = predict(c, clusters[c["ranks"]], a.bin, work, bandwidth, intra)
                label = c["rate"]
                if c["nodes"]:
                    label = "%s@%dx%d-%s" % (c["rate"], c["nodes"], c["per_node"], c["collectives"][:4])
                terms = list(MODES)
                if "inter_node_mb" in c["measured"]:
                    terms.append("inter_node_mb")
                calibrated_comm = c["ranks"] in lo if c.get("loopback") else c["ranks"] == fit_ranks
                for term in terms:
                    m, q = c["measured"][term], pred.get(term, float("nan"))
                    err = 100.0 * (q - m) / m if m == m and m > 0 else float("nan")
                    fitted_term = (
                        c["model"] == a.calibrate
                        and not c["nodes"]
                        and ((term == "compute" and c["ranks"] in fitted) or (term == "comm" and calibrated_comm))
                    )
                    if term in ("sequential", "pipelined") and err == err:
                        worst = max(worst, abs(err))
                    if term == "inter_node_mb" and err == err:
                        worst_bytes = max(worst_bytes, abs(err))
                    print(
                        "%-16s %5d %-18s %-10s %10.1f %10.1f %+7.1f%%%s"
                        % (c["model"], c["ranks"], label, term, m, q, err, "  (calibration)" if fitted_term else "")
                    )
            print("worst step error: %.1f %%" % worst)
            if any("inter_node_mb" in c["measured"] for c in configs):
                print("worst inter-node bytes error: %.1f %%" % worst_bytes)
            if a.goal is not None and worst > a.goal:
                return 1
    except BadInput as e:
        print("validate_shaped_net: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
