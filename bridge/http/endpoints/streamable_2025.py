"""The Streamable HTTP transport (2025-03-26, 2025-06-18, 2025-11-25) at `/servers/{name}/mcp`.

A POST carrying requests is answered on its own stream: the responses and
the messages the mux says belong to those requests (progress, server
requests made while they run) go there, as SSE when the client prefers it,
else as one JSON body. A client that takes both as much gets the form its
answer needs, chosen when the answer is due (HOLD_S): one JSON body when its
responses came first and quickly, else a stream. Everything else for the session (list_changed,
resources/updated, log messages, server requests with no call in flight)
goes to the session's standalone stream, which one GET at a time may read;
a second GET takes it over and the first ends. Every event has an id
`<stream>_<n>`, and a GET with `Last-Event-ID` replays, from a bounded
per-session buffer, what that stream sent after it, then continues it.

A POST whose body carries the 2026-07-28 `_meta` is no session's: the dispatcher
(endpoints/post.py) hands it to `stateless_2026` instead.
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from bridge.gateway.sessions import Served, Session
from bridge.http import state, streams
from bridge.http.aiohttp_reply import AiohttpReply
from bridge.http.endpoints.base import Post
from bridge.http.errors import HttpError
from bridge.http.reply import EventSink, Reply, later
from bridge.protocol import jsonrpc, media
from bridge.protocol.jsonrpc import RequestId
from bridge.protocol.mcp import PROTOCOL_VERSIONS, SESSION_HEADER, VERSION_HEADER

DEFAULT_VERSION = "2025-03-26"  # what a request without the header speaks, per the spec
PRIMING_SINCE = "2025-11-25"  # clients from this version on resume from an empty priming event
STANDALONE = "g"
# A POST that accepts both forms has its answer's form chosen when the answer is first due:
# at the first message for it, or after this long. All its responses there and nothing
# before them: one JSON body, which costs the bridge and the client least (no stream head,
# no chunks, no events to frame and parse). Else an SSE stream: a slow call's client sees its
# stream open this much later, well inside any client's wait for response headers.
HOLD_S = 0.02
_SESSION_VERSIONS = frozenset(PROTOCOL_VERSIONS)  # every request checks: one hash, not four compares


class Stream(msgspec.Struct, eq=False):
    """One SSE stream of a session: events waiting for a reader, and the requests it still owes.
    (A Struct, as Reader: one of each is made per POST, and a Struct is made in C.)"""

    key: str
    # (sequence number, message, is the response to a request this stream owes)
    pending: deque[tuple[int, bytes, bool]] = msgspec.field(default_factory=deque)
    pending_bytes: int = 0  # of the messages in pending
    owed: set[RequestId] = msgspec.field(default_factory=set)
    reader: Reader | None = None  # the HTTP answer reading it now, if any

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


class Reader(msgspec.Struct, eq=False):
    """An HTTP answer reading a stream: its events as SSE (`sink`, once opened), or its
    responses gathered into one JSON body. A POST that takes either is `held` until its
    answer is due (HOLD_S). `done` runs once, when it stops reading."""

    stream: Stream
    reply: Reply
    batch: bool = False  # a JSON answer to a batch is an array
    done: Callable[[], None] | None = None
    sink: EventSink | None = None
    held: bool = False  # its form not chosen yet: in Holds, until it is
    first: bytes = b""  # what a stream opens with after its priming event: the replay
    prime: int | None = None  # the sequence number its priming event names, if it has one
    last: int = 0  # the sequence number of the last event it sent
    responses: list[bytes] = msgspec.field(default_factory=list)

    @property
    def gathers(self) -> bool:
        """Its answer is one JSON body: only responses go to it."""
        return self.sink is None and not self.held


class Holds:
    """The POST answers whose form is not chosen yet, in the order they are due, and one timer
    for them all (rather than one per request): past HOLD_S, each opens its stream. A reader
    whose form was chosen meanwhile (`held` set False) is passed over when its turn comes,
    so that choosing costs nothing here."""

    __slots__ = ("_due", "_loop", "_timer")

    def __init__(self) -> None:
        self._due: deque[tuple[float, StreamableSession, Reader]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, session: StreamableSession, reader: Reader) -> None:
        loop = self._loop = self._loop or asyncio.get_running_loop()
        reader.held = True
        self._due.append((loop.time() + HOLD_S, session, reader))
        if self._timer is None:
            self._timer = loop.call_later(HOLD_S, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        due = self._due
        now = loop.time() + 0.001  # the loop may run a timer a hair before its time: never spin for it
        while due and (due[0][0] <= now or not due[0][2].held):  # past due, or answered meanwhile
            _, session, reader = due.popleft()
            if reader.held:
                reader.held = False
                session.open(reader)
        if due:  # timed for the first still held
            self._timer = loop.call_at(due[0][0], self._expire, loop)


class StreamableSession(Session):
    """Its streams are written by the callbacks that deliver to it: `deliver` queues, `flush`
    (once per batch of server output) writes what each reader's stream got, in one write, and
    ends a POST's answer with its last response. A POST answered as one JSON body, with
    nothing but its responses, is answered by the delivery of the last one. No task waits on
    a stream."""

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
        self._due: dict[Stream, None] = {}  # streams with a reader that got events since the last flush
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
            reader = stream.reader
            if not stream.owed:
                if reader is None:
                    if stream.key != STANDALONE:
                        self.streams.pop(stream.key, None)  # its POST is gone; a resume replays from the buffer
                elif reader.sink is None and not stream.pending and reader.done is None:
                    # Its answer is one JSON body that this response completes: it goes now, as
                    # one write, with nothing queued (it is never an event a client could resume
                    # after, and one message is within the session's bounds, which config checks).
                    self._answer_whole(reader, data)
                    return True
        elif stream.reader is not None and stream.reader.gathers:
            stream = self.streams[STANDALONE]  # a JSON answer carries only responses: the rest goes there
        self._seq += 1
        self._remember(self._seq, stream.key, data)
        return self._queue(stream, (self._seq, data, response))

    def _queue(self, stream: Stream, item: tuple[int, bytes, bool]) -> bool:
        """Queue an event on `stream`, within the session's bounds: False when its reader is
        not keeping up (the gateway drops the session as too slow); with no reader, the
        oldest go (they stay in the replay buffer)."""
        reader = stream.reader
        limit, byte_limit = self._queue_limit - 1, self._queue_bytes - len(item[1])  # room for this one
        if reader is not None and reader.sink is not None:
            byte_limit -= reader.sink.unsent()  # written, and not yet taken by the socket
        if len(stream.pending) > limit or stream.pending_bytes > byte_limit:
            if reader is not None:
                return False
            while stream.pending and (len(stream.pending) > limit or stream.pending_bytes > byte_limit):
                stream.pop()
        stream.push(item)
        if reader is not None:
            self._due[stream] = None
        return True

    def flush(self) -> None:
        while self._due:
            stream = next(iter(self._due))
            del self._due[stream]
            if stream.reader is not None:
                self._pump(stream.reader)

    def attached(self) -> bool:
        return any(stream.reader is not None for stream in self.streams.values())

    def keepalive(self) -> None:
        for stream in self.streams.values():
            reader = stream.reader
            if reader is not None and reader.sink is not None:
                reader.sink.write(streams.PING)

    def end(self, reason: str) -> None:
        super().end(reason)
        for stream in list(self.streams.values()):
            reader = stream.reader
            if reader is None:
                continue
            if reason == "slow" and reader.sink is not None and reader.sink.unsent():
                # A stream whose socket is not being read: only an abort frees what is queued for it.
                self._stop(reader)
                reader.reply.abort()
            else:
                self._pump(reader)

    # Called by the handlers.

    def open_post_stream(self, request_ids: list[RequestId]) -> Stream:
        self._posts += 1
        stream = Stream(f"p{self._posts}")
        stream.owed.update(request_ids)
        self.streams[stream.key] = stream
        for rid in request_ids:
            self.by_request[rid] = stream
        return stream

    def answer(
        self, stream: Stream, reply: Reply, form: Form, batch: bool, prime: int | None, holds: Holds, done: Callable[[], None] | None
    ) -> None:
        """Answer a POST from its stream: as SSE (after a priming event with the id of `prime`),
        as one JSON body, or, when `form` is EITHER, in the form its answer takes by when it
        is due (`holds` times it). `done` runs once the answer has ended."""
        reader = stream.reader = Reader(stream, reply, batch, done)
        reply.watch(functools.partial(self._stop, reader))  # its client went: the unsent stays for a resume
        if form is not _JSON:
            reader.prime = prime
            if form is _STREAM:
                self.open(reader)
                return
            holds.add(self, reader)
        if stream.pending or not stream.owed or self.ended:
            self._pump(reader)  # answered already (by the mux, at once), or nothing to wait for

    def resume(self, stream: Stream, reply: Reply, after: int | None) -> None:
        """Answer a GET with `stream`, as SSE: what it sent after `after` (when resuming), then
        what comes. A reader already on the stream ends: this one takes over."""
        old = stream.reader
        if old is not None:
            self._stop(old)
            old.reply.end_stream()
        reader = stream.reader = Reader(stream, reply, False, None)
        reply.watch(functools.partial(self._stop, reader))  # its client went: the unsent stays for a resume
        if after is not None:
            reader.last = after
            replayed = self.replay(stream.key, after)
            if replayed:
                reader.first = b"".join([_event(stream, seq, data) for seq, data in replayed])
                reader.last = replayed[-1][0]
        self.open(reader)

    def open(self, reader: Reader) -> None:
        """Answer as a stream: its head and first events now."""
        if reader.stream.reader is not reader:
            return  # answered, or its client went, meanwhile
        first = reader.first
        if reader.prime is not None:
            first = b"id: %s_%d\ndata: \n\n" % (reader.stream.key.encode(), reader.prime) + first
        reader.sink = reader.reply.open_stream(self.id, first)
        self._pump(reader)

    def forget(self, stream: Stream) -> None:
        """A POST stream whose body was refused (nothing of it was taken): it owes nothing."""
        for rid in stream.owed:
            self.by_request.pop(rid, None)
        stream.owed.clear()
        self.streams.pop(stream.key, None)

    def mark(self) -> int:
        return self._seq

    def replay(self, key: str, after: int) -> list[tuple[int, bytes]]:
        return [(seq, data) for seq, k, data in self._replay if k == key and seq > after]

    def _pump(self, reader: Reader) -> None:
        """Send what the reader's stream has; end the answer when it is complete."""
        stream = reader.stream
        sink = reader.sink
        if sink is None:
            if not reader.held:
                self._gather(reader)  # a JSON answer
            elif self.ended or not all(item[2] for item in stream.pending):
                reader.held = False
                self.open(reader)  # something besides its responses: the answer is a stream
            elif not stream.owed:
                reader.held = False
                self._gather(reader)  # all its responses, and nothing else: one JSON body
            return
        while stream.pending and stream.pending[0][0] <= reader.last:
            stream.pop()  # sent already, by the replay
        events = b""
        if stream.pending:
            batch = stream.take()
            events = b"".join([_event(stream, seq, data) for seq, data, _ in batch])
            reader.last = batch[-1][0]
        if self.ended or (not stream.owed and stream.key != STANDALONE):
            self._stop(reader)  # a POST stream ends after its last response
            reader.reply.end_stream(events)
        elif events:
            sink.write(events)

    def _answer_whole(self, reader: Reader, last: bytes) -> None:
        """End a JSON answer with its last response (the others, of a batch, gathered already)."""
        self._stop(reader)
        responses = reader.responses
        body = b"[" + b",".join([*responses, last]) + b"]" if reader.batch else last
        reader.reply.whole(200, body, self.id)

    def _gather(self, reader: Reader) -> None:
        """A JSON answer: the responses it owes. Anything else (what came before it was read:
        `deliver` sends the rest straight there) goes to the standalone stream."""
        stream = reader.stream
        moved = False
        while stream.pending:
            item = stream.pop()
            if item[2]:
                reader.responses.append(item[1])
            else:
                # A standalone reader not keeping up misses it, and is dropped at its next delivery.
                moved = self._queue(self.streams[STANDALONE], item) or moved
        if moved and (standalone := self.streams[STANDALONE].reader) is not None:
            self._pump(standalone)
        if stream.owed and not self.ended:
            return
        self._stop(reader)
        responses = reader.responses
        if not responses:
            reader.reply.error(HttpError(503, "session ended before the response"))
        else:
            reader.reply.whole(200, b"[" + b",".join(responses) + b"]" if reader.batch else responses[0], self.id)

    def _stop(self, reader: Reader) -> None:
        """The reader is done with its stream (answered, replaced, or its client went)."""
        stream = reader.stream
        reader.held = False
        if stream.reader is reader:
            stream.reader = None
            if not stream.owed and stream.key != STANDALONE and self.streams.get(stream.key) is stream:
                del self.streams[stream.key]  # a stream that still owes stays, for a resuming GET
        done, reader.done = reader.done, None
        if done is not None:
            done()

    def _remember(self, seq: int, key: str, data: bytes) -> None:
        if len(data) > self._replay_limit:
            return
        self._replay.append((seq, key, data))
        self._replay_size += len(data)
        while self._replay_size > self._replay_limit:
            self._replay_size -= len(self._replay.popleft()[2])




