"""The Python package against a real coordinator process on loopback: the
Coordinator client, manifests, errors, and ShardedMuonAdamW's bad-use cases
(each a clear exception, never a hang) and /metrics."""

import json
import re
import socket
import threading
import time
import urllib.request

import fixture_model
import pytest
import torch

import muonshard
import muonshard.torch as mst


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dense_params():
    return [(n, torch.nn.Parameter(v)) for n, v in fixture_model.full_tensors("dense", 3)]


# ------------------------------------------------------------------ errors


def test_errors_are_builtin_exceptions_with_codes():
    e = muonshard._errors.from_status("INVALID_ARGUMENT", "bad")
    assert isinstance(e, ValueError) and isinstance(e, muonshard.Error) and e.code == "INVALID_ARGUMENT"
    assert isinstance(muonshard._errors.from_status("NOT_FOUND", "x"), LookupError)
    assert isinstance(muonshard._errors.from_status("DEADLINE_EXCEEDED", "x"), TimeoutError)
    assert isinstance(muonshard._errors.from_status("UNAVAILABLE", "x"), ConnectionError)
    assert isinstance(muonshard._errors.from_status("UNAUTHENTICATED", "x"), PermissionError)
    assert isinstance(muonshard._errors.from_status("PERMISSION_DENIED", "x"), PermissionError)
    other = muonshard._errors.from_status("DATA_LOSS", "torn")
    assert isinstance(other, RuntimeError) and other.code == "DATA_LOSS" and str(other) == "torn"


# ------------------------------------------------------------------ Coordinator


def test_submit_plan_rank_view_and_workers(coordinator):
    c = muonshard.Coordinator(coordinator.address)
    assert c.health() == "SERVING"
    manifest = mst.manifest_from_module(dense_params(), "dense")
    version = c.submit(manifest, world_size=2, policy="balanced")
    assert c.submit(manifest, world_size=2, policy="balanced") == version  # identical request
    plan = c.plan(version)
    assert plan["model"] == "dense" and len(plan["tensors"]) == len(manifest["tensors"])
    view = c.rank_view(version, 1)
    assert view["rank"]["rank"] == 1
    with pytest.raises(LookupError, match="nobody"):
        c.workers("nobody")


def test_bad_requests_raise_value_error_naming_the_item(coordinator):
    c = muonshard.Coordinator(coordinator.address)
    manifest = {"model": "m", "tensors": [{"name": "w", "shape": [0, 4], "dtype": "FP32"}]}
    with pytest.raises(ValueError, match='"w"'):
        c.submit(manifest, world_size=2)
    with pytest.raises(ValueError, match="policy"):
        c.submit(manifest, world_size=2, policy="fastest")
    with pytest.raises(RuntimeError, match="no plan"):
        c.plan(0)  # nothing stored yet: FAILED_PRECONDITION
    c.submit(mst.manifest_from_module(dense_params(), "dense"), world_size=2)
    with pytest.raises(LookupError, match="999"):
        c.plan(999)


def test_unreachable_coordinator_fails_within_the_timeout():
    c = muonshard.Coordinator("127.0.0.1:%d" % free_port(), timeout=2)
    t0 = time.monotonic()
    with pytest.raises((ConnectionError, TimeoutError)):
        c.health()
    assert time.monotonic() - t0 < 20


def test_host_without_port_means_50051():
    assert muonshard.Coordinator("localhost").address == "localhost:50051"


# ------------------------------------------------------------------ manifests


def test_manifest_from_module_names_shapes_dtypes_and_experts():
    model = torch.nn.Sequential()
    model.add_module("proj", torch.nn.Linear(8, 4, bias=True))
    m = mst.manifest_from_module(
        model, "tiny", muon_exclude=["proj.bias"], expert_of=lambda n: 3 if "weight" in n else None
    )
    assert m["model"] == "tiny"
    assert [t["name"] for t in m["tensors"]] == ["proj.weight", "proj.bias"]
    assert m["tensors"][0]["shape"] == [4, 8] and m["tensors"][0]["dtype"] == "FP32"
    assert m["tensors"][0]["expert"] == 3 and "expert" not in m["tensors"][1]
    assert m["tensors"][1]["optimizer"] == "ADAMW"
    with pytest.raises(ValueError, match="float64"):
        mst.manifest_from_module([("x", torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)))], "bad")


