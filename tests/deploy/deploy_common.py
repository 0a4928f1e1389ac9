"""Helpers shared by the deploy checks (tests/deploy/*.py).

- Exit codes: 0 pass, 1 fail, SKIP (77, ctest SKIP_RETURN_CODE) only when a
  tool the check runs is not installed.
- PromQL metric-name extraction for the dashboard and the Prometheus rules.
- The exported metric names as the C++ headers list them.
- LoopbackStack: the real muonshard-coordinator and muonshard-worker processes
  on 127.0.0.1, always cleaned up.
"""

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def skip(message):
    print(f"SKIP: {message}")
    sys.exit(SKIP)


def require_tool(name):
    path = shutil.which(name)
    if path is None:
        skip(f"{name} is not installed")
    return path


class Checker:
    """Collects failures so one run reports all of them."""

    def __init__(self, name):
        self.name = name
        self.failures = []
        self.checks = 0

    def check(self, condition, message):
        self.checks += 1
        if not condition:
            self.failures.append(message)
            print(f"FAIL: {message}")
        return condition

    def finish(self):
        if self.failures:
            print(f"{self.name}: {len(self.failures)} of {self.checks} checks failed")
            sys.exit(1)
        print(f"{self.name}: all {self.checks} checks passed")
        sys.exit(0)


def variant_and_tool(script):
    """The compose|k8s argument of `script` and the tool that renders it
    (docker-compose or kubectl); usage and exit 2 otherwise."""
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in ("compose", "k8s"):
        print(f"usage: {script} compose|k8s")
        sys.exit(2)
    return which, require_tool("docker-compose" if which == "compose" else "kubectl")


def run(argv, **kwargs):
    """Runs a command, returning CompletedProcess with text output."""
    kwargs.setdefault("timeout", 120)
    return subprocess.run(argv, capture_output=True, text=True, **kwargs)


def load_yaml(path_or_text, text=False):
    import yaml  # PyYAML (Debian python3-yaml, see scripts/install-deps.sh)

    if text:
        return list(yaml.safe_load_all(path_or_text))
    with open(path_or_text) as f:
        return yaml.safe_load(f)


# ---------------------------------------------------------------- PromQL

_PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
}
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def promql_metric_names(expr):
    """The metric names a PromQL expression (possibly with Grafana variables)
    selects. Raises ValueError for what it cannot parse (unbalanced brackets),
    so an odd query fails the check instead of slipping through."""
    s = expr
    # String literals (label values, e.g. "$job", "0.99"), then Grafana
    # variables ($job, $__rate_interval, ${phase}).
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', s)
    s = re.sub(r"'(?:[^'\\]|\\.)*'", "''", s)
    s = re.sub(r"\$\{[^}]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*", " ", s)
    # Label matchers, range / subquery selectors.
    s = _strip_balanced(s, "{", "}")
    s = _strip_balanced(s, "[", "]")
    # Label lists of aggregations and vector matching: by (a, b), on(...).
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    names = set()
    for m in _IDENT.finditer(s):
        word = m.group(0)
        start, end = m.span()
        if start > 0 and (s[start - 1].isdigit() or s[start - 1] == "."):
            continue  # part of a number such as 1e-9 or 0.5
        rest = s[end:].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if word.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def _strip_balanced(s, open_c, close_c):
    out, depth = [], 0
    for c in s:
        if c == open_c:
            depth += 1
            continue
        if c == close_c:
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {close_c!r} in {s!r}")
            continue
        if depth == 0:
            out.append(c)
    if depth != 0:
        raise ValueError(f"unbalanced {open_c!r} in {s!r}")
    return "".join(out)


# ---------------------------------------------------------------- sources

DASHBOARD = os.path.join(REPO, "deploy", "grafana", "muonshard.json")
RULES = os.path.join(REPO, "deploy", "prometheus", "rules", "muonshard.rules.yml")
PROMETHEUS_CONFIG = os.path.join(REPO, "deploy", "prometheus", "prometheus.yml")


