#!/usr/bin/env python3
"""deploy_promtool: `promtool check config` on deploy/prometheus/prometheus.yml
(which loads the rule file), `promtool check rules` on the rules, and
`promtool test rules tests/deploy/rules_test.yml`: the recording rules compute
what they claim and every alert fires, and stays quiet, when it should. Fails
when an alert has no test case where it fires and one where it stays quiet,
or lacks its severity label or summary / description annotations."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc

RULES_TEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules_test.yml")


def main():
    promtool = dc.require_tool("promtool")
    c = dc.Checker("deploy_promtool")
    for argv in (
        ["check", "config", "--lint=all", dc.PROMETHEUS_CONFIG],
        ["check", "rules", "--lint=all", dc.RULES],
        ["test", "rules", RULES_TEST],
    ):
        r = dc.run([promtool, *argv])
        print(r.stdout + r.stderr)
        c.check(r.returncode == 0, f"promtool {' '.join(argv)} exit {r.returncode}")
    cfg = dc.load_yaml(dc.PROMETHEUS_CONFIG)
    c.check(
        cfg.get("rule_files")
        and all(os.path.isfile(os.path.join(os.path.dirname(dc.PROMETHEUS_CONFIG), f)) for f in cfg["rule_files"]),
        "prometheus.yml loads the rule files of deploy/prometheus",
    )
    c.check(
        all(sc.get("honor_labels") is True for sc in cfg["scrape_configs"]),
        "every scrape job keeps the exported `job` label (the training job)",
    )
    check_alerts_tested(c, dc.load_yaml(dc.RULES), dc.load_yaml(RULES_TEST))
    c.finish()


def check_alerts_tested(c, rules, rules_test):
    """Every alerting rule has a severity label, summary and description
    annotations, and in rules_test.yml an alert_rule_test case where it fires
    (exp_alerts not empty) and one where it stays quiet (exp_alerts empty);
    every case names an alert the rules define."""
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    names = [a["alert"] for a in alerts]
    c.check(len(names) == len(set(names)), f"alert names are unique: {names}")
    c.check(
        any(
            os.path.normpath(os.path.join(os.path.dirname(RULES_TEST), f)) == os.path.normpath(dc.RULES)
            for f in rules_test.get("rule_files", [])
        ),
        "rules_test.yml loads deploy/prometheus/rules/muonshard.rules.yml",
    )
    firing, quiet = set(), set()
    for i, t in enumerate(rules_test.get("tests", [])):
        for case in t.get("alert_rule_test", []) or []:
            name = case.get("alertname")
            c.check(name in names, f"rules_test.yml test {i}: alertname {name!r} is an alert of the rules file")
            (firing if case.get("exp_alerts") else quiet).add(name)
    for a in alerts:
        name = a["alert"]
        c.check(name in firing, f"rules_test.yml has an alert_rule_test where {name} fires")
        c.check(name in quiet, f"rules_test.yml has an alert_rule_test where {name} stays quiet")
        c.check(
            (a.get("labels") or {}).get("severity") in ("critical", "warning", "info"),
            f"alert {name} has a severity label (critical, warning or info)",
        )
        annotations = a.get("annotations") or {}
        for key in ("summary", "description"):
            c.check(str(annotations.get(key, "")).strip(), f"alert {name} has a {key} annotation")


if __name__ == "__main__":
    main()
