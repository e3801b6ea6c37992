"""2026-07-28 requests at `/servers/{name}/mcp`: each one served by a mux session of its own.

The dispatcher (endpoints/post.py) hands a POST here when its body carries the 2026-07-28
`_meta` (both HTTP paths, aiohttp's and the fast path, go through it). After
`stateless.admit` (envelope, mirrored headers, version, removed methods,
Accept), the request gets a `StatelessSession` no other call is using, which the mux
adopts already initialized with the request's capabilities, version, log
level and principal. The session's messages are the request's: progress and
log messages open an SSE stream (while there are none, the answer stays one
JSON body with the status the spec gives its error code); the final response
ends the exchange and closes the session, or, in shared mode, keeps it open,
idle, for the principal's next call with the same capabilities (`keep`:
only when nothing of the call is left at the server; it hears nothing while
it waits). A client that goes away closes the session, which cancels the
call upstream.

MRTR. A server request the mux routes to such a session (sampling,
elicitation, roots) ends the exchange with `resultType: "input_required"`:
the request(s), and a sealed `requestState` naming the parked session. The
session stays open, parked, until the client's retry (same method and params
but for `inputResponses` and `requestState`) feeds the answers to the mux as
the client's responses and takes the exchange over, or until
`limits.request_state_ttl` passes: then it is closed, so the server's request
gets an error and the call is cancelled. A parked session that ends otherwise
(an administrator, its server gone) leaves the parking: its retry is told
the call has ended. Parked sessions count against the
server's session limit. In a cluster the state names the replica (address and
epoch) holding the call and is sealed under a key every replica derives from
the peer key: a retry that reaches another replica is verified there and
forwarded to the holder (http/forward.py), or refused at once when the
holder's life is over.

`subscriptions/listen` is a session that listens: it subscribes (through the
mux's reference-counted subscriptions) to what the client asked for,
acknowledges once those are in place, then streams the notifications it asked
for, each tagged with its subscription id, until the client closes the stream.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge import logs
from bridge.core import request_state
from bridge.core.cluster import FORWARDED_HEADER
from bridge.core.request_state import State, StateKeys
from bridge.gateway.gateway import Gateway, SessionLimitError
from bridge.gateway.sessions import Served, Session, Spares
from bridge.http import errors, forward, state, streams
from bridge.http.endpoints.base import Post
from bridge.http.errors import HttpError
from bridge.http.reply import EventSink, Reply, later
from bridge.http.streams import event
from bridge.protocol import jsonrpc, mcp, media, stateless
from bridge.protocol.jsonrpc import Message, RequestId
from bridge.protocol.stateless import Envelope, StatelessError

_LISTEN_ID = "mcp-bridge-listen"  # ids of the bridge's own requests in a listen session (its own: no clash)
_TOOL_HEADERS_KEPT = 4096  # tools whose x-mcp-header names are remembered, per server
_request_numbers = itertools.count(1)
_NO_NOTICES: frozenset[str] = frozenset()  # a call's session hears only about its call
# Capabilities longer than this, encoded, are never a kept session's kind: a client's are
# about a hundred bytes, and a kept session holds its kind for as long as it waits.
_SPARE_KIND_BYTES = 1024


class StatelessSession(Session):
    """One 2026-07-28 request at a time (or a listen stream): what the mux says to it, in order. Whatever
    answers it (an `Exchange`, a `Listen`) is `driver`, run at every flush, at its end and
    when a keepalive is due: no task waits on it. A call's answer delivered with nothing
    before it is taken by the driver at that delivery, never queued."""

    transport = "stateless"
    logged = False
    addressed = False
    era = mcp.STATELESS_VERSION

    def __init__(self, server: str, owner: str | None, queue_limit: int, queue_bytes: int) -> None:
        super().__init__(server, owner, f"req-{next(_request_numbers)}")  # unique in this daemon's life
        self.queue: deque[tuple[bytes, RequestId | None, bool]] = deque()
        self._limit = queue_limit
        self._byte_limit = queue_bytes
        self._bytes = 0  # of the messages in queue
        self.ping_due = False
        self.driver: Driver | None = None  # none while parked: the queue waits for the retry
        # Its call's (a listen stream has none): the request that made it, what it asks, and
        # the HTTP status of its answer once `finish` has made it a 2026-07-28 one.
        self.post: Post[Gateway] | None = None
        self.parking: Parking | None = None
        self.method = ""
        self.status = 200
        # What its principal's next call must share to be served by it once this one is
        # answered (None: never: it asked for log messages, or its server is not shared),
        # and, while it waits idle for one, the spares it is kept among.
        self.spare_key: Hashable | None = None
        self.kept_in: Spares | None = None
        self.adopted = False  # by the mux, as its request's `_meta` says: it may carry the request
        # While its call waits for the client's retry: where it is parked, and under which key.
        self.parked_in: tuple[Parking, str] | None = None

    def finish(self, message: Message) -> None:
        """Its call's answer, as a legacy server gave it, made a 2026-07-28 one in place."""
        post, method = self.post, self.method
        if post is None:
            return  # a listen stream's: answers to the bridge's own requests
        result = message.get("result")
        if result.__class__ is dict:
            if method == "server/discover":
                message["result"] = stateless.discover(result)
            elif method == "tools/list" and self.parking is not None:
                self.parking.learn_tools(post.gateway.name, result)
        self.status = stateless.complete(message, method, post.gateway.identity(self))

    def deliver(self, data: bytes, related: RequestId | None, final: bool) -> bool:
        driver = self.driver
        if final and driver is not None and not self.queue and driver.takes(data, related):
            return True  # its request's answer, with nothing before it: sent as it came
        if self.kept_in is not None:
            return True  # idle, kept for a call to come: what was said after the last one is not for it
        # Written to its stream and not yet taken by the socket counts too, as for SseSession.
        unsent = driver.sink.unsent() if driver is not None and driver.sink is not None else 0
        if len(self.queue) >= self._limit or self._bytes + unsent + len(data) > self._byte_limit:
            return False  # limits.session_queue(_bytes): the gateway drops the session as too slow
        self.queue.append((data, related, final))
        self._bytes += len(data)
        return True

    def flush(self) -> None:
        if self.driver is not None:
            self.driver.pump()

    def pop(self) -> tuple[bytes, RequestId | None, bool]:
        item = self.queue.popleft()
        self._bytes -= len(item[0])
        return item

    def ask_again(self, requests: list[bytes]) -> None:
        """Put server requests a retry left unanswered back in front, in order."""
        self.queue.extendleft((data, None, False) for data in reversed(requests))
        self._bytes += sum(len(data) for data in requests)

    def attached(self) -> bool:
        # Its exchange, or its parking's expiry, decides when it ends; kept idle, it is
        # ended as any session is after limits.session_idle_timeout.
        return self.kept_in is None

    def reached(self) -> bool:
        return self.driver is not None  # parked or kept, nothing reads it

    def keep(self, spares: Spares) -> bool:
        """Once its call is answered: wait, idle and open, for a call of its principal's of
        the same kind, if it may (nothing of its call is left at the server) and there is
        room among the server's spares. Whether it is kept."""
        key = self.spare_key
        if key is None or self.post is None or not self.post.gateway.quiet(self) or not spares.keep(key, self):
            return False
        self.queue.clear()
        self._bytes = 0
        self.ping_due = False
        self.post, self.parking, self.method, self.status = None, None, "", 200
        self.last_seen = time.monotonic()  # idle from now, not from when its call began
        self.kept_in = spares
        return True

    def keepalive(self) -> None:
        self.ping_due = True
        self.flush()

    def end(self, reason: str) -> None:
        super().end(reason)
        if self.kept_in is not None:
            self.kept_in.drop(self.spare_key, self)
            self.kept_in = None
        if self.parked_in is not None:
            # Ended while parked (an administrator, its server gone): a retry is told the call has ended.
            parking, key = self.parked_in
            parking.unpark(key)
        driver = self.driver
        if driver is None:
            return  # parked (waiting for its retry, or unparked just now), or its driver is what closed it
        if reason == "slow" and driver.sink is not None and driver.sink.unsent():
            driver.drop()  # its socket is not being read: only an abort frees what is queued for it
        else:
            driver.pump()


