"""One group: several servers behind `/groups/NAME/`, the IO shell of `core.group`.

A group has no process of its own. Each of its client sessions (a transport's `Session`, as
a server's) holds a `GroupSession` (the rules, sans-IO) and one `MemberSession` per member
its principal may use, opened on that member's own gateway when the client session opens.
So whatever a direct session gets there (ids, progress, cancellation, subscriptions,
server requests, views, pins, limits, audit) a group session gets too: this shell only
carries out what the GroupSession says, and keeps time (`list_timeout`, idle, keepalives).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from bridge import logs
from bridge.access.policy import Throttled
from bridge.config.schema import Group as GroupConfig
from bridge.config.schema import Limits
from bridge.core.group import LISTS, GroupSession, Names, Out, Routes, ToClient, ToMember
from bridge.gateway.gateway import Gateway, SessionLimitError
from bridge.gateway.sessions import Registry, Session
from bridge.metrics import ServerMetrics
from bridge.protocol import jsonrpc, stateless
from bridge.protocol.jsonrpc import NOTIFICATION, REQUEST, RESPONSE, Kind, Message, ProtocolError, RequestId

if TYPE_CHECKING:
    from bridge.traces.spans import Spans  # imported only when tracing is on (traces/settings.py)

_decode = msgspec.json.Decoder().decode
encode = jsonrpc.encode


class NoMember(Exception):
    """The principal may use none of the group's members."""


class MemberSession(Session):
    """A group session's session of one member, on that member's gateway. What the member's
    mux sends it is the group session's to route; it lives exactly as long as the group
    session (the group reaps and keeps alive its own client sessions)."""

    transport = "group"

    def __init__(self, joined: Joined, member: str) -> None:
        self.joined = joined
        super().__init__(member, joined.client.owner)
        self.group = joined.group.name

    def deliver(self, data: bytes, related: RequestId | None, final: bool) -> bool:
        joined = self.joined
        client = joined.client
        if client.ended:
            return True
        # A call's answer that is neither an error (which the group names) nor a task's (whose
        # id it learns) is the client's as it came: not decoded, nothing rewritten.
        if final and related is not None and b'"error"' not in data and b'"task"' not in data and joined.rules.answered(self.server, related):
            if not client.deliver(data, related, True):
                joined.group.too_slow(client)
            return True
        msg = _decode(data)
        joined.group.carry(joined, joined.rules.from_member(self.server, msg, related, final), msg, data)
        return True

    def flush(self) -> None:
        self.joined.client.flush()

    def attached(self) -> bool:
        return not self.joined.client.ended

    def keepalive(self) -> None:
        """The group's client session has its own."""

    def end(self, reason: str) -> None:
        super().end(reason)
        self.joined.group.member_ended(self, reason)


class Joined:
    """What the group holds for one client session: its rules and its members' sessions."""

    __slots__ = ("client", "group", "gone", "members", "rules")

    def __init__(self, group: Group, client: Session, rules: GroupSession) -> None:
        self.group = group
        self.client = client
        self.rules = rules
        self.members: dict[str, MemberSession] = {}
        self.gone: dict[str, str] = {}  # member -> why its session is not open


