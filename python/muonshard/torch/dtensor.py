"""DTensor and FSDP2 parameters: how their mesh and placements map onto a plan.

NOTE [Sharded parameters]
A module wrapped with `fully_shard` (FSDP2), or whose parameters are
DTensors, holds on each rank only a shard of every parameter, and after
backward each rank's `.grad` is its shard of the gradient already averaged
over the mesh (FSDP2's reduce-scatter). From the optimizer's side that is
exactly the layout of tensor parallelism (NOTE [Tensor-parallel Muon] in
worker/optimizer/sharded_optimizer.h): rank t of the S ranks holds block t
of each split tensor. So a 1-D mesh of S ranks is planned as tp = S with
one model replica, each parameter's split taken from its placement:

  Shard(0) of a 1-D tensor, or of a 2-D [out, in] matrix   TP_COLUMN
  Shard(1) of a 2-D [out, in] matrix                      TP_ROW
  Replicate()                                             TP_REPLICATED
  Shard(0) of a 3-D expert stack [experts, rows, cols]    (not split: ep = S)

A 3-D expert stack sharded along its experts holds whole experts on each
rank, so it is planned with ep = S: the planner's expert parallelism gives
ep rank t exactly FSDP2's block t of the experts, and each rank
orthogonalises its own experts with no gather at all.

(HSDP, a 2-D mesh of R replicas x S shards whose parameters are Replicate()
over the replicas, is planned as R model replicas of tp = S, rank q * S + t
being replica q's shard t: the sharding groups then span the replicas, so
the optimizer state is sharded over the replicas too, where HSDP would
replicate it. Their reduce to each owner averages gradients FSDP2 has
already all-reduced over the replicas: redundant bytes, the same values. A
step that skips it is not built yet; FSDP2's set_requires_all_reduce(False)
is no way around it, as it keeps the gradients out of `.grad` until the
all-reduce runs.)
(FSDP x TP, torchtitan's 2-D mesh: init_device_mesh(.., (D, T),
mesh_dim_names=("dp_shard", "tp")), parallelize_module over mesh["tp"],
fully_shard over mesh["dp_shard"]. Parameters are DTensors on the 2-D mesh,
or on its dp_shard submesh (those tensor parallelism left whole: read as
Replicate() over tp), and every rank holds a different block of a TP
weight: (_StridedShard(0), Shard(0)) rows t * D + d of D * T for a colwise
one, (Shard(0), Shard(1)) a 2-D tile for a rowwise one, (Shard(0),
Replicate()) half the rows for the rest. So the whole mesh is the tp group:
one replica of tp = D * T with topology.tp_mesh = [D, T], each tensor split
per mesh dimension (TensorSpec.tp_mesh_split: Shard(0) TP_COLUMN, Shard(1)
of a matrix TP_ROW, Replicate() TP_REPLICATED), and the planner's one
definition of the tile rank k holds (NOTE [TP mesh tiles] in
plan/tp_mesh.h) is the block FSDP2 gives it: checked on every rank against
compute_local_shape_and_global_offset, a ValueError naming the parameter
where they differ. Newton-Schulz gathers each Muon matrix's tiles to its
owner (balanced by the planner), which assembles them in place (ranks
replicating a tile send it twice, equal), orthogonalises and scatters back;
AdamW tensors update their tiles where they are. muonshard's own
checkpoint format holds one split dimension per tensor and refuses such
plans (UNIMPLEMENTED); DCP's get/set_optimizer_state_dict work. Refused:
3-D tensors, Partial, per-block Newton-Schulz (ns_blocks) on tiled tensors.)
The step does what the plan says: AdamW updates each rank's shard
where it is (a group of one rank: no communication beyond FSDP2's own);
each Muon matrix is gathered to the one rank the planner chose for it
(balanced by Newton-Schulz FLOPs), orthogonalised there and the shards of
the result scattered back (2 collectives per bucket, never an all-gather of
everything), and each rank applies its shard of the update to its shard of
the parameter. The optimizer state of a split tensor lives with its shard,
so the coordinator's memory table is the FSDP job's.

What cannot be planned is refused with ValueError naming the parameter: a
placement other than those (Partial, a strided shard, Shard of another
dimension), a dimension the mesh does not divide (FSDP2 pads its last
shard; the plan's shards are even), a 3-D tensor sharded along another
dimension or not planned as an expert stack (the planner's name rule:
"experts." then a name), per-expert 2-D tensors ("experts.N.") beside such
stacks (ep would give them whole to one rank), stacks on an HSDP mesh,
DTensors on different meshes (other than a 2-D mesh and its submeshes) or
beside plain tensors, a mesh of more than 2 dimensions, or a parameter
whose mesh, split or block disagrees with the plan.
"""

