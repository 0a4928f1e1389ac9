#!/usr/bin/env python3
"""deploy_compose: `docker-compose config -q` accepts docker-compose.yml and
docker-compose.yml + docker-compose.gpu.yml, and the resolved configurations
hold the demo together: the coordinator's healthcheck and named volume, the
one-shot submission after the coordinator is healthy, four Gloo workers (one
per rank 0..3, world size = the submitted one) that start after a successful
submission, Prometheus scraping exactly these services on their metrics
ports, Grafana provisioned with the dashboard; in the GPU variant, NCCL and
one reserved GPU per worker.

Recovery (every variant): each worker restarts on failure a bounded number
of times (`restart: on-failure:N`, which docker-compose 1.29 and Compose v2
both honour; deploy.restart_policy is swarm's), checkpoints its job into
<mount>/<job> (--checkpoint-every in 1..--steps) on a writable named volume
that every worker shares (every rank writes its shard into one directory,
rank 0 commits) and that its image creates owned by its uid (so a fresh
volume is writable), resumes (--resume) and re-forms a broken group in its
process (--max-restarts >= 1); its host identity is its container's
hostname, which a restarted container keeps (the coordinator hands a known
identity its rank back at once).

docker-compose.yml + docker-compose.torch.yml: all of the above unchanged,
plus the torch workers (the PyTorch example under torch's launcher): the
torch image built from its Dockerfile stage, one service per node rank with
its own hostname, started after a healthy coordinator (not after the
submission: rank 0 submits), restarted on failure (on-failure:N), and one
named volume shared by every node holding --checkpoint-dir, so a restarted
container resumes. (deploy_torch_compose parses and runs their command
lines.)"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_images
import deploy_common as dc

BASE = os.path.join(dc.REPO, "docker-compose.yml")
GPU = os.path.join(dc.REPO, "docker-compose.gpu.yml")
TORCH = os.path.join(dc.REPO, "docker-compose.torch.yml")
TORCH_SCRIPT = "/opt/muonshard/examples/torch/train_gpt.py"


def flag(argv, name):
    """Value of `--name V` or `--name=V` in an argv list, else None."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def volumes_of(service):
    """A service's mounts as {type, source, target, read_only}: `config` of
    docker-compose 1.29 prints "source:target[:mode]", Compose v2 the long
    form."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out.append(
                {
                    "type": v.get("type"),
                    "source": v.get("source"),
                    "target": v.get("target"),
                    "read_only": bool(v.get("read_only")),
                }
            )
            continue
        parts = v.split(":")
        if len(parts) == 1:
            out.append({"type": "volume", "source": None, "target": parts[0], "read_only": False})
            continue
        kind = "bind" if parts[0].startswith(("/", ".")) else "volume"
        out.append(
            {
                "type": kind,
                "source": parts[0],
                "target": parts[1],
                "read_only": len(parts) > 2 and "ro" in parts[2].split(","),
            }
        )
    return out


def restart_policy(service):
    """(name, maximum retries or None) of `restart:` ("on-failure:3")."""
    name, _, count = str(service.get("restart", "no")).partition(":")
    return name, int(count) if count.isdigit() else None


def check_restart(c, where, service):
    name, count = restart_policy(service)
    c.check(
        name == "on-failure" and count is not None and count >= 1,
        f"{where}: restarts on failure, a bounded number of times (restart: on-failure:N): {service.get('restart')!r}",
    )
    c.check(
        "restart_policy" not in service.get("deploy", {}),
        f"{where}: no deploy.restart_policy (swarm's; docker-compose 1.29 ignores it, Compose v2 "
        f"would let it override restart:)",
    )


def image_creates(service, target):
    """Whether the service's Dockerfile stage creates `target` owned by the
    stage's USER (`install -d -o UID -g GID ... target`): a fresh named
    volume mounted there is then the uid's, so writable."""
    build = service.get("build") or {}
    df = os.path.join(build.get("context", dc.REPO), build.get("dockerfile", "Dockerfile"))
    if not build.get("target") or not os.path.isfile(df):
        return False
    with open(df) as f:
        text = f.read().replace("\\\n", " ")
    all_stages = check_images.stages(text)
    stage = {st[0]: st for st in all_stages}.get(build["target"])
    if stage is None:
        return False
    body = check_images.chain_body(all_stages, stage)  # with the stages it is built on
    user = re.findall(r"^USER\s+(\d+):(\d+)\s*$", body, re.M)
    if not user:
        return False
    uid, gid = user[-1]
    for m in re.finditer(r"install\s+-d\s+-o\s+(\d+)\s+-g\s+(\d+)\s+-m\s+\d+((?:\s+/\S+)+)", body):
        if (m.group(1), m.group(2)) == (uid, gid) and target.rstrip("/") in m.group(3).split():
            return True
    return False


