#!/usr/bin/env python3
"""deploy_torch_{compose,k8s}: the PyTorch example as deployed -- the torch
workers of docker-compose.torch.yml (`compose`), the worker pods of the
rendered Kubernetes overlay torch (`k8s`) --
is a command line torch's launcher and examples/torch/train_gpt.py accept,
and it trains and resumes.

1. Each node's command (compose: the torch image's ENTRYPOINT + `command`;
   Kubernetes: `command` + `args`, $(VAR)s expanded as the kubelet does) is
   parsed by the real launcher's parser (torch.distributed.run): --redirects 1
   --tee 1 (torch 1.13's launcher fails on Python 3.11 without them), one
   process per node, node ranks 0..N-1 of --nnodes N, one rendezvous address
   and port. The script is the image's copy of examples/torch/train_gpt.py
   (the Dockerfile's COPY), and its flags are parsed by that script's own
   parse_args: --optimizer muonshard, the coordinator's address, one job,
   Gloo on the node's own address, /metrics on the metrics port, checkpoints
   with --resume. The image's ENTRYPOINT is the launcher the pods run.
2. The run, on 127.0.0.1: the coordinator with its deployment arguments,
   then every node's launcher exactly as deployed, except for what one
   machine needs: addresses (127.0.0.1, free ports), /metrics on loopback and
   any port, a device identity per node (MUONSHARD_DEVICE: containers and pods
   have host names of their own, which the coordinator tells ranks apart by;
   here all share one), 4 steps,
   checkpoints every 2 steps in a scratch folder. Rank 0 submits its module's
   plan; every node must exit 0 with its rank joined. Then the same command
   lines to step 6: every node resumes from the step-4 checkpoint.

Exit 77 (skipped) when docker-compose / kubectl or torch is not available, or
the Python package is not built."""

import contextlib
import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_command_lines as ccl
import check_compose
import check_images
import deploy_common as dc

LAUNCHER = ["python3", "-m", "torch.distributed.run"]
DOCKERFILE = os.path.join(dc.REPO, "deploy", "docker", "worker.Dockerfile")
STEPS, RESUMED_STEPS, EVERY = 4, 6, 2


def torch_image():
    """The torch stage of worker.Dockerfile: ENTRYPOINT, CMD and its
    {image path: repository path} copies from the build context."""
    with open(DOCKERFILE) as f:
        text = f.read().replace("\\\n", " ")
    stage = {s[0]: s for s in check_images.stages(text)}.get("torch")
    if stage is None:
        return None
    body = stage[2]
    out = {"copies": {}}
    for key in ("ENTRYPOINT", "CMD"):
        m = re.search(r"^" + key + r"\s+(\[.*\])\s*$", body, re.M)
        out[key] = json.loads(m.group(1)) if m else None
    for src, dst in re.findall(r"^COPY (?!--)(\S+) (\S+)\s*$", body, re.M):
        out["copies"][dst.rstrip("/")] = os.path.join(dc.REPO, src)
    return out


def repo_path(image, path):
    """The repository file the image holds at `path`."""
    for dst, src in image["copies"].items():
        if path.startswith(dst + "/"):
            return os.path.join(src, path[len(dst) + 1 :])
    return None