# ------------------------------------------------------------------ handlers


def answer(post: Post[Served], payload: Any, reply: Reply, holds: Holds) -> None:
    """Route a decoded POST body; `reply` is answered (202, one JSON body, or a stream of
    events) as the session's deliveries come, or at once with an HttpError raised."""
    messages: list[Any] | tuple[Any]
    if payload.__class__ is list:
        messages = payload
        if not messages:
            raise HttpError(400, "invalid request: empty batch")
        request_ids = [m["id"] for m in messages if m.__class__ is dict and "method" in m and jsonrpc.is_id(m.get("id"))]
        if len(set(request_ids)) < len(request_ids):
            # Both would be owed to this POST under one id, and its answer would end at the first.
            # Refused before anything is opened (an initialize among them would leave a session).
            raise HttpError(400, "invalid request: a request id is repeated in this batch", jsonrpc.INVALID_REQUEST)
    else:
        messages = (payload,)
        request_ids = [payload["id"]] if payload.__class__ is dict and "method" in payload and jsonrpc.is_id(payload.get("id")) else []
    form = _answer_form(post.accept) if request_ids else _JSON  # before anything is opened or routed
    if post.session_id is not None:
        try:
            session = _session(post.gateway, post.principal, post.session_id, post.version)
        except HttpError as exc:
            exc.request_id = request_ids[0] if len(request_ids) == 1 and payload.__class__ is dict else None
            raise
        _take(post, session, payload, request_ids, form, reply, holds)
    elif any(m.__class__ is dict and m.get("method") == "initialize" for m in messages):
        later(reply, _initialize(post, payload, request_ids, form, reply, holds), "initialize")
    else:
        raise HttpError(400, f"missing {SESSION_HEADER} header (only initialize may come without one)")


