"""When a supervisor starts a server again (bridge/process/supervisor.py): backoff doubling
from `backoff_initial` to `backoff_max` with +-20% jitter, and a crash loop past
`max_restarts` exits within `window`. The real `next_delay`, no process."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.config.schema import Duration, Restart
from bridge.process.supervisor import Supervisor


def supervisor(jitter: float = 0.5, **policy: Any) -> Supervisor:
    restart = Restart(**{k: Duration(v) if k != "max_restarts" else v for k, v in policy.items()})
    return Supervisor(
        server="s", make_child=lambda: None, restart=restart, shutdown_timeout=1.0, events=None,  # type: ignore[arg-type, return-value]
        jitter=lambda: jitter,
    )  # fmt: skip


def test_the_delay_doubles_from_the_initial_backoff_up_to_the_maximum() -> None:
    sup = supervisor(backoff_initial=0.5, backoff_max=3, max_restarts=10, window=60)
    delays = [sup.next_delay(float(t))[0] for t in range(6)]  # jitter 0.5: the middle of +-20%
    assert delays == pytest.approx([0.5, 1.0, 2.0, 3.0, 3.0, 3.0])


def test_jitter_moves_a_delay_by_20_percent_at_most() -> None:
    assert supervisor(jitter=0.0, backoff_initial=1, window=60).next_delay(0.0)[0] == pytest.approx(0.8)
    assert supervisor(jitter=1.0, backoff_initial=1, window=60).next_delay(0.0)[0] == pytest.approx(1.2)


def test_more_exits_than_max_restarts_within_the_window_is_a_crash_loop() -> None:
    sup = supervisor(backoff_initial=0.5, backoff_max=30, max_restarts=3, window=10)
    assert [sup.next_delay(t)[1] for t in (0.0, 1.0, 2.0)] == [False] * 3
    assert sup.next_delay(3.0) == (30.0, True)


def test_exits_older_than_the_window_are_forgotten() -> None:
    """Exits spread out over time are no crash loop, and start the backoff afresh."""
    sup = supervisor(backoff_initial=0.5, backoff_max=30, max_restarts=3, window=10)
    for t in (0.0, 11.0, 22.0, 33.0, 44.0):
        delay, loop = sup.next_delay(t)
        assert not loop and delay == pytest.approx(0.5), t
