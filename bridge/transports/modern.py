"""2026-07-28 requests at `/servers/{name}/mcp`: each one a short-lived mux session.

`streamable.answer_post` hands a POST here when its body carries the modern
`_meta` (both HTTP paths, aiohttp's and the fast path, go through it). After
the checks of `stateless` (envelope, mirrored headers, version, removed
methods), the request gets a `StatelessSession` of its own, which the mux
adopts already initialized with the request's capabilities, version, log
level and principal. The session's messages are the request's: progress and
log messages open an SSE stream (while there are none, the answer stays one
JSON body with the status the spec gives its error code); the final response
ends the exchange and closes the session. A client that goes away closes the
session, which cancels the call upstream.

MRTR. A server request the mux routes to such a session (sampling,
elicitation, roots) ends the exchange with `resultType: "input_required"`:
the request(s), and a sealed `requestState` naming the parked session. The
session stays open, parked, until the client's retry (same method and params
but for `inputResponses` and `requestState`) feeds the answers to the mux as
the client's responses and takes the exchange over, or until
`limits.request_state_ttl` passes: then it is closed, so the server's request
gets an error and the call is cancelled. Parked sessions count against the
server's session limit. In a cluster the state names the replica (address and
epoch) holding the call and is sealed under a key every replica derives from
the peer key: a retry that reaches another replica is verified there and
forwarded to the holder (transports/forward.py), or refused at once when the
holder's life is over.

`subscriptions/listen` is a session that listens: it subscribes (through the
mux's reference-counted subscriptions) to what the client asked for,
acknowledges once those are in place, then streams the notifications it asked
for, each tagged with its subscription id, until the client closes the stream.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from .. import jsonrpc, stateless
from ..cluster import FORWARDED_HEADER
from ..gateway import Gateway
from ..jsonrpc import Message, RequestId
from ..sessions import Session
from ..stateless import Envelope, ModernError, State, StateKeys
from . import common, forward, http
from .http import EventSink, HttpError

if TYPE_CHECKING:
    from .streamable import PostHead

_LISTEN = "subscriptions/listen"
_LISTEN_ID = "mcp-bridge-listen"  # ids of the bridge's own requests in a listen session (its own: no clash)
_TOOL_HEADERS_KEPT = 4096  # tools whose x-mcp-header names are remembered, per server


class ModernReply(Protocol):
    """How a modern request's answer goes out (aiohttp's response, or the fast path's connection)."""

    def plain(self, status: int, body: bytes) -> Any: ...

    async def open_stream(self, session_id: str | None) -> EventSink: ...

    @property
    def gone(self) -> bool: ...

    def request_headers(self) -> Mapping[str, str]:
        """The request's headers (the fast path's: those it reads): what a forwarded retry carries."""

    def abort(self) -> None:
        """Close the connection mid-answer: the client reads its answer as broken."""


class StatelessSession(Session):
    """One modern request (or listen stream): what the mux says to it, in order."""

    transport = "stateless"
    logged = False
    era = stateless.MODERN_VERSION

    def __init__(self, server: str, owner: str | None, queue_limit: int, queue_bytes: int) -> None:
        super().__init__(server, owner)
        self.queue: deque[tuple[bytes, RequestId | None, bool]] = deque()
        self._limit = queue_limit
        self._byte_limit = queue_bytes
        self._bytes = 0  # of the messages in queue
        self.ping_due = False
        self._waiter: asyncio.Future[None] | None = None

    def deliver(self, data: bytes, related: RequestId | None, final: bool) -> bool:
        if len(self.queue) >= self._limit or self._bytes + len(data) > self._byte_limit:
            return False  # limits.session_queue(_bytes): the gateway drops the session as too slow
        self.queue.append((data, related, final))
        self._bytes += len(data)
        self._wake()
        return True

    def pop(self) -> tuple[bytes, RequestId | None, bool]:
        item = self.queue.popleft()
        self._bytes -= len(item[0])
        return item

    def ask_again(self, requests: list[bytes]) -> None:
        """Put server requests a retry left unanswered back in front, in order."""
        self.queue.extendleft((data, None, False) for data in reversed(requests))
        self._bytes += sum(len(data) for data in requests)

    def attached(self) -> bool:
        return True  # its exchange, or its parking's expiry, decides when it ends: never idle-reaped

    def keepalive(self) -> None:
        self.ping_due = True
        self._wake()

    def end(self, reason: str) -> None:
        super().end(reason)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None


