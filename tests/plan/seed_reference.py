#!/usr/bin/env python3
"""Independent Python model of the seed's partition rules (Paddle
MuonShardingOptimizer + tensor_fusion_helper), written from
docs/reference/paddle_internals.md and the seed source, not from the C++.

Usage: seed_reference.py MANIFEST.json --world-size W [--pp P] [--ep E]
           [--policy seed|seed-all] [--comm-buffer-mb 256] [--per-dtype] > out.json

Prints, per rank, the Muon tensors it owns (name, element range), its AdamW
slices (name, begin, end, padding), its optimizer-state bytes and NS FLOPs;
and every bucket's layout. The C++ planner must agree byte for byte
(tests/plan/seed_reference_test.py) and is benchmarked against this file
(bench/planner/compare_python.sh)."""

import argparse
import json
import re
import sys
import time
from collections import OrderedDict, defaultdict

ESIZE = {"BF16": 2, "FP16": 2, "FP32": 4}
STR_DTYPE = {"BF16": "paddle.bfloat16", "FP16": "paddle.float16", "FP32": "paddle.float32"}
DEFAULT_EXCLUDES = ["embed", "lm_head", "bias", r"\.gate\.weight$", "router", "sinks"]
ALIGNMENT = 256
# fp32 optimizer state per element: Muon's momentum, AdamW's two moments, and
# a master copy only for 16-bit parameters (Paddle's multi_precision keeps
# none for float32 ones: the parameter is its own master).
MASTER_BYTES = {"BF16": 4, "FP16": 4, "FP32": 0}


class Param:
    def __init__(self, index, name, shape, dtype, numel, elem_begin=0, first_matrix=0, matrices=1):
        self.index = index
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.numel = numel  # numel of the local tensor (the ep-local part of a stack)
        self.elem_begin = elem_begin  # offset of the local part in the full tensor
        self.first_matrix = first_matrix
        self.matrices = matrices


def prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


def assign_group_by_size(params, group_size):
    """reducer.cc Eager_AssignGroupBySize with empty tensor_indices."""
    res = []
    open_ = {}
    for i, p in enumerate(params):
        idx, size = open_.get(p.dtype, ([], 0))
        idx = idx + [i]
        size += ESIZE[p.dtype] * p.numel
        if size >= group_size:
            res.append(idx)
            open_[p.dtype] = ([], 0)
        else:
            open_[p.dtype] = (idx, size)
    for dtype in sorted(open_):
        if open_[dtype][0]:
            res.append(open_[dtype][0])
    res.sort(key=lambda g: g[0])
    return OrderedDict((k, [params[j] for j in g]) for k, g in enumerate(res))


def partition_2d_parameters(params, world_size, comm_buffer_size_mb, all_ranks):
    """MuonShardingOptimizer._partition_2d_parameters (seed); older seed when all_ranks."""
    mapping = {rank: [] for rank in range(world_size)}
    parameters = list(params)
    parameters.sort(key=lambda p: p.numel, reverse=True)
    if all_ranks:
        active_ranks = world_size
    else:
        total_numel = sum(p.numel for p in parameters)
        total_size_mb = total_numel * 4 / (1024**2)
        buffer_size_mb = comm_buffer_size_mb if comm_buffer_size_mb > 0 else 256
        min_active_ranks = 1
        if total_size_mb > 0:
            min_active_ranks = max(1, int(total_size_mb / buffer_size_mb) + 1)
        active_ranks = min(min_active_ranks, world_size)
    sizes = [0] * active_ranks
    for param in parameters:
        rank = sizes.index(min(sizes))
        mapping[rank].append(param)
        sizes[rank] += param.numel
    return mapping


def flatten_padded(numel, esize):
    return numel + ((ALIGNMENT - (numel * esize) % ALIGNMENT) % ALIGNMENT) // esize


def layer_index(name, token):
    m = re.search(r"(?:^|\.)" + re.escape(token) + r"(\d+)(?:\.|$)", name)
    return int(m.group(1)) if m else -1


def load_params(manifest, world, pp, ep, excludes):
    tensors = manifest["tensors"]
    pats = [re.compile(p, re.IGNORECASE) for p in excludes]
    layers = [layer_index(t["name"], "layers.") for t in tensors]
    num_layers = max(layers) + 1 if layers else 0
    stages, current = [], 0
    for t, layer in zip(tensors, layers, strict=True):
        if "stage" in t:
            current = int(t["stage"])
        elif layer >= 0:
            current = layer * pp // num_layers
        stages.append(current)
    for i in range(len(tensors) - 1, -1, -1):
        if "stage" in tensors[i] or layers[i] >= 0:
            break
        if num_layers > 0:
            stages[i] = pp - 1
    experts = []
    for t in tensors:
        e = int(t["expert"]) if "expert" in t else layer_index(t["name"], "experts.")
        experts.append(e)
    num_experts = max(experts) + 1 if experts else 0

    ms = world // (pp * ep)
    # group key -> (colour, global ranks); dense group per stage, moe group per (stage, e)
    groups = OrderedDict()
    for p in range(pp):
        groups[("dense", p, -1)] = [m * pp * ep + p * ep + e for m in range(ms) for e in range(ep)]
    if ep > 1:
        for p in range(pp):
            for e in range(ep):
                groups[("moe", p, e)] = [m * pp * ep + p * ep + e for m in range(ms)]
    muon = defaultdict(list)
    adamw = defaultdict(list)
    for i, t in enumerate(tensors):
        shape = [int(d) for d in t["shape"]]
        numel = prod(shape)
        name = t["name"]
        if t.get("optimizer") in ("MUON", "ADAMW"):
            use_muon = t["optimizer"] == "MUON"
        else:
            use_muon = len(shape) in (2, 3) and not any(pt.search(name) for pt in pats)
        matrices = shape[0] if len(shape) == 3 else 1
        stage = stages[i]
        target = muon if use_muon else adamw
        stack = experts[i] < 0 and re.search(r"(?:^|\.)experts\.(?!\d)", name) and len(shape) >= 2
        if ep == 1 or (experts[i] < 0 and not stack):
            target[("dense", stage, -1)].append(Param(i, name, shape, t["dtype"], numel, 0, 0, matrices))
        elif experts[i] >= 0:
            e = experts[i] // (num_experts // ep)
            target[("moe", stage, e)].append(Param(i, name, shape, t["dtype"], numel, 0, 0, matrices))
        else:
            per = shape[0] // ep
            per_expert = numel // shape[0]
            for e in range(ep):
                fm = e * per if use_muon else 0
                mats = per if use_muon else 1
                target[("moe", stage, e)].append(
                    Param(i, name, shape, t["dtype"], per * per_expert, e * per * per_expert, fm, mats)
                )
    return groups, muon, adamw


