"""Forwarding: a request for a session another replica owns is streamed to it, and back.

The one place requests are forwarded. An aiohttp middleware (after the
access check, so the caller's principal is known) reads the session a
message POST, a Streamable GET or DELETE names and asks `cluster.Cluster`
where it lives. The fast path serves only ids with this replica's prefix
and hands every other request naming a session to aiohttp, so it all ends
here.

Forwarding opens one request to the owner through the daemon's one client
(a bounded pool of connections; `cluster.connect_timeout`), with the
client's end-to-end fields, every repeat in its order (its credentials,
which the owner checks again; each proxy's `X-Forwarded-For`), the body as
the client sent it (a compressed one is the owner's to decode), and
`X-MCP-Bridge-Forwarded`, and relays the answer chunk by chunk as it
comes: 202s, JSON bodies, SSE streams with their keepalives, resumed GET
streams. Nothing is buffered whole, and a client gone closes the request to
the owner. An owner that cannot be reached answers 404 at once (its
sessions died with it: the client starts a new one); an owner that dies
mid-answer ends the client's answer as an error (the connection closes
before the answer's end), never as a success.

A 2026-07-28 request has no session and is served where it arrives, even
with a stray `Mcp-Session-Id` (its `MCP-Protocol-Version` says what it is).
Its MRTR retry, though, resumes a call parked on the replica that answered
`input_required`, and names it only in its body's `requestState`. So
`http/endpoints/stateless_2026.py`, having read and verified the state, asks `place`
where the call is and calls `retry`, with the body it decoded (encoded
again: its params are what the state's digest binds, not its bytes), on
either HTTP path; the answer goes back through that path's reply, the
owner's events chunk by chunk. The same client, limits, counts and
owner-gone rules as for sessions; an owner gone answers the retry with a
JSON-RPC error at once, so that the client starts the call anew.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, assert_never
from urllib.parse import quote

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict, MultiMapping

from bridge import logs
from bridge.config.schema import Cluster as ClusterConfig
from bridge.core.cluster import EPOCH_HEADER, FORWARDED_HEADER, Cluster, Forward, Gone, Local, Owner
from bridge.http import state, streams, traced
from bridge.http.errors import RETRY_AFTER_S, HttpError
from bridge.http.reply import EventSink, Reply
from bridge.metrics import Forwarding
from bridge.protocol import jsonrpc, media
from bridge.protocol.mcp import STATELESS_VERSIONS

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from bridge.traces import HttpSpan
    from bridge.traces.spans import Spans  # imported only when tracing is on (traces/settings.py)

# Meant for one connection only (RFC 9110, 7.6.1), so never passed on.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
# Set by this replica on its own answer: its framing, and its CORS headers (the same config's).
_OWN_RESPONSE_HEADERS = HOP_BY_HOP | {"content-length", "vary", "access-control-allow-origin", "access-control-allow-credentials", "access-control-expose-headers"}
_REENCODED = frozenset({"content-length", "content-type", "content-encoding", "expect"})  # of a retry's body, which is sent anew
CALL_GONE = "requestState names a call that cannot go on"
OWNER_GONE = "unknown session: the replica that owned it is gone; start a new session"
STATELESS_VERSION_HEADER = "MCP-Protocol-Version"


class Forwarder:
    """This replica's side of the cluster: its ids, its client to the peers, its counts."""

    def __init__(self, cluster: Cluster, config: ClusterConfig, tls: bool, read_timeout: float, counts: Forwarding) -> None:
        self.cluster = cluster
        self.counts = counts
        self.in_flight = 0  # forwarded requests under way: each holds one connection to its owner
        # The GET streams among them (a session's standalone stream, a resumed one): a drain
        # does not wait for these, which last as long as their clients read.
        self._streams: set[aiohttp.ClientResponse] = set()
        self._draining = False
        self._limit = config.max_connections
        self._scheme = "https" if tls else "http"  # peers share the config, so they listen as this one does
        # No total limit: a forwarded stream lasts as long as the client reads it. Between two reads
        # an owner that is alive sends something within `read_timeout`: a stream its keepalives, a
        # JSON answer its result or a timeout error; one that stays silent longer (stopped, cut off
        # by the network after the connection was made) is gone.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=config.connect_timeout, sock_read=read_timeout)
        self._client: aiohttp.ClientSession | None = None
        self._log = logs.get()
        self.traces: Spans | None = None  # tracing, when on (the app sets it)
        self._spans: dict[aiohttp.ClientResponse, Span] = {}  # traced forwards under way, by the owner's answer

    async def start(self) -> None:
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._limit, limit_per_host=0, enable_cleanup_closed=True),
            timeout=self._timeout,
            cookie_jar=aiohttp.DummyCookieJar(),  # one client for every caller: it must remember nothing
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def calls(self) -> int:
        """Forwarded requests under way other than GET streams: what a drain waits for."""
        return self.in_flight - len(self._streams)

    def begin_drain(self) -> None:
        """SIGTERM: the GET streams relayed now end, cleanly (their clients resume them through
        another replica), and so does any that starts during the drain."""
        self._draining = True
        for upstream in list(self._streams):
            upstream.close()

    async def forward(self, request: web.Request, owner: Owner) -> web.StreamResponse:
        gone = HttpError(404, OWNER_GONE, jsonrpc.SESSION_CLOSED)
        data = request.content if request.body_exists else None
        headers = self._request_headers(request.headers)
        async with self._exchange(owner, request.method, request.raw_path, headers, data, gone, traced.span_of(request)) as (upstream, outcome):
            if request.method != "GET":
                return await self._relay(request, upstream, owner, outcome)
            self._streams.add(upstream)
            try:
                if self._draining:
                    upstream.close()  # its head still goes out: the stream is ended, not refused
                return await self._relay(request, upstream, owner, outcome)
            finally:
                self._streams.discard(upstream)

    def place(self, holder: Owner, forwarded: bool, rid: jsonrpc.RequestId | None) -> Owner | None:
        """Where a verified requestState's call is: None here, else the replica to forward the
        retry to; a 400 with a JSON-RPC error at once when that replica's life is over."""
        route = self.cluster.place(holder, forwarded)
        match route:
            case Local():
                return None
            case Gone(reason, outcome, epoch):
                self.counts.outcomes[outcome] += 1
                headers = {EPOCH_HEADER: epoch} if epoch is not None else None
                raise HttpError(400, f"{CALL_GONE}: {reason}; start the call anew", jsonrpc.INVALID_PARAMS, headers, rid)
            case Forward(owner):
                return owner
            case _:
                assert_never(route)

    async def retry(
        self,
        owner: Owner,
        server: str,
        headers: MultiMapping[str],
        body: bytes,
        reply: Reply,
        rid: jsonrpc.RequestId | None,
        unsent_limit: int,
        span: HttpSpan | None = None,
    ) -> None:
        """Forward an MRTR retry to the replica holding its call; its answer goes back through
        `reply`: a JSON body whole, a stream chunk by chunk (a client that leaves more than
        `unsent_limit` bytes unread is cut off, as a slow session is)."""
        gone = HttpError(400, f"{CALL_GONE}: the replica that held it is gone; start the call anew", jsonrpc.INVALID_PARAMS, request_id=rid)
        # The body is encoded again and sent whole: its own length and type, nothing to expect.
        out = self._request_headers(headers, _REENCODED)
        out["Content-Type"] = media.JSON
        path = f"/servers/{quote(server, safe='')}/mcp"
        async with self._exchange(owner, "POST", path, out, body, gone, span) as (upstream, outcome):
            sink: EventSink | None = None
            try:
                if upstream.content_type != media.SSE:
                    answer = await upstream.read()
                    self.counts.outcomes[outcome] += 1
                    reply.whole(upstream.status, answer)
                    return
                sink = reply.open_stream(None)
                reader = upstream.content
                while chunk := await reader.readany():
                    if reply.gone:
                        return  # the client went: leaving closes the request to the owner
                    sink.write(chunk)
                    if sink.unsent() > unsent_limit:
                        reply.abort()
                        return
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                self._broken(owner, exc, upstream)
                if sink is None:
                    raise gone from None
                reply.abort()  # a stream cut before its end reads as broken, not complete
                return
            self.counts.outcomes[outcome] += 1
            reply.end_stream()

    @contextlib.asynccontextmanager
    async def _exchange(
        self, owner: Owner, method: str, path: str, headers: CIMultiDict[str], data: Any, gone: HttpError, http: HttpSpan | None
    ) -> AsyncIterator[tuple[aiohttp.ClientResponse, str]]:
        """One request to `owner`, and its answer with the outcome it counts as; `gone` when the
        owner cannot be reached. `http`: the span of the request forwarded (tracing on)."""
        client = self._client
        assert client is not None, "forwarding before startup"
        counts = self.counts
        if self.in_flight >= self._limit:
            counts.outcomes["busy"] += 1
            raise HttpError(503, "too many requests being forwarded to other replicas", headers={"Retry-After": RETRY_AFTER_S})
        self.in_flight += 1
        started = time.monotonic()
        span = self.traces.forwarding(headers, method, owner.address, http) if self.traces is not None else None
        upstream: aiohttp.ClientResponse | None = None
        error: str | None = None
        try:
            try:
                upstream = await client.request(
                    method, f"{self._scheme}://{owner.address}{path}", headers=headers, data=data, allow_redirects=False
                )
            except (TimeoutError, aiohttp.ClientConnectionError, OSError) as exc:
                # Refused, unreachable, no connection or answer in time, or closed before answering:
                # what it held is gone with it.
                counts.outcomes["owner_gone"] += 1
                error = "owner_gone"
                ids = self.traces.log_ids(span) if self.traces is not None else {}
                self._log.warning("forward_owner_gone", owner=owner.address, epoch=owner.epoch, error=str(exc) or type(exc).__name__, **ids)
                raise gone from None
            counts.latency.observe(time.monotonic() - started)
            if span is not None:
                self._spans[upstream] = span
            async with upstream:
                epoch = upstream.headers.get(EPOCH_HEADER)
                outcome = "forwarded"
                if epoch is not None and epoch != owner.epoch:
                    self.cluster.owner_restarted(owner)  # later ids and states of that life: refused with no connection
                    outcome = "owner_restarted"
                yield upstream, outcome
        except BaseException as exc:
            error = error or type(exc).__name__
            raise
        finally:
            self.in_flight -= 1
            if span is not None and self.traces is not None:
                if upstream is not None and self._spans.pop(upstream, None) is None:
                    error = "broken"  # `_broken` took it out
                self.traces.forwarded(span, upstream.status if upstream is not None else None, error)

    def _request_headers(self, headers: MultiMapping[str], dropped: frozenset[str] = frozenset()) -> CIMultiDict[str]:
        """The client's end-to-end fields, every one in its order (each proxy's X-Forwarded-For
        line, say), and the forwarding mark; not those meant for one connection, nor `dropped`."""
        skipped = HOP_BY_HOP | connection_named(headers) | dropped
        out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in skipped)
        out[FORWARDED_HEADER] = self.cluster.advertise
        return out

    def _broken(self, owner: Owner, exc: BaseException, upstream: aiohttp.ClientResponse) -> None:
        self.counts.outcomes["broken"] += 1
        span = self._spans.pop(upstream, None)  # its span ends as broken
        ids = self.traces.log_ids(span) if self.traces is not None else {}
        self._log.warning("forward_broken", owner=owner.address, error=str(exc) or type(exc).__name__, **ids)

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse, owner: Owner, outcome: str) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        skipped = _OWN_RESPONSE_HEADERS | connection_named(upstream.headers)
        for name, value in upstream.headers.items():
            if name.lower() not in skipped:
                response.headers.add(name, value)
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        if request.transport is not None and upstream.content_type == "text/event-stream":
            streams.limit_unacked(request.transport)
        await response.prepare(request)
        reader = upstream.content
        while True:
            try:
                chunk = await reader.readany()
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                if upstream.closed and upstream in self._streams and self._draining:
                    break  # ended by the drain: cleanly, between two reads
                # The owner went mid-answer. Closing before the answer's end (the last chunk, or
                # Content-Length bytes) is how HTTP says the answer is broken, not complete.
                self._broken(owner, exc, upstream)
                if request.transport is not None:
                    request.transport.close()
                raise ConnectionResetError("the owning replica went mid-answer") from None
            if not chunk:
                break
            await response.write(chunk)  # a client gone raises here: aiohttp's to handle, the owner is fine
        self.counts.outcomes[outcome] += 1
        await response.write_eof()
        return response


