#!/usr/bin/python3
"""The optimizer step on a network that behaves like a cluster's (not a test).

Issue "Step performance": overlap of communication and compute only shows when
the network is slower than loopback. This script (root, Linux, stdlib only):

 1. Builds a shaped network: a bridge msbr0 (10.77.0.1/24) in the root
    namespace and one network namespace ms-r<i> per rank, joined to the bridge
    by a veth pair (eth0 in the namespace, 10.77.0.<11+i>/24; ms-v<i> on the
    bridge). Each namespace's eth0 egress gets an htb class at --rate (its
    uplink) with a netem --delay leaf (one way; RTT = 2 x delay) where the
    kernel has sch_netem, and the bridge-side ms-v<i> egress the same rate
    (its downlink: a fan-in to one rank is bounded too) unless
    --no-ingress-shaping. A short TCP blast between two namespaces checks the
    rate (printed). Everything is named ms-*/msbr0, removed on exit and, under
    a lock, also on start (leftovers of a killed run).
 2. Starts a muonshard-coordinator in the root namespace on 10.77.0.1 and, per
    model and step mode, one muonshard-worker per rank in its namespace
    (ip netns exec, --hostname 10.77.0.<11+i>, /metrics on that address),
    SyntheticWorkload gradients, WARMUP + STEPS steps, --linger.
 3. Models: Qwen3-30B-A3B (its config.json fields, scaled by
    muonshard-scale-manifest: --moe-divisor 16 --moe-layers 2, ep 2) and a
    dense Llama-3.1-8B (/16, 2 layers, ep 1), both on --ranks 4.
 4. Step modes (worker flags; --modes picks them):
      sequential  --step-schedule sequential  (today's step)
      pipelined   --step-schedule pipelined   (the overlapped step)
      comm        --step-schedule pipelined --step-phases comm     (collectives only)
      compute     --step-schedule pipelined --step-phases compute  (compute only)
    A worker without --step-schedule runs "sequential" as it is (today's step)
    and cannot run the others (exit 2 before anything is set up).
 5. Times: each worker's /metrics is scraped once every rank has done WARMUP
    steps and again after the last; per rank the mean of
    muonshard_worker_step_seconds{phase="step"} over the steps in between
    (muonshard_worker_train_step_seconds where that phase is absent); a mode's
    figure is the slowest rank's (everyone waits for it).
 6. Wire bytes: TCP payload of the workers' Gloo connections, from the
    sockets' own counters (ss -tinp: bytes_acked sent, bytes_received), once
    every rank is lingering after its last step (the sockets stay open), over
    the whole run, divided by the steps run. The coordinator (gRPC) and
    /metrics connections are left out. Theory: the plan's buckets (muonshardctl
    get --output json) through the ring algorithms of
    worker/comm/internal/gloo_ring.h, per rank (rank r of an n-rank group):
      ReduceScatter (AdamW grads)  sum(counts) - counts[r] elements, fp32
      AllGather (AdamW params)     sum(counts) - counts[r+1] elements, dtype
      Reduce (Muon grads)          ring reduce-scatter of EvenCounts(numel, n)
                                   (numel - e[r]) + e[r] to the root unless
                                   r is the root, fp32
      Broadcast (Muon params)      numel x (children in the binomial tree), dtype
    With --step-piece-kib K the Muon rows count each piece of a bucket (NOTE
    [Step pieces] in worker/optimizer/internal/bucket_split.h) as a bucket.
    (reductions travel as fp32 whatever the gradient dtype). The difference is
    gloo's message headers and the connection setup; it is shown per transfer.
    The API bytes (muonshard_worker_comm_bytes_total) are checked against the
    plan's per-rank figures on the way.
 7. With --loopback (default) the same models also run on unshaped 127.0.0.1
    in the root namespace (as process_bench.sh) for the sequential and
    pipelined modes: the overlapped step must be no slower there.
    --loopback-only runs only these (no root, no namespaces; the ctest
    worker_shaped_net_loopback_smoke runs it with 2 steps).
 8. Every job prints how busy the machine's CPUs were between its two
    scrapes (/proc/stat, every process: on a shared machine, others too):
    on 2 cores with 4 ranks, near 2 means the step is CPU-bound.

Goals (issue): pipelined <= 1.15 x max(comm, compute) on the shaped network;
wire bytes = theory +-1 %; pipelined no slower than sequential on loopback.
They are reported; --check-goals makes a missed goal exit 1.

Exit: 0 done; 2 bad flags or cannot run here (not root, no ip netns, a
worker without the needed flags, another run holds the lock); 1 a run failed
(the workers' log tails are printed). Every wait is bounded; the whole run
by --max-seconds.

A rank that no collective holds back (compute mode) runs ahead of the
scrapes; its figure is then its mean over the whole run (marked *).
--repeats N runs every mode N times, round the modes, and the summary takes
the medians (the load on a shared machine drifts between jobs).

Usage: sudo /usr/bin/python3 bench/worker/shaped_net.py [--rate 2gbit] [--delay 0.1ms]
           [--modes sequential,pipelined,comm,compute] [--models moe,dense] [--no-loopback | --loopback-only]
           [--steps 10] [--warmup 2] [--repeats 1] [--ranks 4] [--policy seed] [--comm-buffer-mb MB]
           [--step-piece-kib K]
           [--max-seconds 1500] [--check-goals] [--network-only] [--build build] [--keep] [--trace]

--trace: the workers record every timed step's spans (NOTE [Step trace] in
worker/optimizer/step_stats.h); per job the script prints, per rank, the
medians of the step, the time some collective ran (union over the lanes),
the updates' time and how much of it ran while a collective did (the
overlap), and merges the ranks' files into <scratch>/<job>.trace.json.
"""

import argparse
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BRIDGE = "msbr0"
SUBNET = "10.77.0"
BRIDGE_IP = SUBNET + ".1"
NS_RE = re.compile(r"^ms-r\d+$")
LINK_RE = re.compile(r"^(ms-v\d+|ms-p\d+|msbr0)$")
LOCK_PATH = "/run/lock/muonshard-shaped-net.lock"

# Qwen3-30B-A3B's config.json, the parameter-shaping fields (as process_bench.sh embeds it).
QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "torch_dtype": "bfloat16",
    "_name_or_path": "Qwen/Qwen3-30B-A3B",
}
# Llama-3.1-8B's config.json, the parameter-shaping fields (a dense model).
LLAMA_DENSE = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "bfloat16",
    "_name_or_path": "meta-llama/Llama-3.1-8B",
}

MODE_FLAGS = {
    "sequential": ["--step-schedule", "sequential"],
    "pipelined": ["--step-schedule", "pipelined"],
    "comm": ["--step-schedule", "pipelined", "--step-phases", "comm"],
    "compute": ["--step-schedule", "pipelined", "--step-phases", "compute"],
}
DTYPE_BYTES = {"BF16": 2, "FP16": 2, "FP32": 4, "FP8": 1, "FP8_E4M3": 1, "FP8_E5M2": 1}


class Failure(Exception):
    """A run failed: exit 1 (with the workers' log tails)."""


class CannotRun(Exception):
    """Not runnable here (not root, no netns, missing worker flags): exit 2."""


class Interrupted(Exception):
    pass


