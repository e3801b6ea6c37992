"""Interop: `@modelcontextprotocol/server-memory` (Node.js, pinned in tests/node/package.json)
in shared mode, a server written for one client at a time, and `max_concurrent_calls`.

Its tools read the whole knowledge graph from a file, change it and write it all
back, with no lock: calls that overlap lose each other's writes (and may read a
file half written). With `max_concurrent_calls: 1` the bridge writes one call at a
time to it, whoever sends them; without, entities are lost.

Needs `npm ci --prefix tests/node` (and Node.js); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client as ModernClient
from support.daemon import ROOT
from support.metrics import scrape
from support.sdk import connect

NODE_DIR = ROOT / "tests" / "node"
MEMORY_JS = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "server-memory" / "dist" / "index.js"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(NODE is None, reason="Node.js is not installed"),
    pytest.mark.skipif(not MEMORY_JS.exists(), reason="server-memory is not installed: run `npm ci --prefix tests/node`"),
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

SESSIONS = 20
TRANSPORTS = ("sse", "streamable", "2026-07-28")  # session i uses TRANSPORTS[i % 3]


def config(memory_file: Path, cap: int | None, mode: str = "shared") -> dict[str, Any]:
    server: dict[str, Any] = {
        "command": NODE,
        "args": [str(MEMORY_JS)],
        "env": {"MEMORY_FILE_PATH": str(memory_file)},
        "mode": mode,
        "shutdown_timeout": "1s",
    }
    if cap is not None:
        server["max_concurrent_calls"] = cap
    return {"servers": {"memory": server}}


def entity(name: str) -> dict[str, Any]:
    return {"entities": [{"name": name, "entityType": "test", "observations": [f"made by {name}"]}]}


def names_in(result: types.CallToolResult) -> set[str]:
    """The entity names in a tool result (create_entities' list, or a graph's `entities`);
    a tool error (a half-written file read back) names none."""
    if result.is_error:
        return set()
    text = "".join(block.text for block in result.content if isinstance(block, types.TextContent))
    data = json.loads(text)
    items = data if isinstance(data, list) else data.get("entities", [])
    return {item["name"] for item in items}


@contextlib.asynccontextmanager
async def session(url_of: dict[str, str], transport: str) -> Any:
    """Something with `call_tool(name, arguments)`: an SDK session over HTTP+SSE or Streamable
    HTTP, or the 2026-07-28 client (each call a request of its own)."""
    if transport == "2026-07-28":
        async with ModernClient(url_of["mcp"], mode="2026-07-28", read_timeout_seconds=30) as modern:
            yield modern
    else:
        async with connect(url_of["mcp" if transport == "streamable" else "sse"], streamable=transport == "streamable") as client:
            yield client.session


async def create_and_read(url_of: dict[str, str], round_: str) -> dict[str, bool]:
    """SESSIONS sessions at once, each creating its own entity and then reading it back:
    for each name, whether the session saw its entity."""
    barrier = asyncio.Barrier(SESSIONS)

    async def one(i: int) -> tuple[str, bool]:
        name = f"{round_}-e{i}"
        async with session(url_of, TRANSPORTS[i % len(TRANSPORTS)]) as s:
            async with asyncio.timeout(30):
                await barrier.wait()
                await s.call_tool("create_entities", entity(name))
                read = await s.call_tool("open_nodes", {"names": [name]})
        return name, name in names_in(read)

    async with asyncio.timeout(120), asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(i)) for i in range(SESSIONS)]
    return dict(t.result() for t in tasks)


async def graph(url_of: dict[str, str]) -> set[str]:
    async with connect(url_of["sse"]) as client:
        return names_in(await client.session.call_tool("read_graph", {}))


def file_names(memory_file: Path) -> set[str]:
    return {json.loads(line)["name"] for line in memory_file.read_text().splitlines() if '"type":"entity"' in line}


# Per principal (no tokens: one principal, one process for all its sessions) the cap is the process's.
@pytest.mark.parametrize("mode", ["shared", "per-principal"])
async def test_one_call_at_a_time_loses_no_entity_of_twenty_concurrent_sessions(bridge, tmp_path, mode):
    memory_file = tmp_path / "memory.jsonl"
    async with bridge(config(memory_file, cap=1, mode=mode)) as b:
        url_of = {"sse": b.url("memory"), "mcp": b.url("memory", "mcp")}
        seen = await create_and_read(url_of, "capped")
        assert all(seen.values()), f"sessions that did not read back their own entity: {[n for n, ok in seen.items() if not ok]}"
        assert await graph(url_of) == set(seen) == file_names(memory_file)
        m = await scrape(b)
        # Every call went through the cap (the sessions' 40, the graph's, the SDKs' tools/list), and calls waited.
        assert m.get("mcp_bridge_call_queue_wait_seconds_count", server="memory") >= 2 * SESSIONS + 1  # type: ignore[operator]
        assert m.get("mcp_bridge_call_queue_wait_seconds_sum", server="memory") > 0  # type: ignore[operator]
        assert m.get("mcp_bridge_calls_waiting", server="memory") == 0


async def test_without_the_cap_concurrent_sessions_lose_entities(bridge, tmp_path):
    """What the cap is for: the same sessions with no cap lose entities (the server's own
    read-modify-write race). Up to three rounds, each with names of its own, until one loses any."""
    lost: list[int] = []
    async with bridge(config(tmp_path / "memory.jsonl", cap=None)) as b:
        url_of = {"sse": b.url("memory"), "mcp": b.url("memory", "mcp")}
        for round_ in range(3):
            seen = await create_and_read(url_of, f"free{round_}")
            kept = await graph(url_of) & set(seen)
            lost.append(SESSIONS - len(kept))
            if lost[-1]:
                break
        m = await scrape(b)
        assert m.get("mcp_bridge_call_queue_wait_seconds_count", server="memory") == 0  # no cap: nothing observed
    assert lost[-1] > 0, f"no entity lost in {len(lost)} rounds of {SESSIONS} concurrent sessions: {lost}"
