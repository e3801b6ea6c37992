"""The load generator: N sessions x K `tools/call` round trips, C in flight per session.

Library and command line. Modes:

- `sse`: the 2024-11-05 HTTP+SSE transport. Each session opens `GET <url>`,
  takes the `endpoint` event, and POSTs to it over a small pool of keep-alive
  connections of its own (up to C); responses come back on its stream.
- `streamable`: Streamable HTTP. Each POST carries `Accept: application/json,
  text/event-stream` (and `Mcp-Session-Id` after initialize); the reply is
  read as JSON or as an SSE body, whichever the server chose.
- `stateless`: Streamable HTTP at 2026-07-28: no `initialize` and no session.
  A "session" is one client with its own connections; it asks `server/discover`
  first (as `mcp.Client` does by default) and every POST carries the revision
  and the client's capabilities in `params._meta` and the `MCP-Protocol-Version`,
  `Mcp-Method` and `Mcp-Name` headers.
- `direct`: spawns the server command and speaks newline-delimited JSON-RPC
  on its stdin/stdout; the N sessions are independent id spaces on that one
  pipe (the floor every bridge adds to).

Every session first sends `initialize` and `notifications/initialized`
(session setup = connect until the initialize response; in `stateless` mode
the `server/discover` round trip instead). Each call carries a
token `s<session>c<call>|` (the start of the echo text, or the blob's tag), and
every response is checked: its id is one in flight for that session, its
text is exactly what was sent (echo) or has the right length and tag (blob);
a response carrying another session's token, or an id the session never
sent, counts as misrouted.

To keep its own cost per request low (it shares the cores with what it
measures) it uses asyncio protocols, hand-written HTTP/1.1 and SSE parsing,
callbacks instead of a task per call, pre-built request bytes, uvloop and
orjson when importable, and no garbage collection while it runs. Its CPU
share (own user+sys / wall / cores) is in the report.

    python -m bench.load --mode sse --url http://127.0.0.1:8080/servers/bench/sse -n 50 -k 200 -c 1
    python -m bench.load --mode stateless --url http://127.0.0.1:8080/servers/bench/mcp -n 200 -k 20 -c 1
    python -m bench.load --mode direct -n 1 -k 2000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import resource
import shlex
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

try:
    import orjson

    loads: Callable[[bytes], Any] = orjson.loads
    JSON_LIB = "orjson"
except ImportError:  # pragma: no cover - stdlib fallback
    loads = json.loads
    JSON_LIB = "json"

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "server.py")
DEFAULT_SERVER_CMD = [sys.executable, "-S", SERVER]
PROTOCOL_VERSION = "2025-11-25"
STATELESS_VERSION = "2026-07-28"
ID_SPACE = 10_000_000  # direct mode: session i uses ids i*ID_SPACE + 0..K
perf = time.perf_counter


@dataclass
class LoadConfig:
    mode: str = "sse"  # sse | streamable | stateless | direct
    url: str = ""  # sse: the GET url; streamable, stateless: the endpoint url
    server_cmd: list[str] = field(default_factory=lambda: list(DEFAULT_SERVER_CMD))  # direct
    sessions: int = 1
    calls: int = 100  # per session
    inflight: int = 1  # per session
    in_bytes: int = 0  # echo text size (0: just the token)
    out_bytes: int = 0  # blob size; > 0 calls `blob` instead of `echo`
    call_timeout: float = 30.0
    run_timeout: float = 300.0
    post_conns: int = 0  # sse: POST connections per session (0: as many as inflight)
    protocol_version: str = PROTOCOL_VERSION
    max_errors_kept: int = 10
    tool_prefix: str = ""  # before the tool's name: a group's member (`bench__echo`)


# ---------------------------------------------------------------- HTTP/1.1

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _EOF = range(7)
MAX_HEAD = 64 * 1024


class HttpError(Exception):
    pass


class HttpParser:
    """Incremental HTTP/1.1 response parser: status and headers, then a body by
    Content-Length, chunked, or to end of stream; loops for keep-alive."""

    __slots__ = ("buf", "state", "remaining", "on_head", "on_body", "on_end")

    def __init__(self, on_head: Callable[[int, dict[bytes, bytes]], None], on_body: Callable[[bytes], None], on_end: Callable[[], None]) -> None:
        self.buf = bytearray()
        self.state = _HEAD
        self.remaining = 0
        self.on_head = on_head
        self.on_body = on_body
        self.on_end = on_end

    def feed(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while buf:
            state = self.state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise HttpError("response head too large")
                    return
                lines = bytes(buf[:end]).split(b"\r\n")
                del buf[: end + 4]
                parts = lines[0].split(b" ", 2)
                if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
                    raise HttpError(f"bad status line {lines[0][:80]!r}")
                status = int(parts[1])
                headers: dict[bytes, bytes] = {}
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    headers[name.strip().lower()] = value.strip()
                if 100 <= status < 200:
                    continue
                self.on_head(status, headers)
                if status in (204, 304):
                    self.on_end()
                elif b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                    self.state = _CHUNK_SIZE
                elif b"content-length" in headers:
                    self.remaining = int(headers[b"content-length"])
                    if self.remaining:
                        self.state = _LENGTH
                    else:
                        self.on_end()
                else:
                    self.state = _EOF
            elif state in (_LENGTH, _CHUNK_DATA):
                n = self.remaining
                if len(buf) <= n:
                    chunk = bytes(buf)
                    buf.clear()
                else:
                    chunk = bytes(buf[:n])
                    del buf[:n]
                self.remaining -= len(chunk)
                if chunk:
                    self.on_body(chunk)
                if self.remaining:
                    return
                if state == _LENGTH:
                    self.state = _HEAD
                    self.on_end()
                else:
                    self.state = _CHUNK_END
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
                del buf[: end + 2]
                if size:
                    self.remaining = size
                    self.state = _CHUNK_DATA
                else:
                    self.state = _TRAILER
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    return
                del buf[:2]
                self.state = _CHUNK_SIZE
            elif state == _TRAILER:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[: end + 2]
                if end == 0:
                    self.state = _HEAD
                    self.on_end()
            else:  # _EOF: everything until the connection closes
                self.on_body(bytes(buf))
                buf.clear()

    def eof(self) -> None:
        if self.state == _EOF:
            self.state = _HEAD
            self.on_end()


class SseParser:
    """Incremental text/event-stream parser: `on_event(event, data)` per event, `on_comment()` per comment."""

    __slots__ = ("buf", "scan", "crlf", "on_event", "on_comment")

    def __init__(self, on_event: Callable[[bytes, bytes], None], on_comment: Callable[[], None] | None = None) -> None:
        self.buf = bytearray()
        self.scan = 0
        self.crlf = False
        self.on_event = on_event
        self.on_comment = on_comment

    def feed(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if self.crlf or b"\r" in data:
            self.crlf = True
            self.buf = buf = bytearray(buf.replace(b"\r\n", b"\n"))
        while True:
            end = buf.find(b"\n\n", self.scan)
            if end < 0:
                self.scan = max(0, len(buf) - 1)
                return
            block = bytes(buf[:end])
            del buf[: end + 2]
            self.scan = 0
            if block[:1] == b":" and b"\n" not in block:
                if self.on_comment is not None:
                    self.on_comment()
                continue
            event = b"message"
            data_lines = []
            for line in block.split(b"\n"):
                if line[:5] == b"data:":
                    data_lines.append(line[6:] if line[5:6] == b" " else line[5:])
                elif line[:6] == b"event:":
                    event = line[6:].strip()
                elif line[:1] == b":" and self.on_comment is not None:
                    self.on_comment()
            if data_lines:
                self.on_event(event, data_lines[0] if len(data_lines) == 1 else b"\n".join(data_lines))


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class HttpConn(asyncio.Protocol):
    """One keep-alive client connection in a PostPool; one request at a time."""

    __slots__ = ("pool", "transport", "parser", "status", "headers", "body", "tag", "closing")

    def __init__(self, pool: PostPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = HttpParser(self._head, self._body, self._end)
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.tag: Any = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _nodelay(transport)

    def send(self, data: bytes | list[bytes], tag: Any) -> None:
        self.tag = tag
        if data.__class__ is list:
            self.transport.writelines(data)  # type: ignore[union-attr]
        else:
            self.transport.write(data)  # type: ignore[union-attr,arg-type]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed(data)
        except (HttpError, ValueError) as exc:
            self.pool.broken(self, f"bad HTTP response: {exc}")

    def eof_received(self) -> bool | None:
        self.parser.eof()
        return None

    def _head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status
        self.headers = headers
        self.closing = headers.get(b"connection", b"").lower() == b"close"

    def _body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def _end(self) -> None:
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        self.pool.response(self, self.status, self.headers, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.lost(self)


class PostPool:
    """Keep-alive connections to one host: a request takes a free one, or opens one (up to
    `limit`), or waits. `on_response(tag, status, headers, body)`; status 0 means the
    connection failed before a response (body is the reason)."""

    def __init__(self, host: str, port: int, limit: int, on_response: Callable[[Any, int, dict[bytes, bytes] | None, bytes], None], local_addr: tuple[str, int] | None = None) -> None:
        self.host = host
        self.port = port
        self.limit = max(1, limit)
        self.on_response = on_response
        self.local_addr = local_addr
        self.free: list[HttpConn] = []
        self.conns: set[HttpConn] = set()
        self.opening = 0
        self.queue: deque[tuple[bytes | list[bytes], Any]] = deque()
        self.closed = False

    def submit(self, data: bytes | list[bytes], tag: Any) -> None:
        if self.free:
            self.free.pop().send(data, tag)
            return
        self.queue.append((data, tag))
        if len(self.conns) + self.opening < self.limit:
            self.opening += 1
            asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: HttpConn(self), self.host, self.port, local_addr=self.local_addr)
        except OSError as exc:
            self.opening -= 1
            if not self.conns and not self.opening:
                while self.queue:
                    _, tag = self.queue.popleft()
                    self.on_response(tag, 0, None, f"connect failed: {exc}".encode())
            return
        self.opening -= 1
        if self.closed:
            conn.transport.close()  # type: ignore[union-attr]
            return
        self.conns.add(conn)
        self._idle(conn)

    def _idle(self, conn: HttpConn) -> None:
        if self.queue:
            data, tag = self.queue.popleft()
            conn.send(data, tag)
        else:
            self.free.append(conn)

    def response(self, conn: HttpConn, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        tag = conn.tag
        conn.tag = None
        if conn.closing:
            conn.transport.close()  # type: ignore[union-attr]
        else:
            self._idle(conn)  # before the callback, which may submit the next request
        self.on_response(tag, status, headers, body)

    def broken(self, conn: HttpConn, reason: str) -> None:
        tag = conn.tag
        conn.tag = None
        conn.closing = True
        conn.transport.abort()  # type: ignore[union-attr]
        if tag is not None:
            self.on_response(tag, 0, None, reason.encode())

    def lost(self, conn: HttpConn) -> None:
        self.conns.discard(conn)
        if conn in self.free:
            self.free.remove(conn)
        tag = conn.tag
        conn.tag = None
        if tag is not None:
            self.on_response(tag, 0, None, b"connection closed before the response")
        if self.queue and not self.closed and len(self.conns) + self.opening < self.limit:
            self.opening += 1
            asyncio.get_running_loop().create_task(self._open())

    def close(self) -> None:
        self.closed = True
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.close()
        self.free.clear()


class SseStream(asyncio.Protocol):
    """A GET whose body is an SSE stream: `on_event(event, data)`, `on_comment()`, `on_lost(reason)`."""

    __slots__ = ("transport", "http", "sse", "on_event", "on_comment", "on_lost", "status", "done")

    def __init__(self, on_event: Callable[[bytes, bytes], None], on_comment: Callable[[], None] | None, on_lost: Callable[[str], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.http = HttpParser(self._head, self._body, self._end)
        self.sse = SseParser(on_event, on_comment)
        self.on_lost = on_lost
        self.status = 0
        self.done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.http.feed(data)
        except (HttpError, ValueError) as exc:
            self._fail(f"bad HTTP response on the stream: {exc}")

    def _head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status

    def _body(self, chunk: bytes) -> None:
        if self.status == 200:
            self.sse.feed(chunk)

    def _end(self) -> None:
        self._fail(f"stream ended (HTTP {self.status})")

    def _fail(self, reason: str) -> None:
        if not self.done:
            self.done = True
            if self.transport is not None:
                self.transport.abort()
            self.on_lost(reason)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"stream connection lost ({exc or 'closed'})")

    def close(self) -> None:
        self.done = True
        if self.transport is not None:
            self.transport.close()


def request_head(method: str, target: str, host: str, extra: list[tuple[str, str]] = ()) -> bytes:  # type: ignore[assignment]
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(lines) + "\r\n").encode()


def post_bytes(head: bytes, body: bytes) -> bytes | list[bytes]:
    """`head` has no Content-Length or blank line yet; a large body is written separately (no copy)."""
    top = head + b"Content-Length: %d\r\n\r\n" % len(body)
    return top + body if len(body) < 65536 else [top, body]


# ---------------------------------------------------------------- the run


class Run:
    """What all sessions of one run share: config, counters, latencies."""

    def __init__(self, cfg: LoadConfig) -> None:
        self.cfg = cfg
        self.loop = asyncio.get_running_loop()
        self.latencies: list[float] = []
        self.setups: list[float] = []
        self.errors = 0
        self.misrouted = 0
        self.late = 0
        self.error_samples: list[str] = []
        self.first_call = math.inf
        self.last_response = 0.0
        self.sessions: list[Session] = []
        tool = "blob" if cfg.out_bytes > 0 else "echo"
        self.tool = tool
        self.pad = b"x" * cfg.in_bytes
        self.pad_str = self.pad.decode()

    def error(self, reason: str) -> None:
        self.errors += 1
        if len(self.error_samples) < self.cfg.max_errors_kept:
            self.error_samples.append(reason[:300])


class Session:
    """One client session: setup, then K calls with C in flight, driven by callbacks."""

    transport_name = "none"
    call_meta = b""  # JSON members added to every tools/call's params (after `arguments`)

    def __init__(self, run: Run, idx: int, id_base: int = 0) -> None:
        self.run = run
        self.idx = idx
        self.id_base = id_base
        self.prefix = f"s{idx}c"
        self.prefix_b = self.prefix.encode()
        self.next = 0  # next call number to issue
        self.completed = 0  # calls answered, failed or timed out
        self.inflight: dict[Any, tuple[float, int]] = {}
        self.timed_out: set[Any] = set()
        self.finished = run.loop.create_future()
        self.t_connect = 0.0
        self.setup_done = False
        self.init_id = id_base
        self.init_sent = 0.0
        self.protocol_version = run.cfg.protocol_version
        cfg = run.cfg
        if run.tool == "echo":
            self._call_fmt = (
                b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"' + cfg.tool_prefix.encode() + b'echo","arguments":{"text":"%s'
                + b"%s"
                + b'"}'
                + self.call_meta
                + b"}}"
            )
        else:
            extra = b',"pad":"%s"' if cfg.in_bytes else b"%s"
            self._call_fmt = (
                b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"' + cfg.tool_prefix.encode() + b'blob","arguments":{"size":'
                + str(cfg.out_bytes).encode()
                + b',"tag":"%s"'
                + extra
                + b"}"
                + self.call_meta
                + b"}}"
            )

    # -- what each transport provides

    async def connect(self) -> None:
        raise NotImplementedError

    def send(self, body: bytes, rid: Any) -> None:
        raise NotImplementedError

    def send_notification(self, body: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    # -- the protocol

    def initialize_body(self) -> bytes:
        params = {
            "protocolVersion": self.protocol_version,
            "capabilities": {},
            "clientInfo": {"name": "mcp-bridge-bench", "version": "1"},
        }
        return json.dumps({"jsonrpc": "2.0", "id": self.init_id, "method": "initialize", "params": params}, separators=(",", ":")).encode()

    async def start(self) -> None:
        """Connect and initialize; calls start from the initialize response."""
        self.t_connect = perf()
        try:
            await self.connect()
        except (TimeoutError, OSError, HttpError, ValueError) as exc:
            self.fail_all(f"session setup failed: {exc.__class__.__name__}: {exc}")
            return
        self.init_sent = perf()
        self.send(self.initialize_body(), self.init_id)

    def on_initialized(self, msg: dict[str, Any]) -> None:
        run = self.run
        if "result" not in msg:
            self.fail_all(f"initialize failed: {str(msg.get('error'))[:200]}")
            return
        self.setup_done = True
        run.setups.append(perf() - self.t_connect)
        version = msg["result"].get("protocolVersion") if msg["result"].__class__ is dict else None
        if isinstance(version, str):
            self.protocol_version = version
        self.after_initialize()
        self.send_notification(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def after_initialize(self) -> None:
        pass

    def begin_calls(self) -> None:
        run = self.run
        now = perf()
        if now < run.first_call:
            run.first_call = now
        for _ in range(min(run.cfg.inflight, run.cfg.calls)):
            self.issue()
        if run.cfg.calls == 0:
            self._finish()

    def issue(self) -> None:
        k = self.next
        self.next = k + 1
        rid = self.id_base + k + 1
        tag = b"%s%d|" % (self.prefix_b, k)
        body = self._call_fmt % (rid, tag, self.run.pad[len(tag):]) if self.run.tool == "echo" else self._call_fmt % (rid, tag, self.run.pad)
        self.inflight[rid] = (perf(), k)
        self.send(body, rid)

    def on_message(self, data: bytes) -> None:
        """One JSON-RPC message that arrived for this session."""
        run = self.run
        try:
            msg = loads(data)
        except ValueError:
            run.error(f"session {self.idx}: a message that is not JSON: {data[:80]!r}")
            return
        if msg.__class__ is list:
            for m in msg:
                self._one(m)
        else:
            self._one(msg)

    def _one(self, msg: Any) -> None:
        run = self.run
        if msg.__class__ is not dict or "method" in msg:
            return  # a notification or request from the server: not part of the workload
        rid = msg.get("id")
        text = None
        result = msg.get("result")
        if result.__class__ is dict:
            try:
                text = result["content"][0]["text"]
            except (KeyError, IndexError, TypeError):
                text = None
            if text.__class__ is not str:
                text = None
        if text is not None and not text.startswith(self.prefix) and text[:1] == "s" and "|" in text[:24]:
            run.misrouted += 1  # another session's answer
            return
        entry = self.inflight.pop(rid, None)
        if entry is None:
            if rid == self.init_id and not self.setup_done and self.init_sent:
                self.on_initialized(msg)
            elif rid in self.timed_out:
                self.timed_out.discard(rid)
                run.late += 1
            else:
                run.misrouted += 1  # an id this session has not got in flight
            return
        now = perf()
        t0, k = entry
        if "error" in msg:
            run.error(f"session {self.idx} call {k}: error {str(msg['error'])[:200]}")
        elif text is None:
            run.error(f"session {self.idx} call {k}: no text content")
        elif self._content_ok(text, k):
            run.latencies.append(now - t0)
        else:
            run.error(f"session {self.idx} call {k}: wrong content ({len(text)} chars, starts {text[:30]!r})")
        if now > run.last_response:
            run.last_response = now
        self._completed()

    def _content_ok(self, text: str, k: int) -> bool:
        tag = f"{self.prefix}{k}|"
        if not text.startswith(tag):
            return False
        cfg = self.run.cfg
        if self.run.tool == "blob":
            return len(text) == cfg.out_bytes
        want = max(cfg.in_bytes, len(tag))
        return len(text) == want and (want == len(tag) or text.endswith(self.run.pad_str[: want - len(tag)]))

    def fail_call(self, rid: Any, reason: str) -> None:
        entry = self.inflight.pop(rid, None)
        if entry is None:
            if rid == self.init_id and not self.setup_done:
                self.fail_all(reason)
            return
        self.run.error(f"session {self.idx} call {entry[1]}: {reason}")
        self._completed()

    def _completed(self) -> None:
        self.completed += 1
        cfg = self.run.cfg
        if self.next < cfg.calls:
            self.issue()
        elif self.completed >= cfg.calls:
            self._finish()

    def expire(self, now: float, timeout: float) -> None:
        if not self.setup_done:
            if now - self.t_connect > timeout and self.t_connect:
                self.fail_all(f"session setup took over {timeout}s")
            return
        for rid, (t0, k) in list(self.inflight.items()):
            if now - t0 > timeout:
                del self.inflight[rid]
                self.timed_out.add(rid)
                self.run.error(f"session {self.idx} call {k}: no answer within {timeout}s")
                self._completed()

    def fail_all(self, reason: str) -> None:
        """The session is lost: every call not yet answered is an error."""
        if self.finished.done():
            return
        left = self.run.cfg.calls - self.completed
        self.inflight.clear()
        if left > 0:
            self.run.error(f"session {self.idx}: {reason} ({left} calls not answered)")
            self.run.errors += left - 1
        self.completed = self.next = self.run.cfg.calls
        self._finish()

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


class SseSession(Session):
    transport_name = "sse"

    def __init__(self, run: Run, idx: int, host: str, port: int, path: str, local_addr: tuple[str, int] | None = None) -> None:
        super().__init__(run, idx)
        self.host, self.port, self.path = host, port, path
        self.local_addr = local_addr
        self.stream: SseStream | None = None
        self.endpoint: asyncio.Future[str] = run.loop.create_future()
        limit = run.cfg.post_conns or run.cfg.inflight
        self.pool = PostPool(host, port, limit, self._posted, local_addr)
        self.post_head = b""
        self.hostport = f"{host}:{port}"

    async def connect(self) -> None:
        loop = self.run.loop
        _, self.stream = await loop.create_connection(
            lambda: SseStream(self._event, None, self._lost), self.host, self.port, local_addr=self.local_addr
        )
        self.stream.transport.write(  # type: ignore[union-attr]
            request_head("GET", self.path, self.hostport, [("Accept", "text/event-stream"), ("Cache-Control", "no-cache")]) + b"\r\n"
        )
        endpoint = await asyncio.wait_for(self.endpoint, self.run.cfg.call_timeout)
        parts = urlsplit(endpoint)
        target = parts.path + ("?" + parts.query if parts.query else "")
        if not target.startswith("/"):
            target = self.path.rsplit("/", 1)[0] + "/" + target
        self.post_head = request_head("POST", target, self.hostport, [("Content-Type", "application/json")])

    def _event(self, event: bytes, data: bytes) -> None:
        if event == b"message":
            self.on_message(data)
        elif event == b"endpoint" and not self.endpoint.done():
            self.endpoint.set_result(data.decode())

    def _lost(self, reason: str) -> None:
        if not self.endpoint.done():
            self.endpoint.set_exception(HttpError(reason))
        if not self.finished.done():
            self.fail_all(reason)

    def send(self, body: bytes, rid: Any) -> None:
        self.pool.submit(post_bytes(self.post_head, body), rid)

    def send_notification(self, body: bytes) -> None:
        self.pool.submit(post_bytes(self.post_head, body), _INITIALIZED)

    def _posted(self, tag: Any, status: int, headers: dict[bytes, bytes] | None, body: bytes) -> None:
        if tag is _INITIALIZED:
            if status in (200, 202):
                self.begin_calls()
            else:
                self.fail_all(f"notifications/initialized got HTTP {status}: {body[:200]!r}")
        elif status not in (200, 202):
            self.fail_call(tag, f"POST got HTTP {status}: {body[:200]!r}")

    def close(self) -> None:
        self.pool.close()
        if self.stream is not None:
            self.stream.close()


_INITIALIZED = object()


class StreamableSession(Session):
    transport_name = "streamable"

    def __init__(self, run: Run, idx: int, host: str, port: int, path: str) -> None:
        super().__init__(run, idx)
        self.host, self.port, self.path = host, port, path
        self.hostport = f"{host}:{port}"
        self.pool = PostPool(host, port, run.cfg.inflight, self._posted)
        self.head = self._head(None)
        self.session_id: str | None = None

    def _head(self, session_id: str | None) -> bytes:
        extra = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")]
        if session_id is not None:
            extra += [("Mcp-Session-Id", session_id), ("MCP-Protocol-Version", self.protocol_version)]
        return request_head("POST", self.path, self.hostport, extra)

    async def connect(self) -> None:
        pass  # the first POST (initialize) opens the connection

    def send(self, body: bytes, rid: Any) -> None:
        self.pool.submit(post_bytes(self.head, body), rid)

    def send_notification(self, body: bytes) -> None:
        self.pool.submit(post_bytes(self.head, body), _INITIALIZED)

    def after_initialize(self) -> None:
        self.head = self._head(self.session_id)

    def _posted(self, tag: Any, status: int, headers: dict[bytes, bytes] | None, body: bytes) -> None:
        if tag is _INITIALIZED:
            if status in (200, 202):
                self.begin_calls()
            else:
                self.fail_all(f"notifications/initialized got HTTP {status}: {body[:200]!r}")
            return
        if status != 200:
            self.fail_call(tag, f"POST got HTTP {status}: {body[:200]!r}")
            return
        assert headers is not None
        if self.session_id is None and b"mcp-session-id" in headers:
            self.session_id = headers[b"mcp-session-id"].decode()
        ctype = headers.get(b"content-type", b"")
        if ctype.startswith(b"text/event-stream"):
            SseParser(self._event).feed(body + b"\n\n")
        else:
            self.on_message(body)
        if tag in self.inflight:
            self.fail_call(tag, "the POST's reply did not carry its response")

    def _event(self, event: bytes, data: bytes) -> None:
        if event == b"message" and data.strip():
            self.on_message(data)

    def close(self) -> None:
        self.pool.close()


def modern_meta() -> dict[str, Any]:
    """The `_meta` members every 2026-07-28 request carries (clientInfo is a SHOULD)."""
    return {
        "io.modelcontextprotocol/protocolVersion": STATELESS_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "mcp-bridge-bench", "version": "1"},
    }


class StatelessSession(StreamableSession):
    """A 2026-07-28 client: `server/discover` (its setup), then calls that each stand alone."""

    transport_name = "stateless"
    call_meta = b',"_meta":' + json.dumps(modern_meta(), separators=(",", ":")).encode()

    def __init__(self, run: Run, idx: int, host: str, port: int, path: str) -> None:
        super().__init__(run, idx, host, port, path)
        self.protocol_version = STATELESS_VERSION
        self.discover_head = self._modern_head("server/discover", None)
        self.head = self._modern_head("tools/call", run.tool)

    def _modern_head(self, method: str, name: str | None) -> bytes:
        extra = [
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", STATELESS_VERSION),
            ("Mcp-Method", method),
        ]
        if name is not None:
            extra.append(("Mcp-Name", name))
        return request_head("POST", self.path, self.hostport, extra)

    def initialize_body(self) -> bytes:
        request = {"jsonrpc": "2.0", "id": self.init_id, "method": "server/discover", "params": {"_meta": modern_meta()}}
        return json.dumps(request, separators=(",", ":")).encode()

    def send(self, body: bytes, rid: Any) -> None:
        head = self.discover_head if rid == self.init_id and not self.setup_done else self.head
        self.pool.submit(post_bytes(head, body), rid)

    def on_initialized(self, msg: dict[str, Any]) -> None:
        result = msg.get("result")
        versions = result.get("supportedVersions") if result.__class__ is dict else None
        if versions.__class__ is not list or STATELESS_VERSION not in versions:
            self.fail_all(f"server/discover does not offer {STATELESS_VERSION}: {str(msg)[:200]}")
            return
        super().on_initialized(msg)

    def after_initialize(self) -> None:
        pass  # no session id: the call head stays as it is

    def send_notification(self, body: bytes) -> None:
        self.begin_calls()  # 2026-07-28 has no notifications/initialized


class DirectPipe(asyncio.SubprocessProtocol):
    """The server's stdout, split into lines and handed to the session that owns each id."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.buf = bytearray()
        self.exited = run.loop.create_future()
        self.ready = run.loop.create_future()  # answered the warm-up ping: the process is up
        self.stdin: asyncio.WriteTransport | None = None
        # Requests made while a read is being handled go out together in one write at its end.
        self.batching = False
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        if self.batching:
            self.out.append(data)
        else:
            self.stdin.write(data)  # type: ignore[union-attr]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd != 1:
            return
        self.batching = True
        try:
            buf = self.buf
            if not buf and data.endswith(b"\n") and data.count(b"\n") == 1:
                self._line(data)
                return
            buf += data
            start = 0
            while (end := buf.find(b"\n", start)) >= 0:
                self._line(bytes(buf[start:end]))
                start = end + 1
            del buf[:start]
        finally:
            self.batching = False
            if self.out:
                out, self.out = self.out, []
                if self.stdin is not None and not self.stdin.is_closing():
                    self.stdin.writelines(out) if len(out) > 1 else self.stdin.write(out[0])

    def _line(self, line: bytes) -> None:
        run = self.run
        try:
            msg = loads(line)
        except ValueError:
            run.error(f"server printed a line that is not JSON: {line[:80]!r}")
            return
        rid = msg.get("id") if msg.__class__ is dict else None
        if rid.__class__ is not int:
            return
        if rid == -1:
            if not self.ready.done():
                self.ready.set_result(None)
            return
        idx = rid // ID_SPACE
        if 0 <= idx < len(run.sessions):
            run.sessions[idx]._one(msg)
        else:
            run.misrouted += 1

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)
        for s in self.run.sessions:
            s.fail_all("server process exited")


