"""Interop: the official `mcp` SDK client through the bridge, in shared mode.

Every test runs the real daemon (conftest `bridge`) with a real stdio server
behind it and drives it with `mcp.client.sse.sse_client` + `ClientSession`.
Sessions use the SDK's default request ids, so concurrent sessions always
share ids; `tests/support/sdk.py` records each session's raw JSON-RPC traffic so the
tests can check that nothing of another session's ever arrives.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from support.daemon import demo
from support.sdk import TIME_SERVER, Client, connect, gather_sessions, own_progress_token, prompt_text, text_of

pytestmark = [
    # The SDK marks 2025-era features (logging, subscriptions, roots) deprecated for 2026-07-28.
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

N_SESSIONS = 20
CALLS_PER_SESSION = 4


def shared(**servers: dict) -> dict:
    return {"servers": {name: {**cfg, "mode": "shared"} for name, cfg in servers.items()}}


# --------------------------------------------------------------------- basics


async def test_demo_server_basics(bridge):
    async with bridge(shared(demo=demo())) as b:
        async with connect(b.url("demo")) as c:
            assert c.init.server_info.name == "mcp-bridge-demo"
            assert c.init.capabilities.tools is not None
            names = {t.name for t in (await c.session.list_tools()).tools}
            assert {"echo", "add", "current_time", "countdown", "log", "bump"} <= names

            assert text_of(await c.session.call_tool("echo", {"text": "hello through the bridge"})) == (
                "hello through the bridge"
            )
            added = await c.session.call_tool("add", {"a": 2, "b": 3.5})
            assert text_of(added) == "5.5"
            assert added.structured_content == {"sum": 5.5}
            c.wire.check_own_traffic()


async def test_time_server_basics(bridge):
    async with bridge(shared(time=TIME_SERVER)) as b:
        async with connect(b.url("time")) as c:
            assert c.init.server_info.name == "mcp-time"
            tools = {t.name: t for t in (await c.session.list_tools()).tools}
            assert {"get_current_time", "convert_time"} <= set(tools)

            result = json.loads(text_of(await c.session.call_tool("get_current_time", {"timezone": "UTC"})))
            assert result["timezone"] == "UTC"
            now = datetime.fromisoformat(result["datetime"])
            assert now.utcoffset() is not None and now.utcoffset().total_seconds() == 0
            c.wire.check_own_traffic()


# ------------------------------------------------------ many sessions, same ids


def _demo_calls(i: int):
    for k in range(CALLS_PER_SESSION):
        yield ("echo", {"text": f"session {i} call {k}"}, f"session {i} call {k}")
        yield ("add", {"a": i * 1000, "b": k}, str(i * 1000 + k))


def _time_calls(i: int):
    for k in range(CALLS_PER_SESSION):
        hhmm = f"{i:02d}:{k * 7:02d}"
        yield (
            "convert_time",
            {"source_timezone": "UTC", "time": hhmm, "target_timezone": "UTC"},
            f"T{hhmm}:00",
        )


@pytest.mark.parametrize(
    ("server", "calls"),
    [(demo(), _demo_calls), (TIME_SERVER, _time_calls)],
    ids=["demo", "mcp-server-time"],
)
async def test_twenty_sessions_default_ids_get_only_their_own_results(bridge, server, calls):
    async with bridge(shared(srv=server)) as b:

        async def body(c: Client, i: int):
            async def one(name, args, expected):
                text = text_of(await c.session.call_tool(name, args))
                assert expected in text, f"session {i} called {name}({args}) and got {text!r}"
                if name == "convert_time":
                    # Nothing of another session's conversion in this one's answer.
                    assert json.loads(text)["source"]["datetime"].endswith(f"{expected}+00:00")

            await asyncio.gather(*(one(*call) for call in calls(i)))
            c.wire.check_own_traffic()
            sent = c.wire.sent_requests("tools/call")
            assert len(sent) == len(list(calls(i)))
            return {m["id"] for m in sent}

        ids = await gather_sessions(b.url("srv"), N_SESSIONS, body)
        # The point of the test: all sessions used (mostly) the very same ids for their calls.
        shared_ids = set.intersection(*ids)
        assert len(shared_ids) >= len(list(calls(0))) // 2, ids


# ------------------------------------------------------------ demo features


async def test_progress_reaches_only_the_caller(bridge):
    async with bridge(shared(demo=demo())) as b:

        async def body(c: Client, i: int):
            steps = 3 + i
            seen: list[tuple[float, float | None, str | None]] = []
            all_seen = asyncio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append((progress, total, message))
                if len(seen) >= steps:
                    all_seen.set()

            result = await c.session.call_tool(
                "countdown", {"steps": steps, "interval_ms": 30}, progress_callback=on_progress
            )
            assert text_of(result) == "done"
            async with asyncio.timeout(5):
                await all_seen.wait()
            # Exactly this call's progress: its own step count, every step once.
            assert sorted(p for p, _, _ in seen) == [float(s) for s in range(1, steps + 1)], seen
            assert {t for _, t, _ in seen} == {float(steps)}, seen
            assert sorted(m for _, _, m in seen) == sorted(f"step {s}/{steps}" for s in range(1, steps + 1))
            return own_progress_token(c, steps)

        tokens = await gather_sessions(b.url("demo"), 3, body)
        assert len(set(map(str, tokens))) == 1, f"the SDK's default tokens should collide: {tokens}"


def _answer(client: Client, params: types.CreateMessageRequestParams) -> str:
    return f"{client.name} answers: {prompt_text(params)}"


async def test_sampling_is_answered_by_the_calling_session(bridge):
    async with bridge(shared(demo=demo())) as b:
        async with (
            connect(b.url("demo"), name="A", sampling=_answer) as a,
            connect(b.url("demo"), name="B", sampling=_answer) as bb,
            connect(b.url("demo"), name="C", sampling=_answer) as c,
            connect(b.url("demo"), name="D") as d,  # no sampling capability
        ):
            # B is the most recently active session when A asks.
            assert text_of(await bb.session.call_tool("echo", {"text": "B was here"})) == "B was here"
            result = await a.session.call_tool("sample", {"prompt": "question from A"})
            assert text_of(result) == "A answers: question from A"
            assert [prompt_text(p) for p in a.sampled] == ["question from A"]

            # B has a long call in flight, started before C asks: C still answers its own.
            b_running = asyncio.Event()

            async def b_progress(p: float, t: float | None, m: str | None) -> None:
                b_running.set()

            countdown = asyncio.create_task(
                bb.session.call_tool("countdown", {"steps": 3, "interval_ms": 100}, progress_callback=b_progress)
            )
            async with asyncio.timeout(10):
                await b_running.wait()
            result = await c.session.call_tool("sample", {"prompt": "question from C"})
            assert text_of(result) == "C answers: question from C"
            assert [prompt_text(p) for p in c.sampled] == ["question from C"]
            assert text_of(await countdown) == "done"

            # D cannot sample; it still sees nothing of the others' server requests.
            assert text_of(await d.session.call_tool("echo", {"text": "D"})) == "D"
            assert bb.sampled == [] and bb.wire.server_requests() == []
            assert d.wire.server_requests() == []
            assert len(a.wire.server_requests("sampling/createMessage")) == 1
            assert len(c.wire.server_requests("sampling/createMessage")) == 1
            for client in (a, bb, c, d):
                client.wire.check_own_traffic()


async def _round_trip(*clients: Client) -> None:
    """A server round trip on each session: whatever the server sent before is delivered."""
    await asyncio.gather(*(c.session.call_tool("echo", {"text": "barrier"}) for c in clients))


def _log_texts(client: Client) -> list[str]:
    return [str(m["params"]["data"]) for m in client.wire.notifications("notifications/message")]


async def test_log_levels_per_session(bridge):
    async with bridge(shared(demo=demo())) as b:
        async with (
            connect(b.url("demo"), name="verbose") as verbose,
            connect(b.url("demo"), name="quiet") as quiet,
            connect(b.url("demo"), name="default") as default,
        ):
            await verbose.session.set_logging_level("debug")
            await quiet.session.set_logging_level("warning")

            await verbose.session.call_tool("log", {"level": "info", "message": "m1 info"})
            await verbose.session.call_tool("log", {"level": "error", "message": "m2 error"})
            await quiet.session.call_tool("log", {"level": "debug", "message": "m3 debug"})
            await _round_trip(verbose, quiet, default)

            assert _log_texts(verbose) == ["m1 info", "m2 error", "m3 debug"]
            assert _log_texts(quiet) == ["m2 error"]
            # A session that never set a level gets whatever the server sends.
            assert _log_texts(default) == ["m1 info", "m2 error", "m3 debug"]
            assert [p.data for p in quiet.logs] == ["m2 error"]  # the SDK's logging_callback agrees

            # Both now ask for warning: the server is set to warning, and info is not even sent.
            mark = len(b.events)
            await verbose.session.set_logging_level("warning")
            await quiet.session.call_tool("log", {"level": "info", "message": "m4 info"})
            await quiet.session.call_tool("log", {"level": "warning", "message": "m5 warning"})
            await _round_trip(quiet, default)
            assert _log_texts(quiet) == ["m2 error", "m5 warning"]
            assert _log_texts(default) == ["m1 info", "m2 error", "m3 debug", "m5 warning"]
            assert not [e for e in b.events[mark:] if e.get("event") == "message_dropped"]
            for client in (verbose, quiet, default):
                client.wire.check_own_traffic()


async def test_log_level_restored_when_session_ends(bridge):
    async with bridge(shared(demo=demo())) as b:
        async with connect(b.url("demo"), name="quiet") as quiet, connect(b.url("demo"), name="default") as default:
            await quiet.session.set_logging_level("error")
            async with connect(b.url("demo"), name="verbose") as verbose:
                await verbose.session.set_logging_level("debug")
                await default.session.call_tool("log", {"level": "info", "message": "while verbose"})
                await _round_trip(verbose, quiet, default)
                assert _log_texts(verbose) == ["while verbose"]
            await b.wait_for("session_closed")
            await default.session.call_tool("log", {"level": "info", "message": "after verbose left"})
            await default.session.call_tool("log", {"level": "error", "message": "an error"})
            await _round_trip(quiet, default)
            assert _log_texts(quiet) == ["an error"]
            assert _log_texts(default) == ["while verbose", "an error"]


async def test_resource_updates_reach_subscribers_only(bridge):
    uri = "demo://counter"

    def updates(client: Client) -> int:
        return sum(1 for m in client.wire.notifications("notifications/resources/updated") if m["params"]["uri"] == uri)

    async with bridge(shared(demo=demo())) as b:
        async with (
            connect(b.url("demo"), name="A") as a,
            connect(b.url("demo"), name="B") as bb,
            connect(b.url("demo"), name="C") as c,
        ):
            await a.session.subscribe_resource(uri)
            await bb.session.subscribe_resource(uri)
            assert text_of(await c.session.call_tool("bump", {})) == "1"
            await _round_trip(a, bb, c)
            assert (updates(a), updates(bb), updates(c)) == (1, 1, 0)

            # A leaves the subscription; B's keeps the server subscribed.
            await a.session.unsubscribe_resource(uri)
            assert text_of(await a.session.call_tool("bump", {})) == "2"
            await _round_trip(a, bb, c)
            assert (updates(a), updates(bb), updates(c)) == (1, 2, 0)

            # Nobody subscribed: nothing is sent at all.
            await bb.session.unsubscribe_resource(uri)
            assert text_of(await c.session.call_tool("bump", {})) == "3"
            await _round_trip(a, bb, c)
            assert (updates(a), updates(bb), updates(c)) == (1, 2, 0)

            # A fresh subscription reaches the server again.
            await c.session.subscribe_resource(uri)
            assert text_of(await a.session.call_tool("bump", {})) == "4"
            await _round_trip(a, bb, c)
            assert (updates(a), updates(bb), updates(c)) == (1, 2, 1)
            read = await c.session.read_resource(uri)
            assert read.contents[0].text == "4"
            for client in (a, bb, c):
                client.wire.check_own_traffic()


async def test_completion_for_prompt_argument(bridge):
    async with bridge(shared(demo=demo())) as b:

        async def body(c: Client, i: int):
            prefix = ["Al", "C", "Tr"][i]
            result = await c.session.complete(
                types.PromptReference(type="ref/prompt", name="greet"), {"name": "name", "value": prefix}
            )
            return result.completion.values

        values = await gather_sessions(b.url("demo"), 3, body)
        assert values == [["Alice", "Alan"], ["Carol", "Charlie"], ["Trent"]]


async def test_cancelled_call_gets_no_late_result_and_server_stays_usable(bridge):
    async with bridge(shared(demo=demo())) as b:
        async with connect(b.url("demo"), name="A") as a, connect(b.url("demo"), name="B") as other:
            # B has the same kind of call in flight, with the same request id, and must be unaffected.
            b_progress: list[float] = []

            async def b_on_progress(p: float, t: float | None, m: str | None) -> None:
                b_progress.append(p)

            b_call = asyncio.create_task(
                other.session.call_tool("countdown", {"steps": 6, "interval_ms": 50}, progress_callback=b_on_progress)
            )

            first_progress = asyncio.Event()

            async def on_progress(p: float, t: float | None, m: str | None) -> None:
                first_progress.set()

            call = asyncio.create_task(
                a.session.call_tool("countdown", {"steps": 5, "interval_ms": 100}, progress_callback=on_progress)
            )
            async with asyncio.timeout(10):
                await first_progress.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

            (sent,) = a.wire.sent_requests("tools/call")
            cancelled_id = sent["id"]
            (cancel,) = [m for m in a.wire.sent if m.get("method") == "notifications/cancelled"]
            assert cancel["params"]["requestId"] == cancelled_id

            # The same call again, started after the cancel, ends after the cancelled one would have:
            # once it is answered, a late answer to the cancelled one would have arrived before it.
            mark = len(a.wire.received)
            assert text_of(await a.session.call_tool("countdown", {"steps": 5, "interval_ms": 100})) == "done"
            after = a.wire.received[mark:]
            late = [m for m in a.wire.responses() if m["id"] == cancelled_id]
            assert late == [], f"late result for the cancelled call: {late}"
            late_progress = [
                m
                for m in after
                if m.get("method") == "notifications/progress" and m["params"]["progressToken"] == cancelled_id
            ]
            assert late_progress == [], late_progress

            # The other session's identical call is untouched, and the server still serves both.
            assert text_of(await b_call) == "done"
            assert len(b_progress) == 6
            assert text_of(await a.session.call_tool("echo", {"text": "still here"})) == "still here"
            assert text_of(await other.session.call_tool("add", {"a": 1, "b": 1})) == "2"
            a.wire.check_own_traffic()
            other.wire.check_own_traffic()


async def test_request_timeout_cancels_upstream(bridge):
    """The SDK's own request timeout: the bridge forwards its cancel and drops the late result."""
    async with bridge(shared(demo=demo())) as b:
        async with connect(b.url("demo"), name="A") as a:
            with pytest.raises(MCPError) as err:
                await a.session.call_tool("countdown", {"steps": 4, "interval_ms": 100}, read_timeout_seconds=0.15)
            assert err.value.error.code == types.REQUEST_TIMEOUT
            (sent,) = a.wire.sent_requests("tools/call")
            assert [m["params"]["requestId"] for m in a.wire.sent if m.get("method") == "notifications/cancelled"] == [
                sent["id"]
            ]
            assert text_of(await a.session.call_tool("countdown", {"steps": 4, "interval_ms": 100})) == "done"
            assert [m for m in a.wire.responses() if m["id"] == sent["id"]] == []
            assert text_of(await a.session.call_tool("echo", {"text": "ok"})) == "ok"