@dataclass(eq=False)
class Parked:
    """A call waiting for its client's input: the session, and what the client was asked."""

    key: str
    gateway: Gateway
    session: StatelessSession
    principal: str | None
    method: str
    digest: str
    asked: dict[str, Message]  # input key -> the server request, as the client was shown it
    ids: dict[str, RequestId]  # input key -> the server request's id at the session
    call_id: RequestId  # the original request's id: its call's answer carries it
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class Parking:
    """The daemon's parked calls and the key that seals their `requestState`s."""

    keys: StateKeys = field(default_factory=StateKeys)
    forwarder: forward.Forwarder | None = None  # in a cluster: where retries for other replicas' calls go
    parked: dict[str, Parked] = field(default_factory=dict)
    # server -> tool name -> its x-mcp-header names and the argument paths they mirror
    tool_headers: dict[str, dict[str, dict[str, tuple[str, ...]]]] = field(default_factory=dict)

    @classmethod
    def of(cls, forwarder: forward.Forwarder | None) -> Parking:
        if forwarder is None:
            return cls()
        cluster = forwarder.cluster
        return cls(StateKeys(cluster.derived("requestState"), cluster.me), forwarder)

    def park(self, parked: Parked, ttl: float) -> None:
        self.parked[parked.key] = parked
        parked.timer = asyncio.get_running_loop().call_later(ttl, self.expire, parked.key)

    def unpark(self, key: str) -> Parked | None:
        parked = self.parked.pop(key, None)
        if parked is not None and parked.timer is not None:
            parked.timer.cancel()
        return parked

    def expire(self, key: str) -> None:
        parked = self.parked.pop(key, None)
        if parked is not None:
            parked.gateway.log.info("input_expired", method=parked.method, principal=parked.principal, asked=len(parked.asked))
            parked.gateway.close_session(parked.session, "input_timeout")

    def learn_tools(self, server: str, result: Any) -> None:
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return
        known = self.tool_headers.setdefault(server, {})
        for tool in tools:
            found = stateless.tool_headers(tool)
            if found is not None and (found[0] in known or len(known) < _TOOL_HEADERS_KEPT):
                known[found[0]] = found[1]


PARKING = web.AppKey("parking", Parking)


# ------------------------------------------------------------------ answers


async def answer(head: PostHead, payload: Any, reply: ModernReply) -> Any:
    """Answer a modern POST (a decoded body that `stateless.is_modern`)."""
    try:
        return await _answer(head, payload, reply)
    except ModernError as exc:
        head.gateway.metrics.error_sent({"code": exc.code})
        return reply.plain(exc.status, exc.body())
    except HttpError as exc:
        # A refusal of the daemon's (limits, rate limits): its error names the request too.
        if exc.request_id is None and "method" in payload and jsonrpc.is_id(payload.get("id")):
            exc.request_id = payload["id"]
        raise


async def _answer(head: PostHead, msg: Message, reply: ModernReply) -> Any:
    gateway = head.gateway
    try:
        kind = jsonrpc.classify(msg)
    except jsonrpc.ProtocolError as exc:
        raise ModernError(exc.code, exc.message, request_id=exc.request_id) from None
    if kind is jsonrpc.Kind.NOTIFICATION:
        # 2026-07-28 defines no client notifications over HTTP (a client cancels by closing its stream).
        return reply.plain(202, b"")
    if kind is jsonrpc.Kind.RESPONSE:
        raise ModernError(jsonrpc.INVALID_REQUEST, "a 2026-07-28 client sends no responses: input goes in a retry's inputResponses")
    env = stateless.envelope(msg)
    tools = gateway.name in head.parking.tool_headers and msg["method"] == "tools/call"
    known = head.parking.tool_headers[gateway.name].get(msg["params"].get("name")) if tools else None
    stateless.check_headers(msg, env, head.mirrored, known)
    stateless.check_version(msg, env)
    method = msg["method"]
    if method in stateless.REMOVED:
        raise stateless.removed(msg)
    accept = head.accept
    if accept and not http.quality(accept, http.SSE) and (method == _LISTEN or not http.quality(accept, http.JSON)):
        wanted = http.SSE if method == _LISTEN else f"{http.JSON} or {http.SSE}"
        raise HttpError(406, f"{method} needs Accept: {wanted}", request_id=msg["id"])
    if method == _LISTEN:
        return await _listen(head, msg, env, reply)
    params = msg["params"]
    if params.get("requestState") is not None:
        return await _resume(head, msg, reply)
    # No requestState: a fresh call. Its inputResponses (SEP-2322: a client may answer ahead)
    # answer the server's requests whose keys they name; the rest of them is ignored.
    params.pop("requestState", None)
    offered = params.pop("inputResponses", {})
    if not isinstance(offered, dict):
        raise ModernError(jsonrpc.INVALID_PARAMS, "inputResponses must be an object", request_id=msg["id"])
    # Before routing: the mux rewrites the id in place (and, of the params, only what is in _meta,
    # which a digest leaves out), so the params are digested only if the call is ever parked.
    rid, digest = msg["id"], functools.partial(stateless.digest, params)
    stateless.strip_envelope(params)
    session = await _open(head, env)
    try:
        common.route(gateway, session, msg)
    except BaseException:
        gateway.close_session(session, "refused")
        raise
    return await _exchange(head, session, rid, method, rid, reply, digest, offered)


