"""The spans of requests, as OpenTelemetry's SDK makes and exports them (imported only when
tracing is on: `settings.start`). With tracing off a gateway's per-message path tests one
attribute and nothing here runs.

Rules
-----
1. Spans follow the OpenTelemetry semantic conventions for MCP (semantic-conventions v1.41,
   docs/gen-ai/mcp.md, status development). A request from a client is one SERVER span named
   `{mcp.method.name} {target}` (the tool or prompt; the method alone otherwise), from its
   arrival at its gateway to its answer, with the conventions' attributes that apply
   (`Spans.started`): never arguments or results.
2. A POST to an MCP endpoint (past the access check) is a SERVER span too, by the HTTP
   server conventions: `POST {http.route}`, under the context of its `traceparent` and
   `tracestate` headers, until its answer is complete (a stream: its end). A request's
   parent is the trace context in its `params._meta`, when it is valid (the HTTP request's
   span is then a link), else the span of the HTTP request that carried it. A malformed
   context is ignored, never an error.
3. Sampling is parent-based: a sampled parent's trace is traced, an unsampled one's is not,
   and a trace an HTTP request begins is with probability `ratio`; a request with no `_meta`
   context follows its HTTP request's decision (`UNSAMPLED`: not traced). A request not
   traced costs a lookup or two: no span is made, and its `_meta` reaches the server as it
   came. So that it costs no more, the HTTP paths draw for a request with no `traceparent`
   where it arrives (`draw() < ratio`), and the gateway passes over a request that follows
   `UNSAMPLED` without a call into this module (each Python call there costs about 1,000
   instructions, a tenth of what tracing on cost a call not traced).
4. The span's own context replaces the one in the `_meta` the server gets (nothing else of
   `_meta` changes), so that a server that reads it (the official SDKs do) continues the trace.
5. The stages of a request are events of its span. One the mux does not write to the server
   at once gets, on arrival, an event naming why (`core/mux/states.py` `Waiting`): `held`
   (its turn to be the call a server's question is attributed to), `waiting_for_server` (the
   process starting, restarting or initializing), `waiting_for_slot` (`max_concurrent_calls`).
   When the answer comes, an event `written` at the time the mux wrote the request to the
   server's stdin: before it, the request waited at the bridge; after it, the server's own
   time. A line that did not all go into the pipe at once (the server is not reading) gets
   `queued` then too, with the bytes waiting for the server to read them, its own included.
   A 2026-07-28 request whose session waits for a process before its gateway sees it begins
   its span when it arrived, with `waiting_for_server` then. (Events, not child spans: a
   traced call costs half as much.) An error answer sets `error.type` and
   `rpc.response.status_code` to its JSON-RPC code and the status to ERROR; a tool's result
   with `isError`, `error.type` `tool_error`.
6. A server's request to the client (sampling, elicitation, roots) attributed to a traced call
   is a CLIENT span under that call's, named by its method, from the request to the client's
   answer (for a 2026-07-28 client: to its retry carrying the answer: the call's next round),
   which the span of the HTTP request that carried the answer links.
7. A request one replica forwards to another (the owner of its session, or of the call its
   `requestState` resumes) is a CLIENT span there, named by its HTTP method with the HTTP
   client conventions' attributes, under the context of the request's `traceparent` header,
   from the forward to the owner's answer's end; its own context replaces the header's, so
   the owner's span has it as parent (no `_meta` context) or as link (rule 2).
8. Export never waits on the event loop: spans go to the SDK's batch processor (its own
   thread) through a queue of `queue_size`; a span that finds it full, or that the collector
   refuses or never takes, is dropped and counted (`dropped`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bridge import __version__, logs
from bridge.core.mux import ToSession, Waiting
from bridge.traces import UNSAMPLED
from bridge.traces.settings import Settings

if TYPE_CHECKING:
    from bridge.traces import HttpSpan


class Session(Protocol):
    """What a request's span reads of the session it came in (gateway/sessions.py's)."""

    id: str
    transport: str
    era: str
    waited_from: int | None


S = TypeVar("S", bound=Session)
R = TypeVar("R")

SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.41.0"
# Methods whose span is named by a target, and the attribute that carries it.
TARGETS: Final = {"tools/call": "gen_ai.tool.name", "prompts/get": "gen_ai.prompt.name"}
URI_METHODS: Final = frozenset({"resources/read", "resources/subscribe", "resources/unsubscribe"})
_PROPAGATOR: Final = TraceContextTextMapPropagator()
ASKED_PER_SESSION: Final = 64  # server requests a session's client has not answered, traced at once


class Spans:
    """The daemon's tracing, when on: the spans of requests in flight, by session and the
    client's request id, and the processor that exports them."""

    def __init__(self, settings: Settings) -> None:
        # The SDK logs each failed export and each span its full queue drops: `trace_export_failed`
        # and mcp_bridge_trace_spans_total say it once a minute and count them instead.
        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
        self.settings = settings
        self.dropped = 0  # spans lost: the queue full, or the collector refused or never took them
        self.exported = 0
        self.processor = _Bounded(self, _Counted(self, _exporter(settings)), settings.queue_size)
        resource = Resource.create({"service.name": settings.service_name, "service.version": __version__})
        # The decision to trace is taken here before a span is asked for (rule 3): the SDK's
        # parent-based sampler would only take it again.
        self.provider = TracerProvider(resource=resource, sampler=ALWAYS_ON, shutdown_on_exit=False)  # the app shuts it down, bounded in time
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("mcp-bridge", __version__, schema_url=SCHEMA_URL)
        self.open: dict[str, dict[Any, Span]] = {}  # session id -> the client's request id -> its span
        self.asked: dict[str, dict[Any, Span]] = {}  # session id -> a server request's id there -> its span
        self.draw = random.Random().random  # a trace begun here is sampled when draw() < ratio (rule 3)
        self.ratio = settings.ratio

    def shutdown(self) -> None:
        """Export what is queued and stop (blocks: the app runs it in a thread of its own)."""
        self.provider.shutdown()

    # ------------------------------------------------------------------ HTTP requests

    def http_started(self, carried: tuple[str, str] | None, describe: Callable[[R], tuple[str, str, str]], request: R) -> HttpSpan:
        """A POST at an MCP endpoint, past the access check (rule 2): its SERVER span, under the
        context of its `traceparent` and `tracestate` headers (`carried`), or `UNSAMPLED`.
        `carried` None: it has none, and its caller drew it traced (rule 3).
        `describe(request)`: its route, path and scheme, asked only of a request traced."""
        parent = _parent({"traceparent": carried[0], "tracestate": carried[1]}) if carried is not None else None
        if parent is None:
            if carried is not None and self.draw() >= self.ratio:  # a malformed one: as if none
                return UNSAMPLED
        elif not trace.get_current_span(parent).get_span_context().trace_flags.sampled:
            return UNSAMPLED
        route, path, scheme = describe(request)
        attributes = {"http.request.method": "POST", "http.route": route, "url.path": path, "url.scheme": scheme, "network.protocol.version": "1.1"}
        return self.tracer.start_span(f"POST {route}", context=parent, kind=SpanKind.SERVER, attributes=attributes)

    @staticmethod
    def http_ended(span: Span, status: int | None) -> None:
        """Its answer is complete (a stream: ended), with `status`; None: it was cut off."""
        if status is None:
            span.set_attribute("error.type", "aborted")
            span.set_status(Status(StatusCode.ERROR, "aborted"))
        else:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:  # a server span's error: a 4xx is the client's (HTTP conventions)
                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR))
        span.end()

    # ------------------------------------------------------------------ requests

    def started(self, session: S, msg: dict[str, Any], version: Callable[[S], str | None], http: HttpSpan | None = None) -> bool:
        """A client's request arrives at its gateway, before the mux rewrites it (rules 2-4);
        whether its span began. `version`: the session's protocol version, asked only then;
        `http`: the span of the HTTP request that carried it (None: no HTTP request's)."""
        params = msg.get("params")
        meta = params.get("_meta") if params.__class__ is dict else None
        parent = _parent(meta) if meta.__class__ is dict and "traceparent" in meta else None
        links = None
        if parent is None:
            if http is not None:  # the HTTP request's decision is its own
                if http is UNSAMPLED:
                    return False
                parent = trace.set_span_in_context(http)
            elif self.draw() >= self.ratio:
                return False
        elif not trace.get_current_span(parent).get_span_context().trace_flags.sampled:
            return False
        elif http is not None and http is not UNSAMPLED:
            links = [trace.Link(http.get_span_context())]
        name, attributes = _described(session, msg, params, version)
        since = session.waited_from
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes, links=links, start_time=since)
        if since is not None:
            span.add_event(Waiting.SERVER.value, timestamp=since)
        if params.__class__ is not dict:
            params = msg["params"] = {}
        if meta.__class__ is not dict:
            meta = params["_meta"] = {}
        meta.pop("tracestate", None)  # the span's own, if any, replaces the client's
        _PROPAGATOR.inject(meta, context=trace.set_span_in_context(span))
        self.open.setdefault(session.id, {})[msg["id"]] = span
        return True

    def span(self, session_id: str | None, request_id: Any) -> Span | None:
        """The span of a request in flight (None: it is not traced)."""
        spans = self.open.get(session_id) if session_id is not None else None
        return spans.get(request_id) if spans else None

    def ids(self, session_id: str | None, request_id: Any) -> tuple[str, str] | None:
        """The trace and span id (hex) of a request in flight, for the log events about it."""
        span = self.span(session_id, request_id)
        return None if span is None else _hex(span)

    def waiting(self, session_id: str, request_id: Any, why: str) -> None:
        """A request the mux did not write to its server at once: why, as an event (rule 5);
        not twice: one that waited for its process before (`started`) and for its initializing
        now waits for the server still."""
        span = self.span(session_id, request_id)
        if span is not None and not (isinstance(span, ReadableSpan) and span.events and span.events[-1].name == why):
            span.add_event(why)

    @staticmethod
    def queued(span: Span, buffered: int) -> None:
        """A traced request's line that did not all go into the server's stdin pipe at once:
        it waits behind what the server has not read (rule 5)."""
        span.add_event("queued", attributes={"mcp_bridge.server_input.buffered": buffered})

    def answered(self, session_id: str, request_id: Any, message: Mapping[str, Any], sent: float = 0.0) -> None:
        """A request's answer is delivered (rule 5). `sent`: when the mux wrote it to the server
        (time.monotonic; 0: it was not, the mux answered it itself)."""
        span = self._pop(session_id, request_id)
        if span is None:
            return
        now = time.time_ns()
        if sent:
            span.add_event("written", timestamp=now - int((time.monotonic() - sent) * 1e9))
        error = message.get("error")
        if isinstance(error, dict):
            code = str(error.get("code"))
            span.set_attributes({"error.type": code, "rpc.response.status_code": code})
            span.set_status(Status(StatusCode.ERROR, str(error.get("message", ""))))
        elif isinstance(result := message.get("result"), dict) and result.get("isError") is True:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, "tool_error"))
        span.end(now)

    def abandoned(self, session_id: str, request_id: Any, why: str, sent: float = 0.0) -> None:
        """A request that ends with no answer delivered (cancelled, its session closed);
        `sent` as for `answered`."""
        span = self._pop(session_id, request_id)
        if span is not None:
            if sent:
                span.add_event("written", timestamp=time.time_ns() - int((time.monotonic() - sent) * 1e9))
            span.set_attribute("error.type", why)
            span.set_status(Status(StatusCode.ERROR, why))
            span.end()

    def closed(self, session_id: str) -> None:
        """A session ended: what it still had in flight is abandoned, what it was asked ends."""
        for request_id in list(self.open.get(session_id, ())):
            self.abandoned(session_id, request_id, "session_closed")
        for span in self.asked.pop(session_id, {}).values():
            span.set_status(Status(StatusCode.ERROR, "session_closed"))
            span.end()

    # ------------------------------------------------------------------ forwards

    def forwarding(self, headers: MutableMapping[str, str], method: str, owner: str, http: HttpSpan | None) -> Span | None:
        """A request forwarded to the replica that owns its session or call (rule 7): its
        CLIENT span, under `http`, the request's own span (or, with none, the context its
        headers carry), whose context replaces the request's in `headers`; None when it is
        not traced (its headers then reach the owner as they came)."""
        if http is not None:
            if http is UNSAMPLED:
                return None
            parent: Context | None = trace.set_span_in_context(http)
        else:
            parent = _parent(headers) if "traceparent" in headers else None
            if parent is None:
                if self.draw() >= self.ratio:
                    return None
            elif not trace.get_current_span(parent).get_span_context().trace_flags.sampled:
                return None
        host, _, port = owner.rpartition(":")
        attributes: dict[str, str | int] = {"http.request.method": method, "server.address": host.strip("[]"), "server.port": int(port)}
        span = self.tracer.start_span(method, context=parent, kind=SpanKind.CLIENT, attributes=attributes)
        while headers.pop("tracestate", None) is not None:  # every line of it: the span's own replaces them
            pass
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        return span

    @staticmethod
    def log_ids(span: Span | None) -> dict[str, str]:
        """A span's ids as the fields of a log event about what it records (none for no span)."""
        return Spans.fields(None if span is None else _hex(span))

    @staticmethod
    def fields(ids: tuple[str, str] | None) -> dict[str, str]:
        """A trace and span id (`ids`, `_hex`) as the fields of a log event (none for None)."""
        return {} if ids is None else {"trace_id": ids[0], "span_id": ids[1]}

    @staticmethod
    def forwarded(span: Span, status: int | None, error: str | None) -> None:
        """A forward's end: the owner's status, or why there was none or it broke off."""
        if status is not None:
            span.set_attribute("http.response.status_code", status)
            if error is None and status >= 500:
                error = str(status)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    # ------------------------------------------------------------- server requests

    def from_server(self, actions: Sequence[object]) -> None:
        """A server's requests to a client, among the mux's `actions` for what it read (rule 6)."""
        for action in actions:
            if action.__class__ is not ToSession:
                continue
            session, message, related = action.session, action.message, action.related
            if related is None or "method" not in message or "id" not in message:
                continue
            calls = self.open.get(session)
            call = calls.get(related) if calls else None
            if call is None:
                continue
            attributes = {"mcp.method.name": message["method"], "jsonrpc.request.id": str(message["id"]), "mcp.session.id": session}
            asked = self.tracer.start_span(message["method"], context=trace.set_span_in_context(call), kind=SpanKind.CLIENT, attributes=attributes)
            mine = self.asked.setdefault(session, {})
            if len(mine) >= ASKED_PER_SESSION:  # a client that never answers: the oldest ends unanswered
                oldest = next(iter(mine))
                mine.pop(oldest).end()
            mine[message["id"]] = asked

    def responded(self, session_id: str, msg: Mapping[str, Any], http: HttpSpan | None = None) -> None:
        """A client's answer to a server's request: its span ends, and the span of the HTTP
        request that carried the answer (a 2026-07-28 retry's: the call's next round) links it."""
        asked = self.asked.get(session_id)
        span = asked.pop(msg.get("id"), None) if asked else None
        if span is None:
            return
        if isinstance(error := msg.get("error"), dict):
            code = str(error.get("code"))
            span.set_attributes({"error.type": code, "rpc.response.status_code": code})
            span.set_status(Status(StatusCode.ERROR, str(error.get("message", ""))))
        span.end()
        if http is not None and http is not UNSAMPLED:
            http.add_link(span.get_span_context())

    def _pop(self, session_id: str, request_id: Any) -> Span | None:
        spans = self.open.get(session_id)
        span = spans.pop(request_id, None) if spans else None
        if spans is not None and not spans:
            del self.open[session_id]
        return span


