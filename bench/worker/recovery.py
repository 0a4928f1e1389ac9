#!/usr/bin/python3
"""Time from a failure to training again, by fault (not a test).

Starts muonshard-coordinator (--heartbeat-timeout H) and 4 muonshard-worker
processes (regression workload, --reduce-order rank, --blas-threads 1, the
bundled tiny-llama submitted with --world-size 4, a checkpoint every K steps,
--resume, --max-restarts) and injects one fault per run, playing the
supervisor as tests/worker/fault_tolerance_test.cc does (a killed process is
started again at once with the same command line):

  kill-worker      kill -9 of a worker (rank 1..3), relaunched at once
  stop-thaw        SIGSTOP of a worker; SIGCONT once rank 0 noticed (its
                   "failed:" line)
  stop-kill        SIGSTOP of a worker; once rank 0 noticed, kill -9 and
                   relaunch instead of thawing
  kill-coordinator kill -9 of the coordinator, restarted at once on the same
                   --data-dir and --listen address (the workers' jobs are
                   adopted: no recovery is expected)

Every time is taken by this script from the workers' stderr, read as it is
written (rank 0 logs every step with --log-every 1), against the instant the
signal was sent:
  - to failure: the fault to rank 0's "failed:" line (its step aborted);
  - abort / rendezvous / restore: the survivors' own figures, from their
    "recovered into generation G (detect .., abort .., rendezvous ..,
    restore ..)" lines (median over the survivors of the run);
  - worker detect: the workers' own "detect" (from the start of the step
    that failed to its failure: it includes the part of the step computed
    before the fault);
  - to recovered: the fault to rank 0's "recovered into generation" line
    (the group re-formed and restored; it trains from here);
  - first step: from that line to rank 0's next completed step (one step,
    slower than "median step", the steps' median before the fault);
  - to training: the fault to the first step rank 0 completes after its
    recovery (for kill-coordinator: the first step it completes after the
    kill; "all adopted" is the fault to the restarted coordinator's line for
    the 4th worker re-registered, "longest gap" the longest time between two
    of rank 0's steps spanning the fault or within 10 s after it, against
    "longest gap before", the same before the fault);
  - replacement resumed: the fault to the relaunched process's "resumed
    from" line (its start, join, group and checkpoint load);
  - steps lost: the last step rank 0 completed before the fault minus the
    checkpoint step the group continued from.

Each fault hits a random instant of a random step in (K, 2K] (K = the
checkpoint interval) of a fresh cluster, on a random rank of 1..3.

Prints one table of median / min / max over the repeats per fault and
phase. Every wait is bounded; every process started is killed on exit.

Usage: /usr/bin/python3 bench/worker/recovery.py [--heartbeat-timeout 2] [--repeats 3]
           [--faults kill-worker stop-thaw stop-kill kill-coordinator] [--checkpoint-every 5]
           [--max-load 2 [--max-load-wait 600]] [--build build] [--keep]
"""

import argparse
import itertools
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLD = 4
FAULTS = ["kill-worker", "stop-thaw", "stop-kill", "kill-coordinator"]

STEP_RE = re.compile(r"rank 0: step (\d+)/\d+ ")
RECOVERED_RE = re.compile(
    r"rank (\d+): recovered into generation (\d+) \(detect ([^,]+), abort ([^,]+), "
    r"rendezvous ([^,]+), restore ([^)]+)\); continuing from step (\d+)"
)
DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|s|m)")
UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def seconds(text):
    """absl::FormatDuration (truncated to ms): "0", "7ms", "1.234s", "1m2.5s"."""
    text = text.strip()
    if text == "0":
        return 0.0
    total, matched = 0.0, ""
    for value, unit in DURATION_RE.findall(text):
        total += float(value) * UNITS[unit]
        matched += value + unit
    if matched != text:
        raise ValueError("not a duration: %r" % text)
    return total


class Abort(Exception):
    pass


def wait_until(predicate, bound, what):
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            raise Abort("timed out after %.0f s waiting for %s" % (bound, what))
        time.sleep(0.01)


class Proc:
    """A child process whose stderr lines are timestamped as they arrive."""

    def __init__(self, name, argv, log_dir):
        self.name = name
        self.lines = []  # (monotonic time, line)
        self.lock = threading.Lock()
        self.log = open(os.path.join(log_dir, name + ".err"), "w")
        self.p = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stderr:
            t = time.monotonic()
            with self.lock:
                self.lines.append((t, line.rstrip("\n")))
            self.log.write("%.3f %s" % (t, line))
            self.log.flush()

    def snapshot(self):
        with self.lock:
            return list(self.lines)

    def find(self, pattern, after=0.0):
        for t, line in self.snapshot():
            if t >= after and pattern in line:
                return t, line
        return None

    def alive(self):
        return self.p.poll() is None

    def signal(self, sig):
        if self.alive():
            self.p.send_signal(sig)

    def kill(self):
        if self.p.poll() is None:
            try:
                self.p.send_signal(signal.SIGCONT)
                self.p.kill()
            except ProcessLookupError:
                pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.reader.join(timeout=2)
        self.log.close()

    def tail(self, n=15):
        return "\n".join("  %s: %s" % (self.name, line) for _, line in self.snapshot()[-n:])


