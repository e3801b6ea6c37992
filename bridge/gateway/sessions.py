"""Client sessions: id, owner, idle tracking; transports say how messages reach the client.

A transport subclasses `Session` to say how messages reach its client. The
gateway only calls `deliver` (which must never block: a full queue returns
False and the gateway drops the session as too slow), `flush` (once what one
batch of input produced is delivered), `finish` when it has one, and `end`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

from structlog.typing import FilteringBoundLogger

from bridge.config.schema import Limits
from bridge.metrics import ServerMetrics
from bridge.protocol.jsonrpc import Kind, Message, RequestId

if TYPE_CHECKING:
    from bridge.traces import HttpSpan

KEEPALIVE_PASSES = 5  # checks per keepalive interval: comments come every 4/5 to 5/5 of it
KEEPALIVE_SLICE = 64  # keepalives written between yields to the event loop


def new_session_id() -> str:
    return secrets.token_hex(16)  # 128 bits from the OS CSPRNG


class Session:
    transport = "none"
    logged = True  # its opening and closing are logged (not a stateless request's: one per call)
    # Its id is the client's handle on it: unguessable, and in a cluster it names the replica.
    # A stateless request's session is never named by a client, so it takes a cheap id.
    addressed = True
    era = "legacy"  # the protocol era it speaks: "legacy" (2024-11-05 to 2025-11-25) or "2026-07-28"
    # What a final response to this session's call passes through before it is encoded: the
    # 2026-07-28 path makes a legacy server's answer a 2026-07-28 one there, in place, so a
    # result is decoded once, where the server's line was read. None: sent as it came.
    finish: Callable[[Message], None] | None = None
    # Set while the gateway ends it from outside (the admin API): a transport that closes it on
    # the errors this delivers (a 2026-07-28 call, answered by one) closes it for this reason.
    ending: str | None = None
    group: str | None = None  # the group it serves (a group session's member session, or a 2026-07-28 request's)
    # Tracing on: the span of the HTTP request that carries the message being routed (an
    # opentelemetry Span, or UNSAMPLED: traces/__init__.py), set by its endpoint and taken by
    # the gateway.
    http_trace: HttpSpan | None = None
    # Tracing on, while it is routed: when (time.time_ns) the message arrived, if it waited for
    # a process before the gateway saw it (a 2026-07-28 request opening its session).
    waited_from: int | None = None

    def __init__(self, server: str, owner: str | None, session_id: str | None = None) -> None:
        self.id = session_id or new_session_id()
        self.server = server
        self.owner = owner
        self.created = time.monotonic()
        self.last_seen = self.created  # the client's last request: idle reaping
        self.last_pinged = self.created
        self.ended = False
        self.end_reason: str | None = None

    def deliver(self, data: bytes, related: RequestId | None, final: bool) -> bool:
        raise NotImplementedError

    def flush(self) -> None:
        """Write what `deliver` queued, if this transport holds messages back for one write."""

    def attached(self) -> bool:
        """Whether a client connection is waiting on this session right now."""
        raise NotImplementedError

    def reached(self) -> bool:
        """Whether what it is given now reaches its client before it closes: a connection
        reads it now (a parked 2026-07-28 call's session is attached, and read by none)."""
        return self.attached()

    def keepalive(self) -> None:
        """Write a comment on every open stream, so proxies and clients see it is alive."""
        raise NotImplementedError

    def end(self, reason: str) -> None:
        self.ended = True
        self.end_reason = reason


class Registry:
    """The sessions of one gateway or group, by id: who may name one, and their keepalives."""

    keepalive: float  # seconds between comments on every stream
    sessions: dict[str, Session]

    def session(self, session_id: str | None, owner: str | None) -> Session | None:
        """The live session with this id, if `owner` opened it; anyone else gets None."""
        session = self.sessions.get(session_id) if session_id else None
        if session is None or session.owner != owner:
            return None
        return session

    def session_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for session in self.sessions.values():
            counts[session.transport] = counts.get(session.transport, 0) + 1
        return counts

    async def keepalives(self) -> None:
        """A comment on every stream once per `keepalive` seconds.

        Checked a few times per interval, so each pass writes to the slice of the
        sessions that opened in one part of it; and a pass yields to the loop after
        every few writes, so that requests never wait behind thousands of them.
        """
        while True:
            await asyncio.sleep(self.keepalive / KEEPALIVE_PASSES)
            now = time.monotonic()
            due = now - self.keepalive * (1 - 1 / KEEPALIVE_PASSES)
            for pinged, session in enumerate([s for s in self.sessions.values() if s.last_pinged < due], 1):
                session.last_pinged = now
                session.keepalive()
                if pinged % KEEPALIVE_SLICE == 0:
                    await asyncio.sleep(0)


class Spares:
    """Open sessions a transport keeps, idle, for its next requests of the same kind (a
    2026-07-28 call's: see http/endpoints/stateless_2026.py), at most `limit` of them; each is in its
    gateway's sessions too. The one kept last is taken first; the one kept first gives way."""

    __slots__ = ("_by_kind", "count", "limit")

    def __init__(self, limit: int) -> None:
        self._by_kind: dict[Hashable, list[Session]] = {}
        self.count = 0
        self.limit = limit

    def __bool__(self) -> bool:
        return self.count > 0

    def keep(self, kind: Hashable, session: Session) -> bool:
        """Keep `session` for a request of `kind`, if there is room; whether it was."""
        if self.count >= self.limit:
            return False
        kept = self._by_kind.get(kind)
        if kept is None:
            self._by_kind[kind] = [session]
        else:
            kept.append(session)
        self.count += 1
        return True

    def take(self, kind: Hashable) -> Session | None:
        """A kept session of `kind` (no longer kept), if there is one."""
        kept = self._by_kind.get(kind)
        if kept is None:
            return None
        session = kept.pop()
        if not kept:
            del self._by_kind[kind]
        self.count -= 1
        return session

    def drop(self, kind: Hashable, session: Session) -> None:
        """A kept session closed."""
        kept = self._by_kind.get(kind)
        if kept is not None and session in kept:
            kept.remove(session)
            if not kept:
                del self._by_kind[kind]
            self.count -= 1

    def oldest(self) -> Session | None:
        """The session kept longest ago, near enough (the first of the kind kept first)."""
        for kept in self._by_kind.values():
            return kept[0]
        return None

    def all(self) -> list[Session]:
        return [session for kept in self._by_kind.values() for session in kept]


class Served(Protocol):
    """What the 2025 transports' endpoints serve: one server's `Gateway`, or a `Group` of
    servers (gateway/group.py). Each registers its sessions and routes their messages."""

    name: str
    path: str  # where it is served: /servers/NAME or /groups/NAME
    limits: Limits
    metrics: ServerMetrics
    log: FilteringBoundLogger

    @property
    def traces(self) -> object | None:
        """Tracing, when on: its endpoints hand the gateway each HTTP request's span."""

    async def open_session(self, session: Session) -> None: ...

    def session(self, session_id: str | None, owner: str | None) -> Session | None: ...

    def close_session(self, session: Session, reason: str) -> None: ...

    def from_client(self, session: Session, payload: Any, kind: Kind | None = None) -> None: ...

    def negotiated_version(self, session: Session) -> str | None: ...
