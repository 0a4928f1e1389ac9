#!/usr/bin/env python3
"""deploy_kustomize: `kubectl kustomize` renders deploy/k8s/overlays/cpu, .../gpu,
.../torch, cpu + every component and torch + prometheus-operator, and the rendered objects pass a schema check.

The schema check is this file's own (no network here, so no kubeconform and
its OpenAPI schemas): it checks the fields these manifests rely on, by kind —
known apiVersion/kind pairs, required fields and their types, names, labels
and selectors that match, container ports / probes / env / resources /
securityContext well-formed, every ConfigMap, Secret, PVC and Service a pod or
argument refers to present in the render (Secrets marked optional, or created
by the cluster operator for a component, excepted), $(VAR) references in
args resolvable, no floating image tags — plus the cross-object facts of this
deployment (world size = Job completions, gRPC probes on the service the
coordinator registers, GPU resources only in the gpu overlay, the bundled
manifest copy identical to examples/manifests, the PrometheusRule identical
to the rules file). overlays/torch: the worker container is torch's launcher
(--redirects 1 --tee 1, node rank = completion index, the rendezvous on pod
0's stable name through a port the headless Service exposes) running the
image's examples/torch/train_gpt.py with the torch image, no plan
submission (deploy_torch_k8s parses and runs the command lines).

Recovery, in every render (check_recovery): the worker Job's pods are
replaced, not restarted in place (restartPolicy Never), under a well-formed
podFailurePolicy that fails the Job at once on exit code 2 (bad usage or
input) of any container, counts exit 1 and signals toward backoffLimit and
ignores disruptions (DisruptionTarget); backoffLimit is at least 4 per rank
(or backoffLimitPerIndex >= 4 with maxFailedIndexes 0). The program's
--checkpoint-dir is <mount>/.../$(MUONSHARD_JOB) on a writable mount of a
ReadWriteMany PVC in the render (every rank writes into one directory, rank
0 commits), with --checkpoint-every in 1..STEPS and --resume; the C++
workers also --max-restarts >= 1, a --rejoin-grace longer than
--comm-timeout (a replacement pod takes longer than a process) and a host
identity a replacement pod keeps (the pod hostname <job>-<index>, not the
pod's name: the coordinator hands a known identity its rank). Every PVC
is mounted by a pod, and the coordinator's --data-dir is its PVC (it adopts
running jobs from its store when it restarts)."""

import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc

K8S = os.path.join(dc.REPO, "deploy", "k8s")
NAMESPACE = "muonshard"
# Created by the cluster operator (documented in the components), never
# rendered: a non-optional reference to it is expected with the components.
EXTERNAL_SECRETS = {"muonshard-coordinator"}