async def _initialize(post: Post[Served], payload: Any, request_ids: list[RequestId], form: Form, reply: Reply, holds: Holds) -> None:
    """A new session (which may wait for a process of its own), then its initialize."""
    gateway = post.gateway
    limits = gateway.limits
    session = StreamableSession(gateway.name, post.principal, limits.session_queue, limits.slow_bytes, post.resume_buffer)
    await state.open_session(gateway, session)
    _take(post, session, payload, request_ids, form, reply, holds, initializing=True)


def _take(
    post: Post[Served], session: StreamableSession, payload: Any, request_ids: list[RequestId], form: Form, reply: Reply, holds: Holds, initializing: bool = False
) -> None:
    gateway = post.gateway
    if not session.by_request.keys().isdisjoint(request_ids):
        single = request_ids[0] if payload.__class__ is dict else None
        raise HttpError(400, "invalid request: a request id in this body is already in flight", jsonrpc.INVALID_REQUEST, request_id=single)
    done = functools.partial(_after_initialize, gateway, session) if initializing else None
    if gateway.traces is not None:
        session.http_trace = post.request.http_span()
    if not request_ids:
        _route(gateway, session, payload, initializing)
        if done is not None:
            done()
        reply.whole(202, b"", session.id)
        return
    stream = session.open_post_stream(request_ids)
    primed = session.mark()  # before routing: a reply the mux makes at once comes after it
    try:
        _route(gateway, session, payload, initializing)
    except HttpError:
        session.forget(stream)
        raise
    prime = primed if form is not _JSON and not initializing and session.protocol_version >= PRIMING_SINCE else None
    session.answer(stream, reply, form, payload.__class__ is list, prime, holds, done)