def _described(session: S, msg: dict[str, Any], params: object, version: Callable[[S], str | None]) -> tuple[str, dict[str, Any]]:
    """A traced request's span name and attributes (rule 1)."""
    method = msg["method"]
    attributes: dict[str, Any] = {"mcp.method.name": method, "jsonrpc.request.id": str(msg["id"]), "network.transport": "tcp"}
    name = method
    if isinstance(params, dict):
        key = TARGETS.get(method)
        if key is not None and isinstance(target := params.get("name"), str):
            attributes[key] = target
            name = f"{method} {target}"
            if method == "tools/call":
                attributes["gen_ai.operation.name"] = "execute_tool"
        elif method in URI_METHODS and isinstance(uri := params.get("uri"), str):
            attributes["mcp.resource.uri"] = uri
    if session.transport == "stateless":  # a 2026-07-28 request is part of no session
        attributes["mcp.protocol.version"] = session.era
    else:
        attributes["mcp.session.id"] = session.id
        if (negotiated := version(session)) is not None:
            attributes["mcp.protocol.version"] = negotiated
    return name, attributes


def _hex(span: Span) -> tuple[str, str]:
    """A span's trace and span id, as W3C trace context writes them."""
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def _parent(carrier: Mapping[str, str]) -> Context | None:
    """The trace context a W3C `traceparent` (and `tracestate`) carries; None when malformed."""
    context = _PROPAGATOR.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


