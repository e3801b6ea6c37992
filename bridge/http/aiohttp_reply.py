"""aiohttp's side of a Streamable HTTP answer: `AiohttpReply`, an `reply.Reply` over an aiohttp
response, and `AiohttpHead`, what a POST's endpoint may read of an aiohttp request's head."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web
from multidict import CIMultiDictProxy

from bridge.http import errors, state, streams
from bridge.http.errors import HttpError
from bridge.http.reply import chunk
from bridge.protocol import media, stateless
from bridge.protocol.mcp import SESSION_HEADER, VERSION_HEADER

if TYPE_CHECKING:
    from bridge.traces import HttpSpan


class AiohttpHead:
    """A `RequestHead` over an aiohttp request (the fast path's `Head` is the other)."""

    __slots__ = ("_headers", "_span")

    def __init__(self, headers: CIMultiDictProxy[str], span: HttpSpan | None = None) -> None:
        self._headers = headers
        self._span = span

    def fields(self) -> CIMultiDictProxy[str]:
        return self._headers

    def mirrored(self) -> stateless.Headers:
        return mirrored(self._headers)

    def trace_context(self) -> tuple[str, str] | None:
        """Its W3C trace context headers, `traceparent` and `tracestate` (http/traced.py)."""
        parent = self._headers.get("traceparent")
        return (parent, self._headers.get("tracestate", "")) if parent else None

    def http_span(self) -> HttpSpan | None:
        return self._span


class AiohttpReply:
    """An `reply.Reply` through aiohttp: the handler waits in `send` for what the exchange
    decides, then sends it; a stream's events go straight to the socket, as `SseSession`'s do."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._response: web.StreamResponse | None = None
        self._headers: dict[str, str] | None = None  # a stream's, once decided
        self._early: list[bytes] = []  # events written before the stream's head went out
        self._out: asyncio.Transport | None = None
        self._chunked = True
        self._ended = False
        self._left: Callable[[], object] | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def streaming(self) -> bool:
        return self._headers is not None

    @property
    def gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    def whole(self, status: int, body: bytes, session_id: str | None = None) -> None:
        if self._ended:
            return  # answered already: nothing more is said
        headers = {SESSION_HEADER: session_id} if session_id else None
        if body:
            self._response = web.Response(status=status, body=body, content_type=media.JSON, headers=headers)
        else:
            self._response = web.Response(status=status, headers=headers, content_type="text/plain", charset="utf-8")  # as the fast path's
        self._end()

    def error(self, exc: HttpError) -> None:
        if self._ended:
            return
        if self.streaming:
            self.abort()
        else:
            state.refused(self._request, exc)
            self._response = errors.render(exc)
            self._end()

    def open_stream(self, session_id: str | None, first: bytes = b"") -> AiohttpReply:
        self._headers = {SESSION_HEADER: session_id} if session_id else {}
        if first:
            self._early.append(first)
        self._wake()
        return self

    def write(self, data: bytes) -> None:
        if not self._ended:
            self._put(data)

    def _put(self, data: bytes) -> None:
        out = self._out
        if out is None:
            self._early.append(data)
        elif not out.is_closing():
            out.write(chunk(data) if self._chunked else data)

    def unsent(self) -> int:
        out = self._out
        return out.get_write_buffer_size() if out is not None else sum(map(len, self._early))

    def end_stream(self, last: bytes = b"") -> None:
        if self._ended:
            return
        if self._headers is None:
            self.open_stream(None)  # ended before it began: still a stream, an empty one
        if last:
            self.write(last)
        self._end()  # aiohttp writes the last chunk when the handler returns

    def abort(self) -> None:
        if self._ended:
            return
        if self._request.transport is not None:
            self._request.transport.close()
        self._end()

    def watch(self, left: Callable[[], object]) -> None:
        self._left = left


    def _end(self) -> None:
        self._ended = True
        self._left = None
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    async def send(self) -> web.StreamResponse:
        """Wait for the answer and send it: a whole response, or the stream until it ends."""
        try:
            while not self._ended and self._headers is None:
                await self._wait()
            if self._headers is None:
                assert self._response is not None
                return self._response
            self._response = await streams.open_stream(self._request, self._headers)
            self._out = self._request.transport
            self._chunked = self._response.headers.get("Transfer-Encoding") == "chunked"
            if self._early:
                early, self._early = b"".join(self._early), []
                self._put(early)
            while not self._ended:
                await self._wait()
        except (ConnectionResetError, asyncio.CancelledError):
            # The client went away. Return rather than re-raise, so that no cancelled task
            # keeps this frame in a cycle.
            left, self._left = self._left, None
            if left is not None:
                left()
        return self._response or web.StreamResponse()  # aiohttp wants one even when the client went


_MIRRORING = ("MCP-Protocol-Version", "Mcp-Method", "Mcp-Name")


def mirrored(headers: CIMultiDictProxy[str]) -> stateless.Headers:
    """What a 2026-07-28 request's headers mirror of its body."""
    repeated = next((name for name in _MIRRORING if len(headers.getall(name, ())) > 1), None)
    params: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith("mcp-param-"):
            if lower[10:] in params:
                repeated = name
            params[lower[10:]] = value
    return stateless.Headers(headers.get(VERSION_HEADER), headers.get("Mcp-Method"), headers.get("Mcp-Name"), params, repeated)