class Driver:
    """What answers a StatelessSession's request from its queue. `pump` is reentrant-safe:
    what it sets off (a response to the server, the session closing) may deliver and flush
    again while it runs; that round is taken once it is done. A bug in a step ends this
    request with a 500, never the flush of the server's output that ran it."""

    __slots__ = ("_again", "_running", "post", "over", "reply", "session", "sink")

    def __init__(self, post: Post[Gateway], session: StatelessSession, reply: Reply) -> None:
        self.post = post
        self.session = session
        self.reply = reply
        self.sink: EventSink | None = None  # once the answer is a stream
        self.over = False  # answered, parked, or its client went: nothing more to do
        self._running = False
        self._again = False

    def start(self) -> None:
        session = self.session
        session.driver = self
        self.reply.watch(self.left)
        if session.queue or session.ended:  # else its first step waits for the first delivery
            self.pump()

    def pump(self) -> None:
        if self.over:
            return
        if self._running:
            self._again = True
            return
        self._run(self._steps)

    def takes(self, data: bytes, related: RequestId | None) -> bool:
        """Take a final response delivered with nothing queued before it, as it comes,
        if that ends the request: no queue, no step."""
        return False

    def step(self) -> None:
        raise NotImplementedError

    def _steps(self) -> None:
        again = True
        while again and not self.over:  # ends: each round is one more flush of the session's
            self._again = False
            self.step()
            again = self._again

    def _run(self, work: Callable[..., None], *args: Any) -> None:
        self._running = True
        try:
            work(*args)
        except Exception:
            logs.get().exception("internal_error", where="stateless_request", server=self.post.gateway.name, session=self.session.id)
            self.close("internal error")
            self.reply.error(errors.INTERNAL_ERROR)
        finally:
            self._running = False

    def left(self) -> None:
        """The client closed its stream: closing the session cancels the call upstream."""
        if not self.over:
            self.close("client closed stream")

    def close(self, reason: str) -> None:
        self.over = True
        session = self.session
        session.driver = None
        gateway = self.post.gateway
        if reason != "answered" or not session.keep(gateway.spares):
            gateway.close_session(session, reason)

    def drop(self) -> None:
        """Its session was closed as too slow: the answer is cut off, not ended."""
        self.over = True
        self.session.driver = None
        self.reply.abort()


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
        parked.session.parked_in = (self, parked.key)
        parked.timer = asyncio.get_running_loop().call_later(ttl, self.expire, parked.key)

    def unpark(self, key: str) -> Parked | None:
        parked = self.parked.pop(key, None)
        if parked is not None:
            parked.session.parked_in = None
            if parked.timer is not None:
                parked.timer.cancel()
        return parked

    def expire(self, key: str) -> None:
        parked = self.unpark(key)
        if parked is not None:
            trace = parked.gateway.trace_fields(parked.session.id, parked.call_id)
            parked.gateway.log.info("input_expired", method=parked.method, principal=parked.principal, asked=len(parked.asked), **trace)
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




