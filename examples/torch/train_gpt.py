#!/usr/bin/env python3
"""Train the example GPT on the synthetic language, data parallel, with one of three optimizers.

    # 2 processes on this machine (Gloo), the sharded optimizer with a local coordinator:
    export PYTHONPATH=build/python
    .venv/bin/python -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        examples/torch/train_gpt.py --optimizer muonshard --moe --steps 100

    # the baselines: torch AdamW with a gradient all-reduce, or unsharded Muon + AdamW
    .venv/bin/python -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        examples/torch/train_gpt.py --optimizer adamw
    .venv/bin/python examples/torch/train_gpt.py --optimizer muon-local

(.venv: the project's virtual environment with the PyTorch pinned in
python/requirements.txt, 2.11.x; scripts/install-deps.sh makes it.)

Optimizers:
  adamw       torch.optim.AdamW on every rank's full replica; the script averages
              gradients with one all-reduce per step. Every rank holds 2 fp32
              moments per parameter.
  muon-local  an unsharded Muon + AdamW in plain torch (MuonAdamW below): Muon
              for 2-D/3-D weight matrices, AdamW for embeddings, lm_head, norms
              and the MoE router. The same math as muonshard's step, each rank
              holding all of the state.
  muonshard   muonshard.torch.ShardedMuonAdamW: the coordinator's plan gives each
              rank the Muon matrices and AdamW slices it owns; the optimizer
              reduces gradients to their owners, updates its part and sends the
              new parameters back. No all-reduce in this script.

Rank 0 prints the loss curve (mean loss over ranks, step time) and at the end
each rank's optimizer memory next to what unsharded AdamW and unsharded
Muon + AdamW would hold for this model. The exit code is 1 when the loss on a
fixed held-out batch did not fall over the run (the demo relies on it), 2 on
bad flags.

The data is a pure function of (step, rank, world, seed) (data.py), so a run
resumed from a checkpoint sees the batches it would have seen.

Recovery (--optimizer muonshard --max-restarts N): each rank is its own process
that a supervisor (Kubernetes, compose, a test) starts again with the same
command line when it dies; the others do not exit. When a peer dies or
freezes, ShardedMuonAdamW re-joins the job's new generation, waits for the
replacement, restores the newest checkpoint of --checkpoint-dir (the initial
parameters when there is none) and raises muonshard.torch.Recovered; the loop
below rewinds to its step (data and LR schedule are functions of the step, so
the run ends as an uninterrupted one would). In this mode the script uses no
torch.distributed (a dead rank would break its process group too): start the
ranks with RANK / WORLD_SIZE set, not under torch's launcher (which stops
every rank when one dies); every rank submits the plan itself (an identical
request gets the same version) to --coordinator, which must outlive the
ranks; the logged loss is rank 0's own.

Elastic (--min-workers M, with --max-restarts and --checkpoint-dir): when a
rank stays away past --rejoin-grace and at least M are present, the
coordinator plans the job again for those present and the survivors go on
with new ranks and world size: Recovered carries them, and the loop's data
follows (data.batch takes the rank and world). The dead rank's process,
started again with the same command line, grows the job back (the others
recover once more). An elastic job's ranks are the coordinator's: a process
takes the rank it is given (RANK only names its slot for the supervisor).

    # 2 ranks, each restartable (run both; restart either with the same line):
    RANK=0 WORLD_SIZE=2 python3 examples/torch/train_gpt.py --coordinator 127.0.0.1:50051 \
        --max-restarts 3 --checkpoint-dir /tmp/ckpt --checkpoint-every 10
    RANK=1 WORLD_SIZE=2 python3 examples/torch/train_gpt.py --coordinator 127.0.0.1:50051 \
        --max-restarts 3 --checkpoint-dir /tmp/ckpt --checkpoint-every 10
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import math
import os
import re
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

# Running a script puts its own directory on sys.path; this keeps `gpt` and
# `data` importable when the file is run some other way (runpy, an IDE).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import data
from gpt import GPT, GPTConfig, count_parameters

MIB = 1 << 20


# --------------------------------------------------------------------------- flags


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a small GPT on a synthetic language (data parallel over Gloo).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--optimizer", choices=["muonshard", "adamw", "muon-local"], default="muonshard")
    p.add_argument("--steps", type=int, default=100, help="last step to run (steps count from 1)")
    p.add_argument(
        "--hostname",
        default=None,
        help="muonshard: the address Gloo binds and advertises to the other ranks (default "
        "$MUONSHARD_HOSTNAME, else 127.0.0.1; the pod IP in a cluster)",
    )
    p.add_argument(
        "--lr-schedule",
        choices=["cosine", "constant"],
        default="cosine",
        help="cosine: decay to 10%% of --lr at --schedule-steps (torch.optim.lr_scheduler.LambdaLR, which "
        "drives ShardedMuonAdamW as any torch optimizer)",
    )
    p.add_argument(
        "--schedule-steps",
        type=int,
        default=None,
        help="the schedule's horizon (default --steps); give a run that stops early to resume "
        "later the whole run's horizon, so the resumed run follows the same rates",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="learning rate (default: 3e-3 for adamw, 0.02 for the Muon optimizers, "
        "which use one lr for their Muon and AdamW parts, as Paddle does)",
    )
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--seed", type=int, default=0, help="seeds the model init and the data")
    # Model.
    p.add_argument("--moe", action="store_true", help="mixture-of-experts MLPs (top-2 routing)")
    p.add_argument(
        "--stacked-experts",
        action="store_true",
        help="experts as 3-D [E, out, in] parameters instead of one module each",
    )
    p.add_argument("--n-experts", type=int, default=4)
    p.add_argument("--vocab", type=int, default=data.DEFAULT_VOCAB)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument(
        "--d-ff",
        type=int,
        default=None,
        help="SwiGLU intermediate size (default: 344 dense, 172 per expert with --moe)",
    )
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--bf16", action="store_true", help="bf16 parameters (default fp32)")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="shard the parameters with FSDP2 (fully_shard per layer and the root, on a 1-D CPU mesh); "
        "muonshard then plans the DTensor shards, muon-local all-gathers every Muon gradient",
    )
    # muonshard.
    p.add_argument(
        "--coordinator",
        default=os.environ.get("MUONSHARD_COORDINATOR"),
        metavar="HOST:PORT",
        help="coordinator address (env MUONSHARD_COORDINATOR); without it rank 0 "
        "starts a local coordinator on 127.0.0.1 for the run",
    )
    p.add_argument("--job", default="gpt", help="job name at the coordinator (and manifest name)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree of the plan")
    p.add_argument(
        "--policy",
        choices=["seed", "balanced"],
        default="balanced",
        help="the planner's partition policy (seed: Paddle's, which puts every Muon matrix of a "
        "model this small on one rank; balanced: muonshard's)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the optimizer's /metrics on this port + local rank (0: any free port)",
    )
    p.add_argument(
        "--metrics-host",
        default=None,
        help="address /metrics binds (default $MUONSHARD_METRICS_HOST, else 127.0.0.1; 0.0.0.0 "
        "in a container scraped from outside)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="muonshard: recover up to N times when a peer dies or freezes (re-join, wait for the "
        "group, restore the newest checkpoint, rewind); ranks then run as independent processes "
        "without torch.distributed (see above); implies --resume with --checkpoint-dir",
    )
    p.add_argument(
        "--reduce-order",
        choices=["ring", "rank"],
        default="ring",
        help="muonshard: ring (gloo's ring sums) or rank (sums in rank order: the same bits under any "
        "plan of the same world size; n x the reduction traffic)",
    )
    p.add_argument(
        "--min-workers",
        type=int,
        default=0,
        help="muonshard: elastic job: when ranks stay away past --rejoin-grace and at least this many "
        "are present, go on without them (re-planned; new ranks and world size); needs "
        "--max-restarts and --checkpoint-dir",
    )
    p.add_argument(
        "--rejoin-grace",
        type=float,
        default=None,
        help="muonshard: seconds a recovery waits for every rank (a replacement process) to re-join "
        "(default: the communication timeout)",
    )
    # Checkpoints and logging.
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="save every N steps (0: only after the last step); needs --checkpoint-dir",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint in --checkpoint-dir (from scratch if there is none)",
    )
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--summary-json", default=None, help="rank 0 writes the loss curve, step times and memory here")
    args = p.parse_args(argv)

    if args.lr is None:
        args.lr = 3e-3 if args.optimizer == "adamw" else 0.02
    if args.d_ff is None:
        args.d_ff = 172 if args.moe else 344
    if args.stacked_experts and not args.moe:
        p.error("--stacked-experts needs --moe")
    if args.ep < 1:
        p.error("--ep must be >= 1")
    if args.ep > 1 and args.optimizer != "muonshard":
        p.error("--ep applies to --optimizer muonshard only")
    if (args.resume or args.checkpoint_every) and not args.checkpoint_dir:
        p.error("--resume and --checkpoint-every need --checkpoint-dir")
    if args.steps < 1 or args.batch_size < 1 or args.log_every < 1:
        p.error("--steps, --batch-size and --log-every must be >= 1")
    if args.max_restarts < 0:
        p.error("--max-restarts must be >= 0")
    if args.max_restarts and args.optimizer != "muonshard":
        p.error("--max-restarts applies to --optimizer muonshard only")
    if args.max_restarts and not args.coordinator:
        p.error(
            "--max-restarts needs --coordinator (or $MUONSHARD_COORDINATOR): a coordinator started by rank 0 "
            "would die with it"
        )
    if args.rejoin_grace is not None and not args.rejoin_grace > 0:
        p.error("--rejoin-grace must be > 0")
    if args.fsdp and (args.max_restarts or args.stacked_experts or args.ep > 1):
        p.error(
            "--fsdp runs without --max-restarts, --stacked-experts and --ep (FSDP2 shards every tensor along "
            "dim 0 under torch.distributed, which a dead rank breaks)"
        )
    if args.fsdp and args.checkpoint_dir and args.optimizer != "muonshard":
        p.error("--fsdp checkpoints with --optimizer muonshard only")
    if args.min_workers < 0:
        p.error("--min-workers must be >= 0")
    if args.min_workers and not (args.max_restarts and args.checkpoint_dir):
        p.error(
            "--min-workers needs --max-restarts and --checkpoint-dir (a resized group restores the newest "
            "checkpoint under its new plan)"
        )
    return args


def uses_torch_distributed(args, world: int) -> bool:
    """Whether the ranks form a torch.distributed group (not with --max-restarts:
    each rank is then its own restartable process; always with --fsdp)."""
    return (world > 1 or args.fsdp) and not args.max_restarts


def shard_model(model: torch.nn.Module, world: int) -> None:
    """FSDP2: every layer and then the root fully_shard'ed on one CPU mesh of
    the world's ranks; every parameter becomes a DTensor sharded along dim 0."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def local_part(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (a view), else the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def shard_of(whole: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """This rank's block of `whole` as DTensor parameter `p` holds it (Shard(d) on a 1-D mesh)."""
    (placement,) = p.placements
    if not isinstance(placement, Shard):
        return whole
    mesh = p.device_mesh
    return whole.chunk(mesh.size(), dim=placement.dim)[mesh.get_local_rank()]


# --------------------------------------------------------------------------- Muon


# Which tensors Muon updates: 2-D and 3-D ones whose name matches none of the
# planner's default exclusion patterns (case-insensitive regexes), so that
# muon-local classifies exactly as muonshard's plan does. The rest get AdamW.
MUON_EXCLUDE = re.compile(r"embed|lm_head|bias|\.gate\.weight$|router|sinks", re.IGNORECASE)


def is_muon(name: str, p: torch.Tensor) -> bool:
    return p.ndim in (2, 3) and not MUON_EXCLUDE.search(name)


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-9) -> torch.Tensor:
    """Approximately orthogonalise g (or each matrix of a [E, m, n] stack), in fp32."""
    a, b, c = NS_COEFFICIENTS
    x = g.float()
    transposed = x.shape[-2] > x.shape[-1]  # iterate on the smaller Gram matrix
    if transposed:
        x = x.transpose(-2, -1)
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp_min(eps)
    for _ in range(steps):
        gram = x @ x.transpose(-2, -1)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.transpose(-2, -1) if transposed else x


class MuonAdamW(torch.optim.Optimizer):
    """Unsharded Muon (for weight matrices) + AdamW (for everything else).

    Muon, per [out, in] matrix (per expert for a 3-D stack), as muonshard's kernel:
        m = beta*m + (1-beta)*g;  u = (1-beta)*g + beta*m          (Nesterov)
        p = p*(1 - lr*wd) - lr * 0.2*sqrt(max(1, out/in)) * NewtonSchulz5(u)
    AdamW (torch's, which equals Paddle's) with the same lr and weight decay.

    FSDP2 (DTensor) parameters: what a user writes without a sharded Muon:
    each Muon gradient is all-gathered on every rank (full_tensor()), every
    rank keeps the whole momentum and orthogonalises every matrix, then
    applies its own block; AdamW updates the local shards.
    `gathered_bytes` counts what the all-gathers moved in the last step
    (each rank sends and receives (W-1)/W of every Muon matrix, fp32).
    """

    def __init__(
        self, named_params, lr=0.02, betas=(0.9, 0.95), eps=1e-9, weight_decay=0.01, muon_momentum=0.95, ns_steps=5
    ):
        muon, adamw = [], []
        for name, p in named_params:
            (muon if is_muon(name, p) else adamw).append(p)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, muon_momentum=muon_momentum, ns_steps=ns_steps
        )
        groups = [dict(params=muon, use_muon=True), dict(params=adamw, use_muon=False)]
        super().__init__([g for g in groups if g["params"]], defaults)
        self.gathered_bytes = 0

    def _gradient(self, p: torch.Tensor, whole: bool) -> torch.Tensor:
        """p's gradient in fp32: the local shard, or (`whole`) all-gathered."""
        if not isinstance(p.grad, DTensor):
            return p.grad.float()
        if not whole:
            return p.grad.to_local().float()
        world = p.device_mesh.size()
        self.gathered_bytes += 2 * (world - 1) * p.grad.to_local().numel() * 4  # sent + received, per rank
        return p.grad.full_tensor().float()

    @torch.no_grad()
    def step(self, closure=None):
        self.gathered_bytes = 0
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                g, state = self._gradient(param, whole=group["use_muon"]), self.state[param]
                p = local_part(param)
                p.mul_(1 - lr * wd)  # decoupled weight decay
                if group["use_muon"]:
                    beta = group["muon_momentum"]
                    if not state:
                        state["momentum"] = torch.zeros_like(g)
                    m = state["momentum"]
                    m.mul_(beta).add_(g, alpha=1 - beta)
                    u = g.mul(1 - beta).add_(m, alpha=beta)
                    scale = 0.2 * math.sqrt(max(1.0, param.shape[-2] / param.shape[-1]))
                    update = newton_schulz(u, group["ns_steps"])
                    if isinstance(param, DTensor):
                        update = shard_of(update, param)
                    p.add_(update.to(p.dtype), alpha=-lr * scale)
                else:
                    beta1, beta2 = group["betas"]
                    if not state:
                        state["step"] = 0
                        state["exp_avg"] = torch.zeros_like(g)
                        state["exp_avg_sq"] = torch.zeros_like(g)
                    state["step"] += 1
                    m1, m2, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                    m1.mul_(beta1).add_(g, alpha=1 - beta1)
                    m2.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    denom = (m2 / (1 - beta2**t)).sqrt_().add_(group["eps"])
                    p.add_((m1 / denom).to(p.dtype), alpha=-lr / (1 - beta1**t))
        return None


