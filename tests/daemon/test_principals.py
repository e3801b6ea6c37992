"""Principals are trust boundaries: processes per principal, end to end.

Real daemon, real server processes (tests/servers/faulty.py), two bearer tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
from support.daemon import faulty, pid_alive
from support.rawclient import RawSse, call
from support.rawstreamable import RawStreamable
from test_supervision import server_pid, tool

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def two_tokens(server: dict[str, Any]) -> dict[str, Any]:
    return {
        "servers": {"f": server},
        "security": {"tokens": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}]},
    }


async def test_per_principal_mode_gives_each_principal_its_own_process(bridge: Any) -> None:
    config = two_tokens({**faulty(), "mode": "per-principal", "principal_idle_timeout": "1s"})
    async with bridge(config) as b:
        async with RawSse(b.url("f"), bearer(ALICE)) as a1, RawSse(b.url("f"), bearer(ALICE)) as a2:
            await a1.initialize()
            await a2.initialize()
            alice_pid = await server_pid(a1)
            assert await server_pid(a2) == alice_pid  # one principal's sessions share one process
            async with RawSse(b.url("f"), bearer(BOB)) as b1:
                await b1.initialize()
                bob_pid = await server_pid(b1)
                assert bob_pid != alice_pid
            retired = await b.wait_for("server_retired", where=lambda e: e["principal"] == "bob", timeout=10)
            assert retired["idle_s"] == 1
            await b.wait_for("server_stopped", where=lambda e: e["pid"] == bob_pid, timeout=10)
            assert not pid_alive(bob_pid)
            assert pid_alive(alice_pid)  # alice still has sessions
        async with RawSse(b.url("f"), bearer(ALICE)) as a3:  # back within the idle timeout: the same process
            await a3.initialize()
            assert await server_pid(a3) == alice_pid
        assert b.named("server_retired")[-1]["principal"] == "bob"


async def test_a_principals_process_retires_idle_timeout_after_its_last_session_not_its_first(bridge: Any) -> None:
    """A session that comes back while its principal's process waits to retire cancels that
    retirement: the process retires principal_idle_timeout after the session that ends last."""
    config = two_tokens({**faulty(), "mode": "per-principal", "principal_idle_timeout": "2s"})
    async with bridge(config) as b:
        async with RawSse(b.url("f"), bearer(ALICE)) as a1:
            await a1.initialize()
            pid = await server_pid(a1)
        first_left = loop_time()
        await asyncio.sleep(1.0)  # back after half the idle timeout
        async with RawSse(b.url("f"), bearer(ALICE)) as a2:
            await a2.initialize()
            assert await server_pid(a2) == pid
        last_left = loop_time()
        await b.wait_for("server_retired", where=lambda e: e["principal"] == "alice", timeout=10)
        retired = loop_time()
        assert retired - last_left >= 1.8, f"retired {retired - first_left:.1f}s after the first session left, {retired - last_left:.1f}s after the last"


def loop_time() -> float:
    return asyncio.get_running_loop().time()


def _log(marker: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": marker}})


def _custom(marker: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/vendor/secret", "params": {"data": marker}})


def _ask(request_id: str, marker: str) -> str:
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": marker}}], "maxTokens": 1}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "sampling/createMessage", "params": params})


def _mentions(messages: list[dict[str, Any]], marker: str) -> list[dict[str, Any]]:
    return [m for m in messages if marker in json.dumps(m)]


async def _drain(c: RawSse, barrier: str) -> list[dict[str, Any]]:
    """Everything the session got before the bridge's answer to a ping sent now."""
    await c.request("ping", request_id=barrier)
    got, c._held[:] = list(c._held), []
    return got


