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
    rate (printed), with the CPU it took per byte (the machine's busy cores
    over the payload rate; with --nodes also one flow on a node's own lo).
    Everything is named ms-*/msbr0, removed on exit and, under a lock, also
    on start (leftovers of a killed run).
    --nodes N (two-host emulation; N >= 2 dividing --ranks): N namespaces
    ms-n<k> (10.77.0.<11+k>) act as N machines, node k holding the ranks
    k*P..k*P+P-1 (P = ranks / N) on its one address. A node's ranks reach each
    other over its own lo (unshaped: the same address in one namespace), and
    every byte between nodes crosses the node's eth0 and the bridge, shaped as
    above (--rate, --delay, ingress): each node has one link, as a machine's NIC.
 2. Starts a muonshard-coordinator in the root namespace on 10.77.0.1 and, per
    model and step mode, one muonshard-worker per rank in its namespace
    (ip netns exec, --hostname 10.77.0.<11+i>, /metrics on that address; with
    --nodes its node's namespace and address, /metrics on a free port each),
    SyntheticWorkload gradients, WARMUP + STEPS steps, --linger.
 3. Models: Qwen3-30B-A3B (its config.json fields, scaled by
    muonshard-scale-manifest: --moe-divisor 16 --moe-layers 2, ep 2) and a
    dense Llama-3.1-8B (/16, 2 layers, ep 1), both on --ranks (default 4; with
    --nodes 2 --ranks 8 each expert group has two ranks on each node).
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
                                   r is the root, fp32; two ranks: numel
                                   from the other rank to the root
      Broadcast (Muon params)      numel x (children in the binomial tree), dtype
    With --step-piece-kib K the Muon rows count each piece of a bucket (NOTE
    [Step pieces] in worker/optimizer/internal/bucket_split.h) as a bucket.
    (reductions travel as fp32 whatever the gradient dtype). The difference is
    gloo's message headers and the connection setup; it is shown per transfer.
    The API bytes (muonshard_worker_comm_bytes_total) are checked against the
    plan's per-rank figures on the way.
    With --nodes the same sockets are split by the peer's address: inter-node
    bytes (peers on another node: the shaped links) and intra-node (the node's
    own address: lo), summed over ranks per step, each against its theory
    (flat rings: a ring step, tree edge or send to the root is inter-node when
    its two global ranks are on different nodes).
 7. With --loopback (default) the same models also run on unshaped 127.0.0.1
    in the root namespace (as process_bench.sh) for the sequential and
    pipelined modes: the overlapped step must be no slower there.
    --loopback-only runs only these (no root, no namespaces; the ctest
    worker_shaped_net_loopback_smoke runs it with 2 steps), and every mode of
    --modes: the comm-only figure on loopback is what the ranks' CPUs move
    over a machine's lo (bench/sim/validate_shaped_net.py fits a node's lo
    on it).
 8. Every job prints how busy the machine's CPUs were between its two
    scrapes (/proc/stat, every process: on a shared machine, others too):
    on 2 cores with 4 ranks, near 2 means the step is CPU-bound.
 9. --collectives flat,hierarchical (with --nodes; default: flat only, today's
    plan and workers): a bench dimension. Both variants run one plan per model,
    submitted with --gpus-per-node P (the topology's gpus_per_node): flat
    workers get --collectives flat (placement-oblivious rings on that plan: the
    same owners and balance), hierarchical ones --collectives hierarchical
    where the worker's --help lists that value, else no flag (the plan's nodes
    decide). Needs a muonshard-worker with --collectives and a muonshardctl
    submit with --gpus-per-node (checked only then; exit 2 without). Theory of
    the hierarchical collectives (a group of n ranks, p on each of its m = n/p
    nodes, local index l = position among the group's ranks on its node;
    "local": a node's ranks, "cross": the ranks of one local index, by node;
    each level the flat algorithms above, reductions fp32):
      Reduce(root R)      local Reduce to the rank of R's local index, then
                          cross Reduce among those to R's node
      Broadcast(root R)   cross Broadcast from R, then local Broadcast from
                          that rank on every node
      ReduceScatter       local ReduceScatter of the buffer permuted into parts
                          l = the (node k, index l) segments over k (counts:
                          their sums), then cross ReduceScatter of part l
                          (counts: the (k, l) segments')
      AllGather           cross AllGather, then local AllGather
    A group not spread evenly over its nodes, on one node, or with one rank
    per node runs flat. Only the cross level crosses nodes. The summary puts
    flat and hierarchical side by side per model and mode: step time (slowest
    rank), inter-node bytes per step, and hierarchical / flat of those bytes.

Goals (issue): pipelined <= 1.15 x max(comm, compute) on the shaped network;
wire bytes = theory +-1 % (with --nodes also the inter-node bytes); pipelined
no slower than sequential on loopback; with --collectives flat,hierarchical:
hierarchical / flat inter-node bytes per step <= 0.70 (>= 30 % fewer). They
are reported; --check-goals makes a missed goal exit 1.

Exit: 0 done; 2 bad flags or cannot run here (not root, no ip netns, a
worker or muonshardctl without the needed flags, another run holds the
lock); 1 a run failed (the workers' log tails are printed). Every wait is
bounded; the whole run by --max-seconds.

A rank that no collective holds back (compute mode) runs ahead of the
scrapes; its figure is then its mean over the whole run (marked *).
--repeats N runs every mode N times, round the modes, and the summary takes
the medians (the load on a shared machine drifts between jobs).

Usage: sudo /usr/bin/python3 bench/worker/shaped_net.py [--rate 2gbit] [--delay 0.1ms]
           [--modes sequential,pipelined,comm,compute] [--models moe,dense] [--no-loopback | --loopback-only]
           [--steps 10] [--warmup 2] [--repeats 1] [--ranks 4] [--policy seed] [--comm-buffer-mb MB]
           [--muon-reduce owner|scatter-rounds]
           [--step-piece-kib K] [--nodes N [--collectives flat,hierarchical]]
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
NS_RE = re.compile(r"^ms-[rn]\d+$")  # ms-r<rank> (a namespace per rank), ms-n<node> (--nodes)
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


def ns_name(i, node=False):
    """The namespace of rank i (ms-r<i>), or of node i with --nodes (ms-n<i>)."""
    return ("ms-n%d" if node else "ms-r%d") % i


def ns_ip(i):
    return "%s.%d" % (SUBNET, 11 + i)


def teardown_network(kill_stale=False):
    """Removes every ms-r*/ms-n* namespace, ms-v*/ms-p* link and msbr0. Returns what it removed."""
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


def setup_network(n, rate_bps, delay_s, ingress, netem, nodes=False):
    """n namespaces on the bridge: one per rank (ms-r<i>), or one per node with nodes (ms-n<i>)."""
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", BRIDGE_IP + "/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    for i in range(n):
        ns, host_end, ns_end = ns_name(i, nodes), "ms-v%d" % i, "ms-p%d" % i
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
            lambda i=i: run([py, "-c", REACH, BRIDGE_IP], ns=ns_name(i, nodes), check=False).returncode == 0,
            15,
            "%s to reach %s" % (ns_name(i, nodes), BRIDGE_IP),
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


def rate_check(seconds, py, nodes=False, inside=False):
    """One TCP connection ms-r0 -> ms-r1 (ms-n0 -> ms-n1 with nodes; with inside, ms-n0 to
    its own address: a node's lo): the median round trip of one byte (idle link), then
    `seconds` of bulk: (payload Gbit/s at the receiver, RTT s, cores busy meanwhile)."""
    to = 0 if inside else 1
    server = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns_name(to, nodes),
            py,
            "-c",
            RATE_SERVER,
            ns_ip(to),
            str(seconds + 20),
            str(PING_PONGS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_child_setup,
    )
    try:
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise Failure("rate check: the receiver did not start: " + server.stderr.read()[-400:])
        before = cpu_jiffies()  # the receiver is up: its start is not counted, the sender's is
        client = run(
            [py, "-c", RATE_CLIENT, ns_ip(to), port, str(seconds), str(PING_PONGS)],
            ns=ns_name(0, nodes),
            timeout=seconds + 30,
        )
        out, _err = server.communicate(timeout=DEADLINE.bound(30))
        busy = busy_cores(before, cpu_jiffies())
        result = json.loads(out.strip().splitlines()[-1])
        rtt = json.loads(client.strip().splitlines()[-1])["rtt_median"]
        return result["bytes"] * 8 / result["seconds"] / 1e9, rtt, busy
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


def hierarchy(ranks, node_of):
    """(local, cross) of a group for the hierarchical collectives, or None when it runs flat.

    ranks: the group's global ranks in group-rank order. local[k]: the ranks of
    the group's k-th node (nodes in ascending order), in group-rank order; cross[l]:
    the ranks of local index l, one per node, ordered by node. None unless every
    node of the group holds the same number p >= 2 of its ranks on m >= 2 nodes."""
    by_node = {}
    for r in ranks:
        by_node.setdefault(node_of(r), []).append(r)
    local = [by_node[k] for k in sorted(by_node)]
    p = len(local[0])
    if len(local) < 2 or p < 2 or any(len(x) != p for x in local):
        return None
    return local, [[x[lr] for x in local] for lr in range(p)]


class WireTally:
    """Bytes and data messages each global rank sends, split by where the receiver is."""

    def __init__(self, world, node_of):
        self.node_of = node_of
        self.sent = [0] * world
        self.transfers = [0] * world
        self.inter = [0] * world  # to a rank on another node

    def send(self, src, dst, nbytes):
        if nbytes <= 0:  # zero-length segments are skipped on both sides
            return
        self.sent[src] += nbytes
        self.transfers[src] += 1
        if self.node_of(src) != self.node_of(dst):
            self.inter[src] += nbytes

    # The algorithms of worker/comm/internal/gloo_ring.h over `rs` (global ranks
    # in the collective's rank order: ring step i -> i+1).
    def reduce_scatter(self, rs, counts, elem):
        n = len(rs)
        for k in range(n):
            for s in range(n - 1):  # step s: the partial sum of segment k-1-s to the right
                self.send(rs[k], rs[(k + 1) % n], counts[(k - 1 - s) % n] * elem)

    def all_gather(self, rs, counts, elem):
        n = len(rs)
        for k in range(n):
            for s in range(n - 1):  # step s: segment k-s to the right
                self.send(rs[k], rs[(k + 1) % n], counts[(k - s) % n] * elem)

    def reduce(self, rs, numel, root, elem):
        if len(rs) == 2:  # ReduceOfTwo: the other rank's buffer straight to the root
            self.send(rs[1 - root], rs[root], numel * elem)
            return
        e = even_counts(numel, len(rs))
        self.reduce_scatter(rs, e, elem)
        for k in range(len(rs)):
            if k != root:
                self.send(rs[k], rs[root], e[k] * elem)

    def broadcast(self, rs, numel, root, elem):
        n = len(rs)
        for k in range(n):
            me = (k - root) % n
            mask = 1
            while mask < n and not me & mask:
                mask <<= 1
            mask >>= 1
            while mask > 0:  # binomial tree: the children below my lowest set bit
                if me + mask < n:
                    self.send(rs[k], rs[(me + mask + root) % n], numel * elem)
                mask >>= 1

    # The hierarchical collectives (a group spread evenly over nodes, see hierarchy()).
    def h_reduce(self, local, cross, numel, root, elem):
        li = next(i for i, x in enumerate(local) if root in x)
        lr = local[li].index(root)
        for x in local:  # to the rank of the root's local index on every node
            self.reduce(x, numel, lr, elem)
        self.reduce(cross[lr], numel, li, elem)  # then among those, to the root's node

    def h_broadcast(self, local, cross, numel, root, elem):
        li = next(i for i, x in enumerate(local) if root in x)
        lr = local[li].index(root)
        self.broadcast(cross[lr], numel, li, elem)
        for x in local:
            self.broadcast(x, numel, lr, elem)

    def h_parts(self, local, counts_of):
        p = len(local[0])
        return [[counts_of[x[lr]] for x in local] for lr in range(p)]

    def h_reduce_scatter(self, local, cross, counts_of, elem):
        parts = self.h_parts(local, counts_of)  # parts[l][k]: the count of (node k, local index l)
        for x in local:
            self.reduce_scatter(x, [sum(c) for c in parts], elem)
        for lr, c in enumerate(parts):
            self.reduce_scatter(cross[lr], c, elem)

    def h_all_gather(self, local, cross, counts_of, elem):
        parts = self.h_parts(local, counts_of)
        for lr, c in enumerate(parts):
            self.all_gather(cross[lr], c, elem)
        for x in local:
            self.all_gather(x, [sum(c) for c in parts], elem)


def scatter_rounds(plan, groups):
    """The plan's Muon scatter rounds (NOTE [Muon scatter rounds] in plan/muon_rounds.h), written
    again from its rule: per group, the Muon buckets in hand-off order (descending largest tensor
    index, then position); round k of a dtype holds every owner's k-th bucket; a round of n members
    scatters where (n - 1) x its largest bucket < the sum of its buckets. [(group id, [buckets])]."""
    if plan.get("policy", {}).get("muon_reduce") != "MUON_REDUCE_SCATTER_ROUNDS":
        return []
    by_group = {}
    for b in plan.get("muon_buckets", []):
        by_group.setdefault(b["group"], []).append(b)
    out = []
    for gid, buckets in by_group.items():
        n = len(groups[gid])
        if n < 2:
            continue
        last = [max((int(e.get("tensor", 0)) for e in b.get("entries", [])), default=-1) for b in buckets]
        order = sorted(range(len(buckets)), key=lambda i: -last[i])  # stable: ties keep position
        taken, rounds = {}, {}
        for i in order:
            b = buckets[i]
            key = (b.get("dtype", "FP32"), int(b["owner"]))
            k = taken.get(key, 0)
            taken[key] = k + 1
            rounds.setdefault((key[0], k), []).append(b)
        for members in rounds.values():
            sizes = [int(b["numel"]) for b in members]
            if len(members) >= 2 and (n - 1) * max(sizes) < sum(sizes):
                out.append((gid, members))
    return out


def wire_theory(plan, piece_bytes=0, node_of=None, hierarchical=False):
    """Per global rank, by the rings' algorithms: {"bytes": sent per step, "transfers": data
    messages per step, "inter": bytes sent to ranks on other nodes per step}.

    node_of: rank -> node (None: every rank a node of its own). hierarchical: the
    groups spread evenly over nodes run the hierarchical collectives, the plan's
    topology.gpus_per_node ranks a node."""
    groups = {g["id"]: [int(r) for r in g["ranks"]] for g in plan["groups"]}
    world = int(plan["topology"]["world_size"])
    tally = WireTally(world, node_of or (lambda r: r))
    reduce_elem = 4  # reductions travel as fp32 (bf16/fp16 widened)
    per_node = int(plan["topology"].get("gpus_per_node", 0) or 0)

    def levels(ranks):
        if not hierarchical or per_node < 1:
            return None
        return hierarchy(ranks, lambda r: r // per_node)

    grad_elem = grad_bytes(plan)
    in_round = set()
    for gid, members in scatter_rounds(plan, groups):
        # One reduce-scatter and one all-gather of a segment per member, each the round's largest.
        ranks = groups[gid]
        segment = max(int(b["numel"]) for b in members)
        elem = DTYPE_BYTES.get(members[0].get("dtype", "FP32"), 4)
        in_round.update(id(b) for b in members)
        h = levels(ranks)
        if h is None:
            tally.reduce_scatter(ranks, [segment] * len(ranks), reduce_elem)
            tally.all_gather(ranks, [segment] * len(ranks), elem)
        else:
            counts_of = dict.fromkeys(ranks, segment)
            tally.h_reduce_scatter(h[0], h[1], counts_of, reduce_elem)
            tally.h_all_gather(h[0], h[1], counts_of, elem)
    for b in plan.get("muon_buckets", []):
        ranks = groups[b["group"]]
        if len(ranks) < 2 or id(b) in in_round:
            continue
        elem = DTYPE_BYTES.get(b.get("dtype", "FP32"), 4)
        owner = int(b["owner"])
        h = levels(ranks)
        for numel in muon_pieces(b, grad_elem, piece_bytes):
            if h is None:
                root = ranks.index(owner)
                tally.reduce(ranks, numel, root, reduce_elem)  # Reduce: ring reduce-scatter + gather
                tally.broadcast(ranks, numel, root, elem)  # Broadcast: binomial tree
            else:
                tally.h_reduce(h[0], h[1], numel, owner, reduce_elem)
                tally.h_broadcast(h[0], h[1], numel, owner, elem)
    for b in plan.get("adamw_buckets", []):
        ranks = groups[b["group"]]
        n = len(ranks)
        if n < 2:
            continue
        offsets = [int(x) for x in b["shard_offsets"]]
        counts = [offsets[i + 1] - offsets[i] for i in range(n)]
        elem = DTYPE_BYTES.get(b.get("dtype", "FP32"), 4)
        h = levels(ranks)
        if h is None:
            tally.reduce_scatter(ranks, counts, reduce_elem)
            tally.all_gather(ranks, counts, elem)
        else:
            counts_of = dict(zip(ranks, counts, strict=True))
            tally.h_reduce_scatter(h[0], h[1], counts_of, reduce_elem)
            tally.h_all_gather(h[0], h[1], counts_of, elem)
    return [{"bytes": tally.sent[r], "transfers": tally.transfers[r], "inter": tally.inter[r]} for r in range(world)]


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
        # --nodes: a namespace per node, ranks // nodes consecutive ranks on each.
        self.nodes = a.nodes if kind == "shaped" else 0
        self.per_node = ranks // self.nodes if self.nodes else 1

    def node(self, rank):
        """The rank's node: its namespace's index (every rank its own without --nodes; 0 on loopback)."""
        if self.kind != "shaped":
            return 0
        return rank // self.per_node

    def host(self, rank):
        return ns_ip(self.node(rank)) if self.kind == "shaped" else "127.0.0.1"

    def ns(self, rank):
        return ns_name(self.node(rank), self.nodes > 0) if self.kind == "shaped" else None

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

    def submit(self, manifest, ep, gpus_per_node=0):
        """Submits the plan request (topology: --world-size, --ep, --tp and, when
        gpus_per_node, --gpus-per-node); (version, the plan as JSON)."""
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
            + (["--muon-reduce", self.a.muon_reduce] if self.a.muon_reduce != "owner" else [])
            + (["--tp", str(self.a.tp)] if self.a.tp > 1 else [])
            + (["--gpus-per-node", str(gpus_per_node)] if gpus_per_node else [])
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
        if gpus_per_node:
            t = plan.get("topology", {})
            got = int(t.get("gpus_per_node", t.get("gpusPerNode", 0)) or 0)
            if got != gpus_per_node:
                raise Failure(
                    "plan version %d: topology.gpus_per_node is %d, submitted %d (the coordinator or "
                    "muonshardctl drops the field?)" % (version, got, gpus_per_node)
                )
        return version, plan

    def close(self):
        if self.coordinator is not None:
            self.coordinator.stop()


FAILED_RE = re.compile(r"rank \d+: failed: ")


class Job:
    """One worker per rank for one (model, mode, collectives) on a network."""

    def __init__(self, net, model, mode, version, repeat=0, collectives="flat"):
        self.net = net
        self.model = model
        self.mode = mode
        self.collectives = collectives
        a = net.a
        # The variant is in the name only when --collectives asks for them.
        coll = "-" + collectives if net.kind == "shaped" and a.collectives_given else ""
        self.name = "%s-%s%s-%s-%d" % (model["key"], mode, coll, net.kind, repeat)
        self.total_steps = a.warmup + a.steps
        self.cpu_busy = float("nan")
        self.workers = []
        self.ports = {}
        flags = a.mode_flags[mode] + (a.collectives_flags[collectives] if net.kind == "shaped" else [])
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
        net = self.net
        peer_ips = {net.host(r) for r in range(net.ranks)}
        for r, w in enumerate(self.workers):
            counters = socket_counters(w.p.pid, net.ns(r), {net.coord_port}, {self.ports[r]}, peer_ips)
            if net.nodes:
                # The same sockets split by the peer's node: another node's
                # address (the shaped link) or this node's own (lo).
                other = peer_ips - {net.host(r)}
                counters["inter"] = socket_counters(w.p.pid, net.ns(r), {net.coord_port}, {self.ports[r]}, other)
                counters["intra"] = socket_counters(
                    w.p.pid, net.ns(r), {net.coord_port}, {self.ports[r]}, {net.host(r)}
                )
            wire.append(counters)
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


def per_rank(before, after, final, wire, plan, mode, steps, piece_bytes, node_of=None, hierarchical=False):
    """Per-rank figures of one job (with node_of, --nodes: the wire split by the peer's node)."""
    rows = []
    theory = wire_theory(plan, piece_bytes, node_of, hierarchical)
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
        expect_inter = 0 if mode == "compute" else theory[r]["inter"]
        split = {}
        if "inter" in wire[r]:
            split = {
                "inter": wire[r]["inter"]["sent"] / steps_run if steps_run else float("nan"),
                "intra": wire[r]["intra"]["sent"] / steps_run if steps_run else float("nan"),
                "theory_inter": expect_inter,
                "theory_intra": expect_wire - expect_inter,
            }
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
                **split,
            }
        )
    return rows


def pct(measured, theory):
    return 100.0 * (measured - theory) / theory if theory else float("nan")


def fmt_ms(v):
    return "%.1f" % v if v == v else "n/a"


def diff_text(measured, theory, unit=""):
    """measured against theory: "+0.006" (percent), or "+123B" where the theory is 0."""
    return ("%+.3f%s" % (pct(measured, theory), unit)) if theory else "%+.0fB" % measured


def print_job(title, rows, shaped):
    print(title)
    nodes = "inter" in rows[0]  # --nodes: the wire split by the peer's node
    extra = " %13s %13s %8s %13s" % ("inter_MB/step", "inter_theory", "diff%", "intra_MB/step") if nodes else ""
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
        + extra
    )
    for x in rows:
        p = x["phases"]
        extra = ""
        if nodes:
            extra = " %13.4f %13.4f %8s %13.4f" % (
                x["inter"] / 1e6,
                x["theory_inter"] / 1e6,
                diff_text(x["inter"], x["theory_inter"]),
                x["intra"] / 1e6,
            )
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
                diff_text(x["sent"], x["theory"]),
                x["retrans"] / 1e6,
            )
            + extra
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
    split = {}
    if nodes:
        split = {k: sum(x[k] for x in rows) for k in ("inter", "intra", "theory_inter", "theory_intra")}
        split["inter_max_abs_pct"] = max(
            (abs(pct(x["inter"], x["theory_inter"])) for x in rows if x["theory_inter"]), default=float("nan")
        )
        print(
            "  inter-node (the shaped links) %.4f MB/step sent, theory %.4f (%s; worst rank %s %%); "
            "intra-node (a node's lo) %.4f MB/step, theory %.4f (%s)"
            % (
                split["inter"] / 1e6,
                split["theory_inter"] / 1e6,
                diff_text(split["inter"], split["theory_inter"], " %"),
                "%.3f" % split["inter_max_abs_pct"]
                if split["inter_max_abs_pct"] == split["inter_max_abs_pct"]
                else "n/a",
                split["intra"] / 1e6,
                split["theory_intra"] / 1e6,
                diff_text(split["intra"], split["theory_intra"], " %"),
            )
        )
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
        **split,
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


