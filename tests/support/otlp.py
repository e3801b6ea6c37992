"""Real OTLP trace receivers on loopback, for tests, over HTTP and over gRPC: what collectors are
sent, decoded with the official `opentelemetry-proto` messages, kept as flat `Span`s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceServicer, add_TraceServiceServicer_to_server


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start: int
    end: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    links: list[tuple[str, str]] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)  # (name, time)
    event_attributes: dict[str, dict[str, Any]] = field(default_factory=dict)  # by event name (of a repeat, the last)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    headers: dict[str, str] = field(default_factory=dict)  # of the last export (lower-case names)

    async def handle(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.take(export, {k.lower(): v for k, v in request.headers.items()})
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf")

    def take(self, export: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        self.requests += 1
        self.headers = headers
        for resource_spans in export.resource_spans:
            service = next((_value(a.value) for a in resource_spans.resource.attributes if a.key == "service.name"), "")
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    self.spans.append(
                        Span(
                            service, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                            s.start_time_unix_nano, s.end_time_unix_nano, {a.key: _value(a.value) for a in s.attributes},
                            s.status.code, s.status.message, [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            [(e.name, e.time_unix_nano) for e in s.events],
                            {e.name: {a.key: _value(a.value) for a in e.attributes} for e in s.events},
                        )
                    )  # fmt: skip
        self._changed.set()

    async def wait_for(self, where: Callable[[Span], bool], timeout: float = 10.0) -> Span:
        """The first span received that satisfies `where`."""
        async with asyncio.timeout(timeout):
            while True:
                for span in self.spans:
                    if where(span):
                        return span
                self._changed.clear()
                await self._changed.wait()


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    """A receiver at http://127.0.0.1:PORT/v1/traces, stopped on exit."""
    got = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", got.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    got.url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        yield got
    finally:
        await runner.cleanup()


class _Service(TraceServiceServicer):
    def __init__(self, got: Receiver) -> None:
        self.got = got

    async def Export(self, request: ExportTraceServiceRequest, context: grpc.aio.ServicerContext[Any, Any]) -> ExportTraceServiceResponse:  # noqa: N802 (the service's name)
        self.got.take(request, {k.lower(): v for k, v in context.invocation_metadata() or () if isinstance(v, str)})
        return ExportTraceServiceResponse()


@asynccontextmanager
async def grpc_receiver() -> AsyncIterator[Receiver]:
    """A receiver of OTLP over gRPC (plaintext) at http://127.0.0.1:PORT, stopped on exit."""
    got = Receiver()
    server = grpc.aio.server()
    add_TraceServiceServicer_to_server(_Service(got), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    got.url = f"http://127.0.0.1:{port}"
    try:
        yield got
    finally:
        await server.stop(None)
