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
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from balancer import MISSING, NGINX, nginx_in_front
from conftest import Bridge
from mcp import Client as McpClient
from sdk import Client, connect, prompt_text, text_of
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
