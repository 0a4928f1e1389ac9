"""The optimizer state of DTensor parameters in the shape torch.distributed.checkpoint takes.

NOTE [DCP state]
With DTensor / FSDP2 parameters (NOTE [Sharded parameters]) every rank holds
the optimizer state of its shard of every parameter, laid out as the shard
is. So `state_dict()` is a torch optimizer's: `state[i]` for the i-th
parameter of `param_groups` holds
  "step"                  the steps done (a 0-d float32 tensor, as torch's
                          optimizers keep it),
  "momentum_buffer"       Muon matrices' momentum,
  "exp_avg", "exp_avg_sq" AdamW's two moments, with "beta1_pow" and
                          "beta2_pow" (0-d: the one pair of NOTE [Beta
                          powers], kept per parameter as Paddle does),
  "master"                the fp32 master of a bf16/fp16 parameter (an fp32
                          parameter is its own master),
every tensor a DTensor on the parameter's mesh with its placements (fp32).
Plain (replicated) parameters, whose state the plan splits into element
ranges of fused buckets (a Muon matrix's whole on its owner, AdamW ranges
that need not follow rows), get the same keys with each state a
ShardedTensor of the flattened tensor holding this rank's ranges (none on a
rank that owns nothing of it), over torch.distributed's default group,
whose ranks must be the plan's: DTensor cannot say uneven ranges (torch
marks ShardedTensor deprecated in its favour and warns). Without an
initialised torch.distributed they keep the per-rank format.
torch.distributed.checkpoint.state_dict's get_optimizer_state_dict /
set_optimizer_state_dict re-key it by parameter name, and DCP saves each
rank's shards and loads them into the shards of any other mesh size: a
checkpoint saved at W ranks loads at W'. `load_state_dict` takes the same
shape, keyed by parameter position or by name.
"""

import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard as TensorShard
from torch.distributed._shard.sharded_tensor import ShardedTensor, init_from_local_shards
from torch.distributed.tensor import DTensor

# The C++ state kinds (checkpoint/state.h) and torch's names for them.
TORCH_KEYS = {"momentum": "momentum_buffer", "moment1": "exp_avg", "moment2": "exp_avg_sq", "master": "master"}


def parse_key(key):
    """ "<tensor>/<kind>/<begin>:<end>" (RankSession.state()) as (tensor, kind, begin, end)."""
    name, kind, span = key.rsplit("/", 2)
    begin, end = span.split(":")
    return name, kind, int(begin), int(end)


def _shards_by_name(session_state):
    """{tensor: {kind: [(begin, end, float32 array)]}} of RankSession.state()."""
    shards = {}
    for key, values in session_state["tensors"].items():
        name, kind, begin, end = parse_key(key)
        shards.setdefault(name, {}).setdefault(kind, []).append((begin, end, values))
    return shards


def _dtensor_state(param, local_shape, ranges):
    ((_, _, values),) = ranges  # a DTensor part's state is its whole shard
    local = torch.from_numpy(values).view(local_shape)
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )


def _flat_state(numel, ranges, rank):
    """A ShardedTensor of a flattened tensor of `numel` elements with this
    rank's ranges (a collective over the default group)."""
    local = [
        TensorShard(torch.from_numpy(values), ShardMetadata([begin], [end - begin], "rank:%d/cpu" % rank))
        for begin, end, values in ranges
    ]
    if not local:
        # An empty shard, at the end (DCP dedups chunks by offset): DCP drops a
        # ShardedTensor without local shards from this rank's keys, and a key
        # missing on a rank makes its load take the checkpoint for a pre-2.4 one.
        local = [TensorShard(torch.zeros(0), ShardMetadata([numel], [0], "rank:%d/cpu" % rank))]
    return init_from_local_shards(local, numel)