async def get(request: web.Request) -> web.StreamResponse:
    gateway = state.gateway_for(request)
    accept = request.headers.get("Accept")
    if accept and not media.quality(accept, media.SSE):
        raise HttpError(406, "GET needs Accept: text/event-stream")
    session_id = _session_header(request)
    session = _session(gateway, state.principal(request), session_id, request.headers.get(VERSION_HEADER))
    resume = request.headers.get("Last-Event-ID")
    key, last = _parse_event_id(resume)
    stream = session.streams.get(key)
    if stream is None:
        stream = Stream(key)  # it has ended: replay what it sent after `last`, then end
    elif stream.reader is not None and stream.reader.sink is None:
        raise HttpError(409, "that stream's POST is being answered as one JSON body: there is no stream to resume")
    reply = AiohttpReply(request)
    session.resume(stream, reply, last if resume else None)
    return await reply.send()


async def delete(request: web.Request) -> web.Response:
    gateway = state.gateway_for(request)
    session = _session(gateway, state.principal(request), _session_header(request), request.headers.get(VERSION_HEADER))
    gateway.close_session(session, "client ended session")
    return web.Response(status=204)


# ------------------------------------------------------------------- helpers


def _session_header(request: web.Request) -> str:
    """The session a GET or DELETE names; with none, 405: 2026-07-28 has only POST."""
    session_id = request.headers.get(SESSION_HEADER)
    if session_id is None:
        raise HttpError(405, f"{request.method} needs an {SESSION_HEADER} header (2026-07-28 requests are POSTs)", headers={"Allow": "POST"})
    return session_id