# --------------------------------------------------------------------------- optimizers


class ReplicatedOptimizer:
    """A torch optimizer on a full model replica per rank, plus the gradient all-reduce.

    It has the interface of muonshard.torch.ShardedMuonAdamW that this script
    uses (step, zero_grad, memory, save_checkpoint, load_checkpoint, close), so
    the training loop is the same for every --optimizer.
    """

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, world: int):
        self.model, self.opt = model, opt
        self.rank, self.world_size = rank, world
        self.sharded = any(isinstance(p, DTensor) for p in model.parameters())
        self.steps_done = 0
        self.last_step_stats = {}

    def step(self):
        t0 = time.perf_counter()
        if self.world_size > 1 and not self.sharded:  # FSDP2 reduce-scattered them already
            allreduce_mean_gradients(list(self.model.parameters()), self.world_size)
        t1 = time.perf_counter()
        self.opt.step()
        t2 = time.perf_counter()
        self.steps_done += 1
        reduce = {"reduce_seconds": t1 - t0} if self.world_size > 1 and not self.sharded else {}
        gathered = getattr(self.opt, "gathered_bytes", 0)
        self.last_step_stats = {
            **reduce,
            "update_seconds": t2 - t1,
            **({"all_gather_bytes": gathered} if gathered else {}),
        }

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=False)

    def memory(self) -> dict:
        return {
            "optimizer_state": tensor_bytes(self.opt.state.values()),
            "gradients": sum(
                p.grad.numel() * p.grad.element_size() for p in self.model.parameters() if p.grad is not None
            ),
        }

    def _path(self, directory: str) -> str:
        return os.path.join(directory, "replicated.pt")

    def save_checkpoint(self, directory: str) -> None:
        # Every rank holds the same replica: rank 0 writes it (atomically), all wait.
        if self.rank == 0:
            os.makedirs(directory, exist_ok=True)
            tmp = self._path(directory) + ".tmp"
            torch.save(
                {"step": self.steps_done, "model": self.model.state_dict(), "optimizer": self.opt.state_dict()}, tmp
            )
            os.replace(tmp, self._path(directory))
        barrier(self.world_size)

    def load_checkpoint(self, directory: str) -> int:
        if not os.path.exists(self._path(directory)):
            raise FileNotFoundError(f"no checkpoint at {self._path(directory)}")
        ckpt = torch.load(self._path(directory), map_location="cpu")
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.steps_done = ckpt["step"]
        return self.steps_done

    def close(self):
        pass


