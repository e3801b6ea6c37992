"""Run workloads a-f against direct stdio, mcp-bridge and (when installed) supergateway and mcp-proxy.

Each target is started fresh for every run, the load generator (bench/load.py)
runs as its own process, and the peak RSS of the target process plus all its
descendants is sampled from /proc. Prints a table of medians with the ratio of
mcp-bridge to every other target, and writes the raw results to
bench/results/<timestamp>.json.

    python -m bench.run                              # a-f, all targets found, 3 runs, HTTP+SSE
    python -m bench.run --workloads a,b --targets direct,bridge --runs 1
    python -m bench.run --transport streamable
    python -m bench.run --transport sse,streamable,stateless --workloads a,c,d --targets direct,bridge
    python -m bench.run --idle 10000                 # the idle-sessions target (bench/idle.py)
    python -m bench.run --workloads c,d --targets nginx-1,nginx-3,nginx-fwd   # replicas behind nginx (bench/replicas.py)

With `--record`, the table also replaces its own in bench/RESULTS.md (bench/figures.py):
HTTP+SSE against the other bridges, or, with several transports, mcp-bridge's side by side.

supergateway listens on every interface and has no host option, so when it is
a target the whole comparison runs inside a new network namespace holding
nothing but loopback (`unshare -n`, or `unshare -rn` when not root); if no
namespace can be made, supergateway is skipped with a message.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import figures

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OTHERS = os.path.join(HERE, ".others")
RESULTS = os.path.join(HERE, "results")
SERVER_CMD = [sys.executable, "-S", os.path.join(HERE, "server.py")]
MIB = 1024 * 1024
NETNS_ENV = "MCP_BRIDGE_BENCH_NETNS"

WORKLOADS: dict[str, dict[str, Any]] = {
    "a": {"title": "1 session x 2,000 sequential calls", "sessions": 1, "calls": 2000, "inflight": 1},
    "b": {"title": "1 session x 5,000 calls, 32 in flight", "sessions": 1, "calls": 5000, "inflight": 32},
    "c": {"title": "50 sessions x 200 calls, all at once", "sessions": 50, "calls": 200, "inflight": 1},
    "d": {"title": "200 sessions x 20 calls, all at once", "sessions": 200, "calls": 20, "inflight": 1},
    "e": {"title": "1 session x 50 calls echoing 1 MiB each way", "sessions": 1, "calls": 50, "inflight": 1, "in_bytes": MIB},
    "f": {"title": "1 session x 50 calls returning 1 MiB", "sessions": 1, "calls": 50, "inflight": 1, "out_bytes": MIB},
}

# The best correct other bridge per workload (HTTP+SSE, measured once with this
# benchmark and quoted here), and the targets.
ANCHORS = {
    "a": ("supergateway 4.0.0", 1200, 0.66, 155),
    "b": ("supergateway 4.0.0", 3080, 7.3, 174),
    "c": ("mcp-proxy 6.7.19", 2880, 11.5, 211),
    "d": ("mcp-proxy 6.7.19", 2020, 34, 174),
    "e": ("mcp-proxy 6.7.19", 30, 30, 229),
    "f": ("mcp-proxy 6.7.19", 43, 21, 208),
}
TARGET_RPS_FACTOR = 2.0
TARGET_ADDED_P50_MS = 0.25
TARGET_RSS_D_MIB = 64

ALL_TARGETS = ["direct", "bridge", "supergateway", "mcp-proxy", "nginx-1", "nginx-3", "nginx-fwd"]
LABELS = {
    "direct": "direct stdio", "bridge": "mcp-bridge", "supergateway": "supergateway", "mcp-proxy": "mcp-proxy",
    "nginx-1": "nginx+1 bridge", "nginx-3": "nginx+3 bridges", "nginx-fwd": "nginx+fwd hop",
}  # fmt: skip
# Replicas behind nginx (bench/replicas.py): how many, and whether every message takes a forwarding hop.
REPLICA_TARGETS = {"nginx-1": ["--replicas", "1"], "nginx-3": ["--replicas", "3"], "nginx-fwd": ["--replicas", "2", "--forward"]}
# The load generator's modes for the HTTP transports: HTTP+SSE (2024-11-05), Streamable HTTP
# with 2025 sessions, and Streamable HTTP at 2026-07-28 (stateless, no session).
TRANSPORTS = {"sse": "HTTP+SSE", "streamable": "Streamable 2025", "stateless": "2026-07-28"}
# The other bridges serve a legacy server to legacy clients only.
STATELESS_TARGETS = ("direct", "bridge")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------ /proc sampling


PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def process_tree(root: int) -> list[int]:
    seen, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo += _children(pid)
    return seen


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait)."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    return (sum(parts[:8]) - parts[3] - parts[4]) / TICK


class Sampler(threading.Thread):
    """Samples the summed RSS of a process tree every `interval` s; remembers the peak."""

    def __init__(self, root: int, exclude: tuple[int, ...] = (), interval: float = 0.025) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.exclude = set(exclude)
        self.interval = interval
        self.peak = 0
        self.last = 0
        self.samples = 0
        self.cpu: dict[int, float] = {}  # CPU seconds each process used while sampled
        self._cpu0: dict[int, float] = {}
        self._stop_event = threading.Event()
        self._pids: list[int] = []
        self._refreshed = 0.0
        self._t_start = time.monotonic()

    def pids(self) -> list[int]:
        return [p for p in process_tree(self.root) if p not in self.exclude]

    def _account_cpu(self) -> None:
        for p in self._pids:
            used = cpu_seconds(p)
            # What a process had used when first seen at the start is not the run's (a bridge's startup).
            base = self._cpu0.setdefault(p, used if self.samples == 0 else 0.0)
            self.cpu[p] = max(self.cpu.get(p, 0.0), used - base)

    def sample(self) -> None:
        now = time.monotonic()
        # The tree is re-read every 0.1 s (every sample during the first second, when children appear).
        if now - self._refreshed > 0.1 or now - self._t_start < 1.0:
            self._pids = self.pids()
            self._refreshed = now
            self._account_cpu()
        total = sum(rss_bytes(p) for p in self._pids)
        self.last = total
        self.peak = max(self.peak, total)
        self.samples += 1

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(2)
        self._pids = self.pids()
        self._account_cpu()

    def cpu_total(self) -> float:
        return sum(self.cpu.values())


# ------------------------------------------------------------------ targets


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, timeout: float = 1.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def others_bin(name: str) -> str | None:
    path = os.path.join(OTHERS, "node_modules", ".bin", name)
    return path if os.path.exists(path) else None


def bridge_config(path: str, keepalive: str = "15s", max_sessions: int = 1000) -> None:
    """The config mcp-bridge is benchmarked with: bench/server.py, shared, limits raised."""
    args = json.dumps(SERVER_CMD[1:])
    with open(path, "w") as f:
        f.write(
            f"""# generated by bench/run.py
