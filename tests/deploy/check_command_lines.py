#!/usr/bin/env python3
"""deploy_command_lines_{compose,k8s}: the command lines the deployments run are ones the
binaries accept, and the CPU ones really run.

1. Every flag in every command line of docker-compose.yml (+ the GPU
   override) and the Dockerfiles' CMD / HEALTHCHECK (`compose`), or of the
   rendered Kubernetes overlays cpu and gpu: containers, init containers,
   exec probes (`k8s`), is in the `--help` of the program it runs. Every env
   variable a Kubernetes pod sets (env, envFrom ConfigMaps) is substituted
   into an argument of the pod or read by the binaries
   (client/coordinator_client.h's kEnvironmentFlags) or OpenBLAS, and every
   containerPort and published compose port of a muonshard program is one
   its flags make it listen on. (The images these command lines run:
   scripts/images.sh, run for real by deploy_containers.)
2. The compose demo and the Kubernetes cpu overlay, run for real on
   127.0.0.1: the coordinator with its deployment arguments, the submission
   exactly as deployed, then the four workers exactly as deployed (with
   ConfigMap values and the downward API substituted as Kubernetes would),
   except for what loopback needs: addresses (127.0.0.1, ports picked by the
   OS), 2 steps, no linger, the checkpoint directory in a scratch folder.
   Every worker must finish with exit 0 (--resume with no checkpoint yet
   starts from step 0) and rank 0 commit the checkpoint of step 2. Then the
   same command lines again, as restarted containers / replacement pods
   (new pod names), to step 4: every rank must resume from step 2.
3. Recovery as deployed: the same command lines to step 24; once rank 0 is
   past step 8, rank 2 is killed (SIGKILL) and its restarted container /
   replacement pod started with its command line (in Kubernetes with a new
   pod name). The survivors must re-form the group with it (--max-restarts,
   --rejoin-grace), it must take its rank back at once (its host identity is
   the same) and resume from the checkpoint, and every process must finish
   the run with exit 0."""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_compose
import deploy_common as dc

PROGRAMS = ("muonshard-coordinator", "muonshard-worker", "muonshardctl")


def help_flags(binary, sub=None):
    argv = [binary] + ([sub] if sub else []) + ["--help"]
    r = dc.run(argv, timeout=30)
    return set(re.findall(r"^\s+(--[a-z0-9-]+)\b", r.stdout + r.stderr, re.M)) | {"--help"}


def used_flags(argv):
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def command_lines(compose_cfgs, renders, dockerfiles):
    """(where, program, subcommand, argv-after-program)."""
    out = []
    for label, cfg in compose_cfgs:
        for name, s in cfg["services"].items():
            if name == "coordinator":
                out.append((f"compose {label} {name}", "muonshard-coordinator", None, s["command"]))
                hc = s["healthcheck"]["test"]
                out.append((f"compose {label} {name} healthcheck", "muonshardctl", hc[2], hc[3:]))
            elif name == "submit-plan":
                argv = s["entrypoint"] + s["command"]
                out.append((f"compose {label} {name}", "muonshardctl", argv[1], argv[2:]))
            elif name.startswith("worker-"):
                out.append((f"compose {label} {name}", "muonshard-worker", None, s["command"]))
    for label, docs in renders:
        for o in docs:
            if o.get("kind") not in ("Deployment", "Job"):
                continue
            spec = o["spec"]["template"]["spec"]
            for ct in spec.get("initContainers", []) + spec["containers"]:
                cmd = ct.get("command") or []
                prog = (
                    os.path.basename(cmd[0])
                    if cmd
                    else ("muonshard-coordinator" if "coordinator" in ct["image"] else "muonshard-worker")
                )
                rest = cmd[1:] + ct.get("args", [])
                sub = rest.pop(0) if prog == "muonshardctl" else None
                out.append((f"k8s {label} {o['kind']}/{ct['name']}", prog, sub, rest))
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    ex = ct.get(probe, {}).get("exec", {}).get("command")
                    if ex:
                        out.append((f"k8s {label} {ct['name']} {probe}", ex[0], ex[1], ex[2:]))
    for df in ("coordinator.Dockerfile", "worker.Dockerfile") if dockerfiles else ():
        with open(os.path.join(dc.REPO, "deploy", "docker", df)) as f:
            text = f.read().replace("\\\n", " ")
        for m in re.finditer(r"^HEALTHCHECK .*?CMD (\[.*\])", text, re.M):
            argv = eval(m.group(1))  # a JSON-style list literal
            out.append((f"{df} HEALTHCHECK", argv[0], argv[1], argv[2:]))
        entry = None
        for line in text.splitlines():
            if line.startswith("ENTRYPOINT"):
                entry = eval(line.split(None, 1)[1])[0]
            # (The torch image's ENTRYPOINT is torch's launcher: deploy_torch_* checks it.)
            # (A bare ["--help"] CMD, as the tools image's, is no deployment's command line.)
            if line.startswith("CMD") and entry and entry != "python3" and eval(line.split(None, 1)[1]) != ["--help"]:
                out.append((f"{df} CMD", entry, None, eval(line.split(None, 1)[1])))
    return out


