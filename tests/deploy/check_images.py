#!/usr/bin/env python3
"""deploy_images: what can be checked of the Dockerfiles without a container
engine.

1. Runtime packages: the Debian 12 package lists of the coordinator image
   (RUNTIME_PACKAGES) and the CPU worker image (CPU_RUNTIME_PACKAGES) are
   exactly the packages owning the shared libraries that `ldd` resolves for
   the binaries built here (deploy/docker/runtime-packages.sh: ldd + dpkg -S),
   so the images stay runnable as the code's dependencies change. The GPU
   image computes its list with the same script at build time; running it
   here also tests the script. The torch image installs CPU_RUNTIME_PACKAGES
   for muonshardctl and the Python package's extension (_muonshard*.so):
   the list covers what ldd resolves for the extension built here too, and
   the CPU build stage checks that (and the torch stage imports the package)
   when the image is built.
2. The project's conventions for its images: multi-stage builds whose build
   stages run scripts/install-deps.sh and a Release CMake build of the
   binaries they copy; pinned base images (no `latest`); runtime stages that
   run as the non-root uid 10001; the coordinator's HEALTHCHECK through
   muonshardctl health; the GPU stage on NVIDIA's CUDA runtime base with CUDA
   and NCCL on; the torch stage on Debian 12 with Debian's python3, torch and
   NumPy, the package built by the CPU build stage (muonshard_python) on its
   PYTHONPATH, examples/torch, torch's launcher as its ENTRYPOINT, and an
   import of the package at build time; a .dockerignore that keeps build trees and .git out of the
   build context. (Not a Dockerfile linter: hadolint is not available.)"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc

DOCKER = os.path.join(dc.REPO, "deploy", "docker")
SCRIPT = os.path.join(DOCKER, "runtime-packages.sh")


def read(path):
    with open(path) as f:
        return f.read()


def arg_default(text, name):
    m = re.search(r"^ARG " + name + r'="([^"]*)"', text.replace("\\\n", ""), re.M)
    return sorted(m.group(1).split()) if m else None


def stages(text):
    """[(name, base, body)] of a Dockerfile's stages."""
    out = []
    parts = re.split(r"^FROM\s+", text, flags=re.M)
    for part in parts[1:]:
        first, _, body = part.partition("\n")
        m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", first.strip())
        out.append((m.group(2), m.group(1), body))
    return out


def check_dockerfile(c, name, text, finals):
    st = stages(text)
    c.check(len(st) >= 2, f"{name}: multi-stage ({len(st)} stages)")
    global_args = dict(re.findall(r"^ARG (\w+)=(\S+)", text.split("\nFROM", 1)[0], re.M))
    names = {s[0] for s in st if s[0]}
    for stage, base, body in st:
        where = f"{name} stage {stage or '(final)'}"
        if base in names:  # on an earlier stage: pinned there
            continue
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: global_args.get(m.group(1), m.group(0)), base)
        c.check(
            re.fullmatch(r"[\w./-]+:[\w.-]+", resolved) is not None and not resolved.endswith(":latest"),
            f"{where}: pinned base image {resolved}",
        )
        if "cmake --build" in body:
            c.check(
                "COPY scripts/install-deps.sh" in body and "bash scripts/install-deps.sh" in body,
                f"{where}: installs build dependencies with scripts/install-deps.sh",
            )
            c.check("-DCMAKE_BUILD_TYPE=Release" in body, f"{where}: Release build")
            built = set(re.findall(r"--target ([\w\- ]+)", body.replace("\\\n", " "))[0].split())
            c.check({"muonshardctl"} <= built, f"{where}: builds muonshardctl")
    by_name = {s[0]: s for s in st}
    for final in finals:
        stage = by_name.get(final) if final else st[-1]
        c.check(stage is not None, f"{name}: a runtime stage {final}")
        if stage is None:
            continue
        _, base, own = stage
        # With the stages it is built on (their USER, ENTRYPOINT, packages).
        body = chain_body(st, stage)
        where = f"{name} runtime stage {final or '(final)'}"
        c.check(re.search(r"^USER 10001:10001$", body, re.M) is not None, f"{where}: runs as uid 10001")
        c.check("cmake" not in body and "install-deps" not in body, f"{where}: no build tools")
        copies = re.findall(r"^COPY --from=(\S+) (.+) (\S+)$", own, re.M)
        c.check(copies, f"{where}: copies the binaries from a build stage")
        for src_stage, files, _ in copies:
            c.check(src_stage in by_name, f"{where}: COPY --from={src_stage} names a stage")
            src_body = by_name.get(src_stage, (None, None, ""))[2]
            for f in files.split():
                if f.startswith("/build/bin/"):
                    c.check(os.path.basename(f) in src_body, f"{where}: {f} is built in stage {src_stage}")
        entry = re.search(r'^ENTRYPOINT \["([^"]+)"', body, re.M)
        c.check(
            entry is not None and any(entry.group(1) in files for _, files, _ in copies),
            f"{where}: the ENTRYPOINT is a copied binary",
        )