listen: {{host: 127.0.0.1, port: 0}}
limits:
  max_message_bytes: 8MiB      # 1 MiB texts, JSON-escaped, with room to spare
  max_sessions: {max_sessions}
  max_inflight: 256
  session_queue: 1024
  drain_timeout: 1s
sse:
  keepalive: {keepalive}
logging: {{format: json, level: info}}
servers:
  bench:
    command: {json.dumps(SERVER_CMD[0])}
    args: {args}
    mode: shared
"""
        )


@dataclass
class Target:
    """One started bridge: its process (a group leader), its URLs, its log."""

    name: str
    proc: subprocess.Popen[bytes] | None
    sse_url: str = ""
    streamable_url: str = ""
    logfile: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def url(self, transport: str) -> str:
        return self.sse_url if transport == "sse" else self.streamable_url  # stateless shares the /mcp endpoint

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the group we started, SIGKILL it after `grace` seconds; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        # Anything left in our group (a server the bridge did not reap) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.returncode


def spawn(cmd: list[str], logfile: str, cwd: str | None = None) -> subprocess.Popen[bytes]:
    with open(logfile, "wb") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)


def wait_ready(pred: Any, proc: subprocess.Popen[bytes], what: str, logfile: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready; log: {log_tail(logfile)}")
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            value = pred()
            if value:
                return value
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready within {timeout}s; log: {log_tail(logfile)}")


def log_tail(path: str, n: int = 1500) -> str:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        data = f.read()
        return data[-n:].decode("utf-8", "replace")
    return ""


def start_bridge(workdir: str, keepalive: str = "15s", max_sessions: int = 1000) -> Target:
    cfg = os.path.join(workdir, "bridge.yaml")
    bridge_config(cfg, keepalive, max_sessions)
    logfile = os.path.join(workdir, "bridge.log")
    exe = shutil.which("mcp-bridge", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    cmd = [exe, "--config", cfg, "--port", "0"] if exe else [sys.executable, "-m", "bridge", "--config", cfg, "--port", "0"]
    cmd += shlex.split(os.environ.get("BENCH_BRIDGE_ARGS", ""))  # e.g. "--loop asyncio" to compare loops
    proc = spawn(cmd, logfile, cwd=ROOT)
    port = bridge_port(proc, logfile)
    wait_ready(lambda: http_get(port, "/readyz") == 200, proc, "mcp-bridge /readyz", logfile)
    base = f"http://127.0.0.1:{port}/servers/bench"
    return Target("bridge", proc, base + "/sse", base + "/mcp", logfile, {"port": port, "config": cfg})


def bridge_port(proc: subprocess.Popen[bytes], logfile: str, timeout: float = 20.0) -> int:
    """The port a bridge started with `--port 0` listens on, from its log."""

    def listening() -> int | None:
        with open(logfile, "rb") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "listening":
                        return int(event["port"])
        return None

    port: int = wait_ready(listening, proc, "mcp-bridge", logfile, timeout)
    return port


def start_supergateway(workdir: str, transport: str) -> Target:
    exe = others_bin("supergateway")
    assert exe is not None
    port = free_port()
    logfile = os.path.join(workdir, "supergateway.log")
    cmd = [exe, "--stdio", " ".join(SERVER_CMD), "--port", str(port), "--logLevel", "none", "--healthEndpoint", "/healthz"]
    if transport == "streamable":
        cmd += ["--outputTransport", "streamableHttp", "--stateful"]
    proc = spawn(cmd, logfile)
    wait_ready(lambda: http_get(port, "/healthz") == 200, proc, "supergateway", logfile)
    base = f"http://127.0.0.1:{port}"
    return Target("supergateway", proc, base + "/sse", base + "/mcp", logfile, {"port": port})


def start_mcp_proxy(workdir: str, transport: str) -> Target:
    exe = others_bin("mcp-proxy")
    assert exe is not None
    port = free_port()
    logfile = os.path.join(workdir, "mcp-proxy.log")
    server = "sse" if transport == "sse" else "stream"
    cmd = [exe, "--host", "127.0.0.1", "--port", str(port), "--server", server, "--", *SERVER_CMD]
    proc = spawn(cmd, logfile)
    wait_ready(lambda: http_get(port, "/ping") == 200, proc, "mcp-proxy", logfile)
    base = f"http://127.0.0.1:{port}"
    return Target("mcp-proxy", proc, base + "/sse", base + "/mcp", logfile, {"port": port})


def start_replicas(name: str, workdir: str) -> Target:
    logfile = os.path.join(workdir, "replicas.log")
    proc = spawn([sys.executable, "-m", "bench.replicas", "--workdir", workdir, *REPLICA_TARGETS[name]], logfile, cwd=ROOT)

    def ready() -> int | None:
        with open(logfile, "rb") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    return int(json.loads(line)["port"])
        return None

    port = wait_ready(ready, proc, name, logfile, timeout=60)
    base = f"http://127.0.0.1:{port}/servers/bench"
    return Target(name, proc, base + "/sse", base + "/mcp", logfile, {"port": port})


def start_target(name: str, workdir: str, transport: str) -> Target:
    if name in REPLICA_TARGETS:
        return start_replicas(name, workdir)
    if name == "direct":
        return Target("direct", None)
    if name == "bridge":
        return start_bridge(workdir)
    if name == "supergateway":
        return start_supergateway(workdir, transport)
    if name == "mcp-proxy":
        return start_mcp_proxy(workdir, transport)
    raise ValueError(name)


# ------------------------------------------------------------------ one run


def load_command(workload: dict[str, Any], mode: str, url: str, args: argparse.Namespace) -> list[str]:
    cmd = [
        sys.executable,
        os.path.join(HERE, "load.py"),
        "--mode", mode,
        "-n", str(workload["sessions"]),
        "-k", str(workload["calls"]),
        "-c", str(workload["inflight"]),
        "--in-bytes", str(workload.get("in_bytes", 0)),
        "--out-bytes", str(workload.get("out_bytes", 0)),
        "--call-timeout", str(args.call_timeout),
        "--run-timeout", str(args.run_timeout),
    ]  # fmt: skip
    if url:
        cmd += ["--url", url]
    if args.no_uvloop:
        cmd.append("--no-uvloop")
    return cmd


def one_run(wl_name: str, target_name: str, run_no: int, transport: str, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh target, the workload once (or `--rounds` times on the same target), RSS sampled throughout."""
    workload = WORKLOADS[wl_name]
    record: dict[str, Any] = {"workload": wl_name, "target": target_name, "run": run_no, "transport": transport}
    rounds = 1 if target_name == "direct" else max(1, args.rounds)
    with tempfile.TemporaryDirectory(prefix="mcp-bridge-bench-") as workdir:
        target: Target | None = None
        sampler: Sampler | None = None
        try:
            target = start_target(target_name, workdir, transport)
            mode = "direct" if target_name == "direct" else transport
            cmd = load_command(workload, mode, target.url(transport) if target.proc else "", args)
            record["command"] = " ".join(cmd)
            if target.proc is not None:
                sampler = Sampler(target.proc.pid, interval=args.sample_interval)
                sampler.start()
                time.sleep(args.sample_interval * 2)
            per_round = []
            for round_no in range(1, rounds + 1):
                busy0, t0 = machine_busy_seconds(), time.monotonic()
                cpu0 = sampler.cpu_total() if sampler else 0.0
                loadgen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                if sampler is None:  # direct: the server is the load generator's child
                    sampler = Sampler(loadgen.pid, exclude=(loadgen.pid,), interval=args.sample_interval)
                    sampler.start()
                sampler.peak = 0
                try:
                    out, err = loadgen.communicate(timeout=args.run_timeout + 30)
                except subprocess.TimeoutExpired:
                    loadgen.kill()
                    out, err = loadgen.communicate()
                if target.proc is None:
                    sampler.stop()
                else:
                    sampler.sample()
                    sampler._pids = sampler.pids()
                    sampler._account_cpu()
                busy1, t1 = machine_busy_seconds(), time.monotonic()
                try:
                    report = json.loads(out)
                except ValueError:
                    raise RuntimeError(f"load generator failed (exit {loadgen.returncode}): {err.decode()[-1500:]}") from None
                wall = t1 - t0
                cores = os.cpu_count() or 1
                cpu = sampler.cpu_total() - cpu0
                if report.get("machine_busy_s") is not None:  # measured over the load generator's own window
                    other = report["machine_busy_s"] - cpu - report["loadgen_cpu_s"]
                    wall = report["wall_s"]
                else:
                    other = (busy1 - busy0) - cpu - report["loadgen_cpu_s"]
                this = {
                    "load": report,
                    "peak_rss_mib": round(sampler.peak / MIB, 1),
                    "target_cpu_s": round(cpu, 3),
                    "target_cpu_share": round(cpu / wall / cores, 3),
                    # CPU used by everything else on the machine meanwhile (noise): high means a busy neighbour.
                    "other_cpu_share": round(max(0.0, other) / wall / cores, 3),
                }
                if err.strip():
                    this["loadgen_stderr"] = err.decode()[-1000:]
                if rounds > 1:
                    time.sleep(0.5)  # let the sessions that just closed be cleaned up
                    sampler.sample()
                    this["rss_after_mib"] = round(sampler.last / MIB, 1)
                    if not args.quiet:
                        log(f"  {wl_name} run {run_no} {LABELS[target_name]} round {round_no}: {report['rps']:,.0f} req/s, peak RSS {this['peak_rss_mib']} MiB, after {this['rss_after_mib']} MiB, err {report['errors']} mis {report['misrouted']}")
                per_round.append(this)
            record.update(per_round[0])  # the fresh round is what the table compares
            record["rss_samples"] = sampler.samples if sampler else 0
            if rounds > 1:
                record["rounds"] = [
                    {
                        "rps": r["load"]["rps"],
                        "p50_ms": r["load"]["latency_ms"]["p50"],
                        "p99_ms": r["load"]["latency_ms"]["p99"],
                        "errors": r["load"]["errors"],
                        "misrouted": r["load"]["misrouted"],
                        "peak_rss_mib": r["peak_rss_mib"],
                        "rss_after_mib": r["rss_after_mib"],
                    }
                    for r in per_round
                ]
        except Exception as exc:  # recorded, shown in the table as a failure
            record["failure"] = f"{exc.__class__.__name__}: {exc}"
        finally:
            if sampler is not None and sampler.is_alive():
                sampler.stop()
            if target is not None:
                record["target_exit"] = target.stop()
                if target.logfile:
                    record["target_log_tail"] = log_tail(target.logfile, 600) if record.get("failure") else None
    return record


