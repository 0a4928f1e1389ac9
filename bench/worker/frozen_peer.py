#!/usr/bin/python3
"""How fast a survivor leaves its collective when a peer freezes (not a test).

Starts muonshard-coordinator (--heartbeat-timeout H) and two muonshard-worker
processes (synthetic workload on the bundled tiny-llama, --comm-timeout 300),
SIGSTOPs rank 1 after FREEZE_AT seconds of training and prints, from rank 0's
own stderr read as it is written, how long after the freeze rank 0 reported
its step failed (the collective aborted: the line the worker prints at once)
and when it exited (after tearing down: the /metrics server's stop takes
about 2 s). NOTE [Prompt aborts] (worker/rank_session.h) targets H + 1 s for
leaving the collective.

Usage: /usr/bin/python3 bench/worker/frozen_peer.py [--heartbeat-timeout 2] [--freeze-at 1 3 6] [--build build]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(bin_dir, timeout, freeze_at):
    scratch = tempfile.mkdtemp(prefix="muonshard-frozen-")
    port_file = os.path.join(scratch, "ports.json")
    coordinator = subprocess.Popen(
        [
            os.path.join(bin_dir, "muonshard-coordinator"),
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            os.path.join(scratch, "data"),
            "--metrics-port",
            "-1",
            "--heartbeat-timeout",
            str(timeout),
            "--port-file",
            port_file,
        ],
        stderr=subprocess.DEVNULL,
    )
    workers = []
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.monotonic() > deadline:
                raise TimeoutError("the coordinator did not start")
            time.sleep(0.05)
        address = "127.0.0.1:%d" % json.load(open(port_file))["grpc_port"]
        subprocess.run(
            [
                os.path.join(bin_dir, "muonshardctl"),
                "submit",
                "--coordinator",
                address,
                "--manifest",
                os.path.join(ROOT, "examples", "manifests", "tiny-llama.json"),
                "--world-size",
                "2",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        error_at = []
        for r in range(2):
            workers.append(
                subprocess.Popen(
                    [
                        os.path.join(bin_dir, "muonshard-worker"),
                        "--coordinator",
                        address,
                        "--job",
                        "frozen",
                        "--rank",
                        str(r),
                        "--steps",
                        "1000000",
                        "--workload",
                        "synthetic",
                        "--blas-threads",
                        "1",
                        "--metrics-port",
                        "0",
                        "--comm-timeout",
                        "300",
                        "--log-every",
                        "1000000",
                    ],
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )

        def watch():
            for line in workers[0].stderr:
                if "failed: " in line:
                    error_at.append((time.monotonic(), line.strip()))

        threading.Thread(target=watch, daemon=True).start()
        time.sleep(freeze_at)
        frozen = time.monotonic()
        workers[1].send_signal(signal.SIGSTOP)
        workers[0].wait(timeout=600)
        exited = time.monotonic()
        time.sleep(0.1)  # the reader thread's last line
        reported = error_at[0][0] - frozen if error_at else float("nan")
        return reported, exited - frozen, error_at[0][1] if error_at else ""
    finally:
        for p in workers + [coordinator]:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heartbeat-timeout", type=float, default=2.0)
    ap.add_argument("--freeze-at", type=float, nargs="+", default=[1.0, 3.0, 6.0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    bin_dir = os.path.join(os.path.abspath(a.build), "bin")
    print("| frozen after s | rank 0 out of its collective after s | rank 0 exited after s | target (timeout + 1 s) |")
    print("|---|---|---|---|")
    last = ""
    for at in a.freeze_at:
        reported, exited, line = run(bin_dir, a.heartbeat_timeout, at)
        print("| %.1f | %.2f | %.2f | %.1f |" % (at, reported, exited, a.heartbeat_timeout + 1), flush=True)
        last = line
    print("\nrank 0: %s" % last[:240], file=sys.stderr)


if __name__ == "__main__":
    main()