def check_checkpoints(c, where, cfg, service, argv, shared):
    """--checkpoint-dir <named volume mount>/<job> with --resume and a
    period within the run; adds (volume, dir) to `shared`."""
    ckpt = flag(argv, "--checkpoint-dir") or ""
    mounts = [v for v in volumes_of(service) if ckpt.startswith(v["target"].rstrip("/") + "/")]
    c.check(
        len(mounts) == 1
        and mounts[0]["type"] == "volume"
        and mounts[0]["source"] in cfg.get("volumes", {})
        and not mounts[0]["read_only"],
        f"{where}: --checkpoint-dir {ckpt!r} lies in a writable named volume: {volumes_of(service)}",
    )
    if mounts:
        c.check(
            image_creates(service, mounts[0]["target"]),
            f"{where}: its image's stage creates {mounts[0]['target']} owned by its USER "
            f"(a fresh volume there is writable)",
        )
        shared.add((mounts[0]["source"], ckpt))
    c.check(
        ckpt.rstrip("/").rsplit("/", 1)[-1] == flag(argv, "--job"),
        f"{where}: one checkpoint directory per job (<mount>/{flag(argv, '--job')}): {ckpt!r}",
    )
    every, steps = flag(argv, "--checkpoint-every") or "", flag(argv, "--steps") or ""
    c.check(
        every.isdigit() and steps.isdigit() and 0 < int(every) <= int(steps),
        f"{where}: a checkpoint every {every} steps, within the run's {steps}",
    )
    c.check("--resume" in argv, f"{where}: --resume (the newest checkpoint, step 0 while there is none)")


def resolved(compose, files):
    args = [compose]
    for f in files:
        args += ["-f", f]
    r = dc.run(args + ["config", "-q"], cwd=dc.REPO)
    ok = r.returncode == 0
    if not ok:
        print(r.stdout + r.stderr)
    r2 = dc.run(args + ["config"], cwd=dc.REPO)
    return ok, (dc.load_yaml(r2.stdout, text=True)[0] if r2.returncode == 0 else None)