def help_text(argv):
    p = run(argv + ["--help"], check=False, timeout=30)
    return (p.stdout or "") + (p.stderr or "")


def flag_values(text, flag):
    """The values a --help text lists for `flag` ("a (...) | b | c (...)": {a, b, c}); None: no such flag."""
    m = re.search(r"^\s*%s\b[^\n]*\n((?:[ \t]{4,}[^\n]*\n?)*)" % re.escape(flag), text, re.M)
    if not m:
        return None
    body, depth, top = m.group(1), 0, ""
    for ch in body:  # the text outside parentheses
        depth += ch == "("
        if not depth:
            top += ch
        depth -= ch == ")" and depth > 0
    return {w.split()[0] for w in top.split("|") if w.split()}


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
            # --collectives: one plan with the nodes in its topology for both variants
            # (the same owners and balance; only the workers' --collectives differs).
            shaped_nodes = kind == "shaped" and a.collectives_given
            version, plan = net.submit(model["manifest"], model["ep"], net.per_node if shaped_nodes else 0)
            colls = a.collectives if kind == "shaped" else ["flat"]
            # Repeats go round the modes (and the collectives), so a change of
            # load hits them alike.
            for rep, mode, coll in [(r, m, c) for r in range(a.repeats) for m in modes for c in colls]:
                job = Job(net, model, mode, version, rep, coll)
                try:
                    before, after, final, wire = job.run()
                except Failure as e:
                    failures.append(
                        "%s: %s\n%s\n--- coordinator ---\n%s" % (job.name, e, job.tails(), net.coordinator.tail())
                    )
                    raise
                finally:
                    job.stop()
                rows = per_rank(
                    before,
                    after,
                    final,
                    wire,
                    plan,
                    mode,
                    a.steps,
                    a.piece_bytes,
                    net.node if net.nodes else None,
                    coll == "hierarchical",
                )
                grad_elem = grad_bytes(plan)
                pieces = sum(len(muon_pieces(b, grad_elem, a.piece_bytes)) for b in plan.get("muon_buckets", []))
                title = "%s, %s network%s, mode %s%s%s (plan: %d Muon buckets in %d pieces + %d AdamW buckets):" % (
                    model["label"],
                    kind,
                    (
                        " (%d nodes x %d ranks), collectives %s" % (net.nodes, net.per_node, coll)
                        + ("" if a.collectives_given else " (no flag)")
                    )
                    if net.nodes
                    else "",
                    mode,
                    "" if a.mode_flags[mode] else " (today's step: no flag)",
                    ", repeat %d of %d" % (rep + 1, a.repeats) if a.repeats > 1 else "",
                    len(plan.get("muon_buckets", [])),
                    pieces,
                    len(plan.get("adamw_buckets", [])),
                )
                results.setdefault((model["key"], kind, mode, coll), []).append(
                    print_job(title, rows, kind == "shaped")
                )
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
        help="only the loopback runs: no namespaces, no shaping (every mode of --modes)",
    )
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="two-host emulation: N namespaces ms-n<k> as N machines, --ranks / N consecutive ranks on each "
        "(unshaped among themselves, shaped links between nodes); default 0: a namespace per rank",
    )
    p.add_argument(
        "--collectives",
        default=None,
        help="with --nodes: comma-separated flat, hierarchical (a plan with gpus_per_node = ranks / N; the "
        "workers' --collectives); default: flat only, today's plan and workers",
    )
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
        "--muon-reduce",
        default="owner",
        choices=["owner", "scatter-rounds"],
        help="the plans' --muon-reduce (NOTE [Muon scatter rounds] in plan/muon_rounds.h; default owner)",
    )
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
    if a.steps < 1 or a.warmup < 1 or not 1 <= a.repeats <= 20:
        p.error("--steps and --warmup must be >= 1, --repeats in [1, 20]")
    if min(a.moe_divisor, a.moe_layers, a.dense_divisor, a.dense_layers, a.ep, a.tp) < 1:
        p.error("divisors, layers, --ep and --tp must be >= 1")
    if a.ranks % a.ep or a.ranks % a.tp:
        p.error("--ep and --tp must divide --ranks")
    if a.nodes and (a.nodes < 2 or a.ranks % a.nodes):
        p.error("--nodes must be 0 or >= 2 and divide --ranks")
    if a.nodes and a.loopback_only:
        p.error("--nodes shapes the namespaces' network: not with --loopback-only")
    a.collectives_given = a.collectives is not None
    a.collectives = [c for c in (a.collectives or "flat").split(",") if c]
    if a.collectives_given and not a.nodes:
        p.error("--collectives needs --nodes")
    if not a.collectives or [c for c in a.collectives if c not in ("flat", "hierarchical")]:
        p.error("--collectives: comma-separated flat, hierarchical")
    if len(set(a.collectives)) != len(a.collectives):
        p.error("--collectives repeats an entry")
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
    a.collectives_flags = {"flat": []}  # today's workers and plan: no flag
    if a.collectives_given:
        # Only when --collectives asks for the variants: the plan's gpus_per_node
        # (muonshardctl submit --gpus-per-node) and the workers' --collectives.
        text = help_text([os.path.join(a.bin, "muonshard-worker")])
        values = flag_values(text, "--collectives") or set()
        if "--collectives" not in text:
            raise CannotRun(
                "this muonshard-worker has no --collectives (flat vs hierarchical collectives): "
                "run without --collectives (flat only)"
            )
        if "--gpus-per-node" not in help_text([os.path.join(a.bin, "muonshardctl"), "submit"]):
            raise CannotRun(
                "this muonshardctl submit has no --gpus-per-node (the plan's topology.gpus_per_node): "
                "run without --collectives (flat only)"
            )
        # flat: placement-oblivious rings on the same plan. hierarchical: by
        # name where the worker lists it, else its default (the plan's nodes).
        a.collectives_flags = {
            "flat": ["--collectives", "flat"],
            "hierarchical": ["--collectives", "hierarchical"] if "hierarchical" in values else [],
        }


