"""muonshard for PyTorch training programs.

* `ShardedMuonAdamW`: a `torch.optim.Optimizer` running muonshard's sharded
  Muon + AdamW step (the C++ step: plan view, communicators, kernels,
  checkpoints) on a module's parameters; with `max_restarts` it recovers
  from a broken group by itself and raises `Recovered` (the step to go on
  from) for the training loop to rewind.
* `manifest_from_module`: the manifest of a live `nn.Module`, to submit as a
  plan; `topology_of`: the world size and tp a DTensor / FSDP2 module's plan
  needs (NOTE [Sharded parameters] in muonshard/torch/dtensor.py).
"""

from muonshard.torch.manifest import manifest_from_module, topology_of
from muonshard.torch.optimizer import Recovered, ShardedMuonAdamW

__all__ = ["Recovered", "ShardedMuonAdamW", "manifest_from_module", "topology_of"]