def check_common(c, cfg, label, backend):
    services = cfg["services"]
    co = services.get("coordinator")
    c.check(co is not None, f"{label}: a coordinator service")
    if co is None:
        return
    hc = co.get("healthcheck", {}).get("test", [])
    c.check(
        hc[:3] == ["CMD", "muonshardctl", "health"], f"{label}: coordinator healthcheck runs muonshardctl health: {hc}"
    )
    data_dir = flag(co.get("command", []), "--data-dir")
    vols = volumes_of(co)
    c.check(
        any(v["type"] == "volume" and v["target"] == data_dir and v["source"] in cfg.get("volumes", {}) for v in vols),
        f"{label}: a named volume at the coordinator's --data-dir {data_dir}: {vols}",
    )
    c.check(
        flag(co.get("command", []), "--metrics-host") == "0.0.0.0",
        f"{label}: coordinator metrics reachable from the network (--metrics-host 0.0.0.0)",
    )
    c.check(
        (flag(co.get("command", []), "--listen") or "").startswith("0.0.0.0:"),
        f"{label}: coordinator listens on all interfaces",
    )
    coordinator_metrics = flag(co["command"], "--metrics-port")
    grpc_port = flag(co["command"], "--listen").rsplit(":", 1)[1]

    sub = services.get("submit-plan", {})
    sub_argv = (sub.get("entrypoint") or []) + (sub.get("command") or [])
    c.check(sub_argv[:2] == ["muonshardctl", "submit"], f"{label}: submit-plan runs muonshardctl submit")
    c.check(
        sub.get("depends_on", {}).get("coordinator", {}).get("condition") == "service_healthy",
        f"{label}: submit-plan waits for a healthy coordinator",
    )
    c.check(sub.get("restart", "no") == "no", f"{label}: submit-plan is one-shot")
    c.check(
        flag(sub_argv, "--coordinator") == f"coordinator:{grpc_port}", f"{label}: submit-plan dials the coordinator"
    )
    manifest = flag(sub_argv, "--manifest")
    mounted = [
        v for v in volumes_of(sub) if v["type"] == "bind" and manifest and manifest.startswith(v["target"] + "/")
    ]
    c.check(
        mounted and os.path.isfile(os.path.join(mounted[0]["source"], manifest[len(mounted[0]["target"]) + 1 :])),
        f"{label}: the submitted manifest {manifest} is mounted from the repository",
    )
    world = int(flag(sub_argv, "--world-size") or 0)

    workers = {n: s for n, s in services.items() if n.startswith("worker-")}
    c.check(world == 4 and len(workers) == world, f"{label}: 4 workers for world size {world}: {sorted(workers)}")
    ranks, jobs, shared = [], set(), set()
    for name, w in sorted(workers.items()):
        argv = w.get("command", [])
        rank = flag(argv, "--rank")
        ranks.append(rank)
        jobs.add(flag(argv, "--job"))
        c.check(flag(argv, "--backend") == backend, f"{label}: {name} uses --backend {backend}")
        c.check(flag(argv, "--coordinator") == f"coordinator:{grpc_port}", f"{label}: {name} dials the coordinator")
        c.check(name == f"worker-{rank}", f"{label}: {name} runs rank {rank}")
        c.check(
            flag(argv, "--hostname") == w.get("hostname") == name,
            f"{label}: {name} binds and advertises its own hostname for Gloo",
        )
        c.check(
            flag(argv, "--metrics-host") == "0.0.0.0"
            and flag(argv, "--metrics-port") == "9465"
            and flag(argv, "--local-rank") == "0",
            f"{label}: {name} serves /metrics on 0.0.0.0:9465 (+ local rank 0)",
        )
        deps = w.get("depends_on", {})
        c.check(
            deps.get("coordinator", {}).get("condition") == "service_healthy"
            and deps.get("submit-plan", {}).get("condition") == "service_completed_successfully",
            f"{label}: {name} starts after a healthy coordinator and a successful submission",
        )
        # Recovery.
        check_restart(c, f"{label}: {name}", w)
        check_checkpoints(c, f"{label}: {name}", cfg, w, argv, shared)
        restarts = flag(argv, "--max-restarts") or ""
        c.check(
            restarts.isdigit() and int(restarts) >= 1,
            f"{label}: {name} re-forms a broken group in its process (--max-restarts {restarts or None} >= 1)",
        )
        c.check(
            flag(argv, "--host-id") in (None, w.get("hostname")),
            f"{label}: {name}'s host identity is its hostname, which its restarted container keeps "
            f"(the coordinator hands a known identity its rank)",
        )
        grace = flag(argv, "--rejoin-grace")
        c.check(
            grace is None or (grace.replace(".", "", 1).isdigit() and float(grace) > 0),
            f"{label}: {name} --rejoin-grace {grace} is a positive number of seconds",
        )
    c.check(len(shared) == 1, f"{label}: every worker shares one checkpoint directory: {sorted(shared)}")
    c.check(sorted(ranks) == [str(r) for r in range(world)], f"{label}: ranks 0..{world - 1}: {ranks}")
    c.check(len(jobs) == 1 and None not in jobs, f"{label}: one job: {jobs}")

    # Prometheus: its config is the repository's, scraping these services.
    prom = services.get("prometheus", {})
    pvols = {v["target"]: v["source"] for v in volumes_of(prom)}
    c.check(
        pvols.get("/etc/prometheus") == os.path.join(dc.REPO, "deploy", "prometheus"),
        f"{label}: Prometheus mounts deploy/prometheus",
    )
    pcfg = dc.load_yaml(dc.PROMETHEUS_CONFIG)
    targets = {t for sc in pcfg["scrape_configs"] for st in sc["static_configs"] for t in st["targets"]}
    want = {f"coordinator:{coordinator_metrics}"} | {f"{n}:9465" for n in workers}
    c.check(targets == want, f"{label}: prometheus.yml scrapes {sorted(want)}, has {sorted(targets)}")
    # Grafana: provisioning and the dashboard where the provider reads it.
    g = services.get("grafana", {})
    gvols = {v["target"]: v["source"] for v in volumes_of(g)}
    c.check(
        gvols.get("/etc/grafana/provisioning") == os.path.join(dc.REPO, "deploy", "grafana", "provisioning"),
        f"{label}: Grafana provisioning mounted",
    )
    c.check(
        gvols.get("/etc/dashboards/muonshard/muonshard.json") == dc.DASHBOARD,
        f"{label}: the dashboard mounted where the provider reads it",
    )
    # Every bind mount exists; no image floats.
    for name, s in services.items():
        for v in volumes_of(s):
            if v["type"] == "bind":
                c.check(os.path.exists(v["source"]), f"{label}: {name} mounts {v['source']}, which exists")
        image = s.get("image", "")
        c.check(":" in image and not image.endswith(":latest"), f"{label}: {name} image {image!r} has a fixed tag")
        if "build" in s:
            df = os.path.join(s["build"]["context"], s["build"].get("dockerfile", "Dockerfile"))
            c.check(os.path.isfile(df), f"{label}: {name} builds from {df}, which exists")
            target = s["build"].get("target")
            if target:
                with open(df) as f:
                    text = f.read()
                c.check(f" AS {target}\n" in text, f"{label}: {name} build target {target} is a stage of {df}")