async def test_nothing_of_one_principal_reaches_another_on_a_shared_server(bridge: Any) -> None:
    """A hostile server sends log messages, vendor notifications and sampling requests
    during alice's call, during bob's, during both, and during none. On the wire: bob's
    session never carries anything of alice's calls, nor alice's of bob's; what is about
    no call is either about the server (notifications: everyone) or refused (requests)."""
    async with bridge(two_tokens(faulty())) as b:
        async with RawSse(b.url("f"), bearer(ALICE)) as a, RawSse(b.url("f"), bearer(BOB)) as o:
            for c in (a, o):
                await c.initialize(capabilities={"sampling": {}})
                await c.request("logging/setLevel", {"level": "debug"}, request_id="lvl")
            seen: dict[str, list[dict[str, Any]]] = {"alice": [], "bob": []}

            # During one principal's call: only that principal hears of it.
            for owner, c in (("alice", a), ("bob", o)):
                lines = [_log(f"{owner}-log"), _custom(f"{owner}-note"), _ask(f"ask-{owner}", f"{owner}-ask")]
                reply = await tool(c, "emit", {"lines": lines}, request_id=f"emit-{owner}")
                assert "result" in reply
            for who, c in (("alice", a), ("bob", o)):
                seen[who] += await _drain(c, "barrier-1")
            for who, other in (("alice", "bob"), ("bob", "alice")):
                assert len(_mentions(seen[who], f"{who}-log")) == 1
                assert len(_mentions(seen[who], f"{who}-note")) == 1
                assert len(_mentions(seen[who], f"{who}-ask")) == 1
                assert _mentions(seen[who], other) == [], f"{who} got {other}'s traffic"

            # During calls of both: nobody can tell whose it is, so nobody gets it.
            status, _ = await a.post({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": call("slow", {"ms": 1500})})
            assert status == 202
            await b.wait_for("server_stderr", where=lambda e: e.get("line", "").startswith("faulty: slow"))
            await tool(o, "emit", {"lines": [_log("both-log"), _custom("both-note")]}, request_id="emit-both")
            await a.response("slow", timeout=10)
            for who, c in (("alice", a), ("bob", o)):
                got = await _drain(c, "barrier-2")
                assert _mentions(got, "both-") == []
                seen[who] += got

            # During no call: notifications are about the server; a request is refused to it.
            await tool(a, "later", {"ms": 100, "lines": [_log("idle-log"), _ask("ask-idle", "idle-ask")]}, request_id="later")
            refused = await b.wait_for("server_stderr", where=lambda e: "ask-idle" in e.get("line", ""), timeout=10)
            assert '"error"' in refused["line"]
            for who, c in (("alice", a), ("bob", o)):
                got = await _drain(c, "barrier-3")
                assert len(_mentions(got, "idle-log")) == 1
                assert _mentions(got, "idle-ask") == []
                seen[who] += got
            assert _mentions(seen["bob"], "alice-") == [] and _mentions(seen["alice"], "bob-") == []


async def test_one_principals_queue_delays_anothers_call_by_one_window_at_most(bridge: Any) -> None:
    """alice keeps three calls waiting for attribution; bob's call goes next."""
    window = 0.5
    async with bridge(two_tokens({**faulty(), "attribution_window": f"{window}s"})) as b:
        async with RawSse(b.url("f"), bearer(ALICE)) as a, RawSse(b.url("f"), bearer(BOB)) as o:
            for c in (a, o):
                await c.initialize(capabilities={"sampling": {}})
            for rid in range(4):
                status, _ = await a.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call("slow", {"ms": 3000})})
                assert status == 202
            await b.wait_for("server_stderr", where=lambda e: e.get("line", "").startswith("faulty: slow"))
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert "result" in await tool(o, "echo", {"text": "bob"}, request_id="bob", timeout=10)
            waited = loop.time() - started
            # Behind all of alice's held calls it would wait three more windows (2 s).
            assert waited < 2 * window, f"bob waited {waited:.2f}s behind alice's queue"


RATED = {
    "servers": {"f": faulty()},
    "security": {
        "tokens": [
            {"name": "alice", "token": ALICE, "rate_limit": {"per_second": 0.5, "burst": 3}},
            {"name": "bob", "token": BOB},
        ]
    },
    "limits": {"per_principal": {"in_flight": 2}},
}


def _echo(rid: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call("echo", {"text": str(rid)})}


async def test_a_principal_over_its_rate_gets_429_and_nothing_of_it_is_taken(bridge: Any) -> None:
    async with bridge(RATED) as b:
        async with RawSse(b.url("f"), bearer(ALICE)) as a, RawSse(b.url("f"), bearer(BOB)) as o:
            await a.initialize()  # initialize and ping are not counted
            await o.initialize()
            for rid in (1, 2):
                assert (await a.post(_echo(rid)))[0] == 202
                assert "result" in await a.response(rid)
            # One token left: a batch of two calls is refused whole.
            status, body = await a.post([_echo("b1"), _echo("b2")])
            assert status == 429, (status, body)
            error = json.loads(body)["error"]
            assert error["code"] == -32004 and "rate limit" in error["message"]
            assert (await a.post(_echo(3)))[0] == 202
            assert "result" in await a.response(3)
            status, _ = await a.post(_echo(4))
            assert status == 429
            # Other principals are unaffected; bob has no rate, only the default cap in flight.
            for rid in range(1, 8):
                assert (await o.post(_echo(rid)))[0] == 202
                assert "result" in await o.response(rid)
            assert "result" in await a.request("ping", request_id="still")
            got = await _drain(a, "barrier")
            assert not [m for m in got if m.get("id") in ("b1", "b2", 4)], got  # refused: never answered, never run
        async with aiohttp.ClientSession() as http, http.get(b.base + "/metrics", headers=bearer(BOB)) as resp:
            metrics = await resp.text()
        assert 'mcp_bridge_rate_limited_total{limit="rate",principal="alice"} 3.0' in metrics
        assert [e["principal"] for e in b.named("rate_limited")] == ["alice", "alice"]


