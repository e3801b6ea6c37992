"""The process pool: warm starts, caps on processes, waits for a slot; a warm
per-session process serves a session of any protocol version.

Real daemon, real server processes (tests/servers/faulty.py, which notes on
stderr every initialize it answers, for whom, with which version and capabilities,
and every ping). Every wait is on a log event, a reply or a bounded poll of /status.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import aiohttp
import pytest
from support.daemon import Bridge, faulty, pid_alive
from support.rawclient import RawSse
from support.rawstreamable import RawStreamable, text_of
from test_modern import headers_for, post
from test_modern import request as modern_request
from test_operations import reload
from test_supervision import get_json, server_pid, stderr_note

PER_SESSION = {**faulty(), "mode": "per-session"}
LATEST = "2025-11-25"  # the bridge's latest: what it asks a per-principal process for, and faulty answers
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
FAST_RESTART = {"backoff_initial": "0.05s", "backoff_max": "1s", "max_restarts": 5, "window": "30s"}
TRANSPORTS = ["sse", "streamable"]
# What the bridge declares when it initializes a process itself (shared, per-principal): what it can route.
ANY_CAPABILITY = {"roots": {"listChanged": True}, "sampling": {"context": {}, "tools": {}}, "elicitation": {"form": {}, "url": {}}}


def initialize(version: str = LATEST, name: str = "pool-test") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": "init",
        "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": name, "version": "0"}},
    }


async def sse_session(b: Bridge, server: str, version: str = LATEST, name: str = "pool-test") -> RawSse:
    c = RawSse(b.url(server))
    await c.__aenter__()
    assert c.status == 200, c.status
    status, text = await c.post(initialize(version, name))
    assert status == 202, (status, text)
    reply = await c.response("init")
    assert reply["result"]["protocolVersion"] == version, reply
    await c.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return c


async def pool_of(b: Bridge, server: str) -> dict[str, Any]:
    _, status = await get_json(b, "/status")
    pool: dict[str, Any] = status["servers"][server]["pool"]
    return pool


async def until_pool(b: Bridge, server: str, timeout: float = 10.0, **want: int) -> dict[str, Any]:
    """Poll /status (every 50 ms, at most `timeout`) until the server's pool has these sizes."""
    async with asyncio.timeout(timeout):
        while True:
            pool = await pool_of(b, server)
            if all(pool[k] == v for k, v in want.items()):
                return pool
            await asyncio.sleep(0.05)


def initializes(b: Bridge, pid: int) -> list[dict[str, Any]]:
    """The initializes faulty process `pid` was sent, in order: client, requested and answered
    version, capabilities."""
    return [json.loads(e["line"].split(" ", 2)[2]) for e in b.named("server_stderr") if e.get("pid") == pid and stderr_note("initialize ")(e)]


def initialized_for(b: Bridge, pid: int) -> list[str | None]:
    """The clients faulty process `pid` was sent an initialize for, in order."""
    return [seen["client"] for seen in initializes(b, pid)]


async def sent_initializes(b: Bridge, pid: int) -> list[dict[str, Any]]:
    """`initializes`, once there is one: stderr is read apart from stdout, and may lag the answer."""
    await b.wait_for("server_stderr", where=lambda e: e["pid"] == pid and stderr_note("initialize ")(e))
    return initializes(b, pid)


async def the_warm_one(b: Bridge, server: str = "f") -> int:
    """The pid of the one ready warm process, once it is the only process of the server."""
    await until_pool(b, server, warm=1, starting=0, in_use=0)
    (pid,) = [p for p in b.server_pids() if pid_alive(p)]
    return pid


