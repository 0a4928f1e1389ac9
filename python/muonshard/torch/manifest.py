"""The manifest of a live torch module, for the planner."""

import json
import re

import torch

from muonshard import _muonshard
from muonshard.torch import dtensor
from muonshard.torch.groups import parse_groups, use_muon_of

_DTYPES = {torch.float32: "FP32", torch.bfloat16: "BF16", torch.float16: "FP16"}
_EXPERT = re.compile(r"(?:^|\.)experts\.(\d+)\.")


def dtype_name(dtype):
    """The manifest dtype of a torch dtype; ValueError for ones the optimizer cannot hold."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError("dtype %s is not supported (float32, bfloat16 or float16)" % dtype) from None


def _matches(patterns, name):
    if callable(patterns):
        return bool(patterns(name))
    return any(re.search(p, name, re.IGNORECASE) for p in patterns)


def manifest_from_module(
    model,
    name,
    expert_of=None,
    muon_exclude=None,
    requires_grad_only=True,
    tp=1,
    tp_split=None,
    tp_experts=False,
    shards=False,
    ns_blocks=None,
):
    """The manifest (a dict, proto3 JSON form) of `model`'s parameters.

    `model` is a module, (name, parameter) pairs or param groups of those, as
    ShardedMuonAdamW takes them (muonshard/torch/groups.py): a group's
    "use_muon" sets its tensors' optimizer (MUON or ADAMW) over the planner's
    rule, so pass the optimizer's groups here too. Tensors come from
    `named_parameters()` in order, with their shapes and dtypes. Layouts are torch's: an `nn.Linear` weight is [out, in] (OUT_IN, the
    planner's default). Which tensors use Muon is the planner's rule (2-D and 3-D
    tensors except embeddings, lm_head, biases, routers; see docs/planner.md);
    `muon_exclude` (regexes, or a callable on the name) sends more to AdamW.
    Experts: a name holding `experts.N.` is expert N (the planner detects it);
    `expert_of(name) -> int | None` marks others. 3-D expert stacks
    ([experts, rows, cols]) stay 3-D: Muon orthogonalises each expert's matrix.
    Frozen parameters (requires_grad False) are left out unless
    `requires_grad_only` is False.

    Tensor parallelism (`tp` > 1): every tensor gets Megatron's split as the
    HF importer marks it (`import-hf --tp`: q/k/v/gate/up and embeddings
    column, o/down row, the rest replicated; experts replicated unless
    `tp_experts`). `tp_split(name)` may return "column", "row" or
    "replicated" to decide for a tensor (None: the rule). With `shards` the
    module's parameters are this rank's shards (a tensor-parallel program's
    ColumnParallelLinear weight is [out / tp, in]): the manifest gets the
    whole shapes, which the planner wants. ValueError naming the tensor for
    an unknown split or a dimension tp does not divide.

    DTensor parameters (a module wrapped with FSDP2's `fully_shard`, or
    distributed by hand) are planned as their placements say (NOTE [Sharded
    parameters] in muonshard/torch/dtensor.py): tp is the mesh's size and
    each tensor's split its placement's (`tp` and `tp_split` must be left
    unset); submit the plan with `**topology_of(module)`.

    Fused weights (`ns_blocks`, docs/planner.md "Fused weights: per-block
    Newton-Schulz"): `{key: spec}` has Muon orthogonalise the matrices of the
    parameters a key names block by block instead of whole (a fused q | k | v,
    gate | up, per-head rows). A key is a parameter name (that parameter,
    whatever regex keys match it too) or a regex that must match the whole
    name; a spec is
    `{"axis": "rows" | "cols", "sizes": [int, ...], "groups": int}` (`groups`
    back-to-back groups of consecutive blocks `sizes` along dimension -2 for
    rows, -1 for cols, of each expert's matrix for a 3-D stack; groups
    defaults to 1) or `{"axis": "rows" | "cols", "stride": int}` (`stride`
    interleaved blocks: block j holds the indices i with i % stride == j).
    Sizes are the whole tensor's (with `shards` too). Examples: a Phi-3
    qkv_proj `{"axis": "rows", "sizes": [3072, 1024, 1024]}`, GPT-NeoX's
    query_key_value `{"axis": "rows", "sizes": [128, 128, 128], "groups": 32}`,
    gpt-oss's experts gate_up_proj `{"axis": "cols", "stride": 2}`.
    TypeError naming the key for a spec or a value of the wrong type;
    ValueError naming the key for a bad spec, a key that names no parameter,
    blocks that do not tile the parameter's axis (naming it and the shape),
    and naming the parameter when two keys name it. Whether the parameter is
    a Muon matrix is the planner's to check, on submit (ValueError).
    """
    groups = parse_groups(model)
    use_muon = use_muon_of(groups)
    named = [pair for g in groups for pair in g.named]
    mesh = dtensor.mesh_of(named)
    tiles = None  # FSDP x TP: {name: tp_mesh_split}
    if mesh is not None:
        if tp != 1 or tp_split is not None or shards:
            raise ValueError(
                "the parameters are DTensors: their mesh and placements decide tp and the splits; "
                "leave tp, tp_split and shards unset"
            )
        by_name = dict(named)
        tp, shards = dtensor.shard_ranks(mesh), False
        tp_split = lambda n: _placement_split(n, by_name[n])  # noqa: E731
        if dtensor.is_fsdp_tp(mesh, named):
            tiles = {n: dtensor.mesh_splits(n, p, mesh) for n, p in named}
    tensors = []
    for pname, param in named:
        if requires_grad_only and not param.requires_grad:
            continue
        spec = {"name": pname, "shape": [int(d) for d in param.shape], "dtype": dtype_name(param.dtype)}
        if pname in use_muon:
            spec["optimizer"] = "MUON" if use_muon[pname] else "ADAMW"
        if muon_exclude is not None and _matches(muon_exclude, pname):
            spec["optimizer"] = "ADAMW"
        if expert_of is not None:
            expert = expert_of(pname)
            if expert is not None:
                spec["expert"] = int(expert)
        tensors.append(spec)
    if not tensors:
        raise ValueError("module %r has no trainable parameters" % name)
    manifest = {"model": name, "tensors": tensors}
    if tiles is not None:  # split per mesh dimension (topology_of gives the mesh)
        for spec in tensors:
            spec["tpMeshSplit"] = tiles[spec["name"]]
    elif tp > 1:
        manifest = _mark_tensor_parallel(manifest, tp, tp_split, tp_experts, shards)
    if ns_blocks is not None:
        _set_ns_blocks(manifest["tensors"], ns_blocks)
    return manifest


_NS_BLOCKS_FIELDS = ("axis", "sizes", "groups", "stride")


def _int_field(key, field, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("ns_blocks[%r]: %s must be an int, got %r" % (key, field, value))
    if value < minimum:
        raise ValueError("ns_blocks[%r]: %s must be >= %d, got %d" % (key, field, minimum, value))
    return int(value)


def _ns_blocks_spec(key, spec):
    """The manifest's nsBlocks (proto3 JSON) of one ns_blocks entry, checked."""
    if not isinstance(key, str):
        raise TypeError("ns_blocks: keys must be parameter names or regexes (str), got %r" % (key,))
    if not isinstance(spec, dict):
        raise TypeError("ns_blocks[%r]: the spec must be a dict (axis, sizes, groups or stride), got %r" % (key, spec))
    unknown = sorted(str(f) for f in spec if f not in _NS_BLOCKS_FIELDS)
    if unknown:
        raise ValueError("ns_blocks[%r]: unknown field(s) %s (axis, sizes, groups, stride)" % (key, ", ".join(unknown)))
    axis = spec.get("axis")
    if not isinstance(axis, str) or axis.lower() not in ("rows", "cols"):
        raise ValueError('ns_blocks[%r]: axis must be "rows" or "cols", got %r' % (key, axis))
    out = {"axis": axis.upper()}
    if ("sizes" in spec) == ("stride" in spec):
        raise ValueError("ns_blocks[%r]: give sizes or stride (exactly one)" % key)
    if "stride" in spec:
        if "groups" in spec:
            raise ValueError("ns_blocks[%r]: groups go with sizes, not with a stride" % key)
        out["stride"] = _int_field(key, "stride", spec["stride"], 1)
        return out
    sizes = spec["sizes"]
    if not isinstance(sizes, (list, tuple)):
        raise TypeError("ns_blocks[%r]: sizes must be a list of ints, got %r" % (key, sizes))
    if not sizes:
        raise ValueError("ns_blocks[%r]: sizes is empty" % key)
    out["sizes"] = [_int_field(key, "sizes[%d]" % i, s, 1) for i, s in enumerate(sizes)]
    groups = _int_field(key, "groups", spec.get("groups", 1), 1)
    if groups > 1:
        out["groups"] = groups
    return out


def _check_tiling(key, tensor, blocks):
    shape = tensor["shape"]
    if len(shape) not in (2, 3):
        raise ValueError(
            "ns_blocks[%r]: parameter %r of shape %s is not a matrix (2-D) or a stack of them (3-D)"
            % (key, tensor["name"], shape)
        )
    length = shape[-2] if blocks["axis"] == "ROWS" else shape[-1]
    if "stride" in blocks:
        ok, what = length % blocks["stride"] == 0, "stride %d" % blocks["stride"]
    else:
        ok = sum(blocks["sizes"]) * blocks.get("groups", 1) == length
        what = "sizes %s x %d groups" % (blocks["sizes"], blocks.get("groups", 1))
    if not ok:
        raise ValueError(
            "ns_blocks[%r]: %s do not tile the %d %s of parameter %r (shape %s)"
            % (key, what, length, blocks["axis"].lower(), tensor["name"], shape)
        )


def _set_ns_blocks(tensors, ns_blocks):
    """Sets nsBlocks on the tensors `ns_blocks`' keys name (see manifest_from_module)."""
    if not isinstance(ns_blocks, dict):
        raise TypeError("ns_blocks must be a dict {name or regex: spec}, got %r" % (ns_blocks,))
    entries = []
    for key, spec in ns_blocks.items():
        blocks = _ns_blocks_spec(key, spec)
        try:
            pattern = re.compile(key)
        except re.error as e:
            raise ValueError("ns_blocks[%r]: not a valid regex: %s" % (key, e)) from None
        entries.append((key, pattern, blocks))
    names = {t["name"] for t in tensors}
    used = set()
    for tensor in tensors:
        name = tensor["name"]
        if name in ns_blocks:  # a name names itself, whatever else matches it
            matched = [e for e in entries if e[0] == name]
        else:
            matched = [e for e in entries if e[0] not in names and e[1].fullmatch(name)]
        if len(matched) > 1:
            raise ValueError(
                "ns_blocks: parameter %r is matched by the keys %s" % (name, ", ".join(repr(e[0]) for e in matched))
            )
        if matched:
            key, _, blocks = matched[0]
            _check_tiling(key, tensor, blocks)
            tensor["nsBlocks"] = dict(blocks)
            used.add(key)
    for key, _, _ in entries:
        if key not in used:
            raise ValueError("ns_blocks[%r]: names no parameter (a regex must match the whole name)" % key)


def _placement_split(name, param):
    """tp_split of a DTensor parameter: its placement's, or None (the
    planner's rule) for an expert stack, which ep splits."""
    split = dtensor.split_of(name, param)
    return None if split == "experts" else split


def topology_of(model):
    """The plan's topology for `model` (what ShardedMuonAdamW will find):
    {"world_size": W, "tp": S} for DTensor parameters on a mesh of S ranks,
    or of R x S (HSDP: W = R * S; NOTE [Sharded parameters]), {"world_size":
    W, "tp": W, "tp_mesh": [D, T]} on an FSDP x TP mesh of D x T, with "ep": S
    when expert stacks are sharded along their experts, else {} (give
    world_size yourself). For
    `Coordinator.submit(manifest, **topology_of(model))`."""
    groups = parse_groups(model)
    named = [pair for g in groups for pair in g.named]
    mesh = dtensor.mesh_of(named)
    if mesh is None:
        return {}
    return dtensor.topology(mesh, named)


def _mark_tensor_parallel(manifest, tp, tp_split, tp_experts, shards):
    if tp_split is not None:
        for spec in manifest["tensors"]:
            split = tp_split(spec["name"])
            if split is None:
                continue
            if split not in dtensor.TP_SPLITS:
                raise ValueError("tensor %r: tp_split %r is not column, row or replicated" % (spec["name"], split))
            spec["tpSplit"] = dtensor.TP_SPLITS[split]
    try:
        marked = json.loads(_muonshard.mark_tensor_parallel(json.dumps(manifest), tp, tp_experts, shards))
    except Exception as e:  # the C++ status (INVALID_ARGUMENT naming the tensor)
        raise ValueError(str(e)) from None
    # Only the split and the (whole) shape come back: the rest stays as built.
    for spec, done in zip(manifest["tensors"], marked["tensors"], strict=True):
        spec["tpSplit"] = done.get("tp_split", done.get("tpSplit"))
        spec["shape"] = [int(d) for d in done.get("shape", [])]
    return manifest
