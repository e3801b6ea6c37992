"""A stdio MCP server whose tools and prompts come from a JSON file a test edits, for the
pinning tests: `python tests/servers/pinned.py FILE`.

FILE holds `{"tools": [...], "prompts": [...], "unlisted": [names]}` (`unlisted`: tools it
answers but never lists, as a server that hides one does) and is read again at every request, so a
test changes what the server offers by writing it, then restarting the server or calling
the tool `changed` (which sends `notifications/tools/list_changed` and
`notifications/prompts/list_changed`, as a server that rewrites itself at run time does).
Each tool of the file answers `NAME: ARGUMENTS as JSON`; a name it does not offer is
answered -32602 `Unknown tool: NAME`, as the official SDKs do. Stdlib only.
"""

from __future__ import annotations

import json
import sys
from typing import Any

VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
CHANGED = {"name": "changed", "description": "Say that the lists changed.", "inputSchema": {"type": "object"}}


def offered() -> dict[str, list[dict[str, Any]]]:
    with open(sys.argv[1], encoding="utf-8") as f:
        data: dict[str, list[dict[str, Any]]] = json.load(f)
    return data


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(msg: dict[str, Any]) -> dict[str, Any]:
    method, params = msg["method"], msg.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
            "capabilities": {"tools": {"listChanged": True}, "prompts": {"listChanged": True}},
            "serverInfo": {"name": "pinned", "version": "1"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": [*offered().get("tools", []), CHANGED]}
    if method == "prompts/list":
        return {"prompts": offered().get("prompts", [])}
    if method == "tools/call":
        name = params.get("name")
        if name == "changed":
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            send({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"})
            return {"content": [{"type": "text", "text": "changed"}]}
        if any(tool.get("name") == name for tool in offered().get("tools", [])) or name in offered().get("unlisted", []):
            return {"content": [{"type": "text", "text": f"{name}: {json.dumps(params.get('arguments') or {}, sort_keys=True)}"}]}
        raise LookupError(f"Unknown tool: {name}")
    if method == "prompts/get":
        name = params.get("name")
        if any(prompt.get("name") == name for prompt in offered().get("prompts", [])):
            return {"messages": [{"role": "user", "content": {"type": "text", "text": f"prompt {name}"}}]}
        raise LookupError(f"Unknown prompt: {name}")
    raise NotImplementedError(f"Method not found: {method}")


def main() -> None:
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
            continue
        try:
            send({"jsonrpc": "2.0", "id": msg["id"], "result": answer(msg)})
        except LookupError as exc:
            send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32602, "message": str(exc)}})
        except NotImplementedError as exc:
            send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": str(exc)}})


if __name__ == "__main__":
    main()
