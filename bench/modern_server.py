"""A 2026-07-28 (stateless) Streamable HTTP server with bench/server.py's two tools, on the official Python SDK.

The reference the load generator's `stateless` mode is checked against before
any bridge serves that revision: `echo {text}` returns `text`, `blob {size,
tag?}` a text of exactly `size` bytes, `tag` first, padded with `x`. Built on
`mcp` 2.3.0 (`MCPServer.streamable_http_app`, served by uvicorn), which answers
2026-07-28 requests as single exchanges and 2025 sessions as before.

    python -m bench.modern_server --port 8931      # then POST to http://127.0.0.1:8931/mcp

It prints `listening <port>` on stdout once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvicorn
from mcp.server.mcpserver import MCPServer

MAX_BLOB = 64 * 1024 * 1024
MAX_BODY = 8 * 1024 * 1024  # room for workload e's 1 MiB texts

server = MCPServer("bench-modern")


@server.tool()
def echo(text: str) -> str:
    """Returns its text."""
    return text


@server.tool()
def blob(size: int, tag: str = "") -> str:
    """Returns a text of size bytes (tag first, padded with x)."""
    if not 0 <= size <= MAX_BLOB or len(tag) > size:
        raise ValueError(f"size must be in [len(tag), {MAX_BLOB}]")
    return tag + "x" * (size - len(tag))


async def serve(port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    app = server.streamable_http_app(json_response=True, max_request_body_size=MAX_BODY)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    task = asyncio.create_task(http.serve(sockets=[sock]))
    while not http.started and not task.done():
        await asyncio.sleep(0.01)
    print(f"listening {sock.getsockname()[1]}", flush=True)
    await task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0, help="loopback port (0: any free one)")
    asyncio.run(serve(p.parse_args().port))


if __name__ == "__main__":
    main()