def test_manifest_from_module_tensor_parallel_marks_megatrons_splits():
    class Layer(torch.nn.Module):
        def __init__(self, out_features, in_features):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(32, in_features)
            self.q_proj = torch.nn.Linear(in_features, out_features, bias=False)
            self.o_proj = torch.nn.Linear(out_features, in_features, bias=True)
            self.input_layernorm = torch.nn.LayerNorm(in_features)
            self.mixer = torch.nn.Linear(in_features, in_features, bias=False)

    whole = mst.manifest_from_module(Layer(16, 8), "tp", tp=2)
    splits = {t["name"]: t["tpSplit"] for t in whole["tensors"]}
    assert splits["embed_tokens.weight"] == "TP_COLUMN" and splits["q_proj.weight"] == "TP_COLUMN"
    assert splits["o_proj.weight"] == "TP_ROW" and splits["o_proj.bias"] == "TP_REPLICATED"
    assert splits["input_layernorm.weight"] == "TP_REPLICATED" and splits["mixer.weight"] == "TP_REPLICATED"
    assert [t["shape"] for t in whole["tensors"]][:3] == [[32, 8], [16, 8], [8, 16]]
    # A rank's shards (q_proj [16 / 2, 8], o_proj [8, 16 / 2]) give the whole shapes; tp_split decides too.
    shards = mst.manifest_from_module(
        Layer(8, 8), "tp", tp=2, shards=True, tp_split=lambda n: "row" if n == "mixer.weight" else None
    )
    by_name = {t["name"]: t for t in shards["tensors"]}
    assert by_name["q_proj.weight"]["shape"] == [16, 8] and by_name["o_proj.weight"]["shape"] == [8, 16]
    assert by_name["mixer.weight"]["tpSplit"] == "TP_ROW" and by_name["mixer.weight"]["shape"] == [8, 16]
    assert by_name["input_layernorm.weight"]["shape"] == [8]
    with pytest.raises(ValueError, match=r"embed_tokens\.weight.*not divisible by tp 3"):
        mst.manifest_from_module(Layer(16, 8), "tp", tp=3)
    with pytest.raises(ValueError, match=r"mixer\.weight.*diagonal"):
        mst.manifest_from_module(Layer(16, 8), "tp", tp=2, tp_split=lambda n: "diagonal" if "mixer" in n else None)


def test_plan_request_with_tensor_parallelism():
    from muonshard.coordinator import plan_request

    r = plan_request({"model": "m", "tensors": []}, 4, tp=2, tp_muon="duplicated")
    assert r["topology"]["tp"] == 2 and r["policy"]["tp_muon"] == "TP_MUON_DUPLICATED"
    assert "tp" not in plan_request({"model": "m", "tensors": []}, 4)["topology"]
    sharded = plan_request({"model": "m", "tensors": []}, 4, tp=2, tp_muon="sharded")
    assert sharded["policy"]["tp_muon"] == "TP_MUON_SHARDED"
    with pytest.raises(ValueError, match="blockwise"):
        plan_request({"model": "m", "tensors": []}, 4, tp=2, tp_muon="blockwise")


def test_plan_request_with_muon_reduce():
    from muonshard.coordinator import plan_request

    r = plan_request({"model": "m", "tensors": []}, 4, muon_reduce="scatter-rounds")
    assert r["policy"]["muon_reduce"] == "MUON_REDUCE_SCATTER_ROUNDS"
    assert "muon_reduce" not in plan_request({"model": "m", "tensors": []}, 4, muon_reduce="owner")["policy"]
    with pytest.raises(ValueError, match="'scatter' is not one of owner, scatter-rounds"):
        plan_request({"model": "m", "tensors": []}, 4, muon_reduce="scatter")


def test_plan_request_with_gpus_per_node():
    from muonshard.coordinator import plan_request

    assert plan_request({"model": "m", "tensors": []}, 8, gpus_per_node=4)["topology"]["gpus_per_node"] == 4
    assert "gpus_per_node" not in plan_request({"model": "m", "tensors": []}, 8)["topology"]
    with pytest.raises(ValueError, match="gpus_per_node must be >= 0"):
        plan_request({"model": "m", "tensors": []}, 8, gpus_per_node=-1)


