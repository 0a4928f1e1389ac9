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
    """
    groups = parse_groups(model)
    use_muon = use_muon_of(groups)
    named = [pair for g in groups for pair in g.named]
    mesh = dtensor.mesh_of(named)
    if mesh is not None:
        if tp != 1 or tp_split is not None or shards:
            raise ValueError(
                "the parameters are DTensors: their mesh and placements decide tp and the splits; "
                "leave tp, tp_split and shards unset"
            )
        by_name = dict(named)
        tp, shards = dtensor.shard_ranks(mesh), False
        tp_split = lambda n: _placement_split(n, by_name[n])  # noqa: E731
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
    if tp > 1:
        manifest = _mark_tensor_parallel(manifest, tp, tp_split, tp_experts, shards)
    return manifest


def _placement_split(name, param):
    """tp_split of a DTensor parameter: its placement's, or None (the
    planner's rule) for an expert stack, which ep splits."""
    split = dtensor.split_of(name, param)
    return None if split == "experts" else split


def topology_of(model):
    """The plan's topology for `model` (what ShardedMuonAdamW will find):
    {"world_size": W, "tp": S} for DTensor parameters on a mesh of S ranks,
    or of R x S (HSDP: W = R * S; NOTE [Sharded parameters]), with "ep": S
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
