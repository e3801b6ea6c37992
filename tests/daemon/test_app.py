"""The aiohttp application in-process (pytest-aiohttp's `aiohttp_client`): routes, the
aiohttp side of the HTTP layer, health, and a reload's effect on what principals see.

The server processes are real (the demo server); only the HTTP client is in-process.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import yaml
from aiohttp.test_utils import TestClient
from support.daemon import demo
from support.rawclient import RawSse

from bridge.app import apply_config, create_app
from bridge.config import load, schema
from bridge.http.state import GATEWAYS, LIVE

TOKEN = "ops-token-0123456789"


def from_dict(data: dict[str, Any]) -> schema.Config:
    return load.parse(yaml.safe_dump(data), environ={})
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def config(tools: dict[str, Any] | None = None) -> schema.Config:
    server = {**demo(), **({"tools": tools} if tools else {})}
    return from_dict({"servers": {"demo": server}, "security": {"tokens": [{"name": "ops", "token": TOKEN}]}})


async def ready(client: TestClient, timeout: float = 20.0) -> None:
    """Until /readyz says so: the server process is up and initialized."""
    async with asyncio.timeout(timeout):
        while (await client.get("/readyz")).status != 200:
            await asyncio.sleep(0.05)


async def test_probes_are_open_and_everything_else_needs_a_token(aiohttp_client: Any) -> None:
    client = await aiohttp_client(create_app(config()))
    assert (await client.get("/healthz")).status == 200
    await ready(client)
    refused = await client.get("/status")
    assert refused.status == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await refused.json())["error"]["message"] == "missing token"
    status = await (await client.get("/status", headers=AUTH)).json()
    (process,) = status["servers"]["demo"]["processes"]
    assert process["state"] == "running" and process["protocol"] == "ready" and process["rss_bytes"] > 0


async def test_an_unknown_route_and_a_foreign_host_are_answered_by_the_http_layer(aiohttp_client: Any) -> None:
    client = await aiohttp_client(create_app(config()))
    assert (await client.get("/servers/nope/mcp", headers={**AUTH, "Accept": "text/event-stream"})).status == 404
    foreign = await client.post("/servers/demo/mcp", headers={**AUTH, "Host": "evil.example.com"}, data=b"{}")
    assert foreign.status == 403 and (await foreign.json())["error"]["message"] == "host not allowed"


async def test_a_reload_changes_what_an_open_session_may_see(aiohttp_client: Any) -> None:
    app = create_app(config())
    client = await aiohttp_client(app)
    await ready(client)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}}
    opened = await client.post("/servers/demo/mcp", json=init, headers={**AUTH, "Accept": "application/json"})
    assert opened.status == 200
    session = {**AUTH, "Accept": "application/json", "Mcp-Session-Id": opened.headers["Mcp-Session-Id"]}

    async def tools() -> set[str]:
        listed = await client.post("/servers/demo/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=session)
        return {t["name"] for t in (await listed.json())["result"]["tools"]}

    assert "echo" in await tools()
    old = app[LIVE].config
    new = from_dict(
        {"servers": {"demo": {**demo()}}, "security": {"tokens": [{"name": "ops", "token": TOKEN, "tools": {"demo": {"deny": ["echo"]}}}]}}
    )
    assert new.servers == old.servers  # the server is unchanged: its session stays open
    await apply_config(app, new)
    assert "echo" not in await tools()
    assert len(app[GATEWAYS]["demo"].sessions) == 1


async def test_a_400_for_a_request_whose_id_could_be_read_carries_that_id(aiohttp_client: Any, bridge: Any) -> None:
    """JSON-RPC: the error answers the request's id when it could be read, else null. The
    same on aiohttp's path (in-process here) and on the fast path (the daemon below)."""
    bad = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": ["not", "an", "object"]}
    app = create_app(config())
    client = await aiohttp_client(app)
    await ready(client)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}}
    opened = await client.post("/servers/demo/mcp", json=init, headers={**AUTH, "Accept": "application/json"})
    session = {**AUTH, "Accept": "application/json", "Mcp-Session-Id": opened.headers["Mcp-Session-Id"]}
    answered = await client.post("/servers/demo/mcp", json=bad, headers=session)
    assert answered.status == 400 and (await answered.json())["id"] == 7
    unreadable = await client.post("/servers/demo/mcp", data=b"{not json", headers=session)
    assert unreadable.status == 400 and (await unreadable.json())["id"] is None
    async with bridge({"servers": {"demo": demo()}}) as b, RawSse(b.url("demo")) as c:
        await c.initialize()
        status, body = await c.post(bad)
        assert status == 400 and json.loads(body)["id"] == 7