async def test_cancel_during_sampling_reaches_the_server(bridge):
    """Cancelling `sample` while the client is still sampling: the server gets the cancel (it
    withdraws its own sampling request, and that withdrawal reaches the same session), and the
    caller gets no late result."""
    async with bridge(shared(demo=demo())) as b:
        asked = asyncio.Event()
        withdrawn = asyncio.Event()

        async def slow_llm(client: Client, params: types.CreateMessageRequestParams) -> str:
            asked.set()
            try:
                async with asyncio.timeout(15):
                    await asyncio.Event().wait()  # never answers; only a cancel ends it
            except asyncio.CancelledError:
                withdrawn.set()
                raise
            return "too late"

        async with (
            connect(b.url("demo"), name="A", sampling=slow_llm) as a,
            connect(b.url("demo"), name="B", sampling=_answer) as other,
        ):
            call = asyncio.create_task(a.session.call_tool("sample", {"prompt": "never answered"}))
            async with asyncio.timeout(10):
                await asked.wait()
            (server_request,) = a.wire.server_requests("sampling/createMessage")
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

            # The demo server only withdraws its sampling request when it got the client's cancel.
            withdrawal = await a.wire.wait_for(lambda m: m.get("method") == "notifications/cancelled")
            assert withdrawal["params"]["requestId"] == server_request["id"]
            async with asyncio.timeout(10):
                await withdrawn.wait()  # the SDK stopped the sampling callback

            (sent,) = a.wire.sent_requests("tools/call")
            assert text_of(await a.session.call_tool("echo", {"text": "after"})) == "after"
            assert [m for m in a.wire.responses() if m["id"] == sent["id"]] == []
            # The other session saw none of it and can still sample.
            assert other.wire.server_requests() == [] and other.wire.notifications("notifications/cancelled") == []
            result = await other.session.call_tool("sample", {"prompt": "B asks"})
            assert text_of(result) == "B answers: B asks"
            a.wire.check_own_traffic()
            other.wire.check_own_traffic()
