"""Automatic recovery of muonshard.torch.ShardedMuonAdamW (max_restarts; NOTE
[Recovery] in worker/rank_session.h), against a real coordinator on loopback.

In one process (world 1): errors injected into the session's step (a wrapper
around the real RankSession) drive the real report / re-join / restore path;
the run then matches an uninterrupted one bit for bit, /metrics counts the
restart, and errors that are not a broken group (or come with no restarts
left) are reported and raised, never retried. A session whose recovery
failed raises a muonshard error on every call (no crash).

With real processes: examples/torch/train_gpt.py on 2 ranks (each its own
process, as a supervisor starts them) checkpointing every few steps; one is
killed with SIGKILL mid-run and started again with the same command line
(the test is the supervisor). The survivor recovers, both rewind to the
newest checkpoint, and the run ends with the parameters of an uninterrupted
run, bit for bit. Every wait is bounded.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import fixture_model
import pytest
import torch
from conftest import ROOT, package_env

import muonshard
import muonshard.torch as mst

SEED = 7
KIND = "dense"  # fp32 and bf16 parameters
SHAPES = {n: s for n, s, _ in fixture_model.specs(KIND)}


def submit(coord, world):
    params = [(n, torch.nn.Parameter(v)) for n, v in fixture_model.full_tensors(KIND, SEED)]
    return muonshard.Coordinator(coord.address).submit(
        mst.manifest_from_module(params, "test-recovery"), world_size=world
    )


def make_optimizer(coord, version, job, **kwargs):
    params = fixture_model.local_parameters(KIND, SEED, 0, 1)
    opt = mst.ShardedMuonAdamW(
        params,
        coordinator=coord.address,
        job=job,
        plan_version=version,
        rank=0,
        reduce_order="rank",
        blas_threads=1,
        comm_timeout=30,
        join_timeout=10,
        **kwargs,
    )
    return opt, params


def train(opt, params, total, save_every=0):
    """The loop of a training program: gradients that depend on the parameters
    (a wrong restore changes every later step), Recovered rewinds. Returns the
    Recovered exceptions seen."""
    recovered = []
    step = opt.start_step
    while step < total:
        try:
            for name, p in params:
                g = fixture_model.local_gradient(name, SHAPES[name], 0, step, SEED, 1)
                g = 0.1 * p.detach().float() + (0 if g is None else g)
                p.grad = g.to(p.dtype)
            opt.step()
            opt.zero_grad()
            step += 1
            if save_every and step % save_every == 0:
                opt.save_checkpoint()
        except mst.Recovered as r:
            recovered.append(r)
            step = r.step
    return recovered


def snapshot(opt, params):
    return {
        "params": {n: p.detach().clone() for n, p in params},
        "state": {k: v.clone() for k, v in opt.state_dict()["state"].items()},
        "steps": opt.steps_done,
    }


def assert_identical(a, b):
    assert a["steps"] == b["steps"]
    for kind in ("params", "state"):
        assert a[kind].keys() == b[kind].keys()
        for k in a[kind]:
            assert torch.equal(a[kind][k], b[kind][k]), "%s %s differs" % (kind, k)


class FaultySession:
    """The real RankSession, with errors raised from its step (step_addresses,
    which ShardedMuonAdamW calls) at chosen calls and the recovery loop's
    reports and re-joins counted."""

    def __init__(self, inner, faults):
        self.inner = inner
        self.faults = dict(faults)  # step call number (from 0) -> exception
        self.calls = {"step": 0, "report_error": [], "recover": 0}

    def step_addresses(self, *args, **kwargs):
        n = self.calls["step"]
        self.calls["step"] += 1
        if n in self.faults:
            raise self.faults.pop(n)
        return self.inner.step_addresses(*args, **kwargs)

    def recover_from(self, code, message, detect, before_teardown, restore):
        """The recovery loop (worker/recovery_driver.h): reports `code`, then
        restores once per re-join."""
        self.calls["report_error"].append(code)

        def counted_restore():
            self.calls["recover"] += 1
            return restore()

        return self.inner.recover_from(code, message, detect, before_teardown, counted_restore)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def inject(opt, faults):
    opt._session = FaultySession(opt._session, faults)
    return opt._session


def metric(port, name):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    values = [float(m.group(1)) for m in re.finditer(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), text, re.M)]
    return sum(values) if values else None


def uninterrupted(coord, version, job, steps):
    opt, params = make_optimizer(coord, version, job)
    assert train(opt, params, steps) == []
    result = snapshot(opt, params)
    opt.close()
    return result


# --------------------------------------------------------------------------- one process


def test_recovers_from_the_newest_checkpoint(coordinator, tmp_path):
    version = submit(coordinator, 1)
    expected = uninterrupted(coordinator, version, "ref", 8)

    opt, params = make_optimizer(
        coordinator, version, "ckpt", max_restarts=2, checkpoint_dir=tmp_path / "ckpt", rejoin_grace=20, metrics_port=0
    )
    assert opt.start_step == 0 and opt.max_restarts == 2
    faults = inject(opt, {5: muonshard.AbortedError("injected: a peer's connection closed")})
    generation = opt.generation
    recovered = train(opt, params, 8, save_every=2)

    assert [r.step for r in recovered] == [4]  # the newest checkpoint when step 6 broke
    r = recovered[0]
    assert isinstance(r.cause, muonshard.AbortedError) and r.__cause__ is r.cause
    assert (r.restarts, r.max_restarts, r.rank, r.world_size) == (1, 2, 0, 1)
    assert r.generation > generation and opt.generation == r.generation
    assert set(r.times) == {"detect", "abort", "rendezvous", "restore"} and min(r.times.values()) >= 0
    assert faults.calls["report_error"] == ["ABORTED"] and faults.calls["recover"] == 1
    assert opt.restarts == 1
    assert_identical(snapshot(opt, params), expected)
    assert metric(opt.metrics_port, "muonshard_worker_restarts_total") == 1
    assert metric(opt.metrics_port, "muonshard_worker_recovery_seconds_count") == 4  # one per phase
    opt.close()
    # The module's parameters outlive the optimizer's buffers.
    assert_identical({**expected, "params": {n: p.detach() for n, p in params}}, expected)


def test_recovers_the_initial_parameters_without_a_checkpoint(coordinator, tmp_path):
    """No checkpoint yet (or no checkpoint_dir): every rank restores the
    parameters the optimizer was constructed with, whatever the broken steps
    did to the module; a save failing the same way recovers too."""
    version = submit(coordinator, 1)
    expected = uninterrupted(coordinator, version, "ref0", 5)
    initial = {n: p.detach().clone() for n, p in fixture_model.local_parameters(KIND, SEED, 0, 1)}

    opt, params = make_optimizer(coordinator, version, "init", max_restarts=3)
    inject(opt, {3: muonshard.DeadlineExceededError("injected: a peer did not answer")})
    seen = []
    real_step = opt.step

    def step_and_check():
        if opt.restarts == 1 and not seen:  # the first step after the recovery
            seen.append({n: p.detach().clone() for n, p in params})
        return real_step()

    opt.step = step_and_check
    recovered = train(opt, params, 5)
    assert [r.step for r in recovered] == [0]
    for name, value in seen[0].items():
        assert torch.equal(value, initial[name]), name
    assert_identical(snapshot(opt, params), expected)
    opt.close()

    # A broken checkpoint save: the same recovery (here from the first save).
    opt, params = make_optimizer(coordinator, version, "save", max_restarts=1, checkpoint_dir=tmp_path / "c2")
    inner = opt._session

    class SaveFails(FaultySession):
        def save_checkpoint(self, *args):
            if self.calls.setdefault("saves", 0) == 1:
                self.calls["saves"] += 1
                raise muonshard.UnavailableError("injected: the coordinator is unreachable")
            self.calls["saves"] += 1
            return self.inner.save_checkpoint(*args)

    opt._session = SaveFails(inner, {})
    recovered = train(opt, params, 5, save_every=2)
    assert [r.step for r in recovered] == [2]
    assert_identical(snapshot(opt, params), expected)
    opt.close()


@pytest.mark.parametrize("case", ["not-broken", "no-restarts-left", "python-error", "python-fault"])
def test_errors_that_cannot_be_recovered_are_reported_and_raised(coordinator, case):
    version = submit(coordinator, 1)
    if case == "not-broken":  # a broken group it is not: retrying cannot help
        error, restarts = muonshard.InvalidArgumentError("injected: gradient of plan tensor 3 has 7 values"), 3
    elif case == "no-restarts-left":
        error, restarts = muonshard.AbortedError("injected: the generation moved"), 0
    elif case == "python-error":  # not the C++ layer's: reported with the code of its kind
        error, restarts = TypeError("injected: not a tensor"), 3
    else:  # neither: reported as INTERNAL (a fault, recovered from by a replacement)
        error, restarts = RuntimeError("injected: a bug"), 3
    opt, params = make_optimizer(coordinator, version, "fail-" + case, max_restarts=restarts)
    faults = inject(opt, {1: error})
    with pytest.raises(type(error)) as raised:
        train(opt, params, 3)
    assert raised.value is error
    code = getattr(error, "code", "INVALID_ARGUMENT" if case == "python-error" else "INTERNAL")
    assert faults.calls["report_error"] == [code] and faults.calls["recover"] == 0
    assert opt.restarts == 0
    # The job moved on (the peers learn at once), and this rank leaves without
    # waiting to meet them.
    jobs = muonshard.Coordinator(coordinator.address).workers("fail-" + case)
    assert int(jobs[0]["generation"]) > opt.generation, jobs
    started = time.monotonic()
    opt.close()
    assert time.monotonic() - started < 10


def test_no_restarts_left_after_the_last_recovery(coordinator, tmp_path):
    version = submit(coordinator, 1)
    opt, params = make_optimizer(coordinator, version, "twice", max_restarts=1, checkpoint_dir=tmp_path / "c")
    second = muonshard.AbortedError("injected: the second failure")
    faults = inject(opt, {2: muonshard.AbortedError("injected: the first failure"), 4: second})
    with pytest.raises(muonshard.AbortedError) as raised:
        train(opt, params, 6, save_every=1)
    assert raised.value is second
    assert faults.calls["recover"] == 1 and faults.calls["report_error"] == ["ABORTED", "ABORTED"]
    opt.close()


def test_a_session_without_a_group_raises_instead_of_crashing(tmp_path):
    """After a failed recover() there is no optimizer: every call that needs one
    raises FAILED_PRECONDITION; recover() may be tried again; close() works."""
    with muonshard.LocalCoordinator(heartbeat_timeout=10) as coord:
        version = submit(coord, 1)
        params = fixture_model.local_parameters(KIND, SEED, 0, 1)
        session = muonshard._muonshard.RankSession(
            coordinator=coord.address,
            job="lost",
            plan_version=version,
            rank=0,
            blas_threads=1,
            join_timeout=1.0,
            rpc_timeout=2.0,
        )
        assert session.has_group
        for name, p in params:
            held = next(h for h in session.held() if h["name"] == name)
            session.set_parameter(held["index"], p.detach().float().reshape(-1).contiguous().numpy())
        session.report_error("ABORTED", "injected")
        coord.stop()  # the re-join cannot reach it
        with pytest.raises(muonshard.Error):
            session.recover()
        assert not session.has_group
        index = session.held()[0]["index"]
        calls = [
            lambda: session.step({}),
            lambda: session.step_addresses({}),
            lambda: session.grad_ready_address(index, 0, "float32", 0),
            lambda: session.copy_model_copies_to({}),
            lambda: session.host_copies,
            session.describe,
            session.memory,
            session.state,
            lambda: session.steps_done,
            lambda: session.part_storage(index),
            session.sync_model_copies,
            lambda: session.save_checkpoint(str(tmp_path), 1, 0.02, 0.0),
            lambda: session.load_latest_checkpoint(str(tmp_path)),
            session.finish,
            lambda: session.barrier("x"),
        ]
        for call in calls:
            with pytest.raises(muonshard.FailedPreconditionError, match="recovery failed"):
                call()
        with pytest.raises(muonshard.Error):
            session.recover()  # still no coordinator: an error, not a crash
        session.report_error("ABORTED", "no membership: nothing to tell")
        session.close()
        with pytest.raises(muonshard.FailedPreconditionError, match="closed"):
            session.describe()


def test_is_broken_group_follows_the_worker():
    broken = {"ABORTED", "UNAVAILABLE", "DEADLINE_EXCEEDED"}
    for code in [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ]:
        assert muonshard._muonshard.is_broken_group(code) == (code in broken), code
    with pytest.raises(ValueError):
        muonshard._muonshard.is_broken_group("BROKEN")


def test_recovery_arguments_are_checked(coordinator, tmp_path):
    params = fixture_model.local_parameters(KIND, SEED, 0, 1)
    with pytest.raises(ValueError, match="needs resume"):
        mst.ShardedMuonAdamW(
            params, coordinator=coordinator.address, job="j", max_restarts=1, checkpoint_dir=tmp_path, resume=False
        )
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="j", resume=True)
    with pytest.raises(ValueError, match="max_restarts"):
        mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="j", max_restarts=-1)
    with pytest.raises(ValueError, match="rejoin_grace"):
        mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="j", rejoin_grace=0)
    with pytest.raises(ValueError, match="min_workers must be >= 0"):
        mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="j", min_workers=-1)
    with pytest.raises(ValueError, match="min_workers needs max_restarts > 0 and a checkpoint_dir"):
        mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="j", min_workers=2, max_restarts=1)
    with pytest.raises(ValueError, match="min_workers needs max_restarts > 0 and a checkpoint_dir"):
        mst.ShardedMuonAdamW(params, coordinator=coordinator.address, job="j", min_workers=2, checkpoint_dir=tmp_path)


# --------------------------------------------------------------------------- real processes

EXAMPLE = os.path.join(ROOT, "examples", "torch", "train_gpt.py")
WORLD = 2
STEPS = 20
CHECKPOINT_EVERY = 4
KILL_AFTER = 8  # steps: rank 1 is killed once the checkpoint of this step is committed
# A model small enough for tens of ms per step on a busy core.
EXAMPLE_FLAGS = [
    "--vocab",
    "64",
    "--d-model",
    "64",
    "--n-layers",
    "2",
    "--n-heads",
    "4",
    "--seq-len",
    "32",
    "--batch-size",
    "8",
    "--log-every",
    "1",
    "--steps",
    str(STEPS),
    "--checkpoint-every",
    str(CHECKPOINT_EVERY),
    "--max-restarts",
    "2",
    "--rejoin-grace",
    "60",
]
BOUND = 150  # seconds: any wait that succeeds takes a fraction of it


class ExampleRun:
    """WORLD processes of train_gpt.py, each started (and restarted) alone with
    RANK / WORLD_SIZE set, as a supervisor starts them."""

    def __init__(self, coord, out, job, world=WORLD, extra=(), ckpt=None):
        self.out = out
        os.makedirs(out, exist_ok=True)
        self.world = world
        self.ckpt = ckpt or os.path.join(out, "ckpt")
        self.summary = os.path.join(out, "summary.json")
        self.args = (
            [
                sys.executable,
                EXAMPLE,
                "--coordinator",
                coord.address,
                "--job",
                job,
                "--checkpoint-dir",
                self.ckpt,
                "--summary-json",
                self.summary,
            ]
            + EXAMPLE_FLAGS
            + list(extra)
        )
        self.procs = {}
        self.logs = []
        self.log_of = {}

    def launch(self, rank):
        env = package_env()
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(self.world),
            OMP_NUM_THREADS="1",
        )
        path = os.path.join(self.out, "rank-%d-%d.log" % (rank, len(self.logs)))
        self.logs.append(path)
        self.log_of[rank] = path  # the slot's latest process
        with open(path, "wb") as log:
            self.procs[rank] = subprocess.Popen(self.args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.out)

    def output(self):
        text = []
        for path in self.logs:
            with open(path, errors="replace") as f:
                text.append("--- %s\n%s" % (os.path.basename(path), f.read()[-4000:]))
        return "\n".join(text)

    def wait_for_checkpoint(self, step):
        deadline = time.monotonic() + BOUND
        while not os.path.isdir(os.path.join(self.ckpt, "step-%d" % step)):  # renamed into place: committed
            dead = {r: p.returncode for r, p in self.procs.items() if p.poll() is not None}
            assert not dead and time.monotonic() < deadline, "no checkpoint of step %d (exited: %s)\n%s" % (
                step,
                dead,
                self.output(),
            )
            time.sleep(0.02)

    def finish(self):
        deadline = time.monotonic() + BOUND
        codes = {}
        for rank, p in self.procs.items():
            try:
                codes[rank] = p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                codes[rank] = p.wait()
        assert codes == {r: 0 for r in self.procs}, "exit codes %s\n%s" % (codes, self.output())
        with open(self.summary) as f:
            return json.load(f)

    def kill(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_killed_rank_is_replaced_and_the_run_ends_as_an_uninterrupted_one(coordinator, tmp_path):
    """kill -9 of rank 1 after the checkpoint of step 8, then the same command line
    again: rank 0 recovers (Recovered: rewinds to the newest checkpoint), the
    replacement resumes from it, and the run's losses and final parameters are
    the uninterrupted run's, bit for bit."""
    reference = ExampleRun(coordinator, str(tmp_path / "reference"), "gpt-reference")
    faulty = ExampleRun(coordinator, str(tmp_path / "faulty"), "gpt-faulty")
    try:
        for rank in range(WORLD):  # both runs at once: the test's wall time is the faulty run's
            reference.launch(rank)
            faulty.launch(rank)
        faulty.wait_for_checkpoint(KILL_AFTER)
        victim = faulty.procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(BOUND)
        faulty.launch(1)  # the supervisor's restart
        expected = reference.finish()
        got = faulty.finish()
    finally:
        reference.kill()
        faulty.kill()

    out = faulty.output()
    assert got["restarts"] == 1 and expected["restarts"] == 0, out
    assert "recovered at step" in out, out
    with open(faulty.logs[-1], errors="replace") as f:  # the replacement's
        resumed = re.search(r"rank 1: resumed from \S+ \(step (\d+),", f.read())
    assert resumed and KILL_AFTER <= int(resumed.group(1)) < STEPS, out  # from a checkpoint, not from scratch
    assert got["losses"] == expected["losses"], "the losses differ\n" + out  # every step's, re-run ones included
    assert got["parameter_digests"][1] == expected["parameter_digests"][1], "final parameters differ\n" + out