def ns_flops(shape, steps):
    r, c = shape[-2], shape[-1]
    a, b = min(r, c), max(r, c)
    return steps * (4.0 * a * a * b + 2.0 * a * a * a)


def plan(manifest, world, pp, ep, policy, buf_mb, per_dtype, steps=5):
    groups, muon, adamw = load_params(manifest, world, pp, ep, DEFAULT_EXCLUDES)
    group_size = buf_mb * 1024 * 1024
    ranks = [
        {"rank": r, "owned": [], "slices": [], "muon_numel": 0, "adamw_shard_numel": 0, "ns_flops": 0.0}
        for r in range(world)
    ]
    state_bytes = [0] * world
    muon_buckets, adamw_buckets = [], []
    for key, granks in groups.items():
        n = len(granks)
        params = muon.get(key, [])
        if params:
            passes = [params]
            if per_dtype:
                passes = [
                    [p for p in params if p.dtype == d]
                    for d in sorted(set(p.dtype for p in params), key=lambda d: STR_DTYPE[d])
                ]
            owner = {}
            for sub in passes:
                mapping = partition_2d_parameters(sub, n, buf_mb, policy == "seed-all") if n > 1 else {0: list(sub)}
                for r, ps in mapping.items():
                    for p in ps:
                        owner[id(p)] = r
            by_dst = defaultdict(list)
            for p in sorted(params, key=lambda p: (owner[id(p)], p.index)):
                by_dst[owner[id(p)]].append(p)
            for dst in sorted(by_dst):
                for _, bucket in assign_group_by_size(by_dst[dst], group_size).items():
                    offset, entries = 0, []
                    for p in bucket:
                        entries.append([p.name, p.elem_begin, p.numel, offset])
                        offset += flatten_padded(p.numel, ESIZE[p.dtype])
                        rp = ranks[granks[dst]]
                        rp["owned"].append([p.name, p.elem_begin, p.elem_begin + p.numel])
                        rp["muon_numel"] += p.numel
                        state_bytes[granks[dst]] += p.numel * (4 + MASTER_BYTES[p.dtype])
                        rp["ns_flops"] += p.matrices * ns_flops(p.shape, steps)
                    muon_buckets.append({"owner": granks[dst], "numel": offset, "entries": entries})
        params = list(adamw.get(key, []))
        if not params:
            continue
        params.sort(key=lambda p: STR_DTYPE[p.dtype])
        for _, bucket in assign_group_by_size(params, group_size).items():
            esize = ESIZE[bucket[0].dtype]
            align = (ALIGNMENT // esize) * n
            index, entries = 0, []
            layout = []
            for p in bucket:
                padded = (p.numel + align - 1) // align * align
                layout.append((p, index, padded))
                entries.append([p.name, p.elem_begin, p.numel, index])
                index += padded
            total = index
            shard = total // n
            for r in range(n):
                rank_begin, rank_end = r * shard, (r + 1) * shard
                rp = ranks[granks[r]]
                rp["adamw_shard_numel"] += shard
                state_bytes[granks[r]] += shard * (8 + MASTER_BYTES[bucket[0].dtype])
                for p, idx, padded in layout:  # ShardingGradView
                    param_begin = max(idx, rank_begin)
                    param_end = min(idx + padded, rank_end)
                    if param_begin >= param_end:
                        continue
                    begin, end = param_begin - idx, param_end - idx
                    if begin >= p.numel:
                        continue
                    padding = end - max(begin, p.numel)
                    rp["slices"].append(
                        [p.name, p.elem_begin + begin, p.elem_begin + min(end, p.numel), max(padding, 0)]
                    )
            adamw_buckets.append(
                {"numel": total, "entries": entries, "shard_offsets": [r * shard for r in range(n + 1)]}
            )
    for rp in ranks:
        rp["optimizer_state_bytes"] = state_bytes[rp["rank"]]
    return {"ranks": ranks, "muon_buckets": muon_buckets, "adamw_buckets": adamw_buckets}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--policy", default="seed", choices=["seed", "seed-all"])
    ap.add_argument("--comm-buffer-mb", type=int, default=256)
    ap.add_argument("--per-dtype", action="store_true")
    ap.add_argument("--time", action="store_true", help="print plan seconds to stderr only")
    args = ap.parse_args()
    with open(args.manifest) as f:
        manifest = json.load(f)
    start = time.perf_counter()
    out = plan(manifest, args.world_size, args.pp, args.ep, args.policy, args.comm_buffer_mb, args.per_dtype)
    elapsed = time.perf_counter() - start
    if args.time:
        print(f"python_plan_seconds={elapsed:.4f}", file=sys.stderr)
        return
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
