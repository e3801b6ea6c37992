"""Message POSTs without aiohttp's per-request machinery.

Every message an HTTP+SSE client sends is a small POST, so the cost of one
request is most of the bridge's cost of one call. aiohttp spends about
250 µs of CPU on each (parser objects, Request and Response, router,
middleware, a task); routing the message itself takes about 10 µs. This is
the protocol every connection starts with: it serves the plain message POST
itself, with the same access checks (`security.admit`), the same handler
steps (`sse.posted_session`, `sse.take`) and the same error bodies, and
writes a prebuilt answer.

Any request it does not fully understand is aiohttp's: at the first byte of
such a request (another path or method, HTTP/1.0, a chunked body, `Expect`,
`Upgrade`, a repeated framing header, any header line that is not a plain
`token: value`), the connection is handed to an aiohttp `RequestHandler` for
good, with the bytes of that request, so every edge of HTTP is still
aiohttp's and only the common case is parsed here. A request is only ever
answered whole and in order, so keep-alive and pipelining need nothing else.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from aiohttp import web

from .. import jsonrpc, logs
from ..gateway import Gateway
from ..sessions import Session
from ..security import Refusal, admit, cors_headers, refused
from . import common, sse

MAX_HEAD = 8190  # aiohttp's own limit on a request line and on a header field
DISCARD_LIMIT = 64 * 1024  # a refused request's body up to this size is read, to keep the connection
IDLE_TIMEOUT_S = 75.0  # aiohttp's keep-alive timeout: an idle connection is closed after it
_PREFIX = b"/servers/"
_SUFFIX = b"/messages"
# The header block (after the request line, each line ended by CRLF) in the one shape this path
# takes: token names, no space before the colon, no folding, no control characters in values.
_FIELDS = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*\r\n)*")
_FIELD = re.compile(rb"([^:]+):([^\r]*)\r\n")  # one field of a block _FIELDS took
# A header here that changes how the body is framed or what is expected of the server means aiohttp.
_HAND_OFF_FIELDS = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
# The headers read here: each may appear once.
_WATCHED = frozenset({b"host", b"origin", b"authorization", b"content-length", b"connection"}) | _HAND_OFF_FIELDS
_ACCEPTED_BODY = b"Accepted"


class Head:
    """The parts of a message POST's head that this path reads."""

    __slots__ = (
        "authorization", "close", "content_length", "gateway", "host", "origin", "refusal", "server", "session", "session_id"
    )  # fmt: skip

    def __init__(self) -> None:
        self.server = ""
        self.gateway: Gateway | None = None  # these two once admitted
        self.session: Session | None = None
        self.refusal: tuple[int, str, dict[str, str] | None] | None = None  # the answer, when refused
        self.session_id: str | None = None
        self.host: str | None = None
        self.origin: str | None = None
        self.authorization: str | None = None
        self.content_length = 0
        self.close = False


def parse_head(head: bytes) -> Head | None:
    """The head of a plain `POST /servers/{name}/messages?session_id=...` over HTTP/1.1, else None."""
    line_end = head.find(b"\r\n")
    request_line = head if line_end < 0 else head[:line_end]
    parts = request_line.split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
        return None
    out = Head()
    if not _target(parts[1], out):
        return None
    fields = b"" if line_end < 0 else head[line_end + 2 :] + b"\r\n"
    if _FIELDS.fullmatch(fields) is None:
        return None
    found: dict[bytes, bytes] = {}
    for name, value in _FIELD.findall(fields):
        name = name.lower()
        if name in _WATCHED:
            if name in found or name in _HAND_OFF_FIELDS:
                return None  # a repeat is ambiguous: aiohttp says what it means
            found[name] = value.strip(b" \t")
    host = found.get(b"host")
    if host is None:
        return None  # HTTP/1.1 requires it (RFC 9112, 3.2)
    out.host = _text(host)
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
    return out


def _target(target: bytes, out: Head) -> bool:
    path, _, query = target.partition(b"?")
    if not path.startswith(_PREFIX) or not path.endswith(_SUFFIX) or b"%" in target or b"+" in query:
        return False
    name = path[len(_PREFIX) : -len(_SUFFIX)]
    if not name or b"/" in name:
        return False
    out.server = name.decode("ascii", "surrogateescape")
    if query.startswith(b"session_id=") and b"&" not in query:  # what the endpoint event says
        out.session_id = query[11:].decode("ascii", "surrogateescape") or None
        return True
    found: dict[bytes, bytes] = {}
    for pair in query.split(b"&"):
        key, _, value = pair.partition(b"=")
        if key in (b"session_id", b"sessionId") and key not in found:
            found[key] = value
    session_id = found.get(b"session_id") or found.get(b"sessionId")
    out.session_id = session_id.decode("ascii", "surrogateescape") if session_id else None
    return True


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