def allreduce_mean_gradients(params, world: int) -> None:
    """Average gradients over ranks with one fp32 all-reduce of a flat buffer."""
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def make_muonshard_optimizer(args, model, rank: int, world: int, local_rank: int, stack: contextlib.ExitStack):
    """ShardedMuonAdamW with its plan: rank 0 (starts a coordinator if needed and) submits;
    with --max-restarts every rank submits (the same request: the same version)."""
    if args.ep > 1:
        # With ep > 1 the plan gives each expert-parallel group E/ep experts;
        # the forward/backward would need expert-parallel dispatch (all-to-all
        # of tokens), which this data-parallel example does not do.
        raise NotImplementedError(
            "--ep > 1 needs expert-parallel dispatch in the model; this example is "
            "data parallel (every rank holds all experts): use --ep 1"
        )
    try:
        import muonshard
        import muonshard.torch as mst
    except ImportError as e:
        raise ImportError(
            f"--optimizer muonshard needs the muonshard Python package ({e}); "
            "the adamw and muon-local optimizers work without it"
        ) from e

    address, version, error, failure = args.coordinator, None, None, None
    if args.max_restarts:  # no torch.distributed to share rank 0's answer over
        version = muonshard.Coordinator(address).submit(
            mst.manifest_from_module(model, name=args.job), world_size=world, ep=args.ep, policy=args.policy
        )
        log(rank, f"submitted plan version {version} (world {world}, ep {args.ep}, policy {args.policy}) to {address}")
    elif rank == 0:
        try:
            if address is None:
                coord_proc = stack.enter_context(muonshard.LocalCoordinator())
                address = coord_proc.address
                log(rank, f"started a local coordinator at {address}")
            manifest = mst.manifest_from_module(model, name=args.job)
            # FSDP2: the mesh decides world_size and tp (NOTE [Sharded parameters]).
            topology = mst.topology_of(model) or {"world_size": world}
            version = muonshard.Coordinator(address).submit(manifest, ep=args.ep, policy=args.policy, **topology)
            log(
                rank,
                f"submitted plan version {version} (world {world}, ep {args.ep}, policy {args.policy}) to {address}",
            )
        except Exception as e:  # tell the other ranks before failing, so they do not hang
            failure, error = e, f"{type(e).__name__}: {e}"
    if uses_torch_distributed(args, world):
        # Share the coordinator address and plan version (or rank 0's error) over Gloo.
        shared = [address, version, error]
        dist.broadcast_object_list(shared, src=0)
        address, version, error = shared
    if failure is not None:
        raise failure
    if error:
        raise RuntimeError(f"rank 0 could not set up the plan: {error}")

    # /metrics on --metrics-port + LOCAL_RANK (the optimizer adds the local rank);
    # Gloo binds and advertises --hostname (the pod's IP in a cluster). With
    # --resume (implied by --max-restarts) construction restores the newest
    # checkpoint (opt.start_step), as a recovery does.
    return mst.ShardedMuonAdamW(
        model,
        coordinator=address,
        job=args.job,
        plan_version=version,
        lr=args.lr,
        betas=(0.9, 0.95),
        weight_decay=args.weight_decay,
        muon_momentum=0.95,
        backend="gloo",
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        hostname=args.hostname,
        checkpoint_dir=args.checkpoint_dir,
        resume=True if args.resume else None,
        max_restarts=args.max_restarts,
        rejoin_grace=args.rejoin_grace,
        min_workers=args.min_workers,
        reduce_order=args.reduce_order,
    )


