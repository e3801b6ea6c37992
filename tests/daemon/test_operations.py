"""Running it in production: metrics, logs, health, SIGHUP reload and SIGTERM drain.

Real daemon (the `bridge` fixture), real server processes (tests/servers/faulty.py),
real sockets on loopback, real signals. Every wait is on a log event, a message,
a process exit or a bounded poll of an HTTP endpoint, each under a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.daemon import PY, ROOT, Bridge, demo, faulty, pid_alive
from support.metrics import Samples, http_get, scrape, scrape_until
from support.rawclient import RawSse, call

# Levels an operator sees at the default logging.level (info); the tests run the daemon at debug.
LOGGED = ("info", "warning", "error", "critical")
FAST_RESTART = {"backoff_initial": "0.05s", "backoff_max": "1s", "max_restarts": 5, "window": "30s"}
# Crash loops at the third exit and then stays down for a minute: stable for the whole test.
LOOPING = {"backoff_initial": "0.05s", "backoff_max": "60s", "max_restarts": 2, "window": "60s"}
EVIL_ORIGIN = "http://evil.example"


# ------------------------------------------------------------------------ helpers


class Client(RawSse):
    """A RawSse that counts the bytes of the message bodies it posts (accepted ones)
    and of the `message` events it receives: what mcp_bridge_bytes_total must add up to."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.sent_bytes = 0
        self.received_bytes = 0

    async def post(self, message: Any, *, raw: bytes | None = None, headers: Any = None) -> tuple[int, str]:
        body = raw if raw is not None else json.dumps(message).encode()
        status, text = await super().post(message, raw=body, headers=headers)
        if status == 202:
            self.sent_bytes += len(body)
        return status, text

    def _dispatch(self, event: str, data: str) -> None:
        if event != "endpoint":
            self.received_bytes += len(data.encode())
        super()._dispatch(event, data)


