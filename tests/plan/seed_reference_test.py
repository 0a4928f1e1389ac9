#!/usr/bin/env python3
"""The C++ planner against tests/plan/seed_reference.py (an independent
Python model of the seed's rules) on generated manifests: owners, slices,
bucket layouts and per-rank state bytes must agree exactly.

Usage: seed_reference_test.py MUONSHARDCTL"""

import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import seed_reference  # noqa: E402


def random_manifest(rng, experts):
    tensors = []
    layers = rng.randint(1, 6)
    tensors.append({"name": "model.embed_tokens.weight", "shape": [rng.randint(50, 3000), 64], "dtype": "BF16"})
    count = rng.randint(5, 120)
    for i in range(count):
        layer = i * layers // count
        p = f"model.layers.{layer}."
        dtype = rng.choice(["BF16"] * 6 + ["FP16", "FP32"])
        kind = rng.randint(0, 9)
        if kind < 3:
            tensors.append({"name": f"{p}norm{i}.weight", "shape": [rng.randint(1, 5000)], "dtype": dtype})
        elif kind < 7 or experts == 0:
            tensors.append(
                {"name": f"{p}proj{i}.weight", "shape": [rng.randint(1, 700), rng.randint(1, 700)], "dtype": dtype}
            )
        elif kind < 9:
            e = rng.randint(0, experts - 1)
            tensors.append(
                {
                    "name": f"{p}mlp.experts.{e}.w{i}.weight",
                    "shape": [rng.randint(1, 300), rng.randint(1, 300)],
                    "dtype": dtype,
                }
            )
        else:
            tensors.append(
                {
                    "name": f"{p}mlp.experts.w{i}",
                    "shape": [experts, rng.randint(1, 64), rng.randint(1, 64)],
                    "dtype": dtype,
                }
            )
            tensors.append(
                {"name": f"{p}mlp.experts.w{i}_bias", "shape": [experts, rng.randint(1, 64)], "dtype": dtype}
            )
    if experts:
        tensors.append(
            {"name": f"model.layers.0.mlp.experts.{experts - 1}.last.weight", "shape": [16, 16], "dtype": "BF16"}
        )
    tensors.append({"name": "model.norm.weight", "shape": [64], "dtype": "FP32"})
    tensors.append({"name": "lm_head.weight", "shape": [rng.randint(50, 3000), 64], "dtype": "BF16"})
    return {"model": "random", "tensors": tensors}


def cpp_plan(ctl, manifest_path, world, pp, ep, policy, buf, per_dtype):
    cmd = [
        ctl,
        "plan",
        "--manifest",
        manifest_path,
        "--world-size",
        str(world),
        "--pp",
        str(pp),
        "--ep",
        str(ep),
        "--policy",
        policy,
        "--comm-buffer-mb",
        str(buf),
        "--output",
        "json",
    ]
    if per_dtype:
        cmd.append("--per-dtype")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def normalize_cpp(plan):
    tensors = plan["tensors"]
    ranks = []
    for r in plan["ranks"]:
        owned = []
        for o in r.get("owned", []):
            t = tensors[o.get("tensor", 0)]
            shape = [int(d) for d in t["shape"]]
            per = shape[-1] * shape[-2]
            owned.append([o["name"], o.get("matrix_begin", 0) * per, o.get("matrix_end", 0) * per])
        slices = [
            [s["name"], int(s.get("begin", 0)), int(s.get("end", 0)), int(s.get("padding", 0))]
            for s in r.get("slices", [])
        ]
        ranks.append((sorted(owned), slices, int(r.get("optimizer_state_bytes", 0))))
    muon = [
        (
            b.get("owner", 0),
            int(b["numel"]),
            [
                [
                    tensors[e.get("tensor", 0)]["name"],
                    int(e.get("element_begin", 0)),
                    int(e["numel"]),
                    int(e.get("offset", 0)),
                ]
                for e in b["entries"]
            ],
        )
        for b in plan.get("muon_buckets", [])
    ]
    adamw = [
        (
            int(b["numel"]),
            [
                [
                    tensors[e.get("tensor", 0)]["name"],
                    int(e.get("element_begin", 0)),
                    int(e["numel"]),
                    int(e.get("offset", 0)),
                ]
                for e in b["entries"]
            ],
            [int(x) for x in b["shard_offsets"]],
        )
        for b in plan.get("adamw_buckets", [])
    ]
    return ranks, muon, adamw


def normalize_py(plan):
    ranks = [(sorted(r["owned"]), r["slices"], r["optimizer_state_bytes"]) for r in plan["ranks"]]
    muon = [(b["owner"], b["numel"], b["entries"]) for b in plan["muon_buckets"]]
    adamw = [(b["numel"], b["entries"], b["shard_offsets"]) for b in plan["adamw_buckets"]]
    return ranks, muon, adamw


def main():
    ctl = sys.argv[1]
    rng = random.Random(20261129)
    cases = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(40):
            experts = rng.choice([0, 0, 4, 8])
            manifest = random_manifest(rng, experts)
            path = os.path.join(tmp, f"m{i}.json")
            with open(path, "w") as f:
                json.dump(manifest, f)
            for _ in range(3):
                pp = rng.choice([1, 1, 2])
                ep = rng.choice([1, 2, 4]) if experts else 1
                ms = rng.choice([1, 2, 3])
                world = pp * ep * ms
                policy = rng.choice(["seed", "seed-all"])
                buf = rng.choice([1, 2, 256])
                per_dtype = rng.random() < 0.3
                want = normalize_py(seed_reference.plan(manifest, world, pp, ep, policy, buf, per_dtype))
                got = normalize_cpp(cpp_plan(ctl, path, world, pp, ep, policy, buf, per_dtype))
                label = f"manifest {i} world={world} pp={pp} ep={ep} policy={policy} buf={buf} per_dtype={per_dtype}"
                for what, a, b in zip(("ranks", "muon buckets", "adamw buckets"), got, want, strict=True):
                    if a != b:
                        print(f"MISMATCH in {what}: {label}", file=sys.stderr)
                        for x, y in zip(a, b, strict=True):
                            if x != y:
                                print(f"  c++:    {x}\n  python: {y}", file=sys.stderr)
                                break
                        if len(a) != len(b):
                            print(f"  lengths c++ {len(a)} python {len(b)}", file=sys.stderr)
                        sys.exit(1)
                cases += 1
    print(f"{cases} plans agree with the Python seed reference")


if __name__ == "__main__":
    main()
