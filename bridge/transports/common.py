"""What both HTTP transports share: app state keys, SSE framing, sessions, body reading."""

from __future__ import annotations

import asyncio
import socket
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import StreamReader, web

from .. import jsonrpc
from ..config import Config
from ..gateway import Gateway, SessionLimitError
from ..jsonrpc import ProtocolError
from ..metrics import Metrics
from ..policy import Throttled
from ..pool import Slots
from ..principals import OAuthVerifier
from ..security import Guard
from ..sessions import Session
from .http import PRINCIPAL, RETRY_AFTER_S, HttpError


@dataclass(slots=True)
class Live:
    """What a reload replaces: read through this on every request, never cached."""

    config: Config
    guard: Guard
    # Client calls in flight by principal, counted by every mux: outlives reloads.
    in_flight: Counter[str | None] = field(default_factory=Counter)
    processes: Slots = field(default_factory=lambda: Slots(None))  # every server's processes: outlives reloads
    oauth: OAuthVerifier | None = None  # its keys and checked tokens outlive reloads that keep security.oauth
    port: int | None = None  # the one bound, once it is
    draining: bool = False  # SIGTERM: /readyz is 503 from then on (app.drain)


LIVE = web.AppKey("live", Live)
GATEWAYS = web.AppKey("gateways", dict[str, Gateway])
METRICS = web.AppKey("metrics", Metrics)


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


def principal(request: web.Request) -> str | None:
    return request.get(PRINCIPAL)


SSE_ROUTE, MESSAGES_ROUTE, MCP_ROUTE = "/servers/{name}/sse", "/servers/{name}/messages", "/servers/{name}/mcp"
_MESSAGE_ROUTES = frozenset({SSE_ROUTE, MESSAGES_ROUTE, MCP_ROUTE})


def refused(request: web.Request, error: HttpError) -> None:
    """A refusal at a server's MCP endpoint is a JSON-RPC error sent to its client: counted
    (`mcp_bridge_errors_total`) as the fast path counts its own."""
    resource = request.match_info.route.resource
    if resource is not None and resource.canonical in _MESSAGE_ROUTES:
        gateway = request.app[GATEWAYS].get(request.match_info["name"])
        if gateway is not None:
            gateway.metrics.error_sent({"code": error.code})


def gateway_for(request: web.Request) -> Gateway:
    return gateway_named(request.app[GATEWAYS], request.match_info["name"])


def gateway_named(gateways: dict[str, Gateway], name: str) -> Gateway:
    gateway = gateways.get(name)
    if gateway is None:
        raise HttpError(404, f"unknown server {name!r}")
    return gateway


async def open_session(gateway: Gateway, session: Session) -> None:
    """Open `session`, or 503 when the server is full or stopping, or no process came in time."""
    try:
        await gateway.open_session(session)
    except SessionLimitError as exc:
        raise _full(exc) from None


def open_at_once(gateway: Gateway, session: Session) -> bool:
    """Open `session` if its process is at hand, else False (`open_session` waits); 503 as there."""
    try:
        return gateway.open_at_once(session)
    except SessionLimitError as exc:
        raise _full(exc) from None


def _full(exc: SessionLimitError) -> HttpError:
    if exc.retry_after is None:
        return HttpError(503, str(exc), headers={"Retry-After": RETRY_AFTER_S})
    return HttpError(503, str(exc), jsonrpc.SERVER_UNAVAILABLE, {"Retry-After": str(exc.retry_after)})


def check_length(content_length: int | None, gateway: Gateway) -> None:
    """413 before any of the body is read, when its declared length is over the limit."""
    limit = gateway.limits.max_message_bytes
    if content_length is not None and content_length > limit:
        raise HttpError(413, f"body of {content_length} bytes is over the limit of {limit}")


def decode_body(body: bytes, gateway: Gateway) -> Any:
    """The decoded JSON body, or 400 with a one-line reason."""
    gateway.metrics.bytes_in += len(body)
    try:
        return jsonrpc.decode(body)
    except ProtocolError as exc:
        raise HttpError(400, exc.message, exc.code) from None


async def read_message(request: web.Request, gateway: Gateway) -> Any:
    """The decoded JSON body, or 413 / 415 / 400 with a one-line reason."""
    check_length(request.content_length, gateway)
    limit = gateway.limits.max_message_bytes
    if CONTENT_ENCODING in request.headers and (coding := content_coding(request.headers.getall(CONTENT_ENCODING))) is not None:
        return decode_body(await _decompressed(request.content, coding, limit), gateway)
    # Read here rather than with the app's client_max_size, which a reload cannot change.
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"body is over the limit of {limit} bytes")
    return decode_body(chunks[0] if len(chunks) == 1 else b"".join(chunks), gateway)