def render_rounds(records: list[dict[str, Any]]) -> str:
    """RSS after each round on one daemon, and its growth after the second round (the target: under 5 MiB in d)."""
    lines = []
    for r in records:
        rounds = r.get("rounds")
        if not rounds:
            continue
        after = [x["rss_after_mib"] for x in rounds]
        growth = after[-1] - after[1] if len(after) > 1 else 0.0
        errors = sum(x["errors"] for x in rounds)
        mis = sum(x["misrouted"] for x in rounds)
        lines.append(
            f"  {r['workload']} run {r['run']} {LABELS[r['target']]:<13} RSS after each round (MiB): {' '.join(f'{a:.1f}' for a in after)}; "
            f"growth after round 2: {growth:+.1f} MiB; req/s by round: {' '.join(format(x['rps'], ',.0f') for x in rounds)}; err {errors} mis {mis}"
        )
    return ("\nrepeated rounds on one daemon:\n" + "\n".join(lines)) if lines else ""


# -------------------------------------------------------------- the table


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        cell = out.setdefault(r["workload"], {}).setdefault(r["target"], {"runs": [], "failures": []})
        if "load" in r:
            cell["runs"].append(r)
        else:
            cell["failures"].append(r.get("failure"))
    for wl in out.values():
        for cell in wl.values():
            runs = cell.pop("runs")
            loads = [r["load"] for r in runs]
            cell.update(
                n=len(runs),
                rps=_median([x["rps"] for x in loads]),
                p50=_median([x["latency_ms"]["p50"] for x in loads]),
                p99=_median([x["latency_ms"]["p99"] for x in loads]),
                setup_p50=_median([x["setup_ms"]["p50"] for x in loads]),
                setup_p99=_median([x["setup_ms"]["p99"] for x in loads]),
                rss=_median([r["peak_rss_mib"] for r in runs]),
                loadgen_cpu=_median([x["loadgen_cpu_share"] for x in loads]),
                target_cpu=_median([r["target_cpu_share"] for r in runs]),
                target_us=_median([r["target_cpu_s"] / r["load"]["ok"] * 1e6 if r["load"]["ok"] else None for r in runs]),
                loadgen_us=_median([x["loadgen_cpu_us_per_call"] for x in loads]),
                other_cpu=_median([r["other_cpu_share"] for r in runs]),
                errors=sum(x["errors"] for x in loads),
                misrouted=sum(x["misrouted"] for x in loads),
            )
    return out


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def _failed_row(label: str, cell: dict[str, Any], width: int) -> str:
    return f"{label:<{width}}failed: {(cell['failures'] or ['?'])[0]}"[:200]


