"""Protocol eras on the server side: a stdio server that speaks only 2026-07-28, served to
today's clients (the official `mcp` SDK over HTTP+SSE and 2025 Streamable HTTP) through the
bridge's era translator (bridge/core/translator.py), in shared and per-session mode; and legacy servers,
still found legacy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from support.daemon import PY, SERVERS, demo, faulty
from support.metrics import scrape
from support.sdk import connect, gather_sessions, prompt_text, text_of

pytestmark = [pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]

MODERN = {"command": PY, "args": [str(SERVERS / "modern.py")]}
TRANSPORTS = [pytest.param(False, id="sse"), pytest.param(True, id="streamable")]
MODES = ["shared", "per-session", "per-principal"]


def config(mode: str = "shared", **server: object) -> dict:
    return {"servers": {"m": {**MODERN, "mode": mode, **server}}}


def url(b, streamable: bool) -> str:
    return b.url("m", "mcp" if streamable else "sse")


async def eras(b, name: str = "m") -> list[str]:
    async with httpx2.AsyncClient() as http:
        body = (await http.get(f"{b.base}/status")).json()
    return [p["era"] for p in body["servers"][name]["processes"]]


@pytest.mark.parametrize("streamable", TRANSPORTS)
@pytest.mark.parametrize("mode", MODES)
async def test_modern_server_serves_legacy_clients(bridge, mode, streamable):
    async with bridge(config(mode)) as b:
        async with connect(url(b, streamable), streamable=streamable) as c:
            assert c.init.server_info.name == "modern-test"
            assert c.init.instructions == "A modern-only test server."
            assert c.init.capabilities.tools is not None
            tools = {t.name for t in (await c.session.list_tools()).tools}
            assert {"echo", "greet", "summarize", "roots", "work", "touch"} <= tools
            assert text_of(await c.session.call_tool("echo", {"text": "hi"})) == "hi"
            await c.session.send_ping()
            read = await c.session.read_resource("counter://value")
            assert read.contents[0].text.isdigit()
            event = await b.wait_for("server_era", where=lambda e: e["final"])
            assert event["era"] == "modern"
            assert await eras(b) == ["modern"]
            metrics = await scrape(b)
            assert metrics.get("mcp_bridge_server_processes_by_era", server="m", era="modern") == 1


@pytest.mark.parametrize("streamable", TRANSPORTS)
@pytest.mark.parametrize("mode", MODES)
async def test_sampling_elicitation_and_roots_through_input_required(bridge, mode, streamable):
    async with bridge(config(mode)) as b:
        async with connect(
            url(b, streamable),
            streamable=streamable,
            sampling=lambda c, params: f"summary of {prompt_text(params)}",
            roots=["file:///work/a", "file:///work/b"],
            elicit=lambda params: {"name": "ada"},
        ) as c:
            assert text_of(await c.session.call_tool("greet", {})) == "hello ada"
            assert text_of(await c.session.call_tool("summarize", {"text": "x"})) == "summary of summarize: x"
            assert text_of(await c.session.call_tool("roots", {})) == "file:///work/a,file:///work/b"
            assert text_of(await c.session.call_tool("both", {"text": "y"})) == "ada: summary of summarize: y"
            asked = [m["method"] for m in c.wire.server_requests()]
            assert asked.count("elicitation/create") == 2 and asked.count("sampling/createMessage") == 2
            c.wire.check_own_traffic()


async def test_input_goes_to_the_calling_session_only(bridge):
    n = 20
    async with bridge(config("shared")) as b:

        async def one(client, i: int) -> str:
            result = text_of(await client.session.call_tool("both", {"text": f"t{i}"}))
            client.wire.check_own_traffic()
            return result

        results = await gather_sessions(
            b.url("m"), n, one, elicit=lambda params: {"name": "x"}, sampling=lambda c, params: f"{c.name} {prompt_text(params)}"
        )
        assert results == [f"x: s{i} summarize: t{i}" for i in range(n)]


async def test_calls_to_a_modern_server_do_not_take_turns(bridge):
    """A legacy server's questions must be attributed, so in shared mode calls that may ask go
    one at a time for up to attribution_window each; a modern server's come with their call."""
    async with bridge(config("shared", attribution_window="2s")) as b:
        async with connect(b.url("m"), sampling=lambda c, params: "x") as c:
            started = time.monotonic()
            results = await asyncio.gather(*(c.session.call_tool("nap", {"seconds": 1}) for _ in range(4)))
            took = time.monotonic() - started
        assert [text_of(r) for r in results] == ["rested"] * 4
        assert took < 3, f"4 calls of 1s took {took:.1f}s: they took turns (4s)"


