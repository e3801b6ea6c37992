"""traces/spans.py's rules that need no daemon: how an HTTP request's span ends (rule 2), and
what a request not traced follows (rule 3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridge.traces import UNSAMPLED
from bridge.traces import spans as spans_module
from bridge.traces.settings import Settings
from bridge.traces.spans import Spans

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_an_http_span_is_an_error_on_a_5xx_and_when_cut_off_never_on_a_4xx() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for status in (200, 404, 503, None):
        Spans.http_ended(tracer.start_span(f"POST {status}"), status)
    ended = [(s.attributes.get("http.response.status_code"), s.attributes.get("error.type"), s.status.status_code.name) for s in exporter.get_finished_spans()]
    assert ended == [(200, None, "UNSET"), (404, None, "UNSET"), (503, "503", "ERROR"), (None, "aborted", "ERROR")]


class _Session:
    id = "s1"
    transport = "streamable"
    era = "legacy"
    waited_from = None


@pytest.fixture(params=[0.0])
def spans(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Spans, InMemorySpanExporter]]:
    """Tracing at ratio 0 (no trace begun here is sampled; else as parametrized), exporting to memory."""
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(spans_module, "_exporter", lambda settings: exporter)
    made = Spans(Settings(None, "http/protobuf", {}, request.param, "test", 64))
    yield made, exporter
    made.provider.shutdown()


def _finished(traces: Spans, exporter: InMemorySpanExporter) -> tuple[Any, ...]:
    traces.provider.force_flush()
    return exporter.get_finished_spans()


def _call(meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "echo"}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def test_a_request_with_no_context_follows_its_http_requests_decision_and_draws_for_none(spans: tuple[Spans, InMemorySpanExporter]) -> None:
    traces, exporter = spans
    assert not traces.started(_Session(), _call(), lambda s: None, UNSAMPLED)
    assert not traces.started(_Session(), _call(), lambda s: None, None)  # no HTTP request's: its own draw, at ratio 0
    assert _finished(traces, exporter) == () and traces.open == {}


@pytest.mark.parametrize("spans", [1.0], indirect=True)  # a draw would trace it
def test_a_malformed_meta_context_in_an_unsampled_http_request_is_not_traced(spans: tuple[Spans, InMemorySpanExporter]) -> None:
    traces, _ = spans
    msg = _call({"traceparent": "00-nonsense-01", "progressToken": 7})
    assert not traces.started(_Session(), msg, lambda s: None, UNSAMPLED)
    assert msg["params"]["_meta"] == {"traceparent": "00-nonsense-01", "progressToken": 7}  # reaches the server as it came


def test_a_sampled_meta_context_is_traced_whatever_its_http_request_decided(spans: tuple[Spans, InMemorySpanExporter]) -> None:
    traces, exporter = spans
    msg = _call({"traceparent": SAMPLED})
    assert traces.started(_Session(), msg, lambda s: "2025-06-18", UNSAMPLED)
    traces.answered("s1", 1, {"jsonrpc": "2.0", "id": 1, "result": {}})
    (span,) = _finished(traces, exporter)
    assert f"{span.context.trace_id:032x}" == SAMPLED.split("-")[1] and span.links == ()
    assert msg["params"]["_meta"]["traceparent"].split("-")[2] == f"{span.context.span_id:016x}"


def test_an_http_request_drawn_traced_by_its_caller_is_and_a_malformed_header_draws_again(spans: tuple[Spans, InMemorySpanExporter]) -> None:
    traces, _ = spans
    def describe(request: None) -> tuple[str, str, str]:
        return "/servers/{name}/mcp", "/servers/s/mcp", "http"
    span = traces.http_started(None, describe, None)  # the caller drew it traced
    assert span is not UNSAMPLED and span.is_recording()
    Spans.http_ended(span, 200)
    assert traces.http_started(("00-nonsense-01", ""), describe, None) is UNSAMPLED  # as if none: drawn, at ratio 0
    assert traces.http_started((SAMPLED.replace("-01", "-00"), ""), describe, None) is UNSAMPLED  # its parent's decision


def test_the_decision_is_the_bridges_not_the_sdks_sampler_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The config's ratio (1) wins over OTEL_TRACES_SAMPLER (settings.py); the SDK reads the
    # variable too, and would otherwise drop what the bridge decided to trace (or draw again).
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(spans_module, "_exporter", lambda settings: exporter)
    traces = Spans(Settings(None, "http/protobuf", {}, 1.0, "test", 64))
    try:
        assert traces.started(_Session(), _call(), lambda s: None, None)
        traces.answered("s1", 1, {"jsonrpc": "2.0", "id": 1, "result": {}})
        assert len(_finished(traces, exporter)) == 1
    finally:
        traces.provider.shutdown()
