"""The metric tables stay bounded whatever method names clients invent."""

from __future__ import annotations

from bridge.metrics import ServerMetrics


def test_tables_keyed_by_bounded_labels() -> None:
    m = ServerMetrics("s")
    for i in range(1000):
        m.request_done(f"vendor/{i}", 0.001)
        m.message("from_client", f"vendor/{i}")
    m.request_done("tools/call", 0.002)
    m.message("from_client", ["not", "a", "string"])
    assert set(m.durations) == {"other", "tools/call"}
    assert m.durations["other"].count == 1000
    assert set(m.messages) == {("from_client", "other")}
    assert m.messages["from_client", "other"] == 1001
