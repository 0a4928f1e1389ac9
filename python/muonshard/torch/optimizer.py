"""ShardedMuonAdamW: a torch optimizer that runs muonshard's sharded C++ step."""

import math
import os
import time
import warnings
from typing import Any

import torch

from muonshard import _muonshard
from muonshard._errors import Error, FailedPreconditionError, from_status
from muonshard.torch import dcp_state, dtensor
from muonshard.torch.groups import check_group_options, no_decay_names, parse_groups, use_muon_of
from muonshard.torch.manifest import dtype_name

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_NAMES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}
# The one source of defaults: the C++ option structs' (worker::RankSessionOptions,
# worker::OptimizerConfig), the ones muonshard-worker's flags take too.
_DEFAULTS = _muonshard.session_defaults()


def _env_int(name):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


class Recovered(Exception):
    """Raised by `ShardedMuonAdamW.step()` and `save_checkpoint()` after the
    optimizer recovered from a broken group (a peer died, froze or reported an
    error; NOTE [Recovery] in worker/rank_session.h): it re-joined the job's
    new generation, waited for every rank (a killed one's replacement
    process included), restored the newest checkpoint of `checkpoint_dir`
    (or, with none, the parameters it was constructed with) and copied the
    restored values into the module's parameters, with zeroed gradients.

    The training loop rewinds to `step` and goes on:

        step = opt.start_step
        while step < total:
            try:
                train_one_step(step)           # forward, backward, opt.step(), ...
                step += 1
            except muonshard.torch.Recovered as r:
                step = r.step                  # the data position, LR schedule, ...

    Attributes: `step` (the restored state's step: steps done, 0 without a
    checkpoint), `restarts` / `max_restarts` (this process's recoveries so far
    and its limit), `times` (seconds: detect, abort, rendezvous, restore),
    `generation`, `rank`, `world_size`, `plan_version` (after the recovery:
    an elastic job's resize changes them), `cause` (the error that broke the
    step; also `__cause__`).
    """

    def __init__(self, step, restarts, max_restarts, times, generation, rank, world_size, cause, plan_version=0):
        super().__init__(
            "recovered (restart %d of %d) into generation %d from: %s; continue from step %d"
            % (restarts, max_restarts, generation, cause, step)
        )
        self.step = step
        self.restarts = restarts
        self.max_restarts = max_restarts
        self.times = times
        self.generation = generation
        self.rank = rank
        self.world_size = world_size
        self.plan_version = plan_version
        self.cause = cause


class _Part:
    """One tensor part this rank holds, and the parameter that is it."""

    def __init__(self, held, param):
        self.index = int(held["index"])
        self.name = held["name"]
        self.param = param
        # A DTensor parameter (FSDP2): the rank's shard is what the plan's
        # part is (NOTE [Sharded parameters]); its memory is FSDP2's, so it is
        # copied in and out, never aliased.
        self.sharded = dtensor.is_dtensor(param)
        self.element_begin = int(held["element_begin"])
        self.numel = int(held["element_end"]) - self.element_begin
        self.tensor_numel = int(held["local_numel"])  # the element space of the plan's ranges
        self.muon = held["optimizer"] == "MUON"
        self.aliased = False  # param.data views the optimizer's fused buffer
        # fp32 view of the part's gradient slot in the fused buffer, and
        # whether it is also the parameter's .grad (fp32 parameters).
        self.slot = None
        self.grad_is_slot = False
        self._zeros = None

    def local(self):
        """The parameter's values this rank holds: the tensor, or a DTensor's shard."""
        return dtensor.local_tensor(self.param)

    def values(self):
        """The parameter's current values as float32 numpy (for set_parameter)."""
        return self.local().detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous().numpy()

    def master_values(self, begin, end):
        """Elements [begin, end) of the tensor's element space, of an fp32
        parameter (its own master), as float32 numpy."""
        return self.values()[begin - self.element_begin : end - self.element_begin]

    def alias(self, storage):
        """Makes the parameter a view of the optimizer's model copy, and keeps a view
        of its gradient slot: no copies in or out of a step (NOTE [Part storage]).
        `storage` is the optimizer's (params, grads) as DLPack capsules, in its
        backend's memory: the host's, or the parameter's GPU. fp32 parameters get
        the slot as their .grad (backward accumulates into the fused buffer);
        others are converted into it by the step."""
        params, grads = (torch.utils.dlpack.from_dlpack(c) for c in storage)
        if params.dtype == self.param.dtype:
            self.param.data = params.view(self.param.shape)
            self.aliased = True
        if grads.dtype == torch.float32:
            self.slot = grads.view(self.param.shape)
            self.slot.copy_(self.param.grad if self.param.grad is not None else torch.zeros_like(self.slot))
            if self.param.dtype == torch.float32:
                self.param.grad = self.slot
                self.grad_is_slot = True

    def gradient(self):
        """This step's local gradient as a contiguous tensor on the parameter's
        device (None counts as zeros): the fused slot itself when backward wrote
        into it, else the gradient, which the step converts into the slot."""
        grad = dtensor.local_grad(self.param)
        if grad is None:
            if self.slot is not None:
                self.slot.zero_()
                if self.grad_is_slot:
                    self.param.grad = self.slot
                return self.slot
            if self._zeros is None:
                self._zeros = torch.zeros(self.numel, dtype=torch.float32, device=self.local().device)
            return self._zeros
        return grad.detach().reshape(-1).contiguous()

    def write_target(self):
        """Where the step's model copy goes in a parameter that does not view
        it: (the tensor to write, the one to copy it into afterwards or None)."""
        data = self.local().data
        if data.is_contiguous():
            return data, None
        return torch.empty(data.shape, dtype=data.dtype, device=data.device), data

    def zero_grad(self, set_to_none):
        if self.grad_is_slot:
            # The fused gradient buffer stays (Paddle's grad storage): zeroed.
            self.slot.zero_()
            self.param.grad = self.slot
        elif self.param.grad is not None:
            if set_to_none:
                self.param.grad = None
            else:
                self.param.grad.detach_()
                self.param.grad.zero_()

    def detach(self):
        """Gives an aliased parameter memory of its own again (the module outlives
        the optimizer's buffers)."""
        if self.aliased:
            self.param.data = self.param.data.clone()
            self.aliased = False
        if self.grad_is_slot:
            self.param.grad = self.slot.clone()
        self.slot = None
        self.grad_is_slot = False


