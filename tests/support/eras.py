"""Which MCP revisions an endpoint serves, for the tests that wait for the bridge's 2026-07-28 path."""

from __future__ import annotations

import aiohttp

MODERN = "2026-07-28"


async def serves_stateless(url: str) -> str | None:
    """None when `url` answers a 2026-07-28 `server/discover`, else why not (a skip reason)."""
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": MODERN, "Mcp-Method": "server/discover"}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as resp:
        answer = await resp.json(content_type=None) if resp.content_type == "application/json" else None
    error = answer.get("error") if isinstance(answer, dict) else None
    # The 2025-only bridge takes it for a request without its session (-32600); an unknown
    # method (-32601) is as clear a "not yet". Anything else is the new path, to be judged.
    if isinstance(error, dict) and error.get("code") in (-32600, -32601):
        return f"awaits the {MODERN} stateless path: server/discover got HTTP {resp.status} {error}"
    return None