async def _open(head: PostHead, env: Envelope, notices: frozenset[str] = frozenset()) -> StatelessSession:
    gateway = head.gateway
    limits = gateway.limits
    session = StatelessSession(gateway.name, head.principal, limits.session_queue, limits.slow_bytes)
    await common.open_session(gateway, session)
    gateway.adopt(session, env.capabilities, env.version, env.client_info, env.log_level, notices)
    return session


async def _exchange(
    head: PostHead,
    session: StatelessSession,
    call_id: RequestId,
    method: str,
    reply_id: RequestId,
    reply: ModernReply,
    digest: Callable[[], str],
    offered: dict[str, Any],
) -> Any:
    """Carry the session's messages to this exchange until the call's final answer (the
    exchange's end), a server request (answered input_required, the session parked, unless
    `offered`, the call's inputResponses not spent yet, answers it), or the client going (the
    session closed: the call is cancelled upstream)."""
    gateway = head.gateway
    sink: EventSink | None = None
    asked: dict[str, Message] = {}
    ids: dict[str, RequestId] = {}
    parked = False
    reason = "answered"
    can_stream = bool(head.accept) and http.quality(head.accept, http.SSE) > 0
    try:
        while True:
            while session.queue:
                data, related, final = session.pop()
                if final and related == call_id:
                    return await _finish(head, session, data, method, reply_id, reply, sink)
                msg = jsonrpc.decode(data)
                if "method" in msg and "id" in msg:  # a server request: MRTR
                    if method not in stateless.MRTR_METHODS:
                        # Only these may be answered input_required: the server's question gets an error.
                        refusal = f"{msg['method']} during {method}: 2026-07-28 asks the client only during tools/call, prompts/get and resources/read"
                        gateway.from_client(session, jsonrpc.error(msg["id"], jsonrpc.METHOD_NOT_FOUND, refusal))
                        continue
                    key = _input_key(gateway, session, msg["id"], asked)
                    if key in offered:
                        if not session.ended:
                            gateway.from_client(session, _response(msg["id"], key, offered.pop(key)))
                        continue
                    asked[key] = {"method": msg["method"], **({"params": msg["params"]} if "params" in msg else {})}
                    ids[key] = msg["id"]
                    continue
                if msg.get("method") == "notifications/cancelled":
                    # The server withdrew a request of its own: the client never saw its id, so
                    # it is not asked (again) rather than told.
                    withdrawn = msg.get("params", {}).get("requestId")
                    for key in [k for k, downstream in ids.items() if downstream == withdrawn]:
                        del asked[key], ids[key]
                    continue
                if sink is None and can_stream and not asked:
                    sink = await reply.open_stream(None)
                if sink is not None:
                    await sink.write(_event(data))
            if asked:
                parked = True
                return await _input_required(head, session, method, reply_id, call_id, reply, sink, asked, ids, digest)
            if session.ended:
                ended = jsonrpc.error(reply_id, jsonrpc.SESSION_CLOSED, f"request ended before its answer: {session.end_reason}")
                if sink is None:
                    return reply.plain(503, jsonrpc.encode(ended))
                await sink.write(_event(jsonrpc.encode(ended)))
                return None
            if session.ping_due:
                session.ping_due = False
                if sink is not None:
                    await sink.write(common.PING)
                elif reply.gone:
                    reason = "client closed stream"
                    return None
            await session.wait()
    except (ConnectionResetError, asyncio.CancelledError):
        reason = "client closed stream"  # closing the session (below) cancels the call upstream
        return None
    finally:
        if not parked:
            gateway.close_session(session, reason)


async def _finish(
    head: PostHead, session: StatelessSession, data: bytes, method: str, reply_id: RequestId, reply: ModernReply, sink: EventSink | None
) -> Any:
    if method == "server/discover":
        msg = jsonrpc.decode(data)
        if msg.get("result").__class__ is dict:
            msg["result"] = stateless.discover(msg["result"])
            data = jsonrpc.encode(msg)
    elif method == "tools/list":
        head.parking.learn_tools(head.gateway.name, jsonrpc.decode(data).get("result"))
    body, status = stateless.answer(data, method, reply_id, _server(head, session))
    if sink is not None:
        await sink.write(_event(body))
        return None
    return reply.plain(status, body)