class DirectSession(Session):
    transport_name = "direct"

    def __init__(self, run: Run, idx: int, pipe: DirectPipe) -> None:
        super().__init__(run, idx, id_base=idx * ID_SPACE)
        self.pipe = pipe

    async def connect(self) -> None:
        pass

    def send(self, body: bytes, rid: Any) -> None:
        if len(body) >= 65536:
            self.pipe.write(body)
            self.pipe.write(b"\n")
        else:
            self.pipe.write(body + b"\n")

    def send_notification(self, body: bytes) -> None:
        self.send(body, None)
        self.begin_calls()


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


async def run_load(cfg: LoadConfig) -> dict[str, Any]:
    """Run one workload and return the report."""
    loop = asyncio.get_running_loop()
    run = Run(cfg)
    proc_transport = None
    pipe = None
    if cfg.mode == "direct":
        proc_transport, pipe = await loop.subprocess_exec(
            lambda: DirectPipe(run), *cfg.server_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None
        )
        pipe.stdin = proc_transport.get_pipe_transport(0)  # type: ignore[assignment]
        # The clock starts once the process is up, as a bridge's server is before its clients come.
        pipe.stdin.write(b'{"jsonrpc":"2.0","id":-1,"method":"ping"}\n')  # type: ignore[union-attr]
        await asyncio.wait_for(pipe.ready, cfg.call_timeout)
        run.sessions = [DirectSession(run, i, pipe) for i in range(cfg.sessions)]
        target = " ".join(shlex.quote(a) for a in cfg.server_cmd)
    else:
        parts = urlsplit(cfg.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        path = parts.path + ("?" + parts.query if parts.query else "")
        if cfg.mode == "sse":
            run.sessions = [SseSession(run, i, host, port, path) for i in range(cfg.sessions)]
        elif cfg.mode == "streamable":
            run.sessions = [StreamableSession(run, i, host, port, path) for i in range(cfg.sessions)]
        elif cfg.mode == "stateless":
            run.sessions = [StatelessSession(run, i, host, port, path) for i in range(cfg.sessions)]
        else:
            raise ValueError(f"unknown mode {cfg.mode!r}")
        target = cfg.url

    gc.collect()
    gc.freeze()
    gc.disable()
    busy0 = machine_busy_seconds()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = perf()

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(0.2)
            now = perf()
            for s in run.sessions:
                if not s.finished.done():
                    s.expire(now, cfg.call_timeout)

    dog = loop.create_task(watchdog())
    starters = [loop.create_task(s.start()) for s in run.sessions]
    timed_out = False
    try:
        done, pending = await asyncio.wait([s.finished for s in run.sessions], timeout=cfg.run_timeout)
        if pending:
            timed_out = True
            for s in run.sessions:
                s.fail_all(f"run timeout of {cfg.run_timeout}s")
    finally:
        t1 = perf()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        busy1 = machine_busy_seconds()
        dog.cancel()
        for task in starters:
            task.cancel()
        for s in run.sessions:
            s.close()
        gc.enable()
        gc.unfreeze()
    if proc_transport is not None:
        proc_transport.get_pipe_transport(0).close()  # type: ignore[union-attr]
        try:
            await asyncio.wait_for(pipe.exited, 5)  # type: ignore[union-attr]
        except TimeoutError:
            proc_transport.kill()
        proc_transport.close()
    else:
        await asyncio.sleep(0.05)  # let the closes go out

    wall = t1 - t0
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    lat = sorted(run.latencies)
    setups = sorted(run.setups)
    requests = cfg.sessions * cfg.calls
    calls_wall = (run.last_response - run.first_call) if run.latencies and run.last_response > run.first_call else None
    return {
        "mode": cfg.mode,
        "target": target,
        "workload": {k: v for k, v in asdict(cfg).items() if k in ("sessions", "calls", "inflight", "in_bytes", "out_bytes")},
        "tool": run.tool,
        "uvloop": "uvloop" in type(loop).__module__,
        "json": JSON_LIB,
        "requests": requests,
        "ok": len(lat),
        "errors": run.errors,
        "misrouted": run.misrouted,
        "late": run.late,
        "timed_out_run": timed_out,
        "wall_s": round(wall, 4),
        "rps": round(len(lat) / wall, 1) if wall > 0 else None,
        "calls_wall_s": round(calls_wall, 4) if calls_wall else None,
        "rps_calls": round(len(lat) / calls_wall, 1) if calls_wall else None,
        "latency_ms": {
            "p50": ms(pct(lat, 0.50)),
            "p90": ms(pct(lat, 0.90)),
            "p99": ms(pct(lat, 0.99)),
            "max": ms(lat[-1] if lat else None),
            "mean": ms(sum(lat) / len(lat) if lat else None),
        },
        "setup_ms": {"p50": ms(pct(setups, 0.50)), "p99": ms(pct(setups, 0.99)), "n": len(setups)},
        "loadgen_cpu_s": round(cpu, 4),
        "loadgen_cpu_share": round(cpu / wall / (os.cpu_count() or 1), 4) if wall > 0 else None,
        "loadgen_cpu_us_per_call": round(cpu / len(lat) * 1e6, 1) if lat else None,
        "cores": os.cpu_count(),
        # CPU seconds the whole machine was busy during the run (all processes, kernel included).
        "machine_busy_s": round(busy1 - busy0, 4) if busy0 is not None and busy1 is not None else None,
        "error_samples": run.error_samples,
    }


def machine_busy_seconds() -> float | None:
    """CPU seconds all cores spent busy since boot (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(parts[:8]) - parts[3] - parts[4]) / os.sysconf("SC_CLK_TCK")


def raise_nofile(wanted: int | None = None) -> int:
    """Raise this process's open-file limit (to the hard limit by default); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    goal = hard if wanted is None else min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted
    if goal != resource.RLIM_INFINITY and soft < goal:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (goal, hard))
            soft = goal
        except (ValueError, OSError):
            pass
    return soft