def chain_body(st, stage):
    """The bodies of `stage` and of the stages it is built FROM, parents first."""
    by_name = {s[0]: s for s in st if s[0]}
    bodies = []
    while stage is not None:
        bodies.insert(0, stage[2])
        stage = by_name.get(stage[1]) if stage[1] != stage[0] else None
    return "\n".join(bodies)


def check_prebuilt(c, name, text, pairs):
    """scripts/images.sh's targets: each `prebuilt` stage is on the same stage
    as the image built from source (one USER, ENTRYPOINT, CMD, HEALTHCHECK for
    both) and only copies the binaries of the build context's bin/; the
    runtime stages are on ${RUNTIME_BASE}, Debian 12 slim by default."""
    st = stages(text)
    by_name = {s[0]: s for s in st}
    global_args = dict(re.findall(r"^ARG (\w+)=(\S+)", text.split("\nFROM", 1)[0], re.M))
    c.check(
        global_args.get("RUNTIME_BASE") == "debian:bookworm-slim",
        f"{name}: ARG RUNTIME_BASE defaults to debian:bookworm-slim ({global_args.get('RUNTIME_BASE')})",
    )
    for prebuilt, source in pairs:
        p = by_name.get(prebuilt)
        s = by_name.get(source) if source else st[-1]
        if not c.check(p is not None and s is not None, f"{name}: stages {prebuilt} and {source or '(final)'}"):
            continue
        c.check(p[1] == s[1], f"{name}: {prebuilt} and {source or '(final)'} are both on stage {s[1]} ({p[1]})")
        lines = [ln for ln in p[2].splitlines() if ln.strip() and not ln.startswith("#")]
        c.check(
            lines and all(re.fullmatch(r"COPY (bin/[\w.-]+ )+/usr/local/bin/", ln) for ln in lines),
            f"{name} {prebuilt}: only copies bin/* to /usr/local/bin/ ({lines})",
        )
        want = {
            os.path.basename(f)
            for _, files, _ in re.findall(r"^COPY --from=(\S+) (.+) (\S+)$", s[2], re.M)
            for f in files.split()
        }
        got = {os.path.basename(f) for ln in lines for f in ln.split()[1:-1]}
        if source is not None or prebuilt == "prebuilt":
            c.check(got == want, f"{name} {prebuilt}: the same binaries as {source or '(final)'} ({got} vs {want})")
        root = chain_body(st, p)
        c.check(re.search(r"^ENTRYPOINT ", root, re.M) is not None, f"{name} {prebuilt}: has an ENTRYPOINT")
        chain = p
        while chain[1] in by_name:
            chain = by_name[chain[1]]
        c.check(chain[1] == "${RUNTIME_BASE}", f"{name} {prebuilt}: on ${{RUNTIME_BASE}} ({chain[1]})")


TORCH_ENTRYPOINT = ["python3", "-m", "torch.distributed.run"]