def dashboard_panels(dashboard):
    """Every panel, rows' nested panels included."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []) or [])
    return out


def dashboard_exprs(dashboard):
    """(where, expr) of every query: panel targets and query variables."""
    out = []
    for p in dashboard_panels(dashboard):
        for t in p.get("targets", []) or []:
            if "expr" in t:
                out.append((f"panel {p.get('title')!r} target {t.get('refId')}", t["expr"]))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else (q or "")
            m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_]\w*\s*\)\s*", q)
            out.append((f"variable {v.get('name')}", m.group(1) if m else q))
    return out


_AGGREGATIONS = (
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "quantile",
    "topk",
    "bottomk",
    "stddev",
    "stdvar",
    "group",
    "count_values",
)
_AGG = re.compile(r"\b(" + "|".join(_AGGREGATIONS) + r")\b\s*(by|without)?\s*(\([^()]*\))?\s*\(")


def _closing(s, i):
    """The index after the bracket closing the one at s[i]."""
    depth = 0
    for j in range(i, len(s)):
        depth += {"(": 1, ")": -1}.get(s[j], 0)
        if depth == 0:
            return j + 1
    raise ValueError(f"unbalanced ( in {s!r}")


def aggregations(expr):
    """(operator, grouping labels or None for none / `without`) of every
    aggregation in a PromQL expression, either form: `sum by (a) (x)` and
    `sum(x) by (a)`."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values may hold anything
    out = []
    for m in _AGG.finditer(s):
        op, mod, labels = m.group(1), m.group(2), m.group(3)
        if mod is None:  # maybe the trailing form
            t = re.match(r"\s*(by|without)\s*(\([^()]*\))", s[_closing(s, m.end() - 1) :])
            if t:
                mod, labels = t.group(1), t.group(2)
        if mod == "by":
            out.append((op, {x.strip() for x in labels.strip("()").split(",") if x.strip()}))
        else:
            out.append((op, None))  # over every label (or `without`, which may drop job)
    return out


def panels_in_order(dashboard):
    """(panel, the repeat variable of the row it lies in or None), rows'
    nested (collapsed) panels and the panels following an expanded row."""
    out, row_repeat = [], None
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            row_repeat = p.get("repeat")
            out.append((p, None))
            out.extend((q, row_repeat) for q in p.get("panels", []) or [])
        else:
            out.append((p, row_repeat))
    return out


def rules_exprs(rules):
    """(where, expr) of every rule, and the names the rules record."""
    out, recorded = [], set()
    for g in rules.get("groups", []):
        for r in g.get("rules", []):
            where = f"rule {r.get('record') or r.get('alert')}"
            out.append((where, r["expr"]))
            if "record" in r:
                recorded.add(r["record"])
    return out, recorded


def header_exported_names(path, array):
    """The names in `inline constexpr const char* <array>[] = {...};`."""
    with open(path) as f:
        text = f.read()
    m = re.search(re.escape(array) + r"\[\]\s*=\s*\{(.*?)\};", text, re.S)
    if not m:
        raise ValueError(f"{path}: no {array}[] list")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return re.findall(r'"([a-zA-Z_:][a-zA-Z0-9_:]*)"', body)


def exported_names_from_headers():
    """Family names the binaries declare, with their histogram series names
    (a family is a histogram when its header comment says so)."""
    families = set(header_exported_names(os.path.join(REPO, "coordinator", "metrics.h"), "kExportedMetrics"))
    families |= set(header_exported_names(os.path.join(REPO, "worker", "metrics.h"), "kWorkerExportedMetrics"))
    series = set(families)
    for path in ("coordinator/metrics.h", "worker/metrics.h"):
        with open(os.path.join(REPO, path)) as f:
            for name in re.findall(r'"([a-z_:0-9]+)",\s*//\s*histogram', f.read()):
                series |= {name + "_bucket", name + "_sum", name + "_count"}
    return families, series


# ---------------------------------------------------------------- /metrics


def scrape(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def sample_names(exposition):
    """Names of the samples in a Prometheus text exposition."""
    names = set()
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)", line)
        if m:
            names.add(m.group(1))
    return names


def sample_values(exposition, name):
    """{labels-string: value} of the samples named `name`."""
    out = {}
    for line in exposition.splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) == name:
            out[m.group(2) or ""] = float(m.group(3))
    return out


# ---------------------------------------------------------------- processes


def bin_dir():
    d = os.environ.get("MUONSHARD_BIN_DIR", os.path.join(REPO, "build", "bin"))
    return d