class Group(Registry):
    """The sessions of one group and the carrying out of their rules. Serves the transports as
    a `Gateway` does (`Served`): the endpoints are given either."""

    def __init__(
        self,
        name: str,
        config: GroupConfig,
        members: tuple[str, ...],
        gateways: Mapping[str, Gateway],
        limits: Limits,
        metrics: ServerMetrics,
        keepalive: float,
        servers_of: Callable[[str | None], frozenset[str] | None],
    ) -> None:
        self.name = name
        self.path = f"/groups/{name}"
        self.config = config
        self.members = members
        self.gateways = gateways  # the app's, read at each use: a reload replaces a member's
        self.limits = limits
        self.metrics = metrics
        self.keepalive = keepalive
        self.servers_of = servers_of  # principal -> the servers it may use (None: all)
        self.sessions: dict[str, Session] = {}
        self._joined: dict[str, Joined] = {}
        self.log = logs.get(group=name)
        self.accepting = True
        self.draining = False
        self.last_request = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self.names_left_out: Counter[str] = Counter()  # by member: names that would break the tool-name rules
        self.requests: Counter[str] = Counter()  # by member: requests the group handed it
        self._left_out_log = logs.Throttle(1.0, 10)
        self.new_id: Callable[[str | None], str] | None = None  # with a cluster: ids that name this replica (the app sets it)
        self.traces: Spans | None = None  # tracing, when on (the app sets it): its members' gateways trace what it hands them
        # 2026-07-28 requests (endpoints/group_2026.py), which no session holds: the URIs and
        # templates their lists showed (rule 2), and the Names of each set of members used.
        self.routes = Routes()
        self._names: dict[tuple[str, ...], Names] = {}

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._spawn(self._tick(), f"tick:group:{self.name}")
        self._spawn(self.keepalives(), f"keepalive:group:{self.name}")

    async def stop(self, reason: str = "shutdown") -> None:
        self.accepting = False
        for session in list(self.sessions.values()):
            self.close_session(session, reason)
        for task in list(self._tasks):
            task.cancel()

    def update(self, config: GroupConfig, members: tuple[str, ...], limits: Limits, keepalive: float) -> None:
        """A reload: new members, separator and limits. Each open session loses the members
        that left (what waited on them fails) and gains those that joined (each initialized
        as the client initialized the others); its client hears that the lists changed. Its
        other members' sessions are untouched. A new separator applies to new sessions."""
        self.config, self.members, self.limits, self.keepalive = config, members, limits, keepalive
        self._names.clear()
        self.routes = Routes()
        for joined in list(self._joined.values()):
            allowed = self.allowed(joined.client.owner)
            for member in [m for m in joined.rules.names.members if m not in allowed]:
                sub = joined.members.pop(member, None)
                joined.gone.pop(member, None)
                self.carry(joined, joined.rules.leave(member, "it left the group"))
                if sub is not None and (gateway := self.gateways.get(member)) is not None:
                    gateway.close_session(sub, "group_changed")
            for member in [m for m in allowed if m not in joined.members]:  # new, or its session ended (its server changed)
                if member in joined.rules.names.members:
                    self.carry(joined, joined.rules.leave(member, joined.gone.pop(member, "its session ended")))
                self._spawn(self._join(joined, member, allowed), f"join:{self.name}:{member}")
            joined.client.flush()

    async def _join(self, joined: Joined, member: str, members: tuple[str, ...]) -> None:
        try:
            await self._open_member(joined, member)
        except SessionLimitError as exc:
            joined.gone[member] = str(exc)
            return
        if joined.client.ended:
            self._close_members(joined, "shutdown")
            return
        self.carry(joined, joined.rules.join(member, members))
        joined.client.flush()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def begin_drain(self) -> None:
        self.draining = True

    def drain_step(self, now: float, quiet_s: float) -> bool:
        """As `Gateway.drain_step`: close each session with nothing in flight at any member and
        no message from its client for `quiet_s`; whether the drain must still wait here."""
        quiet_since = now - quiet_s
        for sid, session in list(self.sessions.items()):
            joined = self._joined[sid]
            busy = any(m.server in self.gateways and self.gateways[m.server].session_inflight(m) for m in joined.members.values())
            if not busy and session.last_seen <= quiet_since:
                self.close_session(session, "shutdown")
        return bool(self.sessions) or self.last_request > quiet_since

    # ----------------------------------------------------------------- sessions

    def allowed(self, principal: str | None) -> tuple[str, ...]:
        """The members `principal` may use, in the group's order."""
        servers = self.servers_of(principal)
        return tuple(m for m in self.members if m in self.gateways and (servers is None or m in servers))

    async def open_session(self, session: Session) -> None:
        """Open `session` and its session of each member its principal may use (each waits for
        a process as a direct one would). A member that cannot open now is gone for this
        session (its calls fail naming it); none at all: SessionLimitError."""
        if not self.accepting or self.draining:
            raise SessionLimitError(f"group {self.name!r} is shutting down")
        if len(self.sessions) >= self.limits.max_sessions:
            raise SessionLimitError(f"group {self.name!r} has {len(self.sessions)} sessions (limit {self.limits.max_sessions})")
        members = self.allowed(session.owner)
        if not members:
            raise NoMember(f"token not allowed for any server of group {self.name!r}")
        if self.new_id is not None:
            session.id = self.new_id(session.owner)
        joined = Joined(self, session, GroupSession(self.name, Names(members, self.config.separator)))
        outcomes = await asyncio.gather(*(self._open_member(joined, m) for m in members), return_exceptions=True)
        for member, outcome in zip(members, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                joined.gone[member] = str(outcome) if isinstance(outcome, SessionLimitError) else "could not open a session"
        if not joined.members:
            raise SessionLimitError(f"group {self.name!r}: no member could open a session ({'; '.join(joined.gone.values())})")
        if session.ended or not self.accepting:
            self._close_members(joined, "shutdown")
            raise SessionLimitError(f"group {self.name!r} is shutting down")
        self.sessions[session.id] = session
        self._joined[session.id] = joined
        self.metrics.sessions_opened[session.transport] += 1
        self.log.info("session_opened", session=session.id, transport=session.transport, owner=session.owner, members=list(joined.members))

    async def _open_member(self, joined: Joined, member: str) -> None:
        gateway = self.gateways[member]
        sub = MemberSession(joined, member)
        await gateway.open_session(sub)
        joined.members[member] = sub

    def close_session(self, session: Session, reason: str) -> None:
        joined = self._joined.pop(session.id, None)
        if self.sessions.pop(session.id, None) is None or joined is None:
            return
        session.end(reason)  # first: its members' ends are then not the group's to answer
        self._close_members(joined, reason)
        self.log.info("session_closed", session=session.id, transport=session.transport, reason=reason, duration_s=round(time.monotonic() - session.created, 3))

    def _close_members(self, joined: Joined, reason: str) -> None:
        for member, sub in list(joined.members.items()):
            gateway = self.gateways.get(member)
            if gateway is not None:
                gateway.close_session(sub, reason)
        joined.members.clear()

    def member_ended(self, sub: MemberSession, reason: str) -> None:
        """A member's gateway closed its session (its server went, it was too slow, removed):
        what the group session waited on there fails, the rest goes on."""
        joined = sub.joined
        if joined.client.ended or joined.members.get(sub.server) is not sub:
            return
        del joined.members[sub.server]
        joined.gone[sub.server] = f"its session ended ({reason})"
        rules = joined.rules
        self.carry(joined, rules.member_gone(sub.server, f"its session ended ({reason})") + rules.lists_changed())
        joined.client.flush()

    def negotiated_version(self, session: Session) -> str | None:
        joined = self._joined.get(session.id)
        return joined.rules.negotiated if joined is not None else None

    # ------------------------------------------------------------------ messages

    def from_client(self, session: Session, payload: Any, kind: Kind | None = None) -> None:
        """Route one decoded client message (or batch) by the group's rules; raises
        ProtocolError if invalid, Throttled when a lone call is over its principal's limits."""
        session.last_seen = self.last_request = time.monotonic()
        joined = self._joined[session.id]
        messages = payload if payload.__class__ is list else (payload,)
        if not messages:
            raise ProtocolError(jsonrpc.INVALID_REQUEST, "invalid request: empty batch")
        for i, msg in enumerate(messages):
            try:
                jsonrpc.classify(msg)
            except ProtocolError as exc:
                raise ProtocolError(exc.code, f"batch[{i}]: {exc.message}" if payload.__class__ is list else exc.message, exc.request_id) from None
        lone = len(messages) == 1
        answered = False  # by the group itself: a member's answers are flushed by its gateway
        try:
            for msg in messages:
                outs = joined.rules.from_client(msg)
                if msg.get("method") in LISTS and "id" in msg:
                    self._time_list(joined, msg["id"])
                answered = self.carry(joined, outs, throttle=lone) or answered
        finally:
            session.http_trace = None  # handed to each member's session its messages went to
        if answered:
            session.flush()

    def _time_list(self, joined: Joined, client_id: RequestId) -> None:
        def due() -> None:
            if not joined.client.ended:
                self.carry(joined, joined.rules.overdue(client_id))
                joined.client.flush()

        asyncio.get_running_loop().call_later(self.config.list_timeout, due)

    def carry(self, joined: Joined, outs: list[Out], came: Message | None = None, data: bytes = b"", throttle: bool = False) -> bool:
        """Carry out a GroupSession's outs; whether any was the client's. `came`, `data`: the
        member's message they answer, as read (passed on as it came when the rules left it as
        it was)."""
        client = joined.client
        delivered = False
        for out in outs:
            match out:
                case ToClient(message=message, related=related, final=final):
                    delivered = True
                    if not client.deliver(data if message is came and data else encode(message), related, final):
                        self.too_slow(client)
                        return True
                case ToMember(member=member, message=message):
                    delivered = self._to_member(joined, member, message, throttle and len(outs) == 1) or delivered
        if joined.rules.left_out:
            self._left_out(joined)
        return delivered

    def _left_out(self, joined: Joined) -> None:
        self.left_out(joined.rules.left_out)
        joined.rules.left_out.clear()

    def left_out(self, names: list[tuple[str, str]]) -> None:
        """Names members offer that would break the tool-name rules as the group shows them."""
        for member, name in names:
            self.names_left_out[member] += 1
            if (held := self._left_out_log.allow()) is not None:
                self.log.warning("group_name_left_out", member=member, name=name[:200], separator=self.config.separator, suppressed=held)

    def names_for(self, members: tuple[str, ...]) -> Names:
        """The group's Names for `members` (one per set of members a principal may use: few)."""
        names = self._names.get(members)
        if names is None:
            if len(self._names) >= 64:
                self._names.clear()
            names = self._names[members] = Names(members, self.config.separator)
        return names

    def identity(self) -> stateless.Server:
        """What a merged 2026-07-28 answer is decorated with: the group's name, and a cache
        scope that is public only when every member's is."""
        public = all(g.server.cache_scope == "public" for m in self.members if (g := self.gateways.get(m)) is not None)
        return stateless.Server({"name": self.name, "version": "group"}, "public" if public else "private")

    def _to_member(self, joined: Joined, member: str, message: Message, throttle: bool) -> bool:
        """Hand `message` to the group session's session of `member`; whether the client was
        answered here instead (a member that is gone, a member's limit)."""
        sub = joined.members.get(member)
        gateway = self.gateways.get(member)
        if sub is None or gateway is None or sub.ended:
            if "method" in message and "id" in message:  # a request: it fails at once (the rules name the member)
                error = jsonrpc.error(message["id"], jsonrpc.SERVER_UNAVAILABLE, joined.gone.get(member, "it is not running"))
                return self.carry(joined, joined.rules.from_member(member, error, message["id"], True))
            return False
        if "id" in message and "method" in message:
            self.requests[member] += 1
        if self.traces is not None:
            sub.http_trace = joined.client.http_trace  # the span of the HTTP request that carried it
        try:
            # Valid JSON-RPC: the client's was checked (`from_client`), the group's own is made so.
            gateway.from_client(sub, message, REQUEST if "id" in message and "method" in message else NOTIFICATION if "method" in message else RESPONSE)
        except Throttled:
            if throttle:
                raise
            if "method" in message and "id" in message:
                error = jsonrpc.error(message["id"], jsonrpc.TOO_MANY_REQUESTS, "too many requests")
                return self.carry(joined, joined.rules.from_member(member, error, message["id"], True))
        return False

    def too_slow(self, session: Session) -> None:
        self.log.warning("session_too_slow", session=session.id, queue_limit=self.limits.session_queue, queue_bytes=self.limits.slow_bytes)
        asyncio.get_running_loop().call_soon(self.close_session, session, "slow")

    # -------------------------------------------------------------------- time

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            idle_before = time.monotonic() - self.limits.session_idle_timeout
            for session in [s for s in self.sessions.values() if s.last_seen < idle_before and not s.attached()]:
                self.close_session(session, "idle")

    # ------------------------------------------------------------------ health

    def readiness(self) -> str | None:
        """None when every member is ready, else which are not and why."""
        down = {m: reason for m in self.members if (g := self.gateways.get(m)) is not None and (reason := g.readiness()) is not None}
        return "; ".join(f"member {m!r}: {r}" for m, r in down.items()) or None


