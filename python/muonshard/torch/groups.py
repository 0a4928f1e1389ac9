"""Param groups, as torch.optim takes them, for a plan that fixes the optimizer.

`ShardedMuonAdamW` and `manifest_from_module` take what `torch.optim`
optimizers take for `params`: a module, (name, parameter) pairs, or a list of
param-group dicts whose "params" are a module or (name, parameter) pairs
(names are what the plan knows tensors by). A group may set:

- "use_muon" (bool): Muon (True) or AdamW (False) for its tensors, as Muon
  implementations take it. It overrides the planner's own rule in
  `manifest_from_module` (the manifest's per-tensor optimizer), and the
  optimizer checks that the plan it joins does the same.
- "weight_decay": the optimizer's own or 0.0 (0.0 puts the group's tensors
  into `no_decay`).
- "lr": the optimizer's own. Every group steps with one learning rate in the
  C++ step, so groups may not start with different ones; a scheduler scales
  all groups alike from equal rates.

Anything else is refused with ValueError naming the group and key: an option
that would silently not apply is an error, never ignored.
"""

import torch

GROUP_OPTIONS = ("use_muon", "weight_decay", "lr")


def named_parameters_of(model_or_named):
    """(name, parameter) pairs of a module (named_parameters(): tied weights
    once) or of an iterable of pairs, in order."""
    if isinstance(model_or_named, torch.nn.Module):
        return list(model_or_named.named_parameters())
    pairs = list(model_or_named)
    for pair in pairs:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], torch.Tensor)
        ):
            raise TypeError("expected an nn.Module, (name, parameter) pairs or param groups of those, got %r" % (pair,))
    return pairs


class Group:
    """One param group: its (name, parameter) pairs and the options it set."""

    def __init__(self, index, named, options):
        self.index = index
        self.named = named
        self.options = options

    @property
    def names(self):
        return [n for n, _ in self.named]


def parse_groups(params):
    """[Group] of `params` (a module, pairs, or group dicts); TypeError for a
    `params` of another kind, ValueError for a bad group (naming it)."""
    if isinstance(params, dict):
        params = [params]
    elif isinstance(params, torch.nn.Module):
        return [Group(0, named_parameters_of(params), {})]
    else:
        params = list(params)
        if not params or not all(isinstance(g, dict) for g in params):
            return [Group(0, named_parameters_of(params), {})]
    groups = []
    seen = {}
    for index, group in enumerate(params):
        if "params" not in group:
            raise ValueError('param group %d has no "params"' % index)
        unknown = sorted(set(group) - {"params"} - set(GROUP_OPTIONS))
        if unknown:
            raise ValueError(
                "param group %d: %s not supported (a group may set %s; the optimizer-wide options are "
                "constructor arguments)" % (index, ", ".join(repr(k) for k in unknown), ", ".join(GROUP_OPTIONS))
            )
        named = named_parameters_of(group["params"])
        for name, _ in named:
            if name in seen:
                raise ValueError("parameter %r is in param groups %d and %d" % (name, seen[name], index))
            seen[name] = index
        options = {k: group[k] for k in GROUP_OPTIONS if k in group}
        if "use_muon" in options and not isinstance(options["use_muon"], bool):
            raise TypeError("param group %d: use_muon must be a bool, got %r" % (index, options["use_muon"]))
        groups.append(Group(index, named, options))
    return groups


def check_group_options(groups, lr, weight_decay):
    """ValueError naming the first group whose lr or weight_decay the step
    cannot honour."""
    for g in groups:
        if "lr" in g.options and float(g.options["lr"]) != float(lr):
            raise ValueError(
                "param group %d: lr %r differs from the optimizer's lr %r; every group steps with one "
                "learning rate (per-group rates are not supported)" % (g.index, g.options["lr"], lr)
            )
        wd = g.options.get("weight_decay")
        if wd is not None and float(wd) not in (0.0, float(weight_decay)):
            raise ValueError(
                "param group %d: weight_decay %r is neither 0 nor the optimizer's %r (per-group decay "
                "rates are not supported; 0 exempts the group)" % (g.index, wd, weight_decay)
            )


def no_decay_names(groups):
    """Names of the tensors whose group sets weight_decay 0."""
    return [n for g in groups if float(g.options.get("weight_decay", 1.0)) == 0.0 for n in g.names]


def use_muon_of(groups):
    """{name: bool} for the tensors whose group sets use_muon."""
    return {n: g.options["use_muon"] for g in groups if "use_muon" in g.options for n in g.names}