# Variables the runtime libraries read (OpenBLAS's thread count).
LIBRARY_ENV = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}


def client_env_variables():
    """The variables muonshardctl and the worker read (kEnvironmentFlags of
    client/coordinator_client.h: MUONSHARD_COORDINATOR, ...)."""
    with open(os.path.join(dc.REPO, "client", "coordinator_client.h")) as f:
        text = f.read()
    m = re.search(r"kEnvironmentFlags\[\] = \{(.*?)\};", text, re.S)
    return set(re.findall(r'\{"([A-Z0-9_]+)", "[a-z-]+"\}', m.group(1) if m else ""))


def listened_ports(argv):
    """Ports a muonshard program's command line makes it listen on: --listen
    HOST:PORT and --metrics-port P (+ --local-rank)."""
    ports = set()
    args = {}
    for i, a in enumerate(argv):
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            args[k] = v
        elif a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            args[a] = argv[i + 1]
    if ":" in args.get("--listen", ""):
        ports.add(int(args["--listen"].rsplit(":", 1)[1]))
    if args.get("--metrics-port", "").isdigit():
        ports.add(int(args["--metrics-port"]) + int(args.get("--local-rank", "0") or 0))
    return ports


def check_env_and_ports(c, compose_cfgs, renders):
    """Every env variable the Kubernetes manifests set in a muonshard pod is
    used: substituted into an argument ($(VAR)) of a container of the pod,
    read by the binaries (kEnvironmentFlags) or by OpenBLAS; every
    containerPort / published compose port of a muonshard program is one its
    command line listens on."""
    known = client_env_variables()
    c.check(len(known) >= 3, f"client/coordinator_client.h's kEnvironmentFlags: {sorted(known)}")
    for label, docs in renders:
        config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in docs if o.get("kind") == "ConfigMap"}
        for o in docs:
            if o.get("kind") not in ("Deployment", "Job"):
                continue
            spec = o["spec"]["template"]["spec"]
            cts = spec.get("initContainers", []) + spec["containers"]
            text = " ".join(" ".join((ct.get("command") or []) + (ct.get("args") or [])) for ct in cts)
            for ct in cts:
                where = f"k8s {label} {o['kind']}/{ct['name']}"
                names = [e["name"] for e in ct.get("env", []) or []]
                for ef in ct.get("envFrom", []) or []:
                    names += list(config_maps.get(ef.get("configMapRef", {}).get("name"), {}))
                for n in names:
                    c.check(
                        f"$({n})" in text or n in known or n in LIBRARY_ENV,
                        f"{where}: env {n} is in no argument of the pod ($({n})) and read by no binary",
                    )
                argv = (ct.get("command") or [])[1:] + (ct.get("args") or [])
                listens = listened_ports(argv)
                for p in ct.get("ports", []) or []:
                    c.check(
                        p["containerPort"] in listens,
                        f"{where}: containerPort {p['containerPort']} is one its flags listen on {sorted(listens)}",
                    )
    for label, cfg in compose_cfgs:
        for name, s in cfg["services"].items():
            if name != "coordinator" and not name.startswith("worker-"):
                continue
            listens = listened_ports(s["command"])
            for p in s.get("ports", []) or []:
                target = int(p["target"]) if isinstance(p, dict) else int(str(p).rsplit(":", 1)[1].split("/")[0])
                c.check(
                    target in listens,
                    f"compose {label} {name}: publishes {target}, its flags listen on {sorted(listens)}",
                )
            for n in s.get("environment", {}) or {}:
                c.check(n in known or n in LIBRARY_ENV, f"compose {label} {name}: env {n} is read by no binary")