from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard  # FSDP2 over TP's (not a Shard)

# The plan's TpSplit of each split name (manifest_from_module's tp_split too).
TP_SPLITS = {"column": "TP_COLUMN", "row": "TP_ROW", "replicated": "TP_REPLICATED"}


def is_dtensor(tensor):
    return isinstance(tensor, DTensor)


def local_tensor(param):
    """The rank's own part of a parameter: a DTensor's local shard (a view:
    writing it writes the parameter), else the tensor itself."""
    return param.to_local() if isinstance(param, DTensor) else param


def local_grad(param):
    """The rank's part of `param`'s gradient laid out as the parameter is (a
    DTensor gradient of another placement is redistributed first: a Partial
    one is reduced), or None."""
    grad = param.grad
    if grad is None or not isinstance(grad, DTensor):
        return grad
    if tuple(grad.placements) != tuple(param.placements):
        grad = grad.redistribute(device_mesh=param.device_mesh, placements=param.placements)
    return grad.to_local()


def _root(mesh):
    """The mesh `mesh` was sliced from (itself when it was not)."""
    root = mesh._get_root_mesh()
    return mesh if root is None else root


def placements_on(param, mesh):
    """A DTensor parameter's placements on `mesh`: its own, or, on a submesh
    of it (FSDP2's dp_shard submesh of an FSDP x TP mesh), its placement per
    named dimension and Replicate() on the others."""
    if param.device_mesh == mesh:
        return tuple(param.placements)
    by_name = dict(zip(param.device_mesh.mesh_dim_names, param.placements, strict=True))
    return tuple(by_name.get(dim, Replicate()) for dim in mesh.mesh_dim_names)


def mesh_of(named):
    """The DeviceMesh every parameter of `named` ((name, parameter) pairs) is
    on (the 2-D mesh when some are on its submeshes), None when none is a
    DTensor. ValueError naming a parameter that is not a DTensor beside ones
    that are, or is on another mesh, or on a mesh of more than 2 dimensions."""
    mesh = None
    first = None
    plain = None
    for name, param in named:
        if not isinstance(param, DTensor):
            plain = plain or name
            continue
        root = _root(param.device_mesh)
        if root != param.device_mesh and (root.mesh_dim_names is None or root.ndim != 2):
            raise ValueError(
                "parameter %r is on a submesh %s of a %d-D DeviceMesh: muonshard takes a submesh of a 2-D "
                "mesh with named dimensions only" % (name, param.device_mesh, root.ndim)
            )
        if mesh is None:
            mesh, first = root, name
        elif root != mesh:
            raise ValueError(
                "parameter %r is on DeviceMesh %s but %r is on %s: every DTensor parameter must be on "
                "one mesh" % (name, param.device_mesh, first, mesh)
            )
    if mesh is None:
        return None
    if plain is not None:
        raise ValueError(
            "parameter %r is a plain tensor but %r is a DTensor: shard every parameter (fully_shard the "
            "root module too) or none" % (plain, first)
        )
    if mesh.ndim > 2:
        raise ValueError(
            "parameter %r is on a %d-D DeviceMesh %s: muonshard plans DTensor parameters on a 1-D mesh "
            "(FSDP2), a 2-D (replicate, shard) one (HSDP) or (dp_shard, tp) one (FSDP x TP)"
            % (first, mesh.ndim, tuple(mesh.shape))
        )
    if mesh.ndim == 2 and not is_fsdp_tp(mesh, named):
        for name, param in named:
            if param.device_mesh != mesh:
                raise ValueError(
                    "parameter %r is on a submesh %s of an HSDP mesh: muonshard takes every HSDP parameter "
                    "on the 2-D mesh" % (name, param.device_mesh)
                )
    return mesh


def is_fsdp_tp(mesh, named):
    """Whether DTensor parameters `named` on mesh_of() `mesh` are FSDP x TP's:
    a 2-D mesh whose first dimension shards some parameter (HSDP's
    replicates every one)."""
    if mesh is None or mesh.ndim != 2:
        return False
    return any(not isinstance(placements_on(param, mesh)[0], Replicate) for _, param in named)


