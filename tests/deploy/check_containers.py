#!/usr/bin/env python3
"""deploy_containers: the images built and docker-compose.yml run for real
with podman (ctest label `containers`).

1. Images: scripts/images.sh builds the coordinator, tools, CPU worker and
   Prometheus (Debian's package) images from the binaries of this build tree
   on a Debian base made with debootstrap (cached by content; podman caches
   the layers), and runs each binary in its image.
2. The stack: docker-compose (the Debian 12 docker-compose 1.29) against
   podman's Docker-compatible API socket brings up docker-compose.yml as users
   do (`up -d` of the coordinator with its SQLite volume, the plan
   submission, the 4 CPU workers and Prometheus; Grafana's image is not
   built here). Only these settings differ, through docker-compose.yml's own
   variables: free loopback host ports, MUONSHARD_DEMO_STEPS,
   MUONSHARD_DEMO_CHECKPOINT_EVERY, MUONSHARD_DEMO_REDUCE_ORDER (rank) and
   MUONSHARD_DEMO_DUMP_PARAMS; and tests/deploy/compose.containers.yml
   names the Prometheus image built in step 1.
3. Checks, with bounded waits: every scrape target is up and every rank
   steps; Prometheus's HTTP API returns the per-rank imbalance
   (muonshard_worker_plan_memory_imbalance_ratio) and step-phase
   (muonshard_worker_step_seconds) series of every rank; the coordinator
   container restarted (`podman restart`, which gives it another address
   under its name) with its volume adopts the running job (the same
   generation, all 4 ranks back, "adopted" in its log, steps go on); then,
   after a checkpoint, a worker container's process killed with SIGKILL is
   restarted by the restart policy and the job recovers by itself (the
   survivors re-form the group, --max-restarts, and every rank restores the
   checkpoint) (MUONSHARD_CONTAINERS_FAULT_ORDER=crash-first: the other
   order); training finishes on every rank, and its final
   fp32 parameters (rank 0's --dump-params, in the checkpoint volume) equal
   those of the unsharded reference run of the same steps
   (`muonshard-worker --reference` on the host against the stack's
   coordinator, then `muonshard-compare-params --rtol 1e-5`, the demo's
   bound; the log says whether they are bit-identical, which the rank-order
   reduction and an exact recovery make them); `docker-compose down -v`
   leaves no container, volume or network of the project and frees the
   ports.

The workers sum gradients in rank order (MUONSHARD_DEMO_REDUCE_ORDER=rank,
as scripts/demo.sh and the fault-tolerance tests do): with Gloo's ring order
the regression workload's bf16 forward pass amplifies last-ulp summation
differences step after step (NOTE [Process tolerance] in
tests/worker/worker_process_test.cc), so no tolerance would be justified.

Limits of THIS TEST ENVIRONMENT (nothing a user deploys depends on them):
- OCI runtimes here may not set rlimits ("setrlimit RLIMIT_NOFILE: Operation
  not permitted"). When a probe container fails so, podman runs with
  tests/deploy/oci-runtime-no-rlimits.sh as its runtime (runc without
  process.rlimits).
- Without systemd, podman schedules no health checks (it uses systemd
  timers); the test runs `podman healthcheck run` on the coordinator every
  2 s, which is what the timer would do, so `depends_on: service_healthy`
  works as with Docker.
- `podman kill` marks the container as stopped by the user, and podman's
  restart policies then leave it down (Docker restarts it); a crash is what
  the policy is for, so the test SIGKILLs the container's main process (as
  the OOM killer or a crash would) rather than calling `podman kill`.

Skips (77) only when podman or docker-compose is not installed
(scripts/install-deps.sh installs both)."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "oci-runtime-no-rlimits.sh")
OVERRIDE = os.path.join(HERE, "compose.containers.yml")
JOB = "tiny-moe"
WORLD = 4
SERVICES = ["coordinator", "submit-plan"] + [f"worker-{r}" for r in range(WORLD)] + ["prometheus"]
# Long enough for the coordinator restart and the worker kill to land while
# training runs; checkpoints along the way for the killed rank to resume from.
# About 1 step/s on a busy 2-core machine.
STEPS = int(os.environ.get("MUONSHARD_CONTAINERS_STEPS", "100"))
CHECKPOINT_EVERY = int(os.environ.get("MUONSHARD_CONTAINERS_CHECKPOINT_EVERY", "20"))
# Rank 0's merged dump of the final fp32 parameters, in the workers' shared
# checkpoint volume (every rank writes its part file next to it).
DUMP_IN_CONTAINER = "/var/lib/muonshard/checkpoints/final-params.safetensors"
# The demo's bound (scripts/demo.sh): max |a - e| / max |e| per tensor.
RTOL = "1e-5"
# restart-first (default): coordinator restart, then worker crash;
# crash-first: the other way round (see run_stack).
FAULT_ORDER = os.environ.get("MUONSHARD_CONTAINERS_FAULT_ORDER", "restart-first")
T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f} s] {msg}", flush=True)


class Stack:
    def __init__(self, c, scratch):
        self.c = c
        self.scratch = scratch
        self.project = f"msct{os.getpid()}"
        self.podman = ["podman"]
        self.service = None
        self.sock = os.path.join(scratch, "podman.sock")
        self.ports = {
            "MUONSHARD_COORDINATOR_PORT": dc.free_port(),
            "MUONSHARD_COORDINATOR_METRICS_PORT": dc.free_port(),
            "MUONSHARD_PROMETHEUS_PORT": dc.free_port(),
            "MUONSHARD_GRAFANA_PORT": dc.free_port(),
        }
        self.env = dict(
            os.environ,
            DOCKER_HOST=f"unix://{self.sock}",
            COMPOSE_PROJECT_NAME=self.project,
            MUONSHARD_DEMO_STEPS=str(STEPS),
            MUONSHARD_DEMO_CHECKPOINT_EVERY=str(CHECKPOINT_EVERY),
            MUONSHARD_DEMO_REDUCE_ORDER="rank",
            MUONSHARD_DEMO_DUMP_PARAMS=DUMP_IN_CONTAINER,
            **{k: str(v) for k, v in self.ports.items()},
        )
        self.env.pop("COMPOSE_FILE", None)
        self.stop_pump = threading.Event()
        self.pump = None
        self.reference = None  # the unsharded reference run (Popen)
        self.prom = f"http://127.0.0.1:{self.ports['MUONSHARD_PROMETHEUS_PORT']}"
        self.coord = f"127.0.0.1:{self.ports['MUONSHARD_COORDINATOR_PORT']}"

    # ------------------------------------------------------------ engine
    def pod(self, *args, timeout=60, check=False):
        r = dc.run(self.podman + list(args), timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: {r.stderr.strip()[-800:]}")
        return r

    def compose(self, *args, timeout=240):
        argv = ["docker-compose", "-f", os.path.join(dc.REPO, "docker-compose.yml"), "-f", OVERRIDE, *args]
        return subprocess.run(argv, cwd=dc.REPO, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start_service(self):
        out = open(os.path.join(self.scratch, "podman-service.log"), "w")
        self.service = subprocess.Popen(
            self.podman + ["system", "service", "--time=0", f"unix://{self.sock}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=dc._die_with_parent,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.service.poll() is not None:
                raise RuntimeError(f"podman system service exited {self.service.returncode}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(2)
                    s.connect(self.sock)
                    s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
                    if b"OK" in s.recv(4096):
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError("podman's API socket did not answer /_ping within 30 s")

    def containers(self, service=None, all_=True):
        args = ["ps", "--format", "{{.Names}}", "--filter", f"label=com.docker.compose.project={self.project}"]
        if all_:
            args.append("-a")
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        return self.pod(*args, check=True).stdout.split()

    def container(self, service):
        names = self.containers(service)
        if len(names) != 1:
            raise RuntimeError(f"service {service}: containers {names}")
        return names[0]

    def inspect(self, name):
        return json.loads(self.pod("inspect", name, check=True).stdout)[0]

    def _pump_health(self):
        # What podman's systemd timer would do (see the module docstring).
        while not self.stop_pump.wait(2):
            try:
                for name in self.containers("coordinator", all_=False):
                    self.pod("healthcheck", "run", name, timeout=20)
            except Exception as e:  # the next round retries
                log(f"health pump: {e}")

    def start_health_pump(self):
        self.pump = threading.Thread(target=self._pump_health, daemon=True)
        self.pump.start()

    def logs(self, service, tail=None):
        args = ["logs"] + (["--tail", str(tail)] if tail else []) + [self.container(service)]
        r = self.pod(*args)
        return r.stdout + r.stderr

    def dump_logs(self):
        for s in SERVICES:
            try:
                print(f"----- {s} (last 25 lines)\n{self.logs(s, 25)}")
            except Exception as e:
                print(f"----- {s}: {e}")

    # ------------------------------------------------------------ clients
    def query(self, promql):
        url = f"{self.prom}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r}: {body}")
        return body["data"]["result"]

    def ctl(self, *args, timeout=20):
        return dc.run([os.path.join(dc.bin_dir(), "muonshardctl"), *args, "--coordinator", self.coord], timeout=timeout)

    def workers(self):
        r = self.ctl("workers", "--job", JOB, "--output", "json", "--timeout", "15")
        if r.returncode != 0:
            raise RuntimeError(f"muonshardctl workers: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def start_reference(self):
        """The same training unsharded in one host process (plain Muon +
        AdamW; the plan fetched from the stack's coordinator once, at its
        start), in the background while the stack trains: its dump is
        scratch/reference.safetensors. The same workload, steps, lr and seed
        as the compose workers (their defaults)."""
        self.reference_dump = os.path.join(self.scratch, "reference.safetensors")
        self.reference_log = os.path.join(self.scratch, "reference.log")
        argv = [os.path.join(dc.bin_dir(), "muonshard-worker"), "--reference", "--coordinator", self.coord]
        argv += ["--plan-version", "latest", "--workload", "regression", "--steps", str(STEPS)]
        # One BLAS thread: less contention on a small machine (the result does
        # not depend on it: the demo's workers and reference differ in it too).
        argv += ["--blas-threads", "1", "--log-every", "25", "--dump-params", self.reference_dump]
        self.reference = subprocess.Popen(
            argv,
            stdout=open(self.reference_log, "w"),
            stderr=subprocess.STDOUT,
            preexec_fn=dc._die_with_parent,
        )

    def close(self):
        self.stop_pump.set()
        if self.reference is not None and self.reference.poll() is None:
            self.reference.kill()
            self.reference.wait(timeout=10)
        if self.service is not None:
            try:
                self.compose("down", "-v", "-t", "5", timeout=120)
            except Exception as e:
                log(f"cleanup: docker-compose down: {e}")
            for name in self.containers() if self.service.poll() is None else []:
                self.pod("rm", "-f", "-t", "0", name)
            r = self.pod("volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={self.project}")
            for v in r.stdout.split():
                self.pod("volume", "rm", "-f", v)
            self.pod("network", "rm", "-f", f"{self.project}_default")
            self.service.terminate()
            try:
                self.service.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(timeout=10)


def wait_for(what, fn, timeout, interval=1.0):
    """fn() until it returns a true value; RuntimeError naming `what` (and the
    last result or error) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            got = fn()
            if got:
                return got
            last = got
        except Exception as e:  # not up yet
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what} (last: {str(last)[:600]})")
        time.sleep(interval)


