"""One rank of an FSDP2 run (launched by test_fsdp.py through torch.distributed.run):
the model of fsdp_model.py wrapped with `fully_shard` on a 1-D CPU DeviceMesh
over Gloo (or HSDP's 2-D one, or with --tp T torchtitan's FSDP x TP mesh of
(W / T, T): block 0 tensor-parallel by parallelize_module, then fully_shard
over dp_shard), trained by ShardedMuonAdamW on its DTensor parameters; rank 0
writes the whole parameters (and which optimizer stepped each) to OUT."""

import argparse
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdp_model

import muonshard
import muonshard.torch as mst


def shard_placement(param):
    """down.weight by columns (Shard(1): the plan's TP_ROW), the rest FSDP2's default Shard(0)."""
    return Shard(1) if param.shape == fsdp_model.DOWN_SHAPE else None


def save(a, model, opt):
    if a.format == "muonshard":
        opt.save_checkpoint(a.save_dir)  # None: checkpoint_dir
        return
    model_state, optim_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=a.save_dir)


def load(a, model, opt):
    """Loads --resume-dir (saved at any world size); returns the steps done."""
    if a.format == "muonshard":
        return opt.load_checkpoint(a.resume_dir)
    model_state, optim_state = get_state_dict(model, opt)
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=a.resume_dir)
    set_state_dict(model, opt, model_state_dict=model_state, optim_state_dict=optim_state)
    return opt.steps_done


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", type=int, default=fsdp_model.STEPS)
    ap.add_argument("--policy", default="balanced")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 parameters (fp32 optimizer state)")
    ap.add_argument("--save-at", type=int, default=-1, help="saves a checkpoint after this many steps")
    ap.add_argument("--save-dir")
    ap.add_argument("--resume-dir", help="loads the checkpoint there before training")
    ap.add_argument(
        "--format",
        choices=["dcp", "muonshard"],
        default="dcp",
        help="checkpoints through torch.distributed.checkpoint or the project's own format",
    )
    ap.add_argument("--checkpoint-dir", help="checkpoint_dir with resume: every save goes there, a start resumes")
    ap.add_argument(
        "--die-at", type=int, default=-1, help="rank 1 of a run that did not resume exits hard after this many steps"
    )
    ap.add_argument("--replicas", type=int, default=1, help="HSDP: a (replicas, W / replicas) mesh")
    ap.add_argument("--tp", type=int, default=1, help="FSDP x TP: a (W / tp, tp) mesh (dp_shard, tp)")
    ap.add_argument(
        "--wrong-tiles", action="store_true", help="plans blocks.0.down.weight's tile transposed (a wrong plan)"
    )
    ap.add_argument("--plan-column", action="store_true", help="plans every split as TP_COLUMN (a wrong plan)")
    ap.add_argument("--experts", action="store_true", help="a 3-D expert stack in every block")
    ap.add_argument(
        "--plain", action="store_true", help="no FSDP2: plain replicated parameters, muonshard's own data-parallel step"
    )
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data_rank = rank
    if a.tp > 1:
        mesh = init_device_mesh("cpu", (world // a.tp, a.tp), mesh_dim_names=("dp_shard", "tp"))
        data_rank = mesh.get_coordinate()[0]  # the tp ranks of a dp rank see its data
    elif a.replicas == 1:
        mesh = init_device_mesh("cpu", (world,))
    else:
        mesh = init_device_mesh("cpu", (a.replicas, world // a.replicas), mesh_dim_names=("replicate", "shard"))
    model = fsdp_model.make_model(a.experts)
    if a.bf16:
        model = model.to(torch.bfloat16)
    if a.tp > 1:  # torchtitan's order: TP on the tp submesh, then FSDP2 over dp_shard
        parallelize_module(model.blocks[0], mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"])
    elif not a.plain:
        for block in model.blocks:
            fully_shard(block, mesh=mesh, shard_placement_fn=shard_placement)
        fully_shard(model, mesh=mesh, shard_placement_fn=shard_placement)

    manifest = mst.manifest_from_module(model, a.job)
    if a.plan_column:  # a plan that disagrees with the placements: shard_placement's Shard(1) planned as Shard(0)
        for t in manifest["tensors"]:
            t["tpSplit"] = "TP_COLUMN" if t.get("tpSplit") == "TP_ROW" else t.get("tpSplit")
    if a.wrong_tiles:  # rows split over tp and columns over dp_shard: another tile than the rank holds
        for t in manifest["tensors"]:
            if t["name"] == "blocks.0.down.weight":
                t["tpMeshSplit"] = ["TP_ROW", "TP_COLUMN"]
    topology = mst.topology_of(model) or {"world_size": world}
    version = muonshard.Coordinator(a.coordinator).submit(manifest, policy=a.policy, **topology)
    opt = mst.ShardedMuonAdamW(
        model,
        coordinator=a.coordinator,
        job=a.job,
        plan_version=version,
        **fsdp_model.OPTIONS,
        blas_threads=1,
        comm_timeout=60,
        join_timeout=30,
        checkpoint_dir=a.checkpoint_dir,
        resume=bool(a.checkpoint_dir),
    )
    start = load(a, model, opt) if a.resume_dir else opt.start_step
    first_attempt = start == 0
    for step in range(start, a.steps):
        x, y = fsdp_model.batch(step, data_rank)
        fsdp_model.loss(model, x, y).backward()
        opt.step()
        opt.zero_grad()
        if step + 1 == a.save_at:
            save(a, model, opt)
        if step + 1 == a.die_at and rank == 1 and first_attempt:
            os._exit(3)  # killed: the job is started again and every rank resumes
    memory = opt.memory()
    refused = None
    if a.replicas > 1 or a.tp > 1:
        try:
            opt.state_dict()
        except ValueError as e:
            refused = str(e)
    kinds = {h["name"]: h["optimizer"] for h in opt.held_tensors}
    whole = {n: (p if a.plain else p.full_tensor()).detach().clone() for n, p in model.named_parameters()}
    opt.close()
    if rank == 0:
        torch.save(whole, os.path.join(a.out, "params.pt"))
    with open(os.path.join(a.out, "rank-%d.json" % rank), "w") as f:
        json.dump(
            {
                "kinds": kinds,
                "memory": memory,
                "version": version,
                "state_dict_refused": refused,
                "topology": mst.topology_of(model),
                "splits": {t["name"]: t.get("tpSplit") for t in manifest["tensors"]},
                "mesh_splits": {t["name"]: t.get("tpMeshSplit") for t in manifest["tensors"]},
            },
            f,
        )
    # Nothing may hold on to the group when it goes (FSDP2's state keeps its
    # collectives' work: destroyed at interpreter exit, torch aborts).
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
