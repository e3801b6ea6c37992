"""The Streamable HTTP transport (2025-03-26, 2025-06-18, 2025-11-25) at `/servers/{name}/mcp`.

A POST carrying requests is answered on its own stream: the responses and
the messages the mux says belong to those requests (progress, server
requests made while they run) go there, as SSE when the client accepts it,
else as one JSON body. Everything else for the session (list_changed,
resources/updated, log messages, server requests with no call in flight)
goes to the session's standalone stream, which one GET at a time may read;
a second GET takes it over and the first ends. Every event has an id
`<stream>_<n>`, and a GET with `Last-Event-ID` replays, from a bounded
per-session buffer, what that stream sent after it, then continues it.

A POST whose body carries the 2026-07-28 `_meta` is no session's: it goes to
`modern.answer` before any of this.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDictProxy

from .. import jsonrpc, stateless
from ..gateway import Gateway
from ..jsonrpc import RequestId
from ..mux import PROTOCOL_VERSIONS
from ..sessions import Session
from . import common, http, modern
from .http import AiohttpSink, EventSink, HttpError

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
DEFAULT_VERSION = "2025-03-26"  # what a request without the header speaks, per the spec
PRIMING_SINCE = "2025-11-25"  # clients from this version on resume from an empty priming event
STANDALONE = "g"


class Stream:
    """One SSE stream of a session: events waiting for a writer, and the requests it still owes."""

    __slots__ = ("generation", "key", "owed", "pending", "pending_bytes", "ping_due", "writers", "_waiter")

    def __init__(self, key: str) -> None:
        self.key = key
        # (sequence number, message, is the response to a request this stream owes)
        self.pending: deque[tuple[int, bytes, bool]] = deque()
        self.pending_bytes = 0  # of the messages in pending
        self.owed: set[RequestId] = set()
        self.generation = 0  # bumped when a writer attaches: older writers stop
        self.writers = 0
        self.ping_due = False
        self._waiter: asyncio.Future[None] | None = None

    def push(self, item: tuple[int, bytes, bool]) -> None:
        self.pending.append(item)
        self.pending_bytes += len(item[1])

    def pop(self) -> tuple[int, bytes, bool]:
        item = self.pending.popleft()
        self.pending_bytes -= len(item[1])
        return item

    def take(self) -> list[tuple[int, bytes, bool]]:
        """Every pending event, for one write."""
        items = list(self.pending)
        self.pending.clear()
        self.pending_bytes = 0
        return items

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            # A writer that replaced this one may already wait on a new future.
            if self._waiter is waiter:
                self._waiter = None


class StreamableSession(Session):
    transport = "streamable"

    def __init__(self, server: str, owner: str | None, queue_limit: int, queue_bytes: int, replay_bytes: int) -> None:
        super().__init__(server, owner)
        self.protocol_version = DEFAULT_VERSION
        self.streams: dict[str, Stream] = {STANDALONE: Stream(STANDALONE)}
        self.by_request: dict[RequestId, Stream] = {}
        self._queue_limit = queue_limit
        self._queue_bytes = queue_bytes
        self._seq = 0
        self._posts = 0
        self._replay: deque[tuple[int, str, bytes]] = deque()
        self._replay_size = 0
        self._replay_limit = replay_bytes

    # Called by the gateway.

    def deliver(self, data: bytes, related: RequestId | None, final: bool) -> bool:
        stream = self.by_request.get(related) if related is not None else None
        response = stream is not None and final
        if stream is None:
            stream = self.streams[STANDALONE]
        elif final and related is not None:
            del self.by_request[related]
            stream.owed.discard(related)
            if not stream.owed and not stream.writers and stream.key != STANDALONE:
                self.streams.pop(stream.key, None)  # its POST is gone; a resume replays from the buffer
        self._seq += 1
        self._remember(self._seq, stream.key, data)
        limit, byte_limit = self._queue_limit - 1, self._queue_bytes - len(data)  # room for this one
        if len(stream.pending) > limit or stream.pending_bytes > byte_limit:
            if stream.writers:
                return False  # a reader is attached and not keeping up
            while stream.pending and (len(stream.pending) > limit or stream.pending_bytes > byte_limit):
                stream.pop()  # nobody listening: keep the newest, the rest is in the replay buffer
        stream.push((self._seq, data, response))
        stream.wake()
        return True

    def attached(self) -> bool:
        return any(stream.writers for stream in self.streams.values())

    def keepalive(self) -> None:
        for stream in self.streams.values():
            if stream.writers:
                stream.ping_due = True
                stream.wake()

    def end(self, reason: str) -> None:
        super().end(reason)
        for stream in self.streams.values():
            stream.wake()

    # Called by the handlers.

    def open_post_stream(self, request_ids: list[RequestId]) -> Stream:
        self._posts += 1
        stream = Stream(f"p{self._posts}")
        stream.owed.update(request_ids)
        self.streams[stream.key] = stream
        for rid in request_ids:
            self.by_request[rid] = stream
        return stream

    def close_post_stream(self, stream: Stream) -> None:
        """The POST handler is done; a stream that still owes responses stays for a resuming GET."""
        if not stream.owed and self.streams.get(stream.key) is stream:
            del self.streams[stream.key]

    def owes(self, request_id: RequestId) -> bool:
        return request_id in self.by_request

    def event_id(self, stream: Stream, seq: int) -> str:
        return f"{stream.key}_{seq}"  # what `_event` writes, and `_parse_event_id` reads back

    def mark(self) -> int:
        return self._seq

    def replay(self, key: str, after: int) -> list[tuple[int, bytes, bool]]:
        return [(seq, data, False) for seq, k, data in self._replay if k == key and seq > after]

    def _remember(self, seq: int, key: str, data: bytes) -> None:
        if len(data) > self._replay_limit:
            return
        self._replay.append((seq, key, data))
        self._replay_size += len(data)
        while self._replay_size > self._replay_limit:
            self._replay_size -= len(self._replay.popleft()[2])


# ------------------------------------------------------------------ handlers


class Reply(Protocol):
    """How the answer to a POST goes out: through aiohttp, or straight to the fast path's connection."""

    def accepted(self, session_id: str) -> Any: ...

    def json(self, body: bytes, session_id: str) -> Any: ...

    def plain(self, status: int, body: bytes) -> Any:
        """A whole answer with no session: a JSON body, or none (202)."""

    async def open_stream(self, session_id: str | None, first: bytes = b"") -> EventSink:
        """Start the stream; `first`, when given, is an event due at once (the priming
        event), sent with the head."""

    @property
    def gone(self) -> bool: ...

    def request_headers(self) -> Mapping[str, str]: ...

    def abort(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PostHead:
    """What a POST's handling reads from its request, besides the body."""

    gateway: Gateway
    principal: str | None
    session_id: str | None
    version: str | None
    accept: str
    resume_buffer: int
    mirrored: stateless.Headers  # what 2026-07-28 requests mirror of their body in headers
    parking: modern.Parking


class _AiohttpReply:
    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._stream: web.StreamResponse | None = None

    def accepted(self, session_id: str) -> web.Response:
        return web.Response(status=202, headers={SESSION_HEADER: session_id})

    def json(self, body: bytes, session_id: str) -> web.Response:
        return web.Response(body=body, content_type=http.JSON, headers={SESSION_HEADER: session_id})

    def plain(self, status: int, body: bytes) -> web.Response:
        return web.Response(status=status, body=body, content_type=http.JSON) if body else web.Response(status=status)

    async def open_stream(self, session_id: str | None, first: bytes = b"") -> AiohttpSink:
        self._stream = await common.open_stream(self._request, {SESSION_HEADER: session_id} if session_id else None)
        sink = AiohttpSink(self._request, self._stream)
        if first:
            await sink.write(first)
        return sink

    @property
    def gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    def request_headers(self) -> CIMultiDictProxy[str]:
        return self._request.headers

    def abort(self) -> None:
        if self._request.transport is not None:
            self._request.transport.close()

    def streamed(self) -> web.StreamResponse:
        """The stream it answered with; aiohttp wants a response object even when the client
        went before the stream opened."""
        return self._stream or web.StreamResponse()


async def post(request: web.Request) -> web.StreamResponse:
    gateway = common.gateway_for(request)
    payload = await common.read_message(request, gateway)
    headers = request.headers
    head = PostHead(
        gateway,
        common.principal(request),
        headers.get(SESSION_HEADER),
        headers.get(VERSION_HEADER),
        headers.get("Accept", ""),
        request.app[common.LIVE].config.streamable.resume_buffer,
        _mirrored(headers),
        request.app[modern.PARKING],
    )
    reply = _AiohttpReply(request)
    answer: web.StreamResponse | None = await answer_post(head, payload, reply)
    return answer if answer is not None else reply.streamed()


async def answer_post(head: PostHead, payload: Any, reply: Reply) -> Any:
    """Route a decoded POST body and answer it: 202, one JSON body (what `reply` returns
    for those), or a stream of events (None)."""
    gateway = head.gateway
    if stateless.is_modern(payload):
        return await modern.answer(head, payload, reply)
    messages = payload if payload.__class__ is list else [payload]
    if not messages:
        raise HttpError(400, "invalid request: empty batch")
    request_ids = [m["id"] for m in messages if m.__class__ is dict and "method" in m and jsonrpc.is_id(m.get("id"))]
    as_stream = bool(request_ids) and _answer_as_stream(head.accept)  # before anything is opened or routed
    if head.session_id is None:
        if not any(m.__class__ is dict and m.get("method") == "initialize" for m in messages):
            if request_ids and payload.__class__ is dict:
                # One request with no session that is not initialize: only 2026-07-28 sends
                # those, so it is one (whose envelope is missing: -32602, as its clients expect).
                return await modern.answer(head, payload, reply)
            raise HttpError(400, f"missing {SESSION_HEADER} header (only initialize may come without one)")
        session = await _open(head)
    else:
        try:
            session = _session(gateway, head.principal, head.session_id)
            _check_version(head.version)
        except HttpError as exc:
            exc.request_id = request_ids[0] if len(request_ids) == 1 and payload.__class__ is dict else None
            raise
    if any(session.owes(rid) for rid in request_ids):
        raise HttpError(400, "invalid request: a request id in this body is already in flight", jsonrpc.INVALID_REQUEST)
    if not request_ids:
        _route(gateway, session, payload, head.session_id is None)
        return reply.accepted(session.id)
    stream = session.open_post_stream(request_ids)
    primed = session.mark()  # before routing: a reply the mux makes at once comes after it
    try:
        _route(gateway, session, payload, head.session_id is None)
        if as_stream:
            prime = primed if head.session_id is not None and session.protocol_version >= PRIMING_SINCE else None
            await _stream_response(reply, session, stream, replay_after=None, prime=prime)
            return None
        return reply.json(await _json_body(session, stream, payload.__class__ is list), session.id)
    finally:
        session.close_post_stream(stream)
        if head.session_id is None:
            _after_initialize(gateway, session)


async def get(request: web.Request) -> web.StreamResponse:
    gateway = common.gateway_for(request)
    accept = request.headers.get("Accept")
    if accept and not http.quality(accept, http.SSE):
        raise HttpError(406, "GET needs Accept: text/event-stream")
    session_id = _session_header(request)
    session = _session(gateway, common.principal(request), session_id)
    _check_version(request.headers.get(VERSION_HEADER))
    resume = request.headers.get("Last-Event-ID")
    key, last = _parse_event_id(resume)
    stream = session.streams.get(key)
    if stream is None:
        stream = Stream(key)  # it has ended: replay what it sent after `last`, then end
    reply = _AiohttpReply(request)
    await _stream_response(reply, session, stream, replay_after=last if resume else None, prime=None)
    return reply.streamed()


async def delete(request: web.Request) -> web.Response:
    gateway = common.gateway_for(request)
    session = _session(gateway, common.principal(request), _session_header(request))
    _check_version(request.headers.get(VERSION_HEADER))
    gateway.close_session(session, "client ended session")
    return web.Response(status=204)


# ------------------------------------------------------------------- helpers


def _session_header(request: web.Request) -> str:
    """The session a GET or DELETE names; with none, 405: 2026-07-28 has only POST."""
    session_id = request.headers.get(SESSION_HEADER)
    if session_id is None:
        raise HttpError(405, f"{request.method} needs an {SESSION_HEADER} header (2026-07-28 requests are POSTs)", headers={"Allow": "POST"})
    return session_id


_MIRRORING = ("MCP-Protocol-Version", "Mcp-Method", "Mcp-Name")


def _mirrored(headers: CIMultiDictProxy[str]) -> stateless.Headers:
    repeated = next((name for name in _MIRRORING if len(headers.getall(name, ())) > 1), None)
    params: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith("mcp-param-"):
            if lower[10:] in params:
                repeated = name
            params[lower[10:]] = value
    return stateless.Headers(headers.get(VERSION_HEADER), headers.get("Mcp-Method"), headers.get("Mcp-Name"), params, repeated)


async def _open(head: PostHead) -> StreamableSession:
    gateway = head.gateway
    limits = gateway.limits
    session = StreamableSession(gateway.name, head.principal, limits.session_queue, limits.slow_bytes, head.resume_buffer)
    await common.open_session(gateway, session)
    return session


def _session(gateway: Gateway, principal: str | None, session_id: str) -> StreamableSession:
    session = gateway.session(session_id, principal)
    if session is None or not isinstance(session, StreamableSession):
        raise HttpError(404, "unknown session")
    return session


def _check_version(version: str | None) -> None:
    if version is not None and version not in PROTOCOL_VERSIONS:
        raise HttpError(400, f"unsupported {VERSION_HEADER}: {version!r} (supported: {', '.join(PROTOCOL_VERSIONS)})")


def _route(gateway: Gateway, session: StreamableSession, payload: Any, initializing: bool) -> None:
    try:
        common.route(gateway, session, payload)
    except HttpError:
        if initializing:
            gateway.close_session(session, "invalid initialize")
        raise


def _after_initialize(gateway: Gateway, session: StreamableSession) -> None:
    """Keep the session only if its initialize succeeded; remember the version it speaks."""
    version = gateway.negotiated_version(session)
    if version is None:
        gateway.close_session(session, "initialize failed")
    else:
        session.protocol_version = version


def _answer_as_stream(accept: str) -> bool:
    """Whether a POST's answer is a stream of events, by its Accept: the one it prefers (a
    tie goes to the stream); one JSON body when it sends none; 406 when it takes neither."""
    if not accept:
        return False
    sse, json = http.quality(accept, http.SSE), http.quality(accept, http.JSON)
    if not sse and not json:
        raise HttpError(406, f"POST needs Accept: {http.JSON} or {http.SSE}")
    return bool(sse) and sse >= json


def _parse_event_id(value: str | None) -> tuple[str, int]:
    if value:
        key, _, seq = value.rpartition("_")
        if key and seq.isdigit():
            return key, int(seq)
    return STANDALONE, 0


async def _json_body(session: StreamableSession, stream: Stream, batch: bool) -> bytes:
    """Wait for the responses this POST owes; anything else it carries goes to the standalone stream."""
    responses: list[bytes] = []
    standalone = session.streams[STANDALONE]
    while True:
        while stream.pending:
            item = stream.pop()
            if item[2]:
                responses.append(item[1])
            else:
                standalone.push(item)
                standalone.wake()
        if not stream.owed or session.ended:
            break
        await stream.wait()
    if not responses:
        raise HttpError(503, "session ended before the response")
    return b"[" + b",".join(responses) + b"]" if batch else responses[0]


async def _stream_response(
    reply: Reply, session: StreamableSession, stream: Stream, *, replay_after: int | None, prime: int | None
) -> None:
    """Write `stream` as SSE until its last response is sent, the session ends, another
    writer takes over, or the client goes."""
    stream.generation += 1
    generation = stream.generation
    stream.writers += 1
    stream.wake()  # a writer this one replaces sees the new generation and ends
    last = 0
    try:
        priming = b"" if prime is None else f"id: {session.event_id(stream, prime)}\ndata: \n\n".encode()
        sink = await reply.open_stream(session.id, priming)
        if replay_after is not None:
            last = replay_after
            for seq, data, _ in session.replay(stream.key, replay_after):
                await sink.write(_event(stream, seq, data))
                last = seq
        while stream.generation == generation and not sink.gone:
            while stream.pending and stream.pending[0][0] <= last:
                stream.pop()
            if stream.pending:
                batch = stream.take()
                await sink.write(b"".join([_event(stream, seq, data) for seq, data, _ in batch]))
                last = batch[-1][0]
            elif stream.ping_due:
                stream.ping_due = False
                await sink.write(common.PING)
            elif session.ended or (not stream.owed and stream.key != STANDALONE):
                break  # a POST stream ends after its last response
            else:
                await stream.wait()
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away; what is unsent stays for a resuming GET. Return rather
        # than re-raise, so that no cancelled task keeps this frame in a cycle.
        pass
    finally:
        stream.writers -= 1


def _event(stream: Stream, seq: int, data: bytes) -> bytes:
    return b"id: %s_%d\nevent: message\ndata: %s\n\n" % (stream.key.encode(), seq, data)
