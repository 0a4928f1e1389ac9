#!/usr/bin/env python3
"""deploy_metrics_scrape: every metric name the Grafana dashboard and the
Prometheus rules use appears in a real /metrics scrape.

Starts the real muonshard-coordinator and one real muonshard-worker on
127.0.0.1 (a one-rank job of the bundled tiny-llama model, 2 steps, then the
worker lingers), scrapes both endpoints over HTTP and compares. Also checks
that each binary exports every family its header declares."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc  # noqa: E402


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
        version = stack.submit(os.path.join(dc.REPO, "examples", "manifests", "tiny-llama.json"),
                               world_size=1)
        stack.start_workers("scrape-check", world_size=1, plan_version=version, steps=2)
        stack.wait_steps(2, timeout=120)
        coordinator_text = dc.scrape(f"http://127.0.0.1:{stack.coordinator_metrics_port}/metrics")
        worker_text = dc.scrape(f"http://127.0.0.1:{stack.worker_metrics_ports[0]}/metrics")
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
    for name, where in sorted(used.items()):
        if name in recorded:
            continue  # defined by a recording rule, itself checked here
        c.check(name in scraped, f"{name} (used by {where}) is in no /metrics scrape")

    # Each binary exports what its header declares (families appear as
    # themselves, or as _bucket/_sum/_count for histograms).
    def exported(names, family):
        return family in names or family + "_bucket" in names

    for family in dc.header_exported_names(
            os.path.join(dc.REPO, "coordinator", "service", "metrics.h"), "kExportedMetrics"):
        c.check(exported(coordinator, family), f"coordinator /metrics lacks {family}")
    for family in dc.header_exported_names(
            os.path.join(dc.REPO, "worker", "metrics.h"), "kWorkerExportedMetrics"):
        c.check(exported(worker, family), f"worker /metrics lacks {family}")

    # The labels the dashboard groups by are there.
    c.check('job="scrape-check"' in worker_text and 'rank="0"' in worker_text,
            "worker series carry job and rank labels")
    c.check(any('job="scrape-check"' in k for k in
                dc.sample_values(coordinator_text, "muonshard_workers")),
            "the coordinator's muonshard_workers has the job label")
    print(f"scraped {len(coordinator)} coordinator and {len(worker)} worker sample names; "
          f"{len(used)} names used by the dashboard and rules")
    import shutil
    shutil.rmtree(scratch, ignore_errors=True)
    c.finish()


if __name__ == "__main__":
    main()