def write_safetensors(path, header):
    """A safetensors file of `header` with a zero data section of the right size."""
    import struct

    body = json.dumps(header).encode()
    size = max([0] + [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"])
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body + b"\0" * size)


def test_manifest_from_safetensors_reads_the_headers_in_order(tmp_path):
    header = {
        "model.layers.0.mlp.experts.1.up_proj.weight": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [0, 16]},
        "model.embed_tokens.weight": {"dtype": "F32", "shape": [3, 2], "data_offsets": [16, 40]},
        "__metadata__": {"format": "pt"},
    }
    write_safetensors(tmp_path / "model.safetensors", header)
    m = muonshard.manifest_from_safetensors(tmp_path, name="tiny")
    assert m["model"] == "tiny"
    assert [t["name"] for t in m["tensors"]] == list(header)[:2]
    assert m["tensors"][0]["dtype"] == "BF16" and m["tensors"][0]["expert"] == 1
    assert [int(d) for d in m["tensors"][1]["shape"]] == [3, 2]
    with open(tmp_path / "bad.safetensors", "wb") as f:
        f.write(b"\xff" * 7)
    with pytest.raises(ValueError, match=re.escape("bad.safetensors")):
        muonshard.manifest_from_safetensors(tmp_path / "bad.safetensors")
    with pytest.raises(LookupError):
        muonshard.manifest_from_safetensors(tmp_path / "missing")


def test_manifest_from_hf_config(tmp_path):
    import os

    config = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "configs", "tiny-moe.config.json")
    m = muonshard.manifest_from_hf_config(config, name="tiny-moe")
    assert m["model"] == "tiny-moe" and len(m["tensors"]) == 135


# ------------------------------------------------------------------ ShardedMuonAdamW: bad use


def test_parameters_not_matching_the_plan_raise_value_error_naming_the_tensor(coordinator):
    c = muonshard.Coordinator(coordinator.address)
    params = dense_params()
    version = c.submit(mst.manifest_from_module(params, "dense"), world_size=1)
    renamed = [("model.embed.weight" if n == "model.embed_tokens.weight" else n, p) for n, p in params]
    with pytest.raises(ValueError, match=re.escape("model.embed_tokens.weight")):
        mst.ShardedMuonAdamW(renamed, coordinator=coordinator.address, job="j1", plan_version=version)
    reshaped = [(n, torch.nn.Parameter(torch.zeros(3, 3)) if n == "lm_head.weight" else p) for n, p in params]
    with pytest.raises(ValueError, match=re.escape("lm_head.weight")):
        mst.ShardedMuonAdamW(reshaped, coordinator=coordinator.address, job="j2", plan_version=version)
    retyped = [
        (n, torch.nn.Parameter(p.detach().double().float().half()) if n == "model.norm.weight" else p)
        for n, p in params
    ]
    with pytest.raises(ValueError, match=re.escape("model.norm.weight")):
        mst.ShardedMuonAdamW(retyped, coordinator=coordinator.address, job="j3", plan_version=version)
    # The backend needs its device: CPU tensors for gloo, CUDA ones for nccl.
    with pytest.raises(ValueError, match=re.escape("'model.embed_tokens.weight' is on cpu: backend nccl needs CUDA")):
        mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="j4", plan_version=version, backend="nccl")
    meta = [
        (n, torch.nn.Parameter(torch.empty(p.shape, device="meta")) if n == "lm_head.weight" else p) for n, p in params
    ]
    with pytest.raises(
        ValueError, match=re.escape("'lm_head.weight' is on meta but 'model.embed_tokens.weight' is on cpu")
    ):
        mst.ShardedMuonAdamW(meta, coordinator=coordinator.address, job="j4", plan_version=version)
    # Nothing was left joined: a correct module still joins these jobs as rank 0 of 1.
    opt = mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="j1", plan_version=version)
    assert opt.rank == 0 and opt.world_size == 1
    opt.close()


def test_missing_coordinator_raises_connection_error_without_hanging():
    t0 = time.monotonic()
    with pytest.raises((ConnectionError, TimeoutError)):
        mst.ShardedMuonAdamW(dense_params(), coordinator="127.0.0.1:%d" % free_port(), job="j", join_timeout=2)
    assert time.monotonic() - t0 < 30