def _device_of(named, backend):
    """The one device every parameter is on, as `backend` needs it: the CPU for
    gloo, one CUDA device for nccl (the optimizer's buffers, the step's kernels
    and NCCL's communicators are on it). ValueError naming a parameter
    elsewhere."""
    if not named:
        return torch.device("cpu")  # the plan check names what is missing
    first_name, first = named[0]
    device = first.device
    if backend == "gloo" and device.type != "cpu":
        raise ValueError("parameter %r is on %s: backend gloo needs CPU tensors" % (first_name, device))
    if backend == "nccl":
        if device.type != "cuda":
            raise ValueError(
                "parameter %r is on %s: backend nccl needs CUDA tensors (the model on cuda:LOCAL_RANK)"
                % (first_name, device)
            )
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    for name, param in named:
        if param.device != device:
            raise ValueError(
                "parameter %r is on %s but %r is on %s: every parameter of a rank must be on one device"
                % (name, param.device, first_name, device)
            )
    return device


def _address(tensor):
    """(address, dtype name, numel) of a contiguous tensor, as the extension's
    address entry points take it (in the backend's memory: this rank's GPU, or
    the host)."""
    return (tensor.data_ptr(), _DTYPE_NAMES[tensor.dtype], tensor.numel())


class ShardedMuonAdamW(torch.optim.Optimizer):
    """Muon for matrices and AdamW for the rest, sharded over the job's ranks by a
    muonshard plan: each Muon matrix is owned whole by one rank, AdamW state is
    split element-wise; gradients are reduced to their owners and the updated
    parameters broadcast / all-gathered back (Paddle's MuonShardingOptimizer,
    executed by the C++ step; this class only hands it tensors).

        opt = ShardedMuonAdamW(model, coordinator="host:50051", job="gpt", lr=0.02)
        loss.backward(); opt.step(); opt.zero_grad()

    Construction joins `job` at the coordinator (rank from torchrun's RANK when
    set, else one the coordinator assigns; LOCAL_RANK / LOCAL_WORLD_SIZE are
    used too), checks that the module holds exactly the plan's tensors of this
    rank (name, shape, dtype: ValueError naming the tensor), rendezvouses with
    the other ranks (Gloo over TCP, or NCCL) and sets the optimizer from the
    module's current values. Every rank must start from the same values
    (seed the model); with `sync_initial` (default) the owners' values are
    broadcast once so ranks agree even if they did not.

    Gradients: each parameter's `.grad` is this rank's local gradient; the step
    averages it over the ranks holding the tensor. A parameter whose `.grad` is
    None counts as a zero gradient. Parameters live inside the optimizer's
    fused buffers (`param.data` is a view of the model copy, as Paddle's
    parameters are views of its param storage), so the step writes them in
    place. float32 parameters' `.grad` is a view of the fused gradient buffer
    too (backward accumulates into it, and the step copies nothing); bf16/fp16
    gradients are converted into that buffer in one pass. A part that cannot be
    a view (a 3-D stack whose experts have several owners) is converted in and
    out.

    Devices: with `backend="gloo"` the parameters are CPU tensors; with
    `backend="nccl"` they are CUDA tensors on one device (`cuda:LOCAL_RANK`),
    the fused buffers, the fp32 masters and the optimizer state are on that
    device, Newton-Schulz runs as the project's CUDA kernels and the
    collectives on its NCCL communicators. The step is ordered after the work
    torch issued on its current CUDA stream (an event, no device-wide
    synchronisation) and returns with the parameters written; no tensor data
    crosses between host and device in a step (`host_copies` counts the
    copies: checkpoints and construction make them).
    After `step()` the gradients are unspecified: call `zero_grad()` (which
    keeps the fused gradient buffers and zeroes them; `set_to_none` applies only
    to gradients outside them).

    DTensor parameters (a module wrapped with FSDP2's `fully_shard`, HSDP, or
    DTensors on a 1-D mesh; NOTE [Sharded parameters] in
    muonshard/torch/dtensor.py): plan them with `manifest_from_module` and
    `topology_of`; each rank hands the step its shards (copied in and out:
    their memory is FSDP2's), each Muon matrix is gathered to one rank and
    the update scattered back, AdamW shards update in place, and
    `state_dict()` has the shape DCP saves and loads at any mesh size
    (NOTE [DCP state]). `overlap_backward` is refused there.

    `params`: a module, (name, parameter) pairs, or param groups of those
    (muonshard/torch/groups.py): a group's `use_muon` (as the plan must run
    it: build the manifest from the same groups) and `weight_decay` 0 are
    honoured; a group lr other than `lr`, another decay rate or any other key
    is refused with ValueError naming the group. Unknown keyword arguments
    are a TypeError, as for every torch optimizer.

    Hyper-parameters (Paddle Muon's defaults): one `lr` for Muon and AdamW
    (changed by torch.optim.lr_scheduler through `param_groups[i]["lr"]`,
    alike in every group; the next `step()` refuses groups whose rates
    parted, or any other option changed after construction),
    `weight_decay` (decoupled; `no_decay` names tensors without it),
    `muon_momentum` with `nesterov`, Newton-Schulz `ns_steps` /
    `ns_coefficients` / `ns_precision`, AdamW `betas` and `eps` (also the
    Newton-Schulz normalisation epsilon, as in Paddle).

    Checkpoints: `save_checkpoint(dir)` (default dir: `checkpoint_dir`) writes
    the project's sharded format (every rank its shard, rank 0 commits), which
    `load_checkpoint(dir)` loads under any plan and world size (reshard on
    load) and `muonshardctl ckpt inspect` reads. `state_dict()` / `load_state_dict()` hold this rank's state
    for this plan only.

    `hostname` is the address Gloo binds and advertises to the peers (default
    $MUONSHARD_HOSTNAME, else 127.0.0.1: set it, e.g. to the pod IP, when ranks
    run on several hosts). `metrics_port` serves /metrics on that port + the
    local rank (0: any free port; None: off), bound to `metrics_host` (default
    $MUONSHARD_METRICS_HOST, else 127.0.0.1; 0.0.0.0 for a scraper outside the
    pod). `device` is the process's identity on its host for the coordinator
    (default $MUONSHARD_DEVICE, else "cpu:<LOCAL_RANK>"): a new process with a
    known (host, device) is taken as that rank's restart.

    Overlap (NOTE [Pipelined step], [Gradient hand-off] in
    worker/optimizer/sharded_optimizer.h): the C++ step is pipelined on the CPU
    (`step_schedule` "auto" or "pipelined"; "sequential" for comparison): each
    bucket's Newton-Schulz overlaps the other buckets' collectives. With
    `backend="nccl"`, "auto" is sequential and "pipelined" runs the same order
    on CUDA streams ordered by events (NOTE [Stream-pipelined step]; tp = 1). Muon
    buckets are cut into pieces of at most `step_piece_kib` KiB of gradients
    for that (NOTE [Step pieces]; 0: the plan's buckets). The sequential step
    orthogonalises a rank's same-shape Muon matrices of all its buckets in
    batched calls of at most `muon_batch_mib` MiB of fp32 update (NOTE [Muon
    batches] in plan/ns_batches.h; 0: a bucket's at a time; a rank's own
    choice). With a plan whose
    topology gives `gpus_per_node` (ranks per machine), `collectives` "auto"
    reduces and broadcasts inside each node first and sends one copy between
    nodes (NOTE [Node-local collectives] in plan/node_grid.h); "flat" runs
    rings over all ranks. `backend`, `reduce_order`, `collectives`,
    `step_schedule`, `step_piece_kib` and the hyper-parameters
    (lr, betas, eps, weight_decay, the Muon and Newton-Schulz settings) must be
    the same on every rank: the constructor raises InvalidArgumentError naming
    the one that differs and a rank (NOTE [Step agreement]). With
    `overlap_backward`, a hook on every parameter hands its gradient to the
    step as soon as backward has accumulated it, so the reduce of the last
    layers' buckets runs while backward computes the first layers', and
    `step()` only hands over what is left and finishes. It needs exactly one
    backward pass per step (a second pass's gradient raises at `step()`); use
    the default for gradient accumulation or gradients set by hand.

    Step trace (NOTE [Step trace] in worker/optimizer/step_stats.h): with
    `step_trace_dir`, every step records when each bucket's reduce, update and
    sync ran and on which thread; the last `step_trace_steps` steps go to
    `<step_trace_dir>/step-trace-rank<R>.json` (Chrome trace events: open it in
    chrome://tracing or Perfetto) at `close()`, or whenever
    `write_step_trace()` is called.

    `blas_threads` (0: cores / LOCAL_WORLD_SIZE) sets OpenBLAS's thread count,
    which is process-wide: torch's CPU matmuls, on the same OpenBLAS, follow it.

    Every wait is bounded: joining by `join_timeout`, the rendezvous and each
    collective by `comm_timeout` (seconds). The methods are collectives where
    the C++ step is (step, save/load_checkpoint, load_state_dict, close).

    Recovery (`max_restarts` > 0; NOTE [Recovery] in worker/rank_session.h,
    what `muonshard-worker --max-restarts` does): when `step()` or
    `save_checkpoint()` fails because the group broke (ABORTED, UNAVAILABLE,
    DEADLINE_EXCEEDED: a peer died, froze or reported an error) and restarts
    remain, the optimizer reports the error to the coordinator (the job moves
    to a new generation at once), re-joins the new generation with this
    process's identity, waits up to `rejoin_grace` seconds (default
    `comm_timeout`) for every rank -- a killed rank's replacement process,
    started with the same command line, joins it -- re-creates the
    communicators and the optimizer, restores the newest checkpoint of
    `checkpoint_dir` (or, when it holds none or there is no `checkpoint_dir`,
    the parameters the optimizer was constructed with, synchronised as at
    construction), writes the restored parameters into the module, zeroes the
    gradients and raises `Recovered` with the step to continue from. A failed
    recovery of the same kind is tried again while restarts remain. Any
    other error, or one with no restarts left, is reported to the coordinator
    (the peers learn at once) and raised. Each recovery counts in /metrics
    (`muonshard_worker_restarts_total`, `muonshard_worker_recovery_seconds`).

    The parameters at construction are kept (a copy in their dtype, on this
    rank's device) while no checkpoint of `checkpoint_dir` is surely committed
    (until the second `save_checkpoint()` there returns, or one was loaded at
    construction), since every rank, survivors and replacements alike, must
    restore the same state. With `resume` (default: `max_restarts` > 0 and a
    `checkpoint_dir`) construction itself restores that way: the newest
    checkpoint of `checkpoint_dir`, else the module's values; `start_step` is
    the step it restored (0: none). A replacement process must restore
    exactly what the survivors restore, so `max_restarts` with a
    `checkpoint_dir` needs `resume`, and `checkpoint_dir` must belong to this
    run. The training loop's data must be a function of the step (rewinding
    repeats the same batches: the result equals an uninterrupted run's).

    Elastic jobs (`min_workers` > 0; NOTE [Elastic jobs] in coordinator.proto,
    what `muonshard-worker --min-workers` does; needs `max_restarts` and a
    `checkpoint_dir`): when ranks of a broken group stay away past the rejoin
    grace and at least `min_workers` are present, the coordinator plans the
    job again for those present (a new plan version) and the survivors go on
    under it with new ranks; a process that joins the shrunk job later (a
    restarted one, with its first command line: the `plan_version` the job
    started with is admitted) grows it back, up to the world it started with.
    The recovery then restores the newest checkpoint under the new plan, and
    `Recovered` carries the new `rank`, `world_size` and `plan_version`: the
    loop's data must follow them (a function of step, rank and world size),
    and a process's first ones are `opt.rank` / `opt.world_size` after
    construction: an elastic job's ranks are the coordinator's, so RANK and
    WORLD_SIZE are not used (an explicit `rank` still is). The module must
    still hold exactly this rank's tensors: with expert parallelism a new rank
    may hold other experts, and the recovery then raises ValueError naming
    the parameter (rebuild the module for the new rank).
    `restarts` counts this process's recoveries (and restarted joins),
    `last_recovery` holds the last one's step, generation and phase seconds.
    A recovery that fails leaves the optimizer without a group: its methods
    raise a muonshard error (FailedPreconditionError) and `close()` only
    leaves.
    """

    def __init__(
        self,
        params: Any,
        coordinator: str | None = None,
        job: str | None = None,
        plan_version: int = 0,
        lr: float = _DEFAULTS["lr"],
        betas: tuple[float, float] = (_DEFAULTS["adamw_beta1"], _DEFAULTS["adamw_beta2"]),
        eps: float = _DEFAULTS["eps"],
        weight_decay: float = _DEFAULTS["weight_decay"],
        muon_momentum: float = _DEFAULTS["muon_momentum"],
        nesterov: bool = _DEFAULTS["nesterov"],
        ns_steps: int = _DEFAULTS["ns_steps"],
        ns_coefficients: str = _DEFAULTS["ns_coefficients"],
        ns_precision: str = _DEFAULTS["ns_precision"],
        muon_scale_version: int = _DEFAULTS["muon_scale_version"],
        muon_extra_scale: float = _DEFAULTS["muon_extra_scale"],
        no_decay: Any = None,
        backend: str = _DEFAULTS["backend"],
        rank: int | None = None,
        reduce_order: str = _DEFAULTS["reduce_order"],
        collectives: str = _DEFAULTS["collectives"],
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        hostname: str | None = None,
        device: str | None = None,
        comm_timeout: float = _DEFAULTS["comm_timeout"],
        join_timeout: float = _DEFAULTS["join_timeout"],
        token_file: str | None = None,
        tls_ca: str | None = None,
        blas_threads: int = _DEFAULTS["blas_threads"],
        sync_initial: bool = True,
        alias_buffers: bool = True,
        checkpoint_dir: str | os.PathLike | None = None,
        resume: bool | None = None,
        max_restarts: int = _DEFAULTS["max_restarts"],
        rejoin_grace: float | None = None,
        overlap_backward: bool = False,
        step_schedule: str = _DEFAULTS["step_schedule"],
        step_piece_kib: int = _DEFAULTS["step_piece_kib"],
        muon_batch_mib: int = _DEFAULTS["muon_batch_mib"],
        step_trace_dir: str | os.PathLike | None = None,
        step_trace_steps: int = _DEFAULTS["step_trace_steps"],
        min_workers: int = _DEFAULTS["min_workers"],
    ) -> None:
        groups = parse_groups(params)
        named = [pair for g in groups for pair in g.named]
        check_group_options(groups, lr, weight_decay)
        if not job:
            raise ValueError("job is required: the name every rank of this training run joins")
        if backend not in ("gloo", "nccl"):
            raise ValueError("backend %r is not gloo or nccl" % (backend,))
        # A CPU model OpenBLAS does not know (many VMs) gets its slowest kernels (kernels/blas_core.h).
        blas_advice = _muonshard.blas_core_advice() if backend == "gloo" else ""
        if blas_advice:
            warnings.warn(blas_advice, RuntimeWarning, stacklevel=2)
        if int(max_restarts) < 0:
            raise ValueError("max_restarts must be >= 0")
        if int(min_workers) < 0:
            raise ValueError("min_workers must be >= 0 (0: the job never shrinks)")
        if int(min_workers) > 0 and (checkpoint_dir is None or int(max_restarts) == 0):
            raise ValueError(
                "min_workers needs max_restarts > 0 and a checkpoint_dir: a resized group restores "
                "the newest checkpoint under its new plan"
            )
        if rejoin_grace is not None and not float(rejoin_grace) > 0:
            raise ValueError("rejoin_grace must be > 0 seconds (None: comm_timeout)")
        checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        if resume is None:
            resume = int(max_restarts) > 0 and checkpoint_dir is not None
        if resume and checkpoint_dir is None:
            raise ValueError("resume needs checkpoint_dir (where to find the newest checkpoint)")
        if not resume and int(max_restarts) > 0 and checkpoint_dir is not None:
            raise ValueError(
                "max_restarts with a checkpoint_dir needs resume: a recovery restores the newest "
                "checkpoint there, and a rank's replacement process must start from the same one"
            )
        self._mesh = dtensor.mesh_of(named)  # NOTE [Sharded parameters]; ValueError for mixed ones
        self._fsdp_tp = dtensor.is_fsdp_tp(self._mesh, named)
        if self._mesh is not None and overlap_backward:
            raise ValueError(
                "overlap_backward with DTensor parameters: FSDP2 writes each .grad after its own "
                "reduce-scatter, outside autograd's accumulation, so there is no gradient to hand over "
                "early (FSDP2 overlaps that reduce-scatter with backward itself)"
            )
        self._by_name = {}
        for name, param in named:
            dtype_name(param.dtype)  # ValueError for unsupported dtypes
            self._by_name[name] = param
        self._device = _device_of(named, backend)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            muon_momentum=muon_momentum,
            nesterov=nesterov,
        )
        super().__init__([dict(g.options, params=[p for _, p in g.named]) for g in groups], defaults)
        self._group_names = [set(g.names) for g in groups]
        self._use_muon = use_muon_of(groups)
        # What the C++ step took at construction: everything but lr is fixed.
        self._fixed_options = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in self.param_groups]
        self._elastic = int(min_workers) > 0
        if rank is None and not self._elastic:  # an elastic job's ranks are the coordinator's
            rank = _env_int("RANK")
        self._parts = []
        self._session = None
        self._alias_buffers = bool(alias_buffers)
        self._sync_initial = bool(sync_initial)
        self._checkpoint_dir = checkpoint_dir
        self._max_restarts = int(max_restarts)
        self._restarts = 0  # the session's count, kept when it closes
        self._restore_error = None  # what the last recovery's restore raised
        self._reported = False  # an error went to the coordinator: the group is gone
        self._saves = 0  # save_checkpoint()s into checkpoint_dir that returned
        # What a recovery restores when checkpoint_dir holds no checkpoint (see
        # the class docstring); None once one is surely committed.
        self._initial = None
        if self._max_restarts > 0:
            self._initial = {name: dtensor.local_tensor(p).detach().clone() for name, p in named}
        self._lr = float(lr)
        # NOTE [Gradient hand-off]: backward hooks hand gradients over.
        self._overlap = bool(overlap_backward)
        self._step_open = False
        self._handed = {}
        self._hook_error = None
        self._hooks = []
        self.hooked_gradients = 0  # handed over by the hooks in the last step
        self._last_step_end = None
        self.last_step_stats = None
        self.last_recovery = None
        self._steps = torch.zeros((), dtype=torch.float32)  # steps done (self.state's "step")
        self._session = self._start_session(
            dict(
                coordinator=coordinator,
                token_file=token_file,
                tls_ca=tls_ca,
                job=job,
                plan_version=int(plan_version or 0),
                rank=rank,
                backend=backend,
                reduce_order=reduce_order,
                collectives=collectives,
                step_schedule=step_schedule,
                step_piece_kib=int(step_piece_kib),
                muon_batch_mib=int(muon_batch_mib),
                step_trace_dir=os.fspath(step_trace_dir) if step_trace_dir is not None else None,
                step_trace_steps=int(step_trace_steps),
                metrics_port=-1 if metrics_port is None else int(metrics_port),
                metrics_host=metrics_host or os.environ.get("MUONSHARD_METRICS_HOST") or "127.0.0.1",
                hostname=hostname or os.environ.get("MUONSHARD_HOSTNAME") or "127.0.0.1",
                device=device or os.environ.get("MUONSHARD_DEVICE"),
                local_rank=_env_int("LOCAL_RANK"),
                local_world_size=_env_int("LOCAL_WORLD_SIZE"),
                comm_timeout=float(comm_timeout),
                join_timeout=float(join_timeout),
                rejoin_grace=0.0 if rejoin_grace is None else float(rejoin_grace),
                min_workers=int(min_workers),
                blas_threads=int(blas_threads),
                **({"cuda_device": self._device.index} if self._device.type == "cuda" else {}),
                lr=float(lr),
                weight_decay=float(weight_decay),
                muon_momentum=float(muon_momentum),
                nesterov=bool(nesterov),
                adamw_beta1=float(betas[0]),
                adamw_beta2=float(betas[1]),
                eps=float(eps),
                ns_steps=int(ns_steps),
                ns_coefficients=ns_coefficients,
                ns_precision=ns_precision,
                muon_scale_version=int(muon_scale_version),
                muon_extra_scale=float(muon_extra_scale),
                no_decay=_no_decay(named, no_decay, groups),
                check_view=self._check_view,
            )
        )
        try:
            started = time.perf_counter()
            try:
                self.start_step = self._restore(use_checkpoint=bool(resume), recovering=False)
            except Exception as e:  # a broken group while restoring: recovered from like a step's
                self.start_step = self._recover(e, started)
        except BaseException:
            self._detach_parameters()
            self._session.close()
            self._session = None
            raise
        if self._overlap:
            self._install_hooks(named)
        # torch's optimizers keep per-parameter state in self.state, and
        # torch.distributed.checkpoint takes an empty one for "never stepped"
        # (and steps with lr 0 to create it): every parameter's "step" is here.
        for param in self._by_name.values():
            self.state[param] = {"step": self._steps}

    # ------------------------------------------------------------------ set-up

    def _install_hooks(self, named):
        """One post-accumulate-grad hook per parameter
        (Tensor.register_post_accumulate_grad_hook): it runs once backward
        has written the parameter's .grad, once per backward pass that
        reaches the parameter, and hands it over (_grad_ready)."""
        for name, param in named:
            if not param.requires_grad:
                continue
            handle = param.register_post_accumulate_grad_hook(lambda _param, name=name: self._grad_ready(name))
            self._hooks.append(handle)

    def _grad_ready(self, name):
        """Backward produced `name`'s gradient: hand it to the step now, so its
        bucket's reduce overlaps the rest of backward. Errors wait for step()."""
        if self._hook_error is not None or self._session is None:
            return
        try:
            part = next((p for p in self._parts if p.name == name), None)
            if part is None:
                return
            if part.index in self._handed:
                raise RuntimeError(
                    "overlap_backward: the gradient of %r arrived twice in one step; gradients are handed over "
                    "during the first backward pass, so accumulating several passes per step needs "
                    "overlap_backward=False" % name
                )
            if not self._step_open:
                self._session.check_health()
                self._session.begin_step()
                self._step_open = True
            self._hand_over(self._session, part)
        except Exception as e:  # raised by step(), which recovers from it like from its own errors
            self._hook_error = e

    def _start_session(self, kwargs):
        """RankSession (join, rendezvous, communicators, optimizer), started
        again while it fails because the group broke under it and restarts
        remain (RecoveryDriver::Start in worker/recovery_driver.h, as
        muonshard-worker does). A failed start has left the job already."""
        return _muonshard.RankSession(max_restarts=self._max_restarts, **kwargs)

    def _check_view(self, info, held):
        """On joining (and re-joining): the module must hold exactly this rank's tensors."""
        world = _env_int("WORLD_SIZE")
        if self._session is None and world is not None and world != info["world_size"] and not self._elastic:
            raise ValueError(
                "WORLD_SIZE is %d but plan version %d of job runs %d ranks"
                % (world, info["plan_version"], info["world_size"])
            )
        self._plan_tp = int(info["tp"])
        if self._mesh is not None:
            dtensor.check_rank(self._mesh, info["rank"])
        parts = []
        held_names = set()
        for h in held:
            name = h["name"]
            held_names.add(name)
            param = self._by_name.get(name)
            if param is None:
                raise ValueError(
                    "rank %d of plan version %d (model %s) holds tensor %r, which is not a parameter "
                    "of the module" % (info["rank"], info["plan_version"], info["model"], name)
                )
            if self._fsdp_tp:
                dtensor.check_tile_against_plan(name, param, h, self._mesh, info["tp_mesh"])
            elif self._mesh is not None:
                if len(info["tp_mesh"]) > 1:
                    raise ValueError(
                        "parameter %r is on a DeviceMesh %s that is no FSDP x TP mesh, but the plan's tp mesh is "
                        "%s (plan it with topology_of(module))" % (name, param.device_mesh, tuple(info["tp_mesh"]))
                    )
                dtensor.check_against_plan(name, param, h, info["tp"])
            else:
                _check_plain_shape(name, param, h, info)
            if _TORCH_DTYPES[h["dtype"]] != param.dtype:
                raise ValueError("parameter %r is %s; the plan's tensor is %s" % (name, param.dtype, h["dtype"]))
            if name in self._use_muon and self._use_muon[name] != (h["optimizer"] == "MUON"):
                raise ValueError(
                    "parameter %r is in a param group with use_muon=%s, but plan version %d steps it with "
                    "%s: build the manifest from the same param groups (manifest_from_module(groups, "
                    "...))" % (name, self._use_muon[name], info["plan_version"], h["optimizer"])
                )
            parts.append(_Part(h, param))
        for name in self._by_name:
            if name not in held_names:
                raise ValueError(
                    "parameter %r is not held by rank %d of plan version %d (model %s): it is not in "
                    "the plan's manifest, or (expert parallel) it is another rank's expert"
                    % (name, info["rank"], info["plan_version"], info["model"])
                )
        self._parts = parts

    def _restore(self, use_checkpoint, recovering):
        """Sets the optimizer's state on a fresh session (construction or a
        recovery; every rank does the same collectives): the newest checkpoint
        of checkpoint_dir when `use_checkpoint` and there is one, else the
        initial parameters (then synchronised as at construction). Then the
        parameters view (or get) the model copies. Returns the restored step."""
        loaded = None
        if use_checkpoint:
            loaded = self._session.load_latest_checkpoint(self._checkpoint_dir)
        if loaded is None:
            if recovering and self._initial is None:
                raise FailedPreconditionError(
                    "nothing to restore: %s holds no committed checkpoint and the optimizer no longer has its "
                    "initial parameters (a checkpoint was loaded or committed)" % (self._checkpoint_dir,)
                )
            for part in self._parts:
                if self._initial is not None:
                    part.local().data.copy_(self._initial[part.name])
                self._session.set_parameter(part.index, part.values())
            if self._sync_initial:
                self._session.sync_model_copies()
        else:
            self._initial = None  # a committed checkpoint exists from now on
        for part in self._parts:
            if recovering:
                part.param.grad = None  # not the broken step's: the fused slot starts at zero
            aliasing = self._alias_buffers and not part.sharded
            storage = self._session.part_storage(part.index) if aliasing else None
            if storage is not None:
                part.alias(storage)
        self._write_back(self._session)
        self._lr = float("nan")  # the next step applies param_groups' lr
        self._steps.fill_(float(self._session.steps_done))
        return 0 if loaded is None else int(loaded["step"])

    # ------------------------------------------------------------------ properties

    @property
    def rank(self):
        return self._session.rank

    @property
    def world_size(self):
        return self._session.world_size

    @property
    def generation(self):
        return self._session.generation

    @property
    def plan_version(self):
        return self._session.plan_version

    @property
    def content_hash(self):
        return self._session.content_hash

    @property
    def metrics_port(self):
        """The /metrics port of this rank, or -1 when not serving."""
        return self._session.metrics_port

    @property
    def steps_done(self):
        return self._session.steps_done

    @property
    def restarts(self):
        """Recoveries (and restarted starts) of this process so far."""
        return self._session.restarts if self._session is not None else self._restarts

    @property
    def host_copies(self):
        """Copies of tensor data between host memory and the optimizer's so far
        (on CUDA, transfers over the bus): a step makes none."""
        return self._live_session().host_copies

    @property
    def max_restarts(self):
        return self._max_restarts

    @property
    def checkpoint_dir(self):
        return self._checkpoint_dir

    @property
    def held_tensors(self):
        """The plan tensors this rank holds (dicts: index, name, shape, dtype, optimizer, ...)."""
        return self._session.held()

    def memory(self):
        """Bytes this rank allocated: optimizer_state (masters, momentum, moments),
        model_copy and gradients (fused buffers), and the plan's figure."""
        return self._session.memory()

    def describe(self):
        return self._session.describe()

    # ------------------------------------------------------------------ training

    @torch.no_grad()
    def step(self, closure=None):
        """One sharded step on every parameter's `.grad` (a collective).
        Raises `Recovered` after a recovery (see the class docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        session = self._live_session()
        started = time.perf_counter()
        try:
            train_seconds = started - self._last_step_end if self._last_step_end is not None else 0.0
            loss_value = float(loss) if isinstance(loss, (float, int, torch.Tensor)) else math.nan
            if self._overlap:
                self.last_step_stats = self._finish_handed_step(session, loss_value, train_seconds)
            else:
                session.check_health()  # the generation moved since the last step: recover before touching anything
                self._apply_lr()
                grads = {part.index: part.gradient() for part in self._parts}  # alive until the step returns
                addresses = {index: _address(grad) for index, grad in grads.items()}
                self.last_step_stats = session.step_addresses(addresses, loss_value, train_seconds, self._stream())
            self._write_back(session)
            self._steps.fill_(float(session.steps_done))
        except Exception as e:
            self._step_open = False
            self._handed = {}
            self._hook_error = None
            self._failed(e, started)
        self._last_step_end = time.perf_counter()
        return loss

    def _finish_handed_step(self, session, loss_value, train_seconds):
        """overlap_backward: hands over what the hooks did not (parameters
        without a gradient count as zeros) and finishes the step."""
        error, self._hook_error = self._hook_error, None
        if error is not None:
            raise error
        if not self._step_open:
            session.check_health()
            session.begin_step()
            self._step_open = True
        self._apply_lr()
        hooked = len(self._handed)
        for part in self._parts:
            if part.index not in self._handed:
                self._hand_over(session, part)
        self._step_open = False
        self.hooked_gradients = hooked
        try:
            return session.finish_step(loss_value, train_seconds)
        finally:
            self._handed = {}

    def _hand_over(self, session, part):
        """Hands `part`'s gradient to the open step, ordered after the work torch
        issued so far on its current stream (which produced the gradient). The
        gradient is kept until the step finishes: on a GPU the step may read it
        later."""
        grad = part.gradient()
        session.grad_ready_address(part.index, *_address(grad), stream=self._stream())
        self._handed[part.index] = grad

    def _apply_lr(self):
        self._check_group_changes(self.param_groups)
        lr = float(self.param_groups[0]["lr"])
        if lr != self._lr:
            self._session.set_lr(lr)
            self._lr = lr

    def _check_group_changes(self, groups):
        """ValueError naming a group option that changed since construction
        (only lr may: the C++ step took the rest, and every rank agreed on them),
        or a group whose lr left group 0's (one rate for every group)."""
        for i, (group, fixed) in enumerate(zip(groups, self._fixed_options, strict=True)):
            for key, value in fixed.items():
                if group.get(key) != value:
                    raise ValueError(
                        "param_groups[%d][%r] changed from %r to %r; only lr may change during training "
                        "(set the others at construction)" % (i, key, value, group.get(key))
                    )
            if float(group["lr"]) != float(groups[0]["lr"]):
                raise ValueError(
                    "param_groups[%d]['lr'] is %r but param_groups[0]['lr'] is %r; every group steps "
                    "with one learning rate" % (i, group["lr"], groups[0]["lr"])
                )

    def zero_grad(self, set_to_none=False):
        for part in self._parts:
            part.zero_grad(set_to_none)

    def add_param_group(self, param_group):
        if getattr(self, "_session", None) is not None:
            raise NotImplementedError("the plan fixes the parameters: ShardedMuonAdamW takes no new param groups")
        super().add_param_group(param_group)

    # ------------------------------------------------------------------ state

    def state_dict(self):
        """The torch optimizers' shape, which DCP saves and loads at any world
        or mesh size (NOTE [DCP state] in muonshard/torch/dcp_state.py):
        DTensors of each DTensor parameter's placements, or ShardedTensors of
        this rank's ranges over torch.distributed's default group (a
        collective then). Without an initialised torch.distributed (plain
        parameters), this rank's optimizer state for this plan: fp32 shards
        keyed "<tensor>/<kind>/<begin>:<end>", the scalars and param_groups."""
        state = self._live_session().state()
        if self._dcp_shape():
            return self._dcp_state_dict(state)
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        for g, names in zip(groups, self._group_names, strict=True):
            g["params"] = [p.index for p in self._parts if p.name in names]
        return {
            "state": {k: torch.from_numpy(v) for k, v in state["tensors"].items()},
            "param_groups": groups,
            "muonshard": {
                "format": 1,
                "content_hash": self.content_hash,
                "rank": self.rank,
                "world_size": self.world_size,
                "step": state["step"],
                "beta1_pow": state["beta1_pow"],
                "beta2_pow": state["beta2_pow"],
            },
        }

    def _dcp_shape(self):
        """Whether state_dict() has NOTE [DCP state]'s shape here; ValueError
        where it cannot say the plan's split."""
        if self._mesh is not None:
            if self._mesh.ndim > 1 and not self._fsdp_tp:
                raise ValueError(
                    "HSDP: the optimizer state is sharded over the replicas as well, which a DTensor of "
                    "the parameters' placements cannot say; use save_checkpoint / load_checkpoint "
                    "(which reshard to any mesh)"
                )
            return True
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return False
        if self._plan_tp > 1:
            raise ValueError(
                "a tensor-parallel plan of plain tensors: the tp ranks' copies of replicated tensors "
                "overlap, which DCP cannot save; use save_checkpoint / load_checkpoint"
            )
        group = (torch.distributed.get_rank(), torch.distributed.get_world_size())
        if group != (self.rank, self.world_size):
            raise ValueError(
                "torch.distributed's default group has this process as rank %d of %d but the plan as "
                "rank %d of %d: the optimizer state's shards are placed by the plan's ranks"
                % (group + (self.rank, self.world_size))
            )
        return True

    def _dcp_maps(self):
        """What NOTE [DCP state]'s conversions take: the parameters in
        param_groups order (their positions), {id(param): name} and
        {name: _Part}."""
        params = [p for g in self.param_groups for p in g["params"]]
        names = {id(p): n for n, p in self._by_name.items()}
        return params, names, {part.name: part for part in self._parts}

    def _dcp_state_dict(self, state):
        params, names, parts = self._dcp_maps()
        groups = []
        position = 0
        for g in self.param_groups:
            groups.append(
                dict(
                    {k: v for k, v in g.items() if k != "params"},
                    params=list(range(position, position + len(g["params"]))),
                )
            )
            position += len(g["params"])
        return {"state": dcp_state.build(state, params, names, parts, self.rank), "param_groups": groups}

    def _load_dcp_state_dict(self, state_dict):
        """load_state_dict of NOTE [DCP state]'s shape."""
        params, names, parts = self._dcp_maps()
        saved_groups = state_dict["param_groups"]
        self._merge_groups(saved_groups)
        state = dcp_state.by_name(state_dict["state"], params, names)
        session = self._live_session()
        tensors, step, beta1_pow, beta2_pow = dcp_state.session_tensors(state, session.state(), parts)
        session.load_state(tensors, step, beta1_pow, beta2_pow)
        self._initial = None  # the initial parameters are no longer this run's start
        self._update_groups(saved_groups)
        self._after_load()

    def _merge_groups(self, saved_groups):
        """ValueError unless saved param_groups can load: as many, and no option
        other than lr differs from this optimizer's."""
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                "state_dict has %d param group(s), this optimizer %d" % (len(saved_groups), len(self.param_groups))
            )
        merged = [
            dict(g, **{k: v for k, v in saved.items() if k != "params"})
            for g, saved in zip(self.param_groups, saved_groups, strict=True)
        ]
        self._check_group_changes(merged)

    def _update_groups(self, saved_groups):
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def load_state_dict(self, state_dict):
        """Restores a state_dict() (a collective: model copies are rebuilt and
        synchronised): NOTE [DCP state]'s shape, from any world or mesh size
        once DCP has loaded it (keyed by position, or by name as
        set_optimizer_state_dict passes it), or the per-rank format of the
        same rank and plan. With max_restarts, save a checkpoint into
        checkpoint_dir afterwards (see load_checkpoint)."""
        if "muonshard" not in state_dict:
            if not self._dcp_shape():
                raise ValueError(
                    "a state_dict of torch's shape (NOTE [DCP state]) loads where torch.distributed is "
                    "initialised (its default group the plan's ranks) or the parameters are DTensors"
                )
            return self._load_dcp_state_dict(state_dict)
        meta = state_dict.get("muonshard")
        if meta is None:
            raise ValueError('not a ShardedMuonAdamW state_dict (no "muonshard" entry)')
        if meta["content_hash"] != self.content_hash or meta["rank"] != self.rank:
            raise ValueError(
                "state_dict of rank %d of plan %s cannot load into rank %d of plan %s; use "
                "save_checkpoint/load_checkpoint to change plans"
                % (meta["rank"], meta["content_hash"][:19], self.rank, self.content_hash[:19])
            )
        saved_groups = state_dict["param_groups"]
        self._merge_groups(saved_groups)
        tensors = {k: v.detach().to(torch.float32).contiguous().numpy() for k, v in state_dict["state"].items()}
        self._live_session().load_state(tensors, int(meta["step"]), float(meta["beta1_pow"]), float(meta["beta2_pow"]))
        self._initial = None  # the initial parameters are no longer this run's start
        self._update_groups(saved_groups)
        self._after_load()

    def save_checkpoint(self, directory=None):
        """Saves every rank's state as checkpoint step `steps_done` of `directory`
        (default: checkpoint_dir; a collective; rank 0 commits). Raises
        `Recovered` after a recovery (see the class docstring)."""
        if directory is None:
            directory = self._checkpoint_dir
            if directory is None:
                raise ValueError("save_checkpoint: no directory and no checkpoint_dir")
        directory = os.fspath(directory)
        session = self._live_session()
        group = self.param_groups[0]
        started = time.perf_counter()
        try:
            session.save_checkpoint(
                directory,
                session.steps_done,
                float(group["lr"]),
                float(group["weight_decay"]),
                {"source": "muonshard.torch"},
            )
        except Exception as e:
            self._failed(e, started)
        if self._checkpoint_dir is not None and os.path.abspath(directory) == os.path.abspath(self._checkpoint_dir):
            # Rank 0 commits a save before it reaches the next save's barrier:
            # once a second one returned, the first is committed on every rank's
            # view, and a recovery always finds a checkpoint.
            self._saves += 1
            if self._saves >= 2:
                self._initial = None

    def load_checkpoint(self, directory, step=None):
        """Loads the latest (or `step`) checkpoint of `directory`, saved under any
        plan and world size of the same model, into the optimizer and the
        parameters; returns its step (a collective). With max_restarts, save a
        checkpoint into checkpoint_dir afterwards: a recovery restores only
        from there (or the initial parameters, which this load replaces)."""
        loaded = self._live_session().load_checkpoint(os.fspath(directory), step)
        self._initial = None  # the initial parameters are no longer this run's start
        self._after_load()
        return int(loaded["step"])

    def _after_load(self):
        self._lr = float("nan")  # the next step re-applies param_groups' lr
        self._steps.fill_(float(self._session.steps_done))
        self._write_back(self._session)

    def _write_back(self, session):
        """After a step or a load: the model copies into the parameters that do
        not view them, converted in the backend (on the GPU with nccl: no host
        copy)."""
        targets, later = {}, []
        for part in self._parts:
            if part.aliased:
                continue
            target, into = part.write_target()
            targets[part.index] = _address(target)
            if into is not None:
                later.append((target, into))
        if targets:
            session.copy_model_copies_to(targets)
        for target, into in later:
            into.copy_(target)

    def _stream(self):
        """The handle of torch's current CUDA stream on this rank's device (what
        the step orders itself after), or 0 on the CPU."""
        if self._device.type != "cuda":
            return 0
        return torch.cuda.current_stream(self._device).cuda_stream

    # ------------------------------------------------------------------ recovery

    def _live_session(self):
        if self._session is None:
            raise FailedPreconditionError("the optimizer is closed")
        return self._session

    def _failed(self, error, started):
        """`error` broke a step or save that began at `started`: raises Recovered
        after a recovery, else `error` (reported)."""
        step = self._recover(error, started)
        raise Recovered(
            step,
            self.restarts,
            self._max_restarts,
            self.last_recovery["times"],
            self.generation,
            self.rank,
            self.world_size,
            error,
            plan_version=self.plan_version,
        ) from error

    def _recover(self, error, started):
        """NOTE [Recovery]: the step to go on from, or raises the error to end
        with. The loop is the C++ one muonshard-worker runs
        (worker/recovery_driver.h): it reports `error` (the job moves to a new
        generation now, the peers learn why) and, while the error is a broken
        group's and restarts remain, re-joins and calls back here to restore
        (a restore that fails the same way is tried again)."""
        if self._session is None:
            raise error
        self._restore_error = None
        result = self._session.recover_from(
            _code_of(error),
            _describe(error),
            time.perf_counter() - started,
            self._detach_parameters,
            self._restore_after_recovery,
        )
        self._reported = True
        if "error" in result:
            raise self._ending_error(error, *result["error"])
        self._reported = False
        self._last_step_end = None
        self.last_recovery = {"step": result["step"], "generation": result["generation"], "times": result["times"]}
        return result["step"]

    def _restore_after_recovery(self):
        """recover_from's restore: the step, or (code, message) of its error
        (kept to be raised as itself if the rank ends with it)."""
        try:
            return self._restore(use_checkpoint=self._checkpoint_dir is not None, recovering=True)
        except Exception as e:
            self._restore_error = e
            return (_code_of(e), _describe(e))

    def _ending_error(self, error, code, message):
        """The exception for the error the rank ends with: the original one
        (`error`, or the restore's) when it is that, else the job's failure."""
        if (_code_of(error), _describe(error)) == (code, message):
            return error
        last = self._restore_error
        if last is not None and (_code_of(last), _describe(last)) == (code, message):
            last.__cause__ = error
            return last
        ending = from_status(code, message)
        ending.__cause__ = error
        return ending

    def _report(self, error):
        """Tells the coordinator (the job moves to a new generation now, the peers
        learn why; an error that is not a broken group's ends the job). Returns
        the error to end with if this rank gives up: the job's failure when
        another rank's error ended it first (NOTE [Job failure] in
        coordinator/job_registry.h), else `error`. A failed report is
        logged by the session, not raised."""
        if self._session is None:
            return error
        failure = self._session.report_error(_code_of(error), _describe(error))
        self._reported = True
        return error if failure is None else from_status(*failure)

    # ------------------------------------------------------------------ end

    def write_step_trace(self):
        """Writes the kept steps' trace (see `step_trace_dir`) and returns its
        path; None without a `step_trace_dir`."""
        return self._session.write_step_trace() if self._session is not None else None

    def close(self):
        """Writes the step trace (with `step_trace_dir`), meets every rank and
        leaves the job (a collective), then frees the session. Idempotent.
        After a reported error or a failed recovery it leaves at once (there is
        no group to meet)."""
        self._close(meet=True)

    def _close(self, meet):
        session = getattr(self, "_session", None)
        if session is None:
            return
        try:
            if meet:  # not while an error unwinds: it would hide that error
                session.write_step_trace()
            if meet and session.has_group and not self._reported:
                session.finish()
        finally:
            self._detach_parameters()
            self._restarts = session.restarts
            session.close()
            self._session = None

    def _detach_parameters(self):
        for part in self._parts:
            part.detach()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.close()
            return
        # Leaving with an exception: tell the coordinator (peers learn at
        # once), and do not wait for peers that will never meet this rank.
        if isinstance(exc, Exception) and not self._reported and self._session is not None:
            self._report(exc)
        self._close(meet=False)


