"""The process pool: warm starts, caps on processes, waits for a slot (issue 16).

Real daemon, real server processes (tests/servers/faulty.py, which notes on
stderr every initialize it answers and for whom). Every wait is on a log
event, a reply or a bounded poll of /status.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from conftest import Bridge, faulty, pid_alive
from rawclient import RawSse
from rawstreamable import RawStreamable
from test_operations import reload
from test_supervision import get_json, server_pid, stderr_note

PER_SESSION = {**faulty(), "mode": "per-session"}
LATEST = "2025-11-25"  # what the bridge asks a warm process for, and faulty answers


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


def initialized_for(b: Bridge, pid: int) -> list[str | None]:
    """The clients faulty process `pid` answered an initialize for, in order."""
    return [
        json.loads(e["line"].split(" ", 2)[2])["client"]
        for e in b.named("server_stderr")
        if e.get("pid") == pid and stderr_note("initialize ")(e)
    ]


async def metric(b: Bridge, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(b.base + "/metrics") as resp:
        text = await resp.text()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as prometheus-client writes them
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_warm_session_is_answered_from_the_pool_and_the_pool_refills(bridge: Any) -> None:
    config = {"servers": {"f": {**PER_SESSION, "pool": {"warm": 2}}}}
    async with bridge(config) as b:
        await until_pool(b, "f", warm=2, starting=0, in_use=0)
        warm_pids = b.server_pids()
        assert len(warm_pids) == 2
        for pid in warm_pids:  # initialized by the bridge, before any session
            await b.wait_for("server_stderr", where=lambda e, p=pid: e["pid"] == p and stderr_note("initialize ")(e))
            assert initialized_for(b, pid) == ["mcp-bridge"]

        started = time.monotonic()
        c = await sse_session(b, "f", name="client-a")
        took = time.monotonic() - started
        try:
            pid = await server_pid(c)
            assert pid in warm_pids  # a process that existed before the session opened
            assert initialized_for(b, pid) == ["mcp-bridge"]  # its initialize was answered from the cached result
            assert took < 2.0, took

            # Replaced in the background: two warm ones again, besides the one in use.
            pool = await until_pool(b, "f", warm=2, in_use=1)
            assert pool["target"] == 2
            assert len(b.server_pids()) == 3
            assert await metric(b, "mcp_bridge_pool_sessions_total", server="f", source="warm") == 1
            assert await metric(b, "mcp_bridge_pool_processes", server="f", state="warm") == 2
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


async def test_a_version_the_warm_process_did_not_settle_on_gets_a_process_of_its_own(bridge: Any) -> None:
    config = {"servers": {"f": {**PER_SESSION, "pool": {"warm": 1, "max": 1}}}}
    async with bridge(config) as b:
        await until_pool(b, "f", warm=1)
        (warm_pid,) = b.server_pids()
        c = await sse_session(b, "f", version="2024-11-05", name="old-client")
        try:
            pid = await server_pid(c)
            assert pid != warm_pid
            # The client's own initialize reached its own process, which answered its version.
            assert initialized_for(b, pid) == ["old-client"]
            replaced = b.named("session_process_replaced")
            assert replaced and replaced[0]["requested"] == "2024-11-05" and replaced[0]["warm"] == LATEST
            # In the same slot (pool.max 1): the warm one stopped first.
            await b.wait_for("server_stopped", where=lambda e: e["pid"] == warm_pid)
            assert not pid_alive(warm_pid)
            assert await metric(b, "mcp_bridge_pool_sessions_total", server="f", source="replaced") == 1
        finally:
            await c.close()


async def test_server_requests_need_what_the_session_declared(bridge: Any) -> None:
    """A warm process was initialized declaring every capability; a session that declared
    none gets no sampling request: the server gets an error, as in shared mode."""
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
        try:
            await c.initialize()
            assert await server_pid(c) == warm_pid
            assert initialized_for(b, warm_pid) == ["mcp-bridge"]
            await until_pool_authed(b, OPS, warm=1, in_use=1)
        finally:
            await c.close()


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
