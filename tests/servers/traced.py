"""A stdio MCP server on the official Python SDK (`mcp` 2.3, whose server continues the trace a
request's `_meta` carries) with OpenTelemetry's SDK exporting its spans over OTLP/HTTP to
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, one export per span (tests/daemon/test_traces.py).

Run as ``python tests/servers/traced.py``. Tools:
  echo        its text back
  nap         sleeps `ms` milliseconds, then "rested"
  fail        a tool error (isError)
  meta        the `_meta` its request came with, as JSON
"""

from __future__ import annotations

import asyncio
import json

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "traced-server"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)

from mcp.server.mcpserver import Context, MCPServer  # noqa: E402 (after the tracer provider: the SDK's tracer binds to it)

server = MCPServer("traced", version="1.0")


@server.tool()
def echo(text: str) -> str:
    return text


@server.tool()
async def nap(ms: int) -> str:
    await asyncio.sleep(ms / 1000)
    return "rested"


@server.tool()
def fail() -> str:
    raise ValueError("it failed, as asked")


@server.tool()
def meta(ctx: Context) -> str:
    params = ctx.request_context.params or {}
    return json.dumps(params.get("_meta") or {}, default=str, sort_keys=True)


if __name__ == "__main__":
    server.run("stdio")