def mesh_splits(name, param, mesh):
    """The plan's TpSplit per dimension of an FSDP x TP `mesh` of a DTensor
    parameter (TensorSpec.tp_mesh_split; NOTE [Sharded parameters]):
    Shard(0) (strided or not) TP_COLUMN, Shard(1) of a matrix TP_ROW,
    Replicate() TP_REPLICATED. ValueError naming the parameter for another
    placement, a tensor of more than 2 dimensions, or a dimension its mesh
    ranks do not divide."""
    placements = placements_on(param, mesh)
    shape = tuple(param.shape)
    splits, ranks = [], [1] * len(shape)
    for m, placement in enumerate(placements):
        if isinstance(placement, Replicate):
            splits.append("TP_REPLICATED")
            continue
        if (
            not isinstance(placement, (Shard, _StridedShard))
            or placement.dim not in (0, 1)
            or placement.dim >= len(shape)
        ):
            raise ValueError(
                "parameter %r has placements %s on an FSDP x TP mesh: muonshard takes Shard(0), Shard(1) of a "
                "matrix (each possibly strided) or Replicate() per mesh dimension" % (name, placements)
            )
        if len(shape) > 2:
            raise ValueError(
                "parameter %r (shape %s) is a %d-D tensor sharded on an FSDP x TP mesh: muonshard tiles 1-D "
                "and 2-D tensors only there" % (name, shape, len(shape))
            )
        splits.append("TP_COLUMN" if placement.dim == 0 else "TP_ROW")
        ranks[placement.dim] *= mesh.size(m)
    for dim, n in enumerate(ranks):
        if shape[dim] % n:
            raise ValueError(
                "parameter %r: dim %d (%d) is not divisible by the %d mesh ranks that shard it; FSDP2 pads, "
                "muonshard's plan holds even tiles: pad the dimension to a multiple of %d"
                % (name, dim, shape[dim], n, n)
            )
    return splits


def shard_ranks(mesh):
    """Ranks of the mesh's sharding dimension (the last): the plan's tp."""
    return mesh.size(mesh.ndim - 1)


def topology(mesh, named):
    """The plan topology of DTensor parameters `named` on mesh_of() mesh: world
    size, tp (HSDP's replicas are the rest) and, with expert stacks sharded
    along their experts, ep."""
    if is_fsdp_tp(mesh, named):
        for name, param in named:
            mesh_splits(name, param, mesh)  # ValueError naming what cannot be tiled
        return {"world_size": mesh.size(), "tp": mesh.size(), "tp_mesh": [int(d) for d in mesh.shape]}
    out = {"world_size": mesh.size(), "tp": shard_ranks(mesh)}
    stacks = [name for name, param in named if is_expert_shard(param)]
    if stacks and shard_ranks(mesh) > 1:
        if mesh.ndim > 1:
            raise ValueError(
                "parameter %r: expert stacks sharded along their experts are planned on a 1-D mesh "
                "only, not HSDP's" % stacks[0]
            )
        out["ep"] = shard_ranks(mesh)
    return out


def is_expert_shard(param):
    """A 3-D DTensor sharded along dim 0: an expert stack's experts split over the mesh."""
    placement = param.placements[-1]
    return param.dim() == 3 and type(placement) is Shard and placement.dim == 0


def split_of(name, param):
    """The plan's split of a DTensor parameter ("column", "row" or
    "replicated"; see NOTE [Sharded parameters]); ValueError naming it for a
    placement the plan cannot hold or a dimension the mesh does not divide."""
    placement = param.placements[-1]
    ranks = shard_ranks(param.device_mesh)
    if isinstance(placement, Replicate):
        return "replicated"
    if type(placement) is not Shard:  # Partial, _StridedShard, ...
        raise ValueError(
            "parameter %r has placement %s: muonshard takes Shard(0), Shard(1) (2-D) or Replicate()" % (name, placement)
        )
    dim, shape = placement.dim, tuple(param.shape)
    if len(shape) > 2 and (len(shape) > 3 or dim != 0):
        raise ValueError(
            "parameter %r (shape %s) is sharded along dim %d: muonshard splits a 3-D tensor (an expert "
            "stack) along its experts (dim 0) only" % (name, shape, dim)
        )
    if len(shape) == 3:
        if shape[0] % ranks:
            raise ValueError(
                "parameter %r: its %d experts are not divisible by the mesh's %d ranks (each rank must "
                "hold whole experts)" % (name, shape[0], ranks)
            )
        return "experts"
    if dim not in (0, 1) or dim >= len(shape):
        raise ValueError(
            "parameter %r (shape %s) has placement Shard(%d): muonshard takes Shard(0), or Shard(1) of "
            "a 2-D matrix" % (name, shape, dim)
        )
    if shape[dim] % ranks:
        raise ValueError(
            "parameter %r: dim %d (%d) is not divisible by the mesh's %d ranks; FSDP2 pads its last "
            "shard, muonshard's plan holds even shards: pad the dimension to a multiple of %d"
            % (name, dim, shape[dim], ranks, ranks)
        )
    return "column" if dim == 0 else "row"


