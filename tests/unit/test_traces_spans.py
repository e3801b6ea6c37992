"""traces/spans.py's rules that need no daemon: how an HTTP request's span ends (rule 2)."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridge.traces.spans import UNSAMPLED, Spans


def test_an_http_span_is_an_error_on_a_5xx_and_when_cut_off_never_on_a_4xx() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for status in (200, 404, 503, None):
        Spans.http_ended(tracer.start_span(f"POST {status}"), status)
    Spans.http_ended(UNSAMPLED, 200)  # not traced: nothing to end, nothing exported
    ended = [(s.attributes.get("http.response.status_code"), s.attributes.get("error.type"), s.status.status_code.name) for s in exporter.get_finished_spans()]
    assert ended == [(200, None, "UNSET"), (404, None, "UNSET"), (503, "503", "ERROR"), (None, "aborted", "ERROR")]
