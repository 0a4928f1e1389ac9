#!/usr/bin/env python3
"""deploy_metrics_scrape: every metric name the Grafana dashboard and the
Prometheus rules use appears in a real /metrics scrape.

Starts the real muonshard-coordinator and one real muonshard-worker on
127.0.0.1 (a one-rank job of the bundled tiny-llama model, running until it
is stopped), scrapes both endpoints over HTTP after 2 steps, while the job
runs its plan, and compares. Also checks that each binary exports every
family its header declares, that the coordinator's plan gauges of the job
(NOTE [Plan gauges per job] in coordinator/metrics.h) carry the job
and the version it runs, and that they are gone once its worker has left."""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc

JOB = "scrape-check"
# Exported only for ranks with a device capacity (Topology.device_memory_bytes).
CAPACITY_ONLY = (
    "muonshard_plan_rank_memory_headroom_bytes",
    "muonshard_job_plan_rank_memory_headroom_bytes",
    "muonshard_worker_plan_memory_headroom_bytes",
)


def has_capacity(plan):
    return any(int(r.get("memory", {}).get("capacity_bytes", 0)) > 0 for r in plan.get("ranks", []))


def check_job_plan_series(c, text, version, plan):
    """The plan gauges of JOB: labelled with the version it runs, per rank and
    term, equal to the plan's figures."""
    info = dc.sample_values(text, "muonshard_job_plan_info")
    mine = [k for k in info if f'job="{JOB}"' in k]
    c.check(
        len(mine) == 1
        and f'plan_version="{version}"' in mine[0]
        and f'content_hash="{plan["content_hash"]}"' in mine[0]
        and 'world_size="1"' in mine[0]
        and 'model="tiny-llama"' in mine[0],
        f"one muonshard_job_plan_info for {JOB} at version {version}: {mine}",
    )
    labels = f'job="{JOB}",plan_version="{version}"'
    state = {k: v for k, v in dc.sample_values(text, "muonshard_job_plan_optimizer_state_bytes").items() if labels in k}
    want = int(plan["ranks"][0]["optimizer_state_bytes"])
    c.check(
        state and sum(state.values()) == want,
        f"rank 0's muonshard_job_plan_optimizer_state_bytes {state} sum to the plan's {want}",
    )
    terms = {
        k for k in dc.sample_values(text, "muonshard_job_plan_rank_memory_bytes") if labels in k and 'rank="0"' in k
    }
    c.check(len(terms) == 8, f"8 memory terms of rank 0 in the job's plan: {sorted(terms)}")
    ratio = [k for k in dc.sample_values(text, "muonshard_job_plan_memory_imbalance_ratio") if labels in k]
    c.check(len(ratio) == 1, f"one muonshard_job_plan_memory_imbalance_ratio for the job: {ratio}")


def job_plan_samples(text):
    return [line for line in text.splitlines() if line.startswith("muonshard_job_plan_") and f'job="{JOB}"' in line]


def check_ended_job_series_removed(c, stack):
    """SIGTERM stops the worker (it leaves, or fails at the heartbeat
    timeout): the job runs no plan any more and its plan series go."""
    _, worker, _ = next(p for p in stack.procs if p[0] == "worker-0")
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    url = f"http://127.0.0.1:{stack.coordinator_metrics_port}/metrics"
    deadline = time.monotonic() + 40  # past the 10 s heartbeat timeout
    left = job_plan_samples(dc.scrape(url))
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = job_plan_samples(dc.scrape(url))
    c.check(not left, f"no plan series of {JOB} once its worker is gone: {left[:3]}")
    c.check(
        any(f'job="{JOB}"' in k for k in dc.sample_values(dc.scrape(url), "muonshard_workers")),
        "the job's worker counts stay",
    )


def main():
    scratch = dc.scratch_dir("muonshard-deploy-scrape-")
    stack = dc.LoopbackStack(scratch)
    for b in ("muonshard-coordinator", "muonshardctl"):
        if stack.binary(b) is None:
            print(f"FAIL: {stack.bin}/{b} is missing (build it first)")
            sys.exit(1)
    if stack.binary("muonshard-worker") is None:
        dc.skip(f"{stack.bin}/muonshard-worker is not built")

    c = dc.Checker("deploy_metrics_scrape")
    try:
        stack.start_coordinator()
        version = stack.submit(os.path.join(dc.REPO, "examples", "manifests", "tiny-llama.json"), world_size=1)
        plan = stack.plan(version)
        # Steps until stopped: the job runs its plan while it is scraped.
        stack.start_workers(JOB, world_size=1, plan_version=version, steps=1_000_000_000)
        stack.wait_steps(2, timeout=120)
        coordinator_text = dc.scrape(f"http://127.0.0.1:{stack.coordinator_metrics_port}/metrics")
        worker_text = dc.scrape(f"http://127.0.0.1:{stack.worker_metrics_ports[0]}/metrics")
        check_job_plan_series(c, coordinator_text, version, plan)
        check_ended_job_series_removed(c, stack)
    finally:
        stack.stop()

    coordinator = dc.sample_names(coordinator_text)
    worker = dc.sample_names(worker_text)
    scraped = coordinator | worker

    # What the dashboard and the rules use.
    with open(dc.DASHBOARD) as f:
        dashboard = json.load(f)
    rule_exprs, recorded = dc.rules_exprs(dc.load_yaml(dc.RULES))
    used = {}
    for where, expr in dc.dashboard_exprs(dashboard) + rule_exprs:
        for name in dc.promql_metric_names(expr):
            used.setdefault(name, where)
    c.check(len(used) >= 15, f"the dashboard and rules use at least 15 names (found {len(used)})")
    # Without a device capacity in the plan, the headroom gauges have no series.
    conditional = set() if has_capacity(plan) else set(CAPACITY_ONLY)
    for name, where in sorted(used.items()):
        if name in recorded:
            continue  # defined by a recording rule, itself checked here
        c.check(name in scraped or name in conditional, f"{name} (used by {where}) is in no /metrics scrape")

    # Each binary exports what its header declares (families appear as
    # themselves, or as _bucket/_sum/_count for histograms).
    def exported(names, family):
        return family in names or family + "_bucket" in names

    for family in dc.header_exported_names(os.path.join(dc.REPO, "coordinator", "metrics.h"), "kExportedMetrics"):
        c.check(exported(coordinator, family) or family in conditional, f"coordinator /metrics lacks {family}")
    for family in dc.header_exported_names(os.path.join(dc.REPO, "worker", "metrics.h"), "kWorkerExportedMetrics"):
        c.check(exported(worker, family) or family in conditional, f"worker /metrics lacks {family}")

    # The labels the dashboard groups by are there.
    c.check(f'job="{JOB}"' in worker_text and 'rank="0"' in worker_text, "worker series carry job and rank labels")
    c.check(
        any(f'job="{JOB}"' in k for k in dc.sample_values(coordinator_text, "muonshard_workers")),
        "the coordinator's muonshard_workers has the job label",
    )
    print(
        f"scraped {len(coordinator)} coordinator and {len(worker)} worker sample names; "
        f"{len(used)} names used by the dashboard and rules"
    )
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
