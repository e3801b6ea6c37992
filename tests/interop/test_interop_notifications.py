"""Interop: every notification `@modelcontextprotocol/server-everything` (pinned in
tests/node/package.json) can send reaches an official-SDK client through the bridge,
in both modes and over both transports.

What the server sends, and what makes it (server-everything 2026.8.31, dist/):
- `notifications/resources/updated`: `toggle-subscriber-updates` sends one for each
  subscribed uri at once, then every 5 s (resources/subscriptions.js).
- `notifications/progress`: `trigger-long-running-operation` with a progress token, one per step.
- `notifications/message`: the `resources/subscribe` handler logs the uri at `info`;
  `toggle-simulated-logging` sends one message of a random level at once, then every 5 s.
  The server filters by the level `logging/setLevel` set (server/logging.js).
- `notifications/resources/list_changed`: `gzip-file-as-resource` registers a session
  resource (a `data:` url keeps it off the network).
- `notifications/tools/list_changed`: only when the process is initialized, as it
  registers the tools that depend on the client's capabilities (server/index.js
  `oninitialized`). A per-session process is initialized by its client; a shared one
  by the bridge, so a shared session sees it only when the process restarts.
- `notifications/tasks/status`: a task-augmented `tools/call` of `simulate-research-query`
  sends one per stage (1 s each) and one when it completes.

What it cannot send: `notifications/prompts/list_changed` (no prompt is registered,
changed or removed after connecting); `notifications/elicitation/complete` (it never
calls `createElicitationCompletionNotifier`); a server-side `notifications/cancelled`
(its own requests are withdrawn only on timeout: 60 s for sampling, 10 min for
elicitation, and not when the call that made them is cancelled).

One daemon serves the module: the server `shared` and the server `per-session`, each
over both transports. The shared process keeps its toggles across cases, so every case
that starts one stops it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import mcp_types as types
import pydantic
import pytest
import pytest_asyncio
from support.daemon import Bridge, run_bridge
from support.sdk import Client, Message, connect, own_progress_token, text_of
from test_interop_everything import DOC, config
from test_interop_everything import pytestmark as everything_marks

pytestmark = [
    *everything_marks,  # skipped without Node.js or server-everything
    pytest.mark.asyncio(loop_scope="module"),
]

MODES = ("shared", "per-session")
TRANSPORTS = ("sse", "streamable")
URI_A, URI_B = DOC + "architecture.md", DOC + "features.md"
# Simulated log messages by level, as server/logging.js spells them.
SIMULATED = {
    "debug": "Debug-level message",
    "info": "Info-level message",
    "notice": "Notice-level message",
    "warning": "Warning-level message",
    "error": "Error-level message",
    "critical": "Critical-level message",
    "alert": "Alert level-message",
    "emergency": "Emergency-level message",
}


Opener = Callable[[str], contextlib.AbstractAsyncContextManager[Client]]


def _server(mode: str) -> dict[str, Any]:
    # A quick restart: test_tools_list_changed kills the shared process.
    return {**config()["servers"]["everything"], "mode": mode, "restart": {"backoff_initial": "50ms"}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bridge]:
    servers = {mode: _server(mode) for mode in MODES}
    async with run_bridge(tmp_path_factory.mktemp("notifications"), {"servers": servers}) as b:
        yield b


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def session(daemon: Bridge, mode: str, transport: str) -> Opener:
    """`async with session(name) as c:` opens an SDK session to this case's server over its transport."""
    streamable = transport == "streamable"
    url = daemon.url(mode, "mcp" if streamable else "sse")
    return lambda name: connect(url, name=name, streamable=streamable)


def notice(method: str, **params: Any) -> Callable[[Message], bool]:
    """A `wire.wait_for` predicate: a notification `method` whose params include `params`."""

    def match(m: Message) -> bool:
        got = m.get("params") or {}
        return m.get("method") == method and "id" not in m and all(got.get(k) == v for k, v in params.items())

    return match


def updated_uris(client: Client) -> set[str]:
    return {m["params"]["uri"] for m in client.wire.notifications("notifications/resources/updated")}


@contextlib.asynccontextmanager
async def toggled(client: Client, tool: str) -> AsyncIterator[None]:
    """`tool` (a server-everything toggle) switched on for the block, and off again after it."""
    started = text_of(await client.session.call_tool(tool, {}))
    assert started.startswith("Started"), started
    try:
        yield
    finally:
        stopped = text_of(await client.session.call_tool(tool, {}))
        assert stopped.startswith("Stopped"), stopped


async def test_resources_updated(mode: str, session: Opener) -> None:
    """The defect this guards: per-session subscribers got no `resources/updated` at all."""
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(session("A"))
        await a.session.subscribe_resource(URI_A)
        b = None
        if mode == "shared":
            # The process keeps one set of subscriptions and one toggle for every session,
            # so A's toggle makes it send B's uri too. It iterates its subscriptions in the
            # order they were first made (URI_A first), so an update for URI_A that went to
            # B by mistake would reach B before B's own.
            b = await stack.enter_async_context(session("B"))
            await b.session.subscribe_resource(URI_B)
        async with toggled(a, "toggle-subscriber-updates"):
            await a.wire.wait_for(notice("notifications/resources/updated", uri=URI_A))
            if b is not None:
                await b.wire.wait_for(notice("notifications/resources/updated", uri=URI_B))
        assert updated_uris(a) <= {URI_A}, f"A got updates for uris it did not subscribe to: {updated_uris(a)}"
        if b is not None:
            assert URI_A not in updated_uris(b), "B got an update for A's subscription"
        for client in (a, b):
            if client is not None:
                client.wire.check_own_traffic()