def render(status: int, body: bytes, content_type: bytes, headers: dict[str, str] | None, close: bool) -> bytes:
    """One whole response."""
    lines = [
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n"
        % (status, _PHRASES.get(status, b""), content_type, len(body), _date())
    ]
    if headers:
        lines.extend(f"{k}: {v}\r\n".encode("latin-1", "replace") for k, v in headers.items())
    if close:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)


class Connections:
    """The connections this path holds now, and how many it ever accepted (every one starts here)."""

    def __init__(self) -> None:
        self.live: set[Connection] = set()
        self.accepted = 0

    def close_all(self) -> None:
        for connection in list(self.live):
            connection.close()


class Connection(asyncio.Protocol):
    """One client connection, until it sends a request this path leaves to aiohttp."""

    def __init__(self, app: web.Application, fallback: Callable[[], asyncio.Protocol], registry: Connections) -> None:
        self._app = app
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

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._registry.live.add(self)
        self._registry.accepted += 1
        peer = transport.get_extra_info("peername")
        self._remote = peer[0] if isinstance(peer, tuple) else None
        self._last_active = time.monotonic()
        self._idle = asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._detach()

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
        self._last_active = time.monotonic()
        if self._head is not None:
            data = self._more_body(data)
            if self._head is not None:
                return
        elif self._pending:
            data = self._pending + data
            self._pending = b""
        pos = 0
        while pos < len(data) and self._transport is not None:
            end = data.find(b"\r\n\r\n", pos)
            if end < 0:
                if len(data) - pos > MAX_HEAD:
                    self._hand_off(data[pos:])
                else:
                    self._pending = data[pos:]
                return
            head = parse_head(data[pos:end])
            if head is None:
                self._hand_off(data[pos:])
                return
            start = end + 4
            stop = start + head.content_length
            if not self._admit(head):
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
        app = self._app
        result = admit(app[common.LIVE].guard, head.host, head.origin, head.authorization, head.server)
        if result.__class__ is Refusal:
            refused(app[common.METRICS].rejected, result, f"/servers/{head.server}/messages", self._remote)  # type: ignore[arg-type]
            text = common.error_text(jsonrpc.INVALID_REQUEST, result.reason)  # type: ignore[union-attr]
            head.refusal = (result.status, text, result.headers)  # type: ignore[union-attr]
        else:
            try:
                head.gateway = common.gateway_named(app[common.GATEWAYS], head.server)
                head.session = sse.posted_session(head.gateway, head.session_id, result.name if result else None)  # type: ignore[union-attr]
                common.check_length(head.content_length, head.gateway)
            except web.HTTPException as exc:
                head.refusal = (exc.status, exc.text or "", _extra(exc.headers))
        if head.refusal is not None and (head.refusal[0] == 413 or head.content_length > DISCARD_LIMIT):
            head.close = True
            self._answer(head, b"")
            return False
        return True

    def _answer(self, head: Head, body: bytes) -> None:
        if head.refusal is not None:
            status, text, headers = head.refusal
            self._reply(head, status, text.encode(), _JSON, headers)
            return
        gateway, session = head.gateway, head.session
        assert gateway is not None and session is not None
        try:
            sse.take(gateway, session, common.decode_body(body, gateway))
        except web.HTTPException as exc:
            self._reply(head, exc.status, (exc.text or "").encode(), _JSON, _extra(exc.headers))
        except Exception:
            logs.get().exception("internal_error", where="message_post", server=head.server, session=session.id)
            self._reply(head, 500, common.error_text(jsonrpc.INTERNAL_ERROR, "internal error").encode(), _JSON, None)
        else:
            self._reply(head, 202, _ACCEPTED_BODY, _TEXT, None)

    def _reply(self, head: Head, status: int, body: bytes, content_type: bytes, headers: dict[str, str] | None) -> None:
        transport = self._transport
        if transport is None:
            return
        cors = cors_headers(self._app[common.LIVE].guard, head.origin)
        if cors is not None:
            headers = {**headers, **cors} if headers else cors
        transport.write(render(status, body, content_type, headers, head.close))
        if head.close:
            transport.close()
            self._detach()

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
        if idle >= IDLE_TIMEOUT_S:
            self._transport.close()
            self._detach()
        else:
            self._idle = asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S - idle, self._check_idle)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


_JSON = b"application/json"
_TEXT = b"text/plain; charset=utf-8"


def _extra(headers: Any) -> dict[str, str] | None:
    """An aiohttp error's headers other than the framing ones this path writes itself."""
    out = {k: v for k, v in (headers or {}).items() if k.lower() not in ("content-type", "content-length")}
    return out or None
