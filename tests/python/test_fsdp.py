"""ShardedMuonAdamW on FSDP2 (`fully_shard`) DTensor parameters, on a CPU
DeviceMesh over Gloo, each run W processes started by torch.distributed.run
(NOTE [Sharded parameters] in muonshard/torch/dtensor.py): the result equals
the unsharded pure-torch reference (reference_optimizer.py) fed the mean of
the ranks' gradients, within 1e-5 relative in fp32, at W = 1, 2 and 4."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import fsdp_model
import muonshard.torch as mst
from muonshard.torch import dtensor
from conftest import HERE, package_env
from reference_optimizer import ReferenceConfig, ReferenceOptimizer

TIMEOUT = 240


def torchrun(coordinator, job, world, out, *extra):
    """fsdp_rank.py in `world` processes by torch.distributed.run; its output (bounded)."""
    os.makedirs(out, exist_ok=True)
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
            os.path.join(HERE, "fsdp_rank.py"), "--coordinator", coordinator.address, "--job", job, "--out", out,
            *extra]
    done = subprocess.run(args, env=package_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=TIMEOUT)
    return done.returncode, done.stdout.decode(errors="replace")[-4000:]


def reference(world, kinds):
    """The unsharded model stepped by the reference optimizer on the mean of
    the `world` ranks' gradients, step after step."""
    model = fsdp_model.make_model()
    named = list(model.named_parameters())
    config = ReferenceConfig(lr=fsdp_model.OPTIONS["lr"], weight_decay=fsdp_model.OPTIONS["weight_decay"],
                             eps=fsdp_model.OPTIONS["eps"], adamw_betas=fsdp_model.OPTIONS["betas"])
    ref = ReferenceOptimizer([(n, p.detach()) for n, p in named],
                             {n: "muon" if kinds[n] == "MUON" else "adamw" for n, _ in named}, config)
    for step in range(fsdp_model.STEPS):
        grads = []
        for rank in range(world):
            model.zero_grad()
            fsdp_model.loss(model, *fsdp_model.batch(step, rank)).backward()
            grads.append({n: p.grad.detach().clone() for n, p in named})
        ref.step(grads)
        with torch.no_grad():
            for n, p in named:
                p.copy_(ref.model_copy(n))
    return {n: p.detach() for n, p in named}


def relative_error(got, want):
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fsdp2_training_equals_the_unsharded_reference(coordinator, tmp_path, world):
    code, log = torchrun(coordinator, "fsdp-%d" % world, world, str(tmp_path))
    assert code == 0, log
    got = torch.load(os.path.join(tmp_path, "params.pt"))
    ranks = [json.load(open(os.path.join(tmp_path, "rank-%d.json" % r))) for r in range(world)]
    kinds = ranks[0]["kinds"]
    assert kinds["blocks.0.up.weight"] == "MUON" and kinds["blocks.1.down.weight"] == "MUON"
    assert kinds["embed.weight"] == "ADAMW" and kinds["blocks.0.up.bias"] == "ADAMW"
    if world > 1:  # FSDP2's Shard(0), and Shard(1) where shard_placement_fn says so
        splits = ranks[0]["splits"]
        assert splits["blocks.0.up.weight"] == "TP_COLUMN" and splits["embed.weight"] == "TP_COLUMN"
        assert splits["blocks.0.down.weight"] == "TP_ROW" and splits["blocks.0.norm.bias"] == "TP_COLUMN"
    want = reference(world, kinds)
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name
    # The plan is the FSDP layout: every rank holds 1 / W of every tensor's
    # state (Muon state whole on the matrix's owner would not level).
    states = [r["memory"]["optimizer_state"] for r in ranks]
    assert max(states) == min(states), states
    assert all(r["memory"]["optimizer_state"] == r["memory"]["plan_optimizer_state"] for r in ranks)


@pytest.fixture
def mesh():
    """A 1-rank CPU DeviceMesh (this process: a Gloo group of one)."""
    from torch.distributed.device_mesh import init_device_mesh
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        torch.distributed.destroy_process_group()


def dparam(value, mesh, placement):
    return torch.nn.Parameter(DTensor.from_local(value, mesh, [placement]))


def test_placements_map_onto_the_plan_splits_or_are_refused_naming_the_parameter(mesh):
    assert dtensor.split_of("a", dparam(torch.ones(8, 4), mesh, Shard(0))) == "column"
    assert dtensor.split_of("a", dparam(torch.ones(8), mesh, Shard(0))) == "column"
    assert dtensor.split_of("a", dparam(torch.ones(8, 4), mesh, Shard(1))) == "row"
    assert dtensor.split_of("a", dparam(torch.ones(8, 4), mesh, Replicate())) == "replicated"
    with pytest.raises(ValueError, match="'p'.*placement P"):
        dtensor.split_of("p", dparam(torch.ones(8, 4), mesh, Partial()))
    with pytest.raises(ValueError, match="'stack'.*3-D"):
        dtensor.split_of("stack", dparam(torch.ones(4, 8, 8), mesh, Shard(0)))
    named = [("a", dparam(torch.ones(8, 4), mesh, Shard(0)))]
    assert mst.topology_of(named) == {"world_size": 1, "tp": 1}
    assert mst.topology_of([("plain", torch.nn.Parameter(torch.ones(4)))]) == {}
    with pytest.raises(ValueError, match="'plain' is a plain tensor"):
        mst.manifest_from_module(named + [("plain", torch.nn.Parameter(torch.ones(4)))], "m")
    with pytest.raises(ValueError, match="leave tp"):
        mst.manifest_from_module(named, "m", tp=2)