async def test_calls_in_flight_are_capped_per_principal_across_transports(bridge: Any) -> None:
    async with bridge(RATED) as b:
        async with RawSse(b.url("f"), bearer(BOB)) as o, RawStreamable(b.url("f", "mcp"), {"Authorization": f"Bearer {BOB}"}) as s:
            await o.initialize()
            await s.initialize()
            for rid in ("h1", "h2"):
                status, _ = await o.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call("hang")})
                assert status == 202
            hanging = lambda e: e.get("line", "").startswith("faulty: hang")  # noqa: E731
            first = await b.wait_for("server_stderr", where=hanging)
            await b.wait_for("server_stderr", where=hanging, start=b.events.index(first) + 1)
            reply = await s.post(_echo("over"))  # bob's third call, on another session and transport
            assert reply.status == 429 and reply.headers["Retry-After"] == "1", (reply.status, reply.text)
            assert "in flight" in reply.json["error"]["message"]
            await o.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "h1"}})
            await b.wait_for("audit", where=lambda e: e["outcome"] == "cancelled")
            response, _ = await s.request("tools/call", call("echo", {"text": "room"}), request_id="room")
            assert "result" in response


OPS = "ops-token-0123456789abcd"


async def status_for(b: Any, token: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(b.base + "/status", headers=bearer(token)) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def test_status_shows_a_principal_only_its_servers_sessions_and_processes(bridge: Any) -> None:
    users = ["shared", "mine", "each"]
    config = {
        "servers": {"shared": faulty(), "mine": {**faulty(), "mode": "per-principal"}, "each": {**faulty(), "mode": "per-session"}, "ops-only": faulty()},
        "security": {
            "tokens": [
                {"name": "ops", "token": OPS, "roles": ["admin"]},
                {"name": "alice", "token": ALICE, "servers": users},
                {"name": "bob", "token": BOB, "servers": users},
                {"name": "metrics", "token": "metrics-token-0123456789", "servers": []},
            ]
        },
    }
    async with bridge(config) as b, contextlib.AsyncExitStack() as stack:
        clients = {
            (who, name): await stack.enter_async_context(RawSse(b.url(name), bearer(token)))
            for who, token in (("alice", ALICE), ("bob", BOB))
            for name in users
        }
        for c in clients.values():
            await c.initialize()
        pids = {key: await server_pid(c) for key, c in clients.items()}
        # bob has a call in flight on the shared process, which notes it on its stderr.
        status, _ = await clients["bob", "shared"].post({"jsonrpc": "2.0", "id": "h", "method": "tools/call", "params": call("hang")})
        assert status == 202
        await b.wait_for("server_stderr", where=lambda e: "faulty: hang" in e.get("line", ""))

        admin = await status_for(b, OPS)
        assert set(admin["servers"]) == {*users, "ops-only"} and {"processes", "servers"} <= set(admin)
        shared = admin["servers"]["shared"]
        assert (shared["sessions"], shared["in_flight"]) == (2, 1)
        assert any("faulty: hang" in line for line in shared["processes"][0]["stderr_tail"])
        assert sorted(p["pid"] for p in admin["servers"]["mine"]["processes"]) == sorted([pids["alice", "mine"], pids["bob", "mine"]])

        for who, calls in (("alice", 0), ("bob", 1)):
            seen = await status_for(b, {"alice": ALICE, "bob": BOB}[who])
            assert set(seen) == {"servers"} and set(seen["servers"]) == set(users), seen  # no ops-only, no daemon-wide counts
            mine = seen["servers"]
            assert (mine["shared"]["sessions"], mine["shared"]["in_flight"]) == (1, calls), mine["shared"]
            (process,) = mine["shared"]["processes"]
            assert process["pid"] == pids[who, "shared"] and process["in_flight"] == calls
            for name in ("mine", "each"):
                assert [p["pid"] for p in mine[name]["processes"]] == [pids[who, name]], (name, mine[name])
                assert mine[name]["sessions"] == 1 and mine[name]["mode"] == config["servers"][name].get("mode", "shared")
            for server in mine.values():
                assert set(server) == {"mode", "ready", "sessions", "in_flight", "processes"}
                for process in server["processes"]:
                    assert "stderr_tail" not in process and "tables" not in process
            assert "faulty:" not in json.dumps(seen)
        assert await status_for(b, "metrics-token-0123456789") == {"servers": {}}