def check_torch_stage(c, text):
    """The torch target of worker.Dockerfile."""
    flat = text.replace("\\\n", " ")
    by_name = {s[0]: s for s in stages(flat)}
    stage = by_name.get("torch")
    c.check(stage is not None, "worker.Dockerfile: a torch stage")
    if stage is None:
        return
    _, base, body = stage
    w = "worker.Dockerfile torch stage"
    c.check(base == "debian:bookworm-slim", f"{w}: Debian 12 runtime base ({base})")
    torch_pkgs = arg_default(text, "TORCH_PACKAGES") or []
    c.check(
        {"python3", "python3-torch", "python3-numpy"} <= set(torch_pkgs),
        f"{w}: TORCH_PACKAGES has Debian's python3, torch and NumPy ({torch_pkgs})",
    )
    install = re.search(r"apt-get install -y --no-install-recommends ([^&]*)", body)
    got = set(install.group(1).split()) if install else set()
    c.check(
        {"$CPU_RUNTIME_PACKAGES", "$TORCH_PACKAGES"} <= got
        and re.search(r"^ARG CPU_RUNTIME_PACKAGES$", body, re.M)
        and re.search(r"^ARG TORCH_PACKAGES$", body, re.M),
        f"{w}: installs CPU_RUNTIME_PACKAGES (the extension's and muonshardctl's libraries) and TORCH_PACKAGES "
        f"without recommends ({sorted(got)})",
    )
    c.check(re.search(r"^USER 10001:10001$", body, re.M) is not None, f"{w}: runs as uid 10001")
    c.check("cmake" not in body and "install-deps" not in body, f"{w}: no build tools")
    copies = re.findall(r"^COPY --from=(\S+) (.+) (\S+)$", body, re.M)
    pkg = [(src, dst) for src, files, dst in copies if "/build/python/muonshard" in files.split()]
    c.check(len(pkg) == 1 and pkg[0][0] == "build-cpu", f"{w}: copies the Python package from build-cpu")
    build = by_name.get("build-cpu", (None, None, ""))[2]
    targets = set((re.findall(r"--target ([\w\- ]+)", build) or [""])[0].split())
    c.check("muonshard_python" in targets, f"build-cpu builds the Python package (target muonshard_python): {targets}")
    c.check(
        re.search(r"runtime-packages\.sh [^>]*/build/python/muonshard/_muonshard", build) is not None,
        "build-cpu checks CPU_RUNTIME_PACKAGES against the extension's libraries too",
    )
    for src, files, _ in copies:
        for f in files.split():
            if f.startswith("/build/bin/"):
                c.check(os.path.basename(f) in targets, f"{w}: {f} is built in stage {src}")
    if pkg:
        dst = pkg[0][1].rstrip("/")
        parent = dst[: -len("/muonshard")] if dst.endswith("/muonshard") else None
        env = re.search(r"^ENV .*\bPYTHONPATH=(\S+)", body, re.M)
        c.check(
            parent is not None and env is not None and parent in env.group(1).split(":"),
            f"{w}: the package's folder {parent} is on PYTHONPATH ({env.group(1) if env else None})",
        )
    ex = re.findall(r"^COPY (?!--)(\S+) (\S+)$", body, re.M)
    c.check(("examples/torch", "/opt/muonshard/examples/torch") in ex, f"{w}: examples/torch in the image: {ex}")
    c.check(
        re.search(r"^RUN python3 -c \"import [^\"]*muonshard\.torch", body, re.M) is not None,
        f"{w}: the build imports muonshard.torch (every library the extension, torch and NumPy load is there)",
    )
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", body, re.M)
    c.check(
        entry is not None and eval(entry.group(1)) == TORCH_ENTRYPOINT,
        f"{w}: the ENTRYPOINT is torch's launcher {TORCH_ENTRYPOINT}",
    )
    # The build stages leave PyTorch out (scripts/install-deps.sh MUONSHARD_TORCH=0).
    with open(os.path.join(dc.REPO, "scripts", "install-deps.sh")) as f:
        deps = f.read()
    c.check("MUONSHARD_TORCH" in deps, "scripts/install-deps.sh has the MUONSHARD_TORCH switch")
    for name, (_, _, b) in by_name.items():
        if "install-deps.sh" in b and "bash scripts/install-deps.sh" in b:
            c.check("MUONSHARD_TORCH=0" in b, f"worker.Dockerfile stage {name}: no PyTorch in the build stage")


def check_image_names(c):
    """The coordinator and CPU worker images docker-compose.yml and the
    Kubernetes base run are the ones scripts/images.sh builds (and the
    deploy_containers test runs): muonshard/coordinator:VERSION and
    muonshard/worker:VERSION-cpu, VERSION the project's."""
    m = re.search(r"^project\(muonshard VERSION ([0-9.]+)", read(os.path.join(dc.REPO, "CMakeLists.txt")), re.M)
    version = m.group(1) if m else None
    want = {f"muonshard/coordinator:{version}", f"muonshard/worker:{version}-cpu"}
    script = read(os.path.join(dc.REPO, "scripts", "images.sh"))
    built = {s.replace("$version", version or "") for s in re.findall(r"\bbuild \"(muonshard/[^\"]+)\"", script)}
    c.check(want <= built, f"scripts/images.sh builds {sorted(want)} ({sorted(built)})")
    used = set()
    for path in ("docker-compose.yml", "deploy/k8s/base/coordinator.yaml", "deploy/k8s/base/worker.yaml"):
        used |= set(re.findall(r"^\s*image: (muonshard/\S+)$", read(os.path.join(dc.REPO, path)), re.M))
    c.check(
        used == want, f"docker-compose.yml and deploy/k8s/base run the images scripts/images.sh builds: {sorted(used)}"
    )


