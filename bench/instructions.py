"""Instructions per call in the bridge, by transport: a count where timings only swing.

Runs mcp-bridge under valgrind's callgrind, which counts the user-space
instructions the bridge process executes (not its server's, not the
kernel's). It warms the bridge with 300 calls, zeroes the count, runs N
sequential calls (workload a's shape) with bench/load.py, and reads the
count. The same code given the same calls executes the same instructions to
within about 0.1%, however busy the machine is (the bridge runs with a fixed
hash seed: with a random one, the count moves by about 0.5%). bench/run.py's CPU times, on
a shared two-core machine, swing by 10% from one set of runs to the next. So
this is the measure that can tell whether a change to the per-call path made
it cheaper, and by how much. bench/run.py remains the measure of what users
get: instructions are not time, and kernel work (the sends, the wakeups) is
not counted here.

    python -m bench.instructions                               # sse, streamable, stateless; 1,000 calls each
    python -m bench.instructions --transport streamable --calls 2000
    python -m bench.instructions --sessions 50 --calls 2000    # 50 clients at once (workload c's shape)
    python -m bench.instructions --transport streamable --region bridge.http.fastpath:parse_head
    python -m bench.instructions --record                      # and replace the table in bench/RESULTS.md
    python -m bench.instructions --transport sse,streamable --group --record  # workloads a and c through a group of two
    python -m bench.instructions --transport sse,streamable --traces 0,0.01,1 --record  # a and c with tracing off and on

`--region MODULE:ATTR` counts only what runs inside that function (a module's
function or a class's method, and all it calls), to say what one part of the
path costs: the function is wrapped in a call through `_functools.reduce`,
and callgrind collects only inside that C function (`--toggle-collect`). The
wrapper adds about 1,500 instructions per call of it; a region that is not
on the path reads 0.

Needs valgrind (Debian's `valgrind`). Under it the bridge runs about 50 times
slower, so a transport takes two to three minutes. Loopback only; it stops
exactly the processes it started.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

from bench import figures
from bench import run as harness  # the config and the daemon handling of bench/run.py

HERE = os.path.dirname(os.path.abspath(__file__))

WARMUP_CALLS = 300
START_TIMEOUT_S = 120.0  # python and aiohttp importing under valgrind


def drive(mode: str, url: str, calls: int, sessions: int = 1, tool_prefix: str = "") -> dict[str, object]:
    """`calls` in all, from `sessions` clients at once, each making its calls one after another."""
    cmd = [sys.executable, os.path.join(HERE, "load.py"), "--mode", mode, "--url", url, "-n", str(sessions), "-k", str(calls // sessions), "-c", "1",
           "--call-timeout", "60", "--run-timeout", "1800", "--tool-prefix", tool_prefix]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1900, check=False)
    report: dict[str, object] = json.loads(out.stdout)
    if report.get("ok") != calls // sessions * sessions:
        raise RuntimeError(f"{mode}: {report.get('ok')} of {calls} calls answered: {report.get('error_samples')}")
    return report


def _total(dump: str) -> int:
    with open(dump) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no total in {dump}")


# Runs the bridge with REGION's function wrapped so that callgrind's --toggle-collect=functools_reduce
# counts only inside it (nothing else on the path calls functools.reduce).
_REGION_RUNNER = """
import _functools, importlib, sys
module, _, path = sys.argv[1].partition(":")
*owners, name = path.split(".")
owner = importlib.import_module(module)
for part in owners:
    owner = getattr(owner, part)
inner = getattr(owner, name)
def wrapped(*args, **kwargs):
    out = []
    _functools.reduce(lambda _a, _b: out.append(inner(*args, **kwargs)), (0, 0))
    return out[0]
setattr(owner, name, wrapped)
sys.argv = ["mcp-bridge", *sys.argv[2:]]
from bridge import cli
cli.main()
"""


# With --group: the server twice, as the two members of one group, called through the group.
GROUP = """  bench2:
    command: {command}
    args: {args}
    mode: shared
groups:
  g: {{servers: [bench, bench2]}}
"""


TRACES = """
telemetry:
  traces: {{endpoint: "{endpoint}", sampler: {{ratio: {ratio}}}}}
"""


TRACES_AFTER = (
    "Ratio 0: tracing on and no call traced, what a call not traced costs (the sampling draw, the trace-context lookups). "
    "Ratio 1: every call traced, two spans each (the HTTP request's and the request's), made, ended and exported. "
    "At ratio 0.01 about ten of the 1,000 calls are traced (a random draw: 5 to 15), and the export thread posts what is queued "
    "every 5 s of wall time, which callgrind's slowdown (about 50x) stretches over more posts per call than a real run makes: "
    "the measured figure moves by a few percent from run to run; the expected one (ratio 0's cost, plus 1% of what tracing a "
    "call adds at ratio 1) does not."
)


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that takes every export and keeps nothing (its work is not the bridge's)."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass


@contextlib.contextmanager
def sink() -> Iterator[str]:
    """A collector on loopback for the bridge's spans: its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()


