"""The 2024-11-05 HTTP+SSE transport.

`GET /servers/{name}/sse` opens a session: the first event, `endpoint`, names
the URL to POST to; every message for the session follows as a `message`
event. `POST /servers/{name}/messages?session_id=...` takes one JSON-RPC
message or a batch and answers 202; replies come on the stream. The stream
is the session: when it closes, the session ends.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from typing import Any

from aiohttp import web

from bridge.gateway.sessions import Served, Session
from bridge.http import body, state, streams, traced
from bridge.http.errors import HttpError
from bridge.protocol.jsonrpc import RequestId

_EVENT = b"event: message\ndata: "
_END = b"\n\n"
_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)*")


class SseSession(Session):
    """Writes its events straight to the client's socket, with no task in between.

    The gateway calls `deliver` for each message and `flush` once it has
    routed everything one batch of server output produced, so that a burst
    of messages for a session goes out in one write. A message counts as
    queued from delivery until the socket has taken all of it (what is
    written but still in the transport's buffer is tracked by offset): more
    than `queue_limit` of those, or more than `queue_bytes` not yet taken by
    the socket, and the client is too slow.
    """

    transport = "sse"

    def __init__(self, server: str, owner: str | None, queue_limit: int, queue_bytes: int) -> None:
        super().__init__(server, owner)
        self._limit = queue_limit
        self._byte_limit = queue_bytes
        self._parts: list[bytes] = []  # framed events not yet written
        self._waiting = 0  # events in _parts
        self._waiting_bytes = 0  # bytes of the messages in _parts
        self._written = 0  # bytes handed to the transport, ever
        self._unsent: deque[tuple[int, int]] = deque()  # (offset their write ends at, events): not yet taken
        self._queued = 0  # events in _unsent
        self._out: asyncio.Transport | None = None
        self._chunked = True
        self._ended: asyncio.Future[None] | None = None

    def attach(self, out: asyncio.Transport, chunked: bool) -> None:
        """Start writing to `out` (the stream's headers are sent); what was delivered before goes first."""
        self._out, self._chunked = out, chunked
        self._written = out.get_write_buffer_size()  # the headers and the endpoint event, if still there
        self.flush()

    async def wait_ended(self) -> None:
        if not self.ended:
            self._ended = asyncio.get_running_loop().create_future()
            await self._ended

    def deliver(self, data: bytes, related: RequestId | None, final: bool) -> bool:
        self._parts += (_EVENT, data, _END)
        self._waiting += 1
        self._waiting_bytes += len(data)
        out = self._out
        if self._waiting_bytes + (out.get_write_buffer_size() if out is not None else 0) > self._byte_limit:
            return False
        return self._waiting + self._queued <= self._limit or self._waiting + self._taken() <= self._limit

    def flush(self) -> None:
        out = self._out
        if not self._parts or out is None:
            return
        if out.is_closing():
            self._parts.clear()
            self._waiting_bytes = 0
            return
        parts = self._parts
        if self._chunked:
            parts = [b"%x\r\n" % sum(map(len, parts)), *parts, b"\r\n"]
        data = b"".join(parts)
        out.write(data)
        self._written += len(data)
        if self._waiting:
            self._unsent.append((self._written, self._waiting))
            self._queued += self._waiting
        self._taken()
        self._parts = []
        self._waiting = 0
        self._waiting_bytes = 0

    def _taken(self) -> int:
        """Forget the writes the socket has taken whole; the events still queued."""
        out = self._out
        if out is None:
            return self._queued
        taken_to = self._written - out.get_write_buffer_size()
        unsent = self._unsent
        while unsent and unsent[0][0] <= taken_to:
            self._queued -= unsent.popleft()[1]
        return self._queued

    def attached(self) -> bool:
        return not self.ended

    def keepalive(self) -> None:
        self._parts.append(streams.PING)
        self.flush()

    def end(self, reason: str) -> None:
        super().end(reason)
        if reason == "slow" and self._out is not None:
            # Its socket is not being read; only an abort frees what is queued for it.
            self._out.abort()
        else:
            self.flush()
        self._out = None  # aiohttp ends the response; nothing more may go to that connection
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)


async def stream(request: web.Request) -> web.StreamResponse:
    gateway = state.gateway_for(request)
    limits = gateway.limits
    session = SseSession(gateway.name, state.principal(request), limits.session_queue, limits.slow_bytes)
    try:
        await state.open_session(gateway, session)
    except asyncio.CancelledError:
        return web.StreamResponse()  # the client left while waiting for a process (returned: see below)
    response = web.StreamResponse()
    reason = "client disconnected"
    try:
        response = await streams.open_stream(request)
        endpoint = f"{_forwarded_prefix(request)}{gateway.path}/messages?session_id={session.id}"
        # Through aiohttp, so that the headers go out with it; then events go to the socket directly.
        await response.write(b"event: endpoint\ndata: " + endpoint.encode() + _END)
        if request.transport is not None:
            session.attach(request.transport, response.headers.get("Transfer-Encoding") == "chunked")
        await session.wait_ended()
        reason = session.end_reason or "ended"
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away (aiohttp cancels the handler when the connection drops).
        # Return rather than re-raise: a task that ends cancelled keeps the exception,
        # whose traceback holds this frame, and with it the session, in a cycle.
        pass
    finally:
        gateway.close_session(session, reason)
    return response


def _forwarded_prefix(request: web.Request) -> str:
    """The path a proxy mounts the bridge under (`X-Forwarded-Prefix`), so that the
    endpoint a client is told to POST to goes through the same proxy. It only
    changes what this client is told, so a client sending it can only mislead itself."""
    prefix = request.headers.get("X-Forwarded-Prefix", "").rstrip("/")
    return prefix if _PREFIX.fullmatch(prefix) else ""


async def post_message(request: web.Request) -> web.Response:
    gateway = state.gateway_for(request)
    session = posted_session(gateway, request.query.get("session_id") or request.query.get("sessionId"), state.principal(request))
    payload = await body.read_message(request, gateway)
    if gateway.traces is not None:
        session.http_trace = traced.span_of(request)
    take(gateway, session, payload)
    return web.Response(status=202, text="Accepted")


# The two steps of a message POST, shared with the fast path (see fastpath.py).


def posted_session(gateway: Served, session_id: str | None, principal: str | None) -> Session:
    """The session a POST names, or 404: unknown, ended, another transport's, or another token's."""
    session = gateway.session(session_id, principal)
    if session is None or session.transport != SseSession.transport:
        raise HttpError(404, "unknown session")
    return session


def take(gateway: Served, session: Session, payload: Any) -> None:
    if session.ended:  # while its body was arriving
        raise HttpError(404, "unknown session")
    state.route(gateway, session, payload)