def substitute(argv, values):
    """Sets `--flag VALUE` / `--flag=VALUE` of the flags in `values`."""
    out, skip_next = [], False
    for _i, a in enumerate(argv):
        if skip_next:
            skip_next = False
            continue
        name = a.split("=", 1)[0]
        if name in values:
            out.append(f"{name}={values[name]}")
            skip_next = "=" not in a
        else:
            out.append(a)
    return out


def k8s_expand(argv, env):
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], a) for a in argv]


class Run:
    """One deployment's coordinator, submission and workers on loopback."""

    def __init__(self, c, label, scratch):
        self.c, self.label = c, label
        os.makedirs(scratch)
        self.stack = dc.LoopbackStack(scratch)
        self.scratch = scratch

    def coordinator(self, argv):
        port_file = os.path.join(self.scratch, "coordinator.port")
        argv = substitute(
            argv,
            {
                "--listen": "127.0.0.1:0",
                "--metrics-host": "127.0.0.1",
                "--metrics-port": "0",
                "--data-dir": os.path.join(self.scratch, "data"),
            },
        )
        p = self.stack.spawn(
            "coordinator", [self.stack.binary("muonshard-coordinator"), *argv, "--port-file", port_file]
        )
        ports = self.stack._wait_port_file("coordinator", p, port_file, 30)
        self.stack.coordinator_port = ports["grpc_port"]
        return self.stack.address

    def submit(self, argv):
        r = dc.run([self.stack.binary("muonshardctl"), "submit", *argv], timeout=60)
        self.c.check(r.returncode == 0, f"{self.label}: submission {argv} exit {r.returncode}: {r.stderr}")

    def workers(self, argvs, name="worker", timeout=240):
        procs = []
        for i, argv in enumerate(argvs):
            procs.append((i, self.stack.spawn(f"{name}-{i}", [self.stack.binary("muonshard-worker"), *argv])))
        deadline = time.monotonic() + timeout
        for i, p in procs:
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self.c.check(
                p.returncode == 0,
                f"{self.label}: {name} {i} exit {p.returncode}:\n{self.stack.log_of(f'{name}-{i}')[-3000:]}",
            )
        return [self.stack.log_of(f"{name}-{i}") for i, _ in procs]

    def check_resumed(self, first, again, job):
        """The logs of a first run (2 steps) and of the same command lines
        run again to step 4."""
        self.c.check(
            bool(first) and f"checkpoint of step {STEPS} committed" in first[0],
            f"{self.label}: rank 0 committed the checkpoint of step {STEPS} of job {job}",
        )
        self.c.check(
            all(f"rank {i}: resumed from" in log and f"(step {STEPS}," in log for i, log in enumerate(again)),
            f"{self.label}: run again (restarted containers / replacement pods), every rank resumed from step {STEPS}",
        )

    def kill_and_replace(self, argvs, replacement, name="recovery", timeout=120):
        """Runs `argvs` to RECOVERY_STEPS; once rank 0 logged step KILL_AT,
        SIGKILLs worker VICTIM and starts `replacement` (its restarted
        container or replacement pod). Every process but the killed one must
        exit 0 and the replacement resume from a checkpoint."""
        binary = self.stack.binary("muonshard-worker")
        procs = [self.stack.spawn(f"{name}-{i}", [binary, *argv]) for i, argv in enumerate(argvs)]
        deadline = time.monotonic() + timeout
        reached = False
        while time.monotonic() < deadline and not any(p.poll() is not None for p in procs):
            done = re.findall(r"^rank 0: step (\d+)/", self.stack.log_of(f"{name}-0"), re.M)
            if done and int(done[-1]) >= KILL_AT:
                reached = True
                break
            time.sleep(0.05)
        self.c.check(
            reached and procs[VICTIM].poll() is None,
            f"{self.label}: every worker still running at step {KILL_AT}:\n{self.stack.log_of(f'{name}-0')[-2000:]}",
        )
        if not reached:
            return
        procs[VICTIM].kill()
        procs[VICTIM].wait(timeout=30)
        label = f"{name}-{VICTIM}-replacement"
        survivors = [(f"{name}-{i}", p) for i, p in enumerate(procs) if i != VICTIM]
        survivors.append((label, self.stack.spawn(label, [binary, *replacement])))
        for n, p in survivors:
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self.c.check(
                p.returncode == 0, f"{self.label}: recovery: {n} exit {p.returncode}:\n{self.stack.log_of(n)[-3000:]}"
            )
        self.c.check(
            f"rank {VICTIM}: resumed from" in self.stack.log_of(label),
            f"{self.label}: recovery: rank {VICTIM}'s replacement took its rank back and resumed from the checkpoint",
        )
        self.c.check(
            f"checkpoint of step {RECOVERY_STEPS} committed" in self.stack.log_of(f"{name}-0"),
            f"{self.label}: recovery: the group re-formed and finished step {RECOVERY_STEPS}",
        )