def measure(
    transport: str, calls: int, sessions: int = 1, region: str | None = None, group: bool = False, traces: tuple[str, float] | None = None
) -> int:
    """User-space instructions the bridge executes per call of `transport` (inside `region` only, if
    given), at the server's own endpoint or, with `group`, through a group of two such servers;
    with `traces` (a collector's URL, a sampler ratio), tracing on."""
    with tempfile.TemporaryDirectory(prefix="mcp-bridge-instr-") as workdir:
        config, log = os.path.join(workdir, "bridge.yaml"), os.path.join(workdir, "bridge.log")
        harness.bridge_config(config)
        if group:
            with open(config, "a") as f:
                f.write(GROUP.format(command=json.dumps(harness.SERVER_CMD[0]), args=json.dumps(harness.SERVER_CMD[1:])))
        if traces is not None:
            with open(config, "a") as f:
                f.write(TRACES.format(endpoint=traces[0], ratio=traces[1]))
        out = os.path.join(workdir, "callgrind.%p")
        bridge = ["-m", "bridge"] if region is None else ["-c", _REGION_RUNNER, region]
        only = [] if region is None else ["--collect-atstart=no", "--toggle-collect=functools_reduce"]
        # A fixed hash seed: with a random one, dict and set layouts differ from run to run, and so
        # does the count (by about 0.5%, more than the changes this is meant to see).
        cmd = ["env", "PYTHONHASHSEED=0", "valgrind", "--tool=callgrind", *only, f"--callgrind-out-file={out}", sys.executable, *bridge,
               "--config", config, "--port", "0"]  # fmt: skip
        proc = harness.spawn(cmd, log, cwd=harness.ROOT)
        try:
            port = harness.bridge_port(proc, log, START_TIMEOUT_S)
            path, prefix = ("groups/g", "bench__") if group else ("servers/bench", "")
            url = f"http://127.0.0.1:{port}/{path}/{'sse' if transport == 'sse' else 'mcp'}"
            drive(transport, url, WARMUP_CALLS, tool_prefix=prefix)
            subprocess.run(["callgrind_control", "--zero", str(proc.pid)], capture_output=True, check=True, timeout=60)
            drive(transport, url, calls, sessions, prefix)
            subprocess.run(["callgrind_control", "--dump", str(proc.pid)], capture_output=True, check=True, timeout=60)
            dumps = sorted((p for p in os.listdir(workdir) if p.startswith(f"callgrind.{proc.pid}.")), key=lambda p: int(p.rsplit(".", 1)[1]))
            if not dumps:
                raise RuntimeError(f"callgrind wrote no dump; log: {harness.log_tail(log)}")
            return _total(os.path.join(workdir, dumps[-1])) // (calls // sessions * sessions)
        finally:
            harness.Target("bridge", proc).stop(grace=60)  # callgrind writes its last dump on the way out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", default="sse,streamable,stateless", help="comma-separated: sse, streamable, stateless")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=1, help="clients at once, sharing the calls (workload c's shape: 50)")
    parser.add_argument("--region", help="MODULE:ATTR (bridge.gateway.gateway:Gateway._call_ended): count only inside that function")
    parser.add_argument("--group", action="store_true", help="workloads a and c at the server's own endpoint and through a group of two such servers, and the ratio")
    parser.add_argument("--traces", help="comma-separated sampler ratios (0.01,1): workloads a and c with tracing off and at each ratio")
    parser.add_argument("--json", action="store_true", help="print {transport: instructions per call} as JSON (what bench/baselines.json holds)")
    parser.add_argument("--record", action="store_true", help="also replace the instructions table of bench/RESULTS.md (all transports, one session, no region)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("needs valgrind (Debian package valgrind)", file=sys.stderr)
        return 2
    transports = args.transport.split(",")
    unknown = [t for t in transports if t not in harness.TRANSPORTS]
    if unknown:
        parser.error(f"unknown transport {', '.join(unknown)} (known: {', '.join(harness.TRANSPORTS)})")
    if args.region is not None and not re.fullmatch(r"[\w.]+:[\w.]+", args.region):
        parser.error(f"--region {args.region!r}: expected MODULE:ATTR, as bridge.http.fastpath:parse_head")
    if args.record and (args.region or args.sessions != 1 or transports[0] != "sse"):
        parser.error("--record: the table is of every transport, HTTP+SSE first, one session, no region")
    if args.group:
        return groups(transports, args.calls, args.region, args.record)
    if args.traces:
        return traced(transports, args.calls, [float(r) for r in args.traces.split(",")], args.record)
    counts = {t: measure(t, args.calls, args.sessions, args.region) for t in transports}
    if args.json:
        print(json.dumps(counts))
        return 0
    base = counts.get("sse")
    each = args.calls // args.sessions
    inside = f", inside {args.region} (with its wrapper)" if args.region else ""
    print(f"bridge instructions per call, {args.sessions} session(s) x {each:,} sequential calls (callgrind, user space{inside}):")
    for transport, count in counts.items():
        ratio = f"   {count / base:.3f}x HTTP+SSE" if base and transport != "sse" else ""
        print(f"  {harness.TRANSPORTS[transport]:<16}{count:>10,}{ratio}")
    if args.record and base:
        figures.record("instructions", table(counts, base, args.calls))
    return 0


GROUP_SHAPES = (("a", 1), ("c", 50))  # workload, sessions at once


def groups(transports: list[str], calls: int, region: str | None, record: bool) -> int:
    """Workloads a and c through a group of two, against the server's own endpoint."""
    rows = []
    print("instructions per call: the server's own endpoint, and through a group of two")
    for transport in [t for t in transports if t != "stateless"]:  # a group serves the 2025 revisions
        for workload, sessions in GROUP_SHAPES:
            n = calls if sessions == 1 else calls * 2
            direct, grouped = measure(transport, n, sessions, region), measure(transport, n, sessions, region, group=True)
            ratio = f"{grouped / direct:.3f}x" if direct else "-"  # a region off the direct path reads 0
            print(f"  {harness.TRANSPORTS[transport]:<16} {workload} {direct:>10,}{grouped:>10,}   {ratio}")
            rows.append([VERSIONED[transport], workload, f"{direct:,}", f"{grouped:,}", ratio])
    if record and region is None:
        figures.record("groups", figures.Table(
            title="Groups: instructions per call",
            command=f"python -m bench.instructions --transport {','.join(transports)} --calls {calls} --group --record",
            about=(f"callgrind, user space, as the table above: workload a ({calls:,} sequential calls, one session) and c "
                   f"({calls * 2:,} calls from 50 sessions at once) to the server's own endpoint, and through a group of two "
                   "such servers (`/groups/g/...`, the tool `bench__echo`)"),
            columns=["transport", "workload", "own endpoint", "through a group", "against own"],
            rows=rows,
        ))  # fmt: skip
    return 0


def traced(transports: list[str], calls: int, ratios: list[float], record: bool) -> int:
    """Workloads a and c with tracing off, and on at each sampler ratio (spans to a collector
    on loopback that takes them all): the export thread's work is the bridge's, and counted."""
    rows = []
    print("instructions per call: tracing off, and on at each ratio (against off)")
    with sink() as url:
        for transport in transports:
            for workload, sessions in GROUP_SHAPES:
                n = calls if sessions == 1 else calls * 2
                off = measure(transport, n, sessions)
                on = dict(zip(ratios, (measure(transport, n, sessions, traces=(url, ratio)) for ratio in ratios), strict=True))
                cells = [f"{count:,} ({count / off:.3f}x)" + _expected(on, ratio, off) for ratio, count in on.items()]
                print(f"  {harness.TRANSPORTS[transport]:<16} {workload} {off:>10,}  " + "  ".join(cells))
                rows.append([VERSIONED[transport], workload, f"{off:,}", *cells])
    if record:
        figures.record("traces", figures.Table(
            title="Traces: instructions per call",
            command=f"python -m bench.instructions --transport {','.join(transports)} --calls {calls} --traces {','.join(map(str, ratios))} --record",
            about=(f"callgrind, user space, as the first table: workload a ({calls:,} sequential calls, one session) and c "
                   f"({calls * 2:,} calls from 50 sessions at once), with tracing off and on (`telemetry.traces`, each ratio; "
                   "the calls carry no trace context, so the ratio decides), spans exported over OTLP/HTTP to a collector on "
                   "loopback: the bridge's export thread is counted"),
            columns=["transport", "workload", "tracing off", *(f"ratio {ratio:g}" for ratio in ratios)],
            rows=rows,
            after=TRACES_AFTER,
        ))  # fmt: skip
    return 0


def _expected(on: dict[float, int], ratio: float, off: int) -> str:
    """With ratios 0 and 1 measured, what a ratio between costs on average: a call not traced
    costs what one at ratio 0 does, a traced one what one at ratio 1 does. Deterministic, where
    the measured figure moves with the draw and the export thread's timing."""
    if not 0 < ratio < 1 or 0 not in on or 1 not in on:
        return ""
    expected = round(on[0] + ratio * (on[1] - on[0]))
    return f"; expected {expected:,} ({expected / off:.3f}x)"


def table(counts: dict[str, int], base: int, calls: int) -> figures.Table:
    rows = [[VERSIONED[t], f"{count:,}", f"{count / base:.3f}x"] for t, count in counts.items()]
    return figures.Table(
        title="Instructions per call",
        command=f"python -m bench.instructions --calls {calls} --record",
        about=(f"callgrind, user space, one session, {calls:,} sequential `tools/call`s of workload a's shape after {WARMUP_CALLS} to warm up; "
               "deterministic to about 0.1% on a quiet machine, 0.5% under load"),  # fmt: skip
        columns=["transport", "instructions per call", "against HTTP+SSE"],
        rows=rows,
        after=("`bench/baselines.json` holds the same at 200 calls, which `tests/release/test_instructions.py` "
               "checks every change against (more than 2% above fails)."),  # fmt: skip
    )


VERSIONED = {"sse": "HTTP+SSE (2024-11-05)", "streamable": "Streamable HTTP (2025-06-18)", "stateless": "2026-07-28"}


if __name__ == "__main__":
    sys.exit(main())