def _server(head: PostHead, session: StatelessSession) -> stateless.Server:
    init = head.gateway.init_result(session)
    return stateless.Server(init.get("serverInfo") if init else None, head.gateway.server.cache_scope)


async def _input_required(
    head: PostHead,
    session: StatelessSession,
    method: str,
    reply_id: RequestId,
    call_id: RequestId,
    reply: ModernReply,
    sink: EventSink | None,
    asked: dict[str, Message],
    ids: dict[str, RequestId],
    digest: Callable[[], str],
) -> Any:
    gateway = head.gateway
    parking = head.parking
    key = secrets.token_urlsafe(16)
    ttl = gateway.limits.request_state_ttl
    salient = digest()
    parking.park(Parked(key, gateway, session, head.principal, method, salient, asked, ids, call_id), ttl)
    token = parking.keys.seal(State(key, head.principal, method, salient, gateway.name), ttl)
    body = jsonrpc.encode(jsonrpc.result(reply_id, stateless.input_required(asked, token, _server(head, session))))
    if sink is not None:
        await sink.write(_event(body))
        return None
    return reply.plain(200, body)


async def _resume(head: PostHead, msg: Message, reply: ModernReply) -> Any:
    """A retry: check its requestState, give the parked call the client's answers, and
    carry the call on in this exchange."""
    gateway, parking = head.gateway, head.parking
    params = msg["params"]
    rid = msg["id"]
    token = params.get("requestState")
    try:
        state = parking.keys.open(token, rid)
    except ModernError as exc:
        _spoil(parking, stateless.StateKeys.peek(token), head, exc.message)
        raise
    if state.server != gateway.name or state.principal != head.principal:
        # Never another principal's call to end: it stays parked for its owner.
        raise ModernError(jsonrpc.INVALID_PARAMS, "requestState was issued to another client or server", request_id=rid)
    forwarder = parking.forwarder
    if forwarder is not None and state.owner is not None:
        headers = reply.request_headers()
        owner = forwarder.place(state.owner, FORWARDED_HEADER in headers, rid)
        if owner is not None:
            return await forwarder.retry(owner, gateway.name, headers, jsonrpc.encode(msg), reply, rid)
    if state.method != msg["method"] or state.digest != stateless.digest(params):
        _spoil(parking, state.park, head, "retry does not match the original request")
        raise ModernError(
            jsonrpc.INVALID_PARAMS, "requestState does not match this request: a retry repeats the original method and params", request_id=rid
        )
    responses = params.get("inputResponses", {})
    if not isinstance(responses, dict):
        _spoil(parking, state.park, head, "inputResponses is not an object")
        raise ModernError(jsonrpc.INVALID_PARAMS, "inputResponses must be an object", request_id=rid)
    parked = parking.unpark(state.park)
    if parked is None:
        raise ModernError(jsonrpc.INVALID_PARAMS, "requestState names a call that has ended (it expired or failed)", request_id=rid)
    session = parked.session
    offered = dict(responses)
    answered = [key for key in parked.asked if key in offered]
    answers = [_response(parked.ids.pop(key), key, offered.pop(key)) for key in answered]
    for key in answered:
        del parked.asked[key]
    if answers and not session.ended:
        gateway.from_client(session, answers)
    # What was asked and not answered is asked again, first thing (in a new input_required).
    session.ask_again([jsonrpc.encode({"jsonrpc": "2.0", "id": parked.ids[k], **request}) for k, request in parked.asked.items()])
    return await _exchange(head, session, parked.call_id, parked.method, rid, reply, lambda: parked.digest, offered)


def _input_key(gateway: Gateway, session: StatelessSession, downstream: RequestId, taken: dict[str, Message]) -> str:
    """The key a server request gets in `inputRequests`: the server's own id when it is a
    string (servers name their questions so), else one made of the id it has here; a key
    already taken in this result gets a suffix."""
    server_id = gateway.server_request_id(session, downstream)
    base = server_id if isinstance(server_id, str) and server_id else f"r{downstream}"
    key, n = base, 1
    while key in taken:  # ends: each round takes a new suffix, and `taken` is finite
        n += 1
        key = f"{base}#{n}"
    return key


def _response(downstream: RequestId, key: str, value: Any) -> Message:
    """The client's input for one server request, as the mux takes a client's response."""
    if isinstance(value, dict):
        return jsonrpc.result(downstream, value)
    return jsonrpc.error(downstream, jsonrpc.INVALID_PARAMS, f"inputResponses[{key!r}] is not an object")


