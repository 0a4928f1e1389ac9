"""The PEP 517 build backend of the muonshard Python package (pyproject.toml).

    pip install ./python          # into the environment of that pip

builds the package for the installing interpreter and installs it: CMake
configures the repository (the Debian packages of scripts/install-deps.sh
must be there: gRPC, protobuf, abseil, gloo, OpenBLAS, SQLite) into
$MUONSHARD_BUILD_DIR (default: build-pip/ at the repository root) with
MUONSHARD_PYTHON set to the interpreter that runs this backend, builds the
`muonshard_python` target (the _muonshard extension and the libraries it
links, not the rest of the project), and packs the built package as a wheel
for this interpreter and platform. A build directory that is already
configured keeps its generator and build type; only the interpreter is set.
pybind11 comes from build-system.requires (or the environment, with
--no-build-isolation); nothing else is needed to pack.
"""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _build_dir():
    return Path(os.environ.get("MUONSHARD_BUILD_DIR") or ROOT / "build-pip").resolve()


def _built_package():
    """Configures and builds the extension; returns the built package's directory."""
    build = _build_dir()
    configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DMUONSHARD_PYTHON=" + sys.executable]
    if not (build / "CMakeCache.txt").exists():
        configure.append("-DCMAKE_BUILD_TYPE=Release")
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
    subprocess.run(configure, check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", str(build), "--target", "muonshard_python", "--parallel"], check=True,
                   stdout=sys.stderr)
    return build / "python"


def get_requires_for_build_wheel(config_settings=None):
    return []


def _version(package):
    text = (package / "muonshard" / "_build_info.py").read_text()
    return re.search(r'VERSION = "([^"]+)"', text).group(1)


def _tag():
    """This interpreter's wheel tag, e.g. cp311-cp311-linux_x86_64."""
    python = "cp%d%d" % sys.version_info[:2]
    platform = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return "%s-%s%s-%s" % (python, python, sys.abiflags, platform)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    package = _built_package()
    version, tag = _version(package), _tag()
    dist_info = "muonshard-%s.dist-info" % version
    files = {}
    for path in sorted((package / "muonshard").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files[path.relative_to(package).as_posix()] = path.read_bytes()
    files[dist_info + "/METADATA"] = ("Metadata-Version: 2.1\nName: muonshard\nVersion: %s\nSummary: Optimizer "
                                      "sharding for Muon + AdamW training, as a service\nRequires-Python: >=3.9\n" %
                                      version).encode()
    files[dist_info + "/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: muonshard build_backend\nRoot-Is-Purelib: "
                                   "false\nTag: %s\n" % tag).encode()
    record = [_record_line(name, data) for name, data in files.items()] + [dist_info + "/RECORD,,"]
    files[dist_info + "/RECORD"] = ("\n".join(record) + "\n").encode()
    name = "muonshard-%s-%s.whl" % (version, tag)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for member, data in files.items():
            wheel.writestr(member, data)
    return name