# Steps of the first run on loopback, of the same command lines again, and of
# the recovery run (rank VICTIM killed once rank 0 is past step KILL_AT).
STEPS, RESUMED_STEPS = 2, 4
RECOVERY_STEPS, KILL_AT, VICTIM = 24, 8, 2


def loopback(argv, address, scratch, steps=STEPS):
    """The deployed argv on 127.0.0.1; the checkpoint directory (the
    volume's) in the scratch folder, under the same name; rank 0 logs every
    step."""
    ckpt = check_compose.flag(argv, "--checkpoint-dir")
    return substitute(
        argv,
        {
            "--coordinator": address,
            "--hostname": "127.0.0.1",
            "--metrics-host": "127.0.0.1",
            "--metrics-port": "0",
            "--steps": str(steps),
            "--linger": "0",
            "--blas-threads": "1",
            "--log-every": "1",
            **({"--checkpoint-dir": os.path.join(scratch, "checkpoints", os.path.basename(ckpt))} if ckpt else {}),
        },
    )


def run_compose(c, cfg, scratch):
    s = cfg["services"]
    r = Run(c, "compose demo", scratch)
    try:
        address = r.coordinator(s["coordinator"]["command"])
        argv = s["submit-plan"]["entrypoint"][2:] + s["submit-plan"]["command"]
        # The manifest, from the repository folder compose mounts.
        for v in check_compose.volumes_of(s["submit-plan"]):
            m = check_compose.flag(argv, "--manifest")
            if v["type"] == "bind" and m.startswith(v["target"] + "/"):
                argv = substitute(argv, {"--manifest": v["source"] + m[len(v["target"]) :]})
        r.submit(substitute(argv, {"--coordinator": address}))
        names = sorted(n for n in s if n.startswith("worker-"))
        # In its container each worker's host name is its service's
        # `hostname:` (its JoinJob identity); on one machine it is given.
        logs = r.workers([loopback(s[n]["command"], address, scratch) + ["--host-id", s[n]["hostname"]] for n in names])
        job = check_compose.flag(s[names[0]]["command"], "--job")
        c.check(
            sum(f'joined job "{job}"' in log for log in logs) == len(names),
            f"compose demo: {len(names)} workers joined job {job}",
        )
        if c.failures:
            return

        # The containers restarted: the same commands (and host names).
        def commands(steps):
            return [loopback(s[n]["command"], address, scratch, steps) + ["--host-id", s[n]["hostname"]] for n in names]

        again = r.workers(commands(RESUMED_STEPS), name="restarted")
        r.check_resumed(logs, again, job)
        if c.failures:
            return
        r.kill_and_replace(commands(RECOVERY_STEPS), commands(RECOVERY_STEPS)[VICTIM])
    finally:
        r.stack.stop()


