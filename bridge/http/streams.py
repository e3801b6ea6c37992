"""An SSE response's headers and keep-alive, and the bound on bytes a stalled client leaves unread."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

# One gateway task writes keepalive comments for every stream (see Gateway), rather than
# a timer task per connection as aiohttp-sse does: at 10,000 sessions those tasks cost
# memory and CPU, and each cancelled one left a reference cycle behind.
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
}


PING = b": ping\n\n"


def event(data: bytes) -> bytes:
    """One JSON-RPC message as an SSE `message` event."""
    return b"event: message\ndata: %s\n\n" % data


# A peer that stops acknowledging (gone without a reset) is dropped after this long,
# instead of after the kernel's default of about 15 minutes of retransmissions.
UNACKED_TIMEOUT_MS = 120_000


def limit_unacked(transport: asyncio.BaseTransport) -> None:
    """Drop the connection when the peer stops acknowledging for UNACKED_TIMEOUT_MS."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKED_TIMEOUT_MS)


async def open_stream(request: web.Request, extra_headers: dict[str, str] | None = None) -> web.StreamResponse:
    """Send the headers of an SSE stream and return the response to write events to."""
    if request.transport is not None:
        limit_unacked(request.transport)
    response = web.StreamResponse(headers={**SSE_HEADERS, **(extra_headers or {})})
    await response.prepare(request)
    return response
