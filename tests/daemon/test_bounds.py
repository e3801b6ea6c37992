"""Bounds toward a server: what it has not read, what waits for it to start, and the
kernel limits (`rlimits`) its process runs under.

Real daemon, real server processes (tests/servers/faulty.py). A server that stops
reading must cost the bridge at most `limits.server_input_buffer`, the calls that
do not fit get an error at once, and the server is restarted once it has not read
for `limits.server_input_stall`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from support.daemon import faulty
from support.rawclient import RawSse, call
from test_supervision import FAST_RESTART, text_of, tool

MiB = 1024 * 1024


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_a_server_that_stops_reading_costs_a_bounded_buffer_and_is_restarted(bridge: Any) -> None:
    """The measurement that set the bound: 300 x 1 MiB notifications to a server that stopped
    reading took the daemon from 44 to 357 MiB, with no log line or metric."""
    config = {
        "servers": {"f": {**faulty(), "restart": FAST_RESTART}},
        "limits": {"max_message_bytes": "2MiB", "server_input_buffer": "8MiB", "server_input_stall": "6s"},
    }
    async with bridge(config) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        deaf = await b.wait_for("server_started")
        assert text_of(await tool(c, "deaf")) == "deaf"
        before = rss(b.proc.pid)
        blob = "x" * MiB
        for i in range(300):
            status, _ = await c.post({"jsonrpc": "2.0", "method": "notifications/flood", "params": {"i": i, "blob": blob}})
            assert status == 202
        grown = rss(b.proc.pid) - before
        assert grown < 48 * MiB, f"the daemon grew by {grown / MiB:.0f} MiB for a server that reads nothing"
        blocked = await b.wait_for("server_input_blocked")
        assert blocked["pid"] == deaf["pid"]

        # A call that does not fit is answered at once, not queued.
        reply = await tool(c, "echo", {"text": "y" * (MiB + MiB // 2)}, request_id="full", timeout=5)
        assert reply["error"]["code"] == -32007, reply
        assert "limits.server_input_buffer" in reply["error"]["message"]

        stalled = await b.wait_for("server_stalled", timeout=10)
        assert stalled["refused"] > 250  # all but the few that fit in the buffer, and the call
        restarted = await b.wait_for("server_started", where=lambda e: e["pid"] != deaf["pid"], timeout=10)
        assert restarted["pid"] != deaf["pid"]
        assert text_of(await tool(c, "echo", {"text": "back"}, request_id="back")) == "back"


async def test_calls_waiting_for_a_starting_server_are_bounded(bridge: Any) -> None:
    """While the server is not ready, at most limits.server_backlog messages wait; the
    call past that gets -32003 at once instead of waiting (and costing memory)."""
    config = {"servers": {"f": {**faulty(FAULTY_NO_INIT="1"), "restart": FAST_RESTART}}, "limits": {"server_backlog": 3}}
    async with bridge(config) as b, RawSse(b.url("f")) as c:
        await b.wait_for("server_started")  # it never answers the bridge's initialize
        for rid in (1, 2, 3, "over"):
            status, _ = await c.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call("echo", {"text": "q"})})
            assert status == 202
        reply = await c.response("over", timeout=5)
        assert reply["error"]["code"] == -32003, reply
        assert "limits.server_backlog" in reply["error"]["message"]
        status, body = await c.post({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": call("echo", {"text": "q"})})
        assert status == 202
        assert (await c.response(4, timeout=5))["error"]["code"] == -32003


def limits_of(pid: int) -> dict[str, str]:
    """/proc/PID/limits: soft limit by name."""
    out = {}
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]:
        name, soft = line[:26].strip(), line[26:47].strip()
        out[name] = soft
    return out


async def test_a_server_runs_under_its_rlimits_and_a_limit_that_stops_it_is_named(bridge: Any) -> None:
    config = {
        "servers": {
            "f": {**faulty(), "restart": FAST_RESTART, "rlimits": {"memory": "1GiB", "cpu_time": "1s", "open_files": 64, "nice": 5}}
        }
    }
    async with bridge(config) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        pid = (await b.wait_for("server_started"))["pid"]
        limits = limits_of(pid)
        assert limits["Max address space"] == str(1 << 30) and limits["Max cpu time"] == "1" and limits["Max open files"] == "64"
        assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16]) == 5  # nice
        opened = int(text_of(await tool(c, "files", request_id="files")))
        assert 50 < opened < 64  # the limit, less what the interpreter holds open
        reply = await tool(c, "burn", request_id="burn", timeout=20)
        assert reply["error"]["code"] == -32000
        assert "its CPU time limit stopped it" in reply["error"]["message"], reply
        assert "cpu_time 1" in reply["error"]["message"]
        event = await b.wait_for("server_exited_under_limits")
        assert event["exit_code"] == -24 and event["likely"] == "its CPU time limit stopped it"
        assert (await b.wait_for("server_started", where=lambda e: e["pid"] != pid))["pid"] != pid  # restarted, daemon fine
        async with aiohttp.ClientSession() as http, http.get(b.base + "/status") as resp:
            status = (await resp.json())["servers"]["f"]
        assert status["rlimits"] == "memory 1073741824, cpu_time 1, open_files 64, nice 5"
        assert -24 in [p["last_exit_code"] for p in status["processes"]] or status["processes"][0]["restarts"] >= 1