def load_script(path):
    spec = importlib.util.spec_from_file_location("deployed_train_gpt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts its own folder on sys.path for `data`, `gpt`
    return module


def parse(parser_fn, argv):
    """(namespace, None) or (None, (exit code, what the parser said))."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser_fn(argv), None
    except SystemExit as e:
        lines = err.getvalue().strip().splitlines()
        return None, (e.code, lines[-1] if lines else "")


class Node:
    def __init__(self, name, argv, env, address):
        self.name = name  # container hostname / pod name
        self.argv = argv  # the launcher's arguments (after python3 -m torch.distributed.run)
        self.env = env  # the container's environment
        self.address = address  # the address the node's Gloo should bind (its --hostname)
        self.launch = None  # torch.distributed.run's namespace
        self.script = None  # train_gpt.py's namespace
        self.script_index = None  # the script's position in argv


def check_nodes(c, label, nodes, image, expect):
    """The flag checks of part 1. `expect`: coordinator, master_addr,
    metrics_port."""
    from torch.distributed.run import get_args_parser

    script_path = os.path.join(next((d for d in image["copies"] if d.endswith("examples/torch")), "?"), "train_gpt.py")
    script_file = repo_path(image, script_path)
    c.check(
        script_file is not None and os.path.isfile(script_file),
        f"{label}: the torch image holds examples/torch/train_gpt.py at {script_path}",
    )
    if script_file is None or not os.path.isfile(script_file):
        return None
    train_gpt = load_script(script_file)
    for n in nodes:
        where = f"{label}: {n.name}"
        n.launch, err = parse(lambda a: get_args_parser().parse_args(a), n.argv)
        c.check(n.launch is not None, f"{where}: torch.distributed.run accepts {n.argv}: {err}")
        if n.launch is None:
            continue
        a = n.launch
        c.check(
            a.redirects == "1" and a.tee == "1",
            f"{where}: --redirects 1 --tee 1 (torch 1.13 on Python 3.11): {a.redirects!r} {a.tee!r}",
        )
        c.check(a.nproc_per_node == "1", f"{where}: one process per node ({a.nproc_per_node})")
        c.check(
            a.rdzv_backend == "static" and not a.standalone and a.max_restarts == 0,
            f"{where}: static rendezvous on --master_addr/--master_port; the container restarts, not the agent",
        )
        c.check(a.training_script == script_path, f"{where}: runs {script_path} ({a.training_script})")
        n.script_index = len(n.argv) - len(a.training_script_args) - 1
        c.check(n.argv[n.script_index] == a.training_script, f"{where}: the script follows the launcher's flags")
        n.script, err = parse(train_gpt.parse_args, a.training_script_args)
        c.check(n.script is not None, f"{where}: train_gpt.py accepts {a.training_script_args}: {err}")
        if n.script is None:
            continue
        s = n.script
        c.check(s.optimizer == "muonshard", f"{where}: --optimizer muonshard ({s.optimizer})")
        c.check(
            s.coordinator == expect["coordinator"],
            f"{where}: dials the coordinator {expect['coordinator']} ({s.coordinator})",
        )
        c.check(s.hostname == n.address, f"{where}: Gloo binds and advertises {n.address} ({s.hostname})")
        c.check(
            s.metrics_port == expect["metrics_port"],
            f"{where}: /metrics on {expect['metrics_port']} + local rank 0 ({s.metrics_port})",
        )
        c.check(s.metrics_host == "0.0.0.0", f"{where}: /metrics reachable from outside the pod ({s.metrics_host})")
        c.check(s.ep == 1, f"{where}: ep 1, the data-parallel example's ({s.ep})")
        c.check(
            s.checkpoint_dir and s.checkpoint_every > 0 and s.resume,
            f"{where}: checkpoints every {s.checkpoint_every} steps into {s.checkpoint_dir} and --resume",
        )
    parsed = [n for n in nodes if n.launch is not None and n.script is not None]
    if len(parsed) != len(nodes):
        return None
    world = len(nodes)
    c.check(
        sorted(n.launch.node_rank for n in nodes) == list(range(world)),
        f"{label}: node ranks 0..{world - 1}: {[n.launch.node_rank for n in nodes]}",
    )
    c.check(all(n.launch.nnodes == str(world) for n in nodes), f"{label}: --nnodes {world} on every node")
    c.check(
        {n.launch.master_addr for n in nodes} == {expect["master_addr"]},
        f"{label}: every node meets at rank 0's {expect['master_addr']}: {[n.launch.master_addr for n in nodes]}",
    )
    c.check(len({n.launch.master_port for n in nodes}) == 1, f"{label}: one --master_port")
    c.check(len({n.script.job for n in nodes}) == 1, f"{label}: one job: {[n.script.job for n in nodes]}")
    c.check(
        len({n.script.checkpoint_dir for n in nodes}) == 1,
        f"{label}: one checkpoint directory (rank 0 commits every rank's shard)",
    )
    return sorted(nodes, key=lambda n: n.launch.node_rank)


# ---------------------------------------------------------------- the run


def _die_with_parent():
    dc._die_with_parent()
    os.setsid()  # its own process group: the launcher and its workers end together


def run_nodes(c, label, scratch, nodes, address, steps):
    """Every node's launcher with the loopback substitutions; returns the logs."""
    master_port = dc.free_port()
    procs = []
    for n in nodes:
        launcher = ccl.substitute(
            n.argv[: n.script_index], {"--master_addr": "127.0.0.1", "--master_port": str(master_port)}
        )
        ckpt = os.path.join(scratch, "checkpoints", os.path.basename(n.script.checkpoint_dir.rstrip("/")))
        script = ccl.substitute(
            n.argv[n.script_index + 1 :],
            {
                "--coordinator": address,
                "--hostname": "127.0.0.1",
                "--metrics-port": "0",
                "--metrics-host": "127.0.0.1",
                "--steps": str(steps),
                "--log-every": "1",
                "--checkpoint-dir": ckpt,
                "--checkpoint-every": str(EVERY),
            },
        )
        script_file = os.path.join(dc.REPO, "examples", "torch", "train_gpt.py")
        argv = [sys.executable, "-m", "torch.distributed.run", *launcher, script_file, *script]
        env = {
            **os.environ,
            **n.env,
            "PYTHONPATH": os.path.join(os.path.dirname(dc.bin_dir()), "python"),
            "MUONSHARD_BIN_DIR": dc.bin_dir(),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            # Each container or pod has its own host name; here every node
            # shares this machine's, so each gets its own device identity
            # (the coordinator takes a known (host, device) for a restart).
            "MUONSHARD_DEVICE": f"cpu:{n.name}",
        }
        log = os.path.join(scratch, f"{n.name}-{steps}.log")
        with open(log, "wb") as f:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=scratch,
                preexec_fn=_die_with_parent,
            )
        procs.append((n, p, log))
    deadline = time.monotonic() + 180
    logs = []
    try:
        for n, p, log in procs:
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            with open(log, errors="replace") as f:
                text = f.read()
            logs.append(text)
            c.check(p.returncode == 0, f"{label}: {n.name} (steps {steps}) exit {p.returncode}:\n{text[-3000:]}")
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
    return logs