def run_k8s(c, docs, scratch):
    objs = {(o["kind"], o["metadata"]["name"]): o for o in docs}
    dep = objs[("Deployment", "muonshard-coordinator")]
    job = objs[("Job", "muonshard-worker")]
    spec = job["spec"]["template"]["spec"]
    init = spec["initContainers"][0]
    worker = spec["containers"][0]
    env = {}
    for ef in worker.get("envFrom", []):
        env.update(objs[("ConfigMap", ef["configMapRef"]["name"])]["data"])
    r = Run(c, "k8s cpu", scratch)
    try:
        address = r.coordinator(dep["spec"]["template"]["spec"]["containers"][0]["args"])
        # The manifest ConfigMap, mounted as a file.
        argv = k8s_expand(init["args"], {**env, "COORDINATOR": address})
        mount = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
        for v in spec["volumes"]:
            if "configMap" in v and v["name"] in mount:
                cm = objs[("ConfigMap", v["configMap"]["name"])]
                d = os.path.join(scratch, "cm-" + v["name"])
                os.makedirs(d)
                for k, val in cm["data"].items():
                    with open(os.path.join(d, k), "w") as f:
                        f.write(val)
                argv = [a.replace(mount[v["name"]], d) for a in argv]
        r.submit(argv)
        world = int(env["WORLD_SIZE"])
        c.check(job["spec"]["completions"] == world, "k8s cpu: one pod per rank")

        def pods(suffix, steps):
            """The worker pods' argvs. Each pod's hostname is <job>-<index>
            (the Indexed Job's: the worker's default host identity), kept by
            a replacement pod; on one machine it is given unless the args
            set --host-id."""
            argvs = []
            for rank in range(world):
                pod_env = {
                    **env,
                    "COORDINATOR": address,
                    "JOB_COMPLETION_INDEX": str(rank),
                    "POD_IP": "127.0.0.1",
                    "POD_NAME": f"{job['metadata']['name']}-{rank}-{suffix}",
                }
                argv = loopback(k8s_expand(worker["args"], pod_env), address, scratch, steps)
                if check_compose.flag(argv, "--host-id") is None:
                    argv += ["--host-id", f"{job['metadata']['name']}-{rank}"]
                argvs.append(argv)
            return argvs

        logs = r.workers(pods("x7k2p", STEPS))
        c.check(
            all(f'joined job "{env["MUONSHARD_JOB"]}" as rank {i} of {world}' in log for i, log in enumerate(logs)),
            f"k8s cpu: pod i joined job {env['MUONSHARD_JOB']} as rank i of {world}",
        )
        if c.failures:
            return
        # Replacement pods: the same args, new pod names.
        again = r.workers(pods("q4m9z", RESUMED_STEPS), name="replacement")
        r.check_resumed(logs, again, env["MUONSHARD_JOB"])
        if c.failures:
            return
        r.kill_and_replace(pods("b8w3n", RECOVERY_STEPS), pods("h5t6v", RECOVERY_STEPS)[VICTIM])
    finally:
        r.stack.stop()


def main():
    which, tool = dc.variant_and_tool("check_command_lines.py")
    bins = dc.bin_dir()
    for b in ("muonshard-coordinator", "muonshardctl"):
        if not os.access(os.path.join(bins, b), os.X_OK):
            print(f"FAIL: {bins}/{b} is missing (build it first)")
            sys.exit(1)
    if not os.access(os.path.join(bins, "muonshard-worker"), os.X_OK):
        dc.skip(f"{bins}/muonshard-worker is not built")
    c = dc.Checker(f"deploy_command_lines_{which}")

    compose_cfgs, renders = [], []
    if which == "compose":
        for label, files in (("cpu", [check_compose.BASE]), ("gpu", [check_compose.BASE, check_compose.GPU])):
            ok, cfg = check_compose.resolved(tool, files)
            c.check(ok and cfg is not None, f"compose {label} resolves")
            if cfg:
                compose_cfgs.append((label, cfg))
    else:
        for overlay in ("cpu", "gpu"):
            r = dc.run([tool, "kustomize", os.path.join(dc.REPO, "deploy", "k8s", "overlays", overlay)])
            c.check(r.returncode == 0, f"kustomize {overlay}: {r.stderr}")
            if r.returncode == 0:
                renders.append((overlay, dc.load_yaml(r.stdout, text=True)))

    helps = {}
    lines = command_lines(compose_cfgs, renders, dockerfiles=(which == "compose"))
    c.check(len(lines) >= 6, f"found the deployments' command lines ({len(lines)})")
    for where, prog, sub, argv in lines:
        c.check(prog in PROGRAMS, f"{where}: runs a muonshard program ({prog})")
        if prog not in PROGRAMS:
            continue
        key = (prog, sub)
        if key not in helps:
            helps[key] = help_flags(os.path.join(bins, prog), sub)
            c.check(len(helps[key]) >= 3, f"{prog} {sub or ''} --help lists flags")
        for f in used_flags(argv):
            c.check(f in helps[key], f"{where}: {prog} {sub or ''} has no flag {f}")

    check_env_and_ports(c, compose_cfgs, renders)

    with dc.scratch_run(c, f"muonshard-deploy-cmdlines-{which}-") as scratch:
        if compose_cfgs:
            run_compose(c, compose_cfgs[0][1], os.path.join(scratch, "compose"))
        if renders:
            run_k8s(c, renders[0][1], os.path.join(scratch, "k8s"))
    c.finish()


if __name__ == "__main__":
    main()
