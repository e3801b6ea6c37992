"""Message POSTs without aiohttp's per-request machinery.

Every message a client sends is a small POST, so the cost of one request is
most of the bridge's cost of one call. aiohttp spends about 250 µs of CPU on
each (parser objects, Request and Response, router, middleware, a task);
routing the message itself takes about 10 µs. This is the protocol every
connection starts with: it serves the plain message POST of both transports
itself (`POST .../messages` of HTTP+SSE, `POST .../mcp` of Streamable HTTP),
with the same HTTP layer as aiohttp's handlers (`access.check_access`, errors
as `errors.HttpError`, Streamable events to an `reply.EventSink`), hands the
decoded body to the `Dispatcher` it is given (endpoints/post.py's `Posts`, as
aiohttp's handler does; it imports no endpoint), and writes the response itself. A Streamable POST holds the connection
until its answer has ended (no task waits for it: the session's deliveries
write it, through `_Reply`); requests that come meanwhile wait their turn.

Any request it does not fully understand is aiohttp's: at the first byte of
such a request (another path or method, HTTP/1.0, a chunked or compressed
body, `Expect`, `Upgrade`, a repeat of a header it reads, any header line that
is not a plain `token: value`), the connection is handed to an aiohttp `RequestHandler` for
good, with the bytes of that request, so every edge of HTTP is still
aiohttp's and only the common case is parsed here. A request is only ever
answered whole and in order, so keep-alive and pipelining need nothing else.
In a cluster, a request naming a session that is not this replica's is
handed over the same way: forwarding lives on aiohttp's path (forward.py).
A 2026-07-28 request (by its `MCP-Protocol-Version`) is served here whatever
`Mcp-Session-Id` it carries, and its MRTR retry for a call another replica
holds is forwarded by its endpoint through `forward.Forwarder.retry`, with the
headers this path read (`Head.fields`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from types import MappingProxyType
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from bridge import logs
from bridge.access.guard import NOT_FORWARDED, Forwarded, cors_headers
from bridge.access.oauth import NeedsFetch
from bridge.gateway.sessions import Served, Session
from bridge.http import forward, reply, state, streams
from bridge.http.access import check_access
from bridge.http.body import check_length, decode_body
from bridge.http.endpoints.base import Dispatcher, Post
from bridge.http.errors import INTERNAL_ERROR, HttpError
from bridge.protocol import mcp, stateless
from bridge.protocol.mcp import SESSION_HEADER
from bridge.traces import UNSAMPLED

if TYPE_CHECKING:
    from bridge.traces import HttpSpan

MAX_HEAD = 8190  # aiohttp's limit on one line; a longer head (of any shape) is aiohttp's to judge
MAX_FIELDS = 100  # under aiohttp's limit of 128 headers: more are aiohttp's to judge
DISCARD_LIMIT = 64 * 1024  # a refused request's body up to this size is read, to keep the connection
LINGER_S, LINGER_BYTES = 2.0, 1 << 20  # reading on after a refusal, before closing
# The target of a message POST in the one shape this path takes: `/servers/{name}/mcp`
# (Streamable HTTP) or `/servers/{name}/messages` (HTTP+SSE), or the same of a group
# (`/groups/{name}/...`), with a query that has no "+";
# visible ASCII only (no controls, no spaces, no bare LF), and neither "#" nor "%": aiohttp
# drops a fragment and decodes an escape, so those targets are its to read. Captured:
# servers or groups, the name (no "/" or "?"), the endpoint, the query.
_TARGET = re.compile(rb"/(servers|groups)/([!\"$&-.0->@-~]+)/(mcp|messages)(?:\?([!\"$&-*,-~]*))?")
_REQUEST_LINE = re.compile(rb"POST " + _TARGET.pattern + rb" HTTP/1\.1")
# The header block after the request line, each field after a CRLF, in the one shape this path
# takes: token names, no space before the colon, no folding, no control characters in values.
# Checked whole in one C pass, then read in another, which takes each value without the spaces
# and tabs around it (linear: the trailing ones are given back once). Per field, what is left
# is one lower() in a comprehension: a loop with a branch and a strip per field cost about
# 4,500 instructions a field. llhttp (httptools) was measured against these regexes and was
# not faster here (bench/headparse.py; bench/RESULTS.md).
_FIELDS = re.compile(rb"(?:\r\n[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*)*")
_FIELD = re.compile(rb"\r\n([^:]+):[\t ]*+((?:[^\r]*[^\r\t ])?)[\t ]*")  # one field of a block _FIELDS took
_MCP, _GROUPS = b"mcp", b"groups"
# A header here that changes how the body is framed or encoded (a compressed body is decoded on
# aiohttp's path, by body.read_message), or what is expected of the server, means aiohttp.
HAND_OFF_FIELDS = frozenset({b"transfer-encoding", b"content-encoding", b"expect", b"upgrade"})
# The fields this path reads (and Mcp-Param-*): a repeat of one is ambiguous, and aiohttp's to
# judge. A repeat of another (an X-Forwarded-For that each proxy on the way added) is not.
_READ = frozenset(
    {b"host", b"origin", b"authorization", b"content-length", b"connection", b"accept", b"mcp-session-id", b"mcp-protocol-version",
     b"mcp-method", b"mcp-name", b"x-mcp-bridge-forwarded", b"x-forwarded-proto", b"x-forwarded-host", b"x-forwarded-prefix"}
)  # fmt: skip
_PARAM = b"mcp-param-"
# An Mcp-Param-* field (2026-07-28: a tool argument mirrored in a header), found in the raw
# head: a search that only stops at each CRLF, rather than a look at every field's name.
_PARAM_FIELD = re.compile(rb"\r\n(?i:mcp-param-)([^:]*):[\t ]*+((?:[^\r]*[^\r\t ])?)")
_ACCEPTED_BODY = b"Accepted"
_NO_PARAMS: Mapping[str, str] = MappingProxyType({})
_NOT_MIRRORED = stateless.Headers(None, None, None, _NO_PARAMS)


class Head(msgspec.Struct, eq=False):
    """The parts of a message POST's head that this path reads (a Struct: one is made per
    request, in C)."""

    server: str = ""  # or group, with `group`
    mcp: bool = False  # Streamable HTTP; else HTTP+SSE
    group: bool = False  # /groups/{name}/...
    principal: str | None = None
    accept: str = ""
    mcp_version: str | None = None
    gateway: Served | None = None  # these two once admitted
    session: Session | None = None
    refusal: HttpError | None = None  # the answer, when refused
    session_id: str | None = None
    host: str | None = None
    origin: str | None = None
    authorization: str | None = None
    forwarded: Forwarded = NOT_FORWARDED
    content_length: int = 0
    close: bool = False
    found: dict[bytes, bytes] = msgspec.field(default_factory=dict)  # by lower-case name (of a repeat not read here, the last)
    raw: bytes = b""  # the head as read: Mcp-Param-* and a forwarded MRTR retry's headers come from it
    span: HttpSpan | None = None  # tracing on: its span (or UNSAMPLED), until its answer is complete

    # A `RequestHead` (endpoints/base.py): what a 2026-07-28 endpoint reads later, from `raw`.
    def fields(self) -> CIMultiDict[str]:
        return CIMultiDict((name.decode("latin-1"), _text(value)) for name, value in _FIELD.findall(self.raw))

    def mirrored(self) -> stateless.Headers:
        return _mirrored(self)

    def http_span(self) -> HttpSpan | None:
        return self.span

    def trace_context(self) -> tuple[str, str] | None:
        found = self.found
        parent = found.get(b"traceparent")
        if parent is None:
            return None
        state = found.get(b"tracestate")
        return _text(parent), _text(state) if state is not None else ""


def read_head(head: bytes) -> tuple[re.Match[bytes], dict[bytes, bytes]] | None:
    """The request line (`_REQUEST_LINE`'s match) and the fields (by lower-case name) of a plain
    HTTP/1.1 message POST's head (without its blank line) in the one shape this path takes,
    else None: a repeat of a field it reads is ambiguous (aiohttp says what it means), and a
    hand-off field is aiohttp's."""
    line = _REQUEST_LINE.match(head)
    if line is None:
        return None
    start = line.end()
    if _FIELDS.fullmatch(head, start) is None:
        return None
    pairs = _FIELD.findall(head, start)
    if len(pairs) > MAX_FIELDS:
        return None
    found = {name.lower(): value for name, value in pairs}
    if (len(found) != len(pairs) and _repeats_a_read_field(pairs)) or not found.keys().isdisjoint(HAND_OFF_FIELDS):
        return None
    return line, found


def _repeats_a_read_field(pairs: list[tuple[bytes, bytes]]) -> bool:
    """Whether a field this path reads comes twice (only asked when some field does)."""
    seen: set[bytes] = set()
    for name, _ in pairs:
        name = name.lower()
        if name in seen and (name in _READ or name.startswith(_PARAM)):
            return True
        seen.add(name)
    return False


def parse_head(head: bytes) -> Head | None:
    """The head of a plain HTTP/1.1 `POST /servers/{name}/messages?session_id=...` or
    `POST /servers/{name}/mcp`, else None."""
    read = read_head(head)
    return None if read is None else _message_head(*read, head)


def message_head(target: bytes, found: dict[bytes, bytes], raw: bytes) -> Head | None:
    """What this path needs of a POST with this target and these fields (by lower-case name),
    if it is a message POST; `raw` is its whole head (where its Mcp-Param-* fields are read)."""
    line = _TARGET.fullmatch(target)
    return None if line is None else _message_head(line, found, raw)


def _message_head(line: re.Match[bytes], found: dict[bytes, bytes], raw: bytes) -> Head | None:
    served, name, endpoint, query = line.group(1, 2, 3, 4)
    host = found.get(b"host")
    if host is None:
        return None  # HTTP/1.1 requires it (RFC 9112, 3.2)
    out = Head(name.decode("ascii", "surrogateescape"), endpoint == _MCP, served == _GROUPS, host=_text(host), found=found, raw=raw)
    if (length := found.get(b"content-length")) is not None:
        if not length.isdigit() or len(length) > 18:
            return None  # aiohttp answers what is not a plain length
        out.content_length = int(length)
    if (connection := found.get(b"connection")) is not None:
        tokens = {t.strip().lower() for t in connection.split(b",")}
        if b"upgrade" in tokens:
            return None
        out.close = b"close" in tokens
    if (origin := found.get(b"origin")) is not None:
        out.origin = _text(origin)
    if (authorization := found.get(b"authorization")) is not None:
        out.authorization = _text(authorization)
    if b"x-forwarded-host" in found or b"x-forwarded-proto" in found or b"x-forwarded-prefix" in found:
        get = found.get
        out.forwarded = (_or_none(get(b"x-forwarded-proto")), _or_none(get(b"x-forwarded-host")), _or_none(get(b"x-forwarded-prefix")))
    if out.mcp:  # every Streamable POST (its session is named by a header): decoded as _text does, without a call each
        if (accept := found.get(b"accept")) is not None:
            out.accept = accept.decode("utf-8", "surrogateescape")
        if (session_id := found.get(b"mcp-session-id")) is not None:
            out.session_id = session_id.decode("utf-8", "surrogateescape")
        if (version := found.get(b"mcp-protocol-version")) is not None:
            out.mcp_version = version.decode("utf-8", "surrogateescape")
    elif query is not None:
        out.session_id = _session_id(query)
    return out


def _session_id(query: bytes) -> str | None:
    """The session an HTTP+SSE POST names in its query."""
    if query.startswith(b"session_id=") and query.find(b"&") < 0:  # what the endpoint event says
        return query[11:].decode("ascii", "surrogateescape") or None
    found: dict[bytes, bytes] = {}
    for pair in query.split(b"&"):
        key, _, value = pair.partition(b"=")
        if key in (b"session_id", b"sessionId") and key not in found:
            found[key] = value
    session_id = found.get(b"session_id") or found.get(b"sessionId")
    return session_id.decode("ascii", "surrogateescape") if session_id else None


def _mirrored(head: Head) -> stateless.Headers:
    """What a 2026-07-28 request's headers mirror of its body (read only for one of those)."""
    found = head.found
    method, name = found.get(b"mcp-method"), found.get(b"mcp-name")
    pairs = _PARAM_FIELD.findall(head.raw)
    params = {_text(k.lower()): _text(v) for k, v in pairs} if pairs else _NO_PARAMS
    if method is None and name is None and not params and head.mcp_version is None:
        return _NOT_MIRRORED
    return stateless.Headers(
        head.mcp_version,
        None if method is None else method.decode("utf-8", "surrogateescape"),  # as _text, without a call each
        None if name is None else name.decode("utf-8", "surrogateescape"),
        params,
    )


def _or_none(value: bytes | None) -> str | None:
    return None if value is None else _text(value)


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")  # as aiohttp decodes header values


class _Date:
    """The Date header, formatted once a second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = formatdate(now, usegmt=True).encode()
        return self._value


_date = _Date()


_PHRASES = {s.value: s.phrase.encode() for s in HTTPStatus}


def render(status: int, body: bytes, content_type: bytes, headers: Mapping[str, str] | None, close: bool) -> bytes:
    """One whole response."""
    first = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n" % (
        status, _PHRASES.get(status, b""), content_type, len(body), _date()
    )
    return first + _fields(headers, close) + b"\r\n" + body


def render_stream_head(headers: dict[str, str], close: bool) -> bytes:
    """The head of an SSE response, with chunked framing to follow: `streams.SSE_HEADERS`
    (rendered once, at import), then `headers`, which name none of them."""
    first = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nDate: %s\r\n%s" % (_date(), _SSE_FIELDS[close])
    return first + _fields(headers, False) + b"\r\n"


def _fields(headers: Mapping[str, str] | None, close: bool) -> bytes:
    if close:  # replaces a Connection header given, rather than adding a second one
        headers = {**(headers or {}), "Connection": "close"}
    if not headers:
        return b""
    lines = ""
    for name, value in headers.items():
        lines += f"{name}: {value}\r\n"
    return lines.encode("latin-1", "replace")


_SSE_FIELDS = {close: _fields(streams.SSE_HEADERS, close) for close in (False, True)}


class Connections:
    """The connections this path holds now, and how many it ever accepted (every one starts here)."""

    def __init__(self) -> None:
        self.live: set[Connection] = set()
        self.accepted = 0

    def stop_taking(self) -> None:
        """Take no more requests, as aiohttp's pre-shutdown does: a connection between requests
        closes now; one answering on a stream closes once that answer has ended, so that the
        stream's last events (the errors a stopping gateway gives) and its end still go out."""
        for connection in list(self.live):
            connection.stop_taking()

    async def wait_closed(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the answers under way to end, then close what is left."""
        busy = [connection.served() for connection in self.live if connection.busy]
        if busy:
            await asyncio.wait(busy, timeout=timeout)
        for connection in list(self.live):
            connection.close()


class Connection(asyncio.Protocol):
    """One client connection, until it sends a request this path leaves to aiohttp."""

    def __init__(
        self, app: web.Application, posts: Dispatcher, fallback: Callable[[], asyncio.Protocol], registry: Connections, idle_timeout: float
    ) -> None:
        self._posts = posts  # what a decoded POST is handed to: this path picks no endpoint
        # What every request reads of the app: each lives as long as the app (a reload changes
        # what is inside `_live` and `_gateways`, never the objects).
        self._live = app[state.LIVE]
        self._gateways = app[state.GATEWAYS]
        self._groups = app[state.GROUPS]
        self._rejected = app[state.METRICS].rejected
        self._traces = app.get(state.TRACES)
        self._cluster = app.get(forward.CLUSTER)  # with one, only sessions of this replica are served here
        self._idle_timeout = idle_timeout  # limits.keepalive_timeout, as aiohttp's keepalive_timeout
        self._fallback = fallback
        self._registry = registry
        self._transport: asyncio.Transport | None = None
        self._remote: str | None = None
        self._pending = b""  # bytes of a request whose head is not complete yet
        self._head: Head | None = None  # a request whose body is still arriving
        self._body: list[bytes] = []
        self._body_size = 0
        self._last_active = 0.0
        self._idle: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._held_back = False  # reading paused until the answer under way has ended
        self._unacked_limited = False  # streams.limit_unacked done: once per connection, not per stream
        self._loop = asyncio.get_running_loop()
        self._busy: _Reply | None = None  # answering a Streamable POST; later requests wait
        self._served_waiter: asyncio.Future[None] | None = None  # shutdown waits for the answer under way
        self._lingering = 0  # bytes still to drop after refusing a body unread
        self._stopping = False  # shutting down: close once the answer under way has ended

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._registry.live.add(self)
        self._registry.accepted += 1
        peer = transport.get_extra_info("peername")
        self._remote = peer[0] if isinstance(peer, tuple) else None
        self._last_active = time.monotonic()
        self._idle = self._loop.call_later(self._idle_timeout, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._detach()
        busy = self._busy
        if busy is not None:
            self._served(busy)
            busy.left()  # as aiohttp cancels a handler whose client went away
            busy.cut()

    def pause_writing(self) -> None:
        # A client that sends requests without reading the answers waits until it reads them.
        self._write_paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._transport is not None:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._linger_read(data)
            return
        if self._busy is not None:
            self._pending += data
            if len(self._pending) > MAX_HEAD + DISCARD_LIMIT and self._transport is not None:
                self._transport.pause_reading()  # a client that will not wait its turn waits anyway
                self._held_back = True
            return
        if self._head is not None:
            # A body that keeps coming is activity; bytes of a head are not (else a
            # client sending one byte a minute would hold the connection for ever).
            self._last_active = time.monotonic()
            data = self._more_body(data)
            if self._head is not None:
                return
        elif self._pending:
            data = self._pending + data
            self._pending = b""
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        pos = 0
        while pos < len(data) and self._transport is not None:
            if self._busy is not None:
                self._pending = data[pos:]
                return
            end = data.find(b"\r\n\r\n", pos)
            if end < 0:
                # A bare LF can never end this head: aiohttp answers it now, rather than the
                # idle timeout later (a head with an end is checked whole by parse_head).
                if len(data) - pos > MAX_HEAD or data.count(b"\n", pos) != data.count(b"\r\n", pos):
                    self._hand_off(data[pos:])
                else:
                    self._pending = data[pos:]
                return
            head = parse_head(data[pos:end]) if end - pos <= MAX_HEAD else None
            if head is None or (
                self._cluster is not None
                and head.session_id is not None
                and head.mcp_version not in mcp.STATELESS_VERSIONS
                and not self._cluster.is_local(head.session_id)
            ):
                # Another replica's session, or nobody's: aiohttp's path is where forwarding lives.
                self._hand_off(data[pos:])
                return
            start = end + 4
            stop = start + head.content_length
            try:
                admitted = self._admit(head)
            except NeedsFetch:
                # Its access token needs the network to check: aiohttp's path can wait for it.
                self._hand_off(data[pos:])
                return
            if not admitted:
                return
            if stop > len(data):
                self._head = head
                self._body = [data[start:]]
                self._body_size = len(data) - start
                return
            self._answer(head, data[start:stop])
            pos = stop

    def eof_received(self) -> bool | None:
        return None  # the transport closes; a request cut short is dropped with it

    # requests

    def _more_body(self, data: bytes) -> bytes:
        """Add to the body being received; what follows a completed body is returned for parsing."""
        head = self._head
        assert head is not None
        need = head.content_length - self._body_size
        if len(data) < need:
            self._body.append(data)
            self._body_size += len(data)
            return b""
        self._body.append(data[:need])
        body = b"".join(self._body)
        self._head, self._body, self._body_size = None, [], 0
        self._answer(head, body)
        return data[need:]

    def _admit(self, head: Head) -> bool:
        """The checks that come before the body is read. A refused request's body is still
        read (and dropped), so that the connection stays usable, unless it is large: then
        the answer goes now and the connection closes. False when it closed."""
        try:
            head.principal = check_access(
                self._live.guard,
                self._rejected,
                method="POST",
                path=f"/{'groups' if head.group else 'servers'}/{head.server}/{'mcp' if head.mcp else 'messages'}",
                server=None if head.group else head.server,  # a group's members are checked as its sessions open
                host=head.host,
                origin=head.origin,
                authorization=head.authorization,
                remote=self._remote,
                forwarded=head.forwarded,
            ).principal
            head.gateway = state.group_named(self._groups, head.server) if head.group else state.gateway_named(self._gateways, head.server)
            if not head.mcp:  # Streamable looks its session up after reading the body, as aiohttp does
                head.session = self._posts.message_session(head.gateway, head.session_id, head.principal)
            check_length(head.content_length, head.gateway)
        except HttpError as exc:
            head.refusal = exc
        if head.refusal is not None and (head.refusal.status == 413 or head.content_length > DISCARD_LIMIT):
            head.close = True
            self._answer(head, b"", linger=True)
            return False
        return True

    def _answer(self, head: Head, body: bytes, linger: bool = False) -> None:
        if head.refusal is not None:
            self._reply_error(head, head.refusal, linger)
            return
        if (traces := self._traces) is not None:  # the draw inline: traces/spans.py, rule 3
            if b"traceparent" in head.found or traces.draw() < traces.ratio:
                head.span = traces.http_started(head.trace_context(), self._describe, head)
            else:
                head.span = UNSAMPLED
        if head.mcp:
            self._start_mcp(head, body)
            return
        gateway, session = head.gateway, head.session
        assert gateway is not None and session is not None
        if gateway.traces is not None:
            session.http_trace = head.span
        try:
            self._posts.message(gateway, session, decode_body(body, gateway))
        except HttpError as exc:
            self._reply_error(head, exc)
        except Exception:
            logs.get().exception("internal_error", where="message_post", server=head.server, session=session.id)
            self._reply_error(head, INTERNAL_ERROR)
        else:
            self._reply(head, 202, _ACCEPTED_BODY, _TEXT, None)

    def _describe(self, head: Head) -> tuple[str, str, str]:
        route = (state.GROUP_MCP_ROUTE if head.mcp else state.GROUP_MESSAGES_ROUTE) if head.group else (state.MCP_ROUTE if head.mcp else state.MESSAGES_ROUTE)
        path = route.replace("{group}" if head.group else "{name}", head.server)
        return route, path, "https" if self._live.config.listen.tls is not None else "http"

    def _traced_end(self, head: Head, status: int | None) -> None:
        """Its answer is complete (`status`), or cut off (None): its span ends. (Its callers test
        for one first, so that a request not traced makes no call.)"""
        span, head.span = head.span, None
        if span is not None and span is not UNSAMPLED and self._traces is not None:
            self._traces.http_ended(span, status)

    def _start_mcp(self, head: Head, body: bytes) -> None:
        gateway = head.gateway
        assert gateway is not None
        try:
            payload = decode_body(body, gateway)
        except HttpError as exc:
            self._reply_error(head, exc)
            return
        post = Post(
            gateway, head.principal, head.session_id, head.mcp_version, head.accept, self._live.config.streamable.resume_buffer, head
        )
        reply = self._busy = _Reply(self, head)
        try:
            self._posts.mcp(post, payload, reply)
        except HttpError as exc:
            reply.error(exc)
        except Exception:
            logs.get().exception("internal_error", where="mcp_post", server=head.server, session=head.session_id)
            reply.error(INTERNAL_ERROR)

    def _served(self, reply: _Reply) -> None:
        """`reply` has ended (or its client went): the next request may be read."""
        if self._busy is not reply:
            return
        self._busy = None
        self._last_active = time.monotonic()
        if self._served_waiter is not None and not self._served_waiter.done():
            self._served_waiter.set_result(None)
        if self._transport is None:
            return
        if self._stopping:
            self.close()
            return
        if self._held_back and not self._write_paused:
            self._held_back = False
            self._transport.resume_reading()
        if self._pending:
            # Not now: this may run inside the flush of a server's output (or inside _parse).
            self._loop.call_soon(self._parse_pending)

    def _parse_pending(self) -> None:
        if self._busy is None and self._pending and self._transport is not None:
            data, self._pending = self._pending, b""
            self._parse(data)

    @property
    def gone(self) -> bool:
        transport = self._transport
        return transport is None or transport.is_closing()

    def write(self, data: bytes) -> None:
        """Bytes of a stream under way; dropped once the client is gone."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def unsent(self) -> int:
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    def open_stream(self, head: Head, headers: dict[str, str], first: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        if not self._unacked_limited:
            streams.limit_unacked(transport)
            self._unacked_limited = True
        cors = None if head.origin is None else cors_headers(self._live.guard, head.origin)
        stream_head = render_stream_head({**headers, **cors} if cors else headers, head.close)
        self.write(stream_head + reply.chunk(first) if first else stream_head)

    def _reply_error(self, head: Head, error: HttpError, linger: bool = False) -> None:
        """The one place this path renders an HttpError (aiohttp's is `access.middleware`). Past
        the access check (its server known), it is a JSON-RPC error sent to the client."""
        if head.gateway is not None:
            head.gateway.metrics.error_sent({"code": error.code})
        self._reply(head, error.status, error.body(), _JSON, error.headers, linger)

    def _reply(
        self, head: Head, status: int, body: bytes, content_type: bytes, headers: Mapping[str, str] | None, linger: bool = False
    ) -> None:
        transport = self._transport
        if transport is None:
            return
        self._last_active = time.monotonic()
        cors = None if head.origin is None else cors_headers(self._live.guard, head.origin)
        if cors is not None:
            headers = {**headers, **cors} if headers else cors
        transport.write(render(status, body, content_type, headers, head.close))
        if head.span is not None and head.span is not UNSAMPLED:
            self._traced_end(head, status)
        if head.close and linger:
            self._linger()
        elif head.close:
            transport.close()
            self._detach()

    def _linger(self) -> None:
        """Refused with the body unread: say so, then read and drop what the client is still
        sending for a while before closing, so that a reset does not destroy the answer."""
        transport = self._transport
        assert transport is not None
        if transport.can_write_eof():
            transport.write_eof()
        self._lingering = LINGER_BYTES
        asyncio.get_running_loop().call_later(LINGER_S, self.close)

    def _linger_read(self, data: bytes) -> None:
        self._lingering -= len(data)
        if self._lingering <= 0:
            self.close()

    # the connection

    def _hand_off(self, data: bytes) -> None:
        """Give the connection, from the first byte of the current request, to aiohttp."""
        transport = self._transport
        assert transport is not None
        self._detach()
        handler = self._fallback()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._write_paused:
            # aiohttp applies back-pressure when it writes, not by pausing reads: undo ours.
            transport.resume_reading()
            handler.pause_writing()
        handler.data_received(data)

    def _detach(self) -> None:
        self._registry.live.discard(self)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._transport = None

    def _check_idle(self) -> None:
        self._idle = None
        if self._transport is None:
            return
        idle = time.monotonic() - self._last_active
        if idle >= self._idle_timeout and self._busy is None:  # a stream under way is not idle
            self._transport.close()
            self._detach()
        else:
            self._idle = self._loop.call_later(self._idle_timeout - idle, self._check_idle)

    @property
    def busy(self) -> bool:
        return self._busy is not None

    def served(self) -> asyncio.Future[None]:
        """Done once the answer under way has ended."""
        if self._served_waiter is None:
            self._served_waiter = asyncio.get_running_loop().create_future()
            if self._busy is None:
                self._served_waiter.set_result(None)
        return self._served_waiter

    def stop_taking(self) -> None:
        self._stopping = True
        if self._busy is None:
            self.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _Reply:
    """An `reply.Reply` through this connection, and its stream's EventSink. Once ended, it
    takes nothing more: a second answer would be a response the client never asked for."""

    __slots__ = ("_connection", "_ended", "_head", "_left", "streaming")

    def __init__(self, connection: Connection, head: Head) -> None:
        self._connection = connection
        self._head = head
        self._left: Callable[[], object] | None = None
        self._ended = False
        self.streaming = False

    def whole(self, status: int, body: bytes, session_id: str | None = None) -> None:
        if self._ended:
            return
        headers = {SESSION_HEADER: session_id} if session_id else None
        self._connection._reply(self._head, status, body, _JSON if body else _TEXT, headers)
        self._done()

    def error(self, exc: HttpError) -> None:
        if self._ended:
            return
        if self.streaming:
            self.abort()  # nothing can be said once the stream is under way
            return
        self._connection._reply_error(self._head, exc)
        self._done()

    def open_stream(self, session_id: str | None, first: bytes = b"") -> _Reply:
        self._connection.open_stream(self._head, {SESSION_HEADER: session_id} if session_id else {}, first)
        self.streaming = True
        return self

    def write(self, data: bytes) -> None:
        if not self._ended:
            self._connection.write(reply.chunk(data))

    def unsent(self) -> int:
        return self._connection.unsent()

    def end_stream(self, last: bytes = b"") -> None:
        if self._ended:
            return
        if not self.streaming:
            self.open_stream(None)  # ended before it began: still a stream, an empty one
        self._connection.write(reply.chunk(last) + reply.LAST_CHUNK if last else reply.LAST_CHUNK)  # one write: one send
        if self._head.span is not None and self._head.span is not UNSAMPLED:
            self._connection._traced_end(self._head, 200)
        if self._head.close:
            self._connection.close()
        self._done()

    def abort(self) -> None:
        if self._ended:
            return
        self._connection.close()
        self.cut()
        self._done()

    def cut(self) -> None:
        """Its client went, or it was cut off: its span (if any) ends so."""
        if self._head.span is not None and self._head.span is not UNSAMPLED:
            self._connection._traced_end(self._head, None)

    def watch(self, left: Callable[[], object]) -> None:
        self._left = left

    def left(self) -> None:
        left, self._left = self._left, None
        if left is not None:
            left()

    @property
    def gone(self) -> bool:
        return self._connection.gone

    def _done(self) -> None:
        self._ended = True
        self._left = None
        self._connection._served(self)


_JSON = b"application/json"
_TEXT = b"text/plain; charset=utf-8"