# --------------------------------------------------------------------------- time bound


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds
        self.seconds = seconds

    def left(self):
        return self.end - time.monotonic()

    def bound(self, seconds):
        left = self.left()
        if left <= 0:
            raise Failure("--max-seconds (%g s) ran out" % self.seconds)
        return min(seconds, left)


DEADLINE = Deadline(3600)


def wait_until(predicate, seconds, what, check=None):
    """Polls predicate every 0.1 s for at most `seconds` (and the run's deadline)."""
    end = time.monotonic() + DEADLINE.bound(seconds)
    while True:
        if check is not None:
            check()
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            if DEADLINE.left() <= 0:
                raise Failure("--max-seconds (%g s) ran out waiting for %s" % (DEADLINE.seconds, what))
            raise Failure("timed out after %g s waiting for %s" % (seconds, what))
        time.sleep(0.1)


# --------------------------------------------------------------------------- processes


def _child_setup():
    # The child dies with this script even when it is killed with SIGKILL
    # (PR_SET_PDEATHSIG = 1); `ip netns exec` keeps it across its execve.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except Exception:
        pass


def child_env():
    env = dict(os.environ)
    for k in list(env):
        if k.lower() in ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "no_proxy"):
            del env[k]
    return env


def run(argv, timeout=30, check=True, ns=None, bounded=True):
    """Runs argv (in namespace `ns`), returns stdout; raises Failure on error when check.

    bounded: also by the run's deadline (not for the teardown, which must run
    after it)."""
    if ns is not None:
        argv = ["ip", "netns", "exec", ns] + argv
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=DEADLINE.bound(timeout) if bounded else timeout,
            env=child_env(),
            preexec_fn=_child_setup,
        )
    except subprocess.TimeoutExpired:
        raise Failure("timed out after %g s: %s" % (timeout, " ".join(argv))) from None
    if check and p.returncode != 0:
        raise Failure("%s: exit %d: %s" % (" ".join(argv), p.returncode, (p.stderr or p.stdout).strip()[-800:]))
    return p.stdout if check else p


class Proc:
    """A process this script started, its stderr+stdout in a log file."""

    def __init__(self, name, argv, log_path, ns=None):
        self.name = name
        self.log_path = log_path
        if ns is not None:
            argv = ["ip", "netns", "exec", ns] + argv
        self.argv = argv
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            preexec_fn=_child_setup,
        )

    def alive(self):
        return self.p.poll() is None

    def text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, n=15):
        return "\n".join("    " + line for line in self.text().splitlines()[-n:])

    def stop(self, grace=10):
        if self.p.poll() is None:
            try:
                self.p.send_signal(signal.SIGTERM)
                self.p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.p.kill()
                try:
                    self.p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            except ProcessLookupError:
                pass
        self.log.close()


# --------------------------------------------------------------------------- network


