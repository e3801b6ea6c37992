"""Which process serves a session (bridge/gateway/placement.py), with the gateway stood in
for: what a per-principal placement does when two of a principal's sessions wait for a
process at once. No process, no socket."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from bridge.gateway.placement import PerPrincipal


class _Host:
    """The part of a gateway a placement uses here: processes come when the test says."""

    name = "f"

    def __init__(self) -> None:
        self.given_back: list[Any] = []
        self.pool = SimpleNamespace(give_back=self.given_back.append, warm=[])
        self.waiting: dict[str, asyncio.Future[Any]] = {}

    async def acquire(self, session: Any, label: str) -> Any:
        future = self.waiting[session.id] = asyncio.get_running_loop().create_future()
        return await future


async def test_two_sessions_of_a_principal_that_waited_together_share_the_first_process() -> None:
    host = _Host()
    placement = PerPrincipal(host)  # type: ignore[arg-type]
    first, second = (SimpleNamespace(id=f"s{i}", owner="alice") for i in (1, 2))
    assert placement.at_hand(first) is None and placement.at_hand(second) is None  # none yet: both wait
    waiting = [asyncio.create_task(placement.acquire(s)) for s in (first, second)]
    async with asyncio.timeout(5):
        while len(host.waiting) < 2:
            await asyncio.sleep(0)
    process_1, process_2 = object(), object()
    host.waiting["s1"].set_result(process_1)
    host.waiting["s2"].set_result(process_2)  # both served before either goes on
    got = await asyncio.gather(*waiting)
    assert got == [process_1, process_1]
    assert host.given_back == [process_2]  # the second goes back to the pool: no principal has two
    assert placement.own("alice") is process_1
