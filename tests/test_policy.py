"""What a principal may see: tool filters and the audit record, end to end.

Real daemon, the fault-injection server, the official SDK client over both
transports, two tokens: alice sees what the server's own filter lets through,
bob's token narrows it further.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types as types
import pytest
from conftest import faulty
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from rawclient import RawSse, call

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"

CONFIG = {
    "servers": {"f": {**faulty(), "tools": {"deny": ["crash", "deaf", "env*"]}}},
    "security": {
        "tokens": [
            {"name": "alice", "token": ALICE},
            {"name": "bob", "token": BOB, "tools": {"f": {"allow": ["echo", "grow", "grown-*", "hang"], "deny": ["grown-secret"]}}},
        ]
    },
    "limits": {"request_timeout": "1s"},
}


@contextlib.asynccontextmanager
async def sdk(url: str, token: str, transport: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    if transport == "sse":
        opened = sse_client(url + "/sse", headers=headers)
    else:
        opened = streamable_http_client(url + "/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=30))
    async with opened as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _names(session: ClientSession) -> set[str]:
    return {tool.name for tool in (await session.list_tools()).tools}


async def _error(session: ClientSession, name: str) -> types.ErrorData:
    with pytest.raises(Exception) as raised:
        await session.call_tool(name, {"text": "x"})
    error = getattr(raised.value, "error", None)
    assert isinstance(error, types.ErrorData), raised.value
    return error


@pytest.mark.parametrize("transport", ["sse", "streamable"])
async def test_hidden_tools_are_absent_and_unknown_even_after_the_list_changes(bridge: Any, transport: str) -> None:
    async with bridge(CONFIG) as b:
        url = f"{b.base}/servers/f"
        async with sdk(url, ALICE, transport) as alice, sdk(url, BOB, transport) as bob:
            alice_sees = await _names(alice)
            assert {"echo", "pid", "grow"} <= alice_sees and not {"crash", "deaf", "env"} & alice_sees
            assert await _names(bob) == {"echo", "grow", "hang"}

            # A hidden tool is unknown: the answer the server gives for a tool it does not have.
            truly_unknown = await _error(alice, "no-such-tool")
            for hidden in ("pid", "crash", "no-such-tool"):
                refused = await _error(bob, hidden)
                assert (refused.code, refused.message) == (truly_unknown.code, truly_unknown.message.replace("no-such-tool", hidden))
            assert (await _error(alice, "crash")).message.endswith("crash")  # the server's filter: hidden from alice too

            # The server's tools change: lists stay filtered after list_changed.
            grown = await bob.call_tool("grow", {"names": [f"grown-{transport}", "grown-secret"]})
            assert not grown.is_error
            assert await _names(bob) == {"echo", "grow", "hang", f"grown-{transport}"}
            assert {f"grown-{transport}", "grown-secret"} <= await _names(alice)
            assert (await _error(bob, "grown-secret")).code == truly_unknown.code

        audits = b.named("audit")
        bobs = [e for e in audits if e["principal"] == "bob" and e["name"] == "pid"]
        assert [(e["outcome"], e["code"], e["method"], e["server"]) for e in bobs] == [("error", truly_unknown.code, "tools/call", "f")]


async def test_every_outcome_is_audited_once_without_arguments_or_results(bridge: Any) -> None:
    async with bridge(CONFIG) as b, RawSse(b.url("f"), {"Authorization": f"Bearer {BOB}"}) as c:
        await c.initialize()
        secret = "argument-that-must-not-be-logged"
        assert "result" in await c.request("tools/call", call("echo", {"text": secret}), request_id="ok")
        assert "error" in await c.request("tools/call", call("pid"), request_id="hidden")
        assert (await c.request("tools/call", call("hang"), request_id="slow"))["error"]["code"] == -32001
        status, _ = await c.post({"jsonrpc": "2.0", "id": "gone", "method": "tools/call", "params": call("hang")})
        assert status == 202
        await b.wait_for("server_stderr", where=lambda e: '"gone"' in e.get("line", "") or "hang" in e.get("line", ""))
        await c.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "gone"}})
        await b.wait_for("audit", where=lambda e: e["outcome"] == "cancelled")
        outcomes = sorted((e["name"], e["outcome"]) for e in b.named("audit"))
        assert outcomes == [("echo", "result"), ("hang", "cancelled"), ("hang", "timeout"), ("pid", "error")]
        for event in b.named("audit"):
            assert event["principal"] == "bob" and event["session"] == c.session_id and event["logger"] == "mcp_bridge.audit"
            assert event["duration_ms"] >= 0
        assert not [e for e in b.events if secret in str(e)]
