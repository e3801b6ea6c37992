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
from typing import Any

from aiohttp import web

from ..gateway import Gateway, SessionLimitError
from ..jsonrpc import ProtocolError, RequestId
from ..sessions import Outbox, Session
from . import common

_EVENT = b"event: message\ndata: "
_END = b"\n\n"
RETRY_AFTER_S = "5"
_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)*")


class SseSession(Session):
    transport = "sse"

    def __init__(self, server: str, owner: str | None, queue_limit: int) -> None:
        super().__init__(server, owner)
        self.outbox: Outbox[bytes] = Outbox(queue_limit)
        self._request: web.Request | None = None

    def deliver(self, data: bytes, related: RequestId | None, final: bool) -> bool:
        return self.outbox.put(data)

    def attached(self) -> bool:
        return not self.ended

    def keepalive(self) -> None:
        self.outbox.put(common.PING)

    def end(self, reason: str) -> None:
        super().end(reason)
        self.outbox.close()
        if reason == "slow" and self._request is not None and self._request.transport is not None:
            # Its writer may be blocked on a full socket; only an abort frees it.
            self._request.transport.abort()


async def stream(request: web.Request) -> web.StreamResponse:
    gateway = common.gateway_for(request)
    session = SseSession(gateway.name, common.principal(request), gateway.limits.session_queue)
    try:
        gateway.open_session(session)
    except SessionLimitError as exc:
        common.fail(503, str(exc), headers={"Retry-After": RETRY_AFTER_S})
    session._request = request
    response = web.StreamResponse()
    reason = "client disconnected"
    try:
        response = await common.open_stream(request)
        endpoint = f"{_forwarded_prefix(request)}/servers/{gateway.name}/messages?session_id={session.id}"
        await response.write(b"event: endpoint\ndata: " + endpoint.encode() + _END)
        while (batch := await session.outbox.get_batch()) is not None:
            await response.write(b"".join([d if d is common.PING else _EVENT + d + _END for d in batch]))
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
    gateway = common.gateway_for(request)
    session = posted_session(gateway, request.query.get("session_id") or request.query.get("sessionId"), common.principal(request))
    take(gateway, session, await common.read_message(request, gateway))
    return web.Response(status=202, text="Accepted")


# The two steps of a message POST, shared with the fast path (see fastpath.py).


def posted_session(gateway: Gateway, session_id: str | None, principal: str | None) -> Session:
    """The session a POST names, or 404: unknown, ended, another transport's, or another token's."""
    session = gateway.session(session_id, principal)
    if session is None or session.transport != SseSession.transport:
        common.fail(404, "unknown session")
    return session


def take(gateway: Gateway, session: Session, payload: Any) -> None:
    if session.ended:  # while its body was arriving
        common.fail(404, "unknown session")
    try:
        gateway.from_client(session, payload)
    except ProtocolError as exc:
        common.fail(400, exc.message, exc.code)