# ---------------------------------------------------------------------- export


def _exporter(settings: Settings) -> SpanExporter:
    headers = dict(settings.headers) or None
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        # gRPC to a bare host:port or http:// is plaintext, as collectors serve it in-cluster.
        insecure = None if settings.endpoint is None else not settings.endpoint.startswith("https://")
        return GrpcExporter(endpoint=settings.endpoint, headers=headers, insecure=insecure)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.endpoint, headers=headers)


class _Counted(SpanExporter):
    """The exporter, counting what it could not deliver as dropped (and saying so, at most once
    a minute: a collector that is down fails every export)."""

    def __init__(self, spans: Spans, inner: SpanExporter) -> None:
        self._spans = spans
        self._inner = inner
        self._log = logs.Throttle(1 / 60, 1)

    def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(batch)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._spans.exported += len(batch)
        else:
            self._spans.dropped += len(batch)
            if (held := self._log.allow()) is not None:
                # Not the endpoint: a collector's URL may carry its credentials.
                logs.get().warning("trace_export_failed", dropped=self._spans.dropped, suppressed=held)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _Bounded(BatchSpanProcessor):
    """The SDK's batch processor, counting the spans its full queue drops (which it only logs)."""

    def __init__(self, spans: Spans, exporter: SpanExporter, max_queue_size: int) -> None:
        super().__init__(exporter, max_queue_size=max_queue_size, max_export_batch_size=min(512, max_queue_size))  # the SDK's default batch, at most the queue
        self._spans = spans
        self._max = max_queue_size

    def on_end(self, span: ReadableSpan) -> None:
        # The queue is the SDK's own deque, which drops its oldest when full: read, never changed.
        if len(self._batch_processor._queue) >= self._max:
            self._spans.dropped += 1
        super().on_end(span)