# ------------------------------------------------------------------ answers


async def refusing(post: Post[Any], payload: Message, reply: Reply, step: Awaitable[None]) -> None:
    """A step run by `reply.later`, whose refusals are answered as `answer` answers them (a
    group's endpoint runs its own so too)."""
    try:
        await step
    except StatelessError as exc:
        refuse(post.gateway, reply, exc)
    except HttpError as exc:
        name_request(exc, payload)
        raise


def refuse(served: Served, reply: Reply, exc: StatelessError) -> None:
    """Answer a refused 2026-07-28 request: its error, with the status the spec gives it."""
    served.metrics.error_sent({"code": exc.code})
    reply.whole(exc.status, exc.body())


def name_request(exc: HttpError, payload: Any) -> None:
    """A refusal of the daemon's (limits, rate limits): its error names the request too."""
    if exc.request_id is None and "method" in payload and jsonrpc.is_id(payload.get("id")):
        exc.request_id = payload["id"]


def answer(post: Post[Gateway], msg: Message, reply: Reply, parking: Parking) -> None:
    """Answer a 2026-07-28 POST (a decoded body that `stateless.is_stateless`)."""
    try:
        if not is_request(msg, reply):
            return
        gateway = post.gateway
        env = stateless.admit(msg, post.request.mirrored(), post.accept, parking.tool_headers.get(gateway.name))
        method, params = msg["method"], msg["params"]
        if method == mcp.LISTEN:
            _listen(post, msg, env, reply)
            return
        offered: dict[str, Any] = {}
        if "requestState" in params or "inputResponses" in params:
            if params.get("requestState") is not None:
                _resume(post, msg, reply, parking)
                return
            # No requestState: a fresh call. Its inputResponses (SEP-2322: a client may answer ahead)
            # answer the server's requests whose keys they name; the rest of them is ignored.
            params.pop("requestState", None)
            offered = params.pop("inputResponses", {})
            if not isinstance(offered, dict):
                raise StatelessError(jsonrpc.INVALID_PARAMS, "inputResponses must be an object", request_id=msg["id"])
        stateless.strip_envelope(params)
        # Calls that share a principal and capabilities are alike to the mux: one may take
        # another's answered session. Not one that asks for log messages (a kept session would
        # keep the server's level up), nor where each request has a process of its own.
        spare_key: Hashable | None = None
        if env.log_level is None and gateway.server.mode == "shared":
            alike = jsonrpc.encode(env.capabilities)
            spare_key = (post.principal, post.group, alike) if len(alike) <= _SPARE_KIND_BYTES else None
        session = _open(post, env, _NO_NOTICES, spare_key)
        if session.adopted:
            _call(post, parking, msg, method, params, reply, offered, session)
        else:
            _open_later(post, msg, env, reply, _NO_NOTICES, session, functools.partial(_call, post, parking, msg, method, params, reply, offered))
    except StatelessError as exc:
        refuse(post.gateway, reply, exc)
    except HttpError as exc:
        name_request(exc, msg)
        raise


