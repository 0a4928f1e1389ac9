"""pytest set-up for the Python package's tests.

The package is imported from the build tree: $MUONSHARD_PYTHONPATH (ctest sets
it to <build>/python), else build/python under the source root. Binaries
(muonshard-coordinator, muonshardctl) come from $MUONSHARD_BIN_DIR or the
build the package was built in. Every server binds to 127.0.0.1.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.abspath(os.environ.get("MUONSHARD_PYTHONPATH") or os.path.join(ROOT, "build", "python"))
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def package_env():
    """The environment a child process needs to import the package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_DIR, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def coordinator():
    """A muonshard-coordinator process on loopback for one test."""
    import muonshard

    with muonshard.LocalCoordinator(heartbeat_timeout=10) as c:
        yield c
