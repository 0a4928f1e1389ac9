"""One source of defaults (python/src/session_options.h): the C++ option
structs' defaults are what muonshard-worker's flags show, what
_muonshard.session_defaults() gives, and what ShardedMuonAdamW's keyword
arguments default to; and nothing a caller passes to a RankSession is
ignored."""

import inspect
import re
import subprocess

import pytest

import muonshard
import muonshard.torch as mst
from muonshard import _muonshard

# muonshard-worker flag -> the RankSession keyword it sets.
SHARED_FLAGS = {
    "lr": "lr",
    "weight-decay": "weight_decay",
    "backend": "backend",
    "reduce-order": "reduce_order",
    "step-schedule": "step_schedule",
    "step-piece-kib": "step_piece_kib",
    "step-trace-steps": "step_trace_steps",
    "comm-timeout": "comm_timeout",
    "join-timeout": "join_timeout",
    "rejoin-grace": "rejoin_grace",
    "max-restarts": "max_restarts",
    "min-workers": "min_workers",
    "blas-threads": "blas_threads",
    "ns-precision": "ns_precision",
}


def worker_flag_defaults():
    """{flag: default text} from `muonshard-worker --help`."""
    p = subprocess.run(
        [muonshard.coordinator.find_binary("muonshard-worker"), "--help"], capture_output=True, text=True, timeout=60
    )
    text = p.stdout + p.stderr
    defaults = {}
    # "  --lr VALUE\n      learning rate (Muon and AdamW) (default: 0.02)"
    for match in re.finditer(r"^  --([a-z0-9-]+)[^\n]*\n[^\n]*\(default: ([^)]*)\)$", text, re.M):
        defaults.setdefault(match.group(1), match.group(2).strip('"'))
    # "  --step-piece-kib VALUE\n      ...; 0 (default): the plan's buckets"
    for match in re.finditer(r"^  --([a-z0-9-]+)[^\n]*\n[^\n]*?(\S+) \(default\)", text, re.M):
        defaults.setdefault(match.group(1), match.group(2))
    return defaults


def test_the_optimizer_keywords_default_to_the_cpp_structs():
    defaults = _muonshard.session_defaults()
    signature = inspect.signature(mst.ShardedMuonAdamW.__init__).parameters
    # None means "not given": the session then keeps the C++ default (or the environment's).
    shared = [name for name in signature if name in defaults and signature[name].default is not None]
    assert len(shared) >= 18, shared
    for name in shared:
        assert signature[name].default == defaults[name], name
    assert signature["betas"].default == (defaults["adamw_beta1"], defaults["adamw_beta2"])
    # The float32 defaults read as the decimals they were written as.
    assert (defaults["lr"], defaults["weight_decay"], defaults["eps"]) == (0.02, 0.01, 1e-9)


def test_the_worker_flags_show_the_same_defaults():
    defaults = _muonshard.session_defaults()
    shown = worker_flag_defaults()
    missing = [flag for flag in SHARED_FLAGS if flag not in shown]
    assert not missing, "muonshard-worker --help shows no default for %s" % missing
    for flag, keyword in SHARED_FLAGS.items():
        value = defaults[keyword]
        if isinstance(value, str):
            assert shown[flag] == value, flag
        else:
            assert float(shown[flag]) == pytest.approx(float(value), rel=1e-6), flag


def test_unknown_or_mistyped_session_keywords_raise_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'comm_timout'"):
        _muonshard.RankSession(job="j", comm_timout=5.0)
    with pytest.raises(TypeError, match="comm_timeout has the wrong type"):
        _muonshard.RankSession(job="j", comm_timeout="soon")
    with pytest.raises(ValueError, match='ns_precision "fp8" is not default, fp32 or bf16'):
        _muonshard.RankSession(job="j", ns_precision="fp8")
    with pytest.raises(TypeError):
        mst.ShardedMuonAdamW([], job="j", comm_timout=5.0)