def _spoil(parking: Parking, key: str | None, head: PostHead, why: str) -> None:
    """End a parked call whose owner's retry was refused: the server's request gets an error."""
    if key is None:
        return
    parked = parking.parked.get(key)
    if parked is None or parked.principal != head.principal or parked.gateway is not head.gateway:
        return
    parking.unpark(key)
    head.gateway.log.info("input_refused", method=parked.method, principal=parked.principal, reason=why)
    head.gateway.close_session(parked.session, "input_refused")


# ------------------------------------------------------------------ listen


async def _listen(head: PostHead, msg: Message, env: Envelope, reply: ModernReply) -> Any:
    gateway = head.gateway
    rid = msg["id"]
    wanted = msg["params"].get("notifications")
    if wanted is None:
        wanted = {}
    if not isinstance(wanted, dict):
        raise ModernError(jsonrpc.INVALID_PARAMS, "notifications must be an object", request_id=rid)
    uris = wanted.get("resourceSubscriptions", [])
    if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
        raise ModernError(jsonrpc.INVALID_PARAMS, "notifications.resourceSubscriptions must be a list of strings", request_id=rid)
    notices = {method for flag, (method, _) in stateless.LIST_CHANGES.items() if wanted.get(flag) is True}
    if uris:
        notices.add(stateless.RESOURCE_UPDATED)
    session = await _open(head, env, frozenset(notices))
    try:
        agreed = await _subscribe(gateway, session, wanted, list(dict.fromkeys(uris)), rid)
        sink = await reply.open_stream(None)
        meta = {stateless.SUBSCRIPTION_KEY: rid}
        ack = jsonrpc.notification("notifications/subscriptions/acknowledged", {"_meta": meta, "notifications": agreed})
        await sink.write(_event(jsonrpc.encode(ack)))
        while not sink.gone:
            while session.queue:
                data, related, _ = session.pop()
                if related is not None:
                    continue  # a late answer to the bridge's own subscribe
                note = jsonrpc.decode(data)
                params = note.get("params")
                if params.__class__ is not dict:
                    params = note["params"] = {}
                note_meta = params.get("_meta")
                params["_meta"] = {**note_meta, **meta} if note_meta.__class__ is dict else meta
                await sink.write(_event(jsonrpc.encode(note)))
            if session.ended:
                # The bridge ends it (shutdown, server gone): a response says it ended gracefully.
                done = jsonrpc.result(rid, {"resultType": "complete", "_meta": meta})
                await sink.write(_event(jsonrpc.encode(done)))
                return None
            if session.ping_due:
                session.ping_due = False
                await sink.write(common.PING)
            await session.wait()
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        gateway.close_session(session, "client closed stream")
    return None


async def _subscribe(gateway: Gateway, session: StatelessSession, wanted: dict[str, Any], uris: list[str], rid: RequestId) -> dict[str, Any]:
    """Ask the mux for the server's capabilities and for each resource subscription, and wait
    for all of them: the subset of `wanted` the server honours."""
    requests = [jsonrpc.request(f"{_LISTEN_ID}-d", "server/discover", {})]
    requests += [jsonrpc.request(f"{_LISTEN_ID}-{i}", "resources/subscribe", {"uri": uri}) for i, uri in enumerate(uris)]
    pending = {r["id"] for r in requests}
    common.route(gateway, session, requests)
    answers: dict[RequestId, Message] = {}
    deadline = time.monotonic() + gateway.limits.request_timeout
    while pending:
        while session.queue and pending:
            data, related, final = session.pop()
            if final and related is not None and related in pending:
                pending.discard(related)
                answers[related] = jsonrpc.decode(data)
        if not pending:
            break
        if session.ended or time.monotonic() > deadline:
            raise HttpError(503, "listen ended before its subscriptions were in place", jsonrpc.SESSION_CLOSED, request_id=rid)
        await session.wait()
    capabilities = answers[f"{_LISTEN_ID}-d"].get("result", {}).get("capabilities", {})
    agreed: dict[str, Any] = {}
    for flag, (_, capability) in stateless.LIST_CHANGES.items():
        cap = capabilities.get(capability)
        if wanted.get(flag) is True and isinstance(cap, dict) and cap.get("listChanged"):
            agreed[flag] = True
    held = [uri for i, uri in enumerate(uris) if "result" in answers[f"{_LISTEN_ID}-{i}"]]
    if uris:
        agreed["resourceSubscriptions"] = held
    return agreed


def _event(data: bytes) -> bytes:
    return b"event: message\ndata: %s\n\n" % data