def is_request(msg: Any, reply: Reply) -> bool:
    """Whether a 2026-07-28 POST is a request to serve: a notification is answered here (202:
    2026-07-28 defines none a client sends over HTTP; a client cancels by closing its stream);
    a response, or what is not JSON-RPC, raises StatelessError."""
    try:
        kind = jsonrpc.classify(msg)
    except jsonrpc.ProtocolError as exc:
        raise StatelessError(exc.code, exc.message, request_id=exc.request_id) from None
    if kind is jsonrpc.NOTIFICATION:
        reply.whole(202, b"")
        return False
    if kind is jsonrpc.RESPONSE:
        raise StatelessError(jsonrpc.INVALID_REQUEST, "a 2026-07-28 client sends no responses: input goes in a retry's inputResponses")
    return True


def _call(
    post: Post[Gateway], parking: Parking, msg: Message, method: str, params: dict[str, Any], reply: Reply, offered: dict[str, Any], session: StatelessSession
) -> None:  # fmt: skip
    """A fresh call, routed in its session and answered by an `Exchange`."""
    gateway = post.gateway
    rid = msg["id"]  # before routing, which rewrites it in place
    # `params` is digested only if the call is ever parked: of them, routing changes only what
    # is in _meta, which a digest leaves out.
    exchange = Exchange(post, parking, session, rid, method, rid, reply, params, offered)  # before routing: what it routes may be answered at once
    if gateway.traces is not None:
        session.http_trace = post.request.http_span()
    try:
        state.route(gateway, session, msg, jsonrpc.REQUEST)
    except BaseException:
        gateway.close_session(session, "refused")
        raise
    exchange.start()


def _open(post: Post[Gateway], env: Envelope, notices: frozenset[str], spare_key: Hashable | None) -> StatelessSession:
    """A session for the request: a kept one under `spare_key` if there is one, else a new one
    adopted as its `_meta` says, at once when its process is at hand (the common case); if it
    is not `adopted` yet, `_open_later` waits for its process."""
    gateway = post.gateway
    if spare_key is not None and gateway.accepting:  # stopping: refused below, as a new session is
        spare = gateway.spares.take(spare_key)
        if isinstance(spare, StatelessSession):
            spare.kept_in = None
            return spare
    limits = gateway.limits
    session = StatelessSession(gateway.name, post.principal, limits.session_queue, limits.slow_bytes)
    session.group = post.group
    session.spare_key = spare_key
    try:
        session.adopted = gateway.open_request(session, env, notices)
    except SessionLimitError as exc:
        raise state.unavailable(exc) from None
    return session


def _open_later(
    post: Post[Gateway], msg: Message, env: Envelope, reply: Reply, notices: frozenset[str], session: StatelessSession,
    then: Callable[[StatelessSession], None],
) -> None:  # fmt: skip
    """`then`, once the session `_open` made has its process and is adopted."""
    arrived = time.time_ns() if post.gateway.traces is not None else None  # a traced request's span begins here
    later(reply, refusing(post, msg, reply, _opened(post.gateway, session, env, notices, then, arrived)), "stateless_request")


async def _opened(
    gateway: Gateway, session: StatelessSession, env: Envelope, notices: frozenset[str], then: Callable[[StatelessSession], None], arrived: int | None
) -> None:
    try:
        await gateway.open_request_later(session, env, notices)
    except SessionLimitError as exc:
        raise state.unavailable(exc) from None
    session.adopted = True
    session.waited_from = arrived
    try:
        then(session)
    finally:
        session.waited_from = None