def plan_split(name, param):
    """split_of as the plan's TpSplit name (TP_COLUMN, TP_ROW, TP_REPLICATED; an
    expert stack is not TP-split), or None for the planner's rule (stacks)."""
    return TP_SPLITS.get(split_of(name, param))


def check_against_plan(name, param, held, tp):
    """ValueError naming `param` when its mesh or placement disagrees with the
    plan part `held` (a dict of RankSession.held()) of a plan with `tp`."""
    ranks = shard_ranks(param.device_mesh)
    if ranks != tp:
        raise ValueError(
            "parameter %r is sharded over a mesh of %d ranks but the plan's tensor-parallel degree is %d "
            "(plan a DTensor model with tp = the mesh size: topology_of(module))" % (name, ranks, tp)
        )
    if ranks > 1 and is_expert_shard(param):
        _check_experts(name, param, held)
        return
    split = plan_split(name, param) if ranks > 1 else "TP_REPLICATED"  # one rank holds it whole anyway
    planned = held["tp_split"] if held["tp_split"] != "TP_SPLIT_UNSPECIFIED" else "TP_REPLICATED"
    if split != planned:
        raise ValueError(
            "parameter %r has placement %s (%s) but the plan splits it %s: build the manifest from the "
            "sharded module (manifest_from_module)" % (name, param.placements[-1], split, planned)
        )
    local = tuple(param.to_local().shape)
    if local != tuple(int(d) for d in held["local_shape"]):
        raise ValueError(
            "parameter %r: this rank's shard is %s but the plan's is %s" % (name, local, tuple(held["local_shape"]))
        )


def check_tile_against_plan(name, param, held, mesh, tp_mesh):
    """ValueError naming `param` (on FSDP x TP `mesh`) when the plan's tp mesh
    is not the mesh's shape, or the block this rank holds (its global offset
    and local shape, as DTensor computes them) is not the plan's tile for it
    (held: a dict of RankSession.held())."""
    if tuple(tp_mesh) != tuple(mesh.shape):
        raise ValueError(
            "parameter %r is on an FSDP x TP DeviceMesh of shape %s but the plan's tp mesh is %s (plan it with "
            "topology_of(module))" % (name, tuple(mesh.shape), tuple(tp_mesh))
        )
    local, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    planned_shape = tuple(int(d) for d in held["local_shape"])
    planned_offset = tuple(int(d) for d in held.get("tile_offset", (0,) * len(planned_shape)))
    real = (tuple(offset), tuple(local))
    if real != (planned_offset, planned_shape) or tuple(param.to_local().shape) != planned_shape:
        raise ValueError(
            "parameter %r (placements %s): this rank holds the block at %s of shape %s, but the plan's tile for "
            "it is at %s of shape %s: build the manifest from the sharded module (manifest_from_module)"
            % (name, tuple(param.placements), real[0], real[1], planned_offset, planned_shape)
        )


def _check_experts(name, param, held):
    """ValueError unless the plan gives this rank FSDP2's block of the stack's experts."""
    local = param.to_local()
    mesh = param.device_mesh
    begin = mesh.get_local_rank(mesh.ndim - 1) * local.numel()
    if (int(held["element_begin"]), int(held["element_end"])) != (begin, begin + local.numel()):
        raise ValueError(
            "parameter %r: this rank holds experts [%d, %d) of %d but the plan gives it elements "
            '[%d, %d): plan it as an expert stack (named "...experts.<name>") with ep = the mesh size '
            "(topology_of(module))"
            % (
                name,
                begin // local[0].numel(),
                begin // local[0].numel() + local.shape[0],
                param.shape[0],
                int(held["element_begin"]),
                int(held["element_end"]),
            )
        )


def check_rank(mesh, rank):
    """ValueError when plan rank `rank` is not this process's coordinate on `mesh`."""
    coordinate = tuple(mesh.get_coordinate())
    expected = (rank,) if mesh.ndim == 1 else divmod(rank, shard_ranks(mesh))
    if coordinate != expected:
        raise ValueError(
            "this process is rank %d of the plan, which is coordinate %s of the parameters' DeviceMesh, "
            "but it is at %s: start the ranks so that both agree (RANK = the mesh's rank)"
            % (rank, expected, coordinate)
        )