def shaped_summary(a, k, get, netem, coll="flat"):
    """The shaped network's line for model k (and collectives coll); False when the overlap goal is missed."""
    seq, pip, com, cmp_ = (get(k, "shaped", m, coll) for m in ("sequential", "pipelined", "comm", "compute"))
    where = "shaped"
    if a.nodes:
        # Not "shaped (": bench/sim/validate_shaped_net.py reads those lines as a namespace per rank.
        where = "shaped over %d nodes x %d ranks, collectives %s" % (a.nodes, a.ranks // a.nodes, coll)
    print(
        "    %s (%s each way, %s): sequential %s | pipelined %s | comm %s | compute %s"
        % (
            where,
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


HIERARCHICAL_GOAL = 0.70  # hierarchical / flat inter-node bytes per step: >= 30 % fewer


def ratio_text(r):
    return "%.3f" % r if r == r else "n/a"


def summary(a, models, results, netem):
    print()
    print(
        'summary (slowest rank\'s ms per step%s; goals of issue "Step performance")'
        % (", median of %d repeats" % a.repeats if a.repeats > 1 else "")
    )
    ok = True

    def get(key, kind, mode, coll="flat", field="step_ms"):
        v = sorted(x[field] for x in results.get((key, kind, mode, coll), []) if x.get(field) == x.get(field))
        if not v:
            return float("nan")
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    colls = a.collectives if a.nodes else ["flat"]
    for model in models:
        k = model["key"]
        print("  %s" % model["label"])
        if not a.loopback_only:
            for coll in colls:
                ok = shaped_summary(a, k, get, netem, coll) and ok
        if a.loopback:
            lseq, lpip = get(k, "loopback", "sequential"), get(k, "loopback", "pipelined")
            r3 = lpip / lseq if lpip == lpip and lseq == lseq else float("nan")
            terms = "".join(
                " | %s %s" % (m, fmt_ms(get(k, "loopback", m))) for m in ("comm", "compute") if m in a.modes
            )
            print(
                "    loopback: sequential %s | pipelined %s%s; pipelined / sequential = %s (goal <= 1.00)"
                % (fmt_ms(lseq), fmt_ms(lpip), terms if a.loopback_only else "", "%.3f" % r3 if r3 == r3 else "n/a")
            )
            if r3 == r3 and r3 > 1.0:
                ok = False
        for mode in a.modes:
            for coll in colls:
                label = mode + (", collectives " + coll if len(colls) > 1 or a.collectives_given else "")
                runs = [x for x in results.get((k, "shaped", mode, coll), []) if x["theory"]]
                if not runs:
                    continue
                # The repeat furthest from the theory (they agree to the byte so far).
                res = max(runs, key=lambda x: abs(pct(x["sent"], x["theory"])))
                d = pct(res["sent"], res["theory"])
                print(
                    "    wire bytes, %s: %.4f MB/step measured vs %.4f theory (%+.3f %%; worst rank %.3f %%; "
                    "goal +-1 %%)" % (label, res["sent"] / 1e6, res["theory"] / 1e6, d, res["per_rank_max_abs_pct"])
                )
                if abs(d) > 1.0:
                    ok = False
                if not a.nodes:
                    continue
                res = max(runs, key=lambda x: abs(pct(x["inter"], x["theory_inter"])) if x["theory_inter"] else 0)
                d = pct(res["inter"], res["theory_inter"])
                print(
                    "    inter-node bytes, %s: %.4f MB/step measured vs %.4f theory (%s; worst rank %s %%; "
                    "goal +-1 %%); intra-node %.4f MB/step vs %.4f theory"
                    % (
                        label,
                        res["inter"] / 1e6,
                        res["theory_inter"] / 1e6,
                        diff_text(res["inter"], res["theory_inter"], " %"),
                        ratio_text(res["inter_max_abs_pct"]),
                        res["intra"] / 1e6,
                        res["theory_intra"] / 1e6,
                    )
                )
                if d == d and abs(d) > 1.0:
                    ok = False
            if "flat" in colls and "hierarchical" in colls and mode != "compute":
                fs, hs = get(k, "shaped", mode, "flat"), get(k, "shaped", mode, "hierarchical")
                fi, hi = (get(k, "shaped", mode, c, "inter") for c in ("flat", "hierarchical"))
                ft, ht = (get(k, "shaped", mode, c, "theory_inter") for c in ("flat", "hierarchical"))
                r = hi / fi if fi else float("nan")
                print(
                    "    flat vs hierarchical, %s: step %s vs %s ms (hierarchical / flat %s); inter-node %.4f vs "
                    "%.4f MB/step: hierarchical / flat = %s (goal <= %.2f; theory %.4f vs %.4f = %s)"
                    % (
                        mode,
                        fmt_ms(fs),
                        fmt_ms(hs),
                        ratio_text(hs / fs if fs == fs and hs == hs and fs else float("nan")),
                        fi / 1e6,
                        hi / 1e6,
                        ratio_text(r),
                        HIERARCHICAL_GOAL,
                        ft / 1e6,
                        ht / 1e6,
                        ratio_text(ht / ft if ft else float("nan")),
                    )
                )
                if r == r and r > HIERARCHICAL_GOAL:
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
    nodes = a.nodes > 0
    count = a.nodes or a.ranks  # namespaces: one per node with --nodes, else one per rank
    setup_network(count, a.rate_bps, a.delay_s, a.ingress, netem, nodes)
    leaf = ("netem delay %s" % a.delay) if netem and a.delay_s > 0 else "bfifo"
    print(
        "network: bridge %s (%s/24), %d namespaces %s..%s (%s.11..%d), veth pairs; tc htb rate %s "
        "(+ %s leaf) on each namespace's egress%s"
        % (
            BRIDGE,
            BRIDGE_IP,
            count,
            ns_name(0, nodes),
            ns_name(count - 1, nodes),
            SUBNET,
            10 + count,
            a.rate,
            leaf,
            " and on the bridge side (ingress)" if a.ingress else "",
        )
    )
    if nodes:
        per = a.ranks // a.nodes
        print(
            "nodes: %s; a node's ranks share its address and talk over its lo (unshaped), every byte between "
            "nodes crosses the shaped links"
            % "; ".join(
                "%s (%s) ranks %d..%d" % (ns_name(k, True), ns_ip(k), k * per, k * per + per - 1)
                for k in range(a.nodes)
            )
        )
    if a.rate_check_seconds > 0:
        py = sys.executable or "/usr/bin/python3"
        g, rtt, busy = rate_check(a.rate_check_seconds, py, nodes)
        # Full-size frames: 1448 payload bytes of 1514 on the wire (timestamps on).
        print(
            "rate check: one TCP flow %s -> %s for %.1f s: %.3f Gbit/s payload = %.1f %% of %s "
            "(%.1f %% with Ethernet/IP/TCP headers); idle round trip (1 byte, median of %d) %.0f us"
            % (
                ns_name(0, nodes),
                ns_name(1, nodes),
                a.rate_check_seconds,
                g,
                100 * g * 1e9 / a.rate_bps,
                a.rate,
                100 * g * 1e9 / a.rate_bps * 1514 / 1448,
                PING_PONGS,
                rtt * 1e6,
            )
        )
        # What a byte costs the host's CPUs (sender, receiver and the kernel between them, every process:
        # an idle machine reads true): on the shaped path, and with --nodes on a node's own lo.
        costs = ["the shaped path %.2f cores busy = %.2f ns of CPU per byte" % (busy, busy / (g / 8.0))]
        if nodes:
            g_lo, _, busy_lo = rate_check(a.rate_check_seconds, py, nodes, inside=True)
            costs.append(
                "a node's lo (one flow %s -> its own address) %.3f Gbit/s payload, %.2f cores busy = %.2f ns "
                "of CPU per byte" % (ns_name(0, True), g_lo, busy_lo, busy_lo / (g_lo / 8.0))
            )
        print("CPU per byte moved: %s" % "; ".join(costs))
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
        # Alongside the shaped runs, loopback only checks the overlap goal; alone it runs every mode.
        lmodes = a.modes if a.loopback_only else [m for m in ("sequential", "pipelined") if m in a.modes]
        print(
            "workers: %d ranks, synthetic workload, %d warm-up + %d timed steps, policy %s%s; modes %s%s%s"
            % (
                a.ranks,
                a.warmup,
                a.steps,
                a.policy,
                " (muon-reduce %s)" % a.muon_reduce if a.muon_reduce != "owner" else "",
                ", ".join(lmodes if a.loopback_only else a.modes),
                " (loopback only)" if a.loopback_only else "",
                (
                    "; %d nodes, collectives %s%s"
                    % (
                        a.nodes,
                        ", ".join(a.collectives),
                        " (plans with gpus_per_node %d; workers: %s)"
                        % (
                            a.ranks // a.nodes,
                            ", ".join(
                                "%s: %s" % (c, " ".join(a.collectives_flags[c]) or "no flag") for c in a.collectives
                            ),
                        )
                        if a.collectives_given
                        else " (today's plan and workers)",
                    )
                )
                if a.nodes
                else "",
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
