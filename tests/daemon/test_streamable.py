"""The Streamable HTTP transport (`/servers/{name}/mcp`), end to end: a real daemon,
real server processes, real sockets, and both a raw client (tests/support/rawstreamable.py)
and the official SDK's `streamable_http_client`.

Every wait is on a log event or a message, bounded by a timeout; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from support.daemon import Bridge, demo, faulty
from support.rawclient import RawSse
from support.rawclient import call as sse_call
from support.rawstreamable import (
    JSON_ONLY,
    SESSION,
    SSE_FIRST,
    Event,
    RawStreamable,
    notification,
    request,
    text_of,
    tool_call,
)
from support.sdk import TIME_SERVER, Client, Wire, _RecordingReader, _RecordingWriter, prompt_text
from support.sdk import text_of as sdk_text

from bridge.http.endpoints.streamable_2025 import HOLD_S, STANDALONE, Form, Holds, StreamableSession

pytestmark = [
    # The SDK marks 2025-era features (logging, subscriptions) deprecated for 2026-07-28.
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

SESSION_ID = re.compile(r"^[0-9a-f]{32,}$")  # hex, at least 128 bits
DEMO = {"servers": {"demo": demo()}}
FAULTY = {"servers": {"f": faulty()}}
COUNTER = "demo://counter"
N_SESSIONS = 20


def init_params(version: str = "2025-11-25", capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "protocolVersion": version,
        "capabilities": capabilities or {},
        "clientInfo": {"name": "raw-streamable", "version": "0"},
    }


def stderr_note(prefix: str) -> Callable[[dict[str, Any]], bool]:
    """A `where=` filter for the faulty server's stderr notes (see tests/servers/faulty.py)."""
    return lambda e: e.get("line", "").startswith(f"faulty: {prefix}")


def messages(events: list[Event]) -> list[dict[str, Any]]:
    return [e.message for e in events if not e.priming]


def logs_in(events: list[Event]) -> list[str]:
    return [e.message["params"]["data"] for e in events if not e.priming and e.message.get("method") == "notifications/message"]


async def say(c: RawStreamable, text: str) -> None:
    """Make the demo server broadcast a log message; it has reached the bridge when this returns
    (the server writes the notification before the tool's response, and the bridge reads in order)."""
    response, before = await c.request("tools/call", {"name": "log", "arguments": {"level": "info", "message": text}})
    assert text_of(response) == "logged"
    assert before == [], f"a broadcast log message went to the POST stream: {before}"


async def next_log(stream: Any, timeout: float = 10.0) -> str:
    """The next message on a stream, which must be a log message; its text."""
    msg = await stream.message(timeout)
    assert msg.get("method") == "notifications/message", msg
    return msg["params"]["data"]


def assert_clean(b: Bridge) -> None:
    """Nothing went wrong inside the bridge: no error logged, no traceback on its stderr."""
    bad = [e for e in b.events if e.get("level") in ("error", "critical") or e.get("event") == "unparsed"]
    assert not bad, bad


async def metric(b: Bridge, name: str, **labels: str) -> float | None:
    async with aiohttp.ClientSession() as http, http.get(f"{b.base}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name) : line.index("}") + 1]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


# ------------------------------------------------------------------ initialize