# Compressed bodies (RFC 9110, 8.4) are decoded here, not by aiohttp (the app is served with
# auto_decompress off), so that every failure is the client's 4xx with its reason (aiohttp's
# was a 500 and two tracebacks), a body that grows past the limit is refused before more of
# it is decompressed, and a forwarded request carries its body as the client sent it.
CONTENT_ENCODING = "Content-Encoding"
_GZIP = 16 + zlib.MAX_WBITS
_CODINGS = {"gzip": _GZIP, "x-gzip": _GZIP, "deflate": zlib.MAX_WBITS}  # the zlib window bits that read each
ACCEPTED_CODINGS = "gzip, deflate"  # what a 415 offers (Accept-Encoding, RFC 9110, 12.5.3)
MAX_GZIP_MEMBERS = 64  # a gzip body may be several members end to end (RFC 1952, 2.2)


def content_coding(fields: list[str]) -> str | None:
    """The one coding the Content-Encoding fields name (None: identity), or 415 for any
    other, or for more than one."""
    named = (c.strip(" \t").lower() for field in fields for c in field.split(","))
    codings = [c for c in named if c not in ("", "identity")]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _CODINGS:
        listed = ", ".join(codings)[:60]
        raise HttpError(415, f"unsupported Content-Encoding {listed!r}: a body may be gzip or deflate", headers={"Accept-Encoding": ACCEPTED_CODINGS})
    return codings[0]


async def _decompressed(content: StreamReader, coding: str, limit: int) -> bytes:
    """The body decoded from `coding`: 400 (-32700) when it does not decode or ends early, 413
    as soon as the body as sent or what it decodes to is over `limit` bytes."""
    wbits = _CODINGS[coding]
    decoder: zlib._Decompress | None = None
    members = 0
    chunks: list[bytes] = []
    taken = size = 0
    while chunk := await content.readany():
        taken += len(chunk)
        if taken > limit:
            raise HttpError(413, f"body is over the limit of {limit} bytes")
        pending = chunk
        while pending:
            fresh = decoder is None or decoder.eof  # a member begins
            if decoder is None or decoder.eof:
                if decoder is not None and wbits != _GZIP:
                    raise _undecodable(coding, "data after its end")
                members += 1
                if members > MAX_GZIP_MEMBERS:
                    raise _undecodable(coding, f"more than {MAX_GZIP_MEMBERS} gzip members")
                # RFC 1950's header names method 8 (deflate); a body without one is raw deflate.
                raw = wbits == zlib.MAX_WBITS and pending[0] & 0x0F != 8
                decoder = zlib.decompressobj(-zlib.MAX_WBITS if raw else wbits)
            try:
                # At most one byte past the limit: no more of a bomb than that is ever decompressed.
                piece = decoder.decompress(pending, limit + 1 - size)
            except zlib.error as exc:
                reason = str(exc).rpartition(": ")[2]
                raise _undecodable(coding, f"data after its end ({reason})" if fresh and members > 1 else reason) from None
            size += len(piece)
            if size > limit:
                raise HttpError(413, f"body is over the limit of {limit} bytes once decompressed")
            chunks.append(piece)
            # Short of the limit, all the input was taken but what lies past a member's end.
            pending = decoder.unused_data
    if decoder is None or not decoder.eof:
        raise _undecodable(coding, "it ends before its compressed data does")
    return b"".join(chunks)


def _undecodable(coding: str, reason: str) -> HttpError:
    return HttpError(400, f"body does not decode as {coding}: {reason}", jsonrpc.PARSE_ERROR)


def route(gateway: Gateway, session: Session, payload: Any) -> None:
    """Hand a POST's decoded body to the gateway; what it refuses is the POST's answer:
    400 for what is not valid JSON-RPC, 429 for calls over their principal's limits
    (nothing of the body is taken then)."""
    try:
        gateway.from_client(session, payload)
    except ProtocolError as exc:
        raise HttpError(400, exc.message, exc.code, request_id=exc.request_id) from None
    except Throttled as exc:
        raise HttpError(429, exc.reason, jsonrpc.TOO_MANY_REQUESTS, {"Retry-After": str(exc.retry_after)}) from None
