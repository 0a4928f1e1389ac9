"""Per-block Newton-Schulz end to end: a model with a fused QKV (GQA sizes)
and fused expert gate_up stacks (gpt-oss's alternating columns; gate | up
rows), planned with manifest_from_module(ns_blocks=...), stepped by W = 4
real rank processes (fused_rank.py, Gloo, a real coordinator) equals the
independent per-block reference (reference_optimizer.py, ns_blocks=...);
and a checkpoint of it reloads under another plan and world size."""

import os
import subprocess
import sys

import fused_rank
import pytest
import torch
from conftest import HERE, package_env
from reference_optimizer import ReferenceConfig, ReferenceOptimizer
from test_sharded_optimizer import assemble, assert_close

import muonshard

SEED = 11
TIMEOUT = 180


def run_ranks(coord, job, version, world, out, **flags):
    os.makedirs(out, exist_ok=True)
    procs = []
    for rank in range(world):
        env = package_env()
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        args = [sys.executable, os.path.join(HERE, "fused_rank.py"), "--coordinator", coord.address, "--job", job]
        args += ["--version", str(version), "--out", out, "--seed", str(SEED)]
        for k, v in flags.items():
            args += ["--" + k.replace("_", "-"), str(v)]
        log = open(os.path.join(out, "rank-%d.log" % rank), "wb")
        procs.append((subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failures = []
    for rank, (p, log) in enumerate(procs):
        try:
            code = p.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            code = "timeout"
        log.close()
        if code != 0:
            with open(os.path.join(out, "rank-%d.log" % rank)) as f:
                failures.append("rank %d exited %s:\n%s" % (rank, code, f.read()[-3000:]))
    assert not failures, "\n".join(failures)
    return [torch.load(os.path.join(out, "rank-%d.pt" % r)) for r in range(world)]


def submit(coord, world, policy):
    import muonshard.torch as mst

    manifest = mst.manifest_from_module(fused_rank.parameters(SEED), "fused", ns_blocks=fused_rank.NS_BLOCKS)
    client = muonshard.Coordinator(coord.address)
    return client, client.submit(manifest, world_size=world, policy=policy)


def reference(client, version, ns_blocks=fused_rank.NS_BLOCKS):
    kinds = {t["name"]: t["optimizer"].lower() for t in client.plan(version)["tensors"]}
    tensors = [(n, p.detach(), "OUT_IN") for n, p in fused_rank.parameters(SEED)]
    return ReferenceOptimizer(tensors, kinds, ReferenceConfig(), ns_blocks=ns_blocks)


def reference_steps(ref, world, steps):
    dtypes = {n: d for n, _, d in fused_rank.TENSORS}
    for step in steps:
        local = [
            {n: fused_rank.gradient(n, s, rank, step, SEED).to(dtypes[n]).float() for n, s, _ in fused_rank.TENSORS}
            for rank in range(world)
        ]
        ref.step(local)


def check(results, ref):
    masters = assemble(results, "master")
    assert set(masters) == set(ref.masters)
    for name, value in masters.items():
        assert_close(value, ref.masters[name], name + " master")
    for name, value in assemble(results, "momentum").items():
        assert_close(value, ref.momentum[name], name + " momentum", rtol=1e-4)
    for r in results:
        for name, value in r["params"].items():
            tol = 1e-5 if value.dtype == torch.float32 else 1e-2
            assert_close(value, ref.model_copy(name), "rank %d %s param" % (r["rank"], name), rtol=tol)


def test_block_indices_tile_the_axis():
    from reference_optimizer import block_indices

    assert [b.tolist() for b in block_indices({"axis": "cols", "stride": 2}, 6)] == [[0, 2, 4], [1, 3, 5]]
    per_head = block_indices({"axis": "rows", "sizes": [1, 2], "groups": 2}, 6)
    assert [b.tolist() for b in per_head] == [[0], [1, 2], [3], [4, 5]]
    with pytest.raises(ValueError):
        block_indices({"axis": "rows", "sizes": [4, 4]}, 9)


def test_w4_fused_model_matches_the_per_block_reference(coordinator, tmp_path):
    world, steps = 4, 3
    client, version = submit(coordinator, world, "balanced")
    plan = client.plan(version)
    blocked = {t["name"] for t in plan["tensors"] if t.get("ns_blocks")}
    assert blocked == set(fused_rank.NS_BLOCKS)
    results = run_ranks(coordinator, "fused-w4", version, world, str(tmp_path), steps=steps)
    ref = reference(client, version)
    reference_steps(ref, world, range(steps))
    check(results, ref)
    # Orthogonalising the fused matrices whole is another update: the run's
    # change of each fused master is not the whole-matrix reference's.
    whole = reference(client, version, ns_blocks=None)
    reference_steps(whole, world, range(steps))
    masters = assemble(results, "master")
    initial = {n: p.detach().float() for n, p in fused_rank.parameters(SEED)}
    for name in fused_rank.NS_BLOCKS:
        ran = masters[name] - initial[name].reshape(-1)
        assert_close(ran, ref.masters[name] - initial[name], name + " change", rtol=1e-3)
        with pytest.raises(AssertionError):
            assert_close(ran, whole.masters[name] - initial[name], name + " change vs whole-matrix NS", rtol=0.05)


def test_fused_checkpoint_reloads_under_another_plan(coordinator, tmp_path):
    client, v4 = submit(coordinator, 4, "seed")
    ckpt = str(tmp_path / "ckpt")
    run_ranks(coordinator, "fused-save", v4, 4, str(tmp_path / "a"), steps=2, save_dir=ckpt, save_at=2)
    _, v2 = submit(coordinator, 2, "balanced")
    results = run_ranks(coordinator, "fused-resume", v2, 2, str(tmp_path / "b"), steps=4, resume_dir=ckpt)
    ref = reference(client, v4)
    reference_steps(ref, 4, range(2))
    ref2 = ReferenceOptimizer.from_state_dict(
        [(n, p.detach(), "OUT_IN") for n, p in fused_rank.parameters(SEED)],
        ref.kinds,
        ref.state_dict(),
        ReferenceConfig(),
        ns_blocks=fused_rank.NS_BLOCKS,
    )
    reference_steps(ref2, 2, range(2, 4))
    check(results, ref2)