def _noise_err(cell: dict[str, Any]) -> str:
    return f"{_f(cell['other_cpu'] and cell['other_cpu'] * 100, '.0f'):>6}%{str(cell['errors']) + '/' + str(cell['misrouted']):>9}"


def render(summary: dict[str, dict[str, dict[str, Any]]], targets: list[str], transport: str) -> str:
    lines = []
    head = f"{'target':<14}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'setup p99':>10}{'RSS MiB':>9}{'lg CPU':>8}{'lg us':>7}{'tgt us':>8}{'noise':>7}{'err/mis':>9}   mcp-bridge / this: req/s   p50    RSS"
    for wl in WORKLOADS:
        if wl not in summary:
            continue
        lines.append(f"\n{wl}: {WORKLOADS[wl]['title']} ({TRANSPORTS[transport]})")
        lines.append(head)
        cells = summary[wl]
        bridge = cells.get("bridge")
        for t in targets:
            c = cells.get(t)
            if c is None:
                continue
            if not c["n"]:
                lines.append(_failed_row(LABELS[t], c, 14))
                continue
            ratios = ""
            if bridge and bridge["n"] and t != "bridge":
                ratios = f"{_ratio(bridge['rps'], c['rps']):>26}{_ratio(bridge['p50'], c['p50']):>7}{_ratio(bridge['rss'], c['rss']):>7}"
            lines.append(
                f"{LABELS[t]:<14}{_f(c['rps'], ',.0f'):>9}{_f(c['p50'], '.3f'):>9}{_f(c['p99'], '.2f'):>9}{_f(c['setup_p99'], '.1f'):>10}"
                f"{_f(c['rss'], '.1f'):>9}{_f(c['loadgen_cpu'] and c['loadgen_cpu'] * 100, '.0f'):>7}%{_f(c['loadgen_us'], '.0f'):>7}{_f(c['target_us'], '.0f'):>8}"
                f"{_noise_err(c)}{ratios}"
                + (f"  ({len(c['failures'])} failed)" if c["failures"] else "")
            )
    return "\n".join(lines)


