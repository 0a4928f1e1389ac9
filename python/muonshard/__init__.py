"""muonshard: optimizer sharding for Muon + AdamW training, as a service.

The package is the Python face of the C++ core (the `_muonshard` extension):

* `Coordinator`: a client of `muonshard-coordinator` (submit plans, read plans
  and rank views, list a job's workers): the RPCs `muonshardctl` uses.
* `LocalCoordinator`: a coordinator process on loopback with a throw-away
  store, for local runs, examples and tests.
* `manifest_from_safetensors`, `manifest_from_hf_config`: manifests of real
  checkpoints and configs, without loading weights.
* `muonshard.torch`: `ShardedMuonAdamW`, a torch optimizer that runs the
  sharded C++ step, and `manifest_from_module`.

Errors are `muonshard.Error` subclasses that are also the matching built-in
exception (ValueError, LookupError, TimeoutError, ConnectionError,
PermissionError, RuntimeError); see `muonshard._errors`.
"""

from muonshard._errors import (
    AbortedError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    StatusError,
    UnauthenticatedError,
    UnavailableError,
)
from muonshard.coordinator import Coordinator, LocalCoordinator, find_binary
from muonshard.manifests import manifest_from_hf_config, manifest_from_safetensors

try:
    from muonshard._build_info import VERSION as __version__
except ImportError:  # a source tree without a build
    __version__ = "0.0.0"

__all__ = [
    "AbortedError",
    "Coordinator",
    "DeadlineExceededError",
    "Error",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "LocalCoordinator",
    "NotFoundError",
    "PermissionDeniedError",
    "StatusError",
    "UnauthenticatedError",
    "UnavailableError",
    "find_binary",
    "manifest_from_hf_config",
    "manifest_from_safetensors",
]