async def test_initialize_sse_creates_session(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        reply = await c.post(request("initialize", init_params("2025-11-25"), "i1"), session=False, version=False, accept=SSE_FIRST)
        assert reply.status == 200, reply.text
        assert reply.content_type == "text/event-stream"
        sid = reply.headers[SESSION]
        assert SESSION_ID.match(sid), sid
        assert reply.stream is not None
        response, before = await reply.stream.response("i1")
        assert before == []
        result = response["result"]
        assert response["jsonrpc"] == "2.0"
        assert result["protocolVersion"] == "2025-11-25"
        assert result["serverInfo"]["name"] == "mcp-bridge-demo"
        assert "tools" in result["capabilities"]
        # The stream closes after the response, cleanly.
        assert messages(await reply.stream.until_end()) == []
        assert reply.stream.error is None
        opened = await b.wait_for("session_opened", where=lambda e: e.get("session") == sid)
        assert opened["transport"] == "streamable"

        # Each initialize is a new session with a fresh random id.
        ids = {sid}
        for _ in range(4):
            other = await c.post(request("initialize", init_params(), 1), session=False, version=False, accept=SSE_FIRST)
            assert other.status == 200
            assert SESSION_ID.match(other.headers[SESSION])
            ids.add(other.headers[SESSION])
            assert other.stream is not None
            await other.stream.until_end()
        assert len(ids) == 5

        # The session works: a request with its id is answered on its own stream.
        c.session_id, c.protocol_version = sid, "2025-11-25"
        assert (await c.post(notification("notifications/initialized"))).status == 202
        response, _ = await c.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert text_of(response) == "hi"


async def test_initialize_and_requests_as_json(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        reply = await c.post(request("initialize", init_params("2025-06-18"), 1), accept=JSON_ONLY, session=False, version=False)
        assert reply.status == 200, reply.text
        assert reply.content_type == "application/json"
        assert SESSION_ID.match(reply.headers[SESSION])
        body = reply.json
        assert body["id"] == 1 and body["jsonrpc"] == "2.0"
        assert body["result"]["protocolVersion"] == "2025-06-18"
        assert body["result"]["serverInfo"]["name"] == "mcp-bridge-demo"
        c.session_id, c.protocol_version = reply.headers[SESSION], "2025-06-18"
        assert (await c.post(notification("notifications/initialized"), accept=JSON_ONLY)).status == 202

        # Requests accepting only JSON get their single response as the body.
        reply = await c.post(tool_call("echo", {"text": "plain"}, 2), accept=JSON_ONLY)
        assert reply.status == 200 and reply.content_type == "application/json"
        assert reply.json == {"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "plain"}]}}

        # Progress cannot ride a JSON body: it must not be lost, it goes to the standalone stream.
        get = await c.get()
        assert get.status == 200 and get.stream is not None
        reply = await c.post(tool_call("countdown", {"steps": 3, "interval_ms": 10}, 3, token="json-tok"), accept=JSON_ONLY)
        assert reply.status == 200 and reply.content_type == "application/json"
        assert reply.json["id"] == 3 and text_of(reply.json) == "done"
        progress = [await get.stream.message() for _ in range(3)]
        assert [m["method"] for m in progress] == ["notifications/progress"] * 3
        assert [m["params"]["progress"] for m in progress] == [1, 2, 3]
        assert {m["params"]["progressToken"] for m in progress} == {"json-tok"}
        assert_clean(b)


# --------------------------------------------------------------- status codes


async def test_missing_session_header_400(bridge: Any) -> None:
    """A POST without a session is 400; a GET or DELETE 405 (2026-07-28 has only POSTs)."""
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        for reply, status in (
            (await c.post(request("tools/list", None, 1), session=False), 400),
            (await c.post(notification("notifications/initialized"), session=False), 400),
            (await c.get(session=False), 405),
            (await c.delete(session=False), 405),
        ):
            assert reply.status == status, (reply.status, reply.text)
            assert "error" in reply.json, reply.text
        # The session is untouched by all that.
        response, _ = await c.request("tools/list")
        assert "tools" in response["result"]


async def test_unknown_and_ended_session_404(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        unknown = "0123456789abcdef" * 2
        for reply in (
            await c.post(request("tools/list", None, 1), session=unknown),
            await c.post(notification("notifications/initialized"), session=unknown),
            await c.get(session=unknown),
            await c.delete(session=unknown),
        ):
            assert reply.status == 404, (reply.status, reply.text)
            assert "error" in reply.json, reply.text
        # An SSE session's id is no Streamable session.
        async with RawSse(b.url("demo")) as sse:
            assert (await c.get(session=sse.session_id)).status == 404
            assert (await c.post(request("ping", None, 1), session=sse.session_id)).status == 404

        sid = c.session_id
        deleted = await c.delete()
        assert deleted.status in (200, 204), (deleted.status, deleted.text)
        await b.wait_for("session_closed", where=lambda e: e.get("session") == sid)
        assert (await c.post(request("tools/list", None, 2))).status == 404
        assert (await c.post(notification("notifications/initialized"))).status == 404
        assert (await c.get()).status == 404
        assert (await c.delete()).status == 404


async def test_notifications_and_responses_only_202(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        for payload in (
            notification("notifications/roots/list_changed"),
            [notification("notifications/cancelled", {"requestId": 99}), notification("notifications/roots/list_changed")],
            {"jsonrpc": "2.0", "id": 12345, "result": {}},  # a response (to no request: dropped, but accepted)
        ):
            reply = await c.post(payload)
            assert reply.status == 202, (reply.status, reply.text)
            assert reply.text == ""
            assert reply.stream is None


async def test_protocol_version_header(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize("2025-06-18")
        assert c.protocol_version == "2025-06-18"
        # Absent (taken as 2025-03-26) and the negotiated one are fine.
        for version in (False, "2025-06-18"):
            reply = await c.post(request("ping", None, f"v-{version}"), version=version, accept=SSE_FIRST)
            assert reply.status == 200, (version, reply.status, reply.text)
            assert reply.stream is not None
            response, _ = await reply.stream.response(f"v-{version}")
            assert response["result"] == {}
        get = await c.get(version=False)
        assert get.status == 200
        # An unsupported value is refused on every kind of request, and changes nothing.
        for bad in ("1999-01-01", "latest"):
            for reply in (
                await c.post(request("ping", None, 1), version=bad),
                await c.post(notification("notifications/roots/list_changed"), version=bad),
                await c.get(version=bad),
                await c.delete(version=bad),
            ):
                assert reply.status == 400, (bad, reply.status, reply.text)
                assert "error" in reply.json
        response, _ = await c.request("ping")
        assert response["result"] == {}


# --------------------------------------------------------------- POST streams


async def test_post_stream_carries_progress_and_response_then_closes(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        reply = await c.post(tool_call("countdown", {"steps": 3, "interval_ms": 20}, 7, token="tok-7"))
        assert reply.status == 200 and reply.stream is not None
        assert reply.content_type == "text/event-stream"
        assert reply.headers.get("Cache-Control") == "no-cache"
        events = await reply.stream.until_end()
        assert reply.stream.error is None, reply.stream.error
        got = messages(events)
        assert [m.get("method") for m in got] == ["notifications/progress"] * 3 + [None], got
        assert [m["params"]["progress"] for m in got[:3]] == [1, 2, 3]
        assert {m["params"]["progressToken"] for m in got[:3]} == {"tok-7"}
        assert got[3]["id"] == 7 and text_of(got[3]) == "done"
        # Every event has an id, increasing.
        seqs = [e.seq for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), [e.id for e in events]

        # Two requests in one POST: both answered on it, then it closes.
        reply = await c.post([tool_call("echo", {"text": "a"}, "a"), tool_call("echo", {"text": "b"}, "b")], accept=SSE_FIRST)
        assert reply.status == 200 and reply.stream is not None
        got = messages(await reply.stream.until_end())
        assert sorted((m["id"], text_of(m)) for m in got) == [("a", "a"), ("b", "b")]
        # A client that takes either, answered at once: both responses as one JSON array.
        reply = await c.post([tool_call("echo", {"text": "a"}, "a2"), tool_call("echo", {"text": "b"}, "b2")])
        assert (reply.status, reply.content_type) == (200, "application/json"), reply
        assert sorted((m["id"], text_of(m)) for m in reply.json) == [("a2", "a"), ("b2", "b")]


async def test_a_client_that_takes_either_form_gets_the_one_its_answer_needs(bridge: Any) -> None:
    """Accept with both as much (as the SDK clients send it): the form is chosen when the
    answer is due. Its response within streamable.HOLD_S with nothing before it: one JSON
    body. No answer by then, or something before the response: a stream, opening with the
    priming event. A client that prefers the stream always gets one."""
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize("2025-11-25")
        quick = await c.post(tool_call("echo", {"text": "q"}, "q"))
        assert (quick.status, quick.content_type) == (200, "application/json"), quick
        assert quick.json["id"] == "q" and text_of(quick.json) == "q"

        slow = await c.post(tool_call("countdown", {"steps": 2, "interval_ms": 60}, "s"))  # no progress: silent for 120 ms
        assert slow.content_type == "text/event-stream" and slow.stream is not None
        events = await slow.stream.until_end()
        assert events[0].priming and [e.message["id"] for e in events[1:]] == ["s"], events

        told = await c.post(tool_call("countdown", {"steps": 2, "interval_ms": 0}, "p", token="tok-p"))
        assert told.content_type == "text/event-stream" and told.stream is not None
        got = messages(await told.stream.until_end())
        assert [m.get("method") for m in got] == ["notifications/progress"] * 2 + [None], got

        preferred = await c.post(tool_call("echo", {"text": "r"}, "r"), accept=SSE_FIRST)
        assert preferred.content_type == "text/event-stream" and preferred.stream is not None
        response, _ = await preferred.stream.response("r")
        assert text_of(response) == "r"


async def test_server_request_goes_to_the_post_stream(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize(capabilities={"sampling": {}})
        get = await c.get()
        assert get.status == 200 and get.stream is not None
        reply = await c.post(tool_call("sample", {"prompt": "what is 2+2?"}, "s1"))
        assert reply.status == 200 and reply.stream is not None
        ask = await reply.stream.message()
        assert ask.get("method") == "sampling/createMessage", ask
        assert ask["params"]["messages"][0]["content"]["text"] == "what is 2+2?"
        answer = {
            "jsonrpc": "2.0",
            "id": ask["id"],
            "result": {"role": "assistant", "content": {"type": "text", "text": "four"}, "model": "raw"},
        }
        answered = await c.post(answer)
        assert answered.status == 202 and answered.text == ""
        response, before = await reply.stream.response("s1")
        assert before == []
        assert text_of(response) == "four"
        assert messages(await reply.stream.until_end()) == []
        # Nothing of that call reached the standalone stream: the next thing on it is this marker.
        await say(c, "marker")
        assert await next_log(get.stream) == "marker"


async def test_standalone_get_stream_gets_unrelated_messages(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c, RawStreamable(b.url("demo", "mcp")) as other:
        await c.initialize()
        await other.initialize()
        response, _ = await c.request("resources/subscribe", {"uri": COUNTER})
        assert response["result"] == {}
        get = await c.get()
        assert get.status == 200 and get.stream is not None
        assert get.content_type == "text/event-stream"
        other_get = await other.get()
        assert other_get.status == 200 and other_get.stream is not None

        # A bump from another POST (the other session's): resources/updated reaches the subscriber's GET stream.
        response, before = await other.request("tools/call", {"name": "bump", "arguments": {}})
        assert before == []
        updated = await get.stream.message()
        assert updated == {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": COUNTER}}
        # The bumping POST of the subscriber itself carries only its response.
        response, before = await c.request("tools/call", {"name": "bump", "arguments": {}})
        assert before == [], before
        updated = await get.stream.message()
        assert updated["method"] == "notifications/resources/updated"

        # Log messages go to every session's standalone stream; the unsubscribed one saw no update.
        await say(c, "to everyone")
        assert await next_log(get.stream) == "to everyone"
        assert await next_log(other_get.stream) == "to everyone"
        assert all(e.id for e in get.stream.events)
        assert_clean(b)


async def test_second_get_replaces_the_first(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        first = await c.get()
        assert first.status == 200 and first.stream is not None
        await say(c, "one")
        assert await next_log(first.stream) == "one"

        second = await c.get()
        assert second.status == 200 and second.stream is not None
        # The first stream ends, cleanly (a finished chunked body, not a reset).
        rest = await first.stream.until_end()
        assert messages(rest) == []
        assert first.stream.error is None, first.stream.error
        await say(c, "two")
        assert await next_log(second.stream) == "two"

        # A message racing a takeover reaches exactly one of the two streams, once.
        await say(c, "racing")
        third = await c.get()
        assert third.status == 200 and third.stream is not None
        await second.stream.until_end()
        await say(c, "three")
        async with asyncio.timeout(10):
            while "three" not in logs_in(third.stream.events):
                await third.stream.wait_events(len(third.stream.events) + 1)
        seen = logs_in(second.stream.events) + logs_in(third.stream.events)
        assert seen.count("racing") == 1 and seen.count("three") == 1, seen

        # Many GETs at once: all but one end, cleanly, and that one gets what comes next.
        replies = await asyncio.gather(*(c.get() for _ in range(6)))
        assert [r.status for r in replies] == [200] * 6
        streams = [r.stream for r in replies]
        await third.stream.until_end()
        async with asyncio.timeout(10):
            while len(still := [s for s in streams if not s.ended.is_set()]) > 1:
                waits = [asyncio.ensure_future(s.ended.wait()) for s in still]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        assert len(still) == 1, "every GET stream ended"
        assert all(s.error is None for s in streams)
        await say(c, "four")
        assert await next_log(still[0]) == "four"
        assert not still[0].ended.is_set()

        # The daemon is fine and the session still works.
        async with aiohttp.ClientSession() as http, http.get(f"{b.base}/healthz") as resp:
            assert resp.status == 200
        response, _ = await c.request("ping")
        assert response["result"] == {}
        assert_clean(b)


# -------------------------------------------------------------------- DELETE


async def test_delete_ends_session(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        sid = c.session_id
        get = await c.get()
        assert get.status == 200 and get.stream is not None
        deleted = await c.delete()
        assert deleted.status in (200, 204), (deleted.status, deleted.text)
        closed = await b.wait_for("session_closed", where=lambda e: e.get("session") == sid)
        assert closed["transport"] == "streamable"
        await get.stream.until_end()  # its stream ends with it
        assert (await c.post(request("ping", None, 1))).status == 404
        assert (await c.get()).status == 404
        assert (await c.delete()).status == 404
        # A client that gets 404 starts over with a new session.
        await c.initialize()
        assert c.session_id != sid
        response, _ = await c.request("ping")
        assert response["result"] == {}


async def test_delete_cancels_requests_in_flight(bridge: Any) -> None:
    async with bridge(FAULTY) as b, RawStreamable(b.url("f", "mcp")) as c:
        await c.initialize()
        mark = len(b.events)
        reply = await c.post(tool_call("hang", {}, "h"))
        assert reply.status == 200 and reply.stream is not None
        hang = await b.wait_for("server_stderr", where=stderr_note("hang "), start=mark)
        upstream_id = json.loads(hang["line"][len("faulty: hang ") :])

        deleted = await c.delete()
        assert deleted.status in (200, 204), (deleted.status, deleted.text)

        def cancelled(e: dict[str, Any]) -> bool:
            prefix = "faulty: notification notifications/cancelled "
            line = e.get("line", "")
            return line.startswith(prefix) and json.loads(line[len(prefix) :]).get("requestId") == upstream_id

        await b.wait_for("server_stderr", where=cancelled, start=mark)
        # The hanging POST's stream ends (with no result from the server).
        rest = messages(await reply.stream.until_end())
        assert all("result" not in m for m in rest), rest
        assert (await c.post(request("ping", None, 2))).status == 404
        assert (await c.get()).status == 404


# ----------------------------------------------------------------- resumption


async def test_resume_post_stream_after_lost_events(bridge: Any) -> None:
    """The connection broke after the client had read part of the stream: what it
    missed (here: everything after the second progress, the response included) is
    replayed from the session's buffer to a GET with Last-Event-ID."""
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        reply = await c.post(tool_call("countdown", {"steps": 4, "interval_ms": 10}, "r", token="r-tok"))
        assert reply.stream is not None
        events = await reply.stream.until_end()
        assert len(messages(events)) == 5, events
        upto = next(i for i, e in enumerate(events) if not e.priming and e.message.get("params", {}).get("progress") == 2)
        seen, lost = events[: upto + 1], events[upto + 1 :]

        resumed = await c.get(seen[-1].id)
        assert resumed.status == 200 and resumed.stream is not None
        replayed = await resumed.stream.until_end()  # that stream is over: replay, then end
        assert [(e.id, e.message) for e in replayed] == [(e.id, e.message) for e in lost]
        assert [m["params"]["progress"] for m in messages(lost)[:-1]] == [3, 4]
        assert messages(lost)[-1]["id"] == "r"


async def test_resume_post_stream_dropped_midway(bridge: Any) -> None:
    """The client drops the connection while the call still runs, and resumes at once:
    it gets the rest (replayed or live), nothing twice, and the stream ends after the response."""
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        steps = 6
        reply = await c.post(tool_call("countdown", {"steps": steps, "interval_ms": 60}, 5, token="mid"))
        assert reply.stream is not None
        await reply.stream.wait_events(3)  # priming and two progress steps
        reply.stream.drop()
        before = list(reply.stream.events)
        assert not [m for m in messages(before) if "id" in m], "the call ended before the drop"

        resumed = await c.get(before[-1].id)
        assert resumed.status == 200 and resumed.stream is not None
        after = await resumed.stream.until_end(timeout=15)
        got = messages(before) + messages(after)
        progress = [m["params"]["progress"] for m in got if m.get("method") == "notifications/progress"]
        assert progress == list(range(1, steps + 1)), progress
        assert [m for m in got if "id" in m] == [got[-1]] and got[-1]["id"] == 5 and text_of(got[-1]) == "done"
        ids = [e.id for e in before + after if not e.priming]
        assert len(ids) == len(set(ids)), ids

        # And a call blocked on the client (sampling) survives a drop the same way.
        await c.initialize(capabilities={"sampling": {}})
        reply = await c.post(tool_call("sample", {"prompt": "p"}, 6))
        assert reply.stream is not None
        ask = await reply.stream.message()
        assert ask["method"] == "sampling/createMessage"
        reply.stream.drop()
        answer = {"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}}
        assert (await c.post(answer)).status == 202
        resumed = await c.get(reply.stream.events[-1].id)
        assert resumed.status == 200 and resumed.stream is not None
        rest = messages(await resumed.stream.until_end())
        assert [m.get("id") for m in rest] == [6] and text_of(rest[0]) == "ok", rest


async def test_resume_standalone_stream(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        first = await c.get()
        assert first.stream is not None
        for i in range(4):
            await say(c, f"m{i}")
        events = await first.stream.wait_events(4)
        assert logs_in(events) == ["m0", "m1", "m2", "m3"]
        # The client lost everything after m1, and then more came while nobody listened.
        first.stream.drop()
        for i in range(4, 6):
            await say(c, f"m{i}")

        resumed = await c.get(events[1].id)
        assert resumed.status == 200 and resumed.stream is not None
        got = [await next_log(resumed.stream) for _ in range(4)]
        assert got == ["m2", "m3", "m4", "m5"]
        assert [e.id for e in resumed.stream.events[:2]] == [events[2].id, events[3].id]
        # Then it carries on live, with nothing twice.
        await say(c, "m6")
        assert await next_log(resumed.stream) == "m6"
        assert logs_in(resumed.stream.events) == ["m2", "m3", "m4", "m5", "m6"]
        assert_clean(b)


async def test_priming_event(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c, RawStreamable(b.url("demo", "mcp")) as old:
        await c.initialize("2025-11-25")
        for payload, rid in ((tool_call("echo", {"text": "x"}, "e"), "e"), (request("ping", None, "p"), "p")):
            reply = await c.post(payload, accept=SSE_FIRST)
            assert reply.stream is not None
            events = await reply.stream.until_end()
            assert len(events) == 2, events
            prime, answer = events
            # First an event with an id and empty data, then the response.
            assert prime.priming and prime.id, prime
            assert not answer.priming and answer.message["id"] == rid
            assert prime.seq < answer.seq, f"the priming id {prime.id} is not before the response {answer.id}"
            # A client that only got the priming event resumes from it and gets everything after.
            resumed = await c.get(prime.id)
            assert resumed.status == 200 and resumed.stream is not None
            replayed = await resumed.stream.until_end()
            assert [(e.id, e.message) for e in replayed] == [(answer.id, answer.message)], (rid, replayed)

        # Older clients get no priming event (an empty message would confuse them).
        await old.initialize("2025-06-18")
        reply = await old.post(request("ping", None, 1), accept=SSE_FIRST)
        assert reply.stream is not None
        events = await reply.stream.until_end()
        assert [e.priming for e in events] == [False], events


# ------------------------------------------------------- security and metrics


ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"


async def test_tokens_and_session_ownership(bridge: Any) -> None:
    config = {
        **DEMO,
        "security": {"tokens": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}]},
    }
    async with bridge(config) as b:
        url = b.url("demo", "mcp")
        async with RawStreamable(url) as anon:
            reply = await anon.post(request("initialize", init_params(), 1), session=False)
            assert reply.status == 401, reply.text
            assert reply.headers.get("WWW-Authenticate", "").startswith("Bearer")
        async with RawStreamable(url, headers={"Authorization": "Bearer not-a-token-at-all"}) as wrong:
            assert (await wrong.post(request("initialize", init_params(), 1), session=False)).status == 401
        async with RawStreamable(url, headers={"Authorization": f"Bearer {ALICE}"}) as alice, RawStreamable(
            url, headers={"Authorization": f"Bearer {BOB}"}
        ) as bob:
            await alice.initialize()
            opened = await b.wait_for("session_opened", where=lambda e: e.get("session") == alice.session_id)
            assert opened["owner"] == "alice"
            # Bob knows Alice's session id: to him it does not exist.
            bob.session_id, bob.protocol_version = alice.session_id, alice.protocol_version
            assert (await bob.post(request("ping", None, 1))).status == 404
            assert (await bob.get()).status == 404
            assert (await bob.delete()).status == 404
            # Without a token, 401 before anything else.
            assert (await alice.post(request("ping", None, 1), headers={"Authorization": ""})).status == 401
            # Alice's session is untouched.
            response, _ = await alice.request("ping")
            assert response["result"] == {}
            assert (await alice.delete()).status in (200, 204)


async def test_origin_host_and_preflight(bridge: Any) -> None:
    allowed = "https://app.example.com"
    config = {**DEMO, "security": {"allowed_origins": [allowed]}}
    async with bridge(config) as b:
        url = b.url("demo", "mcp")
        async with RawStreamable(url) as c:
            reply = await c.post(request("initialize", init_params(), 1), session=False, headers={"Origin": "https://evil.example"})
            assert reply.status == 403, reply.text
            reply = await c.post(request("initialize", init_params(), 1), session=False, headers={"Host": "evil.example.com"})
            assert reply.status == 403, reply.text
            await c.initialize()
            assert (await c.get(headers={"Origin": "https://evil.example"})).status == 403
            assert (await c.delete(headers={"Origin": "https://evil.example"})).status == 403
            assert (await c.get(headers={"Host": "attacker.test:80"})).status == 403

            # The allowed origin: the preflight says what may be sent and what may be read.
            async with aiohttp.ClientSession() as http, http.options(
                url,
                headers={
                    "Origin": allowed,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type, mcp-session-id, mcp-protocol-version",
                },
            ) as resp:
                assert resp.status in (200, 204), await resp.text()
                assert resp.headers["Access-Control-Allow-Origin"] == allowed
                methods = {m.strip() for m in resp.headers["Access-Control-Allow-Methods"].split(",")}
                assert {"GET", "POST", "DELETE"} <= methods
                allow = {h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}
                assert {"mcp-session-id", "mcp-protocol-version", "last-event-id", "content-type"} <= allow
                exposed = {h.strip().lower() for h in resp.headers["Access-Control-Expose-Headers"].split(",")}
                assert "mcp-session-id" in exposed
            # And the real request from it is served, exposing the session id to the page.
            reply = await c.post(request("initialize", init_params(), 1), session=False, headers={"Origin": allowed}, accept=SSE_FIRST)
            assert reply.status == 200
            assert reply.headers["Access-Control-Allow-Origin"] == allowed
            assert "mcp-session-id" in reply.headers["Access-Control-Expose-Headers"].lower()
            assert reply.stream is not None
            await reply.stream.until_end()


async def test_metrics_count_streamable_sessions(bridge: Any) -> None:
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c1, RawStreamable(b.url("demo", "mcp")) as c2:
        async with RawSse(b.url("demo")) as sse:
            await sse.initialize()
            await c1.initialize()
            await c2.initialize()
            assert await metric(b, "mcp_bridge_sessions_open", server="demo", transport="streamable") == 2
            assert await metric(b, "mcp_bridge_sessions_open", server="demo", transport="sse") == 1
            assert await metric(b, "mcp_bridge_sessions_opened_total", server="demo", transport="streamable") == 2
            assert (await c1.delete()).status in (200, 204)
            assert await metric(b, "mcp_bridge_sessions_open", server="demo", transport="streamable") == 1
            assert await metric(b, "mcp_bridge_sessions_opened_total", server="demo", transport="streamable") == 2


# ----------------------------------------------------------------- side by side


async def test_sse_and_streamable_share_one_process(bridge: Any) -> None:
    async with bridge(FAULTY) as b, RawSse(b.url("f")) as sse, RawStreamable(b.url("f", "mcp")) as st:
        await sse.initialize(version="2024-11-05")
        await st.initialize("2025-11-25")
        # Same ids, at the same time: each gets its own answer.
        slow = {"ms": 200}
        status, _ = await sse.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": sse_call("slow", slow)})
        assert status == 202
        reply = await st.post(tool_call("slow", slow, 1))
        assert reply.stream is not None
        for who in range(3):
            status, _ = await sse.post({"jsonrpc": "2.0", "id": f"e{who}", "method": "tools/call", "params": sse_call("echo", {"text": f"sse {who}"})})
            assert status == 202
        st_echo = [await st.request("tools/call", {"name": "echo", "arguments": {"text": f"st {who}"}}, f"e{who}") for who in range(3)]
        assert [text_of(r) for r, _ in st_echo] == ["st 0", "st 1", "st 2"]
        assert [text_of(await sse.response(f"e{who}")) for who in range(3)] == ["sse 0", "sse 1", "sse 2"]
        response, before = await reply.stream.response(1)
        assert before == [] and text_of(response) == "slept"
        assert text_of(await sse.response(1)) == "slept"

        sse_pid = text_of(await sse.request("tools/call", sse_call("pid"), request_id="pid"))
        st_pid = text_of((await st.request("tools/call", {"name": "pid", "arguments": {}}, "pid"))[0])
        assert sse_pid == st_pid
        assert b.server_pids() == {int(st_pid)}
        # Nothing of the other's arrived: the SSE stream holds nothing more, as a ping shows.
        assert (await sse.request("ping", request_id="last")) == {"jsonrpc": "2.0", "id": "last", "result": {}}
        assert sse._held == [], sse._held


# ------------------------------------------------------------------- the SDK


@contextlib.asynccontextmanager
async def connect(
    url: str, *, name: str = "", sampling: Callable[[Client, types.CreateMessageRequestParams], str] | None = None
) -> AsyncIterator[Client]:
    """An initialized official-SDK session over Streamable HTTP, its traffic recorded (see tests/support/sdk.py)."""
    wire = Wire()
    holder: list[Client] = []

    async def on_sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        client = holder[0]
        client.sampled.append(params)
        assert sampling is not None
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=sampling(client, params)), model=f"model-{name}"
        )

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        if holder:
            holder[0].logs.append(params)

    async with streamable_http_client(url) as (read, write):
        async with ClientSession(
            _RecordingReader(read, wire),  # type: ignore[arg-type]
            _RecordingWriter(write, wire),  # type: ignore[arg-type]
            read_timeout_seconds=30,
            sampling_callback=on_sampling if sampling is not None else None,
            logging_callback=on_log,
        ) as session:
            client = Client(session, wire, None, name)  # type: ignore[arg-type]
            holder.append(client)
            client.init = await session.initialize()
            yield client


async def gather_sessions(url: str, n: int, body: Callable[[Client, int], Awaitable[Any]], **kwargs: Any) -> list[Any]:
    """`body(client, i)` in n concurrent SDK sessions, all connected before any body starts."""
    barrier = asyncio.Barrier(n)

    async def one(i: int) -> Any:
        async with connect(url, name=f"s{i}", **kwargs) as client:
            async with asyncio.timeout(30):
                await barrier.wait()
            return await body(client, i)

    async with asyncio.timeout(90), asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(i)) for i in range(n)]
    return [t.result() for t in tasks]


async def test_sdk_sessions_on_demo_server(bridge: Any) -> None:
    async with bridge(DEMO) as b:

        async def body(c: Client, i: int) -> Any:
            assert c.init.server_info.name == "mcp-bridge-demo"
            seen: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(progress)

            steps = 2 + i % 3
            # Several calls in flight at once in each session: several POST streams.
            echo, added, done = await asyncio.gather(
                c.session.call_tool("echo", {"text": f"session {i}"}),
                c.session.call_tool("add", {"a": i, "b": 1000}),
                c.session.call_tool("countdown", {"steps": steps, "interval_ms": 20}, progress_callback=on_progress),
            )
            assert sdk_text(echo) == f"session {i}"
            assert sdk_text(added) == str(i + 1000)
            assert sdk_text(done) == "done"
            assert seen == [float(s) for s in range(1, steps + 1)], (i, seen)
            assert sdk_text(await c.session.call_tool("sample", {"prompt": f"p{i}"})) == f"s{i} says p{i}"
            assert [prompt_text(p) for p in c.sampled] == [f"p{i}"]
            c.wire.check_own_traffic()
            return c.wire.sent_request_ids()

        ids = await gather_sessions(
            b.url("demo", "mcp"), N_SESSIONS, body, sampling=lambda c, p: f"{c.name} says {prompt_text(p)}"
        )
        # The SDK's default ids collide across sessions: that is the point.
        assert len(set.intersection(*(set(x) for x in ids))) >= 5, ids
        opened = [e for e in b.named("session_opened") if e.get("transport") == "streamable"]
        assert len(opened) == N_SESSIONS
        assert len(b.server_pids()) == 1
        assert_clean(b)


async def test_sdk_sessions_on_time_server(bridge: Any) -> None:
    async with bridge({"servers": {"time": TIME_SERVER}}) as b:

        async def body(c: Client, i: int) -> Any:
            assert c.init.server_info.name == "mcp-time"
            hhmm = f"{i:02d}:{(i * 7) % 60:02d}"
            result = json.loads(
                sdk_text(
                    await c.session.call_tool(
                        "convert_time", {"source_timezone": "UTC", "time": hhmm, "target_timezone": "UTC"}
                    )
                )
            )
            assert result["source"]["datetime"].split("T")[1].startswith(hhmm), (i, result)
            now = json.loads(sdk_text(await c.session.call_tool("get_current_time", {"timezone": "UTC"})))
            assert now["timezone"] == "UTC"
            c.wire.check_own_traffic()
            return c.wire.sent_request_ids()

        ids = await gather_sessions(b.url("time", "mcp"), N_SESSIONS, body)
        assert len(set.intersection(*(set(x) for x in ids))) >= 2, ids
        assert len(b.server_pids()) == 1
        assert_clean(b)


class _UnreadReply:
    """An http.Reply whose client reads nothing: all it is written stays unsent."""

    streaming = False
    gone = False

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.ended = False

    def open_stream(self, session_id: str | None, first: bytes = b"") -> _UnreadReply:
        self.streaming = True
        self.written.append(first)
        return self

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def unsent(self) -> int:
        return sum(map(len, self.written))

    def end_stream(self, last: bytes = b"") -> None:
        self.ended = True

    def watch(self, left: object) -> None:
        pass


def test_stream_bytes_bound_a_reader_and_the_backlog() -> None:
    """Past `queue_bytes` pending on a stream, or written to its reader and not taken by the
    socket, a session with a reader attached is too slow; with none, the oldest events go
    (they stay in the replay buffer) to keep within it."""
    message = b"m" * 300
    session = StreamableSession("s", None, queue_limit=1000, queue_bytes=1000, replay_bytes=1 << 20)
    stream = session.streams[STANDALONE]
    for _ in range(10):  # nobody reading: the newest 3 are kept
        assert session.deliver(message, None, False)
    assert len(stream.pending) == 3 and stream.pending_bytes == 900
    assert [seq for seq, _, _ in stream.pending] == [8, 9, 10]
    reply = _UnreadReply()
    session.resume(stream, reply, None)  # type: ignore[arg-type]
    assert not stream.pending and reply.unsent() > 900  # written at once, and not taken
    assert not session.deliver(message, None, False)  # a reader attached, and not keeping up
    reply.written.clear()  # the socket took it all
    assert session.deliver(message, None, False)
    session.flush()
    assert b"data: " + message in reply.written[-1] and not reply.ended


class _JsonReply(_UnreadReply):
    """An http.Reply for a POST that takes only JSON: records its whole answer."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: tuple[int, bytes] | None = None

    def whole(self, status: int, body: bytes, session_id: str | None = None) -> None:
        self.answer = (status, body)


def test_what_a_json_answer_does_not_carry_goes_to_the_standalone_stream_within_its_bounds() -> None:
    """A POST answered as one JSON body carries only its responses: the progress of its call
    goes to the standalone stream as it comes, within the same bounds as anything there (with
    no reader, the newest are kept), not into a backlog of its own."""
    message = b"p" * 300
    session = StreamableSession("s", None, queue_limit=1000, queue_bytes=1000, replay_bytes=1 << 20)
    post = session.open_post_stream(["c"])
    reply = _JsonReply()
    session.answer(post, reply, Form.JSON, False, None, Holds(), None)  # type: ignore[arg-type]
    for _ in range(50):
        assert session.deliver(message, "c", False)
        session.flush()
    standalone = session.streams[STANDALONE]
    assert not post.pending and standalone.pending_bytes <= 1000 and len(standalone.pending) == 3
    assert reply.answer is None
    assert session.deliver(b'{"id":"c"}', "c", True)
    session.flush()
    assert reply.answer == (200, b'{"id":"c"}')


async def test_a_get_cannot_take_over_a_post_answered_as_json(bridge: Any) -> None:
    """A GET naming the stream of a POST that is being answered as one JSON body is refused
    (409: there is no stream to resume), and the POST still gets its answer, whole."""
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        await c.initialize()
        get = await c.get()
        assert get.status == 200 and get.stream is not None
        post = asyncio.create_task(c.post(tool_call("countdown", {"steps": 3, "interval_ms": 100}, "j", token="tok-j"), accept=JSON_ONLY))
        first = await get.stream.message()  # its progress, on the standalone stream: the call is under way
        assert first["method"] == "notifications/progress" and first["params"]["progressToken"] == "tok-j", first
        refused = await c.get("p2_0")  # the POST's stream: initialize had p1
        assert refused.status == 409, (refused.status, refused.text)
        reply = await asyncio.wait_for(post, 10)
        assert (reply.status, reply.content_type) == (200, "application/json") and text_of(reply.json) == "done", reply


class _HeldReply(_JsonReply):
    """An http.Reply for a POST that takes either form: says when its stream opens."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def open_stream(self, session_id: str | None, first: bytes = b"") -> _HeldReply:
        super().open_stream(session_id, first)
        self.opened.set_result(None)
        return self


async def test_held_answers_share_one_timer_and_a_quick_answer_leaves_nothing_behind() -> None:
    """Of two answers held at once, the one whose response comes first is one JSON body at
    that delivery (nothing of it kept for a resume: no event of it was ever sent); the
    other opens its stream when the hold is over, with its priming event; then no timer is
    left, since nothing is held (the first answer's place in the holds, due later, goes too)."""
    session = StreamableSession("s", None, queue_limit=100, queue_bytes=1 << 20, replay_bytes=1 << 20)
    holds = Holds()
    quick, slow = session.open_post_stream(["q"]), session.open_post_stream(["s"])
    quick_reply, slow_reply = _HeldReply(), _HeldReply()
    session.answer(slow, slow_reply, Form.EITHER, False, 0, holds, None)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    halfway = loop.create_future()
    loop.call_later(HOLD_S / 2, halfway.set_result, None)
    await asyncio.wait_for(halfway, 1.0)
    # Held after the other, and answered at once: its place in the holds is due after the other's.
    session.answer(quick, quick_reply, Form.EITHER, False, 0, holds, None)  # type: ignore[arg-type]
    assert session.deliver(b'{"id":"q"}', "q", True)
    assert quick_reply.answer == (200, b'{"id":"q"}') and not quick_reply.streaming
    assert session.replay(quick.key, 0) == [] and session.replay(STANDALONE, 0) == []
    await asyncio.wait_for(slow_reply.opened, 1.0)
    assert slow_reply.answer is None and slow_reply.written == [b"id: %s_0\ndata: \n\n" % slow.key.encode()]
    assert holds._timer is None  # nothing held: nothing timed
    assert session.deliver(b'{"id":"s"}', "s", True)
    session.flush()
    assert slow_reply.ended and session.replay(slow.key, 0) == [(1, b'{"id":"s"}')]


async def test_a_request_id_in_flight_or_repeated_in_a_batch_is_refused_whole(bridge: Any) -> None:
    """Ids a POST would owe twice: 400 / -32600 before any of its body runs."""
    async with bridge(DEMO) as b, RawStreamable(b.url("demo", "mcp")) as c:
        # An initialize among them: refused before its session is opened, so none is left behind.
        initialize = request("initialize", init_params(), 0)
        reply = await c.post([initialize, request("tools/list", None, 0)], accept=JSON_ONLY, session=False, version=False)
        assert reply.status == 400 and SESSION not in reply.headers and "repeated" in reply.json["error"]["message"], reply.text
        await c.initialize()
        async with aiohttp.ClientSession() as http, http.get(b.base + "/metrics") as resp:
            assert 'mcp_bridge_sessions_open{server="demo",transport="streamable"} 1.0' in await resp.text()
        # Repeated within one batch: each answer would be owed to this POST under one id.
        reply = await c.post([tool_call("echo", {"text": "a"}, 5), tool_call("echo", {"text": "b"}, 5)], accept=JSON_ONLY)
        assert reply.status == 400, reply.text
        assert reply.json["error"]["code"] == -32600 and "repeated" in reply.json["error"]["message"], reply.text
        # In flight from an earlier POST (its progress shows it is): refused, naming the request.
        get = await c.get()
        assert get.status == 200 and get.stream is not None
        first = asyncio.create_task(c.post(tool_call("countdown", {"steps": 3, "interval_ms": 200}, 7, token="t7"), accept=JSON_ONLY))
        progress = await asyncio.wait_for(get.stream.message(), 10)
        assert progress["method"] == "notifications/progress" and progress["params"]["progressToken"] == "t7"
        again = await c.post(tool_call("echo", {"text": "c"}, 7), accept=JSON_ONLY)
        assert again.status == 400 and again.json["id"] == 7 and again.json["error"]["code"] == -32600, again.text
        done = await asyncio.wait_for(first, 10)
        assert done.status == 200 and done.json["id"] == 7 and text_of(done.json) == "done", done.text
        # Nothing of the refused batch was taken: id 5 is free.
        reply = await c.post(tool_call("echo", {"text": "d"}, 5), accept=JSON_ONLY)
        assert reply.status == 200 and text_of(reply.json) == "d", reply.text


async def test_a_session_whose_client_holds_a_stream_open_is_never_reaped_as_idle(bridge: Any) -> None:
    """limits.session_idle_timeout ends sessions nobody uses, counted from their client's last
    request: not one whose client holds a stream open (a Streamable GET stream, an HTTP+SSE
    session's stream), however long since it last sent anything."""
    async with bridge({"servers": {"demo": demo()}, "limits": {"session_idle_timeout": "1s"}}) as b:
        async with RawStreamable(b.url("demo", "mcp")) as streaming, RawSse(b.url("demo")) as sse, RawStreamable(b.url("demo", "mcp")) as idle:
            await streaming.initialize()
            get = await streaming.get()
            assert get.status == 200 and get.stream is not None
            await sse.initialize()
            await idle.initialize()  # last: the other two have been quiet longer
            await b.wait_for("session_closed", where=lambda e: e["session"] == idle.session_id and e["reason"] == "idle")
            reaped = [e["session"] for e in b.named("session_closed")]
            assert reaped == [idle.session_id], reaped
            response, _ = await streaming.request("tools/call", {"name": "echo", "arguments": {"text": "still here"}})
            assert text_of(response) == "still here"
            assert (await sse.request("tools/call", sse_call("echo", {"text": "here too"})))["result"]["content"][0]["text"] == "here too"


@pytest.mark.parametrize("path", ["fast", "aiohttp"])
async def test_an_initialize_answered_as_a_stream_names_its_session_on_either_path(bridge: Bridge, path: str) -> None:
    """A client that prefers the stream gets its initialize answered as one, with the new
    session's id in that stream's head (a chunked body goes by aiohttp's path)."""
    from test_modern import post
    from test_operations import INIT

    async with bridge({"servers": {"demo": demo()}}) as b:
        headers = {"Accept": "text/event-stream, application/json;q=0.5", "Content-Type": "application/json"}
        answer = await post(b.url("demo", "mcp"), INIT, headers, path)
        assert answer.status == 200 and answer.content_type == "text/event-stream", answer.body
        assert answer.final()["result"]["protocolVersion"] == "2025-06-18"
        assert answer.headers.get("Mcp-Session-Id"), dict(answer.headers)
        assert answer.headers["Cache-Control"] == "no-cache" and answer.headers["X-Accel-Buffering"] == "no"


@pytest.mark.parametrize("path", ["fast", "aiohttp"])
async def test_a_request_that_is_not_valid_json_rpc_is_refused_naming_its_id(bridge: Bridge, path: str) -> None:
    """400 / -32600 with the request's id when it can be read, so the client can tell which
    of its requests was refused; nothing of it reaches the server."""
    from test_modern import post
    from test_operations import INIT

    async with bridge({"servers": {"demo": demo()}}) as b:
        url = b.url("demo", "mcp")
        plain = {"Accept": "application/json", "Content-Type": "application/json"}
        opened = await post(url, INIT, plain, path)
        session = {**plain, "Mcp-Session-Id": opened.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-06-18"}
        bad = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": ["not", "an", "object"]}
        refused = await post(url, bad, session, path)
        assert refused.status == 400, refused.body
        assert refused.json()["id"] == 7 and refused.json()["error"]["code"] == -32600, refused.body


async def test_a_post_without_accept_is_answered_as_one_json_body(bridge: Bridge) -> None:
    """No Accept says any form will do: the one that needs no stream (not a 406)."""
    from test_operations import INIT, raw_answer, raw_request

    async with bridge({"servers": {"demo": demo()}}) as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        try:
            writer.write(raw_request("POST", "/servers/demo/mcp", json.dumps(INIT).encode(), "Content-Type: application/json"))
            status, headers, body = await raw_answer(reader)
        finally:
            writer.close()
        assert status == 200 and headers["content-type"].startswith("application/json"), (status, body)
        assert json.loads(body)["result"]["protocolVersion"] == "2025-06-18"


async def test_a_session_whose_initialize_the_server_refuses_is_not_kept(bridge: Bridge) -> None:
    """Per session, the client's own initialize reaches its server; refused there, the
    session it would have opened is gone: its id is unknown and nothing is left open."""
    from test_modern import post
    from test_operations import INIT

    config = {"servers": {"f": {**faulty(FAULTY_INIT_ERROR="1"), "mode": "per-session"}}}
    async with bridge(config) as b:
        plain = {"Accept": "application/json", "Content-Type": "application/json"}
        refused = await post(b.url("f", "mcp"), INIT, plain)
        assert refused.json()["error"]["code"] == -32602, refused.body
        session_id = refused.headers.get("Mcp-Session-Id")
        if session_id is not None:
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            again = await post(b.url("f", "mcp"), ping, {**plain, "Mcp-Session-Id": session_id})
            assert again.status == 404, again.body
        closed = await b.wait_for("session_closed")
        assert closed["reason"] == "initialize failed"


async def test_a_stream_under_way_outlives_the_idle_timeout(bridge: Bridge) -> None:
    """keepalive_timeout closes idle connections; one whose answer is still streaming is busy."""
    from test_modern import post
    from test_operations import INIT

    config = {"servers": {"demo": demo()}, "limits": {"keepalive_timeout": "1s"}}
    async with bridge(config) as b:
        plain = {"Accept": "application/json", "Content-Type": "application/json"}
        opened = await post(b.url("demo", "mcp"), INIT, plain)
        session = {**plain, "Accept": "text/event-stream", "Mcp-Session-Id": opened.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-06-18"}
        slow = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "countdown", "arguments": {"steps": 5, "interval_ms": 500}}}
        answer = await post(b.url("demo", "mcp"), slow, session)  # 2.5 s of stream, 0.5 s between events
        assert answer.status == 200 and answer.final()["result"]["content"][0]["text"] == "done", answer.body