async def test_calls_to_a_modern_server_take_turns_under_max_concurrent_calls(bridge):
    """The cap holds through the era translator: one call at a time reaches the server, and a
    call waiting for its client's input (input_required, answered and retried) keeps its slot."""
    async with bridge(config("shared", max_concurrent_calls=1)) as b:
        async with connect(b.url("m"), elicit=lambda params: {"name": "ada"}) as c:
            started = time.monotonic()
            results = await asyncio.gather(
                *(c.session.call_tool("nap", {"seconds": 0.5}) for _ in range(3)), c.session.call_tool("greet", {})
            )
            took = time.monotonic() - started
        assert [text_of(r) for r in results] == ["rested"] * 3 + ["hello ada"]
        assert took >= 1.5, f"3 calls of 0.5s took {took:.2f}s: some ran at once"
        m = await scrape(b)
        assert m.get("mcp_bridge_call_queue_wait_seconds_count", server="m") >= 4  # type: ignore[operator]
        assert m.get("mcp_bridge_call_queue_wait_seconds_sum", server="m") >= 1.0  # type: ignore[operator]


async def test_configured_roots_are_answered_by_the_bridge(bridge):
    async with bridge(config("shared", roots=["file:///srv/data"])) as b, connect(b.url("m")) as c:
        assert text_of(await c.session.call_tool("roots", {})) == "file:///srv/data"
        assert not c.wire.server_requests()


@pytest.mark.parametrize("streamable", TRANSPORTS)
async def test_tool_list_changes_reach_every_session(bridge, streamable):
    async with bridge(config("shared")) as b, connect(url(b, streamable), streamable=streamable) as c, connect(b.url("m")) as other:
        start = len(other.wire.received)
        await c.session.call_tool("grow", {})
        await other.wire.wait_for(lambda m: m.get("method") == "notifications/tools/list_changed", start=start)
        assert "grown" in {t.name for t in (await other.session.list_tools()).tools}


@pytest.mark.parametrize(
    ("mode", "warm", "refusal"),
    [
        # The server sees the bridge's capabilities, asks, and the session cannot answer.
        ("shared", 0, "could not give the input"),
        # The server sees the client's own capabilities, and says what is missing (-32021);
        # on a process from the warm pool too (it once saw the bridge's).
        ("per-session", 0, "elicitation"),
        ("per-session", 1, "elicitation"),
    ],
)
async def test_a_client_unable_to_answer_gets_an_error(bridge, mode, warm, refusal):
    async with bridge(config(mode, pool={"warm": warm})) as b:
        if warm:
            await b.wait_for("server_warm")
        async with connect(b.url("m")) as c:
            with pytest.raises(MCPError, match=refusal) as raised:
                await c.session.call_tool("greet", {})
            if mode == "per-session":
                assert raised.value.error.code == -32021
                assert not c.wire.server_requests()
            assert text_of(await c.session.call_tool("echo", {"text": "still here"})) == "still here"
        if warm:
            assert [e["process"] for e in b.named("session_opened")] == ["warm"]


@pytest.mark.parametrize("streamable", TRANSPORTS)
@pytest.mark.parametrize("mode", MODES)
async def test_resource_subscription_becomes_a_listen(bridge, mode, streamable):
    async with bridge(config(mode)) as b, connect(url(b, streamable), streamable=streamable) as c:
        await c.session.subscribe_resource("counter://value")
        start = len(c.wire.received)
        await c.session.call_tool("touch", {})
        note = await c.wire.wait_for(lambda m: m.get("method") == "notifications/resources/updated", start=start)
        assert note["params"]["uri"] == "counter://value"
        await c.session.unsubscribe_resource("counter://value")
        start = len(c.wire.received)
        await c.session.call_tool("touch", {})
        await c.session.send_ping()  # a round trip after the touch: anything it caused has arrived
        assert not [m for m in c.wire.received[start:] if m.get("method") == "notifications/resources/updated"]


