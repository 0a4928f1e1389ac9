"""ShardedMuonAdamW in 1-4 real processes (Gloo over TCP, a real coordinator on
loopback) against the independent pure-torch reference (reference_optimizer.py):
dense and MoE (per-expert and stacked, ep 2), policies seed and balanced,
resume under another plan and world size, an LR scheduler. Each rank is a
separate process (this interpreter, sys.executable) running sharded_rank.py, as torchrun would
start it (RANK, WORLD_SIZE, LOCAL_RANK set)."""

import contextlib
import json
import os
import subprocess
import sys

import fixture_model
import pytest
import torch
from conftest import HERE, package_env
from reference_optimizer import ReferenceConfig, ReferenceOptimizer, paddle_ep_holders
from sharded_rank import lr_lambda

import muonshard

SEED = 7
TIMEOUT = 180  # seconds for a whole multi-process run (every wait inside is bounded too)


def start_ranks(coord, job, version, world, out, per_rank=None, env_of=None, **flags):
    """Starts `world` rank processes of sharded_rank.py: (process, log) per rank.
    per_rank(rank) -> extra flags of that rank; env_of(rank) -> extra environment."""
    os.makedirs(out, exist_ok=True)
    procs = []
    for rank in range(world):
        env = package_env()
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        env.update(env_of(rank) if env_of else {})
        args = [
            sys.executable,
            os.path.join(HERE, "sharded_rank.py"),
            "--coordinator",
            coord.address,
            "--job",
            job,
            "--version",
            str(version),
            "--out",
            out,
        ]
        for k, v in dict(flags, **(per_rank(rank) if per_rank else {})).items():
            flag = "--" + k.replace("_", "-")
            args += [flag] if v is True else [flag, str(v)]
        log = open(os.path.join(out, "rank-%d.log" % rank), "wb")
        procs.append((subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    return procs


def wait_ranks(procs, out):
    """Waits for every rank (bounded): [(exit code, log tail)] by rank."""
    ended = []
    for rank, (p, log) in enumerate(procs):
        try:
            p.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
        with open(os.path.join(out, "rank-%d.log" % rank), errors="replace") as f:
            ended.append((p.returncode, f.read()[-3000:]))
    return ended


def run_ranks(coord, job, version, world, out, **flags):
    """Starts `world` rank processes of sharded_rank.py and waits for all."""
    ended = wait_ranks(start_ranks(coord, job, version, world, out, **flags), out)
    failures = ["rank %d exited %s:\n%s" % (r, code, tail) for r, (code, tail) in enumerate(ended) if code != 0]
    assert not failures, "\n".join(failures)
    return [torch.load(os.path.join(out, "rank-%d.pt" % r)) for r in range(world)]


def submit(coord, kind, world, ep=1, policy="seed"):
    import muonshard.torch as mst

    params = [(n, torch.nn.Parameter(v)) for n, v in fixture_model.full_tensors(kind, SEED)]
    manifest = mst.manifest_from_module(params, "test-" + kind)
    c = muonshard.Coordinator(coord.address)
    version = c.submit(manifest, world_size=world, ep=ep, policy=policy)
    return c, version


def reference(coord_client, version, kind, world, ep):
    plan = coord_client.plan(version)
    kinds = {t["name"]: t["optimizer"].lower() for t in plan["tensors"]}
    tensors = [(n, v, "OUT_IN") for n, v in fixture_model.full_tensors(kind, SEED)]
    holders = paddle_ep_holders(world, ep, n_experts=fixture_model.EXPERTS, fused_stacks=fixture_model.stacks(kind))
    return ReferenceOptimizer(tensors, kinds, ReferenceConfig(), holders=holders)


def reference_steps(ref, kind, world, ep, steps, lrs=None):
    """Steps `steps` (an iterable of step numbers) of every rank's gradients."""
    dtypes = {n: d for n, _, d in fixture_model.specs(kind)}
    for i, step in enumerate(steps):
        if lrs is not None:
            ref.lr = lrs[i]
        local = []
        for rank in range(world):
            grads = {}
            for name, shape, _ in fixture_model.specs(kind):
                g = fixture_model.gradient(name, shape, rank, step, SEED)
                # What the rank hands over: its dtype's gradient, zeros for None.
                grads[name] = torch.zeros(shape) if g is None else g.to(dtypes[name]).float()
            local.append(grads)
        ref.step(local)


def assemble(results, kind_of_state):
    """Whole tensors of one state kind from every rank's state_dict shards;
    asserts every element is covered exactly once."""
    shapes = {}
    out, covered = {}, {}
    for r in results:
        for key, value in r["state"]["state"].items():
            name, kind, span = key.rsplit("/", 2)
            if kind != kind_of_state:
                continue
            begin, end = (int(x) for x in span.split(":"))
            shapes.setdefault(name, None)
            flat = out.setdefault(name, {})
            flat[(begin, end)] = value
            covered.setdefault(name, []).append((begin, end))
    whole = {}
    for name, pieces in out.items():
        n = max(e for _, e in pieces)
        t = torch.full((n,), float("nan"))
        for (b, e), v in pieces.items():
            assert torch.isnan(t[b:e]).all(), "%s: [%d, %d) covered twice" % (name, b, e)
            t[b:e] = v
        assert not torch.isnan(t).any(), "%s: elements not covered" % name
        whole[name] = t
    return whole


def assert_close(actual, expected, what, rtol=1e-5):
    expected = expected.reshape(-1).float()
    actual = actual.reshape(-1).float()
    assert actual.shape == expected.shape, what
    scale = max(expected.abs().max().item(), 1e-6)
    err = (actual - expected).abs().max().item() / scale
    assert err <= rtol, "%s: max error %.3g (relative to max |x| %.3g) > %g" % (what, err, scale, rtol)
    return err


def check_against_reference(results, ref, kind, ep):
    masters = assemble(results, "master")
    assert set(masters) == set(ref.masters), "state covers %s" % sorted(set(ref.masters) ^ set(masters))
    worst = 0.0
    for name, value in masters.items():
        worst = max(worst, assert_close(value, ref.masters[name], name + " master"))
    for name, value in assemble(results, "momentum").items():
        assert_close(value, ref.momentum[name], name + " momentum", rtol=1e-4)
    for name, value in assemble(results, "moment1").items():
        assert_close(value, ref.moment1[name], name + " moment1", rtol=1e-4)
    # Every rank's parameters are the reference's model copies (its slice under ep).
    for r in results:
        for name, value in r["params"].items():
            expected = ref.model_copy(name)
            part = fixture_model.local_slice(name, tuple(expected.shape), r["rank"], ep)
            if part is not None:
                expected = expected[part[0] : part[1]]
            assert value.dtype == expected.dtype, name
            tol = 1e-5 if value.dtype == torch.float32 else 1e-2  # one bf16 ulp where a master straddles
            assert_close(value, expected, "rank %d %s param" % (r["rank"], name), rtol=tol)
    return worst


CASES = [
    # (kind, world, ep, policy)
    ("dense", 1, 1, "seed"),
    ("dense", 2, 1, "seed"),
    ("dense", 3, 1, "balanced"),
    ("moe", 4, 2, "seed"),
    ("stack", 4, 2, "balanced"),
    ("moe", 2, 2, "balanced"),
]


@pytest.mark.parametrize("kind,world,ep,policy", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_matches_reference(coordinator, tmp_path, kind, world, ep, policy):
    client, version = submit(coordinator, kind, world, ep, policy)
    steps = 4
    results = run_ranks(
        coordinator,
        "job-%s-%d-%d-%s" % (kind, world, ep, policy),
        version,
        world,
        str(tmp_path),
        model=kind,
        ep=ep,
        steps=steps,
        seed=SEED,
    )
    ref = reference(client, version, kind, world, ep)
    reference_steps(ref, kind, world, ep, range(steps))
    worst = check_against_reference(results, ref, kind, ep)
    print("%s world %d ep %d %s: worst master error %.3g" % (kind, world, ep, policy, worst))
    for r in results:
        assert r["memory"]["optimizer_state"] == r["memory"]["plan_optimizer_state"]
        assert r["state"]["muonshard"]["step"] == steps


# (kind, world, ep, policy, step_piece_kib): the last with Muon buckets in
# 1 KiB pieces (NOTE [Step pieces]).
OVERLAP_CASES = [("dense", 2, 1, "balanced", 0), ("moe", 4, 2, "seed", 0), ("moe", 4, 2, "balanced", 1)]


@pytest.mark.parametrize(
    "kind,world,ep,policy,piece_kib", OVERLAP_CASES, ids=["-".join(map(str, c)) for c in OVERLAP_CASES]
)
def test_overlap_backward_hands_gradients_from_hooks_and_matches_reference(
    coordinator, tmp_path, kind, world, ep, policy, piece_kib
):
    """overlap_backward: backward's hooks hand each gradient over as it is
    accumulated (begin_step / grad_ready), step() finishes; the result is the
    reference's, as without hooks, also with the Muon buckets in pieces."""
    client, version = submit(coordinator, kind, world, ep, policy)
    steps = 3
    trace_dir = tmp_path / "trace"
    results = run_ranks(
        coordinator,
        "job-overlap-%s-%d-%s-%d" % (kind, world, policy, piece_kib),
        version,
        world,
        str(tmp_path),
        model=kind,
        ep=ep,
        steps=steps,
        seed=SEED,
        overlap=True,
        step_piece_kib=piece_kib,
        step_trace_dir=str(trace_dir),
    )
    ref = reference(client, version, kind, world, ep)
    reference_steps(ref, kind, world, ep, range(steps))
    check_against_reference(results, ref, kind, ep)
    for r in results:
        assert r["state"]["muonshard"]["step"] == steps
        # The hooks handed over every gradient backward produced, before step().
        assert r["hooked"] == r["with_grad"] > 0, (r["hooked"], r["with_grad"])
        check_step_trace(trace_dir / ("step-trace-rank%d.json" % r["rank"]), r["rank"], steps)


def check_step_trace(path, rank, steps):
    """NOTE [Step trace]: close() wrote every step's spans; in the pipelined
    step each bucket is updated after its reduce and synchronised after its
    update."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    assert all(e["pid"] == rank for e in events)
    assert sorted(e["args"]["step"] for e in events if e["cat"] == "step") == list(range(1, steps + 1))
    spans = {}
    for e in events:
        if e["cat"] != "step":
            key = (e["args"]["step"], e["cat"], e["args"]["buffer"], e["args"]["bucket"])
            assert key not in spans, key
            spans[key] = (e["ts"], e["ts"] + e["dur"])
    updates = [k for k in spans if k[1] == "update"]
    assert updates
    for step, _, buffer, bucket in updates:
        reduce_end = spans[(step, "reduce", buffer, bucket)][1]
        start, end = spans[(step, "update", buffer, bucket)]
        assert reduce_end <= start + 1e-3 and end <= spans[(step, "sync", buffer, bucket)][0] + 1e-3


@pytest.mark.parametrize("held", [0, 1])
def test_ranks_with_different_step_options_both_raise_naming_the_option(coordinator, tmp_path, held):
    """NOTE [Step agreement]: step_piece_kib differs between the two ranks; both
    constructors raise InvalidArgumentError at the group barrier, naming it
    (before, rank 1 crashed in gloo on the first step's mismatched sizes),
    whichever rank is faster: rank `held` waits at the barrier until its peer
    has compared, reported and left (NOTE [Test holds]), and ends with the
    job's failure, its peer's reason (NOTE [Job failure])."""
    _, version = submit(coordinator, "dense", 2)
    job = "job-disagree-%d" % held
    released = tmp_path / "peer-left"
    procs = start_ranks(
        coordinator,
        job,
        version,
        2,
        str(tmp_path),
        per_rank=lambda r: {"step_piece_kib": r},
        env_of=lambda r: {"MUONSHARD_TEST_HOLD_BARRIER": "group=until:%s" % released} if r == held else {},
        model="dense",
        steps=2,
        seed=SEED,
    )
    with contextlib.suppress(subprocess.TimeoutExpired):  # wait_ranks kills what is left
        procs[1 - held][0].wait(TIMEOUT)  # the peer compared, reported and left
    released.touch()
    ended = wait_ranks(procs, str(tmp_path))
    for rank, (code, tail) in enumerate(ended):
        assert code == 1, "rank %d exited %s:\n%s" % (rank, code, tail)
        assert "muonshard._errors.InvalidArgumentError" in tail, tail
        assert (
            'step options differ across ranks: rank 1 runs --step-piece-kib="1" where rank 0 runs --step-piece-kib=0'
        ) in tail, tail
    assert ("rank %d (" % (1 - held)) in ended[held][1] and "failed: INVALID_ARGUMENT" in ended[held][1]


def test_a_rank_that_fails_in_a_step_ends_the_job_with_its_reason_on_every_rank(coordinator, tmp_path):
    """NOTE [Job failure]: rank 0's step refuses its input (lr -1) while rank 1
    waits for it in the step's collectives: rank 1 does not time out or say
    "generation moved" but raises rank 0's own error, with its class."""
    _, version = submit(coordinator, "dense", 2)
    ended = wait_ranks(
        start_ranks(
            coordinator,
            "job-bad-lr",
            version,
            2,
            str(tmp_path),
            per_rank=lambda r: {"bad_lr_at": 1} if r == 0 else {},
            model="dense",
            steps=3,
            seed=SEED,
        ),
        str(tmp_path),
    )
    for rank, (code, tail) in enumerate(ended):
        assert code == 1, "rank %d exited %s:\n%s" % (rank, code, tail)
        assert "muonshard._errors.InvalidArgumentError" in tail, tail
        assert "lr must be finite and >= 0, got -1" in tail, tail
    assert "rank 0 (" in ended[1][1] and "failed: INVALID_ARGUMENT" in ended[1][1], ended[1][1]
    status = muonshard.Coordinator(coordinator.address).workers("job-bad-lr")[0]
    assert int(status["failure"].get("rank", 0)) == 0 and "lr must be finite" in status["failure"]["reason"], status


def test_lr_scheduler_changes_the_step_as_for_torch_adamw(coordinator, tmp_path):
    """A LambdaLR drives param_groups[0]["lr"] exactly as it does for torch.optim.AdamW,
    and the step uses it (the masters follow the reference stepped with those rates)."""
    client, version = submit(coordinator, "dense", 2)
    steps = 4
    results = run_ranks(
        coordinator, "job-lr", version, 2, str(tmp_path), model="dense", steps=steps, seed=SEED, schedule=True
    )
    # The rates torch.optim.AdamW sees under the same scheduler.
    p = torch.nn.Parameter(torch.zeros(1))
    adamw = torch.optim.AdamW([p], lr=0.02)
    sched = torch.optim.lr_scheduler.LambdaLR(adamw, lr_lambda)
    expected = []
    for _ in range(steps):
        expected.append(adamw.param_groups[0]["lr"])
        adamw.step()
        sched.step()
    assert results[0]["lrs"] == pytest.approx(expected, rel=0, abs=0)
    ref = reference(client, version, "dense", 2, 1)
    reference_steps(ref, "dense", 2, 1, range(steps), lrs=expected)
    check_against_reference(results, ref, "dense", 1)


def test_save_at_world_4_resume_at_world_2_under_another_policy(coordinator, tmp_path):
    """Training continues from the saved state when the world size and policy
    change (reshard on load): the result equals the reference trained through
    the same steps with each phase's ranks."""
    kind = "moe"
    client, v4 = submit(coordinator, kind, 4, ep=2, policy="seed")
    ckpt = str(tmp_path / "ckpt")
    run_ranks(
        coordinator,
        "job-save",
        v4,
        4,
        str(tmp_path / "a"),
        model=kind,
        ep=2,
        steps=3,
        seed=SEED,
        save_dir=ckpt,
        save_at=3,
    )
    _, v2 = submit(coordinator, kind, 2, ep=1, policy="balanced")
    results = run_ranks(
        coordinator, "job-resume", v2, 2, str(tmp_path / "b"), model=kind, ep=1, steps=5, seed=SEED, resume_dir=ckpt
    )
    ref = reference(client, v4, kind, 4, 2)
    reference_steps(ref, kind, 4, 2, range(3))
    ref2 = ReferenceOptimizer.from_state_dict(
        [(n, v, "OUT_IN") for n, v in fixture_model.full_tensors(kind, SEED)],
        ref.kinds,
        ref.state_dict(),
        ReferenceConfig(),
        holders=paddle_ep_holders(2, 1, n_experts=fixture_model.EXPERTS),
    )
    reference_steps(ref2, kind, 2, 1, range(3, 5))
    check_against_reference(results, ref2, kind, 1)
    assert results[0]["state"]["muonshard"]["step"] == 5
