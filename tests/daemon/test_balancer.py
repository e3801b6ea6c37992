"""End to end behind a real load balancer: nginx, round robin, no affinity, three replicas.

The official SDK client over both transports (20 sessions each, at once), every
feature the interop suite drives (tools, progress, sampling, log levels,
resource subscriptions, completion), then one replica SIGKILLed in the middle:
its sessions end with errors and their clients start new ones; the other
replicas' sessions lose nothing. Skipped, saying why, where nginx is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import mcp_types as types
import pytest
from mcp import Client as McpClient
from support.balancer import MISSING, NGINX, nginx_in_front
from support.daemon import PY, Bridge, pid_alive
from support.rawstreamable import RawStreamable
from support.sdk import Client, connect, prompt_text, text_of
from test_modern import answer_sampling
from test_replicas import forwarded_count, kill, replicas

pytestmark = [
    pytest.mark.skipif(NGINX is None, reason=MISSING),
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

N_SESSIONS = 20  # per transport
N_MODERN_CALLS = 10
COUNTER = "demo://counter"
BROKEN_READ_TIMEOUT_S = 5.0  # how long an SSE client waits on a stream that died with its replica


def _answer(client: Client, params: types.CreateMessageRequestParams) -> str:
    return f"{client.name} says {prompt_text(params)}"


async def exercise(c: Client, round_: int) -> None:
    """One pass over every feature, each result checked to be this session's own."""
    me = f"{c.name}/{round_}"
    assert text_of(await c.session.call_tool("echo", {"text": me})) == me
    steps = 3
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    done = await c.session.call_tool("countdown", {"steps": steps, "interval_ms": 10}, progress_callback=on_progress)
    assert text_of(done) == "done" and seen == [1.0, 2.0, 3.0], (me, seen)
    assert text_of(await c.session.call_tool("sample", {"prompt": me})) == f"{c.name} says {me}"
    await c.session.set_logging_level("error")
    mark = len(c.wire.received)
    await c.session.call_tool("log", {"level": "error", "message": me})
    await c.wire.wait_for(lambda m: m.get("method") == "notifications/message" and m["params"]["data"] == me, start=mark)
    await c.session.subscribe_resource(COUNTER)
    mark = len(c.wire.received)
    await c.session.call_tool("bump", {})
    await c.wire.wait_for(lambda m: m.get("method") == "notifications/resources/updated", start=mark)
    await c.session.unsubscribe_resource(COUNTER)
    completion = await c.session.complete(types.PromptReference(type="ref/prompt", name="greet"), {"name": "name", "value": "Al"})
    assert completion.completion.values == ["Alice", "Alan"]
    c.wire.check_own_traffic()


@contextlib.asynccontextmanager
async def _behind_nginx(tmp_path: Path, killed: tuple[int, ...] = ()) -> Any:
    async with replicas(tmp_path, killed=killed) as bridges, nginx_in_front(tmp_path / "nginx", [b.port for b in bridges]) as port:
        yield bridges, f"http://127.0.0.1:{port}/servers/demo"


def _sessions(bridges: list[Bridge]) -> list[int]:
    return [sum(1 for e in b.named("session_opened")) for b in bridges]


async def test_sdk_sessions_over_both_transports_through_nginx(tmp_path: Path) -> None:
    async with _behind_nginx(tmp_path) as (bridges, base):
        barrier = asyncio.Barrier(2 * N_SESSIONS)

        async def one(i: int, streamable: bool) -> None:
            url = f"{base}/mcp" if streamable else f"{base}/sse"
            async with connect(url, name=f"{'m' if streamable else 's'}{i}", sampling=_answer, streamable=streamable) as c:
                async with asyncio.timeout(30):
                    await barrier.wait()
                for round_ in range(2):
                    await exercise(c, round_)

        async with asyncio.timeout(120), asyncio.TaskGroup() as tg:
            for i in range(N_SESSIONS):
                tg.create_task(one(i, streamable=False))
                tg.create_task(one(i, streamable=True))
        opened = _sessions(bridges)
        assert sum(opened) == 2 * N_SESSIONS and all(opened), opened  # every replica owned some
        assert all(b.named("forward_owner_gone") == [] for b in bridges)


async def test_a_replica_killed_mid_run(tmp_path: Path) -> None:
    """Sessions on the killed replica end with errors and their clients reconnect; the
    sessions of the other two lose nothing."""
    async with _behind_nginx(tmp_path, killed=(1,)) as (bridges, base):
        victim = bridges[1]
        first_round = asyncio.Barrier(2 * N_SESSIONS + 1)
        killed = asyncio.Event()
        outcomes: dict[str, str] = {}

        async def one(i: int, streamable: bool) -> None:
            url = f"{base}/mcp" if streamable else f"{base}/sse"
            name = f"{'m' if streamable else 's'}{i}"
            kwargs: dict[str, Any] = {"sampling": _answer, "streamable": streamable, "read_timeout": BROKEN_READ_TIMEOUT_S}
            try:
                async with connect(url, name=name, **kwargs) as c:
                    await exercise(c, 0)
                    async with asyncio.timeout(60):
                        await first_round.wait()
                        await killed.wait()
                    await exercise(c, 1)
                outcomes[name] = "kept"
            except Exception:  # noqa: BLE001 - whatever the SDK raises for a session that is gone
                outcomes[name] = "lost"
                async with connect(url, name=name, **kwargs) as again:  # the client starts anew
                    await exercise(again, 2)

        async with asyncio.timeout(180), asyncio.TaskGroup() as tg:
            for i in range(N_SESSIONS):
                tg.create_task(one(i, streamable=False))
                tg.create_task(one(i, streamable=True))
            async with asyncio.timeout(60):
                await first_round.wait()
            owned = _sessions(bridges)
            await kill(victim)
            killed.set()

        lost = sorted(name for name, outcome in outcomes.items() if outcome == "lost")
        assert len(outcomes) == 2 * N_SESSIONS and owned[1] > 0, owned
        # Exactly the killed replica's sessions were lost (and started anew); every other one
        # went through its second round with every result its own.
        assert len(lost) == owned[1], (lost, owned)


