"""Interop: a group of real servers (`@modelcontextprotocol/server-everything`, mcp-server-time,
the demo server) driven by the official Python SDK over `/groups/NAME/mcp` and `/sse`: what a
member asks of its client (sampling, elicitation, roots) reaches the one group session whose
call it serves, and its progress and updates that session only.

Needs `npm ci --prefix tests/node` (and Node.js); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import mcp_types as types
import pytest
from support.daemon import demo
from support.sdk import TIME_SERVER, Client, connect, own_progress_token, prompt_text, text_of
from test_interop_everything import EVERYTHING_JS, NODE, NODE_DIR
from test_interop_everything import pytestmark as pytestmark  # server-everything installed, or skipped


def config() -> dict[str, Any]:
    everything = {"command": NODE, "args": [str(EVERYTHING_JS), "stdio"], "cwd": str(NODE_DIR), "shutdown_timeout": "1s"}
    return {
        "servers": {"everything": everything, "time": TIME_SERVER, "demo": demo()},
        "groups": {"team": {"servers": ["everything", "time", "demo"]}},
    }


def _answer(client: Client, params: types.CreateMessageRequestParams) -> str:
    return f"{client.name} answers: {prompt_text(params)}"


def _sampled(result: types.CallToolResult) -> str:
    text = text_of(result)
    return str(json.loads(text[text.index("{") :])["content"]["text"])


@pytest.mark.parametrize("streamable", [True, False], ids=["streamable", "sse"])
async def test_sampling_reaches_the_group_session_whose_call_asked(bridge: Any, streamable: bool) -> None:
    async with bridge(config()) as b:
        url = f"{b.base}/groups/team/{'mcp' if streamable else 'sse'}"
        async with (
            connect(url, name="A", sampling=_answer, streamable=streamable) as a,
            connect(url, name="B", sampling=_answer, streamable=streamable) as bb,
            connect(url, name="C", streamable=streamable) as c,
        ):
            results = await asyncio.gather(
                a.session.call_tool("everything__trigger-sampling-request", {"prompt": "from A", "maxTokens": 10}),
                bb.session.call_tool("everything__trigger-sampling-request", {"prompt": "from B"}),
                c.session.call_tool("demo__add", {"a": 1, "b": 2}),
            )
            assert _sampled(results[0]) == "A answers: Resource trigger-sampling-request context: from A"
            assert _sampled(results[1]) == "B answers: Resource trigger-sampling-request context: from B"
            assert text_of(results[2]) == "3"
            assert len(a.sampled) == 1 and len(bb.sampled) == 1 and c.wire.server_requests("sampling/createMessage") == []
            for client in (a, bb, c):
                client.wire.check_own_traffic()


async def test_elicitation_and_roots_are_answered_by_the_asking_session(bridge: Any) -> None:
    async with bridge(config()) as b:
        url = f"{b.base}/groups/team/mcp"
        async with (
            connect(url, name="A", roots=["file:///work/a-root"], elicit=lambda p: {"name": "Ada"}, streamable=True) as a,
            connect(url, name="B", streamable=True) as other,
        ):
            roots = text_of(await a.session.call_tool("everything__get-roots-list", {}))
            assert "file:///work/a-root" in roots, roots
            elicited = await a.session.call_tool("everything__trigger-elicitation-request", {})
            assert not elicited.is_error and a.wire.server_requests("elicitation/create")
            await other.session.call_tool("everything__echo", {"message": "barrier"})
            assert other.wire.server_requests() == []
            a.wire.check_own_traffic()


async def test_progress_reaches_only_the_session_that_called(bridge: Any) -> None:
    async with bridge(config()) as b:
        url = f"{b.base}/groups/team/mcp"
        async with connect(url, name="A", streamable=True) as a, connect(url, name="B", streamable=True) as other:
            seen: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(progress)

            other_call = asyncio.ensure_future(
                other.session.call_tool("everything__trigger-long-running-operation", {"duration": 0.3, "steps": 3}, progress_callback=on_progress)
            )
            result = await a.session.call_tool("everything__trigger-long-running-operation", {"duration": 0.2, "steps": 2})
            assert "Steps: 2." in text_of(result)
            assert "Steps: 3." in text_of(await other_call)
            await other.wire.wait_for(lambda m: m.get("method") == "notifications/progress" and m["params"]["progress"] == 3)
            assert sorted(seen) == [1.0, 2.0, 3.0]
            token = own_progress_token(other, 3)
            assert all(m["params"]["progressToken"] == token for m in other.wire.notifications("notifications/progress"))
            a.wire.check_own_traffic()
            other.wire.check_own_traffic()
