"""The pool's rules with the real `Slots` and `Pool` and members that are plain objects: who
gets a freed slot, in which order sessions are served, what a client that left while
waiting leaves behind, and the Retry-After a refusal carries. No process, no socket."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from bridge.config.schema import Duration
from bridge.config.schema import Pool as PoolSettings
from bridge.process.pool import Full, Pool, Slots


class Member:
    def __init__(self, label: str, warm: bool) -> None:
        self.label, self.warm = label, warm
        self.is_ready = False
        self.started = False

    def ready(self) -> bool:
        return self.is_ready

    def start(self) -> None:
        self.started = True


class Harness:
    """One server's pool on `slots`, recording what it made and what it retired."""

    def __init__(self, slots: Slots, name: str, warm: int = 0, max_: int | None = None, wait: float = 5.0) -> None:
        self.made: list[Member] = []
        self.retired: list[Member] = []
        self.waits: Counter[str] = Counter()
        self.pool: Pool[Member] = Pool(name, PoolSettings(warm=warm, max=max_, wait=Duration(wait)), slots, self._make, self.retired.append, self.waits, Counter())

    def _make(self, label: str, warm: bool) -> Member:
        member = Member(label, warm)
        self.made.append(member)
        return member


async def _waiting(pool: Pool[Member], count: int) -> None:
    """Until `count` sessions wait for one of `pool`'s processes (bounded)."""
    async with asyncio.timeout(5):
        while pool.waiting() < count:
            await asyncio.sleep(0)


async def test_a_freed_slot_goes_to_a_waiting_session_before_any_refill() -> None:
    """One slot in all: a warm process of server a holds it, and a session of server b waits
    (its wait evicts a's idle warm process). When that process has exited, the slot is the
    session's: a's pool refills only when nobody waits, and there is no room left then."""
    slots = Slots(limit=1)
    a, b = Harness(slots, "a", warm=1), Harness(slots, "b")
    a.pool.open()
    b.pool.open()
    assert [m.warm for m in a.made] == [True] and slots.used == 1
    session = asyncio.ensure_future(b.pool.acquire("b[1]"))
    await _waiting(b.pool, 1)
    assert a.retired == a.made  # evicted to make room: its slot frees once it has exited
    a.pool.release()
    member = await asyncio.wait_for(session, 5)
    assert member is b.made[0] and not member.warm and member.started
    assert len(a.made) == 1 and a.pool.warm == []  # no warm start took the slot first
    assert slots.used == 1 and not slots.waiters


async def test_waiting_sessions_are_served_first_come_first_served() -> None:
    slots = Slots(limit=1)
    h = Harness(slots, "s")
    h.pool.open()
    first = await h.pool.acquire("s[0]")
    order: list[str] = []

    async def session(label: str) -> None:
        member = await h.pool.acquire(label)
        order.append(member.label)

    tasks = []
    for i in range(1, 4):
        tasks.append(asyncio.ensure_future(session(f"s[{i}]")))
        await _waiting(h.pool, i)  # each one waiting before the next comes
    assert first.label == "s[0]" and order == []
    for _ in range(3):
        h.pool.release()  # the process holding the slot exited: the next in line starts one
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["s[1]", "s[2]", "s[3]"]
    assert h.waits["ok"] == 3


async def test_a_warm_process_given_to_a_client_that_left_goes_back_to_the_pool() -> None:
    """The process is handed over in the same turn as the client's leaving: it goes back to
    the pool, ready for the next session; its slot is still counted once, and nothing is stopped."""
    slots = Slots(limit=1)
    h = Harness(slots, "w", warm=1)
    h.pool.open()
    warm = h.made[0]
    session = asyncio.ensure_future(h.pool.acquire("w[1]"))
    await _waiting(h.pool, 1)
    warm.is_ready = True
    slots.changed()  # it became ready: handed to the waiting session...
    session.cancel()  # ...whose client went before it could use it
    with pytest.raises(asyncio.CancelledError):
        await session
    assert h.pool.warm == [warm] and h.retired == [] and slots.used == 1
    assert h.waits["gone"] == 1
    assert await h.pool.acquire("w[2]") is warm  # the next session takes it


async def test_a_new_process_given_to_a_client_that_left_is_stopped_not_leaked() -> None:
    slots = Slots(limit=1)
    h = Harness(slots, "c")
    h.pool.open()
    await h.pool.acquire("c[0]")
    session = asyncio.ensure_future(h.pool.acquire("c[1]"))
    await _waiting(h.pool, 1)
    h.pool.release()  # c[0] exited: c[1] is started in its slot...
    session.cancel()  # ...for a client that has gone
    with pytest.raises(asyncio.CancelledError):
        await session
    assert [m.label for m in h.retired] == ["c[1]"]  # stopped: its slot frees when it has exited
    assert slots.used == 1 and h.pool.warm == []


@pytest.mark.parametrize(("wait", "retry_after"), [(0.05, 1), (1.5, 2), (3.0, 3)])
async def test_a_refusal_tells_the_client_to_retry_after_pool_wait(wait: float, retry_after: int) -> None:
    """Retry-After follows servers.NAME.pool.wait (whole seconds, at least one)."""
    slots = Slots(limit=1)
    h = Harness(slots, "r", wait=wait)
    h.pool.open()
    await h.pool.acquire("r[0]")
    assert h.pool.retry_after() == retry_after
    if wait < 1:  # waited for in full only where it is short
        with pytest.raises(Full) as refused:
            await h.pool.acquire("r[1]")
        assert refused.value.retry_after == retry_after and "pool.wait" in str(refused.value)
        assert h.waits["timeout"] == 1