# The status code a Python exception is reported with (NOTE [Job failure]:
# bad input ends the job, an unknown fault is INTERNAL and recovered from).
_PYTHON_CODES = (
    (ValueError, "INVALID_ARGUMENT"),
    (TypeError, "INVALID_ARGUMENT"),
    (LookupError, "NOT_FOUND"),
    (FileNotFoundError, "NOT_FOUND"),
    (PermissionError, "PERMISSION_DENIED"),
)


def _code_of(error):
    if isinstance(error, Error):
        return error.code
    return next((code for kind, code in _PYTHON_CODES if isinstance(error, kind)), "INTERNAL")


def _describe(error):
    """An exception as the message the coordinator relays."""
    if isinstance(error, Error):
        return error.message
    return "%s: %s" % (type(error).__name__, error)


def _check_plain_shape(name, param, held, info):
    """ValueError unless a plain tensor parameter is the plan part `held`: the
    whole tensor, or (expert parallel) this rank's experts of a 3-D stack."""
    if held["local_numel"] != held["numel"]:
        raise ValueError(
            "parameter %r is a plain tensor but plan version %d splits it %s over %d tensor-parallel "
            "ranks: hand the optimizer DTensor parameters (FSDP2's fully_shard) planned from the same "
            "module" % (name, info["plan_version"], held["tp_split"], info["tp"])
        )
    numel = int(held["element_end"]) - int(held["element_begin"])
    shape = tuple(int(d) for d in held["shape"])
    whole = numel == int(held["numel"])
    if whole and tuple(param.shape) != shape:
        raise ValueError("parameter %r has shape %s; the plan's tensor is %s" % (name, tuple(param.shape), shape))
    if not whole and (param.numel() != numel or tuple(param.shape[1:]) != shape[1:]):
        raise ValueError(
            "parameter %r has shape %s; rank %d holds experts [%d, %d) of the plan's %s (expert "
            "parallel: the module holds this rank's slice)"
            % (
                name,
                tuple(param.shape),
                info["rank"],
                int(held["element_begin"]) // _rest(shape),
                int(held["element_end"]) // _rest(shape),
                shape,
            )
        )


def _rest(shape):
    """Elements per expert of a 3-D stack's shape."""
    n = 1
    for d in shape[1:]:
        n *= int(d)
    return n


def _no_decay(named, no_decay, groups):
    """The names without weight decay: those `no_decay` matches and those of
    groups with weight_decay 0; None when neither names any."""
    names = set(no_decay_names(groups))
    if no_decay is not None:
        names.update(n for n, _ in named if _matches_name(no_decay, n))
    if no_decay is None and not names:
        return None
    return [n for n, _ in named if n in names]


def _matches_name(no_decay, name):
    if callable(no_decay):
        return bool(no_decay(name))
    return name in set(no_decay)