class Exchange(Driver):
    """A call's answer under way: its session's messages carried to the reply, until the
    call's final answer (the exchange's end), a server request (answered input_required,
    the session parked, unless `offered`, the call's inputResponses not spent yet, answers
    it), or the client going (the session closed: the call is cancelled upstream)."""

    __slots__ = ("asked", "call_id", "ids", "method", "offered", "parking", "reply_id", "salient")

    def __init__(
        self,
        post: Post[Gateway],
        parking: Parking,
        session: StatelessSession,
        call_id: RequestId,
        method: str,
        reply_id: RequestId,
        reply: Reply,
        salient: Mapping[str, Any] | str,
        offered: dict[str, Any],
    ) -> None:
        super().__init__(post, session, reply)
        # What a retry must repeat: the call's params (digested only if it is ever parked), or
        # for a retry, their digest.
        self.call_id, self.method, self.reply_id, self.salient, self.offered = call_id, method, reply_id, salient, offered
        self.parking = parking
        self.asked: dict[str, Message] = {}  # input key -> the server request, as the client is shown it
        self.ids: dict[str, RequestId] = {}  # input key -> the server request's id at the session
        session.post, session.parking, session.method = post, parking, method  # how its answer is finished (a retry's post as good as the first's)

    def takes(self, data: bytes, related: RequestId | None) -> bool:
        # Not while a step runs (what it routes may answer at once): that step takes it in turn.
        if related != self.call_id or self.sink is not None or self._running:
            return False
        self._run(self._finish, data, b"")
        return True

    def step(self) -> None:
        session, asked = self.session, self.asked
        events: list[bytes] = []
        while session.queue:
            data, related, final = session.pop()
            if final and related == self.call_id:
                self._finish(data, b"".join(events))
                return
            msg = jsonrpc.decode(data)
            if "method" in msg and "id" in msg:  # a server request: MRTR
                # Only during tools/call, prompts/get and resources/read: the mux refuses the rest.
                gateway, ids, offered = self.post.gateway, self.ids, self.offered
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
                withdrawn, ids = msg.get("params", {}).get("requestId"), self.ids
                for key in [k for k, downstream in ids.items() if downstream == withdrawn]:
                    del asked[key], ids[key]
                continue
            if self.sink is not None or (not asked and _can_stream(self.post.accept)):
                events.append(event(data))
        if events:
            self._send(b"".join(events))
        if asked:
            self._input_required()
        elif session.ended:
            ended = jsonrpc.encode(jsonrpc.error(self.reply_id, jsonrpc.SESSION_CLOSED, f"request ended before its answer: {session.end_reason}"))
            self._end(ended, 503)
        elif session.ping_due:
            session.ping_due = False
            if self.sink is not None:
                self.sink.write(streams.PING)

    def _send(self, events: bytes) -> None:
        """Events before the answer: the first opens the stream (the answer is SSE from then on)."""
        if self.sink is None:
            self.sink = self.reply.open_stream(None, events)
        else:
            self.sink.write(events)

    def _end(self, body: bytes, status: int, events: bytes = b"") -> None:
        """The exchange's last word: the answer's body (an event when streaming), then the session closes."""
        self.close("answered")
        if self.sink is None and not events and stateless.accepts(self.post.accept)[1]:
            self.reply.whole(status, body)
        else:
            self.reply.end_stream(events + event(body))

    def _finish(self, data: bytes, events: bytes) -> None:
        """The call's answer, finished as it was delivered (`StatelessSession.finish`)."""
        if self.reply_id != self.call_id:
            data = stateless.with_id(data, self.reply_id)  # a retry's answer carries the retry's id
        self._end(data, self.session.status, events)

    def _input_required(self) -> None:
        post, gateway, parking = self.post, self.post.gateway, self.parking
        session = self.session
        self.over = True
        session.driver = None  # parked: its queue waits for the retry
        key = secrets.token_urlsafe(16)
        ttl = gateway.limits.request_state_ttl
        salient = self.salient if isinstance(self.salient, str) else request_state.digest(self.salient)
        parking.park(Parked(key, gateway, session, post.principal, self.method, salient, self.asked, self.ids, self.call_id), ttl)
        token = parking.keys.seal(State(key, post.principal, self.method, salient, gateway.name), ttl)
        body = jsonrpc.encode(jsonrpc.result(self.reply_id, stateless.input_required(self.asked, token, gateway.identity(session))))
        if self.sink is None and stateless.accepts(post.accept)[1]:
            self.reply.whole(200, body)
        else:
            self.reply.end_stream(event(body))