class NeverRaised(Exception):
    """Stands for muonshard.torch.Recovered where nothing can raise it."""


def recovered_exception(args):
    """The exception that tells the loop to rewind (muonshard.torch.Recovered)."""
    if args.optimizer == "muonshard":
        import muonshard.torch as mst

        return mst.Recovered
    return NeverRaised


def make_optimizer(args, model, rank, world, local_rank, stack):
    if args.optimizer == "muonshard":
        return make_muonshard_optimizer(args, model, rank, world, local_rank, stack)
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    else:
        opt = MuonAdamW(model.named_parameters(), lr=args.lr, weight_decay=args.weight_decay)
    return ReplicatedOptimizer(model, opt, rank, world)


# --------------------------------------------------------------------------- helpers


def tensor_bytes(states) -> int:
    """Bytes of the state tensors (moments, momentum) in an iterable of optimizer state dicts.

    0-d tensors (torch AdamW's per-parameter step counters) are not counted.
    """
    return sum(v.numel() * v.element_size() for s in states for v in s.values() if torch.is_tensor(v) and v.ndim > 0)


# The data step of the held-out batch: far past any training run.
HELD_OUT_STEP = 10**9


def unsharded_reference_bytes(model: torch.nn.Module) -> dict:
    """What an unsharded optimizer holds on every rank for this model's parameters."""
    n_total = n_muon = 0
    master = 0
    for name, p in model.named_parameters():
        n_total += p.numel()
        n_muon += p.numel() if is_muon(name, p) else 0
        if p.dtype != torch.float32:
            master += 4 * p.numel()  # an fp32 master copy of a bf16 parameter
    return {
        "params": n_total,
        "muon_params": n_muon,
        "adamw_params": n_total - n_muon,
        "masters": master,
        "adamw": 8 * n_total + master,  # 2 fp32 moments per parameter
        # What muonshard holds too, sharded: fp32 masters only of 16-bit
        # parameters, as Paddle's multi-precision optimizer.
        "muon_adamw": 4 * n_muon + 8 * (n_total - n_muon) + master,
    }