def render_goals(summary: dict[str, dict[str, dict[str, Any]]], transport: str) -> str:
    """mcp-bridge against its targets (the anchors are the quoted HTTP+SSE figures of ANCHORS)."""
    lines = [f"\nmcp-bridge against its targets ({TRANSPORTS[transport]}; anchors quoted, not measured here):"]
    for wl, (who, rps, _p50, _rss) in ANCHORS.items():
        c = summary.get(wl, {}).get("bridge")
        if not c or not c["n"]:
            continue
        ok = c["rps"] is not None and c["rps"] >= TARGET_RPS_FACTOR * rps and c["errors"] == 0 and c["misrouted"] == 0
        lines.append(
            f"  {wl}: {c['rps']:,.0f} req/s = {c['rps'] / rps:.2f}x {who}'s {rps:,} (goal >= {TARGET_RPS_FACTOR:.0f}x, all correct): "
            + ("met" if ok else "MISSED")
        )
    a = summary.get("a", {})
    if a.get("bridge", {}).get("p50") is not None and a.get("direct", {}).get("p50") is not None:
        added = a["bridge"]["p50"] - a["direct"]["p50"]
        lines.append(f"  a: p50 added over direct {added:.3f} ms (goal <= {TARGET_ADDED_P50_MS} ms): " + ("met" if added <= TARGET_ADDED_P50_MS else "MISSED"))
    d = summary.get("d", {}).get("bridge")
    if d and d["n"]:
        lines.append(f"  d: peak RSS bridge+server {d['rss']:.1f} MiB (goal <= {TARGET_RSS_D_MIB} MiB): " + ("met" if d["rss"] <= TARGET_RSS_D_MIB else "MISSED"))
    return "\n".join(lines)