async def test_progress(mode: str, session: Opener) -> None:
    async def run(c: Client, steps: int) -> None:
        seen: list[tuple[float, float | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total))

        result = await c.session.call_tool(
            "trigger-long-running-operation", {"duration": 0.05 * steps, "steps": steps}, progress_callback=on_progress
        )
        assert f"Steps: {steps}." in text_of(result)
        assert seen == [(float(i), float(steps)) for i in range(1, steps + 1)], seen
        own_progress_token(c, steps)

    # In shared mode a second caller runs the same tool at once, with (most likely) the
    # same request id and so the same token: each must get only its own progress.
    callers = 2 if mode == "shared" else 1
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(session(f"s{i}")) for i in range(callers)]
        await asyncio.gather(*(run(c, 3 + i) for i, c in enumerate(clients)))


async def test_log_messages(session: Opener) -> None:
    uri = DOC + "instructions.md"
    async with session("A") as a:
        await a.session.set_logging_level("debug")
        await a.session.subscribe_resource(uri)
        logged = await a.wire.wait_for(notice("notifications/message", level="info"))
        assert logged["params"]["data"].strip() == f"Received Subscribe Resource request for URI: {uri}"

        mark = len(a.wire.received)
        async with toggled(a, "toggle-simulated-logging"):
            simulated = await a.wire.wait_for(notice("notifications/message"), start=mark)
        level = simulated["params"]["level"]
        assert simulated["params"]["data"] == SIMULATED[level], simulated
        await a.session.unsubscribe_resource(uri)
        a.wire.check_own_traffic()


async def test_resources_list_changed(mode: str, transport: str, session: Opener) -> None:
    name = f"{mode}-{transport}.gz"
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(session("A"))
        # A shared process has one resource list: every session is told it changed.
        others = [await stack.enter_async_context(session("B"))] if mode == "shared" else []
        marks = [len(c.wire.received) for c in (a, *others)]
        result = await a.session.call_tool("gzip-file-as-resource", {"name": name, "data": "data:text/plain,hello"})
        (link,) = result.content
        assert isinstance(link, types.ResourceLink) and str(link.uri) == f"demo://resource/session/{name}", link
        for client, mark in zip((a, *others), marks, strict=True):
            await client.wire.wait_for(notice("notifications/resources/list_changed"), start=mark)
        (contents,) = (await a.session.read_resource(str(link.uri))).contents
        assert contents.mime_type == "application/gzip"


async def test_tools_list_changed(daemon: Bridge, mode: str, session: Opener) -> None:
    async with session("A") as a:
        if mode == "shared":
            # The bridge initialized the process long ago: restart it.
            (started,) = [e for e in daemon.named("server_started") if e.get("server") == "shared"][-1:]
            mark, events = len(a.wire.received), len(daemon.events)
            os.kill(started["pid"], signal.SIGKILL)
            await daemon.wait_for("server_started", where=lambda e: e.get("server") == "shared", start=events)
        else:
            mark = 0  # its own process registers them as this session initializes it
        await a.wire.wait_for(notice("notifications/tools/list_changed"), start=mark)
        names = {t.name for t in (await a.session.list_tools()).tools}
        assert "simulate-research-query" in names, names


async def _start_task(client: Client, topic: str) -> str:
    """A task-augmented `tools/call` of simulate-research-query; the task's id.

    SDK 2.3.0 validates a `tools/call` result as a CallToolResult, so it rejects the
    CreateTaskResult; the result is read off the wire instead."""
    params = types.CallToolRequestParams(
        name="simulate-research-query", arguments={"topic": topic}, task=types.TaskMetadata(ttl=60000)
    )
    with pytest.raises(pydantic.ValidationError):
        await client.session.send_request(types.CallToolRequest(params=params), types.CreateTaskResult)
    (sent,) = client.wire.sent_requests("tools/call")
    (response,) = [m for m in client.wire.responses() if m["id"] == sent["id"]]
    return str(response["result"]["task"]["taskId"])


async def _first_task_status(daemon: Bridge, client: Client) -> tuple[Message, list[dict[str, Any]]]:
    """Start a task, wait for its first status notification and cancel it; that notification,
    and what the bridge dropped meanwhile."""
    mark = len(daemon.events)
    task_id = await _start_task(client, "bridges")
    status = await client.wire.wait_for(notice("notifications/tasks/status", taskId=task_id))
    cancelled = await client.session.send_request(
        types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id)), types.CancelTaskResult
    )
    assert cancelled.status == "cancelled"
    return status, [e for e in daemon.events[mark:] if e.get("event") == "message_dropped"]


async def test_task_status(daemon: Bridge, session: Opener) -> None:
    async with session("A") as a:
        status, _ = await _first_task_status(daemon, a)
        assert status["params"]["status"] == "working", status


@pytest.mark.parametrize("transport", ["sse"])  # the mux's rule, whatever the transport
async def test_task_status_sent_before_the_task_result(daemon: Bridge, session: Opener) -> None:
    async with session("A") as a:
        status, dropped = await _first_task_status(daemon, a)
        assert dropped == []
        assert status["params"]["statusMessage"] == "Gathering sources...", status
