"""The coordinator from Python: a gRPC client, and a local coordinator process."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from muonshard import _muonshard

_POLICIES = {"seed": "SEED", "seed-all": "SEED_ALL", "seed_all": "SEED_ALL", "balanced": "BALANCED"}
_DTYPES = {"float32": "FP32", "fp32": "FP32", "bfloat16": "BF16", "bf16": "BF16", "float16": "FP16", "fp16": "FP16"}


def _manifest_dict(manifest):
    """A manifest given as a dict, a JSON string or a path to a JSON file."""
    if isinstance(manifest, dict):
        return manifest
    if isinstance(manifest, (str, os.PathLike)):
        text = str(manifest)
        if not text.lstrip().startswith("{"):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        return json.loads(text)
    raise TypeError("manifest must be a dict, a JSON string or a path, not %s" % type(manifest).__name__)


_TP_MUON = {
    "distributed": "TP_MUON_DISTRIBUTED",
    "duplicated": "TP_MUON_DUPLICATED",
    "sharded": "TP_MUON_SHARDED",
}
_MUON_REDUCE = {
    "owner": "MUON_REDUCE_TO_OWNER",
    "scatter-rounds": "MUON_REDUCE_SCATTER_ROUNDS",
}


def plan_request(
    manifest,
    world_size,
    ep=1,
    pp=1,
    policy="seed",
    comm_buffer_mb=0,
    muon_exclude=None,
    grad_dtype=None,
    per_dtype=False,
    tp=1,
    tp_muon=None,
    tp_mesh=None,
    gpus_per_node=0,
    muon_reduce=None,
):
    """The PlanRequest (proto3 JSON as a dict) `muonshardctl submit` would send.

    `tp` > 1 plans tensor parallelism over the manifest's tp_split marks
    (manifest_from_module(tp=...), import-hf --tp); `tp_muon` is
    "distributed" (default: one tp rank orthogonalises each split matrix),
    "duplicated" (every tp rank does) or "sharded" (every tp rank its own
    shard, the Gram matrices all-reduced: Megatron's distributed mode). `tp_mesh` is the tp group's shape as a
    mesh (product tp; NOTE [TP mesh tiles] in plan/tp_mesh.h), for DTensor
    parameters on an FSDP x TP DeviceMesh (topology_of(module) gives it).
    `gpus_per_node` (ranks per machine, rank r on node r // gpus_per_node; 0:
    not known) lets the workers reduce and broadcast inside each node first.
    `muon_reduce` is "owner" (default: each Muon bucket reduced to its owner
    and broadcast back, as Paddle) or "scatter-rounds" (tp 1: a group's buckets
    of distinct owners reduce-scattered and all-gathered together; NOTE [Muon
    scatter rounds] in plan/muon_rounds.h).
    """
    if policy not in _POLICIES:
        raise ValueError("policy %r is not one of %s" % (policy, ", ".join(sorted(_POLICIES))))
    policy_msg = {"policy": _POLICIES[policy]}
    if comm_buffer_mb:
        policy_msg["comm_buffer_mb"] = int(comm_buffer_mb)
    if muon_exclude:
        policy_msg["muon_exclude_patterns"] = list(muon_exclude)
    if grad_dtype is not None:
        if grad_dtype not in _DTYPES:
            raise ValueError("grad_dtype %r is not one of %s" % (grad_dtype, ", ".join(sorted(_DTYPES))))
        policy_msg["grad_dtype"] = _DTYPES[grad_dtype]
    if per_dtype:
        policy_msg["per_dtype"] = True
    if tp_muon is not None:
        if tp_muon not in _TP_MUON:
            raise ValueError("tp_muon %r is not one of %s" % (tp_muon, ", ".join(sorted(_TP_MUON))))
        policy_msg["tp_muon"] = _TP_MUON[tp_muon]
    if muon_reduce is not None:
        if muon_reduce not in _MUON_REDUCE:
            raise ValueError("muon_reduce %r is not one of %s" % (muon_reduce, ", ".join(sorted(_MUON_REDUCE))))
        if muon_reduce != "owner":
            policy_msg["muon_reduce"] = _MUON_REDUCE[muon_reduce]
    topology = {"world_size": int(world_size), "ep": int(ep), "pp": int(pp)}
    if int(tp) > 1:
        topology["tp"] = int(tp)
    if tp_mesh is not None and len(tp_mesh) > 1:
        topology["tp_mesh"] = [int(d) for d in tp_mesh]
    if int(gpus_per_node) < 0:
        raise ValueError("gpus_per_node must be >= 0 (0: not known), got %d" % int(gpus_per_node))
    if int(gpus_per_node) > 0:
        topology["gpus_per_node"] = int(gpus_per_node)
    return {"manifest": _manifest_dict(manifest), "topology": topology, "policy": policy_msg}


class Coordinator:
    """A client of muonshard-coordinator.

    `address` is HOST:PORT (a host alone means port 50051); unset, it comes from
    $MUONSHARD_COORDINATOR, like `token_file` ($MUONSHARD_TOKEN_FILE), `tls_ca`
    ($MUONSHARD_TLS_CA), `tls_cert` ($MUONSHARD_TLS_CERT) and `tls_key`
    ($MUONSHARD_TLS_KEY). `timeout` bounds every call (seconds). Nothing is dialled
    until the first call; an unreachable coordinator raises ConnectionError
    (UNAVAILABLE) or TimeoutError (DEADLINE_EXCEEDED) then.
    """

    def __init__(self, address=None, token_file=None, tls_ca=None, tls_cert=None, tls_key=None, timeout=30.0):
        self._client = _muonshard.CoordinatorClient(
            address or "", token_file or "", tls_ca or "", tls_cert or "", tls_key or "", float(timeout)
        )

    @property
    def address(self):
        return self._client.address

    def submit(self, manifest, world_size, ep=1, pp=1, policy="seed", **policy_options):
        """Stores the plan of `manifest` on `world_size` ranks; returns its version.

        An identical request returns the version stored before. `policy` is
        "seed" (Paddle's partition), "seed-all" or "balanced"; `policy_options`:
        comm_buffer_mb, muon_exclude (regexes), grad_dtype, per_dtype, tp, tp_muon,
        muon_reduce (plan_request).
        """
        return int(self.submit_info(manifest, world_size, ep, pp, policy, **policy_options)["version"])

    def submit_info(self, manifest, world_size, ep=1, pp=1, policy="seed", **policy_options):
        """submit() with the whole SubmitPlanResponse (version, content_hash, created, info)."""
        request = plan_request(manifest, world_size, ep, pp, policy, **policy_options)
        return json.loads(self._client.submit(json.dumps(request)))

    def plan(self, version=0, with_request=False):
        """The whole plan of `version` (0: the latest) as a dict (proto3 JSON)."""
        response = json.loads(self._client.get_plan(int(version), None, bool(with_request)))
        return response if with_request else response["plan"]

    def rank_view(self, version, rank):
        """Rank `rank`'s view of plan `version`: what its worker executes."""
        return json.loads(self._client.get_plan(int(version), int(rank), False))["rank_view"]

    def workers(self, job=None):
        """The jobs (or `job`) with their generation, plan version and workers."""
        return json.loads(self._client.list_workers(job or "")).get("jobs", [])

    def health(self):
        """The coordinator's grpc.health.v1 status, e.g. "SERVING"."""
        return self._client.health("muonshard.v1.Coordinator")


def find_binary(name):
    """The path of a muonshard binary: $MUONSHARD_BIN_DIR, then the build this
    package was built in, then $PATH. Raises FileNotFoundError naming where it looked."""
    places = []
    env = os.environ.get("MUONSHARD_BIN_DIR")
    if env:
        places.append(env)
    try:
        from muonshard._build_info import BIN_DIR

        places.append(BIN_DIR)
    except ImportError:
        pass
    for place in places:
        path = os.path.join(place, name)
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError("%s not found in %s or on PATH" % (name, ", ".join(places) or "(no build dir)"))


class LocalCoordinator:
    """A muonshard-coordinator process on 127.0.0.1 (a free port) with its SQLite
    store in a temporary directory (or `data_dir`), for local runs and tests.

        with muonshard.LocalCoordinator() as c:
            version = muonshard.Coordinator(c.address).submit(manifest, world_size=2)

    `heartbeat_timeout` (seconds) is how long a silent worker stays a member.
    Start-up waits at most `start_timeout` seconds; stop() sends SIGTERM, then
    SIGKILL after a grace period.
    """

    def __init__(self, data_dir=None, heartbeat_timeout=10.0, start_timeout=30.0, extra_args=(), log=None):
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="muonshard-coordinator-")
        self._port_file = os.path.join(self.data_dir, "ports.json")
        if os.path.exists(self._port_file):
            os.remove(self._port_file)
        args = [
            find_binary("muonshard-coordinator"),
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            self.data_dir,
            "--metrics-port",
            "0",
            "--heartbeat-timeout",
            str(heartbeat_timeout),
            "--port-file",
            self._port_file,
        ] + list(extra_args)
        self._own_log = log is None
        self._log = log if log is not None else open(os.path.join(self.data_dir, "coordinator.log"), "ab")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.grpc_port, self.metrics_port = self._wait_for_ports(start_timeout)
        self.address = "127.0.0.1:%d" % self.grpc_port

    def _wait_for_ports(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    "muonshard-coordinator exited with %d before serving (log: %s)"
                    % (self.process.returncode, os.path.join(self.data_dir, "coordinator.log"))
                )
            try:
                with open(self._port_file, encoding="utf-8") as f:
                    ports = json.load(f)
                return int(ports["grpc_port"]), int(ports.get("metrics_port", -1))
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        self.stop()
        raise TimeoutError("muonshard-coordinator did not serve within %.0f s" % timeout)

    def stop(self, grace=10.0):
        """Stops the process (idempotent) and removes a temporary data dir."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._own_log and not self._log.closed:
            self._log.close()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