def render_transports(summaries: dict[str, dict[str, dict[str, dict[str, Any]]]]) -> str:
    """mcp-bridge over each transport side by side, each against HTTP+SSE (the goal: both
    Streamable paths at least as fast and as cheap per call as HTTP+SSE on a, c and d)."""
    base = summaries.get("sse", {})
    head = f"{'transport':<17}{'req/s':>9}{'tgt us':>8}{'p50 ms':>9}{'noise':>7}{'err/mis':>9}   / HTTP+SSE: req/s  tgt us"
    lines = ["\nmcp-bridge by transport (medians; tgt us: bridge + server CPU per answered call):"]
    for wl in WORKLOADS:
        rows = [(t, s[wl]["bridge"]) for t, s in summaries.items() if s.get(wl, {}).get("bridge")]
        if not rows:
            continue
        lines += [f"\n{wl}: {WORKLOADS[wl]['title']}", head]
        sse = base.get(wl, {}).get("bridge")
        for transport, c in rows:
            if not c["n"]:
                lines.append(_failed_row(TRANSPORTS[transport], c, 17))
                continue
            vs = ""
            if sse and sse["n"] and transport != "sse":
                vs = f"{_ratio(c['rps'], sse['rps']):>18}{_ratio(c['target_us'], sse['target_us']):>8}"
            lines.append(
                f"{TRANSPORTS[transport]:<17}{_f(c['rps'], ',.0f'):>9}{_f(c['target_us'], '.0f'):>8}{_f(c['p50'], '.3f'):>9}"
                f"{_noise_err(c)}{vs}"
            )
    return "\n".join(lines)


# ----------------------------------------------------------- network namespace


def _lo_up() -> None:
    """Bring loopback up in a fresh network namespace (ioctl; no `ip` needed)."""
    import fcntl
    import struct

    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