def _session(gateway: Served, principal: str | None, session_id: str, version: str | None) -> StreamableSession:
    """The session a request names (404 when it is not one of `principal`'s), if the
    `MCP-Protocol-Version` it sends is one sessions speak (else 400)."""
    session = gateway.session(session_id, principal)
    if session is None or session.__class__ is not StreamableSession:
        raise HttpError(404, "unknown session")
    if version is not None and version not in _SESSION_VERSIONS:
        raise HttpError(400, f"unsupported {VERSION_HEADER}: {version!r} (supported: {', '.join(PROTOCOL_VERSIONS)})")
    return session


def _route(gateway: Served, session: StreamableSession, payload: Any, initializing: bool) -> None:
    try:
        state.route(gateway, session, payload)
    except HttpError:
        if initializing:
            gateway.close_session(session, "invalid initialize")
        raise


def _after_initialize(gateway: Served, session: StreamableSession) -> None:
    """Keep the session only if its initialize succeeded; remember the version it speaks."""
    version = gateway.negotiated_version(session)
    if version is None:
        gateway.close_session(session, "initialize failed")
    else:
        session.protocol_version = version


class Form(enum.Enum):
    """The form of a POST's answer, by what its Accept prefers."""

    JSON = "json"
    STREAM = "stream"
    EITHER = "either"  # both, as much: chosen when the answer is due (HOLD_S)


# Read on every POST, as globals: a member lookup on an Enum class is slow in Python 3.11 (jsonrpc.REQUEST).
_JSON, _STREAM = Form.JSON, Form.STREAM


@functools.lru_cache(maxsize=128)  # as media.quality: clients send the same few values
def _answer_form(accept: str) -> Form:
    """The form a POST's answer takes, by its Accept: the one it prefers, either when it
    wants both as much; one JSON body when it sends none; 406 when it takes neither."""
    if not accept:
        return Form.JSON
    sse, json = media.quality(accept, media.SSE), media.quality(accept, media.JSON)
    if not sse and not json:
        raise HttpError(406, f"POST needs Accept: {media.JSON} or {media.SSE}")
    return Form.EITHER if sse == json else Form.STREAM if sse > json else Form.JSON


def _parse_event_id(value: str | None) -> tuple[str, int]:
    if value:
        key, _, seq = value.rpartition("_")
        if key and seq.isdigit():
            return key, int(seq)
    return STANDALONE, 0


def _event(stream: Stream, seq: int, data: bytes) -> bytes:
    return b"id: %s_%d\nevent: message\ndata: %s\n\n" % (stream.key.encode(), seq, data)