def build(session_state, params, names, parts, rank):
    """The DCP-shaped "state" of this rank: {position: {key: tensor}}.
    `params` in param_groups order, `names` {id(param): name}, `parts`
    {name: _Part} (every parameter's: the plan part it is); `rank` the
    plan's, for the ShardedTensors of plain parameters (a collective on
    every rank then)."""
    shards = _shards_by_name(session_state)
    step = torch.tensor(float(session_state["step"]), dtype=torch.float32)
    state = {}
    for position, param in enumerate(params):
        name = names[id(param)]
        part = parts[name]
        entry = {"step": step.clone()}
        held = shards.get(name, {})
        kinds = ["momentum"] if part.muon else ["moment1", "moment2"]
        if param.dtype != torch.float32:
            kinds.append("master")  # an fp32 parameter is its own master
        for kind in kinds:
            if isinstance(param, DTensor):
                entry[TORCH_KEYS[kind]] = _dtensor_state(param, tuple(part.local().shape), held[kind])
            else:
                entry[TORCH_KEYS[kind]] = _flat_state(part.tensor_numel, held.get(kind, []), rank)
        if not part.muon:
            entry["beta1_pow"] = torch.tensor(float(session_state["beta1_pow"]), dtype=torch.float32)
            entry["beta2_pow"] = torch.tensor(float(session_state["beta2_pow"]), dtype=torch.float32)
        state[position] = entry
    return state


def _local_values(value, what, begin, end):
    """The [begin, end) state values of `value`: a DTensor's shard, a
    ShardedTensor's local shard at that range, or a tensor (all of it)."""
    if isinstance(value, DTensor):
        value = value.to_local()
    elif isinstance(value, ShardedTensor):
        found = [
            s.tensor
            for s in value.local_shards()
            if list(s.metadata.shard_offsets) == [begin] and list(s.metadata.shard_sizes) == [end - begin]
        ]
        if not found:
            raise ValueError("%s holds no shard [%d, %d) on this rank" % (what, begin, end))
        value = found[0]
    if not isinstance(value, torch.Tensor):
        raise TypeError("%s is a %s, not a tensor" % (what, type(value).__name__))
    return value.detach().to(torch.float32).reshape(-1).contiguous().numpy()


def by_name(state, params, names):
    """A DCP-shaped "state" (keyed by position or by parameter name) keyed by name."""
    out = {}
    for key, entry in state.items():
        if isinstance(key, int):
            if not 0 <= key < len(params):
                raise ValueError("state_dict has state for parameter %d; this optimizer has %d" % (key, len(params)))
            key = names[id(params[key])]
        out[key] = entry
    return out


def session_tensors(state, current, parts):
    """The RankSession.load_state arguments (tensors, step, beta1_pow,
    beta2_pow) from a by-name DCP-shaped state; `current` is
    RankSession.state() (which shards this rank holds). ValueError naming a
    parameter without its state."""
    tensors = {}
    step = None
    pows = None
    for key in current["tensors"]:
        name, kind, begin, end = parse_key(key)
        entry = state.get(name)
        if entry is None:
            raise ValueError("state_dict has no optimizer state for parameter %r" % name)
        if kind == "master" and TORCH_KEYS[kind] not in entry and parts[name].param.dtype == torch.float32:
            tensors[key] = parts[name].master_values(begin, end)  # an fp32 parameter is its own master
        elif TORCH_KEYS[kind] not in entry:
            raise ValueError("the optimizer state of parameter %r has no %r" % (name, TORCH_KEYS[kind]))
        else:
            tensors[key] = _local_values(
                entry[TORCH_KEYS[kind]], "state %r of %r" % (TORCH_KEYS[kind], name), begin, end
            )
        if "step" not in entry:
            raise ValueError("the optimizer state of parameter %r has no 'step'" % name)
        step = int(float(entry["step"]))
        if "beta1_pow" in entry:
            pows = (float(entry["beta1_pow"]), float(entry["beta2_pow"]))
    if pows is None:  # no AdamW tensor: the pair is unused
        pows = (float(current["beta1_pow"]), float(current["beta2_pow"]))
    return tensors, (current["step"] if step is None else step), pows[0], pows[1]