class Cluster:
    def __init__(self, a, scratch):
        self.a = a
        self.bin = os.path.join(os.path.abspath(a.build), "bin")
        self.scratch = scratch
        self.coordinator = None
        self.coordinator_launches = 0
        self.address = None
        self.workers = [None] * WORLD
        self.launches = [0] * WORLD
        self.dead = []  # killed processes, reaped on exit

    def start_coordinator(self):
        self.coordinator_launches += 1
        port_file = os.path.join(self.scratch, "coordinator.port")
        if os.path.exists(port_file):
            os.remove(port_file)
        listen = self.address or "127.0.0.1:0"
        self.coordinator = Proc(
            "coordinator-%d" % self.coordinator_launches,
            [
                os.path.join(self.bin, "muonshard-coordinator"),
                "--listen",
                listen,
                "--data-dir",
                os.path.join(self.scratch, "data"),
                "--metrics-port",
                "-1",
                "--heartbeat-timeout",
                str(self.a.heartbeat_timeout),
                "--port-file",
                port_file,
            ],
            self.scratch,
        )

        def ready():
            if not self.coordinator.alive():
                raise Abort("the coordinator exited:\n" + self.coordinator.tail())
            try:
                return json.load(open(port_file))["grpc_port"] > 0
            except (OSError, ValueError, KeyError):
                return False

        wait_until(ready, 30, "the coordinator's port file")
        self.address = "127.0.0.1:%d" % json.load(open(port_file))["grpc_port"]
        return time.monotonic()

    def submit(self):
        subprocess.run(
            [
                os.path.join(self.bin, "muonshardctl"),
                "submit",
                "--coordinator",
                self.address,
                "--manifest",
                os.path.join(ROOT, "examples", "manifests", self.a.manifest),
                "--world-size",
                str(WORLD),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def launch(self, rank):
        self.launches[rank] += 1
        argv = [
            os.path.join(self.bin, "muonshard-worker"),
            "--coordinator",
            self.address,
            "--job",
            "recovery",
            "--rank",
            str(rank),
            "--steps",
            str(self.a.steps),
            "--workload",
            "regression",
            "--reduce-order",
            "rank",
            "--lr",
            "0.01",
            "--blas-threads",
            "1",
            "--metrics-port",
            "0",
            "--port-file",
            os.path.join(self.scratch, "w%d.port" % rank),
            "--comm-timeout",
            str(self.a.comm_timeout),
            "--join-timeout",
            "60",
            "--max-restarts",
            "5",
            "--rejoin-grace",
            str(self.a.comm_timeout),
            "--checkpoint-dir",
            os.path.join(self.scratch, "ckpt"),
            "--checkpoint-every",
            str(self.a.checkpoint_every),
            "--resume",
            "--log-every",
            "1",
        ]
        self.workers[rank] = Proc("w%d-%d" % (rank, self.launches[rank]), argv, self.scratch)

    def kill_worker(self, rank):
        self.workers[rank].p.kill()  # SIGKILL
        t = time.monotonic()
        self.dead.append(self.workers[rank])
        return t

    def kill_coordinator(self):
        self.coordinator.p.kill()
        t = time.monotonic()
        self.dead.append(self.coordinator)
        return t

    def check_alive(self):
        for w in self.workers:
            if w is not None and w.p.poll() is not None:
                raise Abort("%s exited with %s:\n%s" % (w.name, w.p.returncode, w.tail()))

    def close(self):
        for p in self.workers + [self.coordinator] + self.dead:
            if p is not None:
                p.kill()


def rank0_steps(cluster, after=0.0):
    """(time, step) of rank 0's progress lines from `after` on."""
    out = []
    for t, line in cluster.workers[0].snapshot():
        m = STEP_RE.search(line)
        if m and t >= after:
            out.append((t, int(m.group(1))))
    return out


def last_step_before(cluster, t0):
    steps = [s for t, s in rank0_steps(cluster) if t < t0]
    return steps[-1] if steps else 0


def recovered_lines(proc, after):
    out = []
    for t, line in proc.snapshot():
        m = RECOVERED_RE.search(line)
        if m and t >= after:
            out.append((t, m))
    return out


def wait_for_quiet(a):
    """With --max-load L: waits (at most --max-load-wait s) until the 1-min
    load average is below L, since other work on the machine (and the
    previous run, decaying) slows the steps. The load then, returned, is
    reported with the run."""
    deadline = time.monotonic() + a.max_load_wait
    while a.max_load > 0 and os.getloadavg()[0] >= a.max_load and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def one_run(a, fault, run_index, rng):
    load = wait_for_quiet(a)
    scratch = tempfile.mkdtemp(prefix="muonshard-recovery-")
    cluster = Cluster(a, scratch)
    try:
        cluster.start_coordinator()
        cluster.submit()
        for r in range(WORLD):
            cluster.launch(r)
        # Fault at a random step past the first checkpoint, so the steps lost
        # vary over 0 .. K-1.
        at = max(3, a.checkpoint_every + rng.randint(1, a.checkpoint_every))

        def reached():
            cluster.check_alive()
            steps = rank0_steps(cluster)
            return steps and steps[-1][1] >= at

        wait_until(reached, 300, "rank 0 at step %d" % at)
        times = [t for t, _ in rank0_steps(cluster)]
        step = statistics.median(b - x for x, b in itertools.pairwise(times))  # the first step warms up
        time.sleep(rng.uniform(0, step))  # anywhere within a step
        victim = rng.randint(1, WORLD - 1)
        row = {"fault": fault, "victim": victim, "load": load, "median step": step}
        if fault == "kill-worker":
            t0 = cluster.kill_worker(victim)
            cluster.launch(victim)
        elif fault in ("stop-thaw", "stop-kill"):
            cluster.workers[victim].signal(signal.SIGSTOP)
            t0 = time.monotonic()
            wait_until(lambda: cluster.workers[0].find("failed: ", t0) is not None, 60, "rank 0 noticing")
            if fault == "stop-thaw":
                cluster.workers[victim].signal(signal.SIGCONT)
            else:
                cluster.kill_worker(victim)
                cluster.launch(victim)
        else:
            victim = None
            row["victim"] = "coordinator"
            t0 = cluster.kill_coordinator()
            serving = cluster.start_coordinator()
            row["coordinator back"] = serving - t0
        row["fault step"] = last_step_before(cluster, t0)

        if fault == "kill-coordinator":
            # No recovery expected: wait for rank 0 to go on past the restart
            # and for a few more steps (a checkpoint barrier the restart cut
            # in two would turn into a recovery: counted below).
            def trained_on():
                cluster.check_alive()
                steps = rank0_steps(cluster, serving)
                return len(steps) >= max(3, a.checkpoint_every + 1)

            wait_until(trained_on, a.comm_timeout + 60, "rank 0 training on after the coordinator's restart")
            after = rank0_steps(cluster, t0)
            row["to training"] = after[0][0] - t0
            adopted = [t for t, line in cluster.coordinator.snapshot() if "adopted after a coordinator restart" in line]
            row["all adopted"] = adopted[-1] - t0 if len(adopted) >= WORLD else float("nan")
            # The longest time between two steps of rank 0 that spans the
            # fault or follows it within 10 s (a step that waits on the
            # coordinator, a checkpoint barrier).
            times = [t for t, _ in rank0_steps(cluster)]
            gaps = [b - x for x, b in itertools.pairwise(times) if b > t0 and x < t0 + 10]
            row["longest gap"] = max(gaps) if gaps else float("nan")
            # The same before the fault (from the 2nd step: the 1st warms up;
            # a checkpoint step included), for comparison.
            gaps = [b - x for x, b in itertools.pairwise(times) if b < t0]
            row["longest gap before"] = max(gaps) if gaps else float("nan")
            row["recoveries"] = sum(len(recovered_lines(w, t0)) for w in cluster.workers)
            lines = [m for w in cluster.workers for _, m in recovered_lines(w, t0)]
            row["steps lost"] = (row["fault step"] - min(int(m.group(7)) for m in lines)) if lines else 0
            return row

        survivors = [r for r in range(WORLD) if r != victim]
        recovering = survivors + ([victim] if fault == "stop-thaw" else [])

        def recovered():
            cluster.check_alive()
            return all(recovered_lines(cluster.workers[r], t0) for r in recovering)

        wait_until(recovered, a.comm_timeout + 60, "the recovery lines")
        t_rec = recovered_lines(cluster.workers[0], t0)[0][0]

        def stepped():
            cluster.check_alive()
            return bool(rank0_steps(cluster, t_rec))

        wait_until(stepped, 60, "rank 0's first step after its recovery")
        failed = cluster.workers[0].find("failed: ", t0)
        row["to failure"] = failed[0] - t0 if failed else float("nan")
        row["to training"] = rank0_steps(cluster, t_rec)[0][0] - t0
        firsts = [recovered_lines(cluster.workers[r], t0)[0][1] for r in survivors]
        row["worker detect"] = statistics.median(seconds(m.group(3)) for m in firsts)
        row["abort"] = statistics.median(seconds(m.group(4)) for m in firsts)
        row["rendezvous"] = statistics.median(seconds(m.group(5)) for m in firsts)
        row["restore"] = statistics.median(seconds(m.group(6)) for m in firsts)
        row["to recovered"] = t_rec - t0
        row["first step"] = row["to training"] - row["to recovered"]
        row["continued from"] = int(firsts[0].group(7))
        row["steps lost"] = row["fault step"] - row["continued from"]
        row["recoveries"] = sum(len(recovered_lines(w, t0)) for w in cluster.workers)
        if fault != "stop-thaw":
            # The replacement's own start, to its "resumed from" line.
            resumed = cluster.workers[victim].find("resumed from")
            row["replacement resumed"] = resumed[0] - t0 if resumed else float("nan")
        return row
    except Abort:
        for p in [cluster.coordinator] + cluster.workers:
            if p is not None:
                print(p.tail(), file=sys.stderr)
        raise
    finally:
        cluster.close()
        if a.keep:
            print("kept %s" % scratch, file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


RECOVERY = [
    "median step",
    "to failure",
    "worker detect",
    "abort",
    "rendezvous",
    "restore",
    "to recovered",
    "first step",
    "to training",
]
PHASES = {
    "kill-worker": RECOVERY + ["replacement resumed", "steps lost"],
    "stop-thaw": RECOVERY + ["steps lost"],
    "stop-kill": RECOVERY + ["replacement resumed", "steps lost"],
    "kill-coordinator": [
        "median step",
        "coordinator back",
        "all adopted",
        "to training",
        "longest gap before",
        "longest gap",
        "recoveries",
        "steps lost",
    ],
}


def fmt(key, v):
    if key in ("steps lost", "recoveries"):
        return "%g" % v
    return "%.3f" % v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heartbeat-timeout", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--faults", nargs="+", choices=FAULTS, default=FAULTS)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100000, help="the workers' --steps (they are killed before)")
    ap.add_argument("--comm-timeout", type=int, default=60)
    ap.add_argument("--manifest", default="tiny-llama.json", help="under examples/manifests")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument(
        "--max-load",
        type=float,
        default=0,
        help="before each run, wait for the 1-min load average to drop below this (0: don't)",
    )
    ap.add_argument("--max-load-wait", type=float, default=600, help="... for at most this many seconds")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (logs, checkpoints)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(
        "seed %d, load average %s, heartbeat timeout %g s, checkpoint every %d steps, %s, %d ranks"
        % (
            seed,
            " ".join("%.2f" % x for x in os.getloadavg()),
            a.heartbeat_timeout,
            a.checkpoint_every,
            a.manifest,
            WORLD,
        ),
        flush=True,
    )
    results = {}
    failed = 0
    for fault in a.faults:
        for i in range(a.repeats):
            try:
                row = one_run(a, fault, i, rng)
            except (Abort, subprocess.SubprocessError) as e:
                failed += 1
                print("%s #%d: FAILED: %s" % (fault, i + 1, str(e).splitlines()[0]), flush=True)
                continue
            results.setdefault(fault, []).append(row)
            print(
                "%s #%d: %s"
                % (
                    fault,
                    i + 1,
                    ", ".join(
                        "%s %s" % (k, fmt(k, v) if isinstance(v, float) else v) for k, v in row.items() if k != "fault"
                    ),
                ),
                flush=True,
            )
    print(
        "\nload average at the end %s; 1-min load before each run %s"
        % (
            " ".join("%.2f" % x for x in os.getloadavg()),
            ", ".join("%.1f" % r["load"] for rows in results.values() for r in rows),
        )
    )
    print("\n| fault | phase | median | min | max |")
    print("|---|---|---|---|---|")
    for fault, rows in results.items():
        for key in PHASES[fault]:
            values = [r[key] for r in rows if key in r]
            if not values:
                continue
            unit = "" if key in ("steps lost", "recoveries") else " s"
            print(
                "| %s | %s%s | %s | %s | %s |"
                % (fault, key, unit, fmt(key, statistics.median(values)), fmt(key, min(values)), fmt(key, max(values)))
            )
    if failed:
        print("\n%d run(s) failed (see above)" % failed)
        sys.exit(1)


def terminate(signum, frame):
    raise KeyboardInterrupt  # unwinds through each run's cleanup


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, terminate)
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
