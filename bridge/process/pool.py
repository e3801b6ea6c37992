"""Server processes as a pool: processes started ahead (warm), and caps on how many run.

A process holds a *slot* from the moment the bridge decides to start it until
it has exited for good (its restarts keep the slot). Slots are counted per
server (`servers.NAME.pool.max`) and for the whole daemon
(`limits.max_processes`); warm processes hold slots like any other.

A session that needs a process takes, in this order: a warm process of its
server that is ready, or a new process in a free slot. Ready is the gateway's
word: per session, started and shown to read its input but not initialized
(its session's own initialize does that, whatever version it asks for); per
principal, initialized by the bridge. When there is neither it waits, first
come first served, up to the server's `pool.wait`, for whichever comes
first: a slot freed (a process exited) or a warm process that became ready;
then it is refused (`Full`), never left hanging. While the daemon-wide cap
is what it waits for, one idle warm process of another server is stopped to
make room for it.

Pools are refilled in the background: after a warm process is taken, and
whenever a slot frees, but never while a session waits for a slot (sessions
come first). A warm process that exits before it is taken is restarted by
its own supervisor, with the server's backoff, and a crash loop of warm
starts is reported as any other; a warm process that is never ready is never
handed out, and so never replaced by another start.

Processes are not reused: once given to a session (or a principal) a process
is never given to another; it is stopped when its owner is done with it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from bridge import logs
from bridge.config import schema


class Member(Protocol):
    """What the pool needs of a process it hands out (the gateway's Upstream)."""

    warm: bool  # started ahead, not for anyone in particular

    def ready(self) -> bool: ...

    def start(self) -> None: ...


M = TypeVar("M", bound=Member)


class Full(Exception):
    """No process for a new session within its server's pool.wait (or the server is stopping)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, for Retry-After


class _Pooled(Protocol):
    """What the daemon-wide count sees of each server's pool."""

    def refill(self) -> None: ...

    def evict(self) -> bool: ...


@dataclass(slots=True, eq=False)
class _Waiter:
    serve: Callable[[], bool]  # hand it a process if there is one now; True if it got one
    done: Callable[[], bool]  # it has its answer already (a process, a refusal, or its client left)


class Slots:
    """The daemon's server processes: how many hold a slot, the cap, and the sessions
    waiting for one (of any server, in the order they came)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit  # limits.max_processes; None: no cap
        self.used = 0
        self.waiters: deque[_Waiter] = deque()
        self.pools: dict[_Pooled, None] = {}  # the active ones, in the order they started

    def room(self) -> bool:
        return self.limit is None or self.used < self.limit

    def changed(self) -> None:
        """A slot freed, a warm process became ready, or the cap changed: serve whoever waits,
        in order, with what is there now; then, if nobody waits, refill the pools."""
        self.waiters = deque(w for w in self.waiters if not (w.done() or w.serve()))
        if not self.waiters:
            for pool in list(self.pools):
                pool.refill()

    def evict_for(self, pool: _Pooled) -> None:
        """Stop one idle warm process of another server, so that `pool` gets its slot."""
        for other in self.pools:
            if other is not pool and other.evict():
                return


class Pool(Generic[M]):
    """One server's processes: the warm ones waiting for a session, and its slots."""

    def __init__(
        self,
        server: str,
        settings: schema.Pool,
        slots: Slots,
        make: Callable[[str, bool], M],
        retire: Callable[[M], None],
        waits: Counter[str],
        starts: Counter[str],
    ) -> None:
        self.server = server
        self.settings = settings
        self.slots = slots
        self.used = 0  # this server's processes that hold a slot
        self.warm: list[M] = []  # started ahead, not yet taken (ready or not)
        self.active = False
        self._make = make  # (label, warm) -> a new process, not started yet
        self._retire = retire  # stop a process for good (its slot frees once it has exited)
        self._waits = waits  # by outcome: ok, timeout, gone (the metric's counts)
        self._starts = starts  # sessions' processes by where they came from: warm, cold
        self._names = itertools.count(1)
        self._log = logs.get(server=server)
        self._waiting: set[asyncio.Future[M]] = set()  # sessions waiting for one of this server's processes

    # --------------------------------------------------------------- lifecycle

    def open(self) -> None:
        self.active = True
        self.slots.pools[self] = None
        self.refill()

    def close(self, reason: str) -> None:
        """Take no more: whoever waits for one of this server's processes is refused now."""
        self.active = False
        self.slots.pools.pop(self, None)
        for future in self._waiting:
            if not future.done():
                future.set_exception(Full(reason, self.retry_after()))

    # ------------------------------------------------------------------ slots

    def room(self) -> bool:
        """A new process of this server may start now."""
        limit = self.settings.max
        return (limit is None or self.used < limit) and self.slots.room()

    def take_slot(self) -> None:
        self.used += 1
        self.slots.used += 1

    def release(self) -> None:
        """One of this server's processes has exited for good."""
        self.used -= 1
        self.slots.used -= 1
        self.slots.changed()

    def retry_after(self) -> int:
        return max(1, math.ceil(self.settings.wait))

    # ------------------------------------------------------------- processes

    def claim(self, label: str) -> M | None:
        """A ready warm process, out of the pool; else a new one started in a free slot;
        None when there is neither now."""
        if not self.active:
            return None
        for i, member in enumerate(self.warm):
            if member.ready():
                del self.warm[i]
                self._starts["warm"] += 1
                self.refill()
                return member
        if not self.room():
            return None
        self.take_slot()
        self._starts["cold"] += 1
        member = self._make(label, False)
        member.start()
        return member

    async def acquire(self, label: str) -> M:
        """A process for a new session, waiting up to pool.wait for one; raises Full."""
        member = self.claim(label)
        if member is not None:
            return member
        if not self.active:
            raise Full(f"server {self.server!r} is shutting down", self.retry_after())
        limit = self.settings.max
        if (limit is None or self.used < limit) and not self.warm:
            self.slots.evict_for(self)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[M] = loop.create_future()

        def serve() -> bool:
            member = self.claim(label)
            if member is not None:
                future.set_result(member)
            return member is not None

        self._log.info(
            "session_waiting_for_process",
            process=label,
            processes=self.used,
            max=self.settings.max,
            total=self.slots.used,
            max_processes=self.slots.limit,
        )
        waiter = _Waiter(serve, future.done)
        self.slots.waiters.append(waiter)
        self._waiting.add(future)
        timer = loop.call_later(self.settings.wait, self._expire, future)
        try:
            member = await future
        except Full:
            self._waits["timeout"] += 1
            raise
        except asyncio.CancelledError:
            # The client left while waiting; a process given to it meanwhile goes back.
            if future.done() and not future.cancelled() and future.exception() is None:
                self.give_back(future.result())
            self._waits["gone"] += 1
            raise
        finally:
            timer.cancel()
            self._waiting.discard(future)
            if waiter in self.slots.waiters:
                self.slots.waiters.remove(waiter)
        self._waits["ok"] += 1
        return member

    def _expire(self, future: asyncio.Future[M]) -> None:
        if future.done():
            return
        limit, total_limit = self.settings.max, self.slots.limit
        held = f"{self.used} processes" + (f" (pool.max {limit})" if limit is not None else "")
        total = f"{self.slots.used} in all" + (f" (limits.max_processes {total_limit})" if total_limit is not None else "")
        future.set_exception(
            Full(
                f"server {self.server!r} has no process free: {held}, {total}; waited {self.settings.wait:g}s (pool.wait)",
                self.retry_after(),
            )
        )

    def give_back(self, member: M) -> None:
        """A process handed out and not used after all: a warm one (no session's message
        reached it) goes back to the pool, any other is stopped."""
        if member.warm and self.active:
            self.warm.append(member)
            self.slots.changed()
        else:
            self._retire(member)

    def refill(self) -> None:
        """Start warm processes up to pool.warm, in free slots, unless a session waits for one."""
        while self.active and len(self.warm) < self.settings.warm and self.room() and not self.slots.waiters:
            self.take_slot()
            member = self._make(f"{self.server}[warm-{next(self._names)}]", True)
            self.warm.append(member)
            member.start()

    def evict(self) -> bool:
        """Stop one warm process (one not ready first) to free its slot; False if there is none."""
        if not self.warm:
            return False
        waiting = [m for m in self.warm if not m.ready()]
        member = waiting[0] if waiting else self.warm[0]
        self.warm.remove(member)
        self._retire(member)
        return True

    def sizes(self) -> dict[str, int]:
        """Processes by state: warm (ready, waiting for a session), starting (warm, not ready
        yet), in_use (given to a session or principal, until it has exited)."""
        ready = sum(1 for m in self.warm if m.ready())
        return {"warm": ready, "starting": len(self.warm) - ready, "in_use": self.used - len(self.warm)}

    def waiting(self) -> int:
        """Sessions waiting for one of this server's processes now."""
        return len(self._waiting)