def stderr_note(prefix: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("line", "").startswith(f"faulty: {prefix}")


def text_of(reply: dict[str, Any]) -> str:
    assert "result" in reply, reply
    return reply["result"]["content"][0]["text"]


def tool_call(name: str, args: dict[str, Any] | None = None, request_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call(name, args)}


async def tool(c: RawSse, name: str, args: dict[str, Any] | None = None, request_id: Any = 1, timeout: float = 10.0) -> dict[str, Any]:
    status, body = await c.post(tool_call(name, args, request_id))
    assert status == 202, (status, body)
    return await c.response(request_id, timeout=timeout)


async def send_call(c: RawSse, name: str, args: dict[str, Any] | None = None, request_id: Any = 1) -> None:
    status, body = await c.post(tool_call(name, args, request_id))
    assert status == 202, (status, body)


async def server_pid(c: RawSse, request_id: Any = "pid") -> int:
    return int(text_of(await tool(c, "pid", request_id=request_id)))




async def get_json(b: Bridge, path: str) -> tuple[int, Any]:
    status, text = await http_get(b.base + path)
    return status, json.loads(text)








def rewrite_config(b: Bridge, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Edit the YAML file the daemon runs (keeping its listen section) for a SIGHUP."""
    config = yaml.safe_load(b.config_path.read_text())
    change(config)
    b.config_path.write_text(yaml.safe_dump(config))
    return config


async def reload(b: Bridge, change: Callable[[dict[str, Any]], None], outcome: str = "config_reloaded") -> dict[str, Any]:
    rewrite_config(b, change)
    mark = len(b.events)
    b.proc.send_signal(signal.SIGHUP)
    return await b.wait_for(outcome, start=mark, timeout=15)


# ------------------------------------------------------------------------ metrics


async def test_metrics_move_with_traffic(bridge: Any) -> None:
    config = {
        "servers": {
            "f": {**faulty(), "restart": FAST_RESTART},
            "loop": {**faulty(FAULTY_CRASH_ON_START="1"), "restart": LOOPING},
            "lim": {**faulty(), "max_sessions": 1},
        },
        # Small enough that a batch of pings overflows it, large enough for one reply at a time.
        "limits": {"session_queue": 4},
    }
    async with bridge(config) as b:
        await b.wait_for("server_crash_loop", where=lambda e: e.get("server") == "loop")

        # Refused before any session exists: wrong Origin, wrong Host.
        status, _ = await http_get(b.url("f"), headers={"Origin": EVIL_ORIGIN})
        assert status == 403
        status, _ = await http_get(b.url("f"), headers={"Host": "attacker.example"})
        assert status == 403

        async with Client(b.url("f")) as a, Client(b.url("f")) as h:
            await a.initialize()
            await h.initialize()
            assert text_of(await tool(a, "echo", {"text": "one"}, request_id=1)) == "one"
            error = await tool(a, "no-such-tool", request_id=2)  # the server answers with an error
            assert error["error"]["code"] == -32602, error
            vendor = await a.request("vendor/x", {}, request_id=3)  # an unknown method: label `other`
            assert vendor["error"]["code"] == -32601, vendor
            assert await a.request("ping", request_id=4) == {"jsonrpc": "2.0", "id": 4, "result": {}}
            # A crash: the call fails, the process restarts, the next call is served by the new one.
            mark = len(b.events)
            crashed = await tool(a, "crash", request_id=5)
            assert crashed["error"]["code"] == -32000, crashed
            await b.wait_for("server_started", where=lambda e: e["server"] == "f", start=mark)
            assert text_of(await tool(a, "echo", {"text": "two"}, request_id=6)) == "two"

            # A call held in flight by the server.
            mark = len(b.events)
            await send_call(h, "hang", request_id="h")
            await b.wait_for("server_stderr", where=stderr_note("hang "), start=mark)
            during = await scrape(b)
            assert during.get("mcp_bridge_requests_in_flight", server="f") == 1
            assert during.get("mcp_bridge_sessions_open", server="f", transport="sse") == 2
            hang_session = h.session_id
            await h.close()
            await b.wait_for("session_closed", where=lambda e: e.get("session") == hang_session)

            # `lim` takes one session: the second is refused; then the first floods its queue.
            async with Client(b.url("lim")) as s:
                async with RawSse(b.url("lim")) as refused:
                    assert refused.status == 503
                pings = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(12)]
                status, _ = await s.post(pings)
                assert status == 202
                await b.wait_for("session_closed", where=lambda e: e.get("session") == s.session_id)
                await s.expect_end()
                lim_sent = s.sent_bytes

            m = await scrape(b)
            f_bytes_in = a.sent_bytes + h.sent_bytes
            f_bytes_out = a.received_bytes + h.received_bytes

        # Sessions.
        assert m.count("mcp_bridge_sessions_opened_total", server="f", transport="sse") == 2
        assert m.get("mcp_bridge_sessions_open", server="f", transport="sse") == 1
        assert m.count("mcp_bridge_sessions_opened_total", server="lim", transport="sse") == 1
        assert m.count("mcp_bridge_sessions_opened_total", server="loop", transport="sse") == 0
        # Requests in flight: the hang was cancelled with its session.
        assert m.get("mcp_bridge_requests_in_flight", server="f") == 0
        # Messages by direction and (bounded) method.
        client = {
            "initialize": 2,
            "notifications/initialized": 2,
            "tools/call": 5,  # echo, no-such-tool, crash, echo, hang
            "ping": 1,
            "other": 1,  # vendor/x
        }
        for method, expected in client.items():
            got = m.count("mcp_bridge_messages_total", server="f", direction="from_client", method=method)
            assert got == expected, (method, got, expected)
        # Responses from the server: the bridge's own server/discover and initialize (twice each:
        # start and restart), echo, the tool error, vendor/x, echo again. Crash and hang never
        # answered; ping was the bridge's.
        assert m.count("mcp_bridge_messages_total", server="f", direction="from_server", method="response") == 8
        f_series = {
            (dict(labels)["direction"], dict(labels)["method"]): v
            for (name, labels), v in m.values.items()
            if name == "mcp_bridge_messages_total" and dict(labels)["server"] == "f"
        }
        expected_series = {("from_client", k): float(v) for k, v in client.items()} | {("from_server", "response"): 8.0}
        assert f_series == expected_series, f_series
        assert "vendor/x" not in m.label_values("method")
        assert m.count("mcp_bridge_messages_total", server="lim", direction="from_client", method="ping") == 12
        # Request durations: one observation per answered tools/call (error and crash included).
        assert m.get("mcp_bridge_request_duration_seconds_count", server="f", method="tools/call") == 4
        assert m.get("mcp_bridge_request_duration_seconds_count", server="f", method="other") == 1
        assert m.get("mcp_bridge_request_duration_seconds_bucket", server="f", method="tools/call", le="+Inf") == 4
        # Processes.
        assert m.get("mcp_bridge_server_up", server="f") == 1
        assert m.get("mcp_bridge_server_up", server="lim") == 1
        assert m.get("mcp_bridge_server_up", server="loop") == 0
        assert m.count("mcp_bridge_server_restarts_total", server="f") == 1
        assert m.count("mcp_bridge_server_restarts_total", server="lim") == 0
        assert m.count("mcp_bridge_server_restarts_total", server="loop") == 3
        assert m.get("mcp_bridge_server_crash_looping", server="f") == 0
        assert m.get("mcp_bridge_server_crash_looping", server="loop") == 1
        # Drops by reason: a client closing its stream is not a drop.
        assert m.count("mcp_bridge_sessions_dropped_total", server="lim", reason="limit") == 1
        assert m.count("mcp_bridge_sessions_dropped_total", server="lim", reason="slow") == 1
        assert not [k for k in m.values if k[0] == "mcp_bridge_sessions_dropped_total" and ("server", "f") in k[1]]
        # Error responses sent to clients, by code: the server's (-32602, -32601) and the bridge's (-32000).
        errors = {
            dict(labels)["code"]: v
            for (name, labels), v in m.values.items()
            if name == "mcp_bridge_errors_total" and dict(labels)["server"] == "f"
        }
        assert errors == {"-32602": 1, "-32601": 1, "-32000": 1}, errors
        # Rejections by reason.
        assert m.count("mcp_bridge_rejections_total", reason="origin") == 1
        assert m.count("mcp_bridge_rejections_total", reason="host") == 1
        # Bytes: exactly what went over the wire as message bodies.
        assert m.count("mcp_bridge_bytes_total", server="f", direction="from_client") == f_bytes_in
        assert m.count("mcp_bridge_bytes_total", server="f", direction="to_client") == f_bytes_out
        assert m.count("mcp_bridge_bytes_total", server="lim", direction="from_client") == lim_sent



async def test_sessions_open_gauge_returns_to_zero(bridge: Any) -> None:
    """A gauge reads 0 when nothing is open; a series that vanishes reads as 'no data' to
    dashboards and alerts (and `rate`/`delta` over it break)."""
    async with bridge({"servers": {"f": faulty()}}) as b:
        async with RawSse(b.url("f")) as c:
            await c.initialize()
            m = await scrape(b)
            assert m.get("mcp_bridge_sessions_open", server="f", transport="sse") == 1
            session = c.session_id
        await b.wait_for("session_closed", where=lambda e: e.get("session") == session)
        m = await scrape_until(b, lambda s: s.get("mcp_bridge_sessions_open", server="f", transport="sse") == 0)
        assert m.get("mcp_bridge_sessions_open", server="f", transport="sse") == 0, [
            line for line in m.text.splitlines() if "sessions_open" in line
        ]
        assert m.count("mcp_bridge_sessions_opened_total", server="f", transport="sse") == 1


async def test_metrics_disabled(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}, "metrics": {"enabled": False}}) as b:
        status, _ = await http_get(b.base + "/metrics")
        assert status == 404
        status, _ = await http_get(b.base + "/healthz")
        assert status == 200


async def test_metrics_custom_path(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}, "metrics": {"path": "/ops/prom"}}) as b:
        status, _ = await http_get(b.base + "/metrics")
        assert status == 404
        m = await scrape(b, "/ops/prom")
        assert m.get("mcp_bridge_requests_in_flight", server="f") == 0
        assert m.get("mcp_bridge_server_crash_looping", server="f") == 0


# --------------------------------------------------------------------------- logs


async def test_log_lines(bridge: Any) -> None:
    marker = f"payload-marker-{uuid.uuid4().hex}"
    async with bridge({"servers": {"f": {**faulty(), "restart": FAST_RESTART}}}) as b:
        async with RawSse(b.url("f")) as c:
            await c.initialize()
            first = await server_pid(c)
            assert text_of(await tool(c, "echo", {"text": marker}, request_id="m")) == marker
            status, _ = await c.post(tool_call("echo", {"text": marker}, "o"), headers={"Origin": EVIL_ORIGIN})
            assert status == 403
            mark = len(b.events)
            assert (await tool(c, "crash", request_id="c"))["error"]["code"] == -32000
            second = (await b.wait_for("server_started", start=mark))["pid"]
            assert await server_pid(c, "pid2") == second != first
            session = c.session_id
        await b.wait_for("session_closed", where=lambda e: e.get("session") == session)
    events = b.events  # complete: the fixture stopped the daemon and read stderr to its end

    assert not b.named("unparsed"), b.named("unparsed")[:3]
    for e in events:
        assert isinstance(e.get("event"), str) and e["event"], e
        assert e.get("level") in ("debug", *LOGGED), e
        assert datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")), e

    opened = b.named("session_opened")
    closed = b.named("session_closed")
    assert [(e["server"], e["session"], e["transport"]) for e in opened] == [("f", session, "sse")]
    assert [(e["server"], e["session"], e["reason"]) for e in closed] == [("f", session, "client disconnected")]
    assert isinstance(closed[0]["duration_s"], int | float)

    started = b.named("server_started")
    assert [(e["server"], e["pid"]) for e in started] == [("f", first), ("f", second)]
    exited = b.named("server_exited")
    assert len(exited) == 1, exited
    assert exited[0]["server"] == "f" and exited[0]["pid"] == first and exited[0]["exit_code"] == 3
    assert 0 < exited[0]["restart_in_s"] <= 1.2, exited[0]  # backoff_initial 0.05s with jitter, capped at 1s
    stopped = b.named("server_stopped")
    assert [(e["server"], e["pid"]) for e in stopped] == [("f", second)]
    assert "exit_code" in stopped[0]

    inits = [e for e in b.named("server_stderr") if stderr_note("initialize ")(e)]
    assert {e["pid"] for e in inits} == {first, second}
    assert all(e["server"] == "f" for e in b.named("server_stderr"))

    rejected = b.named("request_rejected")
    assert len(rejected) == 1 and rejected[0]["level"] in LOGGED, rejected
    assert rejected[0]["status"] == 403 and "origin" in rejected[0]["reason"]

    # Payloads never appear where an operator's log (level info and up) would show them.
    leaks = [e for e in events if e["level"] in LOGGED and marker in json.dumps(e)]
    assert not leaks, leaks


async def test_slow_session_logged_once(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}, "limits": {"session_queue": 4}}) as b:
        async with RawSse(b.url("f")) as c:
            # Twelve replies in one go into a queue of four: the session is dropped as too slow.
            status, _ = await c.post([{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(12)])
            assert status == 202
            closed = await b.wait_for("session_closed", where=lambda e: e.get("session") == c.session_id)
            await c.expect_end()
        assert closed["reason"] == "slow" and closed["server"] == "f", closed
        slow = b.named("session_too_slow")
        assert [(e["server"], e["session"]) for e in slow] == [("f", c.session_id)], slow
        assert all(e["level"] in LOGGED for e in slow)


@pytest.mark.parametrize("transport", ["sse", "streamable"])
async def test_slow_session_by_bytes(bridge: Any, transport: str) -> None:
    """A client that stops reading is dropped once `session_queue_bytes` of its messages are
    waiting, long before `session_queue` of them are (an HTTP+SSE stream, and the standalone
    stream of a Streamable session with its reader attached)."""
    limits = {"session_queue": 1024, "session_queue_bytes": "1MiB", "max_message_bytes": "1MiB"}
    async with bridge({"servers": {"f": faulty()}, "limits": limits}) as b:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read
        sock.setblocking(False)
        poster_reader, poster = await asyncio.open_connection("127.0.0.1", b.port)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", b.port))
            mark = len(b.events)
            if transport == "sse":
                await loop.sock_sendall(sock, raw_request("GET", "/servers/f/sse", None))
                session = (await b.wait_for("session_opened", start=mark))["session"]
                target, headers = f"/servers/f/messages?session_id={session}", ["Accept: application/json"]
                for message in (INIT, INITIALIZED):
                    poster.write(raw_request("POST", target, json.dumps(message).encode()))
                    assert (await raw_answer(poster_reader))[0] == 202
            else:
                session = await _streamable_session(b.port)
                target, headers = "/servers/f/mcp", [f"Mcp-Session-Id: {session}", "Accept: application/json"]
                await loop.sock_sendall(sock, raw_request("GET", target, None, *headers[:1], "Accept: text/event-stream"))
            # Each call puts 200 KiB on the stalled stream: a call's reply on HTTP+SSE, a
            # notification (to every session) on Streamable, whose call is answered here.
            pad = "x" * (200 * 1024)
            notice = json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"pad": pad}})
            arguments = {"bytes": 200 * 1024} if transport == "sse" else {"lines": [notice]}
            closed = None
            for i in range(200):  # 40 MiB at most, far fewer messages than session_queue; the kernel's buffers hold a few MiB
                body = json.dumps(tool_call("big" if transport == "sse" else "emit", arguments, i)).encode()
                poster.write(raw_request("POST", target, body, *headers))
                status, _, text = await raw_answer(poster_reader)
                if status in (404, 503):  # the session is gone, or went while the call ran
                    break
                assert status in (200, 202), text
                if closed := [e for e in b.events[mark:] if e.get("event") == "session_closed" and e["session"] == session]:
                    break
            closed = closed or [await b.wait_for("session_closed", where=lambda e: e.get("session") == session, start=mark)]
            assert closed[0]["reason"] == "slow", closed
            assert i < 199 or transport == "sse", f"dropped only after {i} calls"  # an SSE POST is answered before its call
            slow = [e for e in b.named("session_too_slow") if e["session"] == session]
            assert len(slow) == 1 and slow[0]["queue_bytes"] == 1024 * 1024, slow
        finally:
            sock.close()
            poster.close()


async def test_console_log_format(tmp_path: Path) -> None:
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump({"listen": {"host": "127.0.0.1", "port": 0}, "servers": {"f": faulty()}}))
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "bridge", "--config", str(path), "--log-format", "console",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(20):
            while True:
                raw = await proc.stderr.readline()
                assert raw, f"daemon exited before listening: {lines}"
                lines.append(raw.decode(errors="replace").rstrip("\n"))
                if "listening" in lines[-1]:
                    break
        port = int(re.search(r"\bport=(\d+)", lines[-1]).group(1))  # type: ignore[union-attr]
        assert (await http_get(f"http://127.0.0.1:{port}/healthz"))[0] == 200
        # aiohttp's own records come out in the same format: a malformed request is one line.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/9.Z\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.0 400")
        writer.close()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            _, rest = await proc.communicate()
        lines += (rest or b"").decode(errors="replace").splitlines()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, lines
    text = [line for line in lines if line.strip()]
    for line in text:
        with pytest.raises(ValueError):
            json.loads(line)
    # Human lines: level and event name readable, key=value fields.
    assert any(re.search(r"\binfo\b.*\blistening\b.*\bport=\d+", line) for line in text), text
    assert any("server_started" in line and "pid=" in line for line in text), text
    assert any("stopped" in line for line in text), text
    assert any(re.search(r"\bwarning\b.*\bbad_request\b.*\breason=", line) for line in text), text
    assert not any("Traceback" in line or "Error handling request" in line for line in text), text


# ------------------------------------------------------------------------- health


async def test_ready_when_every_server_can_serve(bridge: Any) -> None:
    config = {"servers": {"ok": faulty(), "per": {**faulty(), "mode": "per-session"}}}
    async with bridge(config) as b, RawSse(b.url("ok")) as c:
        await c.initialize()
        assert text_of(await tool(c, "echo", {"text": "up"})) == "up"  # served: the server is ready
        status, body = await get_json(b, "/readyz")
        assert status == 200, body
        status, body = await get_json(b, "/healthz")
        assert status == 200, body


async def test_readyz_names_crash_looping_server(bridge: Any) -> None:
    config = {"servers": {"ok": faulty(), "bad": {**faulty(FAULTY_CRASH_ON_START="1"), "restart": LOOPING}}}
    async with bridge(config) as b:
        loop = await b.wait_for("server_crash_loop", where=lambda e: e.get("server") == "bad")
        # What the server said last before each exit, in the events and in /status.
        last_words = ["faulty: crashing on start as requested"]
        assert loop["stderr_tail"] == last_words, loop
        assert all(e["stderr_tail"] == last_words for e in b.named("server_exited") if e["server"] == "bad")
        async with RawSse(b.url("ok")) as c:  # served: `ok` is ready
            await c.initialize()
            assert text_of(await tool(c, "echo", {"text": "up"})) == "up"
        status, body = await get_json(b, "/readyz")
        assert status == 503, body
        assert set(body["servers"]) == {"bad"}, body
        assert "crash loop" in body["servers"]["bad"], body
        status, _ = await get_json(b, "/healthz")
        assert status == 200

        _, st = await get_json(b, "/status")
        bad = st["servers"]["bad"]
        assert bad["mode"] == "shared" and bad["ready"] is False and bad["sessions"] == 0
        [proc] = bad["processes"]
        assert proc["state"] == "failed" and proc["pid"] is None, proc
        assert proc["restarts"] == 3 and proc["last_exit_code"] == 4, proc
        assert "crash loop" in proc["failure"], proc
        assert proc["stderr_tail"] == last_words and proc["rss_bytes"] is None and proc["cpu_seconds"] is None, proc
        assert st["servers"]["ok"]["ready"] is True


async def test_readyz_names_a_per_session_server_whose_command_is_missing(bridge: Any) -> None:
    """A per-session server has no process until a session comes: /readyz still says now
    that none could start, rather than each session finding out."""
    missing = "/nonexistent/mcp-server-for-readyz"
    config = {"servers": {"ok": faulty(), "gone": {"command": missing, "mode": "per-session"}}}
    async with bridge(config) as b, RawSse(b.url("ok")) as c:
        await c.initialize()
        assert text_of(await tool(c, "echo", {"text": "up"})) == "up"  # served: `ok` is ready
        status, body = await get_json(b, "/readyz")
        assert status == 503, body
        assert body["servers"] == {"gone": f"command {missing!r} not found"}, body


async def test_status_shared_and_per_session(bridge: Any) -> None:
    config = {
        "servers": {
            "s": {**faulty(), "restart": FAST_RESTART},
            "p": {**faulty(), "mode": "per-session", "restart": FAST_RESTART},
        }
    }
    async with bridge(config) as b:
        async with RawSse(b.url("s")) as cs, RawSse(b.url("p")) as p1, RawSse(b.url("p")) as p2:
            for c in (cs, p1, p2):
                await c.initialize()
            spid, ppid1, ppid2 = await server_pid(cs), await server_pid(p1), await server_pid(p2)
            mark = len(b.events)
            await send_call(cs, "hang", request_id="h")
            await send_call(p1, "hang", request_id="h")
            for pid in (spid, ppid1):
                await b.wait_for("server_stderr", where=lambda e, p=pid: e["pid"] == p and stderr_note("hang ")(e), start=mark)

            status, st = await get_json(b, "/status")
            assert status == 200
            s, p = st["servers"]["s"], st["servers"]["p"]
            assert (s["mode"], s["ready"], s["sessions"], s["in_flight"]) == ("shared", True, 1, 1), s
            [sproc] = s["processes"]
            assert (sproc["pid"], sproc["state"], sproc["restarts"], sproc["last_exit_code"]) == (spid, "running", 0, None)
            assert sproc["in_flight"] == 1 and 0 <= sproc["uptime_s"] < 120, sproc
            assert (p["mode"], p["sessions"], p["in_flight"]) == ("per-session", 2, 1), p
            assert sorted(q["pid"] for q in p["processes"]) == sorted([ppid1, ppid2]), p
            for q in p["processes"]:
                assert q["state"] == "running" and q["restarts"] == 0 and q["last_exit_code"] is None, q
                assert 0 <= q["uptime_s"] < 120 and q["in_flight"] == (1 if q["pid"] == ppid1 else 0), q
            # Each process's memory and CPU, as /proc tells the test (statm: resident pages).
            for q in [sproc, *p["processes"]]:
                resident = int(Path(f"/proc/{q['pid']}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                assert 0.5 * resident <= q["rss_bytes"] <= 2 * resident, (q, resident)
                assert isinstance(q["cpu_seconds"], float) and 0 <= q["cpu_seconds"] < 60, q
                assert any(line.startswith("faulty: initialize ") for line in q["stderr_tail"]), q

            # A crash in each: restarts and last exit code show up, with the new pids.
            mark = len(b.events)
            assert (await tool(cs, "crash", request_id="c"))["error"]["code"] == -32000
            assert (await tool(p1, "crash", request_id="c"))["error"]["code"] == -32000
            assert (await cs.response("h"))["error"]["code"] == -32000
            assert (await p1.response("h"))["error"]["code"] == -32000
            new_spid, new_ppid1 = await server_pid(cs, "again"), await server_pid(p1, "again")
            assert new_spid != spid and new_ppid1 != ppid1
            _, st = await get_json(b, "/status")
            s, p = st["servers"]["s"], st["servers"]["p"]
            assert (s["sessions"], s["in_flight"]) == (1, 0), s
            [sproc] = s["processes"]
            assert (sproc["pid"], sproc["state"], sproc["restarts"], sproc["last_exit_code"]) == (new_spid, "running", 1, 3)
            by_pid = {q["pid"]: q for q in p["processes"]}
            assert set(by_pid) == {new_ppid1, ppid2}, p
            assert (by_pid[new_ppid1]["restarts"], by_pid[new_ppid1]["last_exit_code"]) == (1, 3)
            assert (by_pid[ppid2]["restarts"], by_pid[ppid2]["last_exit_code"]) == (0, None)
            assert p["in_flight"] == 0 and p["sessions"] == 2


# ------------------------------------------------------------------------- reload


async def test_reload_add_remove_change_keep(bridge: Any) -> None:
    config = {
        "servers": {
            "keep": faulty(),
            "gone": faulty(),
            "change": faulty(MARK="one"),
        }
    }
    async with bridge(config) as b:
        async with RawSse(b.url("keep")) as ck, RawSse(b.url("gone")) as cg, RawSse(b.url("change")) as cc:
            for c in (ck, cg, cc):
                await c.initialize()
            keep_pid, gone_pid, change_pid = await server_pid(ck), await server_pid(cg), await server_pid(cc)
            assert text_of(await tool(cc, "env", {"name": "MARK"}, request_id="env")) == "one"
            # A call in flight on the unchanged server across the reload.
            mark = len(b.events)
            await send_call(ck, "slow", {"ms": 1500}, request_id="slow")
            await b.wait_for("server_stderr", where=lambda e: e["pid"] == keep_pid and stderr_note("slow ")(e), start=mark)

            mark = len(b.events)

            def change(cfg: dict[str, Any]) -> None:
                del cfg["servers"]["gone"]
                cfg["servers"]["change"]["env"]["MARK"] = "two"
                cfg["servers"]["new"] = faulty()

            reloaded = await reload(b, change)
            assert reloaded["added"] == ["new"] and reloaded["removed"] == ["gone"], reloaded
            assert reloaded["restarted"] == ["change"] and reloaded["unchanged"] == 1, reloaded
            assert not [e for e in b.events[mark:] if e.get("event") == "reload_needs_restart"]

            # Removed: its session ends cleanly, its process stops, the URL is gone.
            assert await cg.expect_end(timeout=10) == []
            closed = await b.wait_for("session_closed", where=lambda e: e.get("session") == cg.session_id, start=mark)
            assert closed["server"] == "gone" and closed["reason"] == "server_gone", closed
            await b.wait_for("server_stopped", where=lambda e: e["pid"] == gone_pid, start=mark)
            assert not pid_alive(gone_pid)
            assert (await http_get(b.url("gone")))[0] == 404

            # Changed: a new process with the new settings; the old one stopped.
            await b.wait_for("server_stopped", where=lambda e: e["pid"] == change_pid, start=mark)
            assert not pid_alive(change_pid)
            async with RawSse(b.url("change")) as cc2:
                await cc2.initialize()
                assert text_of(await tool(cc2, "env", {"name": "MARK"}, request_id="env")) == "two"
                new_change_pid = await server_pid(cc2)
                assert new_change_pid != change_pid and pid_alive(new_change_pid)

            # Added: starts and serves.
            async with RawSse(b.url("new")) as cn:
                await cn.initialize()
                assert text_of(await tool(cn, "echo", {"text": "hello"})) == "hello"

            # Unchanged: same process, its session and the call in flight untouched.
            assert text_of(await ck.response("slow", timeout=10)) == "slept"
            assert await server_pid(ck, "pid2") == keep_pid
            assert text_of(await tool(ck, "echo", {"text": "still"}, request_id="e")) == "still"
            assert [e["pid"] for e in b.named("server_started") if e["server"] == "keep"] == [keep_pid]
            assert not [e for e in b.events if e.get("event") in ("server_stopped", "server_exited") and e.get("pid") == keep_pid]
            assert not [e for e in b.events if e.get("event") == "session_closed" and e.get("session") == ck.session_id]

            m = await scrape(b)
            assert m.count("mcp_bridge_sessions_dropped_total", server="gone", reason="server_gone") == 1
            assert m.get("mcp_bridge_sessions_open", server="keep", transport="sse") == 1
            assert m.get("mcp_bridge_server_up", server="new") == 1
            assert m.get("mcp_bridge_server_up", server="gone") is None  # no longer reported


async def test_reload_invalid_config_changes_nothing(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}, "limits": {"max_inflight": 8}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        pid = await server_pid(c)

        def break_it(cfg: dict[str, Any]) -> None:
            cfg["servers"]["f"]["mode"] = "sometimes"
            cfg["servers"]["g"] = {"args": ["x"]}  # no command
            cfg["limits"]["request_timeout"] = "soon"
            cfg["limits"]["max_inflight"] = 1
            cfg["limits"]["max_sesions"] = 3

        mark = len(b.events)
        rejected = await reload(b, break_it, outcome="reload_rejected")
        assert rejected["level"] == "error", rejected
        problems = "\n".join(rejected["problems"])
        for key in ("servers.f.mode", "servers.g.command", "limits.request_timeout", "limits.max_sesions"):
            assert key in problems, (key, rejected["problems"])
        assert len(rejected["problems"]) >= 4, rejected
        assert not [e for e in b.events[mark:] if e.get("event") in ("config_reloaded", "server_started", "server_stopped")]

        # Nothing changed: same process, same session, old limits, no new server.
        assert await server_pid(c, "pid2") == pid
        await send_call(c, "hang", request_id="h1")
        assert text_of(await tool(c, "echo", {"text": "fine"}, request_id="e")) == "fine"  # max_inflight still 8
        assert (await http_get(b.url("g")))[0] == 404
        _, st = await get_json(b, "/status")
        assert set(st["servers"]) == {"f"}
        assert st["servers"]["f"]["processes"][0]["pid"] == pid


async def test_reload_listen_change_needs_restart(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        pid = await server_pid(c)
        mark = len(b.events)

        def move(cfg: dict[str, Any]) -> None:
            cfg["listen"]["port"] = b.port + 1 if b.port < 65535 else b.port - 1

        rewrite_config(b, move)
        b.proc.send_signal(signal.SIGHUP)
        needs = await b.wait_for("reload_needs_restart", start=mark, timeout=15)
        assert needs["key"] == "listen" and needs["level"] in LOGGED, needs
        await b.wait_for("config_reloaded", start=mark, timeout=15)
        # Still serving where it was, with the same process and session.
        assert (await http_get(b.base + "/healthz"))[0] == 200
        assert await server_pid(c, "pid2") == pid
        assert text_of(await tool(c, "echo", {"text": "same port"}, request_id="e")) == "same port"


TIGHT = {"max_inflight": 1, "request_timeout": "60s", "max_message_bytes": "16KiB", "max_sessions": 1}
LOOSE = {"max_inflight": 4, "request_timeout": "1s", "max_message_bytes": "64KiB", "max_sessions": 2}


async def _loosen_limits(b: Bridge) -> None:
    """Reload TIGHT -> LOOSE; the server must not restart for it."""
    mark = len(b.events)
    reloaded = await reload(b, lambda cfg: cfg.__setitem__("limits", dict(LOOSE)))
    assert reloaded["restarted"] == [] and reloaded["unchanged"] == 1, reloaded
    assert not [e for e in b.events[mark:] if e.get("event") in ("server_started", "server_stopped")]


async def test_reload_limits_inflight_and_sessions(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}, "limits": TIGHT}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        pid = await server_pid(c)
        mark = len(b.events)
        await send_call(c, "hang", request_id="h1")
        await b.wait_for("server_stderr", where=stderr_note("hang "), start=mark)
        limited = await tool(c, "echo", {"text": "x"}, request_id="e1")
        assert limited["error"]["code"] == -32004, limited  # max_inflight 1
        async with RawSse(b.url("f")) as second:
            assert second.status == 503  # max_sessions 1

        await _loosen_limits(b)
        # The same session, under the new limits, with the old call still in flight.
        assert text_of(await tool(c, "echo", {"text": "x"}, request_id="e2")) == "x"  # max_inflight 4
        assert await server_pid(c, "pid2") == pid
        async with RawSse(b.url("f")) as second:  # max_sessions 2
            assert second.status == 200
            await second.initialize()
            assert text_of(await tool(second, "echo", {"text": "y"})) == "y"


async def test_reload_request_timeout_applies(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}, "limits": TIGHT}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        await _loosen_limits(b)
        started = time.monotonic()
        await send_call(c, "hang", request_id="h")
        try:
            timed_out = await c.response("h", timeout=5)
        except TimeoutError:
            pytest.fail("no answer within 5s: the reloaded request_timeout (1s) did not apply (60s did)")
        assert timed_out["error"]["code"] == -32001, timed_out
        assert time.monotonic() - started < 5


async def test_reload_max_message_bytes_applies(bridge: Any) -> None:
    big = "y" * 20_000  # between the old (16KiB) and the new (64KiB) limit
    async with bridge({"servers": {"f": faulty()}, "limits": TIGHT}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        status, _ = await c.post(tool_call("echo", {"text": big}, "big1"))
        assert status == 413
        await _loosen_limits(b)
        status, body = await c.post(tool_call("echo", {"text": big}, "big2"))
        assert status == 202, (status, body)
        assert text_of(await c.response("big2")) == big


# -------------------------------------------------------------------------- drain


async def test_sigterm_drains_call_in_flight(bridge: Any) -> None:
    config = {"servers": {"f": faulty()}, "limits": {"drain_timeout": "5s"}}
    async with bridge(config) as b:
        async with RawSse(b.url("f")) as c:
            await c.initialize()
            pid = await server_pid(c)
            mark = len(b.events)
            await send_call(c, "slow", {"ms": 1500}, request_id="slow")
            await b.wait_for("server_stderr", where=stderr_note("slow "), start=mark)

            b.proc.send_signal(signal.SIGTERM)
            draining = await b.wait_for("draining", start=mark)
            assert draining["in_flight"] == 1, draining
            # New sessions are refused while it drains.
            async with RawSse(b.url("f")) as late:
                assert late.status == 503
            assert c._inbox.empty() and not c._held, "the call was answered before the drain could wait for it"
            # The call in flight finishes with its real result, then the stream ends.
            assert text_of(await c.response("slow", timeout=10)) == "slept"
            assert await c.expect_end(timeout=10) == []
            code = await b.stop()
            assert code == 0
        assert not b.named("drain_timeout")
        assert not pid_alive(pid)
        assert [e["pid"] for e in b.named("server_stopped")] == [pid]


async def test_sigterm_drain_timeout_fails_hung_call(bridge: Any) -> None:
    config = {"servers": {"f": faulty()}, "limits": {"drain_timeout": "1s"}}
    async with bridge(config) as b:
        async with RawSse(b.url("f")) as c:
            await c.initialize()
            pid = await server_pid(c)
            mark = len(b.events)
            await send_call(c, "hang", request_id="h")
            await b.wait_for("server_stderr", where=stderr_note("hang "), start=mark)

            signalled = time.monotonic()
            b.proc.send_signal(signal.SIGTERM)
            reply = await c.response("h", timeout=10)  # before the stream ends, or this raises
            waited = time.monotonic() - signalled
            assert "result" not in reply and reply["error"]["code"] == -32003, reply
            assert waited >= 0.9, f"the call was failed after {waited:.2f}s, before drain_timeout (1s)"
            assert await c.expect_end(timeout=10) == []
            code = await b.stop()
            assert code == 0
        timeout = b.named("drain_timeout")
        assert len(timeout) == 1 and timeout[0]["in_flight"] == 1, timeout
        assert not pid_alive(pid)
        assert [e["pid"] for e in b.named("server_stopped")] == [pid]



async def test_repeated_sigterm_still_exits_cleanly(bridge: Any) -> None:
    """An orchestrator may signal again while the daemon finishes: once stopping has begun,
    no SIGTERM, however late in the exit, may turn the clean stop into a kill."""
    async with bridge({"servers": {"demo": demo()}}) as b:
        # Through a pidfd: Popen.send_signal polls (waitpid) first, which races asyncio's
        # child watcher for the exit status and can leave it reporting 255.
        pidfd = os.pidfd_open(b.proc.pid)
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            await b.wait_for("stopping")
            for _ in range(5000):  # every millisecond until it exits: at most 5 s
                if b.proc.returncode is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(b.proc.wait()), 0.001)
        finally:
            os.close(pidfd)
        assert await b.stop() == 0


# A stream's end on SIGTERM, over each transport and each HTTP path: the call still in
# flight gets its -32003 event, then the chunked body ends with its last chunk.

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def raw_request(method: str, target: str, body: bytes | None, *headers: str, chunked: bool = False) -> bytes:
    """One HTTP/1.1 request; `chunked` sends the body chunked, which the fast path leaves to aiohttp."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", *headers]
    if body is not None:
        lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    if body is None:
        return head
    return head + (b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if chunked else body)


async def raw_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """A whole response with a Content-Length body."""
    async with asyncio.timeout(10):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in head[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(head[0].split()[1]), headers, body


async def raw_stream_head(reader: asyncio.StreamReader) -> None:
    async with asyncio.timeout(10):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    assert head.startswith("http/1.1 200") and "transfer-encoding: chunked" in head, head


async def raw_stream_rest(reader: asyncio.StreamReader) -> tuple[list[dict[str, Any]], bool]:
    """The rest of a chunked SSE body: the messages it carried, and whether it ended with
    the last chunk (rather than being cut off)."""
    body, clean = b"", False
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, ValueError):
        async with asyncio.timeout(15):
            while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                body += (await reader.readexactly(size + 2))[:-2]
            clean = await reader.readexactly(2) == b"\r\n"
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")], clean


async def _streamable_session(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw_request("POST", "/servers/f/mcp", json.dumps(INIT).encode(), "Accept: application/json"))
        status, headers, body = await raw_answer(reader)
        assert status == 200, body
        session = headers["mcp-session-id"]
        writer.write(raw_request("POST", "/servers/f/mcp", json.dumps(INITIALIZED).encode(), f"Mcp-Session-Id: {session}"))
        assert (await raw_answer(reader))[0] == 202
        return session
    finally:
        writer.close()


@pytest.mark.parametrize("case", ["sse stream", "streamable post fast path", "streamable post aiohttp", "streamable get"])
async def test_sigterm_ends_every_stream_with_its_last_event(bridge: Any, case: str) -> None:
    config = {"servers": {"f": faulty()}, "limits": {"drain_timeout": "0.5s"}}
    hang = json.dumps(tool_call("hang", request_id="h")).encode()
    async with bridge(config) as b:
        stream_reader, stream_writer = await asyncio.open_connection("127.0.0.1", b.port)
        post_reader, post_writer = await asyncio.open_connection("127.0.0.1", b.port)
        mark = len(b.events)
        try:
            if case == "sse stream":
                stream_writer.write(raw_request("GET", "/servers/f/sse", None))
                await raw_stream_head(stream_reader)
                async with asyncio.timeout(10):
                    await stream_reader.readuntil(b"\r\n")  # the endpoint event's chunk size
                    endpoint = (await stream_reader.readuntil(b"\n\n")).decode()
                    await stream_reader.readexactly(2)  # the end of its chunk
                target = endpoint.split("data: ", 1)[1].strip()
                for message in (INIT, INITIALIZED, tool_call("hang", request_id="h")):
                    post_writer.write(raw_request("POST", target, json.dumps(message).encode()))
                    assert (await raw_answer(post_reader))[0] == 202
            else:
                session = f"Mcp-Session-Id: {await _streamable_session(b.port)}"
                if case == "streamable get":
                    stream_writer.write(raw_request("GET", "/servers/f/mcp", None, session, "Accept: text/event-stream"))
                    await raw_stream_head(stream_reader)
                    post_writer.write(raw_request("POST", "/servers/f/mcp", hang, session, "Accept: application/json"))
                else:
                    chunked = case == "streamable post aiohttp"
                    stream_writer.write(raw_request("POST", "/servers/f/mcp", hang, session, "Accept: text/event-stream", chunked=chunked))
                    await raw_stream_head(stream_reader)
            await b.wait_for("server_stderr", where=stderr_note("hang "), start=mark)

            signalled = time.monotonic()
            b.proc.send_signal(signal.SIGTERM)
            messages, clean = await raw_stream_rest(stream_reader)
            assert clean, f"the stream was cut off after {messages}"
            if case == "streamable get":
                assert messages == [], messages
                status, _, body = await raw_answer(post_reader)  # the call, answered as JSON
                messages = [json.loads(body)]
            errors = [m for m in messages if m.get("id") == "h"]
            assert len(errors) == 1 and errors[0]["error"]["code"] == -32003, messages
            assert await b.stop() == 0
            assert time.monotonic() - signalled < 10
        finally:
            stream_writer.close()
            post_writer.close()


async def test_refusals_at_an_mcp_endpoint_count_as_errors_sent_on_either_http_path(bridge: Any) -> None:
    """A 400 with a JSON-RPC error body is an error sent to the client, whichever path (the
    fast path, or aiohttp's for a chunked body) answered it; a refused token is a rejection."""
    async with bridge({"servers": {"f": faulty()}}) as b:
        url = b.url("f", "mcp")
        json_only = {"Accept": "application/json", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}, headers=json_only) as resp:  # fmt: skip
                assert resp.status == 200
                session = {**json_only, "Mcp-Session-Id": resp.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}

            async def chunked() -> Any:
                yield b"{x"

            for body in (b"{x", chunked()):  # the fast path; aiohttp's (a chunked body is its)
                async with http.post(url, data=body, headers=session) as resp:
                    assert resp.status == 400 and (await resp.json())["error"]["code"] == -32700
            repeated = [{"jsonrpc": "2.0", "id": 5, "method": "ping"}, {"jsonrpc": "2.0", "id": 5, "method": "ping"}]
            async with http.post(url, json=repeated, headers=session) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["code"] == -32600
            # aiohttp's router answers a method it has no route for: a JSON-RPC body too, not counted.
            async with http.put(url, data=b"{}", headers=session) as resp:
                assert resp.status == 405 and "POST" in resp.headers["Allow"], resp.headers
                assert (await resp.json())["error"]["code"] == -32600
        m = await scrape(b)
        errors = {
            dict(labels)["code"]: v for (name, labels), v in m.values.items() if name == "mcp_bridge_errors_total" and dict(labels)["server"] == "f"
        }
        assert errors == {"-32700": 2, "-32600": 1}, errors