def main():
    c = dc.Checker("deploy_images")
    coordinator_df = read(os.path.join(DOCKER, "coordinator.Dockerfile"))
    worker_df = read(os.path.join(DOCKER, "worker.Dockerfile"))
    check_dockerfile(c, "coordinator.Dockerfile", coordinator_df, [None])
    check_dockerfile(c, "worker.Dockerfile", worker_df, ["cpu", "gpu"])
    check_torch_stage(c, worker_df)
    c.check(
        re.search(r'^HEALTHCHECK .*CMD \["muonshardctl", "health"', coordinator_df.replace("\\\n", ""), re.M)
        is not None,
        "coordinator.Dockerfile: HEALTHCHECK via muonshardctl health",
    )
    check_prebuilt(c, "coordinator.Dockerfile", coordinator_df, [("prebuilt", None)])
    check_prebuilt(c, "worker.Dockerfile", worker_df, [("cpu-prebuilt", "cpu")])
    tools = {s[0]: s for s in stages(coordinator_df)}.get("tools-prebuilt")
    c.check(
        tools is not None
        and re.search(r'^ENTRYPOINT \["muonshardctl"\]', chain_body(stages(coordinator_df), tools), re.M),
        "coordinator.Dockerfile: a tools-prebuilt target running muonshardctl",
    )
    gpu = dict((s[0], s) for s in stages(worker_df))
    c.check(
        gpu.get("gpu", (None, ""))[1].startswith("nvidia/cuda:") and "-runtime-" in gpu["gpu"][1],
        "worker.Dockerfile: the gpu stage is on an NVIDIA CUDA runtime base",
    )
    c.check(
        "-DMUONSHARD_CUDA=ON" in gpu.get("build-gpu", (None, None, ""))[2],
        "worker.Dockerfile: the GPU build has CUDA and NCCL on (MUONSHARD_CUDA=ON fails without them)",
    )
    check_image_names(c)
    ignore = read(os.path.join(dc.REPO, ".dockerignore")).split()
    c.check({".git", "build", "build-*"} <= set(ignore), ".dockerignore keeps .git and build trees out")

    # Runtime packages against the binaries built here.
    if not dc.shutil.which("dpkg-query") or not dc.shutil.which("ldd"):
        dc.skip("dpkg-query / ldd not available (not a Debian system)")
    bins = dc.bin_dir()
    lists = [
        (
            "coordinator.Dockerfile RUNTIME_PACKAGES",
            arg_default(coordinator_df, "RUNTIME_PACKAGES"),
            ["muonshard-coordinator", "muonshardctl"],
        ),
        (
            "worker.Dockerfile CPU_RUNTIME_PACKAGES",
            arg_default(worker_df, "CPU_RUNTIME_PACKAGES"),
            ["muonshard-worker", "muonshardctl"],
        ),
    ]
    for what, listed, binaries in lists:
        c.check(listed, f"{what} is set")
        paths = [os.path.join(bins, b) for b in binaries]
        missing = [p for p in paths if not os.access(p, os.X_OK)]
        if missing:
            c.check(False, f"{what}: binaries not built: {missing}")
            continue
        r = dc.run(["bash", SCRIPT, *paths])
        c.check(r.returncode == 0, f"runtime-packages.sh {binaries}: {r.stderr}")
        needed = sorted(r.stdout.split())
        c.check(len(needed) >= 5, f"{what}: the script found the binaries' packages ({needed})")
        c.check(
            set(needed) <= set(listed or []),
            f"{what} lacks {sorted(set(needed) - set(listed or []))} (ldd of {binaries})",
        )
        c.check(
            set(listed or []) <= set(needed),
            f"{what} lists {sorted(set(listed or []) - set(needed))}, which {binaries} do not load",
        )
        print(f"{what}: {' '.join(needed)}")
    # The torch image: the extension needs nothing CPU_RUNTIME_PACKAGES lacks.
    pydir = os.path.join(os.path.dirname(bins), "python", "muonshard")
    ext = sorted(
        f
        for f in (os.listdir(pydir) if os.path.isdir(pydir) else [])
        if f.startswith("_muonshard") and f.endswith(".so")
    )
    if not ext:
        print(f"NOTE: the Python package is not built ({pydir}): its extension's runtime packages are not checked")
    else:
        listed = arg_default(worker_df, "CPU_RUNTIME_PACKAGES") or []
        r = dc.run(["bash", SCRIPT, os.path.join(pydir, ext[0])])
        c.check(r.returncode == 0, f"runtime-packages.sh {ext[0]}: {r.stderr}")
        needed = sorted(r.stdout.split())
        c.check(
            len(needed) >= 5 and set(needed) <= set(listed),
            f"worker.Dockerfile CPU_RUNTIME_PACKAGES (torch image) lacks {sorted(set(needed) - set(listed))} "
            f"(ldd of {ext[0]})",
        )
        print(f"{ext[0]}: {' '.join(needed)}")
    # The script fails loudly on a library no package owns.
    r = dc.run(["bash", SCRIPT, "/nonexistent-binary"])
    c.check(r.returncode != 0, "runtime-packages.sh fails for a missing binary")
    c.finish()


if __name__ == "__main__":
    main()
