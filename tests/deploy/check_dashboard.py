#!/usr/bin/env python3
"""deploy_dashboard: deploy/grafana/muonshard.json is a well-formed Grafana
dashboard whose every panel has a query, whose data source is the provisioned
Prometheus, and whose queries (and the Prometheus rules') name only metrics the
binaries declare (kExportedMetrics, kWorkerExportedMetrics). The integration
test deploy_metrics_scrape checks the same names against real /metrics."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc


def check_grouped_by_job(c, dashboard):
    """With `$job` = All (several jobs) no query adds up series of different
    jobs: every aggregation of a query filtered on $job keeps the job label,
    except in a row repeated per job (where $job is one job)."""
    for p, row_repeat in dc.panels_in_order(dashboard):
        if p.get("type") == "row" or row_repeat == "job" or p.get("repeat") == "job":
            continue
        for t in p.get("targets") or []:
            expr = t.get("expr", "")
            if "$job" not in expr:
                continue
            try:
                aggs = dc.aggregations(expr)
            except ValueError as e:
                c.check(False, f"panel {p.get('title')!r} target {t.get('refId')}: {e}")
                continue
            for op, labels in aggs:
                c.check(
                    labels is not None and "job" in labels,
                    f"panel {p.get('title')!r} target {t.get('refId')}: {op} keeps the job label "
                    f"(by (job, ...)), so $job = All does not add up jobs: {expr!r}",
                )


def check_plan_memory_panel(c, dashboard):
    """The per-job row has a per-rank memory panel: the plan's memory terms
    (not their total) stacked by term, one bar per rank."""
    panels = [
        p
        for p, row_repeat in dc.panels_in_order(dashboard)
        if row_repeat == "job"
        and any("muonshard_job_plan_rank_memory_bytes" in t.get("expr", "") for t in p.get("targets") or [])
    ]
    if not c.check(len(panels) == 1, f"one memory-by-term panel in the per-job row ({len(panels)})"):
        return
    p = panels[0]
    exprs = [t["expr"] for t in p["targets"]]
    c.check(
        all('term!="total"' in e and "$job" in e for e in exprs),
        f"the memory panel stacks the terms of job $job, without their total: {exprs}",
    )
    c.check(
        p["type"] == "barchart" and p["options"].get("stacking") == "normal", "the memory panel is a stacked bar chart"
    )
    grouping = [t["options"] for t in p.get("transformations") or [] if t["id"] == "groupingToMatrix"]
    c.check(
        grouping and grouping[0].get("rowField") == "rank" and grouping[0].get("columnField") == "term",
        "the memory panel has a bar per rank and a stack per term",
    )


def main():
    c = dc.Checker("deploy_dashboard")
    with open(dc.DASHBOARD) as f:
        dashboard = json.load(f)  # invalid JSON fails here
    provisioning = dc.load_yaml(
        os.path.join(dc.REPO, "deploy", "grafana", "provisioning", "datasources", "prometheus.yml")
    )
    ds_uids = {d["uid"] for d in provisioning["datasources"] if d["type"] == "prometheus"}
    providers = dc.load_yaml(os.path.join(dc.REPO, "deploy", "grafana", "provisioning", "dashboards", "muonshard.yml"))[
        "providers"
    ]

    c.check(dashboard.get("uid") == "muonshard", "dashboard uid is muonshard")
    c.check(isinstance(dashboard.get("schemaVersion"), int), "schemaVersion set")
    c.check(
        any(p["options"]["path"] == "/etc/dashboards/muonshard" for p in providers),
        "the dashboard provider reads /etc/dashboards/muonshard",
    )
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds_var = variables.get("datasource", {})
    c.check(
        ds_var.get("type") == "datasource" and ds_var.get("query") == "prometheus",
        "a `datasource` variable of type prometheus",
    )
    c.check(
        ds_var.get("current", {}).get("value") in ds_uids,
        f"the datasource variable defaults to a provisioned uid {sorted(ds_uids)}",
    )

    panels = dc.dashboard_panels(dashboard)
    ids = [p["id"] for p in panels]
    c.check(len(ids) == len(set(ids)), "panel ids are unique")
    graph_panels = [p for p in panels if p["type"] != "row"]
    c.check(len(graph_panels) >= 8, f"at least 8 panels (has {len(graph_panels)})")
    for p in graph_panels:
        title = p.get("title", "?")
        targets = p.get("targets") or []
        c.check(targets and all(t.get("expr", "").strip() for t in targets), f"panel {title!r} has queries, none empty")
        c.check(p.get("datasource", {}).get("uid") == "${datasource}", f"panel {title!r} uses the datasource variable")
        for t in targets:
            c.check(
                t.get("datasource", {}).get("uid") == "${datasource}",
                f"panel {title!r} target {t.get('refId')} uses the datasource variable",
            )
        gp = p.get("gridPos", {})
        c.check(
            gp.get("w", 0) > 0 and gp.get("h", 0) > 0 and gp.get("x", 0) + gp.get("w", 0) <= 24,
            f"panel {title!r} has a valid gridPos",
        )
        if p.get("repeat"):
            c.check(p["repeat"] in variables, f"panel {title!r} repeats over a defined variable")

    # The panels the issue asks for, by the metric each is built on.
    exprs = dc.dashboard_exprs(dashboard)
    used = {}
    for where, expr in exprs:
        try:
            names = dc.promql_metric_names(expr)
        except ValueError as e:
            c.check(False, f"{where}: cannot parse {expr!r}: {e}")
            continue
        c.check(names, f"{where}: names a metric ({expr!r})")
        for n in names:
            used.setdefault(n, []).append(where)
    # The plan panels show the plan each job runs (NOTE [Plan gauges per job]
    # in coordinator/metrics.h), not the newest stored one.
    for must in (
        "muonshard_job_plan_optimizer_state_bytes",
        "muonshard_worker_optimizer_state_bytes",
        "muonshard_job_plan_ns_flops",
        "muonshard_job_plan_rank_memory_bytes",
        "muonshard_job_plan_memory_imbalance_ratio",
        "muonshard_job_plan_memory_max_over_mean_ratio",
        "muonshard_job_plan_memory_max_over_lower_bound_ratio",
        "muonshard_worker_step_seconds_bucket",
        "muonshard_worker_comm_bytes_total",
        "muonshard_worker_ns_flops_total",
        "muonshard_worker_plan_version",
        "muonshard_worker_generation",
        "muonshard_job_generation",
        "muonshard_workers",
    ):
        c.check(must in used, f"the dashboard shows {must}")
    heatmaps = [p for p in graph_panels if p["type"] == "heatmap"]
    c.check(
        heatmaps
        and all(t.get("format") == "heatmap" and "_bucket" in t["expr"] for p in heatmaps for t in p["targets"]),
        "step time heatmap from the histogram buckets",
    )

    for where, expr in exprs:
        if any(n.startswith("muonshard_job_plan_") for n in dc.promql_metric_names(expr)):
            c.check("$job" in expr, f"{where}: a per-job plan gauge filtered on $job: {expr!r}")
    check_plan_memory_panel(c, dashboard)
    check_grouped_by_job(c, dashboard)
    # A row per job, showing its ranks: the slow rank.
    job_rows = [p for p in dashboard["panels"] if p.get("type") == "row" and p.get("repeat") == "job"]
    c.check(job_rows, "a row repeated per job")
    per_rank = [
        p
        for p, row_repeat in dc.panels_in_order(dashboard)
        if row_repeat == "job"
        and any(
            labels and {"job", "rank"} <= labels
            for t in p.get("targets") or []
            for _, labels in dc.aggregations(t.get("expr", ""))
        )
    ]
    c.check(len(per_rank) >= 4, f"the per-job row has per-rank panels (by (job, rank)): {len(per_rank)}")
    for must in (
        "muonshard_worker_steps_total",
        "muonshard_worker_restarts_total",
        "muonshard_coordinator_job_events_total",
        "muonshard_rpcs_total",
        "muonshard_coordinator_store_write_failures_total",
        "muonshard_worker_step_seconds_sum",
        "muonshard_worker_step_seconds_count",
    ):
        c.check(must in used, f"the dashboard shows {must}")

    # Every name is one the binaries declare (exactly, with _bucket/_sum/
    # _count only for histograms).
    _families, series = dc.exported_names_from_headers()
    rules = dc.load_yaml(dc.RULES)
    rule_exprs, recorded = dc.rules_exprs(rules)
    for where, expr in rule_exprs:
        for n in dc.promql_metric_names(expr):
            used.setdefault(n, []).append(where)
    for name, wheres in sorted(used.items()):
        c.check(
            name in series or name in recorded,
            f"{name} (used by {wheres[0]}) is not exported by the coordinator or the worker",
        )
    print(f"metric names used: {', '.join(sorted(used))}")
    c.finish()


if __name__ == "__main__":
    main()