def check_torch(c, cfg):
    """The torch workers of docker-compose.torch.yml (their flags: deploy_torch_compose)."""
    services = cfg["services"]
    grpc_port = flag(services["coordinator"]["command"], "--listen").rsplit(":", 1)[1]
    torch = {n: s for n, s in services.items() if n.startswith("torch-worker-")}
    c.check(len(torch) == 2, f"torch: 2 torch workers: {sorted(torch)}")
    ckpt_volumes, jobs = set(), set()
    for name, s in sorted(torch.items()):
        argv = [str(a) for a in s.get("command", [])]
        where = f"torch: {name}"
        c.check(
            s.get("image", "").startswith("muonshard/worker:") and s["image"].endswith("-torch"),
            f"{where}: runs the torch image ({s.get('image')})",
        )
        c.check(s.get("build", {}).get("target") == "torch", f"{where}: built from the torch stage")
        c.check("entrypoint" not in s, f"{where}: the image's ENTRYPOINT (torch's launcher) runs the command")
        c.check(name == f"torch-worker-{flag(argv, '--node_rank')}", f"{where}: node rank {flag(argv, '--node_rank')}")
        c.check(
            flag(argv, "--nnodes") == str(len(torch)) and flag(argv, "--nproc_per_node") == "1",
            f"{where}: one process on each of {len(torch)} nodes",
        )
        c.check(
            flag(argv, "--master_addr") == "torch-worker-0" == services.get("torch-worker-0", {}).get("hostname"),
            f"{where}: the rendezvous on torch-worker-0, node rank 0's hostname",
        )
        c.check(
            flag(argv, "--redirects") == "1" and flag(argv, "--tee") == "1",
            f"{where}: --redirects 1 --tee 1 (torch 1.13's launcher on Python 3.11)",
        )
        c.check(TORCH_SCRIPT in argv, f"{where}: runs {TORCH_SCRIPT}")
        script = argv[argv.index(TORCH_SCRIPT) + 1 :] if TORCH_SCRIPT in argv else []
        c.check(flag(script, "--coordinator") == f"coordinator:{grpc_port}", f"{where}: dials the coordinator")
        c.check(
            flag(script, "--hostname") == s.get("hostname") == name,
            f"{where}: Gloo binds and advertises its own hostname",
        )
        c.check(flag(script, "--metrics-port") == "9465", f"{where}: /metrics on 9465 (+ local rank 0)")
        jobs.add(flag(script, "--job"))
        deps = s.get("depends_on", {})
        c.check(
            deps.get("coordinator", {}).get("condition") == "service_healthy" and "submit-plan" not in deps,
            f"{where}: starts after a healthy coordinator (rank 0 submits its own plan)",
        )
        check_restart(c, where, s)
        check_checkpoints(c, where, cfg, s, script, ckpt_volumes)
    c.check(len(ckpt_volumes) == 1, f"torch: every node shares one checkpoint directory: {sorted(ckpt_volumes)}")
    demo_jobs = {flag(s.get("command", []), "--job") for n, s in services.items() if n.startswith("worker-")}
    c.check(
        len(jobs) == 1 and None not in jobs and not jobs & demo_jobs,
        f"torch: one job {jobs}, not the demo's {demo_jobs}",
    )