def ranks_of(result):
    return sorted(int(s["metric"].get("rank", -1)) for s in result)


def steps_by_rank(stack):
    out = {}
    for s in stack.query(f'muonshard_worker_steps_total{{job="{JOB}"}}'):
        out[int(s["metric"]["rank"])] = float(s["value"][1])
    return out


def progressed(stack, before, by):
    """Every rank's steps_total (this process's steps) moved by `by` since
    `before` (a restarted process starts from 0: counted as moved once it
    passed `by`)."""
    now = steps_by_rank(stack)
    ok = len(now) == WORLD and all(
        v >= before.get(r, 0) + by or (v < before.get(r, 0) and v >= by) for r, v in now.items()
    )
    return now if ok else None


def engine_or_skip():
    if shutil.which("podman") is None:
        dc.skip("podman is not installed (scripts/install-deps.sh installs podman, runc and debootstrap)")
    if shutil.which("docker-compose") is None:
        dc.skip("docker-compose is not installed (scripts/install-deps.sh installs it)")
    if os.geteuid() != 0:
        dc.skip("needs root: the base image is made with debootstrap and the stack runs in rootful podman")


def needs_shim(base, scratch):
    """True when this machine's OCI runtime cannot set rlimits (the sandbox
    limit the shim works around); the probe's error otherwise."""
    r = dc.run(["podman", "run", "--rm", "--network", "none", base, "true"], timeout=60)
    if r.returncode == 0:
        return False
    if "rlimit" in r.stderr.lower():
        probe = dc.run(["podman", "--runtime", SHIM, "run", "--rm", "--network", "none", base, "true"], timeout=60)
        if probe.returncode != 0:
            raise RuntimeError(f"podman run with {SHIM} fails too: {probe.stderr.strip()[-500:]}")
        return True
    raise RuntimeError(f"podman run {base} true: {r.stderr.strip()[-500:]}")