def ensure_gradients(model: torch.nn.Module) -> None:
    """Give parameters that took no part in the forward (an expert no token chose) a zero gradient.

    Every rank then reduces the same set of tensors, and every optimizer sees
    every parameter each step, whatever the routing did on each rank.
    """
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def mean_over_ranks(x: float, world: int) -> float:
    if world == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / world


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(msg, flush=True)


def step_breakdown(stats) -> str:
    """An optimizer's last_step_stats as "  (reduce 1.2  muon 3.4 ms, comm 0.56 MB)"."""
    stats = stats or {}
    phases = "  ".join(
        f"{k[: -len('_seconds')]} {v * 1e3:.1f}"
        for k, v in stats.items()
        if k.endswith("_seconds") and k != "total_seconds"
    )
    comm = sum(v for k, v in stats.items() if k.endswith("_bytes"))
    text = (f"{phases} ms" if phases else "") + (f", comm {comm / 1e6:.2f} MB" if comm else "")
    return f"  ({text})" if text else ""


def fmt_mib(n: float) -> str:
    return f"{n / MIB:.3f} MiB"


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    distributed = uses_torch_distributed(args, world)
    group = world if distributed else 1  # the ranks barrier() and mean_over_ranks() span
    if distributed:
        dist.init_process_group("gloo")  # env:// rendezvous, as torch.distributed.run sets it

    cfg = GPTConfig(
        vocab=args.vocab,
        d_model=args.d_model,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        d_ff=args.d_ff,
        seq_len=args.seq_len,
        moe=args.moe,
        n_experts=args.n_experts,
        stacked_experts=args.stacked_experts,
        dtype=torch.bfloat16 if args.bf16 else torch.float32,
    )
    model = GPT(cfg, seed=args.seed)  # the same init on every rank
    ref = unsharded_reference_bytes(model)
    if args.fsdp:
        shard_model(model, world)
    log(
        rank,
        f"model: {count_parameters(model):,} parameters ({ref['muon_params']:,} Muon, "
        f"{ref['adamw_params']:,} AdamW), {cfg}",
    )
    log(
        rank,
        f"data: {world} rank(s) x {args.batch_size} sequences x {cfg.seq_len} tokens per "
        f"step; loss floor {data.entropy_floor():.3f}, ln(vocab) {math.log(cfg.vocab):.3f}",
    )
    log(rank, f"optimizer: {args.optimizer}, lr {args.lr}, weight decay {args.weight_decay}")

    with contextlib.ExitStack() as stack:
        opt = make_optimizer(args, model, rank, world, local_rank, stack)
        Recovered = recovered_exception(args)
        if args.min_workers and (opt.rank, opt.world_size) != (rank, world):
            # An elastic job's ranks are the coordinator's: a process that grew a
            # shrunk job back takes the rank and world size it was given.
            rank, world = opt.rank, opt.world_size
            log(rank, f"joined as rank {rank} of {world} (plan version {opt.plan_version}); the data follows")

        start = 0
        if args.optimizer == "muonshard":
            # With --resume (or --max-restarts) the constructor restored the newest
            # checkpoint: the model parameters and every rank's optimizer shard,
            # resharded if the plan changed.
            start = opt.start_step
            if start:
                log(rank, f"resumed from {args.checkpoint_dir} after step {start}")
        elif args.resume:
            try:
                start = opt.load_checkpoint(args.checkpoint_dir)
                log(rank, f"resumed from {args.checkpoint_dir} after step {start}")
            except (FileNotFoundError, LookupError) as e:
                log(rank, f"no checkpoint to resume from ({e}); starting from scratch")

        held_out = [heldout_loss(model, cfg, args.seed)]  # the exit check compares these
        digests = [parameter_digest(model)]
        losses, times = {}, {}  # step -> mean loss over ranks / this rank's step seconds
        opt_times, comm = {}, {}  # step -> this rank's opt.step() seconds / bytes its collectives moved
        done = start  # steps done
        sched = lr_scheduler(args, opt, done)
        while done < args.steps:
            step = done + 1
            try:
                inputs, targets = data.batch(
                    step, rank, world, args.batch_size, cfg.seq_len, args.seed, vocab=cfg.vocab
                )
                t0 = time.perf_counter()
                loss = model.loss(inputs, targets)
                loss.backward()
                ensure_gradients(model)
                t1 = time.perf_counter()
                opt.step()  # all-reduce + update, or muonshard's reduce / update / broadcast
                opt_times[step] = time.perf_counter() - t1
                comm[step] = sum(v for k, v in (opt.last_step_stats or {}).items() if k.endswith("_bytes"))
                opt.zero_grad()
                sched.step()
                times[step] = time.perf_counter() - t0

                losses[step] = mean_over_ranks(loss.item(), group)
                if step == start + 1 or step % args.log_every == 0 or step == args.steps:
                    log(
                        rank,
                        f"step {step:5d}/{args.steps}  loss {losses[step]:.4f}  "
                        f"time {times[step] * 1e3:7.1f} ms{step_breakdown(opt.last_step_stats)}",
                    )
                if args.checkpoint_dir and (
                    step == args.steps or (args.checkpoint_every and step % args.checkpoint_every == 0)
                ):
                    opt.save_checkpoint(args.checkpoint_dir)
                    log(rank, f"saved a checkpoint of step {step} to {args.checkpoint_dir}")
                done = step
            except Recovered as r:
                # The group broke (a peer died or froze) and re-formed; the model holds
                # the state after step r.step again: rewind the data and the schedule.
                # An elastic job may have been resized: new rank and world size.
                resized = (r.rank, r.world_size) != (rank, world)
                rank, world = r.rank, r.world_size
                phases = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in r.times.items())
                log(
                    rank,
                    f"recovered at step {step} (restart {r.restarts} of {r.max_restarts}: {r.cause}); "
                    f"{phases}; continuing after step {r.step}",
                )
                if resized:
                    log(rank, f"resized: now rank {rank} of {world} (plan version {r.plan_version}); the data follows")
                done = r.step
                sched = lr_scheduler(args, opt, done)

        held_out.append(heldout_loss(model, cfg, args.seed))
        digests.append(parameter_digest(model))
        memories, comms = [opt.memory()], [comm]
        if distributed:
            memories, comms = [None] * world, [None] * world
            dist.all_gather_object(memories, opt.memory())
            dist.all_gather_object(comms, comm)
        restarts = getattr(opt, "restarts", 0)
        opt.close()
        barrier(group)  # nobody leaves while rank 0's coordinator may still be needed

    status = report(
        args,
        rank,
        losses,
        times,
        memories,
        ref,
        held_out,
        digests,
        restarts=restarts,
        optimizer_times=opt_times,
        comms=comms,
    )
    if distributed:
        # Nothing may hold on to the process group when it goes: FSDP2's state
        # keeps its collectives' work, which torch would destroy at interpreter
        # exit, without the group, and abort ("terminate called without an
        # active exception").
        del model, opt, sched
        gc.collect()
        dist.destroy_process_group()
    return status


