"""Metric tables stay bounded and their labels known (bridge/metrics.py), with no process."""

from __future__ import annotations

import pytest

from bridge.metrics import LATENCY_BUCKETS, Latency, ServerMetrics, code_label


def test_tables_keyed_by_bounded_labels() -> None:
    m = ServerMetrics("s")
    for i in range(1000):
        m.request_done(f"vendor/{i}", 0.001)
        m.message("from_client", f"vendor/{i}")
        m.error_sent({"code": -1000 - i, "message": "vendor"})
    m.request_done("tools/call", 0.002)
    m.message("from_client", ["not", "a", "string"])
    assert set(m.durations) == {"other", "tools/call"}
    assert m.durations["other"].count == 1000
    assert set(m.messages) == {("from_client", "other")}
    assert m.messages["from_client", "other"] == 1001
    assert m.errors == {"other": 1000}


def test_error_code_labels() -> None:
    assert code_label({"code": -32602, "message": "x"}) == "-32602"
    assert code_label({"code": -32003}) == "-32003"  # the bridge's: server unavailable
    assert code_label({"code": -32002}) == "-32002"  # MCP's: resource not found
    for odd in ({"code": 7}, {"code": -32602.0}, {"code": "-32602"}, {"code": True}, {}, "error", None):
        assert code_label(odd) == "other", odd


def test_latency_buckets_are_cumulative_and_a_bound_is_in_its_own_bucket() -> None:
    """Prometheus buckets count what is less than or equal to their bound (`le`)."""
    latency = Latency()
    for seconds in (0.001, 0.0011, 0.3, 1000.0):
        latency.observe(seconds)
    cumulative = dict(latency.cumulative())
    assert cumulative["0.0005"] == 0
    assert cumulative["0.001"] == 1  # exactly on the bound
    assert cumulative["0.0025"] == 2
    assert cumulative["0.25"] == 2 and cumulative["0.5"] == 3
    assert cumulative[str(LATENCY_BUCKETS[-1])] == 3 and cumulative["+Inf"] == 4 == latency.count
    assert latency.total == pytest.approx(1000.3021)


def test_2026_requests_do_not_count_toward_the_next_full_collection() -> None:
    m = ServerMetrics("s")
    m.sessions_opened["sse"] += 2
    m.sessions_opened["streamable"] += 3
    m.sessions_opened["stateless"] += 1000  # one per call: they leave no cycle behind
    assert m.opened() == 5