def netns_command() -> list[str] | None:
    """How to enter a new network namespace here, or None if none can be made."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for flags in (["-n"], ["-rn"]) if os.geteuid() == 0 else (["-rn"],):
        probe = subprocess.run([unshare, *flags, "true"], capture_output=True)
        if probe.returncode == 0:
            return [unshare, *flags, "--"]
    return None


def only_loopback() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]  # this namespace's, unlike /sys/class/net


# ----------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="a,b,c,d,e,f", help="comma-separated, from a-f")
    p.add_argument("--targets", default=None, help=f"comma-separated, from {','.join(ALL_TARGETS)} (default: all that are installed, but the nginx-* replicas)")
    p.add_argument("--transport", default="sse", help=f"comma-separated, from {','.join(TRANSPORTS)}: each gets its table, and with several, mcp-bridge's figures side by side")
    p.add_argument("--runs", type=int, default=3, help="fresh runs per workload and target (default 3)")
    p.add_argument("--rounds", type=int, default=1, help="run each workload this many times on the same target per run (e.g. d 10 times: is RSS flat?); the table shows round 1")
    p.add_argument("--call-timeout", type=float, default=30.0)
    p.add_argument("--run-timeout", type=float, default=300.0)
    p.add_argument("--sample-interval", type=float, default=0.025, help="RSS sampling period in seconds (20-50 ms)")
    p.add_argument("--no-uvloop", action="store_true", help="run the load generator on the stdlib event loop")
    p.add_argument("--no-netns", action="store_true", help="never enter a network namespace (skips supergateway)")
    p.add_argument("--out", default=None, help="results file (default bench/results/<timestamp>.json)")
    p.add_argument("--idle", type=int, default=None, metavar="N", help="instead: the idle-sessions test with N sessions (see bench/idle.py)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--record", action="store_true", help="replace the table in bench/RESULTS.md: others (HTTP+SSE, several targets) or transports (several transports)")
    args, rest = p.parse_known_args(argv)
    args.rest = rest
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.idle is not None:
        from bench import idle

        return idle.main(["--sessions", str(args.idle), *(["--out", args.out] if args.out else []), *args.rest])
    if args.rest:
        log(f"unknown arguments: {' '.join(args.rest)}")
        return 2
    transports = [t.strip() for t in args.transport.split(",") if t.strip()]
    bad = [t for t in transports if t not in TRANSPORTS]
    if bad or not transports:
        log(f"unknown transports: {', '.join(bad) or '(none)'} (known: {', '.join(TRANSPORTS)})")
        return 2
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        log(f"unknown workloads: {', '.join(bad)} (known: {', '.join(WORKLOADS)})")
        return 2
    explicit = args.targets is not None
    default = [t for t in ALL_TARGETS if t not in REPLICA_TARGETS]  # replicas only when named
    targets = [t.strip() for t in (args.targets or ",".join(default)).split(",") if t.strip()]
    bad = [t for t in targets if t not in ALL_TARGETS]
    if bad:
        log(f"unknown targets: {', '.join(bad)} (known: {', '.join(ALL_TARGETS)})")
        return 2
    for t, exe in (("supergateway", "supergateway"), ("mcp-proxy", "mcp-proxy")):
        if t in targets and others_bin(exe) is None:
            log(f"skipping {t}: not installed (see bench/README.md: mkdir -p bench/.others && cd bench/.others && npm install supergateway@4.0.0 mcp-proxy@6.7.19)")
            targets.remove(t)
    if not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
        for t in [t for t in targets if t in REPLICA_TARGETS]:
            log(f"skipping {t}: nginx is not installed (Debian: apt-get install nginx-light)")
            targets.remove(t)
    in_netns = os.environ.get(NETNS_ENV) == "1"
    if "supergateway" in targets and not in_netns:
        ns = None if args.no_netns else netns_command()
        if ns is None:
            log("skipping supergateway: it listens on every interface and no network namespace could be made here (unshare -n / -rn failed)")
            targets.remove("supergateway")
        else:
            log(f"entering a network namespace with only loopback for this comparison: {' '.join(ns)}")
            env = {**os.environ, NETNS_ENV: "1", "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}
            os.execvpe(ns[0], [*ns, sys.executable, "-m", "bench.run", *argv], env)
    if in_netns:
        _lo_up()
        if not only_loopback():
            log("refusing: the namespace has interfaces other than loopback")
            return 1
    if not targets:
        log("no targets to run")
        return 2
    if explicit is False:
        log(f"targets: {', '.join(targets)}")

    started = dt.datetime.now()
    records: list[dict[str, Any]] = []
    skipped = [t for t in targets if t not in STATELESS_TARGETS]
    if "stateless" in transports and skipped:
        log(f"stateless: only {', '.join(STATELESS_TARGETS)} (not {', '.join(skipped)}: they serve a legacy server to legacy clients only)")
    for wl in workloads:
        for run_no in range(1, args.runs + 1):
            # Interleaved, so slow drift on the machine hits every target and transport alike;
            # direct speaks stdio, so it runs once per run whatever the transports.
            for transport, t in [(tr, t) for tr in transports for t in targets if (tr == transports[0] or t != "direct")]:
                if transport == "stateless" and t not in STATELESS_TARGETS:
                    continue
                rec = one_run(wl, t, run_no, transport, args)
                records.append(rec)
                if not args.quiet:
                    label = f"{LABELS[t]} ({TRANSPORTS[transport]})" if t != "direct" else LABELS[t]
                    if "load" in rec:
                        x = rec["load"]
                        log(
                            f"{wl} run {run_no} {label:<30} {x['rps']:>9,.0f} req/s  p50 {x['latency_ms']['p50']} ms  p99 {x['latency_ms']['p99']} ms  "
                            f"RSS {rec['peak_rss_mib']} MiB  lg CPU {x['loadgen_cpu_share']:.0%}  noise {rec['other_cpu_share']:.0%}  "
                            f"err {x['errors']} mis {x['misrouted']}" + (f"  e.g. {x['error_samples'][0][:120]}" if x["error_samples"] else "")
                        )
                    else:
                        log(f"{wl} run {run_no} {label:<30} FAILED: {rec['failure'][:300]}")
    summaries = {
        transport: summarize([r for r in records if r["transport"] == transport or r["target"] == "direct"]) for transport in transports
    }
    tables = [render(summary, targets, transport) for transport, summary in summaries.items()]
    goals_list = [render_goals(summary, transport) for transport, summary in summaries.items()] if "bridge" in targets else []
    side_by_side = render_transports(summaries) if len(transports) > 1 and "bridge" in targets else ""
    table, goals = "\n".join(tables), "\n".join(goals_list)
    print(table)
    if goals:
        print(goals)
    if side_by_side:
        print(side_by_side)
    rounds_text = render_rounds(records)
    if rounds_text:
        print(rounds_text)
    print(
        "\nmedians of fresh runs. RSS: peak of the target process and all its descendants. lg CPU: the load generator's own "
        "CPU / wall / cores; lg us, tgt us: CPU microseconds per answered call of the load generator and of the target "
        "(bridge + server; for direct, the server). noise: CPU the rest of the machine used meanwhile / wall / cores. "
        "err/mis: errors and misrouted messages, summed over runs."
    )
    os.makedirs(RESULTS, exist_ok=True)
    out = args.out or os.path.join(RESULTS, started.strftime("%Y%m%d-%H%M%S") + ".json")
    meta = {
        "started": started.isoformat(timespec="seconds"),
        "argv": argv,
        "transport": transports,
        "runs": args.runs,
        "rounds": args.rounds,
        "workloads": {w: WORKLOADS[w] for w in workloads},
        "targets": targets,
        "netns": in_netns,
        "cores": os.cpu_count(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
        "python": sys.version.split()[0],
        "server_cmd": SERVER_CMD,
        "git_rev": figures.commit(),
        "versions": _versions(targets),
    }
    with open(out, "w") as f:
        json.dump({"meta": meta, "summary": summaries, "table": table, "goals": goals, "transports": side_by_side, "rounds": rounds_text, "records": records}, f, indent=1)
    print(f"raw results: {os.path.relpath(out, os.getcwd())}")
    if args.record:
        if side_by_side:
            figures.record("transports", transports_table(summaries, argv, args.runs))
        elif transports == ["sse"] and "bridge" in targets and len(targets) > 1:
            figures.record("others", others_table(summaries["sse"], targets, argv, args.runs))
        else:
            log("--record: nothing to record (several transports with mcp-bridge, or HTTP+SSE with mcp-bridge and others)")
            return 2
    return 0


def _cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    if not c["n"]:
        return "failed"
    text = f"{c['rps']:,.0f} req/s, p50 {c['p50']:.3f} ms, {c['rss']:.0f} MiB"
    if c["setup_p99"] is not None and c["setup_p99"] >= 100:
        text += f", setup p99 {c['setup_p99'] / 1000:.1f} s"
    return text + (f", **{c['misrouted']:,} misrouted**" if c["misrouted"] else "")


def others_table(summary: dict[str, dict[str, dict[str, Any]]], targets: list[str], argv: list[str], runs: int) -> figures.Table:
    versions = _versions(targets)
    labels = [f"{LABELS[t]} {versions[t]}" if versions.get(t) else LABELS[t] for t in targets]
    rows = []
    for wl in (w for w in WORKLOADS if w in summary):
        cells = summary[wl]
        bridge = cells.get("bridge")
        correct = [(c["rps"], t) for t, c in cells.items() if t not in ("direct", "bridge") and c["n"] and not c["misrouted"] and not c["errors"]]
        versus = "-"
        if correct and bridge and bridge["n"]:
            rps, best = max(correct)
            versus = f"{bridge['rps'] / rps:.2f}x ({LABELS[best]})"
        rows.append([f"{wl}: {WORKLOADS[wl]['title']}", *(_cell(cells.get(t)) for t in targets), versus])
    return figures.Table(
        title="Against other bridges (HTTP+SSE)",
        command=shlex.join(["python", "-m", "bench.run", *argv]),
        about=(f"medians of {runs} fresh runs per workload and target; the other bridges installed in `bench/.others`, "
               "run in a network namespace with only loopback; 2 cores shared by the load generator, the bridge and the server. "
               "Misrouted: responses that reached a session they do not belong to"),  # fmt: skip
        columns=["workload", *labels, "mcp-bridge vs best correct other"],
        rows=rows,
    )


def transports_table(summaries: dict[str, dict[str, dict[str, dict[str, Any]]]], argv: list[str], runs: int) -> figures.Table:
    rows = []
    for wl in WORKLOADS:
        base = summaries.get("sse", {}).get(wl, {}).get("bridge")
        row = [f"{wl}: {WORKLOADS[wl]['title']}"]
        for transport, summary in summaries.items():
            c = summary.get(wl, {}).get("bridge")
            if c is None or not c["n"]:
                row.append("-" if c is None else "failed")
                continue
            text = f"{c['rps']:,.0f} req/s, {c['target_us']:.0f} µs, p50 {c['p50']:.3f} ms"
            if transport != "sse" and base and base["n"]:
                text += f" ({c['rps'] / base['rps']:.2f}x, {c['target_us'] / base['target_us']:.2f}x)"
            row.append(text)
        if len(row) > 1 and any(cell != "-" for cell in row[1:]):
            rows.append(row)
    return figures.Table(
        title="The three HTTP paths",
        command=shlex.join(["python", "-m", "bench.run", *argv]),
        about=(f"medians of {runs} fresh daemons per transport, runs interleaved; µs: bridge and server CPU per call; "
               "ratios to HTTP+SSE in the same run"),  # fmt: skip
        columns=["workload", *(TRANSPORTS[t] for t in summaries)],
        rows=rows,
        after=("Timings on a shared two-core machine move by 10-25% from one set to the next; "
               "the instruction counts above do not."),  # fmt: skip
    )


def _versions(targets: list[str]) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in ("supergateway", "mcp-proxy"):
        if name in targets:
            with contextlib.suppress(OSError, ValueError), open(os.path.join(OTHERS, "node_modules", name, "package.json")) as f:
                versions[name] = json.load(f).get("version")
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        versions["mcp-bridge"] = version("mcp-bridge")
    return versions


if __name__ == "__main__":
    sys.exit(main())
