"""One gateway per configured server: the registry of its sessions and the interpreter of
its muxes' actions.

This is the only place that carries out what a mux decides. Shells hand it client
messages; its processes (`upstream.Upstream`) hand it what they read; it turns both into
mux calls and applies the returned actions (`apply`): bytes to a process, bytes to
sessions, log lines for what was dropped, restarts. Which process serves a session is its
`placement`'s to say.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from structlog.typing import FilteringBoundLogger

from bridge import logs
from bridge.access.policy import RateLimiter, Throttled, View
from bridge.config.schema import Limits, RateLimit, Server
from bridge.core.mux import Abandoned, Action, Broadcast, Call, Discard, PeerState, PinsSeen, RestartServer, Timer, ToServer, ToSession
from bridge.core.pins import LIST_CHANGED, Gate, kinds_changed
from bridge.gateway.pinsfile import PinsFile
from bridge.gateway.placement import PLACEMENTS
from bridge.gateway.sessions import Registry, Session, Spares
from bridge.gateway.upstream import NOT_READING, Upstream
from bridge.metrics import ServerMetrics
from bridge.process import confine
from bridge.process.env import child_env
from bridge.process.pool import Full, Pool, Slots
from bridge.process.supervisor import Status
from bridge.protocol import jsonrpc, stateless
from bridge.protocol.jsonrpc import Kind, Message, RequestId
from bridge.traces import UNSAMPLED

if TYPE_CHECKING:
    from bridge.traces.spans import Spans  # imported only when tracing is on (traces/settings.py)

encode = jsonrpc.encode


# Session ends the bridge chose, counted as drops (a client closing its stream is not one).
DROP_REASONS = frozenset({"slow", "idle", "server_gone", "shutdown", "ended"})  # ended: by an administrator
# Idle sessions kept for requests to come (http/endpoints/stateless_2026.py: answered 2026-07-28 calls'),
# per server: as many as a busy principal's clients have calls at once, within reason.
SPARES_PER_SERVER = 64
RESTART_POLL_S = 0.05  # how often a graceful restart looks whether the calls in flight have ended
# A drain (SIGTERM, or a graceful restart) ends only after this long with no request and no call
# in flight: a client acts on an answer at once (the official SDKs list the tools after a
# call's result, before handing it over), and that follow-up must find the process still
# serving. Idle clients do not wait for it.
DRAIN_QUIET_S = 0.5
_LIST_CHANGES = frozenset(method for method, _ in stateless.LIST_CHANGES.values())


class SessionLimitError(Exception):
    """The server already has as many sessions as it may, is stopping, or has no process free."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds; None: the default for a full or stopping server