async def open_session(b: Bridge, transport: str, version: str, name: str, capabilities: dict[str, Any]) -> Any:
    """A session over `transport`, initialized with `version` and `capabilities`: (client, its process's pid)."""
    init = initialize(version, name)
    init["params"]["capabilities"] = capabilities
    if transport == "sse":
        c = RawSse(b.url("f"))
        await c.__aenter__()
        status, text = await c.post(init)
        assert status == 202, (status, text)
        reply = await c.response("init")
        assert reply["result"]["protocolVersion"] == version, reply
        await c.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return c, await server_pid(c)
    s = RawStreamable(b.url("f", "mcp"))
    await s.__aenter__()
    answer = await s.post(init, session=False, version=False, accept="application/json")
    assert answer.status == 200, (answer.status, answer.text)
    assert answer.json["result"]["protocolVersion"] == version, answer.json
    s.session_id, s.protocol_version = answer.headers["Mcp-Session-Id"], version
    assert (await s.post({"jsonrpc": "2.0", "method": "notifications/initialized"})).status == 202
    response, _ = await s.request("tools/call", {"name": "pid", "arguments": {}})
    return s, int(text_of(response))


async def end_session(c: Any) -> None:
    if isinstance(c, RawSse):
        await c.close()
    else:
        await c.delete()
        await c.__aexit__(None, None, None)


