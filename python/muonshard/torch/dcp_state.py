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
torch.distributed.checkpoint.state_dict's get_optimizer_state_dict /
set_optimizer_state_dict re-key it by parameter name, and DCP saves each
rank's shards and loads them into the shards of any other mesh size: a
checkpoint saved at W ranks loads at W'. `load_state_dict` takes the same
shape, keyed by parameter position or by name.
"""

import torch
from torch.distributed.tensor import DTensor

# The C++ state kinds (checkpoint/state.h) and torch's names for them.
TORCH_KEYS = {"momentum": "momentum_buffer", "moment1": "exp_avg", "moment2": "exp_avg_sq", "master": "master"}


def parse_key(key):
    """"<tensor>/<kind>/<begin>:<end>" (RankSession.state()) as (tensor, kind)."""
    name, kind, _ = key.rsplit("/", 2)
    return name, kind


def build(session_state, params, names, parts):
    """The DCP-shaped "state" of this rank: {position: {key: tensor}}.
    `params` in param_groups order, `names` {id(param): name}, `parts`
    {name: _Part}."""
    shards = {}
    for key, values in session_state["tensors"].items():
        name, kind = parse_key(key)
        shards.setdefault(name, {})[kind] = values
    step = torch.tensor(float(session_state["step"]), dtype=torch.float32)
    state = {}
    for position, param in enumerate(params):
        name = names[id(param)]
        entry = {"step": step.clone()}
        local_shape = tuple(parts[name].local().shape)
        for kind, values in shards.get(name, {}).items():
            if kind == "master" and param.dtype == torch.float32:
                continue  # the parameter itself
            local = torch.from_numpy(values).view(local_shape)
            entry[TORCH_KEYS[kind]] = DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                                                         shape=param.shape, stride=param.stride())
        if "moment1" in shards.get(name, {}):
            entry["beta1_pow"] = torch.tensor(float(session_state["beta1_pow"]), dtype=torch.float32)
            entry["beta2_pow"] = torch.tensor(float(session_state["beta2_pow"]), dtype=torch.float32)
        state[position] = entry
    return state


def _local_values(value, what):
    if isinstance(value, DTensor):
        value = value.to_local()
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
        name, kind = parse_key(key)
        entry = state.get(name)
        if entry is None:
            raise ValueError("state_dict has no optimizer state for parameter %r" % name)
        if kind == "master" and TORCH_KEYS[kind] not in entry and parts[name].param.dtype == torch.float32:
            tensors[key] = parts[name].values()  # an fp32 parameter is its own master
        elif TORCH_KEYS[kind] not in entry:
            raise ValueError("the optimizer state of parameter %r has no %r" % (name, TORCH_KEYS[kind]))
        else:
            tensors[key] = _local_values(entry[TORCH_KEYS[kind]], "state %r of %r" % (TORCH_KEYS[kind], name))
        if "step" not in entry:
            raise ValueError("the optimizer state of parameter %r has no 'step'" % name)
        step = int(float(entry["step"]))
        if "beta1_pow" in entry:
            pows = (float(entry["beta1_pow"]), float(entry["beta2_pow"]))
    if pows is None:  # no AdamW tensor: the pair is unused
        pows = (float(current["beta1_pow"]), float(current["beta2_pow"]))
    return tensors, (current["step"] if step is None else step), pows[0], pows[1]
