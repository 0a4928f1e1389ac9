#!/usr/bin/env python3
"""deploy_prometheus_server: a real Prometheus server (Debian's `prometheus`)
scrapes the real coordinator and two real workers on 127.0.0.1, with the
scrape jobs and rules of deploy/prometheus/prometheus.yml (targets and
intervals replaced for loopback), and the imbalance metrics read back through
its HTTP query API equal the plan's; every rule and every dashboard query
evaluates there.

The job: the bundled tiny-llama model on 2 ranks with the seed policy (its
optimizer state is uneven: (max - min) / max = 0.88), Gloo steps until the
check stops it (after at least 3): the coordinator exports the plan of a job
while it runs (NOTE [Plan gauges per job] in coordinator/metrics.h)."""

import json
import math
import os
import shutil
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc

JOB = "prom-check"
WORLD = 2
STEPS = 3


def loopback_config(stack, scratch):
    """deploy/prometheus/prometheus.yml with loopback targets, 1 s intervals
    and the rule file by absolute path."""
    import yaml

    cfg = dc.load_yaml(dc.PROMETHEUS_CONFIG)
    cfg["global"].update({"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"})
    cfg["rule_files"] = [os.path.join(os.path.dirname(dc.PROMETHEUS_CONFIG), f) for f in cfg["rule_files"]]
    targets = {
        "muonshard-coordinator": [f"127.0.0.1:{stack.coordinator_metrics_port}"],
        "muonshard-worker": [f"127.0.0.1:{p}" for p in stack.worker_metrics_ports],
    }
    for sc in cfg["scrape_configs"]:
        if sc["job_name"] not in targets:
            raise RuntimeError(f"unexpected scrape job {sc['job_name']} in {dc.PROMETHEUS_CONFIG}")
        sc["static_configs"][0]["targets"] = targets.pop(sc["job_name"])
    if targets:
        raise RuntimeError(f"{dc.PROMETHEUS_CONFIG} lacks scrape jobs {sorted(targets)}")
    path = os.path.join(scratch, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path, cfg


def query(base, promql):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(dc.scrape(url))
    if body.get("status") != "success":
        raise RuntimeError(f"query {promql!r}: {body}")
    return body["data"]["result"]


def wait_for(base, promql, want, timeout, accept=lambda result: True):
    """Polls until `promql` returns `want` series that `accept` (bounded);
    returns the last answer either way once it has `want` series."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = query(base, promql)
            if len(last) >= want and accept(last):
                return last
        except (OSError, RuntimeError) as e:
            last = str(e)
        time.sleep(0.5)
    if isinstance(last, list) and len(last) >= want:
        return last  # the caller's check reports the value
    raise RuntimeError(f"{promql!r}: wanted {want} series within {timeout}s, last answer: {last}")


def main():
    prometheus = dc.require_tool("prometheus")
    scratch = dc.scratch_dir("muonshard-deploy-prom-")
    stack = dc.LoopbackStack(scratch)
    for b in ("muonshard-coordinator", "muonshardctl"):
        if stack.binary(b) is None:
            print(f"FAIL: {stack.bin}/{b} is missing (build it first)")
            sys.exit(1)
    if stack.binary("muonshard-worker") is None:
        dc.skip(f"{stack.bin}/muonshard-worker is not built")

    c = dc.Checker("deploy_prometheus_server")
    try:
        stack.start_coordinator()
        version = stack.submit(
            os.path.join(dc.REPO, "examples", "manifests", "tiny-llama.json"), world_size=WORLD, policy="seed"
        )
        plan = stack.plan(version)
        stats = plan["stats"]
        plan_imbalance = float(stats.get("memory_imbalance", 0))
        c.check(plan_imbalance > 0.1, f"the test plan is uneven (imbalance {plan_imbalance})")
        stack.start_workers(JOB, world_size=WORLD, plan_version=version, steps=1_000_000_000)
        stack.wait_steps(STEPS, timeout=180)

        config_path, _ = loopback_config(stack, scratch)
        r = dc.run(["promtool", "check", "config", config_path]) if shutil.which("promtool") else None
        if r is not None:
            c.check(r.returncode == 0, f"promtool accepts the loopback config: {r.stdout}{r.stderr}")
        port = dc.free_port()
        base = f"http://127.0.0.1:{port}"
        stack.spawn(
            "prometheus",
            [
                prometheus,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={os.path.join(scratch, 'tsdb')}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
        )

        # Every target up.
        up = wait_for(base, "up == 1", 1 + WORLD, timeout=60)
        c.check(len(up) == 1 + WORLD, f"{1 + WORLD} targets up: {up}")

        # The coordinator's gauge of the latest (= this) plan.
        got = wait_for(base, "muonshard_plan_memory_imbalance_ratio", 1, timeout=30)
        c.check(
            len(got) == 1 and math.isclose(float(got[0]["value"][1]), plan_imbalance, rel_tol=1e-9),
            f"coordinator imbalance via Prometheus {got} == plan {plan_imbalance}",
        )
        c.check(
            got and got[0]["metric"].get("job") == "muonshard-coordinator",
            f"the coordinator series keeps the scrape job's label: {got}",
        )

        # Each worker's gauge of the plan it runs, labelled with the training
        # job (honor_labels) and its rank.
        got = wait_for(base, f'muonshard_worker_plan_memory_imbalance_ratio{{job="{JOB}"}}', WORLD, timeout=30)
        c.check(
            sorted(s["metric"].get("rank") for s in got) == [str(r) for r in range(WORLD)],
            f"one imbalance series per rank: {got}",
        )
        for s in got:
            c.check(
                math.isclose(float(s["value"][1]), plan_imbalance, rel_tol=1e-9),
                f"rank {s['metric'].get('rank')} imbalance {s['value'][1]} == plan {plan_imbalance}",
            )

        # The recording rule over what the workers allocated, against the
        # workers' own /metrics and the plan's per-rank figures.
        allocated = []
        for p in stack.worker_metrics_ports:
            v = dc.sample_values(dc.scrape(f"http://127.0.0.1:{p}/metrics"), "muonshard_worker_optimizer_state_bytes")
            allocated.extend(v.values())
        measured = (max(allocated) - min(allocated)) / max(allocated)
        # The rule may first run before both targets were scraped (one rank:
        # max = min): wait for an evaluation over both.
        got = wait_for(
            base,
            f'job:muonshard_worker_optimizer_state_bytes:imbalance_ratio{{job="{JOB}"}}',
            1,
            timeout=30,
            accept=lambda r: math.isclose(float(r[0]["value"][1]), measured, rel_tol=1e-9),
        )
        c.check(
            len(got) == 1 and math.isclose(float(got[0]["value"][1]), measured, rel_tol=1e-9),
            f"recorded allocated imbalance {got} == {measured} from the workers' /metrics",
        )
        planned = [int(r["optimizer_state_bytes"]) for r in plan["ranks"]]
        c.check(
            math.isclose(measured, (max(planned) - min(planned)) / max(planned), rel_tol=1e-6),
            f"the workers allocated what the plan assigns: {allocated} vs {planned}",
        )

        # Per-rank state bytes as the dashboard's bar panel queries them.
        got = wait_for(base, "sum by (rank) (muonshard_plan_optimizer_state_bytes)", WORLD, timeout=30)
        by_rank = {s["metric"]["rank"]: float(s["value"][1]) for s in got}
        c.check(
            by_rank == {str(i): float(b) for i, b in enumerate(planned)},
            f"per-rank plan bytes via Prometheus {by_rank} == plan {planned}",
        )
        # The same from the plan the job runs, labelled with its version.
        got = wait_for(
            base,
            f'sum by (job, plan_version, rank) (muonshard_job_plan_optimizer_state_bytes{{job="{JOB}"}})',
            WORLD,
            timeout=30,
        )
        by_rank = {s["metric"]["rank"]: float(s["value"][1]) for s in got}
        c.check(
            by_rank == {str(i): float(b) for i, b in enumerate(planned)}
            and all(s["metric"].get("plan_version") == str(version) for s in got),
            f"per-rank bytes of the plan {JOB} runs (version {version}) via Prometheus {got} == plan {planned}",
        )
        got = wait_for(base, f'muonshard_job_plan_memory_imbalance_ratio{{job="{JOB}"}}', 1, timeout=30)
        c.check(
            len(got) == 1
            and got[0]["metric"].get("plan_version") == str(version)
            and math.isclose(float(got[0]["value"][1]), plan_imbalance, rel_tol=1e-9),
            f"the imbalance of the plan {JOB} runs {got} == plan {plan_imbalance}",
        )
        # The coordinator's worker counts for the job: every rank joined,
        # none failed (after their last step they leave: joined or left).
        got = wait_for(base, f'muonshard_workers{{job="{JOB}"}}', 3, timeout=30)
        states = {s["metric"]["state"]: float(s["value"][1]) for s in got}
        c.check(
            states.get("joined", 0) + states.get("left", 0) == WORLD and states.get("failed") == 0,
            f"{WORLD} workers joined or left, none failed: {states}",
        )
        # Prometheus loaded and evaluates every rule group without errors.
        groups = json.loads(dc.scrape(f"{base}/api/v1/rules"))["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        # As many as the rules file holds (every `record:` and `alert:` entry).
        with open(dc.RULES) as f:
            want = sum(1 for line in f if line.lstrip().startswith(("- record:", "- alert:")))
        c.check(len(rules) == want, f"{want} rules loaded ({len(rules)})")
        c.check(
            all(r.get("health") in ("ok", "unknown") for r in rules),
            f"every rule evaluates: {[(r['name'], r.get('lastError')) for r in rules if r.get('health') == 'err']}",
        )

        # Every dashboard query evaluates, with Grafana's variables as the
        # per-job row sets them (one job, one phase); the per-rank ones (every
        # aggregation by job and rank) give one series per rank.
        with open(dc.DASHBOARD) as f:
            dashboard = json.load(f)
        for p, _ in dc.panels_in_order(dashboard):
            for t in p.get("targets") or []:
                expr = (
                    t["expr"].replace("$__rate_interval", "1m").replace("$job", JOB).replace("$phase", "orthogonalise")
                )
                where = f"panel {p.get('title')!r} target {t.get('refId')}"
                aggs = dc.aggregations(t["expr"])
                per_rank = aggs and all(labels and {"job", "rank"} <= labels for _, labels in aggs)
                try:
                    got = wait_for(base, expr, WORLD, timeout=30) if per_rank else query(base, expr)
                except (OSError, RuntimeError) as e:  # HTTP 400: a query Prometheus rejects
                    c.check(False, f"{where}: {expr!r}: {e}")
                    continue
                if per_rank:
                    c.check(
                        sorted(s["metric"].get("rank") for s in got) == [str(r) for r in range(WORLD)],
                        f"{where}: one series per rank: {got}",
                    )
    except RuntimeError as e:
        c.check(False, str(e))
    finally:
        stack.stop()
    if not c.failures:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"logs kept in {scratch}")
    c.finish()


if __name__ == "__main__":
    main()
