#!/usr/bin/env python3
"""Fails on any #include that runs up the stack of modules.

The table below is the architecture (docs/architecture.md draws it): each
module names the modules it may include, besides itself and the generated
protobuf headers. The most specific folder wins (worker/comm is checked
against its own row, not worker's). A new folder must get a row here, so the
layering is always written down.

Usage: check-layers.py [REPO_ROOT]   (exit 1 and one line per bad include)
"""

from __future__ import annotations

import os
import re
import sys

# module -> modules it may include. Bottom first.
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "plan": {"common"},
    "importer": {"plan", "common"},
    "sim": {"plan", "common"},
    "kernels": {"common"},
    "checkpoint": {"plan", "common"},
    "coordinator": {"plan", "common"},
    "client": {"plan", "common"},
    "worker/comm": {"common"},
    "worker/optimizer": {"worker/comm", "checkpoint", "kernels", "plan", "common"},
    "worker/workload": {"worker/optimizer", "worker/comm", "checkpoint", "kernels", "plan", "common"},
    "worker": {
        "worker/comm",
        "worker/optimizer",
        "worker/workload",
        "client",
        "checkpoint",
        "kernels",
        "plan",
        "common",
    },
    "gpu": {"worker", "worker/comm", "kernels", "common"},
    "cli": {"client", "checkpoint", "importer", "sim", "plan", "common"},
    "python": {
        "worker",
        "worker/optimizer",
        "worker/comm",
        "client",
        "checkpoint",
        "importer",
        "kernels",
        "plan",
        "common",
    },
    # Programs on top of everything: they may include any module.
    "bench": {"*"},
    "fuzz": {"*"},
    "tests": {"*"},
}
# worker/internal belongs to worker (the runner's parts).
ALIASES = {"worker/internal": "worker", "kernels/internal": "kernels"}
SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".cuh")
SKIPPED_DIRS = {".git", "deploy", "docs", "examples", "proto", "scripts"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(path: str) -> str | None:
    """The most specific module of ALLOWED (or ALIASES) that holds path."""
    parts = path.split("/")
    for depth in range(len(parts) - 1, 0, -1):
        prefix = "/".join(parts[:depth])
        if prefix in ALIASES:
            return ALIASES[prefix]
        if prefix in ALLOWED:
            return prefix
    return None


def sources(root: str):
    for directory, subdirs, files in os.walk(root):
        rel_dir = os.path.relpath(directory, root)
        subdirs[:] = [
            d
            for d in subdirs
            if not d.startswith((".", "build")) and os.path.join(rel_dir, d).lstrip("./") not in SKIPPED_DIRS
        ]
        for name in files:
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.normpath(os.path.join(rel_dir, name))


def violations(root: str) -> list[str]:
    found = []
    for path in sorted(sources(root)):
        source = module_of(path)
        if source is None:
            found.append(f"{path}: folder has no row in scripts/check-layers.py's table")
            continue
        allowed = ALLOWED[source]
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                match = INCLUDE.match(line)
                if not match or not os.path.exists(os.path.join(root, match.group(1))):
                    continue  # Generated (protobuf) or third-party.
                target = module_of(match.group(1))
                if target is None or target == source or "*" in allowed or target in allowed:
                    continue
                found.append(f"{path}:{number}: {source} may not include {match.group(1)} ({target})")
    return found


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found = violations(os.path.abspath(root))
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) against the layering (see the table in scripts/check-layers.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