def main():
    compose = dc.require_tool("docker-compose")
    c = dc.Checker("deploy_compose")
    ok, base = resolved(compose, [BASE])
    c.check(ok, "docker-compose -f docker-compose.yml config -q")
    if base:
        check_common(c, base, "cpu", "gloo")
        c.check(
            all(s.get("image", "").endswith("-cpu") for n, s in base["services"].items() if n.startswith("worker-")),
            "cpu: workers run the CPU image",
        )
    ok, gpu = resolved(compose, [BASE, GPU])
    c.check(ok, "docker-compose -f docker-compose.yml -f docker-compose.gpu.yml config -q")
    if gpu:
        check_common(c, gpu, "gpu", "nccl")
        ids = []
        for name, s in sorted(gpu["services"].items()):
            if not name.startswith("worker-"):
                continue
            devices = s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
            c.check(
                len(devices) == 1
                and devices[0].get("driver") == "nvidia"
                and "gpu" in devices[0].get("capabilities", [])
                and len(devices[0].get("device_ids", [])) == 1,
                f"gpu: {name} reserves one NVIDIA GPU: {devices}",
            )
            ids += [d for dev in devices for d in dev.get("device_ids", [])]
            c.check(
                s["build"].get("target") == "gpu" and s["image"].endswith("-gpu"), f"gpu: {name} runs the GPU image"
            )
        c.check(len(ids) == len(set(ids)) == 4, f"gpu: each worker its own GPU: {ids}")
    ok, torch_cfg = resolved(compose, [BASE, TORCH])
    c.check(ok, "docker-compose -f docker-compose.yml -f docker-compose.torch.yml config -q")
    if torch_cfg:
        check_common(c, torch_cfg, "torch", "gloo")
        if base:
            # (a merge may reorder ports and mounts)
            def unordered(services):
                return {
                    n: {k: sorted(map(str, v)) if k in ("ports", "volumes") else v for k, v in s.items()}
                    for n, s in services.items()
                    if not n.startswith("torch-worker-")
                }

            c.check(
                unordered(torch_cfg["services"]) == unordered(base["services"]),
                "torch: docker-compose.torch.yml changes no service of docker-compose.yml",
            )
        check_torch(c, torch_cfg)
    c.finish()


if __name__ == "__main__":
    main()
