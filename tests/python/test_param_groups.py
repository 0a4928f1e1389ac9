"""The torch.optim contract of ShardedMuonAdamW (muonshard/torch/groups.py):
param groups honoured (use_muon, weight_decay 0) or refused with an error
naming the group, unknown keyword arguments a TypeError, options changed
after construction refused at the next step, LR schedulers over several
groups, and a torch.compile'd module. World size 1, in this process."""

import pytest
import torch
from test_torch_parity import EPS, LR, WD, Net, batches, make_net, relative_error, train

import muonshard
import muonshard.torch as mst


def groups_of(model, weights_use_muon=None, bias_decay=None):
    """[weights of up/down, everything else] as param groups."""
    named = list(model.named_parameters())
    first = {"params": [(n, p) for n, p in named if n in Net.MUON]}
    rest = {"params": [(n, p) for n, p in named if n not in Net.MUON]}
    if weights_use_muon is not None:
        first["use_muon"] = weights_use_muon
    if bias_decay is not None:
        rest["weight_decay"] = bias_decay
    return [first, rest]


def start(coord, job, params, manifest_params=None, **kwargs):
    version = muonshard.Coordinator(coord.address).submit(
        mst.manifest_from_module(manifest_params if manifest_params is not None else params, "groups"), world_size=1
    )
    options = dict(
        coordinator=coord.address,
        job=job,
        plan_version=version,
        rank=0,
        lr=LR,
        weight_decay=WD,
        betas=(0.9, 0.95),
        eps=EPS,
        blas_threads=1,
        reduce_order="rank",
    )
    options.update(kwargs)
    return mst.ShardedMuonAdamW(params, **options)


def run(opt, model):
    try:
        return train(model, opt.step, opt.zero_grad)
    finally:
        opt.close()


def test_use_muon_false_group_steps_those_matrices_with_adamw_as_torch_does(coordinator):
    """A group with use_muon=False overrides the planner's rule (the manifest
    built from the same groups marks the tensors ADAMW): every tensor then
    trains exactly as torch.optim.AdamW trains it."""
    model = make_net()
    got = run(start(coordinator, "adamw-only", groups_of(model, weights_use_muon=False)), model)
    reference = make_net()
    adamw = torch.optim.AdamW(reference.parameters(), lr=LR, betas=(0.9, 0.95), eps=EPS, weight_decay=WD)
    want = train(reference, adamw.step, adamw.zero_grad)
    initial = dict(make_net().named_parameters())
    for name, w in want.items():
        err = relative_error(got[name] - initial[name], w - initial[name])
        assert err <= 1e-5, "%s: %.3g" % (name, err)


def test_weight_decay_zero_group_equals_no_decay_by_name(coordinator):
    model = make_net()
    by_group = run(start(coordinator, "wd-group", groups_of(model, bias_decay=0.0)), model)
    model = make_net()
    names = [n for n, _ in model.named_parameters() if n not in Net.MUON]
    by_name = run(start(coordinator, "wd-name", model, no_decay=names), model)
    model = make_net()
    decayed = run(start(coordinator, "wd-all", model), model)
    for name in by_name:
        assert torch.equal(by_group[name], by_name[name]), name
    assert not torch.equal(by_group["up.bias"], decayed["up.bias"])  # the group's 0 took effect


def test_group_that_disagrees_with_the_plan_is_refused_naming_the_parameter(coordinator):
    model = make_net()
    with pytest.raises(
        ValueError,
        match=r"'up.weight' is in a param group with use_muon=False, but plan version "
        r"\d+ steps it with MUON",
    ):
        start(coordinator, "disagree", groups_of(model, weights_use_muon=False), manifest_params=model)


@pytest.mark.parametrize(
    "group, message",
    [
        ({"betas": (0.9, 0.9)}, r"param group 1: 'betas' not supported"),
        ({"lr": 0.5}, r"param group 1: lr 0.5 differs from the optimizer's lr"),
        ({"weight_decay": 0.05}, r"param group 1: weight_decay 0.05 is neither 0 nor the optimizer's"),
        ({"use_muon": "yes"}, r"param group 1: use_muon must be a bool"),
    ],
)
def test_group_options_the_step_cannot_honour_are_refused(coordinator, group, message):
    model = make_net()
    groups = groups_of(model)
    groups[1].update(group)
    kind = TypeError if "bool" in message else ValueError
    with pytest.raises(kind, match=message):
        start(coordinator, "refused", groups, manifest_params=model)


def test_bad_params_and_unknown_keyword_arguments(coordinator):
    model = make_net()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match=r"'embed.weight' is in param groups 0 and 1"):
        start(coordinator, "twice", [{"params": named}, {"params": named[:3]}], manifest_params=model)
    with pytest.raises(ValueError, match=r"param group 0 has no \"params\""):
        start(coordinator, "none", [{"lr": LR}], manifest_params=model)
    with pytest.raises(TypeError, match=r"nn\.Module, \(name, parameter\) pairs or param groups"):
        start(coordinator, "bare", [p for _, p in named], manifest_params=model)
    with pytest.raises(TypeError, match="momentum"):
        start(coordinator, "kwarg", model, momentum=0.9)  # torch.optim.Muon's name; muonshard's is muon_momentum


def test_options_changed_after_construction_are_refused_at_the_next_step(coordinator):
    model = make_net()
    opt = start(coordinator, "changed", model)
    try:
        opt.param_groups[0]["weight_decay"] = 0.0
        x, y = batches()[0]
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        with pytest.raises(ValueError, match=r"param_groups\[0\]\['weight_decay'\] changed from 0.1 to 0.0"):
            opt.step()
    finally:
        opt.close()


def test_lr_scheduler_over_two_groups_scales_both_alike(coordinator):
    model = make_net()
    opt = start(coordinator, "sched", groups_of(model, bias_decay=0.0))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    seen = []
    try:
        for x, y in batches()[:5]:
            torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            opt.step()
            seen.append(opt._session.lr)
            sched.step()
            opt.zero_grad()
    finally:
        opt.close()
    assert seen == pytest.approx([LR, LR, LR / 2, LR / 2, LR / 4], rel=1e-6)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([LR / 8 * 2] * 2)


def test_a_torch_compiled_module_trains(coordinator):
    """torch.compile wraps the module (its parameters are named
    "_orig_mod.<name>"); the manifest and the optimizer take the compiled
    module alike, and it trains as the eager module does."""
    eager = make_net()
    want = run(start(coordinator, "eager", eager), eager)
    model = make_net()
    compiled = torch.compile(model)
    got = run(start(coordinator, "compiled", compiled), compiled)
    for name, w in want.items():
        assert relative_error(got["_orig_mod." + name], w) <= 1e-5, name
