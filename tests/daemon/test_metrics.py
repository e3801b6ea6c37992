"""The process metrics are there and add up: real server processes, read from /proc by the
test itself to check what /metrics says of them. The tables' bounds and labels, which need
no process, are tests/unit/test_metrics_unit.py."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.daemon import faulty
from support.metrics import scrape
from support.rawclient import RawSse
from test_operations import server_pid

from bridge import __version__
from bridge.metrics import ServerMetrics


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