KNOWN_KINDS = {
    ("v1", "Namespace"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
CLUSTER_SCOPED = {"Namespace"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(|[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FIELD_PATHS = re.compile(
    r"^(metadata\.name|metadata\.namespace|metadata\.uid|spec\.nodeName|"
    r"spec\.serviceAccountName|status\.hostIP|status\.podIP|status\.podIPs|"
    r"metadata\.labels\['[^']+'\]|metadata\.annotations\['[^']+'\])$"
)


def quantity(q, what):
    """CPU cores or bytes of a Kubernetes quantity."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    if not m:
        raise ValueError(f"{what}: bad quantity {q!r}")
    scale = {
        None: 1,
        "m": 1e-3,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
    }[m.group(2)]
    return float(m.group(1)) * scale


class Render:
    def __init__(self, label, docs):
        self.label = label
        self.objects = [d for d in docs if d]
        self.by_kind = {}
        for o in self.objects:
            self.by_kind.setdefault(o.get("kind"), {})[o.get("metadata", {}).get("name")] = o

    def get(self, kind, name):
        return self.by_kind.get(kind, {}).get(name)

    def named(self, kind, name_prefix):
        """The object of `kind` whose name is `name_prefix` or generated from
        it (configMapGenerator appends -<hash>)."""
        for n, o in self.by_kind.get(kind, {}).items():
            if n == name_prefix or re.fullmatch(re.escape(name_prefix) + r"-[a-z0-9]{10}", n or ""):
                return o
        return None


def pod_templates(render):
    """(owner label, pod template) of every workload."""
    out = []
    for kind in ("Deployment", "Job"):
        for name, o in render.by_kind.get(kind, {}).items():
            out.append((f"{kind}/{name}", o["spec"]["template"]))
    return out


def check_metadata(c, r, o):
    where = f"{r.label}: {o.get('kind')}/{o.get('metadata', {}).get('name')}"
    c.check(
        (o.get("apiVersion"), o.get("kind")) in KNOWN_KINDS,
        f"{where}: known apiVersion/kind {o.get('apiVersion')}/{o.get('kind')}",
    )
    md = o.get("metadata", {})
    name = md.get("name", "")
    pattern = DNS_LABEL if o.get("kind") in ("Service", "Namespace") else DNS_SUBDOMAIN
    c.check(bool(pattern.match(name)) and len(name) <= 63, f"{where}: valid name {name!r}")
    if o.get("kind") not in CLUSTER_SCOPED:
        c.check(md.get("namespace") == NAMESPACE, f"{where}: in namespace {NAMESPACE}")
    for k, v in (md.get("labels") or {}).items():
        c.check(
            bool(LABEL_KEY.match(k)) and isinstance(v, str) and bool(LABEL_VALUE.match(v)) and len(v) <= 63,
            f"{where}: valid label {k}={v!r}",
        )
    c.check(
        (md.get("labels") or {}).get("app.kubernetes.io/part-of") == "muonshard",
        f"{where}: labelled app.kubernetes.io/part-of=muonshard",
    )
    return where


def env_names(c, r, where, container):
    """Env var names a container defines, checking each source."""
    names = set()
    for e in container.get("env", []) or []:
        c.check(bool(ENV_NAME.match(e.get("name", ""))), f"{where}: env name {e.get('name')!r}")
        names.add(e.get("name"))
        if "valueFrom" in e:
            src = e["valueFrom"]
            c.check(len(src) == 1 and "value" not in e, f"{where}: env {e['name']} has one source")
            if "fieldRef" in src:
                c.check(
                    bool(FIELD_PATHS.match(src["fieldRef"].get("fieldPath", ""))),
                    f"{where}: env {e['name']} fieldPath {src['fieldRef'].get('fieldPath')!r}",
                )
            for ref_kind, key in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                if ref_kind in src:
                    ref = src[ref_kind]
                    obj = r.get(key, ref.get("name"))
                    c.check(
                        obj is not None or ref.get("optional"),
                        f"{where}: env {e['name']} refers to {key} {ref.get('name')} in the render",
                    )
        else:
            c.check(isinstance(e.get("value"), str), f"{where}: env {e.get('name')} value is a string")
    for ef in container.get("envFrom", []) or []:
        ref = ef.get("configMapRef") or ef.get("secretRef")
        kind = "ConfigMap" if "configMapRef" in ef else "Secret"
        obj = r.get(kind, ref.get("name"))
        c.check(obj is not None or ref.get("optional"), f"{where}: envFrom {kind} {ref.get('name')} in the render")
        if obj:
            for k in obj.get("data", {}):
                c.check(bool(ENV_NAME.match(k)), f"{where}: envFrom {kind} {ref['name']} key {k!r} is an env name")
                names.add(ef.get("prefix", "") + k)
    return names


def check_probe(c, where, probe, ports):
    handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc") if h in probe]
    c.check(len(handlers) == 1, f"{where}: exactly one handler ({handlers})")
    if "grpc" in probe:
        port = probe["grpc"].get("port")
        c.check(
            isinstance(port, int) and port in ports.values(),
            f"{where}: gRPC probe port {port} is a container port (grpc probes take numbers)",
        )
        c.check(isinstance(probe["grpc"].get("service", ""), str), f"{where}: gRPC probe service is a string")
    if "exec" in probe:
        c.check(
            isinstance(probe["exec"].get("command"), list) and probe["exec"]["command"],
            f"{where}: exec probe has a command",
        )
    for k in ("periodSeconds", "timeoutSeconds", "failureThreshold", "initialDelaySeconds"):
        if k in probe:
            c.check(isinstance(probe[k], int) and probe[k] >= 0, f"{where}: {k} is a non-negative int")


def check_pod(c, r, owner, template):
    where = f"{r.label}: {owner}"
    spec = template["spec"]
    labels = template.get("metadata", {}).get("labels", {})
    psc = spec.get("securityContext", {})
    c.check(
        psc.get("runAsNonRoot") is True and isinstance(psc.get("runAsUser"), int) and psc["runAsUser"] > 0,
        f"{where}: pod runs as a non-root uid",
    )
    c.check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: RuntimeDefault seccomp")
    c.check(spec.get("automountServiceAccountToken") is False, f"{where}: no service account token")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    c.check(len(volumes) == len(spec.get("volumes", [])), f"{where}: unique volume names")
    for name, v in volumes.items():
        sources = [k for k in v if k != "name"]
        c.check(len(sources) == 1, f"{where}: volume {name} has one source ({sources})")
        if "configMap" in v:
            c.check(
                r.get("ConfigMap", v["configMap"]["name"]) is not None or v["configMap"].get("optional"),
                f"{where}: volume {name}: ConfigMap {v['configMap']['name']} in the render",
            )
        if "secret" in v:
            sname = v["secret"]["secretName"]
            c.check(
                r.get("Secret", sname) is not None
                or v["secret"].get("optional") is True
                or (r.components and sname in EXTERNAL_SECRETS),
                f"{where}: volume {name}: Secret {sname} in the render or optional",
            )
        if "persistentVolumeClaim" in v:
            c.check(
                r.get("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) is not None,
                f"{where}: volume {name}: PVC {v['persistentVolumeClaim']['claimName']} in the render",
            )
    containers = spec.get("initContainers", []) + spec.get("containers", [])
    c.check(len(spec.get("containers", [])) >= 1, f"{where}: has containers")
    all_ports = {}
    for ct in containers:
        cw = f"{where} container {ct.get('name')}"
        c.check(bool(DNS_LABEL.match(ct.get("name", ""))), f"{cw}: valid name")
        image = ct.get("image", "")
        c.check(
            re.fullmatch(r"[a-z0-9./_-]+:[A-Za-z0-9._-]+", image) is not None and not image.endswith(":latest"),
            f"{cw}: image {image!r} has a fixed tag",
        )
        ports = {}
        for p in ct.get("ports", []) or []:
            n, num = p.get("name", ""), p.get("containerPort")
            c.check(isinstance(num, int) and 0 < num < 65536, f"{cw}: port {n} number {num}")
            c.check(bool(DNS_LABEL.match(n)) and len(n) <= 15 and n not in ports, f"{cw}: port name {n!r}")
            c.check(p.get("protocol", "TCP") in ("TCP", "UDP", "SCTP"), f"{cw}: port {n} protocol")
            ports[n] = num
        all_ports.update(ports)
        res = ct.get("resources", {})
        req, lim = res.get("requests", {}), res.get("limits", {})
        c.check(
            "cpu" in req and "memory" in req and "memory" in lim, f"{cw}: cpu and memory requests and a memory limit"
        )
        for k in set(req) & set(lim):
            try:
                c.check(quantity(req[k], cw) <= quantity(lim[k], cw), f"{cw}: request {k} <= limit")
            except ValueError as e:
                c.check(False, str(e))
        for k, v in list(req.items()) + list(lim.items()):
            if k in ("cpu", "memory", "ephemeral-storage"):
                try:
                    quantity(v, cw)
                except ValueError as e:
                    c.check(False, str(e))
        if "nvidia.com/gpu" in req or "nvidia.com/gpu" in lim:
            c.check(
                req.get("nvidia.com/gpu") == lim.get("nvidia.com/gpu"),
                f"{cw}: extended resource nvidia.com/gpu requested = limited",
            )
        sc = ct.get("securityContext", {})
        c.check(
            sc.get("allowPrivilegeEscalation") is False
            and sc.get("readOnlyRootFilesystem") is True
            and sc.get("capabilities", {}).get("drop") == ["ALL"],
            f"{cw}: no privilege escalation, read-only root, all capabilities dropped",
        )
        for m in ct.get("volumeMounts", []) or []:
            c.check(m.get("name") in volumes, f"{cw}: mount {m.get('name')} is a pod volume")
        names = env_names(c, r, cw, ct)
        for a in (ct.get("command") or []) + (ct.get("args") or []):
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                c.check(var in names, f"{cw}: $({var}) in {a!r} is a defined env var")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in ct:
                check_probe(c, f"{cw} {probe}", ct[probe], ports)
    ann = template.get("metadata", {}).get("annotations", {})
    if ann.get("prometheus.io/scrape") == "true":
        c.check(
            ann.get("prometheus.io/path") == "/metrics"
            and ann.get("prometheus.io/port", "").isdigit()
            and int(ann["prometheus.io/port"]) == all_ports.get("metrics"),
            f"{where}: prometheus.io annotations name the `metrics` port {all_ports.get('metrics')}",
        )
    return labels, all_ports


def arg(argv, name):
    for a in argv or []:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def coordinator_health_service():
    """The gRPC service the coordinator marks SERVING: <package>.<service> of
    proto/muonshard/v1/coordinator.proto, as coordinator_server.cc registers
    it (v1::Coordinator::service_full_name())."""
    with open(os.path.join(dc.REPO, "proto", "muonshard", "v1", "coordinator.proto")) as f:
        proto = f.read()
    with open(os.path.join(dc.REPO, "coordinator", "coordinator_server.cc")) as f:
        server = f.read()
    pkg = re.search(r"^package\s+([\w.]+);", proto, re.M).group(1)
    svc = re.search(r"^service\s+(\w+)\s*\{", proto, re.M).group(1)
    if "SetServingStatus(v1::Coordinator::service_full_name()" not in server:
        raise ValueError("coordinator_server.cc no longer registers v1::Coordinator's health status")
    return f"{pkg}.{svc}"


def check_render(c, r, variant):
    for o in r.objects:
        check_metadata(c, r, o)
    # Pod templates and what refers to them.
    pods = {}
    for owner, t in pod_templates(r):
        pods[owner] = check_pod(c, r, owner, t)
    claimed = {
        v["persistentVolumeClaim"]["claimName"]
        for _, t in pod_templates(r)
        for v in t["spec"].get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    for name, pvc in r.by_kind.get("PersistentVolumeClaim", {}).items():
        c.check(name in claimed, f"{r.label}: PVC {name} is mounted by a pod")
        c.check(bool(pvc["spec"].get("accessModes")), f"{r.label}: PVC {name} has access modes")

    dep = r.get("Deployment", "muonshard-coordinator")
    c.check(dep is not None, f"{r.label}: the coordinator Deployment")
    job = r.get("Job", "muonshard-worker")
    c.check(job is not None, f"{r.label}: the worker Job")
    if dep is None or job is None:
        return
    ds = dep["spec"]
    c.check(
        ds.get("replicas") == 1 and ds.get("strategy", {}).get("type") == "Recreate",
        f"{r.label}: coordinator: 1 replica, Recreate",
    )
    tlabels = ds["template"]["metadata"]["labels"]
    c.check(
        ds["selector"]["matchLabels"].items() <= tlabels.items(), f"{r.label}: coordinator selector matches its pods"
    )
    cc = ds["template"]["spec"]["containers"][0]
    grpc_port = int(arg(cc["args"], "--listen").rsplit(":", 1)[1])
    metrics_port = int(arg(cc["args"], "--metrics-port"))
    c.check(
        cc["ports"]
        and {p["name"]: p["containerPort"] for p in cc["ports"]} == {"grpc": grpc_port, "metrics": metrics_port},
        f"{r.label}: coordinator container ports match --listen / --metrics-port",
    )
    c.check(arg(cc["args"], "--metrics-host") == "0.0.0.0", f"{r.label}: coordinator metrics reachable in the cluster")
    data_dir = arg(cc["args"], "--data-dir")
    mounts = {m["mountPath"]: m["name"] for m in cc.get("volumeMounts", [])}
    vols = {v["name"]: v for v in ds["template"]["spec"]["volumes"]}
    c.check(
        "persistentVolumeClaim" in vols.get(mounts.get(data_dir), {}), f"{r.label}: --data-dir {data_dir} is the PVC"
    )
    pvc = r.get("PersistentVolumeClaim", "muonshard-coordinator-data")
    c.check(
        pvc is not None
        and pvc["spec"].get("accessModes") == ["ReadWriteOnce"]
        and quantity(pvc["spec"]["resources"]["requests"]["storage"], "pvc") > 0,
        f"{r.label}: the PVC is ReadWriteOnce with a size",
    )
    c.check("/tmp" in mounts, f"{r.label}: coordinator has a writable /tmp (read-only root)")
    health = coordinator_health_service()
    if r.tls:
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            cmd = cc[probe].get("exec", {}).get("command", [])
            c.check(
                cmd[:2] == ["muonshardctl", "health"] and arg(cmd, "--tls-ca"),
                f"{r.label}: TLS: {probe} is muonshardctl health over TLS",
            )
    else:
        c.check(
            cc["readinessProbe"].get("grpc") == {"port": grpc_port, "service": health},
            f"{r.label}: readiness is a native gRPC probe of {health} on {grpc_port}",
        )
        c.check(
            cc["livenessProbe"].get("grpc", {}).get("port") == grpc_port,
            f"{r.label}: liveness is a native gRPC probe on {grpc_port}",
        )

    svc = r.get("Service", "muonshard-coordinator")
    c.check(
        svc is not None and svc["spec"]["selector"].items() <= tlabels.items(),
        f"{r.label}: the coordinator Service selects the coordinator pods",
    )
    if svc:
        sp = {p["name"]: p for p in svc["spec"]["ports"]}
        c.check(
            set(sp) == {"grpc", "metrics"}
            and sp["grpc"]["port"] == grpc_port
            and sp["metrics"]["port"] == metrics_port
            and all(p["targetPort"] in {"grpc", "metrics"} for p in sp.values()),
            f"{r.label}: the coordinator Service exposes gRPC and metrics",
        )

    # Workers.
    js = job["spec"]
    pod = js["template"]
    ps = pod["spec"]
    wc = next(ct for ct in ps["containers"] if ct["name"] == "worker")
    cm_name = [ef["configMapRef"]["name"] for ef in wc.get("envFrom", []) if "configMapRef" in ef]
    cm = r.get("ConfigMap", cm_name[0]) if cm_name else None
    c.check(cm is not None, f"{r.label}: the worker's job ConfigMap")
    data = cm["data"] if cm else {}
    world = int(data.get("WORLD_SIZE", 0))
    c.check(
        js.get("completionMode") == "Indexed" and js.get("completions") == js.get("parallelism") == world > 0,
        f"{r.label}: Indexed Job with completions = parallelism = WORLD_SIZE {world}",
    )
    # The rank: muonshard-worker's --rank, or the torch launcher's --node_rank.
    rank_flag = "--node_rank" if variant == "torch" else "--rank"
    c.check(arg(wc["args"], rank_flag) == "$(JOB_COMPLETION_INDEX)", f"{r.label}: rank from JOB_COMPLETION_INDEX")
    idx = [e for e in wc.get("env", []) if e["name"] == "JOB_COMPLETION_INDEX"]
    c.check(
        idx
        and idx[0]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']",
        f"{r.label}: JOB_COMPLETION_INDEX from the completion-index annotation",
    )
    if variant != "torch":
        c.check(
            arg(wc["args"], "--local-rank") == "0" and arg(wc["args"], "--metrics-host") == "0.0.0.0",
            f"{r.label}: one rank per pod, metrics reachable in the cluster",
        )
    wports = {p["name"]: p["containerPort"] for p in wc.get("ports", [])}
    c.check(
        wports.get("metrics") == int(arg(wc["args"], "--metrics-port")),
        f"{r.label}: the worker's metrics port is --metrics-port (+ local rank 0)",
    )
    c.check(arg(wc["args"], "--hostname") == "$(POD_IP)", f"{r.label}: Gloo binds the pod IP")
    # The coordinator address names the Service and its gRPC port.
    coord = data.get("COORDINATOR", "")
    c.check(
        arg(wc["args"], "--coordinator") == "$(COORDINATOR)" and coord == f"muonshard-coordinator:{grpc_port}",
        f"{r.label}: workers dial the coordinator Service ({coord})",
    )
    # Headless Service for the pods' names.
    hs = r.get("Service", ps.get("subdomain"))
    c.check(
        hs is not None
        and hs["spec"].get("clusterIP") == "None"
        and hs["spec"]["selector"].items() <= pod["metadata"]["labels"].items(),
        f"{r.label}: a headless Service {ps.get('subdomain')} selects the worker pods",
    )
    check_recovery(c, r, variant, job, wc, data)
    if variant == "torch":
        check_torch_worker(c, r, job, wc, data, hs)
        return check_components(c, r, cc, ps, vols, pods)
    # The submission step.
    init = [ct for ct in ps.get("initContainers", []) if ct["name"] == "submit-plan"]
    c.check(len(init) == 1, f"{r.label}: a submit-plan init container")
    if init:
        ic = init[0]
        argv = ic.get("command", []) + ic.get("args", [])
        c.check(argv[:2] == ["muonshardctl", "submit"], f"{r.label}: the init container runs muonshardctl submit")
        c.check(
            arg(argv, "--world-size") == "$(WORLD_SIZE)" and arg(argv, "--coordinator") == "$(COORDINATOR)",
            f"{r.label}: it submits the ConfigMap's world size to the coordinator",
        )
        manifest = arg(argv, "--manifest")
        mount = [m for m in ic.get("volumeMounts", []) if manifest and manifest.startswith(m["mountPath"] + "/")]
        vol = {v["name"]: v for v in ps["volumes"]}.get(mount[0]["name"]) if mount else None
        mcm = r.get("ConfigMap", vol["configMap"]["name"]) if vol and "configMap" in vol else None
        key = manifest[len(mount[0]["mountPath"]) + 1 :] if mount else None
        c.check(
            mcm is not None and key in mcm.get("data", {}),
            f"{r.label}: the submitted manifest {manifest} comes from a ConfigMap",
        )
        if mcm is not None and key in mcm.get("data", {}):
            with open(os.path.join(dc.REPO, "examples", "manifests", "tiny-moe.json")) as f:
                c.check(
                    mcm["data"][key] == f.read(),
                    f"{r.label}: the ConfigMap's manifest is examples/manifests/tiny-moe.json",
                )
    # Backend by variant.
    backend = data.get("BACKEND")
    gpu_req = wc.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if variant == "gpu":
        c.check(
            backend == "nccl" and gpu_req == 1 and wc["image"].endswith("-gpu"),
            f"{r.label}: NCCL, one GPU per worker, the GPU image",
        )
        c.check(
            any(t.get("key") == "nvidia.com/gpu" for t in ps.get("tolerations", [])),
            f"{r.label}: tolerates the nvidia.com/gpu taint",
        )
        c.check(bool(ps.get("nodeSelector")), f"{r.label}: GPU node selector")
    else:
        c.check(
            backend == "gloo" and gpu_req is None and wc["image"].endswith("-cpu"),
            f"{r.label}: Gloo, no GPU, the CPU image",
        )
    c.check(arg(wc["args"], "--backend") == "$(BACKEND)", f"{r.label}: --backend from the ConfigMap")
    check_components(c, r, cc, ps, vols, pods)


TORCH_LAUNCHER = ["python3", "-m", "torch.distributed.run"]
TORCH_SCRIPT = "/opt/muonshard/examples/torch/train_gpt.py"


def check_torch_worker(c, r, job, wc, data, hs):
    """overlays/torch: the worker container is torch's launcher running the
    example, one node per pod (its flags are parsed, and run, by
    deploy_torch_k8s)."""
    ps = job["spec"]["template"]["spec"]
    args = wc.get("args", [])
    c.check(wc.get("command") == TORCH_LAUNCHER, f"{r.label}: the worker runs torch's launcher {TORCH_LAUNCHER}")
    c.check(
        wc["image"].startswith("muonshard/worker:") and wc["image"].endswith("-torch"),
        f"{r.label}: the torch image ({wc['image']})",
    )
    c.check(not ps.get("initContainers"), f"{r.label}: no submit-plan init container (rank 0 submits)")
    c.check(
        r.named("ConfigMap", "muonshard-manifest") is None
        and not any(
            "configMap" in v and v["configMap"]["name"].startswith("muonshard-manifest") for v in ps.get("volumes", [])
        ),
        f"{r.label}: no plan manifest ConfigMap or volume (the plan is the module's)",
    )
    c.check(TORCH_SCRIPT in args, f"{r.label}: runs {TORCH_SCRIPT}")
    launcher = args[: args.index(TORCH_SCRIPT)] if TORCH_SCRIPT in args else args
    script = args[args.index(TORCH_SCRIPT) + 1 :] if TORCH_SCRIPT in args else []
    c.check(
        arg(launcher, "--nnodes") == "$(WORLD_SIZE)" and arg(launcher, "--nproc_per_node") == "1",
        f"{r.label}: WORLD_SIZE nodes, one process each",
    )
    c.check(arg(launcher, "--node_rank") == "$(JOB_COMPLETION_INDEX)", f"{r.label}: node rank = completion index")
    c.check(
        arg(launcher, "--redirects") == "1" and arg(launcher, "--tee") == "1",
        f"{r.label}: --redirects 1 --tee 1 (torch 1.13's launcher on Python 3.11)",
    )
    master = f"{job['metadata']['name']}-0.{ps.get('subdomain')}"
    c.check(
        arg(launcher, "--master_addr") == master,
        f"{r.label}: the rendezvous on pod 0's stable name {master} ({arg(launcher, '--master_addr')})",
    )
    port = int(arg(launcher, "--master_port") or 0)
    cports = {p["name"]: p["containerPort"] for p in wc.get("ports", [])}
    sports = {p["name"]: p for p in (hs or {}).get("spec", {}).get("ports", [])}
    named = [n for n, num in cports.items() if num == port]
    c.check(
        named and any(p["port"] == port and p.get("targetPort") in (named[0], port) for p in sports.values()),
        f"{r.label}: the headless Service exposes the rendezvous port {port} of the worker container",
    )
    c.check(arg(script, "--optimizer") == "muonshard", f"{r.label}: --optimizer muonshard")
    c.check(arg(script, "--job") == "$(MUONSHARD_JOB)", f"{r.label}: --job from the ConfigMap")
    ep = arg(script, "--ep")
    c.check(
        ep is None or (ep == "$(EP)" and data.get("EP") == "1") or ep == "1",
        f"{r.label}: ep 1, the data-parallel example's (EP={data.get('EP')})",
    )
    mounts = {m["mountPath"] for m in wc.get("volumeMounts", [])}
    c.check("/tmp" in mounts, f"{r.label}: a writable /tmp for torch (read-only root)")
    c.check(wc.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") is None, f"{r.label}: no GPU")
    # (Its checkpoints: check_recovery. The launcher restarts nothing itself:
    # deploy_torch_k8s checks --max-restarts 0.)


# ---------------------------------------------------------------- recovery

POD_FAILURE_ACTIONS = {"FailJob", "Ignore", "Count", "FailIndex"}
# Failed pods the Job may replace, per rank (backoffLimit >= this x completions).
RETRIES_PER_RANK = 4


def program_args(variant, wc):
    """The muonshard program's arguments in the worker container: the
    container's args, or the torch script's (after the launcher's)."""
    args = wc.get("args") or []
    if variant == "torch":
        return args[args.index(TORCH_SCRIPT) + 1 :] if TORCH_SCRIPT in args else []
    return args


def has_flag(argv, name):
    """A boolean flag given as `--name` or `--name=true`."""
    return any(a == name or a == name + "=true" for a in argv)


def number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def pod_failure_outcome(policy, container, exit_code, containers):
    """The action of the first podFailurePolicy rule matching a pod whose
    container `container` failed with `exit_code` (no disruption condition):
    Count when none matches (the Job's default)."""
    for rule in (policy or {}).get("rules", []):
        oec = rule.get("onExitCodes")
        if not oec:
            continue
        name = oec.get("containerName")
        if name is not None and name != container:
            continue
        values = oec.get("values", [])
        if (oec.get("operator") == "In" and exit_code in values) or (
            oec.get("operator") == "NotIn" and exit_code != 0 and exit_code not in values
        ):
            return rule.get("action")
    return "Count"


def check_pod_failure_policy(c, r, js, containers):
    """The fields of spec.podFailurePolicy as the API server validates them."""
    policy = js.get("podFailurePolicy")
    rules = (policy or {}).get("rules")
    c.check(isinstance(rules, list) and 1 <= len(rules) <= 20, f"{r.label}: podFailurePolicy has 1..20 rules")
    for i, rule in enumerate(rules or []):
        where = f"{r.label}: podFailurePolicy rule {i}"
        action = rule.get("action")
        c.check(action in POD_FAILURE_ACTIONS, f"{where}: action {action!r} is one of {sorted(POD_FAILURE_ACTIONS)}")
        c.check(
            action != "FailIndex" or js.get("backoffLimitPerIndex") is not None,
            f"{where}: FailIndex only with backoffLimitPerIndex",
        )
        c.check(
            ("onExitCodes" in rule) != ("onPodConditions" in rule),
            f"{where}: exactly one of onExitCodes, onPodConditions",
        )
        oec = rule.get("onExitCodes")
        if oec is not None:
            values = oec.get("values")
            c.check(oec.get("operator") in ("In", "NotIn"), f"{where}: operator In or NotIn ({oec.get('operator')})")
            c.check(
                isinstance(values, list)
                and 0 < len(values) <= 255
                and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
                and values == sorted(set(values)),
                f"{where}: exit codes a sorted list of distinct ints ({values})",
            )
            c.check(oec.get("operator") != "In" or 0 not in (values or []), f"{where}: In excludes exit code 0")
            name = oec.get("containerName")
            c.check(
                name is None or name in containers,
                f"{where}: containerName {name!r} is a container or init container of the pod",
            )
        for cond in rule.get("onPodConditions") or []:
            c.check(
                isinstance(cond.get("type"), str) and cond.get("status", "True") in ("True", "False", "Unknown"),
                f"{where}: pod condition {cond}",
            )
    return policy


def check_recovery(c, r, variant, job, wc, data):
    """A failed worker pod is replaced and the job goes on from its newest
    checkpoint (see deploy/k8s/base/worker.yaml)."""
    js = job["spec"]
    ps = js["template"]["spec"]
    world = js.get("completions") or 0
    init = [ct["name"] for ct in ps.get("initContainers", [])]
    containers = init + [ct["name"] for ct in ps["containers"]]
    # The failure policy.
    c.check(
        ps.get("restartPolicy") == "Never",
        f"{r.label}: failed worker pods are replaced, not restarted in place (restartPolicy Never, "
        f"which podFailurePolicy needs): {ps.get('restartPolicy')}",
    )
    policy = check_pod_failure_policy(c, r, js, containers)
    for name in containers:
        c.check(
            pod_failure_outcome(policy, name, 2, containers) == "FailJob",
            f"{r.label}: exit 2 (bad usage or input) of {name} fails the Job at once",
        )
        for code in (1, 137):
            c.check(
                pod_failure_outcome(policy, name, code, containers) == "Count",
                f"{r.label}: exit {code} of {name} is retried and counts toward the back-off limit",
            )
    c.check(
        any(
            rule.get("action") == "Ignore"
            and any(
                cond.get("type") == "DisruptionTarget" and cond.get("status", "True") == "True"
                for cond in rule.get("onPodConditions") or []
            )
            for rule in (policy or {}).get("rules", [])
        ),
        f"{r.label}: a disrupted pod (evicted, preempted, node drained) does not count (Ignore DisruptionTarget)",
    )
    per_index = js.get("backoffLimitPerIndex")
    if per_index is not None:
        c.check(
            isinstance(per_index, int) and per_index >= RETRIES_PER_RANK and js.get("maxFailedIndexes") == 0,
            f"{r.label}: backoffLimitPerIndex >= {RETRIES_PER_RANK} and maxFailedIndexes 0 "
            f"(the job needs every rank): {per_index}, {js.get('maxFailedIndexes')}",
        )
    else:
        limit = js.get("backoffLimit")
        c.check(
            isinstance(limit, int) and limit >= RETRIES_PER_RANK * world,
            f"{r.label}: backoffLimit {limit} >= {RETRIES_PER_RANK} failed pods per rank x {world} ranks",
        )
    # The checkpoint directory on a volume every pod shares.
    argv = program_args(variant, wc)
    ckpt = arg(argv, "--checkpoint-dir")
    vols = {v["name"]: v for v in ps.get("volumes", [])}
    mount = [m for m in wc.get("volumeMounts", []) if ckpt and ckpt.startswith(m["mountPath"].rstrip("/") + "/")]
    c.check(
        len(mount) == 1 and not mount[0].get("readOnly"),
        f"{r.label}: --checkpoint-dir {ckpt} lies in a writable mount of the worker container",
    )
    claim = vols.get(mount[0]["name"], {}).get("persistentVolumeClaim", {}).get("claimName") if mount else None
    pvc = r.get("PersistentVolumeClaim", claim) if claim else None
    c.check(
        pvc is not None and "ReadWriteMany" in pvc["spec"].get("accessModes", []),
        f"{r.label}: --checkpoint-dir {ckpt} on a ReadWriteMany PVC every worker pod mounts ({claim}; "
        f"every rank writes its shard into one directory and rank 0 commits it)",
    )
    if pvc is not None:
        try:
            size = quantity(pvc["spec"].get("resources", {}).get("requests", {}).get("storage", ""), claim)
        except ValueError as e:
            c.check(False, str(e))
            size = 0
        c.check(size > 0, f"{r.label}: PVC {claim} requests storage")
    c.check(
        bool(ckpt) and ckpt.endswith("/$(MUONSHARD_JOB)") and arg(argv, "--job") == "$(MUONSHARD_JOB)",
        f"{r.label}: one checkpoint directory per job (--checkpoint-dir .../$(MUONSHARD_JOB), "
        f"--job $(MUONSHARD_JOB)): {ckpt}",
    )
    every = arg(argv, "--checkpoint-every")
    steps = arg(argv, "--steps")
    steps = data.get("STEPS") if steps == "$(STEPS)" else steps
    c.check(
        every is not None
        and every.isdigit()
        and steps is not None
        and steps.isdigit()
        and 0 < int(every) <= int(steps),
        f"{r.label}: a checkpoint every {every} steps, within the run's {steps}",
    )
    c.check(
        has_flag(argv, "--resume"),
        f"{r.label}: --resume (the newest checkpoint, step 0 while there is none: a replaced pod goes on)",
    )
    # The C++ worker re-forms a broken group in its process.
    if variant != "torch":
        restarts = arg(argv, "--max-restarts")
        c.check(
            restarts is not None and restarts.isdigit() and int(restarts) >= 1,
            f"{r.label}: --max-restarts {restarts} >= 1 (survivors re-form the group with a replaced rank)",
        )
        host_id = arg(argv, "--host-id")
        c.check(
            host_id is None
            or ("$(JOB_COMPLETION_INDEX)" in host_id and not re.search(r"\$\((POD_NAME|POD_IP|POD_UID)\)", host_id)),
            f"{r.label}: the worker's host identity ({host_id or 'the pod hostname <job>-<index>'}) is kept by "
            f"a replacement pod, so it gets its rank back at once",
        )
        grace, comm = number(arg(argv, "--rejoin-grace")), number(arg(argv, "--comm-timeout") or 60)
        c.check(
            grace is not None and comm is not None and grace > comm,
            f"{r.label}: --rejoin-grace {arg(argv, '--rejoin-grace')} longer than --comm-timeout {comm} "
            f"(a replacement pod is rescheduled, maybe pulls its image, submits)",
        )
    psc = ps.get("securityContext", {})
    c.check(
        "fsGroup" not in psc or psc.get("fsGroupChangePolicy") == "OnRootMismatch",
        f"{r.label}: the checkpoint volume's group is set once, not file by file on every pod start "
        f"(fsGroupChangePolicy OnRootMismatch)",
    )


def check_components(c, r, cc, ps, vols, pods):
    if r.auth:
        c.check(
            arg(cc["args"], "--auth-token-file") == "/etc/muonshard/secret/token",
            f"{r.label}: auth: the coordinator requires the token",
        )
        for ct in ps["containers"] + ps.get("initContainers", []):
            c.check(
                arg(ct.get("args", []), "--token-file") == "/etc/muonshard/secret/token",
                f"{r.label}: auth: {ct['name']} sends the token",
            )
    if r.tls:
        c.check(arg(cc["args"], "--tls-cert") and arg(cc["args"], "--tls-key"), f"{r.label}: TLS: server cert and key")
        for ct in ps["containers"] + ps.get("initContainers", []):
            c.check(arg(ct.get("args", []), "--tls-ca"), f"{r.label}: TLS: {ct['name']} verifies the server")
    for path_flag in ("--auth-token-file", "--tls-cert", "--tls-key"):
        p = arg(cc["args"], path_flag)
        if p:
            c.check(
                any(
                    p.startswith(m["mountPath"] + "/") and "secret" in vols.get(m["name"], {})
                    for m in cc["volumeMounts"]
                ),
                f"{r.label}: {path_flag} {p} lies in the Secret volume",
            )
    pm = r.get("PodMonitor", "muonshard")
    if r.monitoring:
        c.check(pm is not None, f"{r.label}: a PodMonitor")
        if pm:
            sel = pm["spec"]["selector"]
            comps = {e["key"]: set(e["values"]) for e in sel.get("matchExpressions", [])}
            for owner, (labels, ports) in pods.items():
                matches = sel["matchLabels"].items() <= labels.items() and all(
                    labels.get(k) in v for k, v in comps.items()
                )
                c.check(matches, f"{r.label}: the PodMonitor selects {owner}")
                c.check(
                    all(ep["port"] in ports for ep in pm["spec"]["podMetricsEndpoints"]),
                    f"{r.label}: {owner} has the PodMonitor's port",
                )
            c.check(
                all(ep.get("honorLabels") is True for ep in pm["spec"]["podMetricsEndpoints"]),
                f"{r.label}: the PodMonitor honours the exported job label, as prometheus.yml",
            )
        pr = r.get("PrometheusRule", "muonshard")
        c.check(
            pr is not None and pr["spec"]["groups"] == dc.load_yaml(dc.RULES)["groups"],
            f"{r.label}: the PrometheusRule holds exactly deploy/prometheus/rules/muonshard.rules.yml",
        )
    else:
        c.check(pm is None, f"{r.label}: no PodMonitor without the prometheus-operator component")


def kustomize(kubectl, path):
    r = dc.run([kubectl, "kustomize", path])
    if r.returncode != 0:
        return None, r.stderr
    return dc.load_yaml(r.stdout, text=True), ""


def main():
    kubectl = dc.require_tool("kubectl")
    dc.load_yaml(dc.RULES)  # PyYAML present
    c = dc.Checker("deploy_kustomize")
    with (
        open(os.path.join(K8S, "base", "tiny-moe.json")) as a,
        open(os.path.join(dc.REPO, "examples", "manifests", "tiny-moe.json")) as b,
    ):
        c.check(a.read() == b.read(), "deploy/k8s/base/tiny-moe.json is identical to examples/manifests/tiny-moe.json")

    renders = []
    for variant in ("cpu", "gpu", "torch"):
        docs, err = kustomize(kubectl, os.path.join(K8S, "overlays", variant))
        c.check(docs is not None, f"kubectl kustomize deploy/k8s/overlays/{variant}: {err}")
        if docs:
            r = Render(f"overlays/{variant}", docs)
            r.components, r.auth, r.tls, r.monitoring = False, False, False, False
            renders.append((r, variant))
    # cpu + every component, through a kustomization outside the tree
    # (kustomize wants relative paths).
    tmp = tempfile.mkdtemp(prefix="muonshard-kustomize-")
    try:
        rel = os.path.relpath(K8S, tmp)
        with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
            f.write(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                f"resources:\n  - {rel}/overlays/cpu\n"
                f"components:\n  - {rel}/components/auth-token\n  - {rel}/components/tls\n"
                f"  - {rel}/components/prometheus-operator\n"
            )
        docs, err = kustomize(kubectl, tmp)
        c.check(docs is not None, f"kubectl kustomize overlays/cpu + components: {err}")
        if docs:
            r = Render("overlays/cpu+components", docs)
            r.components, r.auth, r.tls, r.monitoring = True, True, True, True
            renders.append((r, "cpu"))
        # torch + monitoring (auth-token and tls patch the init container,
        # which overlays/torch has not).
        with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
            f.write(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                f"resources:\n  - {rel}/overlays/torch\n"
                f"components:\n  - {rel}/components/prometheus-operator\n"
            )
        docs, err = kustomize(kubectl, tmp)
        c.check(docs is not None, f"kubectl kustomize overlays/torch + components: {err}")
        if docs:
            r = Render("overlays/torch+components", docs)
            r.components, r.auth, r.tls, r.monitoring = True, False, False, True
            renders.append((r, "torch"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r, variant in renders:
        n = c.checks
        check_render(c, r, variant)
        kinds = sorted({f"{o['kind']}" for o in r.objects})
        print(f"{r.label}: {len(r.objects)} objects ({', '.join(kinds)}), {c.checks - n} checks")
    c.check(len(renders) == 5, "five renders checked")
    c.finish()


if __name__ == "__main__":
    main()