def _can_stream(accept: str) -> bool:
    """Whether the client takes the answer as a stream: asked only once a message comes
    before the answer, which most calls never have."""
    return bool(accept) and media.quality(accept, media.SSE) > 0


def _resume(post: Post[Gateway], msg: Message, reply: Reply, parking: Parking) -> None:
    """A retry: check its requestState, give the parked call the client's answers, and
    carry the call on in this exchange."""
    gateway = post.gateway
    params = msg["params"]
    rid = msg["id"]
    token = params.get("requestState")
    try:
        state = parking.keys.open(token, rid)
    except StatelessError as exc:
        _spoil(parking, request_state.StateKeys.peek(token), post, exc.message)
        raise
    if state.server != gateway.name or state.principal != post.principal:
        # Never another principal's call to end: it stays parked for its owner.
        raise StatelessError(jsonrpc.INVALID_PARAMS, "requestState was issued to another client or server", request_id=rid)
    forwarder = parking.forwarder
    if forwarder is not None and state.owner is not None:
        headers = post.request.fields()
        owner = forwarder.place(state.owner, FORWARDED_HEADER in headers, rid)
        if owner is not None:
            retry = forwarder.retry(owner, gateway.name, headers, jsonrpc.encode(msg), reply, rid, gateway.limits.slow_bytes, post.request.http_span())
            later(reply, retry, "mrtr_forward")
            return
    if state.method != msg["method"] or state.digest != request_state.digest(params):
        _spoil(parking, state.park, post, "retry does not match the original request")
        raise StatelessError(
            jsonrpc.INVALID_PARAMS, "requestState does not match this request: a retry repeats the original method and params", request_id=rid
        )
    responses = params.get("inputResponses", {})
    if not isinstance(responses, dict):
        _spoil(parking, state.park, post, "inputResponses is not an object")
        raise StatelessError(jsonrpc.INVALID_PARAMS, "inputResponses must be an object", request_id=rid)
    parked = parking.unpark(state.park)
    if parked is None:
        raise StatelessError(jsonrpc.INVALID_PARAMS, "requestState names a call that has ended (it expired or failed)", request_id=rid)
    session = parked.session
    offered = dict(responses)
    answered = [key for key in parked.asked if key in offered]
    answers = [_response(parked.ids.pop(key), key, offered.pop(key)) for key in answered]
    for key in answered:
        del parked.asked[key]
    if answers and not session.ended:
        if gateway.traces is not None:
            session.http_trace = post.request.http_span()  # the call's next round: it links the questions answered
        gateway.from_client(session, answers)
    # What was asked and not answered is asked again, first thing (in a new input_required).
    session.ask_again([jsonrpc.encode({"jsonrpc": "2.0", "id": parked.ids[k], **request}) for k, request in parked.asked.items()])
    Exchange(post, parking, session, parked.call_id, parked.method, rid, reply, parked.digest, offered).start()


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


def _spoil(parking: Parking, key: str | None, post: Post[Gateway], why: str) -> None:
    """End a parked call whose owner's retry was refused: the server's request gets an error."""
    if key is None:
        return
    parked = parking.parked.get(key)
    if parked is None or parked.principal != post.principal or parked.gateway is not post.gateway:
        return
    parking.unpark(key)
    trace = post.gateway.trace_fields(parked.session.id, parked.call_id)
    post.gateway.log.info("input_refused", method=parked.method, principal=parked.principal, reason=why, **trace)
    post.gateway.close_session(parked.session, "input_refused")


# ------------------------------------------------------------------ listen


def _listen(post: Post[Gateway], msg: Message, env: Envelope, reply: Reply) -> None:
    rid = msg["id"]
    wanted = msg["params"].get("notifications")
    if wanted is None:
        wanted = {}
    if not isinstance(wanted, dict):
        raise StatelessError(jsonrpc.INVALID_PARAMS, "notifications must be an object", request_id=rid)
    uris = wanted.get("resourceSubscriptions", [])
    if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
        raise StatelessError(jsonrpc.INVALID_PARAMS, "notifications.resourceSubscriptions must be a list of strings", request_id=rid)
    asked = {method for flag, (method, _) in stateless.LIST_CHANGES.items() if wanted.get(flag) is True}
    if uris:
        asked.add(stateless.RESOURCE_UPDATED)
    notices = frozenset(asked)
    session = _open(post, env, notices, None)  # never a kept one: a listen stream is no call
    listen = functools.partial(_start_listen, post, reply, rid, wanted, list(dict.fromkeys(uris)))
    if session.adopted:
        listen(session)
    else:
        _open_later(post, msg, env, reply, notices, session, listen)


