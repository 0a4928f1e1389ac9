"""One source of defaults (python/src/session_options.h): the C++ option
structs' defaults are what muonshard-worker's flags show, what
_muonshard.session_defaults() gives, and what ShardedMuonAdamW's keyword
arguments default to; and nothing a caller passes to a RankSession is
ignored."""

import inspect
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

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
    "muon-batch-mib": "muon_batch_mib",
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


def test_openblas_kernels_slower_than_the_cpu_allows_warn_at_construction():
    """kernels/blas_core.h: OpenBLAS takes its generic kernels on a CPU model it does not know (many VMs
    report one); ShardedMuonAdamW (gloo) warns with the OPENBLAS_CORETYPE to start with, exactly when the
    C++ check finds it so (on the development VM of 2026-12-06: Prescott kernels on an AVX-512 CPU)."""
    core = _muonshard.openblas_core()
    assert core
    advice = _muonshard.blas_core_advice()
    if advice:
        assert core in advice and "OPENBLAS_CORETYPE=" in advice
    model = torch.nn.Linear(4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="max_restarts"):
            mst.ShardedMuonAdamW(model.named_parameters(), job="j", max_restarts=-1)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert said == ([advice] if advice else [])


def test_openblas_coretype_set_by_the_user_silences_the_advice():
    env = dict(os.environ, OPENBLAS_CORETYPE="Prescott", PYTHONPATH=os.pathsep.join(sys.path))
    code = "from muonshard import _muonshard as m; print(m.openblas_core()); print(repr(m.blas_core_advice()))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["Prescott", "''"]
