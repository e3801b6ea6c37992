"""A stdio MCP server that speaks only 2026-07-28, on the official Python SDK (`mcp` 2.3).

Run as ``python tests/servers/modern.py``. It answers `server/discover` and
refuses `initialize` (the SDK's modern serving loop, not its dual-era one), so
the bridge must translate for legacy clients. Its tools ask the client for
input the 2026-07-28 way (an `input_required` result, then a retry):
  greet       elicitation (a name)           -> "hello <name>"
  summarize   sampling                       -> the model's text
  roots       roots/list                     -> the root uris, comma-separated
  both        elicitation and sampling in one round
  work        progress and log messages, then "done <steps>"
  touch       bumps resource `counter://value` and notifies its subscribers
  grow        adds a tool `grown` and announces that the tool list changed
  nap         sleeps `seconds`, then "rested"
  echo        its text back

MODERN_SLOW_START=SECONDS makes it wait that long before it reads anything (a
server slower to start than the bridge's discover timeout).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, Elicit, ListRoots, MCPServer, Resolve, Sample
from mcp.server.runner import _serve_modern_stream
from mcp.server.stdio import stdio_server
from mcp_types import CreateMessageResult, ListRootsResult, SamplingMessage, TextContent
from pydantic import BaseModel

warnings.filterwarnings("ignore", message=".*deprecated as of 2026-07-28")  # logging: still what we test
server = MCPServer("modern-test", version="1.0", instructions="A modern-only test server.")
_counter = {"value": 0}


class Name(BaseModel):
    name: str


def ask_name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


def ask_model(text: str) -> Sample:
    prompt = SamplingMessage(role="user", content=TextContent(type="text", text=f"summarize: {text}"))
    return Sample([prompt], max_tokens=50)


def ask_roots() -> ListRoots:
    return ListRoots()


def _text(result: CreateMessageResult) -> str:
    content = result.content
    return content.text if isinstance(content, TextContent) else str(content)


@server.tool()
def echo(text: str) -> str:
    return text


@server.tool()
def greet(who: Annotated[Name, Resolve(ask_name)]) -> str:
    return f"hello {who.name}"


@server.tool()
def summarize(text: str, sampled: Annotated[CreateMessageResult, Resolve(ask_model)]) -> str:
    return _text(sampled)


@server.tool()
def roots(found: Annotated[ListRootsResult, Resolve(ask_roots)]) -> str:
    return ",".join(str(root.uri) for root in found.roots)


@server.tool()
def both(
    text: str,
    who: Annotated[Name, Resolve(ask_name)],
    sampled: Annotated[CreateMessageResult, Resolve(ask_model)],
) -> str:
    return f"{who.name}: {_text(sampled)}"


@server.tool()
async def work(steps: int, ctx: Context) -> str:
    for step in range(steps):
        await ctx.log("info", f"step {step}")
        await ctx.report_progress(step + 1, steps)
    return f"done {steps}"


@server.tool()
async def touch(ctx: Context) -> str:
    _counter["value"] += 1
    await ctx.notify_resource_updated("counter://value")
    return str(_counter["value"])


@server.tool()
async def nap(seconds: float) -> str:
    await anyio.sleep(seconds)
    return "rested"


@server.tool()
async def grow(ctx: Context) -> str:
    server.add_tool(lambda: "grown", name="grown")
    await ctx.notify_tools_changed()
    return "grown"


@server.resource("counter://value")
def counter() -> str:
    return str(_counter["value"])


async def main() -> None:
    lowlevel = server._lowlevel_server
    async with lowlevel.lifespan(lowlevel) as state, stdio_server() as (read, write):
        await _serve_modern_stream(lowlevel, read, write, lifespan_state=state, raise_exceptions=False)


if __name__ == "__main__":
    time.sleep(float(os.environ.get("MODERN_SLOW_START", "0")))
    anyio.run(main)