def run(c, label, scratch, nodes, coordinator_argv):
    r = ccl.Run(c, label, scratch)
    try:
        address = r.coordinator(coordinator_argv)
        world, job = len(nodes), nodes[0].script.job
        logs = run_nodes(c, label, scratch, nodes, address, STEPS)
        c.check("submitted plan version" in logs[0], f"{label}: rank 0 submitted its module's plan")
        # The launcher's stdout lines ("[default0]:...") may land inside a
        # stderr line of the same log: leave them out of this check.
        joins = [re.sub(r"\[default\d+\]:[^\n]*\n", "", log) for log in logs]
        c.check(
            all(f'joined job "{job}" as rank {i} of {world}' in log for i, log in enumerate(joins)),
            f"{label}: node i joined job {job} as rank i of {world}",
        )
        c.check(f"saved a checkpoint of step {STEPS}" in logs[0], f"{label}: checkpoint of step {STEPS} saved")
        if c.failures:
            return
        logs = run_nodes(c, label, scratch, nodes, address, RESUMED_STEPS)
        c.check(
            "resumed from" in logs[0] and f"after step {STEPS}" in logs[0],
            f"{label}: restarted with the same command lines, the job resumed after step {STEPS}",
        )
        c.check(
            all(f"rank {i}: resumed from" in log for i, log in enumerate(logs)),
            f"{label}: every rank loaded its state from the checkpoint",
        )
    finally:
        r.stack.stop()


# ---------------------------------------------------------------- sources


def compose_nodes(c, compose, image):
    ok, cfg = check_compose.resolved(compose, [check_compose.BASE, check_compose.TORCH])
    c.check(ok and cfg is not None, "compose: docker-compose.yml + docker-compose.torch.yml resolve")
    if cfg is None:
        return None, None, None
    services = cfg["services"]
    co = services["coordinator"]
    grpc_port = check_compose.flag(co["command"], "--listen").rsplit(":", 1)[1]
    nodes = []
    for name, s in sorted(services.items()):
        if not name.startswith("torch-worker-"):
            continue
        argv = (s.get("entrypoint") or image["ENTRYPOINT"])[len(LAUNCHER) :] + (s.get("command") or [])
        c.check((s.get("entrypoint") or image["ENTRYPOINT"]) == LAUNCHER, f"compose: {name} runs the launcher")
        nodes.append(Node(s.get("hostname", name), [str(a) for a in argv], {}, s.get("hostname", name)))
    c.check(len(nodes) >= 2, f"compose: torch workers ({[n.name for n in nodes]})")
    rank0 = next((n.name for n in nodes if n.name.endswith("-0")), None)
    expect = {"coordinator": f"coordinator:{grpc_port}", "master_addr": rank0, "metrics_port": 9465}
    return nodes, expect, co["command"]