def _start_listen(post: Post[Gateway], reply: Reply, rid: RequestId, wanted: dict[str, Any], uris: list[str], session: StatelessSession) -> None:
    Listen(post, session, reply, rid, wanted, uris).start()


class Listen(Driver):
    """A `subscriptions/listen` stream: first the subscriptions it needs (the server's
    capabilities and each resource subscription, asked through the mux and all answered),
    then the acknowledgement, then the notifications it asked for, each tagged with its
    subscription id, until the client closes the stream."""

    __slots__ = ("answers", "meta", "pending", "rid", "uris", "wanted")

    def __init__(self, post: Post[Gateway], session: StatelessSession, reply: Reply, rid: RequestId, wanted: dict[str, Any], uris: list[str]) -> None:
        super().__init__(post, session, reply)
        self.rid, self.wanted, self.uris = rid, wanted, uris
        self.meta = {mcp.SUBSCRIPTION_KEY: rid}
        self.pending: set[RequestId] = set()  # the bridge's own requests not answered yet
        self.answers: dict[RequestId, Message] = {}

    def start(self) -> None:
        requests = [jsonrpc.request(f"{_LISTEN_ID}-d", "server/discover", {})]
        requests += [jsonrpc.request(f"{_LISTEN_ID}-{i}", "resources/subscribe", {"uri": uri}) for i, uri in enumerate(self.uris)]
        self.pending = {r["id"] for r in requests}
        try:
            state.route(self.post.gateway, self.session, requests)
        except BaseException:
            self.close("refused")
            raise
        super().start()

    def step(self) -> None:
        session = self.session
        if self.sink is None:
            while session.queue and self.pending:
                data, related, final = session.pop()
                if final and related is not None and related in self.pending:
                    self.pending.discard(related)
                    self.answers[related] = jsonrpc.decode(data)
            if self.pending:
                if session.ended:
                    self.close("ended")
                    self.reply.error(HttpError(503, "listen ended before its subscriptions were in place", jsonrpc.SESSION_CLOSED, request_id=self.rid))
                return
            ack = jsonrpc.notification("notifications/subscriptions/acknowledged", {"_meta": self.meta, "notifications": self._agreed()})
            self.sink = self.reply.open_stream(None, event(jsonrpc.encode(ack)))
        events: list[bytes] = []
        while session.queue:
            data, related, _ = session.pop()
            if related is not None:
                continue  # a late answer to the bridge's own subscribe
            note = jsonrpc.decode(data)
            params = note.get("params")
            if params.__class__ is not dict:
                params = note["params"] = {}
            note_meta = params.get("_meta")
            params["_meta"] = {**note_meta, **self.meta} if note_meta.__class__ is dict else self.meta
            events.append(event(jsonrpc.encode(note)))
        if session.ended:
            # The bridge ends it (shutdown, server gone): a response says it ended gracefully.
            done = jsonrpc.result(self.rid, {"resultType": "complete", "_meta": self.meta})
            self.close("ended")
            self.reply.end_stream(b"".join(events) + event(jsonrpc.encode(done)))
            return
        if session.ping_due:
            session.ping_due = False
            events.append(streams.PING)
        if events:
            self.sink.write(b"".join(events))

    def _agreed(self) -> dict[str, Any]:
        """The subset of what the client wanted that the server honours."""
        capabilities = self.answers[f"{_LISTEN_ID}-d"].get("result", {}).get("capabilities", {})
        agreed: dict[str, Any] = {}
        for flag, (_, capability) in stateless.LIST_CHANGES.items():
            cap = capabilities.get(capability)
            if self.wanted.get(flag) is True and isinstance(cap, dict) and cap.get("listChanged"):
                agreed[flag] = True
        if self.uris:
            agreed["resourceSubscriptions"] = [uri for i, uri in enumerate(self.uris) if "result" in self.answers[f"{_LISTEN_ID}-{i}"]]
        return agreed

