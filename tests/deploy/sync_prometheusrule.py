#!/usr/bin/env python3
"""Rewrites spec.groups of deploy/k8s/components/prometheus-operator/
prometheusrule.yaml from deploy/prometheus/rules/muonshard.rules.yml (the
deploy_kustomize test requires them identical), keeping the file's leading
comments and metadata. Not a test: run it after editing the rules,
`python3 tests/deploy/sync_prometheusrule.py`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc

PROMETHEUS_RULE = os.path.join(dc.REPO, "deploy", "k8s", "components", "prometheus-operator", "prometheusrule.yaml")


def main():
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    # Multi-line strings (the rules' expressions) as `|` blocks, as written.
    Dumper.add_representer(
        str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
    )
    with open(PROMETHEUS_RULE) as f:
        text = f.read()
    header = "".join(line for line in text.splitlines(True) if line.startswith("#"))
    doc = yaml.safe_load(text)
    doc["spec"]["groups"] = dc.load_yaml(dc.RULES)["groups"]
    with open(PROMETHEUS_RULE, "w") as f:
        f.write(header + yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=100))
    print(f"wrote {PROMETHEUS_RULE}")


if __name__ == "__main__":
    main()