async def metric(b: Bridge, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(b.base + "/metrics") as resp:
        text = await resp.text()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as prometheus-client writes them
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_warm_process_is_probed_not_initialized_and_gets_its_sessions_own_initialize(bridge: Any) -> None:
    """A warm process is started and shown to read its input (a ping answered), not
    initialized; the session that takes it sends its own initialize, with its own version.
    Then the pool refills, and a process is never given to a second session."""
    config = {"servers": {"f": {**PER_SESSION, "pool": {"warm": 2}}}}
    async with bridge(config) as b:
        await until_pool(b, "f", warm=2, starting=0, in_use=0)
        warm_pids = b.server_pids()
        assert len(warm_pids) == 2
        for pid in warm_pids:  # probed before any session, and not initialized
            await b.wait_for("server_stderr", where=lambda e, p=pid: e["pid"] == p and stderr_note("ping ")(e))
            assert initialized_for(b, pid) == []

        started = time.monotonic()
        c = await sse_session(b, "f", version="2025-06-18", name="client-a")
        took = time.monotonic() - started
        try:
            pid = await server_pid(c)
            assert pid in warm_pids  # a process that existed before the session opened
            assert await sent_initializes(b, pid) == [{"client": "client-a", "requested": "2025-06-18", "answered": "2025-06-18", "capabilities": {}}]
            assert took < 2.0, took
            opened = b.named("session_opened")
            assert [e["process"] for e in opened] == ["warm"]

            # Replaced in the background: two warm ones again, besides the one in use.
            pool = await until_pool(b, "f", warm=2, in_use=1)
            assert pool["target"] == 2
            assert len(b.server_pids()) == 3
            assert await metric(b, "mcp_bridge_pool_sessions_total", server="f", source="warm") == 1
            assert await metric(b, "mcp_bridge_pool_processes", server="f", state="warm") == 2
            _, status = await get_json(b, "/status")
            warm_now = {p["pid"]: p["warm"] for p in status["servers"]["f"]["processes"]}
            assert warm_now[pid] is False and sorted(warm_now.values()) == [False, True, True], warm_now  # taken: warm no more
        finally:
            await c.close()

        # Its session ended: the process stops, and is never handed to another session.
        await b.wait_for("server_stopped", where=lambda e: e["pid"] == pid)
        assert not pid_alive(pid)
        seen = {pid}
        for n in range(3):
            c = await sse_session(b, "f", name=f"client-{n}")
            try:
                other = await server_pid(c)
            finally:
                await c.close()
            assert other not in seen, (other, seen)
            seen.add(other)
            await b.wait_for("server_stopped", where=lambda e, p=other: e["pid"] == p)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_protocol_version_is_served_by_a_warm_process_with_its_own_initialize(bridge: Any, transport: str) -> None:
    """Sessions asking 2025-06-18 (what many deployed clients send) got a cold
    process when the warm ones had been initialized at 2025-11-25. Each version now takes
    the warm process, and the server gets the session's version and capabilities as sent."""
    config = {"servers": {"f": {**PER_SESSION, "pool": {"warm": 1}}}}
    async with bridge(config) as b:
        for n, version in enumerate(VERSIONS):
            warm_pid = await the_warm_one(b)
            capabilities = {"roots": {"listChanged": True}, "sampling": {}} if n % 2 else {}
            c, pid = await open_session(b, transport, version, f"client-{version}", capabilities)
            try:
                assert pid == warm_pid
                assert await sent_initializes(b, pid) == [
                    {"client": f"client-{version}", "requested": version, "answered": version, "capabilities": capabilities}
                ]
            finally:
                await end_session(c)
            await b.wait_for("server_stopped", where=lambda e, p=pid: e["pid"] == p)
        assert [e["process"] for e in b.named("session_opened")] == ["warm"] * len(VERSIONS)
        assert await metric(b, "mcp_bridge_pool_sessions_total", server="f", source="warm") == len(VERSIONS)
        assert await metric(b, "mcp_bridge_pool_sessions_total", server="f", source="cold") == 0


@pytest.mark.parametrize("path", ["fast", "aiohttp"])
async def test_a_2026_07_28_request_takes_a_warm_process_initialized_with_its_own_capabilities(bridge: Any, path: str) -> None:
    """A 2026-07-28 request has no handshake: in per-session mode the bridge initializes the
    process with the request's capabilities, a warm one as a cold one."""
    config = {"servers": {"f": {**PER_SESSION, "pool": {"warm": 1}}}}
    async with bridge(config) as b:
        warm_pid = await the_warm_one(b)
        capabilities = {"elicitation": {"form": {}}}
        call = modern_request("tools/call", {"name": "pid", "arguments": {}}, capabilities=capabilities)
        answer = await post(b.url("f", "mcp"), call, headers_for(call), path)
        assert answer.status == 200, answer.body
        assert int(answer.final()["result"]["content"][0]["text"]) == warm_pid
        assert await sent_initializes(b, warm_pid) == [{"client": "raw", "requested": LATEST, "answered": LATEST, "capabilities": capabilities}]
        assert await metric(b, "mcp_bridge_pool_sessions_total", server="f", source="warm") == 1
        await b.wait_for("server_stopped", where=lambda e: e["pid"] == warm_pid)  # its request answered, its session ends
        await the_warm_one(b)  # refilled


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_session_that_leaves_before_its_initialize_is_answered_frees_its_warm_process(bridge: Any, transport: str) -> None:
    """The process the session took is stopped and its slot freed (pool.max 1: else no
    warm process could start again)."""
    config = {"servers": {"f": {**faulty(FAULTY_NO_INIT="1"), "mode": "per-session", "pool": {"warm": 1, "max": 1}}}}
    async with bridge(config) as b:
        pid = await the_warm_one(b)
        mark = len(b.events)
        sent = lambda e: e["pid"] == pid and stderr_note("initialize ")(e)  # noqa: E731
        if transport == "sse":
            c = RawSse(b.url("f"))
            await c.__aenter__()
            status, _ = await c.post(initialize(LATEST, "leaver"))
            assert status == 202
            await b.wait_for("server_stderr", where=sent, start=mark)
            await c.close()
        else:
            async with RawStreamable(b.url("f", "mcp")) as s:
                waiting = asyncio.get_running_loop().create_task(s.post(initialize(LATEST, "leaver"), session=False, version=False))
                try:
                    await b.wait_for("server_stderr", where=sent, start=mark)
                finally:
                    waiting.cancel()  # its connection closes with the client
        closed = await b.wait_for("session_closed", start=mark)
        assert closed["reason"] == ("initialize failed" if transport == "streamable" else "client disconnected"), closed
        await b.wait_for("server_stopped", where=lambda e: e["pid"] == pid)
        assert await the_warm_one(b) != pid
        _, status = await get_json(b, "/status")
        assert status["processes"]["running"] == 1


async def test_a_warm_process_that_dies_before_it_is_taken_is_restarted_and_probed_again(bridge: Any) -> None:
    config = {"servers": {"f": {**PER_SESSION, "restart": FAST_RESTART, "pool": {"warm": 1}}}}
    async with bridge(config) as b:
        first = await the_warm_one(b)
        os.kill(first, signal.SIGKILL)
        await b.wait_for("server_exited", where=lambda e: e["pid"] == first)
        second = await the_warm_one(b)
        assert second != first
        await b.wait_for("server_stderr", where=lambda e: e["pid"] == second and stderr_note("ping ")(e))
        c = await sse_session(b, "f", version="2025-06-18", name="after-death")
        try:
            assert await server_pid(c) == second
            assert [seen["client"] for seen in await sent_initializes(b, second)] == ["after-death"]
            assert initialized_for(b, first) == []
        finally:
            await c.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_warm_process_whose_sessions_initialize_fails_passes_the_error_on(bridge: Any, transport: str) -> None:
    """The server's refusal reaches the client as it gave it, as from a process started for
    the session; the session's end stops the process, and the pool refills."""
    config = {"servers": {"f": {**faulty(FAULTY_INIT_ERROR="1"), "mode": "per-session", "pool": {"warm": 1, "max": 1}}}}
    refusal = {"code": -32602, "message": "Unsupported protocol version: 2025-06-18"}
    async with bridge(config) as b:
        pid = await the_warm_one(b)
        if transport == "sse":
            async with RawSse(b.url("f")) as c:
                status, _ = await c.post(initialize("2025-06-18"))
                assert status == 202
                assert (await c.response("init"))["error"] == refusal
        else:
            async with RawStreamable(b.url("f", "mcp")) as s:
                answer = await s.post(initialize("2025-06-18"), session=False, version=False, accept="application/json")
                assert answer.status == 200, answer.text
                assert answer.json["error"] == refusal
        assert [seen["client"] for seen in await sent_initializes(b, pid)] == ["pool-test"]
        await b.wait_for("server_stopped", where=lambda e: e["pid"] == pid)
        assert await the_warm_one(b) != pid


async def test_a_restarted_process_that_was_warm_gets_its_sessions_own_initialize_replayed(bridge: Any) -> None:
    config = {"servers": {"f": {**PER_SESSION, "restart": FAST_RESTART, "pool": {"warm": 1}}}}
    capabilities = {"roots": {"listChanged": True}}
    async with bridge(config) as b:
        warm_pid = await the_warm_one(b)
        c, pid = await open_session(b, "sse", "2025-06-18", "restarted", capabilities)
        try:
            assert pid == warm_pid
            status, _ = await c.post({"jsonrpc": "2.0", "id": "boom", "method": "tools/call", "params": {"name": "crash", "arguments": {}}})
            assert status == 202
            assert (await c.response("boom"))["error"]["code"] == -32000  # the server exited
            await b.wait_for("server_exited", where=lambda e: e["pid"] == pid)
            again = await server_pid(c, request_id="again")  # waits in the backlog for the new process
            assert again != pid
            replayed = {"client": "restarted", "requested": "2025-06-18", "answered": "2025-06-18", "capabilities": capabilities}
            assert await sent_initializes(b, again) == [replayed]
            assert not [e for e in b.named("server_stderr") if e["pid"] == again and stderr_note("ping ")(e)]  # no probe: it has its session
        finally:
            await c.close()


async def test_server_requests_need_what_the_session_declared(bridge: Any) -> None:
    """A session that declared no sampling gets no sampling request, even from a server
    that asks regardless of what its initialize said: the server gets an error."""
    async with bridge({"servers": {"f": {**PER_SESSION, "pool": {"warm": 1}}}}) as b:
        await until_pool(b, "f", warm=1)
        c = await sse_session(b, "f")
        try:
            ask = {"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}}
            emit = {"name": "emit", "arguments": {"lines": [json.dumps(ask)]}}
            status, _ = await c.post({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": emit})
            assert status == 202
            assert "result" in await c.response(5)
            answered = await b.wait_for("server_stderr", where=stderr_note("response "))
            assert json.loads(answered["line"].split(" ", 2)[2])["error"]["code"] == -32601
            assert (await c.request("ping", request_id=6)) == {"jsonrpc": "2.0", "id": 6, "result": {}}  # nothing else came
        finally:
            await c.close()


async def test_a_warm_session_that_can_be_asked_is_not_held_back(bridge: Any) -> None:
    """One session per process: nothing to attribute, so its calls are never held back for
    attribution_window as a shared server's are (here 30 s: a held call would wait that long)."""
    config = {"servers": {"f": {**PER_SESSION, "attribution_window": "30s", "pool": {"warm": 1}}}}
    async with bridge(config) as b:
        await until_pool(b, "f", warm=1)
        c = RawSse(b.url("f"))
        await c.__aenter__()
        try:
            await c.initialize({"sampling": {}}, version=LATEST)
            mark = len(b.events)
            for rid in (1, 2):
                status, _ = await c.post(
                    {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "slow", "arguments": {"ms": 3000}}}
                )
                assert status == 202
            # Both reach the process before either is answered (each takes 3 s).
            started = time.monotonic()
            first = await b.wait_for("server_stderr", where=stderr_note("slow "), start=mark)
            await b.wait_for("server_stderr", where=stderr_note("slow "), start=b.events.index(first) + 1)
            assert time.monotonic() - started < 2.5
            assert "result" in await c.response(1) and "result" in await c.response(2)
        finally:
            await c.close()


async def test_full_cap_waits_then_refuses_with_503_and_retry_after(bridge: Any) -> None:
    config = {"servers": {"f": {**PER_SESSION, "pool": {"max": 1, "wait": "1s"}}}}
    async with bridge(config) as b:
        a = await sse_session(b, "f")
        try:
            await server_pid(a)
            # Streamable: the initialize POST opens the session; after pool.wait, 503 and a JSON-RPC error.
            async with RawStreamable(b.url("f", "mcp")) as s:
                started = time.monotonic()
                reply = await s.post(initialize(), session=False, version=False)
                waited = time.monotonic() - started
            assert reply.status == 503, (reply.status, reply.text)
            assert reply.headers["Retry-After"] == "1"
            assert reply.json["error"]["code"] == -32003
            assert "pool.max 1" in reply.json["error"]["message"] and "pool.wait" in reply.json["error"]["message"]
            assert 0.9 <= waited < 3.0, waited
            # HTTP+SSE: the GET that opens the session, likewise.
            async with aiohttp.ClientSession() as http:
                started = time.monotonic()
                async with http.get(b.url("f")) as resp:
                    assert resp.status == 503
                    assert resp.headers["Retry-After"] == "1"
                    assert (await resp.json())["error"]["code"] == -32003
                assert time.monotonic() - started < 3.0
            assert len(b.named("session_waiting_for_process")) == 2
            assert len(b.named("session_refused_no_process")) == 2
            assert await metric(b, "mcp_bridge_pool_waits_total", server="f", outcome="timeout") == 2
            assert len(b.server_pids()) == 1  # nothing more was started
        finally:
            await a.close()


async def test_a_slot_freed_by_a_session_ending_lets_the_waiting_one_in(bridge: Any) -> None:
    config = {"servers": {"f": {**PER_SESSION, "pool": {"max": 1, "wait": "20s"}}}}
    async with bridge(config) as b:
        a = await sse_session(b, "f")
        first = await server_pid(a)
        mark = len(b.events)
        waiting = asyncio.get_running_loop().create_task(sse_session(b, "f", name="second"))
        try:
            await b.wait_for("session_waiting_for_process", start=mark)
            assert (await pool_of(b, "f"))["waiting"] == 1
            await a.close()
            c = await asyncio.wait_for(waiting, 10)
        except BaseException:
            waiting.cancel()
            raise
        try:
            second = await server_pid(c)
            assert second != first
            # The slot was free only once the first process had exited.
            stopped = b.events.index(await b.wait_for("server_stopped", where=lambda e: e["pid"] == first))
            started = b.events.index(await b.wait_for("server_started", where=lambda e: e["pid"] == second))
            assert stopped < started
            assert await metric(b, "mcp_bridge_pool_waits_total", server="f", outcome="ok") == 1
        finally:
            await c.close()


async def test_a_client_that_leaves_while_waiting_takes_no_process(bridge: Any) -> None:
    config = {"servers": {"f": {**PER_SESSION, "pool": {"max": 1, "wait": "20s"}}}}
    async with bridge(config) as b:
        a = await sse_session(b, "f")
        first = await server_pid(a)
        mark = len(b.events)
        waiting = asyncio.get_running_loop().create_task(sse_session(b, "f", name="leaves"))
        await b.wait_for("session_waiting_for_process", start=mark)
        waiting.cancel()  # its connection closes
        async with asyncio.timeout(10):
            while await metric(b, "mcp_bridge_pool_waits_total", server="f", outcome="gone") != 1:
                await asyncio.sleep(0.05)
        assert (await pool_of(b, "f"))["waiting"] == 0
        await a.close()
        await b.wait_for("server_stopped", where=lambda e: e["pid"] == first)
        await until_pool(b, "f", in_use=0, warm=0, starting=0)
        assert b.server_pids() == {first}  # nothing was started for the session that left


async def test_max_processes_counts_every_server_and_takes_an_idle_warm_process(bridge: Any) -> None:
    config = {
        "servers": {
            "a": {**PER_SESSION, "pool": {"warm": 1, "wait": "10s"}},
            "b": {**PER_SESSION, "pool": {"wait": "1s"}},
        },
        "limits": {"max_processes": 2},
    }
    async with bridge(config) as b:
        await until_pool(b, "a", warm=1)
        (warm_a,) = b.server_pids()
        b1 = await sse_session(b, "b")
        try:
            await server_pid(b1)
            _, status = await get_json(b, "/status")
            assert status["processes"] == {"running": 2, "max": 2, "waiting": 0}
            # The daemon is full: b's second session makes a's idle warm process give way.
            b2 = await sse_session(b, "b", name="b2")
            try:
                await server_pid(b2)
                await b.wait_for("server_stopped", where=lambda e: e["pid"] == warm_a)
                # Two processes, both in use: a third session of either server waits, then is refused.
                async with aiohttp.ClientSession() as http, http.get(b.url("b")) as resp:
                    assert resp.status == 503
                _, status = await get_json(b, "/status")
                assert status["processes"]["running"] == 2
                assert status["servers"]["a"]["pool"]["warm"] == 0
            finally:
                await b2.close()
            # A slot is free again (b2's process exited) and nobody waits: a's pool refills.
            await until_pool(b, "a", warm=1)
        finally:
            await b1.close()


OPS = "ops-token-0123456789abcd"


async def test_per_principal_takes_a_warm_process_for_a_new_principal(bridge: Any) -> None:
    tokens = [{"name": "alice", "token": "alice-token-0123456789"}, {"name": "bob", "token": "bob-token-0123456789ab"}]
    tokens.append({"name": "ops", "token": OPS, "roles": ["admin"]})  # the pool is only in an admin's /status
    config = {
        "servers": {"f": {**faulty(), "mode": "per-principal", "pool": {"warm": 1}}},
        "security": {"tokens": tokens},
    }
    async with bridge(config) as b:
        await until_pool_authed(b, OPS, warm=1)
        (warm_pid,) = b.server_pids()
        c = RawSse(b.url("f"), headers={"Authorization": "Bearer alice-token-0123456789"})
        await c.__aenter__()
        d = RawSse(b.url("f"), headers={"Authorization": "Bearer alice-token-0123456789"})
        await d.__aenter__()
        try:
            # The principal's process, shared by its sessions, is initialized by the bridge (at
            # its latest version); each session is answered with the version it asked for.
            assert (await c.initialize(version="2025-06-18"))["result"]["protocolVersion"] == "2025-06-18"
            assert await server_pid(c) == warm_pid
            assert (await d.initialize(version="2025-03-26"))["result"]["protocolVersion"] == "2025-03-26"
            assert await server_pid(d) == warm_pid
            assert await sent_initializes(b, warm_pid) == [{"client": "mcp-bridge", "requested": LATEST, "answered": LATEST, "capabilities": ANY_CAPABILITY}]
            await until_pool_authed(b, OPS, warm=1, in_use=1)
        finally:
            await c.close()
            await d.close()


async def until_pool_authed(b: Bridge, token: str, timeout: float = 10.0, **want: int) -> None:
    async with asyncio.timeout(timeout), aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        while True:
            async with http.get(b.base + "/status") as resp:
                pool = (await resp.json())["servers"]["f"]["pool"]
            if all(pool[k] == v for k, v in want.items()):
                return
            await asyncio.sleep(0.05)


async def test_warm_starts_that_fail_are_a_crash_loop_not_a_start_per_session(bridge: Any) -> None:
    restart = {"backoff_initial": "0.05s", "backoff_max": "30s", "max_restarts": 3, "window": "30s"}
    pool = {"warm": 2, "max": 2, "wait": "1s"}
    config = {"servers": {"f": {**faulty(FAULTY_CRASH_ON_START="1"), "mode": "per-session", "restart": restart, "pool": pool}}}
    async with bridge(config) as b:
        # Each warm process's supervisor gives up after max_restarts, and tries again after backoff_max.
        first = await b.wait_for("server_crash_loop")
        await b.wait_for("server_crash_loop", start=b.events.index(first) + 1)
        starts = b.named("server_started")
        assert len(starts) == 8, len(starts)  # 2 warm processes x (the first start and 3 restarts)
        status, body = await get_json(b, "/readyz")
        assert status == 503 and "crash loop" in body["servers"]["f"], body
        assert await metric(b, "mcp_bridge_server_crash_looping", server="f") == 1
        assert (await pool_of(b, "f"))["starting"] == 2  # never ready, never handed out
        # A session finds no ready process and no free slot: refused after pool.wait, nothing started for it.
        async with aiohttp.ClientSession() as http, http.get(b.url("f")) as resp:
            assert resp.status == 503
        assert len(b.named("server_started")) == 8


async def test_a_reload_that_raises_max_processes_lets_a_waiting_session_in(bridge: Any) -> None:
    config = {"servers": {"f": {**PER_SESSION, "pool": {"wait": "20s"}}}, "limits": {"max_processes": 1}}
    async with bridge(config) as b:
        a = await sse_session(b, "f")
        mark = len(b.events)
        waiting = asyncio.get_running_loop().create_task(sse_session(b, "f", name="second"))
        try:
            await b.wait_for("session_waiting_for_process", start=mark)

            def raise_cap(cfg: dict[str, Any]) -> None:
                cfg["limits"]["max_processes"] = 2

            await reload(b, raise_cap)
            c = await asyncio.wait_for(waiting, 10)
        except BaseException:
            waiting.cancel()
            raise
        try:
            assert await server_pid(c) != await server_pid(a)  # the open session kept its process
            _, status = await get_json(b, "/status")
            assert status["processes"] == {"running": 2, "max": 2, "waiting": 0}
        finally:
            await c.close()
            await a.close()


@pytest.mark.parametrize("path", ["fast", "aiohttp"])
async def test_a_session_refused_for_want_of_a_process_is_an_error_sent_on_either_path(bridge: Bridge, path: str) -> None:
    """The 503 a Streamable initialize gets when no process comes within pool.wait is a
    JSON-RPC error sent to its client: counted in mcp_bridge_errors_total whichever path
    (a chunked body is aiohttp's) answered it."""
    from test_operations import INIT

    config = {"servers": {"f": {**PER_SESSION, "pool": {"max": 1, "wait": "0.2s"}}}}
    async with bridge(config) as b:
        holder = await sse_session(b, "f")
        try:
            answer = await post(b.url("f", "mcp"), INIT, {"Accept": "application/json", "Content-Type": "application/json"}, path)
            assert answer.status == 503 and answer.headers["Retry-After"] == "1", answer.body
            code = answer.json()["error"]["code"]
            assert await metric(b, "mcp_bridge_errors_total", code=str(code), server="f") == 1
        finally:
            await holder.close()