def _die_with_parent():
    # If this test process dies (a ctest timeout kills it), the kernel kills
    # the children too: nothing outlives the test.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class LoopbackStack:
    """A coordinator, one submitted plan and N workers of one job, all on
    127.0.0.1 with ports picked by the OS (read back from --port-file)."""

    def __init__(self, scratch):
        self.scratch = scratch
        self.bin = bin_dir()
        self.procs = []  # (name, Popen, log path)
        self.coordinator_port = None
        self.coordinator_metrics_port = None
        self.worker_metrics_ports = []

    def binary(self, name):
        path = os.path.join(self.bin, name)
        if not os.access(path, os.X_OK):
            return None
        return path

    def spawn(self, name, argv):
        log = os.path.join(self.scratch, name + ".log")
        f = open(log, "wb")
        p = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        f.close()
        self.procs.append((name, p, log))
        return p

    def log_of(self, name):
        for n, _, log in self.procs:
            if n == name:
                with open(log, errors="replace") as f:
                    return f.read()
        return ""

    def _wait_port_file(self, name, proc, path, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(path):
                try:
                    with open(path) as f:
                        return json.load(f)
                except (ValueError, OSError):
                    pass  # written atomically, but be lenient
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_of(name)}")
            time.sleep(0.05)
        raise RuntimeError(f"{name}: no {path} after {timeout}s:\n{self.log_of(name)}")

    def start_coordinator(self):
        port_file = os.path.join(self.scratch, "coordinator.port")
        p = self.spawn(
            "coordinator",
            [
                self.binary("muonshard-coordinator"),
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                os.path.join(self.scratch, "data"),
                "--metrics-port",
                "0",
                "--metrics-host",
                "127.0.0.1",
                "--port-file",
                port_file,
            ],
        )
        ports = self._wait_port_file("coordinator", p, port_file, 30)
        self.coordinator_port = ports["grpc_port"]
        self.coordinator_metrics_port = ports["metrics_port"]

    @property
    def address(self):
        return f"127.0.0.1:{self.coordinator_port}"

    def ctl(self, *args, timeout=60):
        r = run([self.binary("muonshardctl"), *args, "--coordinator", self.address], timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"muonshardctl {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
        return r.stdout

    def submit(self, manifest, world_size, ep=1, policy="seed"):
        out = json.loads(
            self.ctl(
                "submit",
                "--manifest",
                manifest,
                "--world-size",
                str(world_size),
                "--ep",
                str(ep),
                "--policy",
                policy,
                "--output",
                "json",
            )
        )
        return int(out["version"])

    def plan(self, version):
        return json.loads(self.ctl("get", "--version", str(version), "--output", "json"))

    def start_workers(self, job, world_size, plan_version, steps, linger_s=300):
        for r in range(world_size):
            port_file = os.path.join(self.scratch, f"worker-{r}.port")
            self.spawn(
                f"worker-{r}",
                [
                    self.binary("muonshard-worker"),
                    "--coordinator",
                    self.address,
                    "--job",
                    job,
                    "--rank",
                    str(r),
                    "--plan-version",
                    str(plan_version),
                    "--backend",
                    "gloo",
                    "--workload",
                    "regression",
                    "--steps",
                    str(steps),
                    "--hostname",
                    "127.0.0.1",
                    "--metrics-host",
                    "127.0.0.1",
                    "--metrics-port",
                    "0",
                    "--port-file",
                    port_file,
                    "--blas-threads",
                    "1",
                    "--linger",
                    str(linger_s),
                    "--log-every",
                    "1",
                ],
            )
        for r in range(world_size):
            proc = self.procs[-world_size + r][1]
            ports = self._wait_port_file(f"worker-{r}", proc, os.path.join(self.scratch, f"worker-{r}.port"), 60)
            self.worker_metrics_ports.append(ports["metrics_port"])

    def wait_steps(self, steps, timeout):
        """Until every worker's /metrics shows `steps` finished steps."""
        deadline = time.monotonic() + timeout
        while True:
            done = 0
            for r, port in enumerate(self.worker_metrics_ports):
                name, proc, _ = self.procs[-len(self.worker_metrics_ports) + r]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_of(name)}")
                try:
                    v = sample_values(scrape(f"http://127.0.0.1:{port}/metrics"), "muonshard_worker_steps_total")
                except OSError:
                    v = {}
                if v and min(v.values()) >= steps:
                    done += 1
            if done == len(self.worker_metrics_ports):
                return
            if time.monotonic() >= deadline:
                logs = "\n".join(self.log_of(n) for n, _, _ in self.procs if n.startswith("worker"))
                raise RuntimeError(f"workers did not finish {steps} steps in {timeout}s:\n{logs}")
            time.sleep(0.2)

    def stop(self):
        """SIGTERM every process (workers first), SIGKILL what is left after
        10 s. Safe to call twice."""
        for _, p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, p, _ in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def scratch_dir(prefix):
    return tempfile.mkdtemp(prefix=prefix)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def scratch_run(c, prefix):
    """A scratch folder for a check's processes: an exception inside becomes a
    failed check with its message; the folder is removed when every check
    passed and kept (and named) otherwise."""
    scratch = tempfile.mkdtemp(prefix=prefix)
    try:
        yield scratch
    except Exception as e:
        c.check(False, f"{type(e).__name__}: {e}")
    finally:
        if not c.failures:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"logs kept in {scratch}")
