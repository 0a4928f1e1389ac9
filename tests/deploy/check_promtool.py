#!/usr/bin/env python3
"""deploy_promtool: `promtool check config` on deploy/prometheus/prometheus.yml
(which loads the rule file), `promtool check rules` on the rules, and
`promtool test rules tests/deploy/rules_test.yml`: the recording rules compute
what they claim and every alert fires, and stays quiet, when it should."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc  # noqa: E402


def main():
    promtool = dc.require_tool("promtool")
    c = dc.Checker("deploy_promtool")
    for argv in (["check", "config", "--lint=all", dc.PROMETHEUS_CONFIG],
                 ["check", "rules", "--lint=all", dc.RULES],
                 ["test", "rules", os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules_test.yml")]):
        r = dc.run([promtool, *argv])
        print(r.stdout + r.stderr)
        c.check(r.returncode == 0, f"promtool {' '.join(argv)} exit {r.returncode}")
    cfg = dc.load_yaml(dc.PROMETHEUS_CONFIG)
    c.check(cfg.get("rule_files") and all(
        os.path.isfile(os.path.join(os.path.dirname(dc.PROMETHEUS_CONFIG), f)) for f in cfg["rule_files"]),
        "prometheus.yml loads the rule files of deploy/prometheus")
    c.check(all(sc.get("honor_labels") is True for sc in cfg["scrape_configs"]),
            "every scrape job keeps the exported `job` label (the training job)")
    alerts = [r for g in dc.load_yaml(dc.RULES)["groups"] for r in g["rules"] if "alert" in r]
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules_test.yml")) as f:
        tests = f.read()
    for a in alerts:
        c.check(f"alertname: {a['alert']}" in tests, f"rules_test.yml tests alert {a['alert']}")
    c.finish()


if __name__ == "__main__":
    main()
