"""SIGTERM: a drain loses no answer, and waits for nothing else.

What it promises, across the seams: the answer of every call in flight reaches its
client, on both HTTP paths and in every answer form (JSON body, SSE stream, HTTP+SSE
event), and so does the follow-up a real client sends at once (the official SDK lists
the tools after a call's result, before handing it over); idle sessions end at once
(their streams end cleanly), so a drain with nothing in flight takes no time; `/readyz`
is 503 from its first moment, in every configuration; a server that ignores the end of
its input is stopped within `shutdown_timeout`, and nothing is left running.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client as McpClient
from support.daemon import PY, Bridge, demo, pid_alive
from support.sdk import connect, text_of
from test_operations import INIT, INITIALIZED, raw_answer, raw_request, raw_stream_head, raw_stream_rest
from test_replicas import KEY, free_port

from bridge.process.child import Child

pytestmark = [pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]

MODES = ["shared", "per-session"]
# How long after SIGTERM a daemon with nothing in flight may take to exit, the demo server's
# own stop (it exits as soon as its input ends) included.
IDLE_EXIT_S = 1.5


def countdown(rid: Any, steps: int = 10, interval_ms: int = 100) -> dict[str, Any]:
    params = {"name": "countdown", "arguments": {"steps": steps, "interval_ms": interval_ms}}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


async def in_flight(b: Bridge, server: str = "demo", at_least: int = 1) -> None:
    """Until /status counts `at_least` calls in flight on `server`."""
    async with aiohttp.ClientSession() as http, asyncio.timeout(10):
        while True:
            async with http.get(f"{b.base}/status") as resp:
                if (await resp.json())["servers"][server]["in_flight"] >= at_least:
                    return
            await asyncio.sleep(0.02)


async def exited_within(b: Bridge, seconds: float, since: float) -> None:
    async with asyncio.timeout(seconds + 10):
        assert await b.proc.wait() == 0
    took = time.monotonic() - since
    assert took < seconds, f"exited {took:.2f}s after SIGTERM"


# ------------------------------------------------------------- answers reach clients


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", ["streamable", "sse", "2026-07-28"])
async def test_a_call_answered_during_the_drain_reaches_an_sdk_client(bridge: Any, transport: str, mode: str) -> None:
    """The official SDK: SIGTERM while its call runs; the call's result, and the tools/list
    it sends before handing the result over, are both answered; then the daemon exits."""
    config = {"servers": {"demo": demo(mode=mode)}, "limits": {"drain_timeout": "10s"}}
    arguments = {"steps": 10, "interval_ms": 100}
    async with bridge(config) as b:
        signalled = asyncio.Event()

        async def signal_when_in_flight() -> None:
            await in_flight(b)
            b.proc.send_signal(signal.SIGTERM)
            signalled.set()

        signaller = asyncio.create_task(signal_when_in_flight())
        if transport == "2026-07-28":
            async with McpClient(b.url("demo", "mcp"), mode="2026-07-28", read_timeout_seconds=30) as client:
                result = await client.call_tool("countdown", arguments)
        else:
            url = b.url("demo", "mcp" if transport == "streamable" else "sse")
            async with connect(url, streamable=transport == "streamable") as client:
                result = await client.session.call_tool("countdown", arguments)
        await signaller
        assert signalled.is_set() and text_of(result) == "done"
        draining = await b.wait_for("draining")
        assert draining["in_flight"] == 1, draining
        assert await b.stop() == 0
        assert not b.named("drain_timeout")


@pytest.mark.parametrize("form", ["json", "stream"])
@pytest.mark.parametrize("path", ["fast", "aiohttp"])
async def test_a_follow_up_right_after_a_drained_answer_is_served(bridge: Any, path: str, form: str) -> None:
    """A Streamable session's call answered during the drain, as one JSON body or as a stream,
    on either HTTP path: a request its client sends soon after the answer (a client acting on
    it takes a moment, here 200 ms of the drain's 500 ms pause) is still served on that
    session, which then ends once quiet, and the daemon exits."""
    config = {"servers": {"demo": demo()}, "limits": {"drain_timeout": "10s"}}
    accept = "Accept: application/json" if form == "json" else "Accept: text/event-stream"
    async with bridge(config) as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        try:
            writer.write(raw_request("POST", "/servers/demo/mcp", json.dumps(INIT).encode(), "Accept: application/json"))
            status, headers, _ = await raw_answer(reader)
            assert status == 200
            session = f"Mcp-Session-Id: {headers['mcp-session-id']}"
            writer.write(raw_request("POST", "/servers/demo/mcp", json.dumps(INITIALIZED).encode(), session))
            assert (await raw_answer(reader))[0] == 202
            call = json.dumps(countdown("c", steps=5)).encode()
            writer.write(raw_request("POST", "/servers/demo/mcp", call, session, accept, chunked=path == "aiohttp"))
            await in_flight(b)
            mark = len(b.events)
            b.proc.send_signal(signal.SIGTERM)
            await b.wait_for("draining", start=mark)
            if form == "json":
                status, _, body = await raw_answer(reader)
                answers = [json.loads(body)]
            else:
                await raw_stream_head(reader)
                answers, clean = await raw_stream_rest(reader)
                assert clean, answers
            assert [a["result"]["content"][0]["text"] for a in answers if a.get("id") == "c"] == ["done"], answers
            await asyncio.sleep(0.2)  # the client's own time to act on the answer: see the docstring
            listed = json.dumps({"jsonrpc": "2.0", "id": "l", "method": "tools/list"}).encode()
            writer.write(raw_request("POST", "/servers/demo/mcp", listed, session, "Accept: application/json", chunked=path == "aiohttp"))
            status, _, body = await raw_answer(reader)
            assert status == 200 and "countdown" in {t["name"] for t in json.loads(body)["result"]["tools"]}, body
            closed = await b.wait_for("session_closed", start=mark)
            assert closed["reason"] == "shutdown", closed
            async with asyncio.timeout(10):
                assert await b.proc.wait() == 0
        finally:
            writer.close()
        assert not b.named("drain_timeout")


async def test_a_stateless_request_during_the_drain_is_served(bridge: Any) -> None:
    """2026-07-28 holds no session: a request that comes during the drain is served (it may be
    an answer's follow-up), in shared mode and per session (a process of its own), and the
    drain waits for it; a new 2025 session is refused (503, Retry-After)."""
    from test_modern import headers_for, post, request

    config = {"servers": {"demo": demo(), "own": demo(mode="per-session")}, "limits": {"drain_timeout": "10s"}}
    async with bridge(config) as b:
        slow = request("tools/call", {"name": "countdown", "arguments": {"steps": 10, "interval_ms": 100}})
        running = asyncio.create_task(post(b.url("demo", "mcp"), slow, headers_for(slow)))
        await in_flight(b)
        mark = len(b.events)
        b.proc.send_signal(signal.SIGTERM)
        await b.wait_for("draining", start=mark)
        quick = request("tools/call", {"name": "echo", "arguments": {"text": "late"}}, rid=2)
        served = await post(b.url("demo", "mcp"), quick, headers_for(quick))
        assert served.status == 200 and served.final()["result"]["content"][0]["text"] == "late"
        served = await post(b.url("own", "mcp"), quick, headers_for(quick))
        assert served.status == 200 and served.final()["result"]["content"][0]["text"] == "late"
        initialize = {**INIT, "params": {**INIT["params"], "protocolVersion": "2025-11-25"}}
        refused = await post(b.url("demo", "mcp"), initialize, {"Accept": "application/json", "Content-Type": "application/json"})
        assert refused.status == 503 and refused.headers["Retry-After"] == "5", refused.body
        assert "shutting down" in refused.json()["error"]["message"]
        assert (await running).final()["result"]["content"][0]["text"] == "done"
        async with asyncio.timeout(10):
            assert await b.proc.wait() == 0
        assert not b.named("drain_timeout")


async def test_a_request_just_before_the_drain_holds_it_for_its_follow_up(bridge: Any) -> None:
    """A 2026-07-28 request leaves no session behind once answered (per session, not even a
    kept one), but its client's next request may follow within DRAIN_QUIET_S. So a drain
    begun just after it waits that long, and serves the follow-up."""
    from test_modern import headers_for, post, request

    async with bridge({"servers": {"demo": demo(mode="per-session")}, "limits": {"drain_timeout": "10s"}}) as b:
        discover = request("server/discover")
        assert (await post(b.url("demo", "mcp"), discover, headers_for(discover))).status == 200
        asked = time.monotonic()
        mark = len(b.events)
        b.proc.send_signal(signal.SIGTERM)
        await b.wait_for("draining", start=mark)
        follow_up = request("tools/call", {"name": "echo", "arguments": {"text": "next"}}, rid=2)
        await asyncio.sleep(max(0.0, asked + 0.2 - time.monotonic()))  # the client's think time, well within 0.5 s
        served = await post(b.url("demo", "mcp"), follow_up, headers_for(follow_up))
        assert served.status == 200 and served.final()["result"]["content"][0]["text"] == "next"
        async with asyncio.timeout(10):
            assert await b.proc.wait() == 0


# ---------------------------------------------------------------- idle: no waiting


@pytest.mark.parametrize("cluster", [False, True])
async def test_idle_sessions_end_at_once_and_the_drain_takes_no_time(bridge: Any, cluster: bool) -> None:
    """Nothing in flight: an HTTP+SSE stream, a Streamable GET stream and a Streamable session
    with no stream all end at once (the streams cleanly), and the daemon exits within a second
    however long drain_timeout is; a replica of a cluster too."""
    config: dict[str, Any] = {"servers": {"demo": demo()}, "limits": {"drain_timeout": "30s"}}
    args: tuple[str, ...] = ()
    if cluster:
        port = free_port()
        config["cluster"] = {"peer_key": KEY}
        args = ("--port", str(port), "--advertise", f"127.0.0.1:{port}")
    async with bridge(config, *args) as b:
        sse_reader, sse_writer = await asyncio.open_connection("127.0.0.1", b.port)
        get_reader, get_writer = await asyncio.open_connection("127.0.0.1", b.port)
        post_reader, post_writer = await asyncio.open_connection("127.0.0.1", b.port)
        try:
            sse_writer.write(raw_request("GET", "/servers/demo/sse", None))
            await raw_stream_head(sse_reader)
            sessions = []
            for _ in range(2):
                post_writer.write(raw_request("POST", "/servers/demo/mcp", json.dumps(INIT).encode(), "Accept: application/json"))
                status, headers, _ = await raw_answer(post_reader)
                assert status == 200
                sessions.append(f"Mcp-Session-Id: {headers['mcp-session-id']}")
            get_writer.write(raw_request("GET", "/servers/demo/mcp", None, sessions[0], "Accept: text/event-stream"))
            await raw_stream_head(get_reader)
            await b.wait_for("session_opened", where=lambda e: e["transport"] == "sse")
            mark = len(b.events)
            signalled = time.monotonic()
            b.proc.send_signal(signal.SIGTERM)
            for stream in (sse_reader, get_reader):
                _, clean = await raw_stream_rest(stream)
                assert clean, "a stream was cut off rather than ended"
            await exited_within(b, IDLE_EXIT_S, signalled)
        finally:
            for writer in (sse_writer, get_writer, post_writer):
                writer.close()
        draining = await b.wait_for("draining", start=mark)
        assert draining["in_flight"] == 0, draining
        closed = [e for e in b.events[mark:] if e.get("event") == "session_closed"]
        assert len(closed) == 3 and {e["reason"] for e in closed} == {"shutdown"}, closed
        assert not b.named("drain_timeout")


async def test_readyz_is_503_while_a_replica_without_cluster_drains(bridge: Any) -> None:
    config = {"servers": {"demo": demo()}, "limits": {"drain_timeout": "10s"}}
    async with bridge(config) as b, aiohttp.ClientSession() as http:
        async with asyncio.timeout(10):
            while True:  # until its server is up
                async with http.get(f"{b.base}/readyz") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.02)
        running = asyncio.create_task(_call_over_sse(b))
        await in_flight(b)
        mark = len(b.events)
        b.proc.send_signal(signal.SIGTERM)
        await b.wait_for("draining", start=mark)
        async with http.get(f"{b.base}/readyz") as resp:
            body = await resp.json()
            assert resp.status == 503 and body["status"] == "not ready" and "draining" in body["servers"]["drain"], body
        assert await running == "done"


async def _call_over_sse(b: Bridge) -> str:
    async with connect(b.url("demo", "sse")) as client:
        return text_of(await client.session.call_tool("countdown", {"steps": 10, "interval_ms": 100}))


# ------------------------------------------------------------------ stopping servers

DEAF_AND_STUBBORN = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
sys.stdin.read()  # its input ends: it goes on anyway
time.sleep(3600)
"""


async def test_a_server_that_ignores_its_input_ending_and_sigterm_is_stopped_within_shutdown_timeout() -> None:
    lines: list[bytes] = []
    ready = asyncio.Event()

    def on_line(line: bytes) -> None:
        lines.append(line)
        ready.set()

    child = Child(
        server="t", command=sys.executable, args=["-c", DEAF_AND_STUBBORN], max_line=1 << 16, input_limit=1 << 16,
        on_line=on_line, on_oversize=lambda size, head, tail: None,
    )  # fmt: skip
    await child.start()
    async with asyncio.timeout(10):
        await ready.wait()
    started = time.monotonic()
    try:
        async with asyncio.timeout(5):  # a stop that never escalates must fail here, not hang
            code = await child.stop(1.0)
    finally:
        child.signal_group(signal.SIGKILL)  # none left, whatever happened (gone already: nothing)
    took = time.monotonic() - started
    assert code == -signal.SIGKILL, code
    assert 0.9 <= took < 1.3, f"stopped in {took:.2f}s; shutdown_timeout is 1s"
    assert child.pid is not None and not pid_alive(child.pid)


async def test_a_drain_with_nothing_in_flight_stops_a_stubborn_server_within_its_shutdown_timeout(bridge: Any, tmp_path: Path) -> None:
    """The bound an orchestrator's grace period needs: drain (nothing in flight: no time) plus
    the server's shutdown_timeout, whatever the server does; no process is left."""
    script = tmp_path / "stubborn.py"
    script.write_text(DEAF_AND_STUBBORN.replace('print("ready", flush=True)', "") + "\n")
    server = {"command": PY, "args": ["-m", "bridge.demo_server"], "shutdown_timeout": "2s"}
    stubborn = {"command": PY, "args": [str(script)], "shutdown_timeout": "2s", "era": "legacy"}
    config = {"servers": {"demo": server, "stubborn": stubborn}, "limits": {"drain_timeout": "30s"}}
    async with bridge(config) as b:
        await b.wait_for("server_started", where=lambda e: e["server"] == "stubborn")
        started = b.server_pids()
        signalled = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        await exited_within(b, 2.0 + 0.8, signalled)
        escalated = b.named("server_stop_escalated")
        assert [(e["signal"], e["after_s"]) for e in escalated] == [("SIGTERM", 1.0), ("SIGKILL", 2.0)], escalated
        assert len(started) == 2 and not any(pid_alive(pid) for pid in started)