def parse_rate(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*(bit|kbit|mbit|gbit|tbit)?\s*", text.lower())
    if not m:
        raise ValueError("rate %r: expected a number with bit, kbit, mbit or gbit (e.g. 2gbit)" % text)
    scale = {None: 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}[m.group(2)]
    bps = float(m.group(1)) * scale
    if not 1e6 <= bps <= 1e11:
        raise ValueError("rate %r: must be between 1mbit and 100gbit" % text)
    return bps


def parse_delay(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*(us|ms|s)?\s*", text.lower())
    if not m:
        raise ValueError("delay %r: expected e.g. 0.1ms, 50us, 0" % text)
    seconds = float(m.group(1)) * {None: 1e-3, "us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
    if seconds > 1.0:
        raise ValueError("delay %r: at most 1 s" % text)
    return seconds


def ns_name(i):
    return "ms-r%d" % i


def ns_ip(i):
    return "%s.%d" % (SUBNET, 11 + i)


def teardown_network(kill_stale=False):
    """Removes every ms-r* namespace, ms-v*/ms-p* link and msbr0. Returns what it removed."""
    removed = []

    def do(argv):
        try:
            return run(argv, check=False, bounded=False)
        except Failure:  # a timed-out command: go on with the rest
            return subprocess.CompletedProcess(argv, 1, "", "")

    out = do(["ip", "netns", "list"]).stdout or ""
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if not NS_RE.match(name):
            continue
        if kill_stale:
            # Leftovers of a killed run of this script: only processes inside
            # its own namespaces.
            pids = (do(["ip", "netns", "pids", name]).stdout or "").split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    removed.append("pid %s in %s" % (pid, name))
                except (ValueError, ProcessLookupError, PermissionError):
                    pass
        do(["ip", "netns", "del", name])
        removed.append("netns " + name)
    out = do(["ip", "-o", "link", "show"]).stdout or ""
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        if LINK_RE.match(name):
            if do(["ip", "link", "del", name]).returncode == 0:
                removed.append("link " + name)
    return removed


def shape(dev, rate_bps, delay_s, netem, ns=None):
    """htb at rate_bps on dev's egress; a netem delay leaf if delay_s and netem, else a bfifo."""
    tc = ["tc"] if ns is None else ["ip", "netns", "exec", ns, "tc"]
    rate = "%dbit" % rate_bps
    # Bursts of at least a few GSO packets (64 KiB each: veth keeps GSO) and
    # ~1 ms at the rate, so that the class reaches its rate.
    burst = max(256 * 1024, int(rate_bps / 8 * 1e-3))
    run(tc + ["qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1"])
    run(
        tc
        + [
            "class",
            "add",
            "dev",
            dev,
            "parent",
            "1:",
            "classid",
            "1:1",
            "htb",
            "rate",
            rate,
            "ceil",
            rate,
            "burst",
            str(burst),
            "cburst",
            str(burst),
            "quantum",
            "65536",
        ]
    )
    if delay_s > 0 and netem:
        run(
            tc
            + [
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                "1:1",
                "handle",
                "10:",
                "netem",
                "delay",
                "%dus" % round(delay_s * 1e6),
                "limit",
                "100000",
            ]
        )
    else:
        # A switch-like buffer: ~4 ms at the rate (at least 1 MiB).
        run(
            tc
            + [
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                "1:1",
                "handle",
                "10:",
                "bfifo",
                "limit",
                str(max(1 << 20, int(rate_bps / 8 * 4e-3))),
            ]
        )


def netem_available():
    """Whether the kernel has sch_netem (tried on a throw-away veth)."""
    run(["ip", "link", "add", "ms-p999", "type", "veth", "peer", "name", "ms-v999"])
    try:
        p = run(["tc", "qdisc", "add", "dev", "ms-p999", "root", "netem", "delay", "100us"], check=False)
        return p.returncode == 0
    finally:
        run(["ip", "link", "del", "ms-p999"], check=False)


def setup_network(n, rate_bps, delay_s, ingress, netem):
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", BRIDGE_IP + "/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    for i in range(n):
        ns, host_end, ns_end = ns_name(i), "ms-v%d" % i, "ms-p%d" % i
        run(["ip", "netns", "add", ns])
        run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end])
        run(["ip", "link", "set", ns_end, "netns", ns])
        run(["ip", "-n", ns, "link", "set", ns_end, "name", "eth0"])
        run(["ip", "-n", ns, "addr", "add", ns_ip(i) + "/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run(["ip", "link", "set", host_end, "master", BRIDGE])
        run(["ip", "link", "set", host_end, "up"])
        # Uplink: the namespace's egress, with the one-way delay.
        shape("eth0", rate_bps, delay_s, netem, ns=ns)
        # Downlink: what the bridge sends into the namespace (no second delay).
        if ingress:
            shape(host_end, rate_bps, 0, False)
    # Every namespace reaches the bridge address (the coordinator's): a TCP
    # connect to a closed port there is refused at once when it does.
    py = sys.executable or "/usr/bin/python3"
    for i in range(n):
        wait_until(
            lambda i=i: run([py, "-c", REACH, BRIDGE_IP], ns=ns_name(i), check=False).returncode == 0,
            15,
            "ms-r%d to reach %s" % (i, BRIDGE_IP),
        )


REACH = r"""
import socket, sys
s = socket.socket(); s.settimeout(2)
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    pass
except OSError:
    sys.exit(1)
"""


RATE_SERVER = r"""
import json, socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); s.settimeout(float(sys.argv[2]))
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.settimeout(float(sys.argv[2])); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(int(sys.argv[3])):  # ping-pong: echo one byte
    c.sendall(c.recv(1))
n = 0; first = last = None; buf = bytearray(1 << 20)
while True:
    k = c.recv_into(buf)
    if not k: break
    now = time.monotonic()
    if first is None: first = now; k0 = k
    n += k; last = now
print(json.dumps({"bytes": n - k0, "seconds": last - first}), flush=True)
"""
RATE_CLIENT = r"""
import json, socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(int(sys.argv[4])):
    t = time.monotonic(); c.sendall(b"x"); c.recv(1); rtts.append(time.monotonic() - t)
rtts.sort()
end = time.monotonic() + float(sys.argv[3]); chunk = b"\0" * (1 << 20)
while time.monotonic() < end: c.sendall(chunk)
c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
print(json.dumps({"rtt_median": rtts[len(rtts) // 2]}), flush=True)
"""
PING_PONGS = 200


def rate_check(seconds, py):
    """One TCP connection ms-r0 -> ms-r1: the median round trip of one byte (idle
    link), then `seconds` of bulk: (payload Gbit/s at the receiver, RTT s)."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", ns_name(1), py, "-c", RATE_SERVER, ns_ip(1), str(seconds + 20), str(PING_PONGS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_child_setup,
    )
    try:
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise Failure("rate check: the receiver did not start: " + server.stderr.read()[-400:])
        client = run(
            [py, "-c", RATE_CLIENT, ns_ip(1), port, str(seconds), str(PING_PONGS)], ns=ns_name(0), timeout=seconds + 30
        )
        out, _err = server.communicate(timeout=DEADLINE.bound(30))
        result = json.loads(out.strip().splitlines()[-1])
        rtt = json.loads(client.strip().splitlines()[-1])["rtt_median"]
        return result["bytes"] * 8 / result["seconds"] / 1e9, rtt
    except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError) as e:
        raise Failure("rate check failed: %s" % e) from e
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)


# --------------------------------------------------------------------------- metrics and sockets

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)")
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(host, port):
    """{(name, ((label, value), ...)): value} of a Prometheus text page, or None."""
    try:
        with _OPENER.open("http://%s:%d/metrics" % (host, port), timeout=5) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        m = _SAMPLE_RE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = tuple(sorted((k, v) for k, v in _LABEL_RE.findall(m.group(3) or "") if k not in ("job", "rank")))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            pass
    return out


def metric(sample, name, **labels):
    return sample.get((name, tuple(sorted(labels.items()))), 0.0)


def has_metric(sample, name, **labels):
    return (name, tuple(sorted(labels.items()))) in sample


_SS_ADDR = re.compile(r"^(\[?[0-9a-fA-F:.%]+\]?):(\d+)$")


def socket_counters(pid, ns, exclude_peer_ports, exclude_local_ports, peer_ips):
    """Sum of bytes_acked / bytes_received over pid's TCP sockets to peer_ips (Gloo's), others left out."""
    out = run(["ss", "-tinpHO"], ns=ns, timeout=15)
    sent = received = retrans = sockets = 0
    for line in out.splitlines():
        if "pid=%d," % pid not in line:
            continue
        fields = line.split()
        if len(fields) < 6:
            continue
        local, peer = _SS_ADDR.match(fields[3]), _SS_ADDR.match(fields[4])
        if not local or not peer:
            continue
        if peer.group(1) not in peer_ips or int(peer.group(2)) in exclude_peer_ports:
            continue
        if int(local.group(2)) in exclude_local_ports:
            continue
        kv = dict(re.findall(r"\b(bytes_acked|bytes_received|bytes_retrans):(\d+)", line))
        sent += int(kv.get("bytes_acked", 0))
        received += int(kv.get("bytes_received", 0))
        retrans += int(kv.get("bytes_retrans", 0))
        sockets += 1
    return {"sent": sent, "received": received, "retrans": retrans, "sockets": sockets}


# --------------------------------------------------------------------------- theory


def even_counts(count, n):
    out = [count // n] * n
    for i in range(count % n):
        out[i] += 1
    return out


def tree_children(me, n):
    mask = 1
    while mask < n:
        if me & mask:
            break
        mask <<= 1
    children = 0
    mask >>= 1
    while mask > 0:
        if me + mask < n:
            children += 1
        mask >>= 1
    return children


def grad_bytes(plan):
    """Bytes per element of the plan's gradient buffers (policy.grad_dtype, FP32 unless set)."""
    return DTYPE_BYTES.get(plan.get("policy", {}).get("grad_dtype", "FP32"), 4)


def muon_pieces(bucket, grad_elem, max_bytes):
    """The buffer lengths of a Muon bucket's step pieces (NOTE [Step pieces] in
    worker/optimizer/internal/bucket_split.h: whole entries while their
    gradient bytes from the piece's start fit in max_bytes; 0: the bucket)."""
    numel = int(bucket["numel"])
    entries = bucket.get("entries", [])
    if max_bytes <= 0 or not entries:
        return [numel]
    starts = [0]
    for e in entries[1:]:
        offset = int(e.get("offset", 0))
        if (offset + int(e.get("numel", 0)) - starts[-1]) * grad_elem > max_bytes:
            starts.append(offset)
    return [end - begin for begin, end in zip(starts, starts[1:] + [numel], strict=True)]


def wire_theory(plan, piece_bytes=0):
    """Per global rank: {"bytes": sent per step, "transfers": data messages per step}, by the rings' algorithms."""
    groups = {g["id"]: [int(r) for r in g["ranks"]] for g in plan["groups"]}
    world = int(plan["topology"]["world_size"])
    sent = [0] * world
    transfers = [0] * world
    reduce_elem = 4  # reductions travel as fp32 (bf16/fp16 widened)

    def ring_send(k, counts, skip, elem):
        # Rank k of the ring sends every segment but `skip` (zero-length ones skipped).
        b = sum(c for j, c in enumerate(counts) if j != skip) * elem
        t = sum(1 for j, c in enumerate(counts) if j != skip and c > 0)
        return b, t

    grad_elem = grad_bytes(plan)
    for b in plan.get("muon_buckets", []):
        ranks = groups[b["group"]]
        n = len(ranks)
        if n < 2:
            continue
        elem = DTYPE_BYTES.get(b.get("dtype", "FP32"), 4)
        root = ranks.index(int(b["owner"]))
        for numel in muon_pieces(b, grad_elem, piece_bytes):
            e = even_counts(numel, n)
            for k, r in enumerate(ranks):
                # Reduce: ring reduce-scatter, then every segment to the root.
                by, t = ring_send(k, e, k, reduce_elem)
                if k != root and e[k] > 0:
                    by += e[k] * reduce_elem
                    t += 1
                # Broadcast: binomial tree from the root.
                c = tree_children((k - root) % n, n) if numel > 0 else 0
                sent[r] += by + c * numel * elem
                transfers[r] += t + c
    for b in plan.get("adamw_buckets", []):
        ranks = groups[b["group"]]
        n = len(ranks)
        if n < 2:
            continue
        offsets = [int(x) for x in b["shard_offsets"]]
        counts = [offsets[i + 1] - offsets[i] for i in range(n)]
        elem = DTYPE_BYTES.get(b.get("dtype", "FP32"), 4)
        for k, r in enumerate(ranks):
            by1, t1 = ring_send(k, counts, k, reduce_elem)  # ReduceScatter
            by2, t2 = ring_send(k, counts, (k + 1) % n, elem)  # AllGather
            sent[r] += by1 + by2
            transfers[r] += t1 + t2
    return [{"bytes": sent[r], "transfers": transfers[r]} for r in range(world)]


def plan_api_bytes(plan):
    """Per rank: the plan's API bytes per step by op, as muonshard_worker_comm_bytes_total labels them."""
    out = []
    for r in sorted(plan["ranks"], key=lambda x: int(x.get("rank", 0))):
        out.append(
            {
                "reduce": int(r.get("grad_reduce_bytes", 0)),
                "reduce_scatter": int(r.get("grad_reduce_scatter_bytes", 0)),
                "broadcast": int(r.get("param_broadcast_bytes", 0)),
                "all_gather": int(r.get("param_all_gather_bytes", 0)),
            }
        )
    return out


# --------------------------------------------------------------------------- a cluster per network


class Network:
    """Coordinator + hosts: the shaped namespaces or plain loopback."""

    def __init__(self, kind, a, work, ranks):
        self.kind = kind  # "shaped" | "loopback"
        self.a = a
        self.work = work
        self.ranks = ranks
        self.bin = a.bin
        self.coordinator = None
        self.address = None
        self.coord_host = BRIDGE_IP if kind == "shaped" else "127.0.0.1"

    def host(self, rank):
        return ns_ip(rank) if self.kind == "shaped" else "127.0.0.1"

    def ns(self, rank):
        return ns_name(rank) if self.kind == "shaped" else None

    def start(self):
        port_file = os.path.join(self.work, "coordinator-%s.port" % self.kind)
        self.coordinator = Proc(
            "coordinator",
            [
                os.path.join(self.bin, "muonshard-coordinator"),
                "--listen",
                self.coord_host + ":0",
                "--data-dir",
                os.path.join(self.work, "data-" + self.kind),
                "--metrics-port",
                "-1",
                "--port-file",
                port_file,
            ],
            os.path.join(self.work, "coordinator-%s.log" % self.kind),
        )

        def ready():
            if not self.coordinator.alive():
                raise Failure("the coordinator exited:\n" + self.coordinator.tail())
            try:
                with open(port_file) as f:
                    return json.load(f).get("grpc_port")
            except (OSError, ValueError):
                return None

        self.coord_port = int(wait_until(ready, 30, "the coordinator's port file"))
        self.address = "%s:%d" % (self.coord_host, self.coord_port)

    def submit(self, manifest, ep):
        out = run(
            [
                os.path.join(self.bin, "muonshardctl"),
                "submit",
                "--coordinator",
                self.address,
                "--manifest",
                manifest,
                "--world-size",
                str(self.ranks),
                "--ep",
                str(ep),
                "--policy",
                self.a.policy,
            ]
            + (["--tp", str(self.a.tp)] if self.a.tp > 1 else [])
            + (["--comm-buffer-mb", str(self.a.comm_buffer_mb)] if self.a.comm_buffer_mb else []),
            timeout=60,
        )
        m = re.search(r"^version\s+(\d+)", out, re.M)
        if not m:
            raise Failure("muonshardctl submit printed no version:\n" + out[-800:])
        version = int(m.group(1))
        plan = json.loads(
            run(
                [
                    os.path.join(self.bin, "muonshardctl"),
                    "get",
                    "--coordinator",
                    self.address,
                    "--version",
                    str(version),
                    "--output",
                    "json",
                ],
                timeout=60,
            )
        )
        return version, plan

    def close(self):
        if self.coordinator is not None:
            self.coordinator.stop()


FAILED_RE = re.compile(r"rank \d+: failed: ")


class Job:
    """One worker per rank for one (model, mode) on a network."""

    def __init__(self, net, model, mode, version, repeat=0):
        self.net = net
        self.model = model
        self.mode = mode
        a = net.a
        self.name = "%s-%s-%s-%d" % (model["key"], mode, net.kind, repeat)
        self.total_steps = a.warmup + a.steps
        self.cpu_busy = float("nan")
        self.workers = []
        self.ports = {}
        flags = a.mode_flags[mode]
        for r in range(net.ranks):
            port_file = os.path.join(net.work, "%s.w%d.port" % (self.name, r))
            argv = (
                [
                    os.path.join(a.bin, "muonshard-worker"),
                    "--coordinator",
                    net.address,
                    "--job",
                    self.name,
                    "--plan-version",
                    str(version),
                    "--rank",
                    str(r),
                    "--workload",
                    "synthetic",
                    "--steps",
                    str(self.total_steps),
                    "--hostname",
                    net.host(r),
                    "--metrics-host",
                    net.host(r),
                    "--metrics-port",
                    "0",
                    "--port-file",
                    port_file,
                    "--linger",
                    str(a.linger),
                    "--log-every",
                    "1000000",
                ]
                + flags
                + a.worker_arg
                + self.trace_flags()
            )
            self.workers.append(
                Proc("rank %d" % r, argv, os.path.join(net.work, "%s.w%d.log" % (self.name, r)), ns=net.ns(r))
            )
            self.workers[-1].port_file = port_file

    def trace_dir(self):
        return os.path.join(self.net.work, self.name + ".trace")

    def trace_flags(self):
        if not self.net.a.trace:
            return []
        return ["--step-trace-dir", self.trace_dir(), "--step-trace-steps", str(self.net.a.steps)]

    def check(self):
        for w in self.workers:
            if not w.alive():
                raise Failure("%s: %s exited (code %s) early" % (self.name, w.name, w.p.returncode))
            # A failed step is fatal here (no --max-restarts): say so at once.
            if FAILED_RE.search(w.text()):
                raise Failure("%s: %s reported a failed step" % (self.name, w.name))

    def metrics_ports(self):
        def ready():
            for r, w in enumerate(self.workers):
                if r in self.ports:
                    continue
                try:
                    with open(w.port_file) as f:
                        self.ports[r] = int(json.load(f)["metrics_port"])
                except (OSError, ValueError, KeyError):
                    return False
            return True

        wait_until(ready, 60, "%s: the workers' port files" % self.name, check=self.check)

    def scrape_all(self, min_steps, timeout, what):
        samples = {}

        def reached():
            for r in range(self.net.ranks):
                s = scrape(self.net.host(r), self.ports[r])
                if s is None or metric(s, "muonshard_worker_steps_total") < min_steps:
                    return False
                samples[r] = s
            return True

        wait_until(reached, timeout, "%s: %s" % (self.name, what), check=self.check)
        return [samples[r] for r in range(self.net.ranks)]

    def run(self):
        a = self.net.a
        self.metrics_ports()
        before = self.scrape_all(a.warmup, a.job_timeout, "%d warm-up step(s) on every rank" % a.warmup)
        cpu_before = cpu_jiffies()
        after = self.scrape_all(self.total_steps, a.job_timeout, "%d steps on every rank" % self.total_steps)
        self.cpu_busy = busy_cores(cpu_before, cpu_jiffies())
        # Every rank lingers (past RankSession::Finish's barriers): no Gloo
        # transfer is in flight, the sockets are still open.
        wait_until(
            lambda: all("serving /metrics" in w.text() for w in self.workers),
            60,
            "%s: every rank to finish" % self.name,
            check=self.check_finished,
        )
        wire = []
        peer_ips = {self.net.host(r) for r in range(self.net.ranks)}
        for r, w in enumerate(self.workers):
            wire.append(socket_counters(w.p.pid, self.net.ns(r), {self.net.coord_port}, {self.ports[r]}, peer_ips))
        final = [scrape(self.net.host(r), self.ports[r]) for r in range(self.net.ranks)]
        if any(f is None for f in final):
            raise Failure("%s: a worker's /metrics went away while lingering" % self.name)
        return before, after, final, wire

    def check_finished(self):
        for w in self.workers:
            if not w.alive() and "serving /metrics" not in w.text():
                raise Failure("%s: %s exited (code %s) early" % (self.name, w.name, w.p.returncode))

    def stop(self):
        for w in self.workers:
            if w.alive():
                try:
                    w.p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for w in self.workers:
            w.stop(grace=15)

    def tails(self):
        return "\n".join("--- %s (%s) ---\n%s" % (w.name, w.log_path, w.tail()) for w in self.workers)


# --------------------------------------------------------------------------- figures


def cpu_jiffies():
    """(busy, total) jiffies of the whole machine (/proc/stat's cpu line)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return sum(v) - idle, sum(v)


def busy_cores(b, e):
    """Cores busy on average between two cpu_jiffies() readings (any process: the machine's load)."""
    total = e[1] - b[1]
    return (e[0] - b[0]) / total * (os.cpu_count() or 1) if total > 0 else float("nan")


def step_means(b, e, names):
    """(steps, mean seconds of each of names[i] = (metric, labels)) between samples b and e."""
    first, labels = names[0]
    n = metric(e, first + "_count", **labels) - metric(b, first + "_count", **labels)
    return n, [
        (metric(e, m + "_sum", **labels) - metric(b, m + "_sum", **labels)) / n if n else float("nan")
        for m, labels in names
    ]


def per_rank(before, after, final, wire, plan, mode, steps, piece_bytes):
    """Per-rank figures of one job."""
    rows = []
    theory = wire_theory(plan, piece_bytes)
    api = plan_api_bytes(plan)
    for r, (b, e, f) in enumerate(zip(before, after, final, strict=True)):
        step_name = "muonshard_worker_step_seconds"
        if has_metric(e, step_name + "_count", phase="step"):
            source, first = 'step_seconds{phase="step"}', (step_name, {"phase": "step"})
        else:
            source, first = "train_step_seconds", ("muonshard_worker_train_step_seconds", {})
        names = [first] + [(step_name, {"phase": ph}) for ph in ("reduce", "orthogonalise", "adamw", "sync")]
        n, means = step_means(b, e, names)
        whole_run = False
        if n < max(1, steps // 2):
            # A rank that no collective holds back (--step-phases compute)
            # runs ahead of the scrapes: its mean over the whole run instead.
            n, means = step_means({}, f, names)
            whole_run = True
        steps_run = metric(f, "muonshard_worker_steps_total")
        api_per_step = {
            op: metric(f, "muonshard_worker_comm_bytes_total", op=op) / steps_run if steps_run else 0
            for op in ("reduce", "reduce_scatter", "broadcast", "all_gather")
        }
        expect_wire = 0 if mode == "compute" else theory[r]["bytes"]
        expect_api = {op: 0 for op in api[r]} if mode == "compute" else api[r]
        rows.append(
            {
                "rank": r,
                "timed": int(n),
                "whole_run": whole_run,
                "step_ms": 1e3 * means[0],
                "source": source,
                "phases": {
                    ph: 1e3 * v for ph, v in zip(("reduce", "orthogonalise", "adamw", "sync"), means[1:], strict=True)
                },
                "steps_run": int(steps_run),
                "sent": wire[r]["sent"] / steps_run if steps_run else float("nan"),
                "received": wire[r]["received"] / steps_run if steps_run else float("nan"),
                "retrans": wire[r]["retrans"],
                "sockets": wire[r]["sockets"],
                "theory": expect_wire,
                "transfers": 0 if mode == "compute" else theory[r]["transfers"],
                "api_ok": all(abs(api_per_step[op] - expect_api[op]) < 0.5 for op in expect_api),
            }
        )
    return rows


def pct(measured, theory):
    return 100.0 * (measured - theory) / theory if theory else float("nan")


def fmt_ms(v):
    return "%.1f" % v if v == v else "n/a"


def print_job(title, rows, shaped):
    print(title)
    print(
        "  %-4s %5s %9s %8s %8s %8s %8s %13s %13s %8s %7s"
        % (
            "rank",
            "timed",
            "step_ms",
            "reduce",
            "orthog",
            "adamw",
            "sync",
            "sent_MB/step",
            "theory_MB",
            "diff%",
            "retrMB",
        )
    )
    for x in rows:
        p = x["phases"]
        print(
            "  %-4d %5s %9.1f %8.1f %8.1f %8.1f %8.1f %13.4f %13.4f %8s %7.2f"
            % (
                x["rank"],
                "%d%s" % (x["timed"], "*" if x["whole_run"] else ""),
                x["step_ms"],
                p["reduce"],
                p["orthogonalise"],
                p["adamw"],
                p["sync"],
                x["sent"] / 1e6,
                x["theory"] / 1e6,
                ("%+.3f" % pct(x["sent"], x["theory"])) if x["theory"] else "%+.0fB" % x["sent"],
                x["retrans"] / 1e6,
            )
        )
    sent = sum(x["sent"] for x in rows)
    recv = sum(x["received"] for x in rows)
    theory = sum(x["theory"] for x in rows)
    transfers = sum(x["transfers"] for x in rows)
    # A rank that ran ahead of the scrapes did most of its steps while the
    # others did their warm-up: it is not the slowest (and its whole-run
    # mean carries the slow first steps), so it is left out here.
    held = [x for x in rows if not x["whole_run"]] or rows
    slow = max((x["step_ms"] for x in held if x["step_ms"] == x["step_ms"]), default=float("nan"))
    if any(x["whole_run"] for x in rows):
        print(
            "  *: this rank ran ahead of the scrapes (nothing holds it back): its mean over the whole run, "
            "warm-up included; not taken as the slowest"
        )
    line = "  slowest rank %.1f ms/step (%s); job wire %.4f MB/step sent, %.4f received, theory %.4f" % (
        slow,
        rows[0]["source"],
        sent / 1e6,
        recv / 1e6,
        theory / 1e6,
    )
    if theory:
        line += " (%+.3f %%; %+.0f B per transfer over %d transfers/step)" % (
            pct(sent, theory),
            (sent - theory) / transfers if transfers else 0,
            transfers,
        )
    print(line)
    print(
        "  API bytes (muonshard_worker_comm_bytes_total) = the plan's per rank: %s"
        % ("yes" if all(x["api_ok"] for x in rows) else "NO")
    )
    return {
        "step_ms": slow,
        "sent": sent,
        "theory": theory,
        "per_rank_max_abs_pct": max(
            (abs(pct(x["sent"], x["theory"])) for x in rows if x["theory"]), default=float("nan")
        ),
    }


def union_length(intervals):
    """Total length covered by [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def overlap_length(a, b):
    """Length of (union of a) intersected with (union of b)."""
    return union_length(a) + union_length(b) - union_length(a + b)


def trace_rows(events):
    """Per traced step of one rank: (step ms, collectives' union ms, updates ms, updates under a collective ms)."""
    by_step = {}
    for e in events:
        if e.get("ph") == "X":
            by_step.setdefault(e["args"]["step"], []).append(e)
    rows = []
    for _step, evs in sorted(by_step.items()):

        def span(e):
            return (e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3)

        total = sum(e["dur"] for e in evs if e["cat"] == "step") / 1e3
        comm = [span(e) for e in evs if e["cat"] in ("reduce", "sync")]
        upd = [span(e) for e in evs if e["cat"] == "update"]
        rows.append((total, union_length(comm), union_length(upd), overlap_length(comm, upd)))
    return rows


def print_trace(job, ranks):
    """NOTE [Step trace]: per rank the medians over the timed steps, and one merged trace file."""
    merged = []
    print(
        "  step trace (medians over the timed steps): step ms | collectives busy ms (any lane) | updates ms | "
        "updates while a collective runs"
    )
    for r in range(ranks):
        path = os.path.join(job.trace_dir(), "step-trace-rank%d.json" % r)
        try:
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        except (OSError, ValueError, KeyError) as e:
            print("  rank %d: no step trace (%s)" % (r, e))
            continue
        merged.extend(events)
        rows = trace_rows(events)
        if not rows:
            continue
        med = [statistics.median(x[i] for x in rows) for i in range(4)]
        share = sum(x[3] for x in rows) / sum(x[2] for x in rows) if sum(x[2] for x in rows) >= 0.1 else None
        print(
            "  rank %d: %7.1f | %7.1f | %7.1f | %7.1f ms (%s)"
            % (
                r,
                med[0],
                med[1],
                med[2],
                med[3],
                "%.0f %% of all steps' updates" % (100 * share) if share is not None else "no update time",
            )
        )
    out = os.path.join(job.net.work, job.name + ".trace.json")
    with open(out, "w") as f:
        json.dump({"displayTimeUnit": "ms", "traceEvents": merged}, f)
    print("  trace of every rank: %s" % out)


# --------------------------------------------------------------------------- main


def worker_flags_supported(bin_dir):
    p = run([os.path.join(bin_dir, "muonshard-worker"), "--help"], check=False, timeout=30)
    text = (p.stdout or "") + (p.stderr or "")
    return ("--step-schedule" in text, "--step-phases" in text, "--step-piece-kib" in text, "--step-trace-dir" in text)


def prepare_models(a, work):
    models = []
    for key in a.models:
        if key == "moe":
            cfg, divisor, layers, ep = QWEN3_MOE, a.moe_divisor, a.moe_layers, a.ep
        else:
            cfg, divisor, layers, ep = LLAMA_DENSE, a.dense_divisor, a.dense_layers, 1
        path = os.path.join(work, key + ".config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        full = os.path.join(work, key + ".full.json")
        with open(full, "w") as f:
            f.write(
                run(
                    [os.path.join(a.bin, "muonshardctl"), "import-hf", path]
                    + (["--tp", str(a.tp)] if a.tp > 1 else []),
                    timeout=120,
                )
            )
        manifest = os.path.join(work, key + ".manifest.json")
        with open(manifest, "w") as f:
            f.write(
                run(
                    [
                        os.path.join(a.bin, "muonshard-scale-manifest"),
                        "--manifest",
                        full,
                        "--divisor",
                        str(divisor),
                        "--layers",
                        str(layers),
                    ],
                    timeout=120,
                )
            )
        models.append(
            {
                "key": key,
                "manifest": manifest,
                "ep": ep,
                "divisor": divisor,
                "layers": layers,
                "label": "%s (/%d, %d layers, ep %d%s)"
                % (cfg["_name_or_path"].split("/")[-1], divisor, layers, ep, ", tp %d" % a.tp if a.tp > 1 else ""),
            }
        )
    return models


def run_network(kind, a, work, models, modes, results, failures):
    net = Network(kind, a, work, a.ranks)
    try:
        net.start()
        for model in models:
            version, plan = net.submit(model["manifest"], model["ep"])
            # Repeats go round the modes, so a change of load hits them alike.
            for rep, mode in [(rep, mode) for rep in range(a.repeats) for mode in modes]:
                job = Job(net, model, mode, version, rep)
                try:
                    before, after, final, wire = job.run()
                except Failure as e:
                    failures.append(
                        "%s: %s\n%s\n--- coordinator ---\n%s" % (job.name, e, job.tails(), net.coordinator.tail())
                    )
                    raise
                finally:
                    job.stop()
                rows = per_rank(before, after, final, wire, plan, mode, a.steps, a.piece_bytes)
                grad_elem = grad_bytes(plan)
                pieces = sum(len(muon_pieces(b, grad_elem, a.piece_bytes)) for b in plan.get("muon_buckets", []))
                title = "%s, %s network, mode %s%s%s (plan: %d Muon buckets in %d pieces + %d AdamW buckets):" % (
                    model["label"],
                    kind,
                    mode,
                    "" if a.mode_flags[mode] else " (today's step: no flag)",
                    ", repeat %d of %d" % (rep + 1, a.repeats) if a.repeats > 1 else "",
                    len(plan.get("muon_buckets", [])),
                    pieces,
                    len(plan.get("adamw_buckets", [])),
                )
                results.setdefault((model["key"], kind, mode), []).append(print_job(title, rows, kind == "shaped"))
                print(
                    "  machine CPU between the scrapes (timed steps; every process): %.2f of %d cores busy"
                    % (job.cpu_busy, os.cpu_count() or 0)
                )
                if a.trace:
                    print_trace(job, a.ranks)
                sys.stdout.flush()
    finally:
        net.close()


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Muon+AdamW step on a shaped network (namespaces + veth + tc htb); needs root.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--rate", default="2gbit", help="per-rank link rate, each way (default 2gbit)")
    p.add_argument("--delay", default="0.1ms", help="one-way added latency (netem; default 0.1ms)")
    p.add_argument(
        "--no-ingress-shaping",
        dest="ingress",
        action="store_false",
        help="shape only each namespace's egress (default: both ways)",
    )
    p.add_argument(
        "--modes",
        default="sequential,pipelined,comm,compute",
        help="comma-separated step modes: sequential, pipelined, comm, compute",
    )
    p.add_argument("--models", default="moe,dense", help="comma-separated: moe (Qwen3-30B-A3B), dense (Llama-3.1-8B)")
    p.add_argument(
        "--loopback",
        dest="loopback",
        action="store_true",
        default=True,
        help="also run sequential/pipelined on unshaped 127.0.0.1 (default)",
    )
    p.add_argument("--no-loopback", dest="loopback", action="store_false")
    p.add_argument(
        "--loopback-only",
        action="store_true",
        help="only the loopback runs: no namespaces, no shaping (sequential/pipelined of --modes)",
    )
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--ep", type=int, default=2, help="expert-parallel degree of the MoE model (default 2)")
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor parallelism (Megatron's splits; the wire theory leaves the TP exchanges out)",
    )
    p.add_argument("--moe-divisor", type=int, default=16)
    p.add_argument("--moe-layers", type=int, default=2)
    p.add_argument("--dense-divisor", type=int, default=16)
    p.add_argument("--dense-layers", type=int, default=2)
    p.add_argument("--policy", default="seed", choices=["seed", "seed-all", "balanced"])
    p.add_argument(
        "--comm-buffer-mb",
        type=int,
        default=0,
        help="fusion bucket size for the plans (default: the planner's, 256 MiB)",
    )
    p.add_argument(
        "--step-piece-kib",
        type=int,
        default=0,
        help="the workers' --step-piece-kib: Muon buckets cut into pieces of at most this many KiB "
        "(default 0: the plan's buckets)",
    )
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="jobs per model and mode, round the modes; the summary takes medians (default 1)",
    )
    p.add_argument("--rate-check-seconds", type=float, default=2.0, help="TCP blast length (0: skip)")
    p.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra flag for every worker (repeat; e.g. --worker-arg=--blas-threads=1)",
    )
    p.add_argument("--job-timeout", type=float, default=300, help="seconds one job may take to reach a scrape")
    p.add_argument("--max-seconds", type=float, default=1500, help="bound on the whole run (default 1500)")
    p.add_argument("--check-goals", action="store_true", help="exit 1 when a goal is missed")
    p.add_argument(
        "--network-only", action="store_true", help="set the network up, run the rate check, tear it down (no workers)"
    )
    p.add_argument("--build", default=os.environ.get("BUILD_DIR", "build"), help="build directory (default build)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, plans)")
    p.add_argument(
        "--trace",
        action="store_true",
        help="the workers' --step-trace-dir over the timed steps: per job an overlap table and "
        "<scratch>/<job>.trace.json (all ranks; chrome://tracing, Perfetto; --keep keeps it)",
    )
    a = p.parse_args(argv)
    try:
        a.rate_bps = parse_rate(a.rate)
        a.delay_s = parse_delay(a.delay)
    except ValueError as e:
        p.error(str(e))
    a.modes = [m for m in a.modes.split(",") if m]
    a.models = [m for m in a.models.split(",") if m]
    bad = [m for m in a.modes if m not in MODE_FLAGS] + [m for m in a.models if m not in ("moe", "dense")]
    if bad or not a.modes or not a.models:
        p.error("unknown or empty --modes/--models: %s" % ", ".join(bad))
    if len(set(a.modes)) != len(a.modes) or len(set(a.models)) != len(a.models):
        p.error("--modes/--models repeat an entry")
    if not 2 <= a.ranks <= 64:
        p.error("--ranks must be in [2, 64]")
    if a.loopback_only and not a.loopback:
        p.error("--loopback-only and --no-loopback exclude each other")
    if a.loopback_only and a.network_only:
        p.error("--loopback-only and --network-only exclude each other")
    if a.loopback_only and not [m for m in a.modes if m in ("sequential", "pipelined")]:
        p.error("--loopback-only runs the sequential and pipelined modes: --modes names neither")
    if a.steps < 1 or a.warmup < 1 or not 1 <= a.repeats <= 20:
        p.error("--steps and --warmup must be >= 1, --repeats in [1, 20]")
    if min(a.moe_divisor, a.moe_layers, a.dense_divisor, a.dense_layers, a.ep, a.tp) < 1:
        p.error("divisors, layers, --ep and --tp must be >= 1")
    if a.ranks % a.ep or a.ranks % a.tp:
        p.error("--ep and --tp must divide --ranks")
    if a.comm_buffer_mb < 0:
        p.error("--comm-buffer-mb must be >= 0")
    if a.step_piece_kib < 0:
        p.error("--step-piece-kib must be >= 0")
    if a.max_seconds <= 0 or a.job_timeout <= 0 or a.rate_check_seconds < 0:
        p.error("--max-seconds and --job-timeout must be > 0, --rate-check-seconds >= 0")
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    a.bin = os.path.join(build, "bin")
    a.linger = int(a.max_seconds) + 60  # ended by SIGTERM once sampled
    return a


def preflight(a):
    if not a.loopback_only:
        preflight_network()
    preflight_worker(a)


def preflight_network():
    if os.geteuid() != 0:
        raise CannotRun(
            "needs root (network namespaces, veth, tc): run it as root, e.g. sudo /usr/bin/python3 %s"
            % os.path.relpath(__file__)
        )
    for tool in ("ip", "tc", "ss"):
        if shutil.which(tool) is None:
            raise CannotRun("needs `%s` (iproute2) on PATH" % tool)
    p = run(["ip", "netns", "list"], check=False)
    if p.returncode != 0:
        raise CannotRun("`ip netns` is not available here: %s" % (p.stderr or "").strip())


def preflight_worker(a):
    for b in ("muonshard-coordinator", "muonshardctl", "muonshard-worker", "muonshard-scale-manifest"):
        if not os.access(os.path.join(a.bin, b), os.X_OK):
            raise CannotRun(
                "missing %s: ninja -C %s muonshard-coordinator muonshardctl muonshard-worker "
                "muonshard-scale-manifest" % (os.path.join(a.bin, b), os.path.relpath(os.path.dirname(a.bin), ROOT))
            )
    schedule, phases, pieces, traces = worker_flags_supported(a.bin)
    if a.trace and not traces:
        raise CannotRun("this muonshard-worker has no --step-trace-dir: run without --trace")
    if not pieces and a.step_piece_kib != 0:
        raise CannotRun(
            "this muonshard-worker has no --step-piece-kib (its step runs the plan's buckets): pass --step-piece-kib 0"
        )
    a.piece_bytes = a.step_piece_kib * 1024
    if a.step_piece_kib:
        a.worker_arg = ["--step-piece-kib", str(a.step_piece_kib)] + a.worker_arg
    a.mode_flags = {}
    for m in set(a.modes) | {"sequential", "pipelined"}:
        flags = MODE_FLAGS[m]
        if not schedule:
            if m == "sequential":
                flags = []  # today's step, the only one this worker has
            elif m in a.modes:
                raise CannotRun(
                    "this muonshard-worker has no --step-schedule: mode %s needs it (--modes "
                    "sequential runs today's step)" % m
                )
        if "--step-phases" in flags and not phases and m in a.modes:
            raise CannotRun("this muonshard-worker has no --step-phases: mode %s needs it" % m)
        a.mode_flags[m] = flags


def shaped_summary(a, k, get, netem):
    """The shaped network's line for model k; False when the overlap goal is missed."""
    seq, pip, com, cmp_ = (get(k, "shaped", m) for m in ("sequential", "pipelined", "comm", "compute"))
    print(
        "    shaped (%s each way, %s): sequential %s | pipelined %s | comm %s | compute %s"
        % (
            a.rate,
            ("delay %s" % a.delay) if netem and a.delay_s > 0 else "no added delay",
            fmt_ms(seq),
            fmt_ms(pip),
            fmt_ms(com),
            fmt_ms(cmp_),
        )
    )
    bound = max(com, cmp_) if com == com and cmp_ == cmp_ else float("nan")
    r1 = pip / bound if bound == bound and pip == pip else float("nan")
    r2 = pip / seq if pip == pip and seq == seq else float("nan")
    print(
        "    pipelined / max(comm, compute) = %s (goal <= 1.15); pipelined / sequential = %s"
        % ("%.3f" % r1 if r1 == r1 else "n/a", "%.3f" % r2 if r2 == r2 else "n/a")
    )
    return not (r1 == r1 and r1 > 1.15)


def summary(a, models, results, netem):
    print()
    print(
        'summary (slowest rank\'s ms per step%s; goals of issue "Step performance")'
        % (", median of %d repeats" % a.repeats if a.repeats > 1 else "")
    )
    ok = True

    def get(key, kind, mode):
        v = sorted(x["step_ms"] for x in results.get((key, kind, mode), []) if x["step_ms"] == x["step_ms"])
        if not v:
            return float("nan")
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    for model in models:
        k = model["key"]
        print("  %s" % model["label"])
        if not a.loopback_only:
            ok = shaped_summary(a, k, get, netem) and ok
        if a.loopback:
            lseq, lpip = get(k, "loopback", "sequential"), get(k, "loopback", "pipelined")
            r3 = lpip / lseq if lpip == lpip and lseq == lseq else float("nan")
            print(
                "    loopback: sequential %s | pipelined %s; pipelined / sequential = %s (goal <= 1.00)"
                % (fmt_ms(lseq), fmt_ms(lpip), "%.3f" % r3 if r3 == r3 else "n/a")
            )
            if r3 == r3 and r3 > 1.0:
                ok = False
        for mode in a.modes:
            runs = [x for x in results.get((k, "shaped", mode), []) if x["theory"]]
            if not runs:
                continue
            # The repeat furthest from the theory (they agree to the byte so far).
            res = max(runs, key=lambda x: abs(pct(x["sent"], x["theory"])))
            d = pct(res["sent"], res["theory"])
            print(
                "    wire bytes, %s: %.4f MB/step measured vs %.4f theory (%+.3f %%; worst rank %.3f %%; "
                "goal +-1 %%)" % (mode, res["sent"] / 1e6, res["theory"] / 1e6, d, res["per_rank_max_abs_pct"])
            )
            if abs(d) > 1.0:
                ok = False
    return ok


def set_up_shaped_network(a):
    """Builds the shaped network (step 1 above) and checks its rate; whether netem delays it."""
    netem = netem_available()
    if a.delay_s > 0 and not netem:
        print(
            "note: this kernel has no sch_netem: no added delay (the --delay %s is not applied); "
            "latency is the veth + bridge path's own" % a.delay
        )
    setup_network(a.ranks, a.rate_bps, a.delay_s, a.ingress, netem)
    leaf = ("netem delay %s" % a.delay) if netem and a.delay_s > 0 else "bfifo"
    print(
        "network: bridge %s (%s/24), %d namespaces ms-r0..ms-r%d (%s.11..%d), veth pairs; tc htb rate %s "
        "(+ %s leaf) on each namespace's egress%s"
        % (
            BRIDGE,
            BRIDGE_IP,
            a.ranks,
            a.ranks - 1,
            SUBNET,
            10 + a.ranks,
            a.rate,
            leaf,
            " and on the bridge side (ingress)" if a.ingress else "",
        )
    )
    if a.rate_check_seconds > 0:
        g, rtt = rate_check(a.rate_check_seconds, sys.executable or "/usr/bin/python3")
        # Full-size frames: 1448 payload bytes of 1514 on the wire (timestamps on).
        print(
            "rate check: one TCP flow ms-r0 -> ms-r1 for %.1f s: %.3f Gbit/s payload = %.1f %% of %s "
            "(%.1f %% with Ethernet/IP/TCP headers); idle round trip (1 byte, median of %d) %.0f us"
            % (
                a.rate_check_seconds,
                g,
                100 * g * 1e9 / a.rate_bps,
                a.rate,
                100 * g * 1e9 / a.rate_bps * 1514 / 1448,
                PING_PONGS,
                rtt * 1e6,
            )
        )
    return netem


def main(argv):
    a = parse_args(argv)
    global DEADLINE
    DEADLINE = Deadline(a.max_seconds)
    try:
        preflight(a)
    except CannotRun as e:
        print("shaped_net.py: %s" % e, file=sys.stderr)
        return 2

    os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
    lock = open(LOCK_PATH, "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("shaped_net.py: another run holds %s" % LOCK_PATH, file=sys.stderr)
        return 2

    def on_signal(signum, frame):
        raise Interrupted("signal %d" % signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    work = tempfile.mkdtemp(prefix="muonshard-shaped.")
    failures = []
    results = {}
    rc = 1
    try:
        stale = [] if a.loopback_only else teardown_network(kill_stale=True)
        if stale:
            print("removed leftovers of an earlier run: " + ", ".join(stale))
        netem = False
        if not a.loopback_only:
            netem = set_up_shaped_network(a)
            if a.network_only:
                return 0
        models = prepare_models(a, work)
        lmodes = [m for m in ("sequential", "pipelined") if m in a.modes]
        print(
            "workers: %d ranks, synthetic workload, %d warm-up + %d timed steps, policy %s; modes %s%s"
            % (
                a.ranks,
                a.warmup,
                a.steps,
                a.policy,
                ", ".join(lmodes if a.loopback_only else a.modes),
                " (loopback only)" if a.loopback_only else "",
            )
        )
        sys.stdout.flush()
        if not a.loopback_only:
            print()
            run_network("shaped", a, work, models, a.modes, results, failures)
        if a.loopback and lmodes:
            print()
            run_network("loopback", a, work, models, lmodes, results, failures)
        ok = summary(a, models, results, netem)
        rc = 0 if ok or not a.check_goals else 1
        if not ok:
            print("some goals are missed" + ("" if a.check_goals else " (reported only; --check-goals fails on them)"))
    except (Failure, Interrupted) as e:
        print("shaped_net.py: %s: %s" % ("FAILED" if isinstance(e, Failure) else "interrupted", e), file=sys.stderr)
        for f in failures:
            print(f, file=sys.stderr)
        rc = 1 if isinstance(e, Failure) else 130
    finally:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        removed = [] if a.loopback_only else teardown_network()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("kept %s" % work)
        if removed:
            print("torn down: %d namespaces and links" % len(removed))
        lock.close()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
