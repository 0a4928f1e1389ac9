"""ShardedMuonAdamW on FSDP2 (`fully_shard`) DTensor parameters, on a CPU
DeviceMesh over Gloo, each run W processes started by torch.distributed.run
(NOTE [Sharded parameters] in muonshard/torch/dtensor.py): the result equals
the unsharded pure-torch reference (reference_optimizer.py) fed the mean of
the ranks' gradients, within 1e-5 relative in fp32, at W = 1, 2 and 4, on
HSDP's 2 x 2 mesh and on torchtitan's 2 x 2 FSDP x TP mesh."""

import json
import os
import subprocess
import sys

import fsdp_model
import pytest
import torch
from conftest import HERE, package_env
from reference_optimizer import ReferenceConfig, ReferenceOptimizer
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import muonshard.torch as mst
from muonshard.torch import dtensor

TIMEOUT = 240


def torchrun(coordinator, job, world, out, *extra):
    """fsdp_rank.py in `world` processes by torch.distributed.run; its output (bounded)."""
    os.makedirs(out, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(world),
        os.path.join(HERE, "fsdp_rank.py"),
        "--coordinator",
        coordinator.address,
        "--job",
        job,
        "--out",
        out,
        *extra,
    ]
    done = subprocess.run(args, env=package_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
    return done.returncode, done.stdout.decode(errors="replace")[-4000:]


def reference(worlds, kinds, dtype=torch.float32, experts=False):
    """The unsharded model stepped by the reference optimizer on the mean of
    the ranks' gradients, step after step (step i on worlds[i] ranks)."""
    model = fsdp_model.make_model(experts).to(dtype)
    named = list(model.named_parameters())
    config = ReferenceConfig(
        lr=fsdp_model.OPTIONS["lr"],
        weight_decay=fsdp_model.OPTIONS["weight_decay"],
        eps=fsdp_model.OPTIONS["eps"],
        adamw_betas=fsdp_model.OPTIONS["betas"],
    )
    ref = ReferenceOptimizer(
        [(n, p.detach()) for n, p in named], {n: "muon" if kinds[n] == "MUON" else "adamw" for n, _ in named}, config
    )
    for world in worlds:
        step = ref.step_count
        grads = []
        for rank in range(world):
            model.zero_grad()
            fsdp_model.loss(model, *fsdp_model.batch(step, rank)).backward()
            grads.append({n: p.grad.detach().float() for n, p in named})
        ref.step(grads)
        with torch.no_grad():
            for n, p in named:
                p.copy_(ref.model_copy(n))
    return {n: p.detach() for n, p in named}


def relative_error(got, want):
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def results(out, world):
    """What the run in `out` wrote: the whole parameters, and each rank's record."""
    ranks = []
    for r in range(world):
        with open(os.path.join(out, "rank-%d.json" % r)) as f:
            ranks.append(json.load(f))
    return torch.load(os.path.join(out, "params.pt")), ranks


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fsdp2_training_equals_the_unsharded_reference(coordinator, tmp_path, world):
    code, log = torchrun(coordinator, "fsdp-%d" % world, world, str(tmp_path))
    assert code == 0, log
    got, ranks = results(str(tmp_path), world)
    kinds = ranks[0]["kinds"]
    assert kinds["blocks.0.up.weight"] == "MUON" and kinds["blocks.1.down.weight"] == "MUON"
    assert kinds["embed.weight"] == "ADAMW" and kinds["blocks.0.up.bias"] == "ADAMW"
    if world > 1:  # FSDP2's Shard(0), and Shard(1) where shard_placement_fn says so
        splits = ranks[0]["splits"]
        assert splits["blocks.0.up.weight"] == "TP_COLUMN" and splits["embed.weight"] == "TP_COLUMN"
        assert splits["blocks.0.down.weight"] == "TP_ROW" and splits["blocks.0.norm.bias"] == "TP_COLUMN"
    want = reference([world] * fsdp_model.STEPS, kinds)
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name
    # The plan is the FSDP layout: every rank holds 1 / W of every tensor's
    # state (Muon state whole on the matrix's owner would not level).
    states = [r["memory"]["optimizer_state"] for r in ranks]
    assert max(states) == min(states), states
    assert all(r["memory"]["optimizer_state"] == r["memory"]["plan_optimizer_state"] for r in ranks)


@pytest.mark.parametrize("world", [2, 4])
def test_expert_stacks_sharded_along_their_experts_are_planned_by_ep(coordinator, tmp_path, world):
    """A 3-D expert stack under FSDP2 holds whole experts on each rank: planned
    with ep = W, each rank orthogonalises its own experts (no gather)."""
    code, log = torchrun(coordinator, "experts-%d" % world, world, str(tmp_path), "--experts")
    assert code == 0, log
    got, ranks = results(str(tmp_path), world)
    assert ranks[0]["topology"] == {"world_size": world, "tp": world, "ep": world}
    assert ranks[0]["kinds"]["blocks.0.experts.weight"] == "MUON"
    want = reference([world] * fsdp_model.STEPS, ranks[0]["kinds"], experts=True)
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name


def test_hsdp_on_a_2x2_mesh_equals_the_unsharded_reference(coordinator, tmp_path):
    """HSDP: 2 replicas x 2 shards; the plan (2 replicas of tp 2) shards the
    optimizer state over all 4 ranks, where HSDP would replicate it over the
    replicas, and the DCP state_dict, which cannot say so, is refused."""
    code, log = torchrun(coordinator, "hsdp", 4, str(tmp_path), "--replicas", "2")
    assert code == 0, log
    got, ranks = results(str(tmp_path), 4)
    want = reference([4] * fsdp_model.STEPS, ranks[0]["kinds"])
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name
    assert all(r["memory"]["optimizer_state"] == r["memory"]["plan_optimizer_state"] for r in ranks)
    assert all("HSDP" in r["state_dict_refused"] and "save_checkpoint" in r["state_dict_refused"] for r in ranks)


def test_fsdp_x_tp_on_a_2x2_mesh_equals_the_unsharded_reference(coordinator, tmp_path):
    """torchtitan's FSDP x TP: a (dp_shard 2, tp 2) mesh, block 0's up colwise
    and down rowwise (then (_StridedShard(0), Shard(0)) and (Shard(0),
    Shard(1)) tiles), block 1 and the rest FSDP2's Shard(0) over dp_shard,
    replicated over tp. Planned as one replica of tp 4 on tp_mesh [2, 2]; the
    result is the reference on the 2 dp ranks' data, every rank's state is
    the plan's (1 / 4 of each TP weight, 1 / 2 of the rest), and the DCP
    state_dict is offered."""
    code, log = torchrun(coordinator, "fsdp-tp", 4, str(tmp_path), "--tp", "2")
    assert code == 0, log
    got, ranks = results(str(tmp_path), 4)
    assert ranks[0]["topology"] == {"world_size": 4, "tp": 4, "tp_mesh": [2, 2]}
    splits = ranks[0]["mesh_splits"]
    assert splits["blocks.0.up.weight"] == ["TP_COLUMN", "TP_COLUMN"]
    assert splits["blocks.0.down.weight"] == ["TP_COLUMN", "TP_ROW"]
    assert splits["blocks.1.up.weight"] == ["TP_COLUMN", "TP_REPLICATED"]
    kinds = ranks[0]["kinds"]
    assert kinds["blocks.0.up.weight"] == "MUON" and kinds["blocks.1.down.weight"] == "MUON"
    want = reference([2] * fsdp_model.STEPS, kinds)
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name
    states = [r["memory"]["optimizer_state"] for r in ranks]
    assert max(states) == min(states), states
    assert all(r["memory"]["optimizer_state"] == r["memory"]["plan_optimizer_state"] for r in ranks)
    assert all(r["state_dict_refused"] is None for r in ranks)


def test_fsdp_x_tp_checkpoints_through_dcp_and_resumes_on_a_1d_mesh(coordinator, tmp_path):
    """Saved by DCP after 3 steps on the 2x2 FSDP x TP mesh, loaded into
    plain FSDP2 at W = 2 (other placements, other plan), 3 more steps: the
    reference on the 2 data ranks throughout. The project's own format holds
    one split dimension per tensor and refuses the tiled plan, naming a
    tensor."""
    ckpt = str(tmp_path / "ckpt")
    flags = ("--steps", "3", "--save-at", "3", "--save-dir", ckpt)
    code, log = torchrun(coordinator, "tp-save-dcp", 4, str(tmp_path / "w4"), "--tp", "2", *flags)
    assert code == 0, log
    code, log = torchrun(coordinator, "tp-load-dcp", 2, str(tmp_path / "w2"), "--resume-dir", ckpt)
    assert code == 0, log
    got, ranks = results(str(tmp_path / "w2"), 2)
    want = reference([2] * fsdp_model.STEPS, ranks[0]["kinds"])
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name
    flags = ("--steps", "1", "--save-at", "1", "--save-dir", str(tmp_path / "own"), "--format", "muonshard")
    code, log = torchrun(coordinator, "tp-save-own", 4, str(tmp_path / "own-out"), "--tp", "2", *flags)
    assert code != 0
    assert "is tiled over a multi-dimensional tp mesh" in log and "torch.distributed.checkpoint" in log, log


def test_an_fsdp_x_tp_plan_whose_tiles_disagree_is_refused_naming_the_parameter(coordinator, tmp_path):
    code, log = torchrun(coordinator, "wrong-tiles", 4, str(tmp_path), "--tp", "2", "--wrong-tiles")
    assert code != 0
    assert "parameter 'blocks.0.down.weight' (placements" in log and "but the plan's tile for it is at" in log, log


@pytest.mark.parametrize("fmt,layout", [("dcp", "fsdp"), ("muonshard", "fsdp"), ("dcp", "plain")])
def test_a_checkpoint_saved_at_4_ranks_resumes_at_2(coordinator, tmp_path, fmt, layout):
    """Saved after 3 steps at W = 4 (DCP: get_state_dict + dcp.save; or
    save_checkpoint), loaded at W = 2 (dcp.load + set_state_dict; or
    load_checkpoint, which reshards), 3 more steps: the reference that
    averaged 4 ranks' gradients, then 2 ranks'. FSDP2's DTensor parameters,
    or plain ones (muonshard's own data parallelism: ShardedTensors of the
    plan's element ranges)."""
    ckpt = str(tmp_path / "ckpt")
    first, second = str(tmp_path / "w4"), str(tmp_path / "w2")
    extra = ("--format", fmt) + (("--plain",) if layout == "plain" else ())
    code, log = torchrun(
        coordinator,
        "save-%s-%s" % (fmt, layout),
        4,
        first,
        "--steps",
        "3",
        "--save-at",
        "3",
        "--save-dir",
        ckpt,
        *extra,
    )
    assert code == 0, log
    code, log = torchrun(coordinator, "load-%s-%s" % (fmt, layout), 2, second, "--resume-dir", ckpt, *extra)
    assert code == 0, log
    got, ranks = results(second, 2)
    want = reference([4, 4, 4, 2, 2, 2], ranks[0]["kinds"])
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name


def test_after_a_rank_is_killed_the_job_started_again_resumes_from_its_checkpoint(coordinator, tmp_path):
    """FSDP2 needs torch.distributed, which a dead rank breaks for every rank, so
    recovery is the job's restart (torch.distributed.run --max-restarts,
    a Kubernetes Job): rank 1 dies after step 4 and the launch fails; the same
    command again starts every rank anew, each joins the job as its rank's
    restart and resumes from the newest checkpoint of checkpoint_dir (saved
    after step 2), and the run ends as an uninterrupted one does."""
    ckpt = str(tmp_path / "ckpt")
    flags = ("--checkpoint-dir", ckpt, "--format", "muonshard", "--save-at", "2", "--die-at", "4")
    code, log = torchrun(coordinator, "killed", 2, str(tmp_path / "first"), *flags)
    assert code != 0 and "exitcode  : 3" in log, log
    code, log = torchrun(coordinator, "killed", 2, str(tmp_path / "again"), *flags)
    assert code == 0, log
    got, ranks = results(str(tmp_path / "again"), 2)
    want = reference([2] * fsdp_model.STEPS, ranks[0]["kinds"])
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name


def test_bf16_parameters_keep_fp32_state(coordinator, tmp_path):
    """bf16 parameters: the optimizer keeps fp32 masters and state; the result
    is the reference's within bf16's resolution (FSDP2 reduces the bf16
    gradients in bf16)."""
    code, log = torchrun(coordinator, "bf16", 2, str(tmp_path), "--bf16")
    assert code == 0, log
    got, ranks = results(str(tmp_path), 2)
    assert all(v.dtype == torch.bfloat16 for v in got.values())
    want = reference([2] * fsdp_model.STEPS, ranks[0]["kinds"], torch.bfloat16)
    initial = dict(fsdp_model.make_model().to(torch.bfloat16).named_parameters())
    for name, value in want.items():
        moved = relative_error(value, initial[name].detach())
        assert moved > 0.01, name  # training moved it, by more than the tolerance below
        assert relative_error(got[name], value) <= 0.01, name


def test_a_plan_that_disagrees_with_the_placements_is_refused_naming_the_parameter(coordinator, tmp_path):
    code, log = torchrun(coordinator, "wrong-plan", 2, str(tmp_path), "--plan-column")
    assert code != 0
    assert "parameter 'blocks.0.down.weight' has placement S(1) (TP_ROW) but the plan splits it TP_COLUMN" in log, log


@pytest.fixture
def mesh2d():
    """A 1 x 1 (dp_shard, tp) CPU DeviceMesh of this process."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp_shard", "tp"))
    finally:
        torch.distributed.destroy_process_group()


def test_fsdp_x_tp_placements_map_onto_mesh_splits_or_are_refused_naming_the_parameter(mesh2d):
    from torch.distributed.tensor.placement_types import _StridedShard

    def param(value, placements):
        return torch.nn.Parameter(DTensor.from_local(value, mesh2d, placements))

    colwise = param(torch.ones(8, 4), [_StridedShard(0, split_factor=2), Shard(0)])
    assert dtensor.mesh_splits("up", colwise, mesh2d) == ["TP_COLUMN", "TP_COLUMN"]
    tile = param(torch.ones(8, 4), [Shard(0), Shard(1)])
    assert dtensor.mesh_splits("down", tile, mesh2d) == ["TP_COLUMN", "TP_ROW"]
    norm = param(torch.ones(8), [Shard(0), Replicate()])
    assert dtensor.mesh_splits("norm", norm, mesh2d) == ["TP_COLUMN", "TP_REPLICATED"]
    with pytest.raises(ValueError, match=r"'p' has placements .*Partial|'p' has placements .*P"):
        dtensor.mesh_splits("p", param(torch.ones(8, 4), [Shard(0), Partial()]), mesh2d)
    with pytest.raises(ValueError, match=r"'stack' \(shape \(4, 8, 8\)\) is a 3-D tensor"):
        dtensor.mesh_splits("stack", param(torch.ones(4, 8, 8), [Shard(0), Shard(1)]), mesh2d)
    named = [("up", colwise), ("down", tile), ("norm", norm)]
    assert dtensor.is_fsdp_tp(mesh2d, named)
    assert mst.topology_of(named) == {"world_size": 1, "tp": 1, "tp_mesh": [1, 1]}
    held = {"local_shape": (8, 4), "tile_offset": (0, 0)}
    dtensor.check_tile_against_plan("down", tile, held, mesh2d, (1, 1))
    with pytest.raises(ValueError, match=r"'down' is on an FSDP x TP DeviceMesh of shape \(1, 1\) but the plan's"):
        dtensor.check_tile_against_plan("down", tile, held, mesh2d, (2, 2))
    with pytest.raises(ValueError, match=r"'down' \(placements .*the plan's tile for it is at \(0, 0\) of shape"):
        dtensor.check_tile_against_plan("down", tile, {"local_shape": (4, 4), "tile_offset": (0, 0)}, mesh2d, (1, 1))


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
    with pytest.raises(ValueError, match=r"'p'.*placement P"):
        dtensor.split_of("p", dparam(torch.ones(8, 4), mesh, Partial()))
    assert dtensor.split_of("stack", dparam(torch.ones(4, 8, 8), mesh, Shard(0))) == "experts"
    with pytest.raises(ValueError, match=r"'stack'.*dim 1.*3-D"):
        dtensor.split_of("stack", dparam(torch.ones(4, 8, 8), mesh, Shard(1)))
    named = [("a", dparam(torch.ones(8, 4), mesh, Shard(0)))]
    assert mst.topology_of(named) == {"world_size": 1, "tp": 1}
    assert mst.topology_of([("plain", torch.nn.Parameter(torch.ones(4)))]) == {}
    with pytest.raises(ValueError, match="'plain' is a plain tensor"):
        mst.manifest_from_module(named + [("plain", torch.nn.Parameter(torch.ones(4)))], "m")
    with pytest.raises(ValueError, match="leave tp"):
        mst.manifest_from_module(named, "m", tp=2)
    with pytest.raises(ValueError, match="overlap_backward with DTensor"):
        mst.ShardedMuonAdamW(named, job="j", overlap_backward=True)