def k8s_nodes(c, kubectl):
    r = dc.run([kubectl, "kustomize", os.path.join(dc.REPO, "deploy", "k8s", "overlays", "torch")])
    c.check(r.returncode == 0, f"k8s: kustomize overlays/torch: {r.stderr}")
    if r.returncode != 0:
        return None, None, None, None
    objs = {(o["kind"], o["metadata"]["name"]): o for o in dc.load_yaml(r.stdout, text=True) if o}
    dep = objs[("Deployment", "muonshard-coordinator")]
    job = objs[("Job", "muonshard-worker")]
    spec = job["spec"]["template"]["spec"]
    ct = next(x for x in spec["containers"] if x["name"] == "worker")
    env = {}
    for ef in ct.get("envFrom", []):
        env.update(objs[("ConfigMap", ef["configMapRef"]["name"])]["data"])
    env.update({e["name"]: e["value"] for e in ct.get("env", []) if "value" in e})
    world = int(env["WORLD_SIZE"])
    c.check(job["spec"]["completions"] == world, f"k8s: one pod per node ({world})")
    command = ct.get("command") or []
    c.check(command == LAUNCHER, f"k8s: the worker container runs the launcher: {command}")
    nodes = []
    for i in range(world):
        pod = f"{job['metadata']['name']}-{i}"
        pod_ip = f"10.0.0.{10 + i}"  # what the downward API gives each pod
        pod_env = {**env, "JOB_COMPLETION_INDEX": str(i), "POD_IP": pod_ip, "POD_NAME": f"{pod}-x7k2p"}
        argv = ccl.k8s_expand(command[len(LAUNCHER) :] + ct.get("args", []), pod_env)
        nodes.append(Node(pod, argv, {k: v for k, v in env.items()}, pod_ip))
    expect = {
        "coordinator": env["COORDINATOR"],
        "master_addr": f"{job['metadata']['name']}-0.{spec['subdomain']}",
        "metrics_port": next(p["containerPort"] for p in ct["ports"] if p["name"] == "metrics"),
    }
    return nodes, expect, dep["spec"]["template"]["spec"]["containers"][0]["args"], env


def main():
    which, tool = dc.variant_and_tool("check_torch.py")
    try:
        import torch  # noqa: F401
        from torch.distributed.run import get_args_parser
    except ImportError as e:
        dc.skip(f"torch is not importable by {sys.executable} ({e})")
    package = os.path.join(os.path.dirname(dc.bin_dir()), "python", "muonshard")
    if not os.path.isdir(package):
        dc.skip(f"the Python package is not built ({package})")
    for b in ("muonshard-coordinator", "muonshardctl"):
        if not os.access(os.path.join(dc.bin_dir(), b), os.X_OK):
            print(f"FAIL: {dc.bin_dir()}/{b} is missing (build it first)")
            sys.exit(1)
    c = dc.Checker(f"deploy_torch_{which}")

    image = torch_image()
    c.check(image is not None, "worker.Dockerfile has a torch stage")
    if image is None:
        c.finish()
    c.check(image["ENTRYPOINT"] == LAUNCHER, f"the torch image's ENTRYPOINT is the launcher: {image['ENTRYPOINT']}")
    if image["CMD"]:
        _, err = parse(lambda a: get_args_parser().parse_args(a), image["CMD"])
        c.check(err is None or err[0] == 0, f"the torch image's CMD {image['CMD']} is a launcher command line: {err}")

    if which == "compose":
        nodes, expect, coordinator_argv = compose_nodes(c, tool, image)
    else:
        nodes, expect, coordinator_argv, _ = k8s_nodes(c, tool)
    ordered = check_nodes(c, which, nodes, image, expect) if nodes else None
    if ordered is None or c.failures:
        c.finish()

    with dc.scratch_run(c, f"muonshard-deploy-torch-{which}-") as scratch:
        run(c, which, os.path.join(scratch, "run"), ordered, coordinator_argv)
    c.finish()


if __name__ == "__main__":
    main()