# Long enough for a restarted process (a Python start, torch's import) to
# join before the survivors finish, on a loaded machine too (~10 s of steps).
ELASTIC_STEPS = 400
ELASTIC_CHECKPOINT_EVERY = 8


def slot_log(run, slot):
    with open(run.log_of[slot], errors="replace") as f:
        return f.read()


def wait_for_log(run, slot, pattern):
    """The first match of `pattern` in the log of `slot`'s latest process."""
    deadline = time.monotonic() + BOUND
    while True:
        m = re.search(pattern, slot_log(run, slot))
        if m:
            return m
        dead = {r: p.returncode for r, p in run.procs.items() if p.poll() is not None}
        assert not dead and time.monotonic() < deadline, "no %r (exited: %s)\n%s" % (pattern, dead, run.output())
        time.sleep(0.05)


def elastic_ranks(run, world):
    """{slot: rank}: an elastic job's ranks are the coordinator's (join order), not the slots'."""
    return {
        slot: int(wait_for_log(run, slot, r'joined job "[^"]+" as rank (\d+) of %d' % world).group(1))
        for slot in run.procs
    }


def test_an_elastic_job_shrinks_past_a_dead_rank_grows_back_and_ends_as_its_plans_replayed(coordinator, tmp_path):
    """--min-workers 2 on 3 ranks (sums in rank order: the same bits under any
    plan of a world size). Rank 2 is killed (-9) after the checkpoint of step 8;
    after the rejoin grace the coordinator plans the job again for the two
    survivors (NOTE [Elastic jobs]), which rewind to the newest checkpoint with
    Recovered's new world size. Then the killed process is started again with
    its first command line: it grows the job back to 3 ranks, and everyone
    rewinds once more. The losses and final parameters are those of the three
    plans run one after the other from each other's checkpoints."""
    elastic = ExampleRun(
        coordinator,
        str(tmp_path / "elastic"),
        "gpt-elastic",
        world=3,
        extra=[
            "--steps",
            str(ELASTIC_STEPS),
            "--checkpoint-every",
            str(ELASTIC_CHECKPOINT_EVERY),
            "--log-every",
            "50",
            "--min-workers",
            "2",
            "--rejoin-grace",
            "3",
            "--max-restarts",
            "8",
            "--reduce-order",
            "rank",
        ],
    )
    try:
        for slot in range(3):
            elastic.launch(slot)
        rank_of = elastic_ranks(elastic, 3)
        slot_of = {r: s for s, r in rank_of.items()}
        assert sorted(slot_of) == [0, 1, 2], rank_of
        elastic.wait_for_checkpoint(KILL_AFTER)
        victim_slot, first = slot_of[2], slot_of[0]  # rank 0 survives (and logs)
        victim = elastic.procs.pop(victim_slot)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(BOUND)
        resized = r"continuing after step (\d+)\s+resized: now rank 0 of %d \(plan version (\d+)\)"
        shrunk = wait_for_log(elastic, first, resized % 2)
        elastic.launch(victim_slot)  # the supervisor's restart, once the job has shrunk
        grown = wait_for_log(elastic, first, resized % 3)
        got = elastic.finish()
    finally:
        elastic.kill()
    out = elastic.output()
    r1, r2 = int(shrunk.group(1)), int(grown.group(1))
    assert KILL_AFTER <= r1 <= r2 < ELASTIC_STEPS, out
    assert r1 % ELASTIC_CHECKPOINT_EVERY == 0 == r2 % ELASTIC_CHECKPOINT_EVERY, out
    assert int(shrunk.group(2)) != int(grown.group(2)), out  # a plan per resize
    # The restarted process grew the job back: it took the last rank.
    assert re.search(r"rank 2: joined job \"gpt-elastic\" as rank 2 of 3", slot_log(elastic, victim_slot)), out

    # The replay: 3 ranks to the first rewind point, 2 ranks from there to the
    # second, 3 ranks from there to the end (one LR schedule over the whole run).
    ckpt = str(tmp_path / "replay-ckpt")
    phases = [(3, r1), (2, r2), (3, ELASTIC_STEPS)]
    summaries = []
    for i, (world, last) in enumerate(phases):
        run = ExampleRun(
            coordinator,
            str(tmp_path / ("replay-%d" % i)),
            "gpt-replay-%d" % i,
            world=world,
            ckpt=ckpt,
            extra=[
                "--steps",
                str(last),
                "--schedule-steps",
                str(ELASTIC_STEPS),
                "--checkpoint-every",
                str(ELASTIC_CHECKPOINT_EVERY),
                "--log-every",
                "50",
                "--reduce-order",
                "rank",
            ],
        )
        try:
            for rank in range(world):
                run.launch(rank)
            summaries.append(run.finish())
        finally:
            run.kill()
    expected = {}
    for summary in summaries:
        expected.update(summary["losses"])
    assert set(expected) == {str(s) for s in range(1, ELASTIC_STEPS + 1)}
    assert got["losses"] == expected, "the losses differ\n" + out
    assert got["parameter_digests"][1] == summaries[-1]["parameter_digests"][1], "final parameters differ\n" + out