def main():
    engine_or_skip()
    c = dc.Checker("deploy_containers")
    bins = dc.bin_dir()
    for b in ("muonshard-coordinator", "muonshard-worker", "muonshardctl"):
        if not os.access(os.path.join(bins, b), os.X_OK):
            c.check(False, f"{bins}/{b} is not built")
            c.finish()
    timings = {}
    with dc.scratch_run(c, "muonshard-containers-") as scratch:
        # ---------------------------------------------------------- images
        t = time.monotonic()
        r = dc.run([os.path.join(dc.REPO, "deploy", "images", "base-image.sh")], timeout=600)
        if not c.check(r.returncode == 0, f"base image: {r.stderr.strip()[-1500:]}"):
            c.finish()
        base = r.stdout.strip().splitlines()[-1]
        shim = needs_shim(base, scratch)
        if shim:
            log(f"NOTE: this machine's OCI runtime cannot set rlimits: podman runs with {SHIM} (test-only)")
        argv = [os.path.join(dc.REPO, "scripts", "images.sh"), "--bin-dir", bins] + (
            ["--runtime", SHIM] if shim else []
        )
        r = dc.run(argv, timeout=600)
        print(r.stderr.strip())
        if not c.check(r.returncode == 0, "scripts/images.sh builds and smoke-tests every image"):
            c.finish()
        timings["images"] = time.monotonic() - t
        log(f"images ready in {timings['images']:.0f} s")

        stack = Stack(c, scratch)
        if shim:
            stack.podman += ["--runtime", SHIM]
        try:
            run_stack(c, stack, timings)
        except Exception:
            stack.dump_logs()
            raise
        finally:
            stack.close()
    log("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    c.finish()


def run_stack(c, stack, timings):
    t = time.monotonic()
    stack.start_service()
    stack.start_health_pump()
    r = stack.compose("up", "-d", "--no-build", *SERVICES, timeout=240)
    if not c.check(r.returncode == 0, f"docker-compose up -d: {r.stderr.strip()[-1500:]}"):
        raise RuntimeError("the stack did not come up")
    log("docker-compose up -d: done")

    # Ports: only on 127.0.0.1.
    for name in stack.containers():
        for port, binds in (stack.inspect(name).get("HostConfig", {}).get("PortBindings") or {}).items():
            for b in binds or []:
                c.check(b.get("HostIp") == "127.0.0.1", f"{name} publishes {port} on {b.get('HostIp')!r}")

    # Every target scraped, every rank stepping.
    up = wait_for(
        "Prometheus: the coordinator and 4 workers up",
        lambda: (lambda res: res if len(res) == WORLD + 1 and all(s["value"][1] == "1" for s in res) else None)(
            stack.query("up")
        ),
        timeout=90,
    )
    c.check(len(up) == WORLD + 1, f"5 scrape targets up: {[s['metric'].get('instance') for s in up]}")
    first = wait_for(
        "every rank stepping (muonshard_worker_steps_total > 0)",
        lambda: (lambda s: s if len(s) == WORLD and min(s.values()) > 0 else None)(steps_by_rank(stack)),
        timeout=90,
    )
    timings["up+first steps"] = time.monotonic() - t
    log(f"training: steps by rank {first}")
    # The plan is the job's (one submission): the reference fetches it now,
    # before the coordinator restart, and trains on its own meanwhile.
    stack.start_reference()
    log("reference run started (muonshard-worker --reference, in the background)")

    # Per-rank series through Prometheus's HTTP API.
    imb = wait_for(
        "the per-rank imbalance series",
        lambda: (lambda res: res if ranks_of(res) == list(range(WORLD)) else None)(
            stack.query(f'muonshard_worker_plan_memory_imbalance_ratio{{job="{JOB}"}}')
        ),
        timeout=30,
    )
    c.check(ranks_of(imb) == list(range(WORLD)), f"imbalance series for ranks 0..3: {ranks_of(imb)}")
    c.check(all(float(s["value"][1]) >= 0 for s in imb), f"imbalance values: {[s['value'][1] for s in imb]}")
    phases = wait_for(
        "the step-phase series of every rank",
        lambda: (lambda res: res if len({s["metric"]["rank"] for s in res}) == WORLD else None)(
            stack.query(f'sum by (rank, phase) (muonshard_worker_step_seconds_count{{job="{JOB}"}})')
        ),
        timeout=30,
    )
    by_rank = {}
    for s in phases:
        by_rank.setdefault(int(s["metric"]["rank"]), set()).add(s["metric"]["phase"])
    c.check(sorted(by_rank) == list(range(WORLD)), f"step-phase series for ranks 0..3: {sorted(by_rank)}")
    common = set.intersection(*by_rank.values()) if by_rank else set()
    c.check({"step", "reduce"} <= common, f"every rank has the step and reduce phases: {by_rank}")
    log(f"Prometheus: imbalance {[s['value'][1] for s in imb]}, phases {sorted(common)}")

    # ------------------------------------------------ faults
    # MUONSHARD_CONTAINERS_FAULT_ORDER=crash-first puts the worker crash
    # before the coordinator restart: the order in which a rank once missed
    # the adoption grace (docs/deploy.md: a stuck heartbeat and gRPC's DNS
    # re-resolution delay, both bounded in client/ since; it passed once).
    if FAULT_ORDER == "crash-first":
        crash_worker(c, stack, timings)
        restart_coordinator(c, stack, timings)
    else:
        restart_coordinator(c, stack, timings)
        crash_worker(c, stack, timings)

    # ------------------------------------------------ the end of training
    t = time.monotonic()
    done = wait_for(
        f"every rank finished {STEPS} steps",
        lambda: (lambda logs: logs if all("trained " in text for text in logs.values()) else None)(
            {r: stack.logs(f"worker-{r}", 40) for r in range(WORLD)}
        ),
        timeout=max(240, 3 * STEPS),
        interval=3,
    )
    rank0 = done[0]
    c.check(f"{STEPS}/{STEPS}" in rank0 or re.search(rf"\bstep {STEPS}\b", rank0), f"rank 0 logged step {STEPS}")
    timings["training to the end"] = time.monotonic() - t
    for r in range(WORLD):
        info = stack.inspect(stack.container(f"worker-{r}"))
        c.check(info["State"]["Running"], f"worker-{r} lingers (serves /metrics) after training")
    log("training finished on every rank")

    # ------------------------------------------------ equal to the reference
    t = time.monotonic()
    wrote = wait_for(
        "rank 0's merged parameter dump",
        lambda: re.search(
            r"wrote (\d+) tensors \(fp32 masters\) to " + re.escape(DUMP_IN_CONTAINER), stack.logs("worker-0")
        ),
        timeout=60,
    )
    mount = stack.pod(
        "volume", "inspect", f"{stack.project}_worker-checkpoints", "--format", "{{.Mountpoint}}", check=True
    ).stdout.strip()
    actual = os.path.join(mount, os.path.basename(DUMP_IN_CONTAINER))
    c.check(os.path.isfile(actual), f"the dump is in the checkpoint volume: {actual}")
    try:
        rc = stack.reference.wait(timeout=max(120, 4 * STEPS))
    except subprocess.TimeoutExpired:
        rc = None
    with open(stack.reference_log) as f:
        ref_log = f.read()
    c.check(rc == 0, f"the reference run finished (exit {rc}): {ref_log.strip()[-800:]}")
    if rc == 0:
        r = dc.run(
            [os.path.join(dc.bin_dir(), "muonshard-compare-params"), actual, stack.reference_dump, "--rtol", RTOL],
            timeout=120,
        )
        summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()
        c.check(
            r.returncode == 0,
            f"the containers' final parameters ({wrote.group(1)} tensors) equal the unsharded reference within "
            f"rtol {RTOL}: {r.stdout.strip()[-1500:]} {r.stderr.strip()[-500:]}",
        )
        log(f"compare with the reference: {summary}")
    timings["reference + compare (after training)"] = time.monotonic() - t

    # ------------------------------------------------ down
    t = time.monotonic()
    r = stack.compose("down", "-v", "-t", "10", timeout=180)
    c.check(r.returncode == 0, f"docker-compose down -v: {r.stderr.strip()[-800:]}")
    left = stack.containers()
    c.check(not left, f"no container of the project left: {left}")
    vols = stack.pod(
        "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={stack.project}"
    ).stdout.split()
    c.check(not vols, f"no volume of the project left: {vols}")
    nets = stack.pod("network", "ls", "--format", "{{.Name}}").stdout.split()
    c.check(f"{stack.project}_default" not in nets, f"the project's network is gone: {nets}")
    for k, port in stack.ports.items():
        with socket.socket() as s:
            s.settimeout(1)
            c.check(s.connect_ex(("127.0.0.1", port)) != 0, f"nothing listens on {k} {port} after down")
    timings["down"] = time.monotonic() - t


def restart_coordinator(c, stack, timings):
    """`podman restart` of the coordinator container: the job is adopted at
    its generation (every rank re-registers within the adoption grace, two
    heartbeat timeouts) and training goes on."""
    t = time.monotonic()
    if any("trained " in stack.logs(f"worker-{r}", 5) for r in range(WORLD)):
        raise RuntimeError(f"training ended before the coordinator restart: raise MUONSHARD_CONTAINERS_STEPS ({STEPS})")
    before = wait_for("muonshardctl workers (before the restart)", stack.workers, timeout=60)
    gen_before = job_generation(before)
    coord = stack.container("coordinator")
    info = stack.inspect(coord)
    coord_id_before = info["Id"]
    ip_before = container_ips(info)
    r = stack.pod("restart", "-t", "10", coord, timeout=60)
    c.check(r.returncode == 0, f"podman restart {coord}: {r.stderr.strip()}")
    wait_for("the restarted coordinator healthy", lambda: stack.ctl("health", "--timeout", "3").returncode == 0, 60)
    healthy = time.monotonic()
    info = stack.inspect(coord)
    c.check(info["Id"] == coord_id_before, "the coordinator restarted in place (its volume kept)")
    # podman gives the restarted container another address under the same
    # name: the workers must re-resolve it (client/coordinator_channel.h).
    log(f"coordinator address {ip_before} before the restart, {container_ips(info)} after")
    after = wait_for(
        "all 4 ranks re-registered with the restarted coordinator",
        lambda: (lambda w: w if len(alive_ranks(w)) == WORLD else None)(stack.workers()),
        timeout=60,
    )
    log(f"all {WORLD} ranks re-registered {time.monotonic() - healthy:.1f} s after the coordinator was healthy")
    c.check(
        job_generation(after) == gen_before,
        f"the job adopted at its generation {gen_before} (now {job_generation(after)})",
    )
    adopted = wait_for(
        "the coordinator's log: every rank adopted",
        lambda: (lambda n: n if n >= WORLD else None)(
            stack.logs("coordinator").count("(adopted after a coordinator restart)")
        ),
        timeout=30,
    )
    c.check(adopted == WORLD, f"the restarted coordinator adopted {adopted} ranks (its log)")
    s0 = steps_by_rank(stack)
    wait_for("training going on after the coordinator restart", lambda: progressed(stack, s0, 5), timeout=60)
    timings["coordinator restart"] = time.monotonic() - t
    log(f"coordinator restarted: job adopted at generation {gen_before}")


def crash_worker(c, stack, timings):
    """After a checkpoint, worker-2's process SIGKILLed: its restart policy
    restarts it, the group re-forms and resumes from the checkpoint."""
    t = time.monotonic()
    victim = stack.container("worker-2")
    info = stack.inspect(victim)
    restarts0 = info.get("RestartCount", 0)
    pid = info["State"]["Pid"]
    c.check(pid > 0, f"{victim} runs (pid {pid})")
    # After a checkpoint: the group must resume from it.
    if any("trained " in stack.logs(f"worker-{r}", 5) for r in range(WORLD)):
        raise RuntimeError(f"training ended before the worker crash: raise MUONSHARD_CONTAINERS_STEPS ({STEPS})")
    wait_for(
        "rank 0's first checkpoint",
        lambda: re.search(r"checkpoint of step \d+ committed", stack.logs("worker-0")),
        timeout=120,
    )
    s0 = steps_by_rank(stack)
    os.kill(pid, 9)
    log(f"SIGKILL to {victim}'s process {pid}")
    wait_for(
        f"{victim} restarted by its restart policy",
        lambda: (lambda i: i if i.get("RestartCount", 0) > restarts0 and i["State"]["Running"] else None)(
            stack.inspect(victim)
        ),
        timeout=60,
    )
    wait_for(
        "the group re-formed (muonshard_worker_restarts_total >= 1 on the survivors)",
        lambda: (lambda res: res if sum(1 for s in res if float(s["value"][1]) >= 1) >= WORLD - 1 else None)(
            stack.query(f'muonshard_worker_restarts_total{{job="{JOB}"}}')
        ),
        timeout=120,
    )
    wait_for("training going on after the worker crash", lambda: progressed(stack, s0, 5), timeout=120)
    resumed = [int(s) for s in re.findall(r"continuing from step (\d+)", stack.logs("worker-0"))]
    c.check(
        resumed and resumed[-1] >= CHECKPOINT_EVERY,
        f"the group restored a checkpoint (rank 0 continued from step {resumed[-1] if resumed else None})",
    )
    timings["worker crash + recovery"] = time.monotonic() - t
    log(f"{victim} restarted and the job recovered")


def container_ips(info):
    """The container's addresses on its networks (from podman inspect)."""
    nets = (info.get("NetworkSettings") or {}).get("Networks") or {}
    return sorted(n.get("IPAddress", "") for n in nets.values())


def _jobs(workers_json):
    # ListWorkersResponse as proto3 JSON: {"jobs": [{"job", "generation",
    # "workers": [{"rank", "state", ...}]}]}; zero values are left out.
    return [j for j in workers_json.get("jobs", []) if j.get("job") == JOB]


def job_generation(workers_json):
    """The job's generation from `muonshardctl workers --output json`."""
    jobs = _jobs(workers_json)
    if len(jobs) != 1:
        raise RuntimeError(f"job {JOB} not listed: {str(workers_json)[:400]}")
    return int(jobs[0].get("generation", 0))


def alive_ranks(workers_json):
    """Ranks of the job in state JOINED."""
    return sorted(
        int(w.get("rank", 0))
        for j in _jobs(workers_json)
        for w in j.get("workers", [])
        if w.get("state") == "WORKER_STATE_JOINED"
    )


if __name__ == "__main__":
    main()