class Gateway(Registry):
    def __init__(
        self,
        name: str,
        server: Server,
        limits: Limits,
        metrics: ServerMetrics,
        keepalive: float,
        in_flight: Counter[str | None] | None = None,
        slots: Slots | None = None,
    ) -> None:
        self.name = name
        self.path = f"/servers/{name}"
        self.metrics = metrics
        self.keepalive = keepalive
        self.server = server
        self.limits = limits
        self.in_flight: Counter[str | None] = Counter() if in_flight is None else in_flight  # by principal, daemon-wide
        self.max_sessions = server.max_sessions or limits.max_sessions
        self.sessions: dict[str, Session] = {}
        self.spares = Spares(SPARES_PER_SERVER)
        self.log = logs.get(server=name)
        self.launch = confine.launch(server)
        self.child_env = child_env(server, os.environ, self.launch.identity)
        self._upstreams: dict[str, Upstream] = {}  # session id -> its upstream
        self.placement = PLACEMENTS[server.mode](self)
        self._opening = 0  # sessions waiting for a process
        self.pool = Pool(
            name,
            server.pool,
            Slots(limits.max_processes) if slots is None else slots,  # daemon-wide, from the app
            lambda label, warm: Upstream(self, label, warm),
            self.stop_later,
            metrics.pool_waits,
            metrics.pool_starts,
        )
        self._stopping: set[asyncio.Task[None]] = set()
        self._unflushed: dict[Session, None] = {}  # sessions delivered to since the last flush, in order
        self._ticker: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self.accepting = True
        self.draining = False  # SIGTERM: see begin_drain
        self.last_request = 0.0  # when a client's message last came (time.monotonic): a drain waits for quiet
        self._calling: dict[Session, float] = {}  # see drain_step
        self.new_id: Callable[[str | None], str] | None = None  # with a cluster: ids that name this replica (the app sets it)
        self.restarting = False  # an admin restart is under way (Gateway.restart)
        self.limiter = RateLimiter(RateLimit(), {}, self.in_flight, Counter())  # none, until the app sets its own
        self._throttled_log = logs.Throttle(1.0, 10)
        self._default_view: View | None = None
        self._views: dict[str, View | None] = {}  # principal -> what it may see (policy.views)
        self.pins_file: PinsFile | None = None
        self.pins: Gate | None = None  # what its processes offer that is pinned (servers.NAME.pin)
        self.audit = logs.get(server=name).bind(logger="mcp_bridge.audit")  # operators route it by this name
        self._group_audits: dict[str, FilteringBoundLogger] = {}  # the audit logger bound to each group's name
        self.traces: Spans | None = None  # tracing, when on (the app sets it)

    def upstreams(self) -> Iterable[Upstream]:
        return self.placement.upstreams()

    @property
    def placed(self) -> Mapping[str, Upstream]:
        return self._upstreams

    async def start(self) -> None:
        self.placement.start()
        self.pool.open()
        loop = asyncio.get_running_loop()
        self._ticker = loop.create_task(self._tick(), name=f"tick:{self.name}")
        self._pinger = loop.create_task(self.keepalives(), name=f"keepalive:{self.name}")

    async def stop(self, reason: str = "shutdown") -> None:
        """Refuse new sessions, answer every call still in flight with an error, end
        every session (their streams flush what is queued), then stop the processes."""
        self.accepting = False
        message = "bridge shutting down" if reason == "shutdown" else "server removed or reconfigured"
        self.pool.close(f"server {self.name!r} is shutting down" if reason == "shutdown" else f"server {self.name!r}: {message}")
        for upstream in list(self.upstreams()):
            self.apply(upstream, upstream.mux.shutdown(message))
        for session in list(self.sessions.values()):
            self.close_session(session, reason)
        for task in (self._ticker, self._pinger):
            if task is not None:
                task.cancel()
        self.placement.stop()
        await asyncio.gather(*(u.stop() for u in self.upstreams()))
        while self._stopping:  # and those handed to a session that then found the server stopping
            await asyncio.gather(*self._stopping)

    def update_limits(self, limits: Limits) -> None:
        """Take new limits without touching sessions: they apply to what comes next."""
        self.limits = limits
        self.max_sessions = self.server.max_sessions or limits.max_sessions
        for upstream in self.upstreams():
            upstream.mux.set_limits(max_inflight=limits.max_inflight, max_backlog=limits.server_backlog, max_subscriptions=limits.max_subscriptions)
            if upstream.child is not None:
                upstream.child.set_limits(limits.max_message_bytes, limits.input_buffer())

    def set_views(self, default: View | None, by_principal: dict[str, View | None]) -> None:
        """What each principal may see of this server (at start, and on every reload: open
        sessions see the new views from their next message on)."""
        self._default_view, self._views = default, by_principal
        for sid, session in self.sessions.items():
            self._upstreams[sid].mux.set_view(sid, self.view(session.owner))

    def set_pins(self, pins_file: PinsFile | None) -> None:
        """The pins file (at start, and on every reload): this server's gate in it, if it pins."""
        self.pins_file = pins_file
        self.pins = pins_file.gate(self.name, self.server.pin) if pins_file is not None else None
        for upstream in self.upstreams():
            upstream.mux.set_pins(self.pins)

    def withheld_changed(self, before: Mapping[str, frozenset[str]]) -> None:
        """What its pins withhold was `before` an approval, a rejection or a reload: tell every
        session that hears of list changes of each list that changed, once, whichever
        process serves it."""
        if self.pins is None or before == self.pins.withheld:
            return
        slow: list[Session] = []
        for method in {LIST_CHANGED[kind] for kind in kinds_changed(before, self.pins.withheld)}:
            sids = {sid: None for u in self.upstreams() for a in u.mux.announce(method) if isinstance(a, Broadcast) for sid in a.sessions}
            self._deliver(tuple(sids), jsonrpc.notification(method), slow)
        if slow:
            self._close_slow(slow)
        self.flush()

    def view(self, principal: str | None) -> View | None:
        return self._default_view if principal is None else self._views.get(principal, self._default_view)

    # ----------------------------------------------------------------- sessions

    async def open_session(self, session: Session) -> None:
        """Open `session` on its process: the shared one, its principal's, or its own (from the
        warm pool, or started now); waits up to pool.wait for a process when the caps are reached."""
        if self.open_at_once(session):
            return
        self._register(session, await self.placement.acquire(session))

    def open_at_once(self, session: Session) -> bool:
        """Open `session` if its process is at hand (the shared one, or its principal's
        running one), else False: `open_session` waits for one. Raises SessionLimitError."""
        if not self.accepting or (self.draining and session.addressed):
            raise SessionLimitError(f"server {self.name!r} is shutting down")
        if self.spares and len(self.sessions) + self._opening >= self.max_sessions and (spare := self.spares.oldest()) is not None:
            self.close_session(spare, "idle")  # a kept session gives way to a new one
        if len(self.sessions) + self._opening >= self.max_sessions:
            self.metrics.sessions_dropped["limit"] += 1
            raise SessionLimitError(f"server {self.name!r} has {len(self.sessions)} sessions (limit {self.max_sessions})")
        if self.new_id is not None and session.addressed:
            session.id = self.new_id(session.owner)
        upstream = self.placement.at_hand(session)
        if upstream is None:
            return False
        self._register(session, upstream)
        return True

    def _register(self, session: Session, upstream: Upstream) -> None:
        self.sessions[session.id] = session
        self._upstreams[session.id] = upstream
        upstream.mux.open_session(session.id, session.owner, self.view(session.owner))
        self.metrics.sessions_opened[session.transport] += 1
        if session.logged:
            self.log.info(
                "session_opened", session=session.id, transport=session.transport, owner=session.owner, **self.placement.opened(upstream)
            )

    def close_session(self, session: Session, reason: str) -> None:
        if self.sessions.pop(session.id, None) is None:
            return
        reason = session.ending or reason
        upstream = self._upstreams.pop(session.id)
        self.apply(upstream, upstream.mux.close_session(session.id))
        session.end(reason)
        if self.traces is not None:
            self.traces.closed(session.id)
        if reason in DROP_REASONS:
            self.metrics.sessions_dropped[reason] += 1
        self.placement.released(session, upstream)
        if not session.logged:
            return
        self.log.info(
            "session_closed",
            session=session.id,
            transport=session.transport,
            reason=reason,
            duration_s=round(time.monotonic() - session.created, 3),
        )

    def begin_drain(self) -> None:
        """A drain begins: from now on no session opens that a client would hold on to (a
        2026-07-28 request holds none: it is served while the drain lasts)."""
        self.draining = True

    def drain_step(self, now: float, quiet_s: float) -> bool:
        """Close each session that has had no call in flight, and no message from its client,
        for `quiet_s` (an idle session cannot be saved by waiting: its client opens a new one
        elsewhere); whether the drain must still wait here: a call in flight, a session its
        client still uses, or a request within `quiet_s` (an answer's follow-up: clients list
        the tools after a call's result, say)."""
        quiet_since = now - quiet_s
        # Session -> when a drain step last saw a call of it in flight: its answer came since.
        # Kept after the session closes (a 2026-07-28 request's closes with its answer).
        calling = self._calling
        for session in list(self.sessions.values()):
            if self.session_inflight(session):
                calling[session] = now
            elif session.last_seen <= quiet_since and calling.get(session, 0.0) <= quiet_since and session.transport != "group":
                self.close_session(session, "shutdown")  # (a group session's member session closes with it)
        return bool(self.sessions) or self.last_request > quiet_since or any(t > quiet_since for t in calling.values())

    def quiet(self, session: Session) -> bool:
        """Whether nothing of the session's is left at its server: no call, no server request
        to it, no task or subscription of its. Only such a session may serve another request."""
        upstream = self._upstreams.get(session.id)
        return upstream is not None and upstream.mux.quiet(session.id)

    def end_session(self, session: Session, message: str) -> int:
        """End a session from outside (the admin API): each of its calls in flight gets an
        error with `message` first, then it closes (the calls are cancelled upstream, its
        streams end). How many calls were in flight."""
        upstream = self._upstreams.get(session.id)
        if upstream is None:
            return 0
        pending = list(upstream.mux.peer(session.id).calls)
        session.ending = "ended"
        sent = session.reached()  # else the errors are dropped with the session: not counted as sent
        for request_id in pending:
            error = jsonrpc.error(request_id, jsonrpc.SESSION_CLOSED, message)
            if sent:
                self.metrics.error_sent(error["error"])
            session.deliver(encode(error), request_id, True)
        session.flush()
        self.close_session(session, "ended")
        return len(pending)

    def serving(self, principal: str | None) -> dict[Upstream, int]:
        """The processes that serve `principal` (the shared one, its own per-principal one, its
        sessions' per-session ones), each with that principal's calls in flight on it."""
        served: dict[Upstream, int] = {}
        own = self.placement.own(principal)
        if own is not None:
            served[own] = 0
        for sid, session in self.sessions.items():
            if session.owner == principal and (upstream := self._upstreams.get(sid)) is not None:
                served[upstream] = served.get(upstream, 0) + upstream.mux.inflight(sid)
        return served

    def session_inflight(self, session: Session) -> int:
        upstream = self._upstreams.get(session.id)
        return upstream.mux.inflight(session.id) if upstream is not None else 0

    async def restart(self, reason: str, drain_timeout: float) -> int:
        """Restart this server's processes gracefully: wait up to `drain_timeout` for the calls
        in flight to end and then DRAIN_QUIET_S with no call and no client message (an
        answer's follow-up is served by the process that gave the answer, as in a drain),
        then stop each process (SIGTERM, then shutdown_timeout) and start it again. Sessions
        stay open: their calls wait for the new process, as after a crash. How many
        processes were restarted."""
        self.restarting = True
        try:
            deadline = time.monotonic() + drain_timeout
            busy_at = 0.0  # when a look last saw a call in flight: its answer came since
            while (now := time.monotonic()) < deadline:
                if self.inflight():
                    busy_at = now
                elif max(busy_at, self.last_request) <= now - DRAIN_QUIET_S:
                    break
                await asyncio.sleep(RESTART_POLL_S)
            upstreams = list(self.upstreams())
            await asyncio.gather(*(u.restart(reason) for u in upstreams))
        finally:
            self.restarting = False
        return len(upstreams)

    async def acquire(self, session: Session, label: str) -> Upstream:
        """A process for a new session, from the pool; SessionLimitError when none comes in time."""
        self._opening += 1
        try:
            upstream = await self.pool.acquire(label)
        except Full as exc:
            self.log.warning("session_refused_no_process", session=session.id, reason=str(exc))
            raise SessionLimitError(str(exc), exc.retry_after) from None
        finally:
            self._opening -= 1
        if not self.accepting:  # it stopped while this session waited
            self.pool.give_back(upstream)
            raise SessionLimitError(f"server {self.name!r} is shutting down")
        return upstream

    def stop_later(self, upstream: Upstream) -> None:
        self._track(asyncio.get_running_loop().create_task(upstream.stop()))

    def _track(self, task: asyncio.Task[None]) -> None:
        """Keep a task that stops a process until it is done (the gateway's stop awaits it)."""
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def negotiated_version(self, session: Session) -> str | None:
        """The protocol version this session's initialize settled on; None before (or after a failed) one."""
        upstream = self._upstreams.get(session.id)
        if upstream is None:
            return None
        peer = upstream.mux.peer(session.id)
        return peer.protocol_version if peer.state is not PeerState.OPEN else None

    def open_request(self, session: Session, env: stateless.Envelope, notices: frozenset[str]) -> bool:
        """Open a 2026-07-28 request's session and adopt it as the request's envelope says
        (`Mux.adopt`), if its process is at hand; else False: `open_request_later` waits for
        one. Raises SessionLimitError."""
        if not self.open_at_once(session):
            return False
        self._adopt(session, env, notices)
        return True

    async def open_request_later(self, session: Session, env: stateless.Envelope, notices: frozenset[str]) -> None:
        """`open_request` for a session whose process is not at hand: waits as `open_session` does."""
        await self.open_session(session)
        self._adopt(session, env, notices)

    def _adopt(self, session: Session, env: stateless.Envelope, notices: frozenset[str]) -> None:
        upstream = self._upstreams[session.id]
        self.apply(upstream, upstream.mux.adopt(session.id, env.capabilities, env.version, env.client_info, env.log_level, notices))

    def server_request_id(self, session: Session, downstream_id: RequestId) -> RequestId | None:
        """The id the server gave its request that the mux passed to `session` as `downstream_id`."""
        upstream = self._upstreams.get(session.id)
        if upstream is None or not isinstance(downstream_id, int):
            return None
        asked = upstream.mux.peer(session.id).server_requests.get(downstream_id)
        return asked.server_id if asked is not None else None

    def init_result(self, session: Session) -> dict[str, Any] | None:
        """The initialize result of the process serving this session, once it has one."""
        upstream = self._upstreams.get(session.id)
        return upstream.mux.init_result if upstream is not None else None

    def identity(self, session: Session) -> stateless.Server:
        """The serverInfo and cache scope a 2026-07-28 answer in this session is decorated with."""
        upstream = self._upstreams.get(session.id)
        return upstream.identity() if upstream is not None else stateless.Server(None, self.server.cache_scope)

    def from_client(self, session: Session, payload: Any, kind: Kind | None = None) -> None:
        """Route one decoded client message (or batch); raises ProtocolError if invalid, and
        Throttled, with nothing of it taken, when it carries calls over its principal's limits.
        `kind`: the message's, when its endpoint has classified it already."""
        session.last_seen = self.last_request = time.monotonic()
        upstream = self._upstreams[session.id]
        if self.limiter.active and (calls := _calls(payload)):
            try:
                self.limiter.admit(session.owner, calls)
            except Throttled as exc:
                if (held := self._throttled_log.allow()) is not None:
                    self.log.info("rate_limited", principal=session.owner, limit=exc.limit, calls=calls, suppressed=held)
                raise
        traces = self.traces
        actions = upstream.mux.from_client(session.id, payload, kind) if traces is None else self._traced(traces, upstream, session, payload, kind)
        metrics = self.metrics
        if payload.__class__ is list:
            for msg in payload:
                metrics.message("from_client", msg.get("method", "response"))
            metrics.eras[session.era] += len(payload)
        else:
            metrics.message("from_client", payload.get("method", "response"))
            metrics.eras[session.era] += 1
        self.apply(upstream, actions)

    def _traced(self, traces: Spans, upstream: Upstream, session: Session, payload: Any, kind: Kind | None) -> list[Action]:
        """The mux's actions for `payload`, with tracing on: each request begins its span
        (traces/spans.py) before the mux rewrites it, and one the mux answered at once (no
        call went to the server) ends it here; a call's ends with `_call_ended`."""
        began: list[RequestId] = []  # the client's ids: the mux rewrites a request's
        http, session.http_trace = session.http_trace, None
        for msg in payload if payload.__class__ is list else (payload,):
            if msg.__class__ is not dict or "id" not in msg:
                continue
            if "method" in msg:
                # One that follows an untraced HTTP request is passed over here (spans.py, rule 3).
                if http is UNSAMPLED and (
                    (params := msg.get("params")).__class__ is not dict
                    or (meta := params.get("_meta")).__class__ is not dict
                    or "traceparent" not in meta
                ):
                    continue
                if traces.started(session, msg, self.negotiated_version, http):
                    began.append(msg["id"])
            elif session.id in traces.asked:
                traces.responded(session.id, msg, http)
        mux = upstream.mux
        actions = mux.from_client(session.id, payload, kind)
        if began:
            for action in actions:
                if isinstance(action, ToSession) and action.final and action.call is None and action.related is not None:
                    traces.answered(action.session, action.related, action.message)
            for request_id in began:
                if (why := mux.waiting(session.id, request_id)) is not None:
                    traces.waiting(session.id, request_id, why.value)
        return actions

    # ------------------------------------------------------------------ actions

    def apply(self, upstream: Upstream, actions: list[Action], flush: bool = True) -> None:  # noqa: C901 (below)
        """Carry out `actions` in order. What the mux says about a message the server's
        input had no room for is appended to `actions` and carried out in turn. The two
        actions of every message are carried out here, each outcome a branch: a helper would
        be a Python call per message; the rest in `_carry_out`."""
        if not actions:
            return  # nothing delivered here: whoever delivered before flushes
        slow: list[Session] = []
        metrics = self.metrics
        unflushed = self._unflushed
        for action in actions:
            # Keyword patterns: a positional one looks `__match_args__` up by name, each time.
            match action:
                case ToServer(message=message):
                    if upstream.translator is not None:
                        actions += upstream.translate(message)
                    elif not upstream.send(encode(message) + b"\n"):
                        actions += self._unwritten(upstream, message)
                    elif (traces := self.traces) is not None and traces.open:  # (`open`: a traced call in flight)
                        self._queued(traces, upstream, message)
                case ToSession(session=sid, message=message, related=related, final=final, call=call):
                    session = self.sessions.get(sid)
                    if session is None:
                        continue
                    if call is not None:  # the call's answer: once per call, ended before it is written
                        metrics.request_done(call.method, time.monotonic() - call.started)
                        if call.target is not None or self.traces is not None:
                            self._call_ended(call, message)
                    if final and (finish := session.finish) is not None:
                        finish(message)
                    data = encode(message)
                    metrics.bytes_out += len(data)
                    if "error" in message:
                        metrics.error_sent(message["error"])
                    unflushed[session] = None
                    if not session.deliver(data, related, final):
                        slow.append(session)
                case _:
                    self._carry_out(upstream, action, slow)
        if slow:
            self._close_slow(slow)
        if flush:
            self.flush()

    def _queued(self, traces: Spans, upstream: Upstream, message: Message) -> None:
        """A message written while a traced call is in flight: if it is a traced call's and its
        line did not all go into the pipe at once, its span says so (traces/spans.py, rule 5)."""
        call = upstream.mux.call(message["id"]) if "method" in message and "id" in message else None
        span = traces.span(call.session, call.client_id) if call is not None else None
        if span is not None and (buffered := upstream.buffered()):
            traces.queued(span, buffered)

    def _unwritten(self, upstream: Upstream, message: Message) -> list[Action]:
        """A message the server's input had no room for: dropped, and a request failed."""
        self.metrics.dropped_messages += 1
        return upstream.mux.not_written(message["id"], NOT_READING) if "method" in message and "id" in message else []

    def _carry_out(self, upstream: Upstream, action: Action, slow: list[Session]) -> None:
        metrics = self.metrics
        match action:
            case Broadcast(sessions=sids, message=message):
                if message.get("method") in _LIST_CHANGES:
                    sids = (*sids, *self.placement.listeners(upstream, message["method"]))
                self._deliver(sids, message, slow)
            case PinsSeen(seen=seen):
                if self.pins_file is not None:
                    self.pins_file.seen(self.name, seen, metrics)
            case Discard(reason=reason, detail=detail, log=log):
                metrics.dropped_messages += 1
                if log:
                    self.log.warning("message_dropped", reason=reason, **detail)
            case Abandoned(call=call):
                if call.target is not None or self.traces is not None:
                    self._call_ended(call, None)
            case RestartServer(reason=reason):
                upstream.supervisor.restart(reason)
            case Timer(delay=delay):
                upstream.set_timer(delay)

    def _deliver(self, sids: tuple[str, ...], message: Message, slow: list[Session]) -> None:
        data = encode(message)
        metrics = self.metrics
        for sid in sids:
            session = self.sessions.get(sid)
            if session is not None:
                metrics.bytes_out += len(data)
                self._unflushed[session] = None
                if not session.deliver(data, None, False):
                    slow.append(session)

    def _close_slow(self, slow: list[Session]) -> None:
        limits = self.limits
        for session in dict.fromkeys(slow):  # once each, however many messages it missed
            self.log.warning("session_too_slow", session=session.id, queue_limit=limits.session_queue, queue_bytes=limits.slow_bytes)
            self.close_session(session, "slow")

    def _call_ended(self, call: Call, answer: Message | None) -> None:
        """A call ended, answered or (`answer` None) not. One `audit` event per tools/call,
        prompts/get and resources/read: who, what, how it ended (result, error, cancelled,
        timeout), how long it took, its trace; never arguments or results. Traced: its span
        ends, and its duration's bucket takes its trace as exemplar."""
        traces = self.traces
        ids = traces.ids(call.session, call.client_id) if traces is not None and traces.open else None  # (`open`: none traced, most often)
        if ids is not None and traces is not None and call.session is not None:
            sent = call.sent_at if call.sent else 0.0  # (a call waiting for a slot has a `sent_at` too)
            if answer is None:
                traces.abandoned(call.session, call.client_id, "cancelled", sent)
            else:
                self.metrics.traced(call.method, time.monotonic() - call.started, *ids)
                traces.answered(call.session, call.client_id, answer, sent)
        if call.target is not None:
            code = None
            if answer is None:
                outcome = "cancelled"
            elif isinstance(error := answer.get("error"), dict):
                code = error.get("code")
                outcome = "timeout" if code == jsonrpc.REQUEST_TIMEOUT else "error"
            else:
                outcome = "result"
            audit = self.audit
            if call.session is not None and (session := self.sessions.get(call.session)) is not None and session.group is not None:
                audit = self._group_audits.get(session.group) or self._group_audits.setdefault(session.group, audit.bind(group=session.group))
            if ids is not None and traces is not None:
                audit = audit.bind(**traces.fields(ids))
            audit.info(
                "audit",
                principal=call.principal,
                session=call.session,
                method=call.method,
                name=call.target,
                outcome=outcome,
                code=code,
                duration_ms=round((time.monotonic() - call.started) * 1e6) / 1000,  # to the µs: round(x, 3) formats and parses a decimal
            )

    def trace_fields(self, session_id: str, request_id: RequestId) -> dict[str, str]:
        """The trace and span id of a request in flight, as the fields of a log event about
        it; none when it is not traced."""
        traces = self.traces
        return traces.fields(traces.ids(session_id, request_id)) if traces is not None else {}

    def flush(self) -> None:
        """Write out what the sessions were given since the last flush: one write per session."""
        if self._unflushed:
            sessions = list(self._unflushed)
            self._unflushed.clear()
            for session in sessions:
                session.flush()

    # -------------------------------------------------------------------- time

    async def _tick(self) -> None:
        """Once a second: time out requests and initializes, reap idle sessions."""
        while True:
            await asyncio.sleep(1.0)
            limits = self.limits  # read each time: a reload may have replaced it
            for upstream in list(self.upstreams()):
                self.apply(upstream, upstream.mux.expire(limits.request_timeout, limits.initialize_timeout))
            idle_before = time.monotonic() - limits.session_idle_timeout
            for session in [s for s in self.sessions.values() if s.last_seen < idle_before and not s.attached()]:
                self.close_session(session, "idle")

    # ------------------------------------------------------------------ health

    def inflight(self) -> int:
        return sum(u.mux.inflight() for u in self.upstreams())

    def calls_waiting(self) -> int:
        """Calls waiting for a slot under max_concurrent_calls, every process together."""
        return sum(u.mux.waiting_for_slot() for u in self.upstreams())

    def pids(self) -> list[int]:
        return [u.child.pid for u in self.upstreams() if u.child is not None and u.child.pid is not None]

    def processes_up(self) -> int:
        return sum(1 for u in self.upstreams() if u.child is not None)

    def pool_sizes(self) -> dict[str, int]:
        return self.pool.sizes()

    def processes_by_era(self) -> dict[str, int]:
        return dict(Counter(u.era.value for u in self.upstreams() if u.child is not None))

    def crash_looping(self) -> bool:
        return any(u.supervisor.status is Status.FAILED for u in self.upstreams())

    def readiness(self) -> str | None:
        """None when ready, else the reason this server cannot serve now."""
        return self.placement.readiness()


# Requests a rate limit counts: every call but the session's own handshake and pings.
_UNCOUNTED = frozenset({"initialize", "ping"})


def _calls(payload: Any) -> int:
    if payload.__class__ is dict:
        return 1 if "id" in payload and payload.get("method", "initialize") not in _UNCOUNTED else 0
    return sum(1 for m in payload if m.__class__ is dict and "id" in m and m.get("method", "initialize") not in _UNCOUNTED)