@pytest.mark.parametrize("mode", MODES)
async def test_log_level_and_progress(bridge, mode):
    async with bridge(config(mode)) as b, connect(b.url("m")) as c:
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        await c.session.set_logging_level("info")
        result = await c.session.call_tool("work", {"steps": 3}, progress_callback=on_progress)
        assert text_of(result) == "done 3"
        assert progress == [1, 2, 3]
        assert [log.data for log in c.logs] == ["step 0", "step 1", "step 2"]
        await c.session.set_logging_level("error")
        c.logs.clear()
        await c.session.call_tool("work", {"steps": 2})
        assert c.logs == []


async def test_a_restarted_modern_server_gets_its_subscriptions_back(bridge):
    async with bridge(config("shared")) as b, connect(b.url("m")) as c:
        await c.session.subscribe_resource("counter://value")
        (pid,) = b.server_pids()
        os.kill(pid, signal.SIGKILL)
        await b.wait_for("server_era", where=lambda e: e["pid"] != pid)
        # The replayed subscription is in place once the new server acknowledged its listen;
        # nothing tells the client when, so touch until an update comes (bounded).
        for _ in range(10):
            start = len(c.wire.received)
            await c.session.call_tool("touch", {})
            with contextlib.suppress(TimeoutError):
                note = await c.wire.wait_for(lambda m: m.get("method") == "notifications/resources/updated", 1.0, start)
                break
        assert note["params"]["uri"] == "counter://value"


async def test_legacy_server_is_found_legacy(bridge):
    async with bridge({"servers": {"demo": demo(mode="shared")}}) as b:
        event = await b.wait_for("server_era")
        assert event["era"] == "legacy" and event["final"] and "refused" in event["reason"]
        async with connect(b.url("demo")) as c:
            assert c.init.server_info.name
        assert await eras(b, "demo") == ["legacy"]


async def test_silent_discover_falls_back_after_the_timeout(bridge):
    async with bridge({"servers": {"f": {**faulty(FAULTY_SILENT_DISCOVER="1"), "mode": "shared"}}}) as b:
        started = time.monotonic()
        event = await b.wait_for("server_era", timeout=10)
        assert event["era"] == "legacy" and not event["final"] and "no answer to server/discover" in event["reason"]
        final = await b.wait_for("server_era", where=lambda e: e["final"])
        assert final["era"] == "legacy" and final["reason"] == "answered initialize"
        assert time.monotonic() - started < 5
        async with connect(b.url("f")) as c:
            assert {t.name for t in (await c.session.list_tools()).tools}


async def test_a_modern_server_slower_than_the_timeout_is_found_modern(bridge):
    async with bridge(config("shared", env={"MODERN_SLOW_START": "4"})) as b:
        first = await b.wait_for("server_era", timeout=15)
        assert first["era"] == "legacy" and not first["final"]
        event = await b.wait_for("server_era", timeout=15, where=lambda e: e["final"])
        assert event["era"] == "modern" and "after the timeout" in event["reason"]
        async with connect(b.url("m")) as c:
            assert c.init.server_info.name == "modern-test"
            assert text_of(await c.session.call_tool("echo", {"text": "late"})) == "late"
        assert not b.named("message_dropped")


async def test_a_legacy_server_configured_modern_is_restarted_saying_why(bridge):
    async with bridge({"servers": {"demo": demo(mode="shared", era="modern")}}) as b:
        event = await b.wait_for("server_era")
        assert event["era"] == "modern" and "configured era modern, but server/discover refused" in event["reason"]
        forced = await b.wait_for("server_restart_forced")
        assert "initialize failed" in forced["reason"] and "configured era modern" in forced["reason"]


async def test_configured_legacy_sends_no_discover(bridge):
    async with bridge({"servers": {"f": {**faulty(FAULTY_SILENT_DISCOVER="1"), "mode": "shared", "era": "legacy"}}}) as b:
        async with connect(b.url("f")) as c:
            await c.session.list_tools()
        assert await eras(b, "f") == ["legacy"]
        assert not b.named("server_era")
        assert not [e for e in b.named("server_stderr") if "discover" in e.get("line", "")]

