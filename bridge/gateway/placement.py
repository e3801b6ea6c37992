"""Which process serves a session: `server.mode` as one interface, `Placement`, with one
implementation per mode (`Shared`, `PerPrincipal`, `PerSession`), so that the gateway
asks where a session goes and what follows its closing, and never which mode it is in."""

from __future__ import annotations

import abc
import asyncio
import shutil
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Protocol

from bridge.core.mux import PeerState
from bridge.gateway.sessions import Session
from bridge.gateway.upstream import Host, Upstream
from bridge.process.supervisor import Status


class PlacementHost(Host, Protocol):
    """What a placement needs of its gateway besides what its upstreams need."""

    @property
    def placed(self) -> Mapping[str, Upstream]:
        """Session id -> the process serving it."""
        ...

    async def acquire(self, session: Session, label: str) -> Upstream: ...

    def stop_later(self, upstream: Upstream) -> None: ...


class Placement(abc.ABC):
    mode: ClassVar[str]

    def __init__(self, host: PlacementHost) -> None:
        self.host = host

    def start(self) -> None:
        """The gateway starts: processes that exist before any session start now."""
        return None

    def stop(self) -> None:
        """The gateway stops: no process is to be started or retired from now on."""
        return None

    @abc.abstractmethod
    def at_hand(self, session: Session) -> Upstream | None:
        """The process for `session` if there is one now; None: `acquire` waits for one."""

    @abc.abstractmethod
    async def acquire(self, session: Session) -> Upstream:
        """A process for `session` from the pool (raises `SessionLimitError` when none comes)."""

    @abc.abstractmethod
    def released(self, session: Session, upstream: Upstream) -> None:
        """`session` closed on `upstream`: what becomes of the process."""

    @abc.abstractmethod
    def upstreams(self) -> Iterable[Upstream]:
        """Every process of the server: serving sessions, or warm for one."""

    def own(self, principal: str | None) -> Upstream | None:
        """The process `principal`'s sessions share, if they share one."""
        return None

    def listeners(self, source: Upstream, method: str) -> list[str]:
        """Sessions on other processes that a list change `method` from `source` is for."""
        return []

    def opened(self, upstream: Upstream) -> dict[str, Any]:
        """What the `session_opened` log line says of the process a session got."""
        return {}

    def readiness(self) -> str | None:
        """None when a session opened now could be served, else why not."""
        host = self.host
        if shutil.which(host.server.command, path=host.child_env.get("PATH")) is None:
            return f"command {host.server.command!r} not found"
        upstreams = list(self.upstreams())
        failed = [u for u in upstreams if u.supervisor.status is Status.FAILED]
        if failed and len(failed) == len(upstreams):
            return failed[0].supervisor.failure or "crash loop"
        return None


class Shared(Placement):
    """One process for every session, started with the gateway. It counts toward
    limits.max_processes but never waits: a shared server always has its process."""

    mode = "shared"

    def __init__(self, host: PlacementHost) -> None:
        super().__init__(host)
        self.process: Upstream | None = None

    def start(self) -> None:
        self.host.pool.take_slot()
        self.process = Upstream(self.host, self.host.name)
        self.process.start()

    def at_hand(self, session: Session) -> Upstream | None:
        return self.process

    async def acquire(self, session: Session) -> Upstream:
        raise AssertionError("a shared server's process is always at hand")

    def released(self, session: Session, upstream: Upstream) -> None:
        pass

    def upstreams(self) -> Iterable[Upstream]:
        return () if self.process is None else (self.process,)

    def own(self, principal: str | None) -> Upstream | None:
        return self.process

    def readiness(self) -> str | None:
        process = self.process
        if process is None:
            return super().readiness()
        if process.ready():
            return None
        sup = process.supervisor
        if sup.status is Status.FAILED:
            return sup.failure or "crash loop"
        return f"server is {sup.status.value}, protocol {process.mux.state.value}"


class PerPrincipal(Placement):
    """One process per principal, shared by its sessions, from the pool; stopped once it
    has had no session for `principal_idle_timeout`."""

    mode = "per-principal"

    def __init__(self, host: PlacementHost) -> None:
        super().__init__(host)
        self.by_principal: dict[str | None, Upstream] = {}
        self._retiring: dict[str | None, asyncio.TimerHandle] = {}  # processes with no session, by principal

    def stop(self) -> None:
        for timer in self._retiring.values():
            timer.cancel()
        self._retiring.clear()

    def at_hand(self, session: Session) -> Upstream | None:
        retiring = self._retiring.pop(session.owner, None)
        if retiring is not None:
            retiring.cancel()
        return self.by_principal.get(session.owner)

    async def acquire(self, session: Session) -> Upstream:
        upstream = await self.host.acquire(session, f"{self.host.name}[{session.owner or '-'}]")
        existing = self.at_hand(session)
        if existing is not None:  # another of its sessions got one while this one waited
            self.host.pool.give_back(upstream)
            return existing
        self.by_principal[session.owner] = upstream
        return upstream

    def released(self, session: Session, upstream: Upstream) -> None:
        if not upstream.mux.sessions() and session.owner not in self._retiring:
            self._retiring[session.owner] = asyncio.get_running_loop().call_later(
                self.host.server.principal_idle_timeout, self._retire, session.owner
            )

    def _retire(self, principal: str | None) -> None:
        self._retiring.pop(principal, None)
        upstream = self.by_principal.get(principal)
        if upstream is None or upstream.mux.sessions():
            return
        del self.by_principal[principal]
        self.host.log.info("server_retired", principal=principal, idle_s=self.host.server.principal_idle_timeout)
        self.host.stop_later(upstream)

    def upstreams(self) -> Iterable[Upstream]:
        return [*self.by_principal.values(), *self.host.pool.warm]

    def own(self, principal: str | None) -> Upstream | None:
        return self.by_principal.get(principal)


class PerSession(Placement):
    """A process of its own for each session (a 2026-07-28 request is one), from the pool;
    stopped when its session closes."""

    mode = "per-session"

    def at_hand(self, session: Session) -> Upstream | None:
        return None

    async def acquire(self, session: Session) -> Upstream:
        # The id's end: a cluster's ids share their start.
        return await self.host.acquire(session, f"{self.host.name}[{session.id[-8:]}]")

    def released(self, session: Session, upstream: Upstream) -> None:
        self.host.stop_later(upstream)

    def upstreams(self) -> Iterable[Upstream]:
        return [*self.host.placed.values(), *self.host.pool.warm]

    def opened(self, upstream: Upstream) -> dict[str, Any]:
        return {"process": "warm" if upstream.warm else "cold"}  # started ahead, or for it

    def listeners(self, source: Upstream, method: str) -> list[str]:
        """A list change from a process serving a 2026-07-28 request is for its principal's
        `subscriptions/listen` streams, which each have a process of their own (as every
        request of that client has) that never says it. Not across principals."""
        principals = {peer.principal for sid in source.mux.sessions() if (peer := source.mux.peer(sid)).state is PeerState.STATELESS}
        if not principals:
            return []
        found = []
        for sid, upstream in self.host.placed.items():
            if upstream is not source:
                peer = upstream.mux.peer(sid)
                if peer.state is PeerState.STATELESS and peer.notices and method in peer.notices and peer.principal in principals:
                    found.append(sid)
        return found


PLACEMENTS: dict[str, type[Placement]] = {p.mode: p for p in (Shared, PerPrincipal, PerSession)}
