"""How the daemon's process is tuned (bridge/runtime.py): the open-file limit, the allocator,
and when the garbage collector walks everything. The collector and libc are stood in for,
so each rule is seen as the calls it makes."""

from __future__ import annotations

import asyncio
import resource
from types import SimpleNamespace
from typing import Any

import pytest

from bridge import runtime


def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, wanted), hard))
        runtime.raise_open_file_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _Libc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


def test_the_allocator_keeps_large_buffers_unless_the_operator_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = _Libc()
    monkeypatch.setattr(runtime.ctypes, "CDLL", lambda name: libc)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    runtime.tune_allocator()
    assert sorted(libc.calls) == sorted([(-3, runtime.MMAP_THRESHOLD), (-1, runtime.TRIM_THRESHOLD)])
    libc.calls.clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    runtime.tune_allocator()
    assert libc.calls == []


class _Stop(Exception):
    pass


def _collections(arrivals_per_second: int, sessions: int, seconds: int) -> list[str]:
    """What `keep_collections_short` asks of the collector over `seconds` seconds, with
    connections and sessions arriving at that rate and `sessions` open."""
    calls: list[str] = []
    gc = SimpleNamespace(
        set_threshold=lambda *a: calls.append("threshold"),
        collect=lambda generation=2: calls.append("young" if generation == 1 else "full"),
        freeze=lambda: calls.append("freeze"),
        unfreeze=lambda: calls.append("unfreeze"),
    )
    arrived = [0]

    async def sleep(delay: float) -> None:
        assert delay == runtime.GC_FREEZE_INTERVAL_S
        calls.append("second")
        if calls.count("second") > seconds:
            raise _Stop
        arrived[0] += arrivals_per_second

    fake_asyncio: Any = SimpleNamespace(sleep=sleep)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "gc", gc)
        patch.setattr(runtime, "asyncio", fake_asyncio)
        with pytest.raises(_Stop):
            asyncio.run(runtime.keep_collections_short(lambda: arrived[0], lambda: sessions))
    return calls


def test_every_second_the_young_are_collected_and_the_survivors_frozen() -> None:
    calls = _collections(arrivals_per_second=0, sessions=0, seconds=3)
    assert calls == ["threshold", "young", "freeze", "second"] + ["young", "freeze", "second"] * 3


def test_a_full_walk_comes_once_as_many_arrived_as_are_open_and_at_least_full_after() -> None:
    # 100 a second: FULL_AFTER (512) is reached in the sixth second, then again six later.
    calls = _collections(arrivals_per_second=100, sessions=10, seconds=13)
    seconds = [i for i, c in enumerate(calls) if c == "second"]
    walks = [sum(1 for s in seconds if s < i) for i, c in enumerate(calls) if c == "full"]
    assert walks == [6, 12]
    for i, c in enumerate(calls):
        if c == "full":
            assert calls[i - 1] == "unfreeze"  # a walk over what was frozen too
    # With 1,000 sessions open, a walk waits for 1,000 arrivals.
    calls = _collections(arrivals_per_second=100, sessions=1000, seconds=13)
    seconds = [i for i, c in enumerate(calls) if c == "second"]
    assert [sum(1 for s in seconds if s < i) for i, c in enumerate(calls) if c == "full"] == [10]


def test_a_full_walk_comes_every_gc_full_every_seconds_regardless() -> None:
    every = int(runtime.GC_FULL_EVERY / runtime.GC_FREEZE_INTERVAL_S)
    calls = _collections(arrivals_per_second=0, sessions=0, seconds=every + 1)
    assert calls.count("full") == 1