def install_uvloop(enabled: bool = True) -> bool:
    if not enabled:
        return False
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["sse", "streamable", "stateless", "direct"], default="sse")
    p.add_argument("--url", default="", help="sse: the GET url (…/sse); streamable, stateless: the endpoint (…/mcp)")
    p.add_argument("--server-cmd", default=None, help="direct: the server command line (default: python -S bench/server.py)")
    p.add_argument("-n", "--sessions", type=int, default=1)
    p.add_argument("-k", "--calls", type=int, default=100, help="calls per session")
    p.add_argument("-c", "--inflight", type=int, default=1, help="calls in flight per session")
    p.add_argument("--in-bytes", type=int, default=0, help="echo text size (0: just the token)")
    p.add_argument("--out-bytes", type=int, default=0, help="call `blob` returning this many bytes instead of `echo`")
    p.add_argument("--call-timeout", type=float, default=30.0)
    p.add_argument("--run-timeout", type=float, default=300.0)
    p.add_argument("--post-conns", type=int, default=0, help="sse: POST connections per session (default: --inflight)")
    p.add_argument("--protocol-version", default=PROTOCOL_VERSION)
    p.add_argument("--tool-prefix", default="", help="before each tool's name: a group's member and separator (bench__)")
    p.add_argument("--no-uvloop", action="store_true")
    p.add_argument("--indent", type=int, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode != "direct" and not args.url:
        print("--url is required for sse, streamable and stateless", file=sys.stderr)
        return 2
    cfg = LoadConfig(
        mode=args.mode,
        url=args.url,
        server_cmd=shlex.split(args.server_cmd) if args.server_cmd else list(DEFAULT_SERVER_CMD),
        sessions=args.sessions,
        calls=args.calls,
        inflight=args.inflight,
        in_bytes=args.in_bytes,
        out_bytes=args.out_bytes,
        call_timeout=args.call_timeout,
        run_timeout=args.run_timeout,
        post_conns=args.post_conns,
        protocol_version=args.protocol_version,
        tool_prefix=args.tool_prefix,
    )
    raise_nofile()
    install_uvloop(not args.no_uvloop)
    report = asyncio.run(run_load(cfg))
    print(json.dumps(report, indent=args.indent))
    return 0 if report["errors"] == 0 and report["misrouted"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