def connection_named(headers: MultiMapping[str]) -> frozenset[str]:
    """The fields a message's Connection fields name: hop-by-hop too (RFC 9110, 7.6.1)."""
    return frozenset(t.strip().lower() for field in headers.getall("Connection", ()) for t in field.split(","))


def session_named(request: web.Request) -> str | None:
    """The session a request names, if it is one that names one: a message POST of HTTP+SSE, or
    a Streamable request (POST, GET, DELETE) with a session header."""
    info = request.match_info
    if "name" not in info and "group" not in info:
        return None
    path = request.path
    if path.endswith("/mcp"):
        headers = request.headers
        if request.method == "POST" and headers.get(STATELESS_VERSION_HEADER) in STATELESS_VERSIONS:
            return None  # 2026-07-28 has no sessions: a stray Mcp-Session-Id is ignored
        return headers.get("Mcp-Session-Id")
    if path.endswith("/messages"):
        query = request.query
        return query.get("session_id") or query.get("sessionId")
    return None


def middleware(forwarder: Forwarder) -> Middleware:
    """Requests naming another replica's session are forwarded; ones naming nobody's get 404."""
    cluster = forwarder.cluster

    @web.middleware
    async def route_by_owner(request: web.Request, handler: Handler) -> web.StreamResponse:
        session_id = session_named(request)
        if session_id is None:
            return await handler(request)
        route = cluster.route(session_id, state.principal(request), FORWARDED_HEADER in request.headers)
        match route:
            case Local():
                return await handler(request)
            case Gone(reason, outcome, epoch):
                forwarder.counts.outcomes[outcome] += 1
                # An id that names nobody reads as any unknown one; a dead owner's says its session closed.
                code = jsonrpc.INVALID_REQUEST if outcome in ("invalid", "second_hop") else jsonrpc.SESSION_CLOSED
                raise HttpError(404, reason, code, headers={EPOCH_HEADER: epoch} if epoch is not None else None)
            case Forward(owner):
                return await forwarder.forward(request, owner)
            case _:
                assert_never(route)

    return route_by_owner


CLUSTER = web.AppKey("cluster", Cluster)
FORWARDER = web.AppKey("forwarder", Forwarder)
