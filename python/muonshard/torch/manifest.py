"""The manifest of a live torch module, for the planner."""

import re

import torch

_DTYPES = {torch.float32: "FP32", torch.bfloat16: "BF16", torch.float16: "FP16"}
_EXPERT = re.compile(r"(?:^|\.)experts\.(\d+)\.")


def dtype_name(dtype):
    """The manifest dtype of a torch dtype; ValueError for ones the optimizer cannot hold."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError("dtype %s is not supported (float32, bfloat16 or float16)" % dtype) from None


def named_parameters_of(model_or_named):
    """(name, parameter) pairs of a module (named_parameters(): tied weights
    once) or of an iterable of pairs, in order."""
    if isinstance(model_or_named, torch.nn.Module):
        return list(model_or_named.named_parameters())
    pairs = list(model_or_named)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and isinstance(pair[1], torch.Tensor)):
            raise TypeError("expected an nn.Module or (name, parameter) pairs, got %r" % (pair,))
    return pairs


def _matches(patterns, name):
    if callable(patterns):
        return bool(patterns(name))
    return any(re.search(p, name, re.IGNORECASE) for p in patterns)


def manifest_from_module(model, name, expert_of=None, muon_exclude=None, requires_grad_only=True):
    """The manifest (a dict, proto3 JSON form) of `model`'s parameters.

    Tensors come from `named_parameters()` in order, with their shapes and
    dtypes. Layouts are torch's: an `nn.Linear` weight is [out, in] (OUT_IN, the
    planner's default). Which tensors use Muon is the planner's rule (2-D and 3-D
    tensors except embeddings, lm_head, biases, routers; see docs/planner.md);
    `muon_exclude` (regexes, or a callable on the name) sends more to AdamW.
    Experts: a name holding `experts.N.` is expert N (the planner detects it);
    `expert_of(name) -> int | None` marks others. 3-D expert stacks
    ([experts, rows, cols]) stay 3-D: Muon orthogonalises each expert's matrix.
    Frozen parameters (requires_grad False) are left out unless
    `requires_grad_only` is False.
    """
    tensors = []
    for pname, param in named_parameters_of(model):
        if requires_grad_only and not param.requires_grad:
            continue
        spec = {"name": pname, "shape": [int(d) for d in param.shape], "dtype": dtype_name(param.dtype)}
        if muon_exclude is not None and _matches(muon_exclude, pname):
            spec["optimizer"] = "ADAMW"
        if expert_of is not None:
            expert = expert_of(pname)
            if expert is not None:
                spec["expert"] = int(expert)
        tensors.append(spec)
    if not tensors:
        raise ValueError("module %r has no trainable parameters" % name)
    return {"model": name, "tensors": tensors}