async def test_modern_sdk_client_samples_through_round_robin(tmp_path: Path) -> None:
    """The official client pinned to 2026-07-28: each sampling call is answered input_required
    by one replica and retried through whichever nginx picks next, which forwards the retry
    to the replica holding the call."""
    async with _behind_nginx(tmp_path) as (bridges, base):
        async with asyncio.timeout(60), McpClient(f"{base}/mcp", mode="2026-07-28", sampling_callback=answer_sampling) as client:
            for n in range(N_MODERN_CALLS):
                result = await client.call_tool("sample", {"prompt": f"call {n}"})
                assert result.content[0].text == f"sampled: call {n}", result
        forwarded = [await forwarded_count(b, "forwarded") for b in bridges]
        assert sum(forwarded) >= 1, forwarded  # round robin sends most retries elsewhere
        assert all(b.named("input_expired") == [] and b.named("forward_owner_gone") == [] for b in bridges)


async def test_a_drain_with_nothing_in_flight_ends_at_once_with_streams_relayed_both_ways(tmp_path: Path) -> None:
    """Three replicas behind nginx; SIGTERM to one (A) with no call in flight, while a stream of
    one of its sessions is relayed by another replica and it relays a stream of another
    replica's session: A exits within a second plus its servers' own stop, each stream ends
    cleanly (not cut off), its idle sessions end, the other replica's session goes on through
    nginx (its stream resumed elsewhere), and nothing A started is left running."""
    config = {"servers": {"demo": {"command": PY, "args": ["-m", "bridge.demo_server"]}}, "limits": {"drain_timeout": "30s"}}
    async with (
        replicas(tmp_path, config=config) as bridges,
        nginx_in_front(tmp_path / "nginx", [b.port for b in bridges]) as port,
        contextlib.AsyncExitStack() as stack,
    ):
        a, b, _ = bridges
        balanced = f"http://127.0.0.1:{port}/servers/demo/mcp"
        owned: dict[int, RawStreamable] = {}  # replica index -> a session it owns, opened through nginx
        async with asyncio.timeout(30):
            while 0 not in owned or 1 not in owned:
                client = await stack.enter_async_context(RawStreamable(balanced))
                await client.initialize()
                owner = next(i for i, r in enumerate(bridges) if any(e.get("session") == client.session_id for e in r.named("session_opened")))
                owned.setdefault(owner, client)
        mine, theirs = owned[0], owned[1]
        mine.url, theirs.url = f"{b.base}/servers/demo/mcp", f"{a.base}/servers/demo/mcp"
        relayed_by_b = (await mine.get()).stream  # A's session, its stream relayed by B
        relayed_by_a = (await theirs.get()).stream  # B's session, its stream relayed by A
        assert relayed_by_b is not None and relayed_by_a is not None
        sse = await stack.enter_async_context(aiohttp.ClientSession())
        idle_sse = await sse.get(f"{a.base}/servers/demo/sse")  # an idle HTTP+SSE session on A
        assert idle_sse.status == 200
        await a.wait_for("session_opened", where=lambda e: e["transport"] == "sse")
        pids = {e["pid"] for e in a.named("server_started")}
        mark = len(a.events)

        signalled = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            assert await a.proc.wait() == 0
        took = time.monotonic() - signalled
        assert took < 1.5, f"A took {took:.2f}s to stop with nothing in flight"
        draining = await a.wait_for("draining", start=mark)
        assert draining["in_flight"] == 0 and not a.named("drain_timeout"), draining
        for stream in (relayed_by_b, relayed_by_a):
            await stream.until_end()
            assert stream.error is None, f"a stream was cut off: {stream.error!r}"
        assert await asyncio.wait_for(idle_sse.content.read(), 10) is not None  # ended, cleanly
        idle_sse.release()
        assert not any(pid_alive(pid) for pid in pids), pids

        theirs.url = balanced  # B's session goes on, wherever nginx sends its requests
        response, _ = await theirs.request("tools/call", {"name": "echo", "arguments": {"text": "on"}})
        assert text_of_raw(response) == "on"
        resumed = await theirs.get(last_event_id="g_0")
        assert resumed.status == 200 and resumed.stream is not None
        gone = await mine.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert gone.status == 404, (gone.status, gone.text)  # A's session ended with A: its client starts anew


def text_of_raw(response: dict[str, Any]) -> str:
    return str(response["result"]["content"][0]["text"])