def test_a_job_running_another_plan_version_is_refused(coordinator):
    """Rank 0 runs version A; a process asking for version B gets FAILED_PRECONDITION
    at once, and rank 0's wait for its missing peer ends at comm_timeout."""
    c = muonshard.Coordinator(coordinator.address)
    params = dense_params()
    manifest = mst.manifest_from_module(params, "dense")
    a = c.submit(manifest, world_size=2, policy="seed")
    b = c.submit(manifest, world_size=2, policy="balanced")
    outcome = {}

    def first():
        try:
            mst.ShardedMuonAdamW(
                dense_params(), coordinator=coordinator.address, job="vj", plan_version=a, rank=0, comm_timeout=4
            )
        except Exception as e:
            outcome["first"] = e

    t = threading.Thread(target=first)
    t.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if c.workers("vj"):
                break
        except LookupError:  # not joined yet
            time.sleep(0.05)
    with pytest.raises(muonshard.FailedPreconditionError, match="plan version"):
        mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="vj", plan_version=b, rank=1)
    t.join(60)
    assert not t.is_alive()
    assert isinstance(outcome.get("first"), (TimeoutError, muonshard.AbortedError)), outcome


# ------------------------------------------------------------------ one process end to end


def test_single_rank_step_metrics_and_state_dict_round_trip(coordinator, tmp_path):
    c = muonshard.Coordinator(coordinator.address)
    params = dense_params()
    version = c.submit(mst.manifest_from_module(params, "dense"), world_size=1)
    opt = mst.ShardedMuonAdamW(
        params, coordinator=coordinator.address, job="solo", plan_version=version, metrics_port=0
    )
    by_name = dict(params)
    q = by_name["model.layers.0.self_attn.q_proj.weight"]
    before = q.detach().clone()
    for p in by_name.values():
        p.grad = torch.ones_like(p)
    opt.step()
    assert not torch.equal(q.detach(), before)  # updated in place
    stats = opt.last_step_stats
    assert stats["total_seconds"] > 0 and set(stats) >= {"reduce_seconds", "muon_seconds", "adamw_seconds"}
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % opt.metrics_port, timeout=10).read().decode()
    assert 'muonshard_worker_steps_total{job="solo",rank="0"} 1' in body
    saved = opt.state_dict()
    snapshot = {n: p.detach().clone() for n, p in params}
    opt.zero_grad()
    for p in by_name.values():
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    opt.load_state_dict(saved)
    for n, p in params:
        assert torch.equal(p.detach(), snapshot[n]), n
    assert opt.state_dict()["muonshard"]["step"] == 1
    opt.save_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "latest").exists()
    # The project's sharded format: muonshardctl verifies it.
    import subprocess

    inspect = subprocess.run(
        [muonshard.find_binary("muonshardctl"), "ckpt", "inspect", str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inspect.returncode == 0, inspect.stderr
    assert "model        dense" in inspect.stdout and "step-1 (step 1)" in inspect.stdout
    opt.close()
    opt.close()  # idempotent
    assert json.loads(json.dumps(c.workers("solo")))  # the job is listed, its worker left


@pytest.mark.parametrize(
    "dtype,alias_buffers,overlap_backward",
    [
        (torch.float32, True, False),
        (torch.bfloat16, True, True),
        (torch.float32, False, False),
        (torch.bfloat16, False, True),
    ],
)
def test_steps_move_no_tensor_data_through_the_host(coordinator, dtype, alias_buffers, overlap_backward):
    """The step path is the device one on every backend (issue 34): gradients go
    to the step by address in the backend's memory, parameters are DLPack views
    of the fused buffers (or, not aliased, get the model copy converted in the
    backend), so a step makes no host copy -- here on the CPU backend, whose
    copies into and out of its memory count as they do over the bus on CUDA. The
    fp32 parameters' gradients are the fused slots themselves."""
    c = muonshard.Coordinator(coordinator.address)
    params = [(n, torch.nn.Parameter(p.detach().to(dtype))) for n, p in dense_params()]
    job = "copies-%s-%d-%d" % (str(dtype)[6:], alias_buffers, overlap_backward)
    version = c.submit(mst.manifest_from_module(params, "dense"), world_size=1)
    opt = mst.ShardedMuonAdamW(
        params,
        coordinator=coordinator.address,
        job=job,
        plan_version=version,
        alias_buffers=alias_buffers,
        overlap_backward=overlap_backward,
        blas_threads=1,
    )
    before = {n: p.detach().clone() for n, p in params}
    addresses = {n: p.data_ptr() for n, p in params}
    copies = opt.host_copies
    for _ in range(3):
        loss = sum((p.float() ** 2).sum() for _, p in params)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert opt.host_copies == copies
    for n, p in params:
        assert not torch.equal(p.detach(), before[n]), n
        assert p.data_ptr() == addresses[n], n  # written in place, aliased or not
    opt.close()


def test_pip_installs_the_built_tree_without_network(tmp_path):
    """The README's install: `pip install --no-build-isolation --no-index build/python`."""
    import os
    import subprocess
    import sys

    from conftest import PACKAGE_DIR

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            PACKAGE_DIR,
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run(
        [sys.executable, "-c", "import muonshard, muonshard.torch; print(muonshard.__file__)"],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    assert out.stdout.strip().startswith(str(target))


def test_pip_install_of_the_source_builds_with_cmake_for_this_interpreter(tmp_path):
    """`pip install ./python` (python/build_backend.py): CMake configures and
    builds the extension for the installing interpreter in
    $MUONSHARD_BUILD_DIR, here this test's own build (same interpreter, so
    nothing is rebuilt), and the wheel it packs installs and imports."""
    import os
    import re
    import subprocess
    import sys

    from conftest import PACKAGE_DIR, ROOT

    build = os.path.dirname(PACKAGE_DIR)
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        cached = re.search(r"^MUONSHARD_PYTHON:FILEPATH=(.*)$", f.read(), re.MULTILINE).group(1)
    assert os.path.realpath(cached) == os.path.realpath(sys.executable), "the build is for another interpreter"
    target = tmp_path / "site"
    env = dict(os.environ, MUONSHARD_BUILD_DIR=build)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            os.path.join(ROOT, "python"),
        ],
        timeout=600,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(target.glob("muonshard-*.dist-info/RECORD"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run(
        [sys.executable, "-c", "import muonshard, muonshard.torch; print(muonshard.__file__)"],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    assert out.stdout.strip().startswith(str(target))


def test_gradients_by_address_step_like_arrays(coordinator):
    """The extension's address entry point (a CUDA tensor's data_ptr() with backend
    nccl; host memory here): fp32 and bf16 gradients converted in the backend give
    the same parameters, bit for bit, as float32 arrays; bad addresses are refused."""
    from muonshard import _muonshard

    c = muonshard.Coordinator(coordinator.address)
    params = dense_params()
    version = c.submit(mst.manifest_from_module(params, "dense"), world_size=1)
    values = {n: p.detach() for n, p in params}
    sessions = []
    for job in ("arrays", "addresses"):
        s = _muonshard.RankSession(coordinator=coordinator.address, job=job, plan_version=version, blas_threads=1)
        for h in s.held():
            s.set_parameter(h["index"], values[h["name"]].reshape(-1).float().numpy())
        sessions.append(s)
    arrays, addresses = sessions
    held = arrays.held()
    g = torch.Generator().manual_seed(5)
    grads = {h["index"]: (torch.randn(h["shape"], generator=g) * 0.1).to(values[h["name"]].dtype) for h in held}
    arrays.step({i: t.reshape(-1).float().numpy() for i, t in grads.items()})
    addresses.step_addresses(
        {i: (t.data_ptr(), str(t.dtype).replace("torch.", ""), t.numel()) for i, t in grads.items()}
    )
    for h in held:
        a = torch.empty(h["element_end"] - h["element_begin"])
        b = torch.empty_like(a)
        arrays.read_model_copy(h["index"], a.numpy())
        addresses.read_model_copy(h["index"], b.numpy())
        assert torch.equal(a, b), h["name"]
    i, t = next(iter(grads.items()))
    with pytest.raises(ValueError, match="null address"):
        addresses.step_addresses({i: (0, "float32", t.numel())})
    with pytest.raises(ValueError, match="int8"):
        addresses.step_addresses({i: (t.data_ptr(), "int8", t.numel())})
    for s in sessions:
        s.finish()
        s.close()
