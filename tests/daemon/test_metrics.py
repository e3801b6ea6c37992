"""Metric tables stay bounded; the process metrics are there and add up.

The last test runs the real daemon (the `bridge` fixture) with real server
processes and reads /proc itself to check what /metrics says of them.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.daemon import faulty
from support.metrics import scrape
from support.rawclient import RawSse
from test_operations import server_pid

from bridge import __version__
from bridge.metrics import LATENCY_BUCKETS, Latency, ServerMetrics, code_label


def test_tables_keyed_by_bounded_labels() -> None:
    m = ServerMetrics("s")
    for i in range(1000):
        m.request_done(f"vendor/{i}", 0.001)
        m.message("from_client", f"vendor/{i}")
        m.error_sent({"code": -1000 - i, "message": "vendor"})
    m.request_done("tools/call", 0.002)
    m.message("from_client", ["not", "a", "string"])
    assert set(m.durations) == {"other", "tools/call"}
    assert m.durations["other"].count == 1000
    assert set(m.messages) == {("from_client", "other")}
    assert m.messages["from_client", "other"] == 1001
    assert m.errors == {"other": 1000}


def test_error_code_labels() -> None:
    assert code_label({"code": -32602, "message": "x"}) == "-32602"
    assert code_label({"code": -32003}) == "-32003"  # the bridge's: server unavailable
    assert code_label({"code": -32002}) == "-32002"  # MCP's: resource not found
    for odd in ({"code": 7}, {"code": -32602.0}, {"code": "-32602"}, {"code": True}, {}, "error", None):
        assert code_label(odd) == "other", odd


def test_latency_buckets_are_cumulative_and_a_bound_is_in_its_own_bucket() -> None:
    """Prometheus buckets count what is less than or equal to their bound (`le`)."""
    latency = Latency()
    for seconds in (0.001, 0.0011, 0.3, 1000.0):
        latency.observe(seconds)
    cumulative = dict(latency.cumulative())
    assert cumulative["0.0005"] == 0
    assert cumulative["0.001"] == 1  # exactly on the bound
    assert cumulative["0.0025"] == 2
    assert cumulative["0.25"] == 2 and cumulative["0.5"] == 3
    assert cumulative[str(LATENCY_BUCKETS[-1])] == 3 and cumulative["+Inf"] == 4 == latency.count
    assert latency.total == pytest.approx(1000.3021)


def test_2026_requests_do_not_count_toward_the_next_full_collection() -> None:
    m = ServerMetrics("s")
    m.sessions_opened["sse"] += 2
    m.sessions_opened["streamable"] += 3
    m.sessions_opened["stateless"] += 1000  # one per call: they leave no cycle behind
    assert m.opened() == 5


def resident_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_cpu_of_exited_processes_still_counts() -> None:
    """The CPU counter is a sum over processes that come and go: one that exits keeps
    what it had at its last reading, so the counter never goes back."""
    burn = "import time, sys\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint(flush=True)\nsys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"\n"  # it has burnt its CPU
        m = ServerMetrics("s")
        rss = m.read_processes([proc.pid])
        assert 0.5 * resident_bytes(proc.pid) <= rss <= 2 * resident_bytes(proc.pid)
        used = m.cpu_seconds()
        assert used >= 0.25, used
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert m.read_processes([proc.pid]) == 0  # gone
    assert m.cpu_seconds() == used


async def test_process_metrics(bridge: Any) -> None:
    config = {"servers": {"s": faulty(), "p": {**faulty(), "mode": "per-session"}}}
    async with bridge(config) as b:
        async with RawSse(b.url("s")) as cs, RawSse(b.url("p")) as p1, RawSse(b.url("p")) as p2:
            for c in (cs, p1, p2):
                await c.initialize()
            spid, ppid1, ppid2 = await server_pid(cs), await server_pid(p1), await server_pid(p2)
            m = await scrape(b)
            # The daemon's own process, the interpreter, its collector; what is running.
            assert m.get("process_resident_memory_bytes") > 10 << 20  # type: ignore[operator]
            assert m.get("process_open_fds") > 0  # type: ignore[operator]
            assert m.get("process_cpu_seconds_total") is not None
            assert m.get("python_gc_objects_collected_total", generation="0") is not None
            assert m.get("mcp_bridge_build_info", version=__version__, python=platform.python_version()) == 1
            # Each server's processes: one shared, two per-session ones added up.
            for server, pids in (("s", [spid]), ("p", [ppid1, ppid2])):
                resident = sum(resident_bytes(pid) for pid in pids)
                rss = m.get("mcp_bridge_server_resident_memory_bytes", server=server)
                assert rss is not None and 0.5 * resident <= rss <= 2 * resident, (server, rss, resident)
            cpu_before = m.get("mcp_bridge_server_cpu_seconds_total", server="p")
            assert cpu_before is not None and cpu_before > 0  # two interpreters started
        for pid in (ppid1, ppid2):
            await b.wait_for("server_stopped", where=lambda e, pid=pid: e["pid"] == pid)
        m = await scrape(b)
        assert m.get("mcp_bridge_server_resident_memory_bytes", server="p") == 0
        assert m.get("mcp_bridge_server_cpu_seconds_total", server="p") == cpu_before  # their time stays counted
