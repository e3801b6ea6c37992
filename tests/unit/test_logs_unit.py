"""The daemon's log machinery with no process (bridge/logs.py): the throttle's count, the
timestamps."""

from __future__ import annotations

from typing import Any

from bridge import logs


def test_throttle_counts_what_it_holds_back(monkeypatch: Any) -> None:
    from types import SimpleNamespace

    import token_bucket.storage

    now = [1000.0]
    monkeypatch.setattr(token_bucket.storage, "time", SimpleNamespace(monotonic=lambda: now[0]))  # its clock only
    throttle = logs.Throttle(rate=1.0, burst=3)
    assert [throttle.allow() for _ in range(3)] == [0, 0, 0]
    assert [throttle.allow() for _ in range(5)] == [None] * 5
    assert throttle.suppressed == 5
    now[0] += 1.0  # a token more: the event it lets through says how many were held back
    assert throttle.allow() == 5 and throttle.suppressed == 0
    assert throttle.allow() is None
    now[0] += 1.0
    assert throttle.allow() == 1  # counted afresh


def test_timestamps_are_iso_8601_utc_to_the_microsecond_across_seconds(monkeypatch: Any) -> None:
    import datetime as dt
    import time

    # In a zone far from UTC: the stamp must not follow the machine's zone.
    monkeypatch.setenv("TZ", "NPT-5:45")  # a POSIX zone, UTC+5:45: no tz database needed
    time.tzset()
    stamper = logs.Stamper()
    try:
        # Within one second, the next one, a whole second, and one a day later.
        for now in (1_764_655_542.123456, 1_764_655_542.999999, 1_764_655_543.000001, 1_764_655_543.0, 1_764_741_943.5):
            monkeypatch.setattr(logs.time, "time", lambda now=now: now)
            stamp = stamper(None, "info", {})["timestamp"]
            expected = dt.datetime.fromtimestamp(now, dt.UTC)
            assert stamp.endswith("Z") and len(stamp) == len("2026-12-02T06:15:42.123456Z"), stamp
            parsed = dt.datetime.fromisoformat(stamp[:-1]).replace(tzinfo=dt.UTC)
            assert abs((parsed - expected).total_seconds()) < 2e-6, (stamp, expected)
            assert stamp[:19] == expected.strftime("%Y-%m-%dT%H:%M:%S"), (stamp, expected)
    finally:
        monkeypatch.undo()  # TZ as it was, and the zone with it
        time.tzset()