def lr_scheduler(args, opt, done: int):
    """The schedule from `done` steps on: a function of the absolute step, so a
    resumed or rewound run goes on where the saved one was."""
    return torch.optim.lr_scheduler.LambdaLR(getattr(opt, "opt", opt), lambda i: lr_factor(args, done + i))


def lr_factor(args, step: int) -> float:
    """The lr multiplier before training step `step` + 1 (0-based count of steps done)."""
    if args.lr_schedule == "constant":
        return 1.0
    horizon = args.schedule_steps or args.steps
    progress = min(step, horizon) / max(1, horizon)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes in named order: equal digests are equal models."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        value = p.full_tensor() if isinstance(p, DTensor) else p.detach().clone()  # full_tensor: a collective
        h.update(value.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def heldout_loss(model: torch.nn.Module, cfg: GPTConfig, seed: int) -> float:
    """The loss on a fixed held-out batch (128 sequences no step trains on): a
    low-noise measure of progress, the same on every rank."""
    inputs, targets = data.batch(HELD_OUT_STEP, 0, 1, 128, cfg.seq_len, seed, vocab=cfg.vocab)
    with torch.no_grad():
        loss = float(model.loss(inputs, targets))
    if hasattr(model, "reshard"):  # FSDP2 keeps the root's parameters gathered after a forward: shard them again
        model.reshard()
    return loss


def report(
    args, rank, losses, times, memories, ref, held_out, digests, restarts=0, optimizer_times=None, comms=None
) -> int:
    """Rank 0 prints the summary; every rank returns the same exit status."""
    if not losses:
        log(rank, f"nothing to do: already at step {args.steps}")
        return 0
    steps = sorted(losses)
    first, last = losses[steps[0]], losses[steps[-1]]
    timed = [times[s] for s in steps[1:]] or [times[steps[0]]]  # the first step warms up
    log(rank, f"\nloss: step {steps[0]} {first:.4f} -> step {steps[-1]} {last:.4f} (floor {data.entropy_floor():.3f})")
    log(
        rank,
        f"step time ({args.optimizer}, rank 0): mean {statistics.mean(timed) * 1e3:.1f} ms, "
        f"median {statistics.median(timed) * 1e3:.1f} ms over {len(timed)} steps",
    )

    keys = sorted({k for m in memories for k in m}, key=lambda k: (k != "optimizer_state", k))
    widths = [max(13, len(k)) for k in keys]
    log(rank, "\nmemory per rank:\n  rank  " + "  ".join(f"{k:>{w}}" for k, w in zip(keys, widths, strict=True)))
    for r, m in enumerate(memories):
        log(
            rank,
            f"  {r:4d}  "
            + "  ".join(f"{fmt_mib(m[k]) if k in m else '-':>{w}}" for k, w in zip(keys, widths, strict=True)),
        )
    masters = ", + fp32 masters" if ref["masters"] else ""
    log(
        rank,
        f"  unsharded torch AdamW would hold  {ref['adamw'] / MIB:.3f} MiB of optimizer "
        f"state per rank (2 fp32 moments x {ref['params']:,} parameters{masters})",
    )
    log(
        rank,
        f"  unsharded Muon + AdamW would hold {ref['muon_adamw'] / MIB:.3f} MiB per rank "
        f"(momentum for {ref['muon_params']:,} Muon elements, 2 moments for "
        f"{ref['adamw_params']:,} AdamW elements{masters})",
    )
    if args.optimizer == "muonshard":
        largest = max(m["optimizer_state"] for m in memories)
        which = (
            f"sharded over {len(memories)} rank(s) the largest holds"
            if not args.max_restarts
            else "sharded, rank 0 holds"
        )  # independent ranks: rank 0 knows only its own
        log(
            rank,
            f"  muonshard holds that state sharded: {which} {largest / MIB:.3f} MiB "
            f"({100 * largest / ref['muon_adamw']:.0f}% of it)",
        )

    if rank == 0 and args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(
                {
                    "optimizer": args.optimizer,
                    "losses": {str(s): losses[s] for s in steps},
                    "step_seconds": {str(s): times[s] for s in steps},
                    "optimizer_seconds": {str(s): (optimizer_times or {}).get(s) for s in steps},
                    # bytes each rank's collectives moved in the optimizer step, by step
                    "comm_bytes": [{str(s): c.get(s) for s in steps} for c in comms or []],
                    "memory": memories,
                    "unsharded": ref,
                    "held_out": held_out,
                    "parameter_digests": digests,
                    "restarts": restarts,
                },
                f,
                indent=1,
            )

    log(rank, f"held-out loss: {held_out[0]:.4f} -> {held_out[1]:.4f}")
    if not held_out[1] < held_out[0]:
        log(rank, f"FAIL: the held-out loss did not fall ({held_out[0]:.4f} -> {held_out[1]:.4f})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
