"""The 2024-11-05 HTTP+SSE transport, end to end: a real daemon, real processes, real sockets.

Every wait is on a log event or a message, bounded by a timeout; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import pytest
from support.daemon import Bridge, faulty
from support.rawclient import RawSse, call

from bridge.http.endpoints.sse_2024 import SseSession

SESSION_ID = re.compile(r"^[0-9a-f]{32,}$")


def stderr_note(prefix: str) -> Any:
    """A `where=` filter for the faulty server's stderr notes (see tests/servers/faulty.py)."""
    return lambda e: e.get("line", "").startswith(f"faulty: {prefix}")


def note_json(event: dict[str, Any], prefix: str) -> Any:
    return json.loads(event["line"][len(f"faulty: {prefix}") :])


async def read_event(resp: aiohttp.ClientResponse, timeout: float = 5.0) -> dict[str, str]:
    """The next SSE event, read straight off the wire: its fields (`data` lines joined)."""
    fields: dict[str, str] = {}
    async with asyncio.timeout(timeout):
        while True:
            raw = await resp.content.readline()
            assert raw, "stream ended"
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if fields:
                    return fields
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = f"{fields[name]}\n{value}" if name == "data" and name in fields else value


async def ready(b: Bridge, server: str = "f") -> dict[str, Any]:
    """Open a session and initialize it: once answered, the shared process is up and initialized."""
    async with RawSse(b.url(server)) as c:
        return await c.initialize()


# --------------------------------------------------------------------------- the stream


async def test_endpoint_goes_through_the_proxy_prefix(bridge: Any) -> None:
    """Behind a proxy that mounts the bridge under a path, the endpoint keeps that path;
    a prefix that is not a plain path is ignored."""
    async with bridge({"servers": {"f": faulty()}}) as b, aiohttp.ClientSession() as http:
        for sent, expected in [("/mcp/bridge/", "/mcp/bridge/servers/f/messages?"), ("/x y", "/servers/f/messages?"), ("https://evil", "/servers/f/messages?")]:
            async with http.get(b.url("f"), headers={"X-Forwarded-Prefix": sent}) as resp:
                fields = await read_event(resp)
                assert fields["data"].startswith(expected), (sent, fields)


async def test_endpoint_event_first_and_headers(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, aiohttp.ClientSession() as http:
        async with http.get(b.url("f")) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].split(";")[0].strip() == "text/event-stream"
            assert resp.headers["Cache-Control"] == "no-cache"
            assert resp.headers["X-Accel-Buffering"] == "no"
            fields = await read_event(resp)
            assert fields.get("event") == "endpoint", fields
            endpoint = fields["data"]
            # An absolute path on this server, with the session id in the query.
            prefix = "/servers/f/messages?session_id="
            assert endpoint.startswith(prefix), endpoint
            session_id = endpoint[len(prefix) :]
            assert SESSION_ID.match(session_id), session_id
            opened = await b.wait_for("session_opened", where=lambda e: e.get("session") == session_id)
            assert opened["server"] == "f"

            # A POST there answers 202 and the reply is an `event: message` on this stream.
            async with http.post(b.base + endpoint, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}) as post:
                assert post.status == 202
            fields = await read_event(resp)
            assert fields.get("event") == "message", fields
            assert json.loads(fields["data"]) == {"jsonrpc": "2.0", "id": 1, "result": {}}

        # Another stream is another session.
        async with RawSse(b.url("f")) as c1, RawSse(b.url("f")) as c2:
            assert c1.session_id != c2.session_id
            assert session_id not in (c1.session_id, c2.session_id)


async def test_keepalive_comments(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}, "sse": {"keepalive": "1s"}}) as b, aiohttp.ClientSession() as http:
        async with http.get(b.url("f")) as resp:
            assert (await read_event(resp)).get("event") == "endpoint"
            # Nothing else is sent on this stream, so only keepalives can arrive; two
            # of them within 3.5 s means they are periodic at about the configured 1 s.
            seen: list[str] = []
            async with asyncio.timeout(3.5):
                while len(seen) < 2:
                    raw = await resp.content.readline()
                    assert raw, "stream ended"
                    line = raw.decode().rstrip("\r\n")
                    if line.startswith(":"):
                        seen.append(line)
                    else:
                        assert line == "", f"unexpected line on an idle stream: {line!r}"


# ------------------------------------------------------------------------------ POST


async def test_post_accepted_and_answered(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        status, _ = await c.post({"jsonrpc": "2.0", "id": "e", "method": "tools/call", "params": call("echo", {"text": "hi"})})
        assert status == 202
        reply = await c.response("e")
        assert reply == {"jsonrpc": "2.0", "id": "e", "result": {"content": [{"type": "text", "text": "hi"}]}}


async def test_unknown_server_404(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c, aiohttp.ClientSession() as http:
        async with http.get(b.url("nope")) as resp:
            assert resp.status == 404
        # A real session id of another server does not make an unknown server known.
        url = f"{b.base}/servers/nope/messages?session_id={c.session_id}"
        async with http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}) as resp:
            assert resp.status == 404
        assert all(e["server"] == "f" for e in b.named("session_opened"))


async def test_unknown_session_404(bridge: Any) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c, aiohttp.ClientSession() as http:
        base = f"{b.base}/servers/f/messages"
        for url in (f"{base}?session_id={'0' * 32}", f"{base}?session_id=", base, f"{base}?session_id={c.session_id}x"):
            async with http.post(url, json=ping) as resp:
                assert resp.status == 404, url
        # The real one still works, and saw none of the above.
        assert await c.request("ping", request_id=2) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        assert not c._held


async def test_closed_stream_ends_session(bridge: Any) -> None:
    """Closing the stream ends the session: its in-flight call is cancelled upstream, it is
    logged as closed, and its POST URL is gone."""
    async with bridge({"servers": {"f": faulty()}}) as b:
        c = RawSse(b.url("f"))
        await c.__aenter__()
        try:
            await c.initialize()
            mark = len(b.events)
            status, _ = await c.post({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": call("hang")})
            assert status == 202
            hang = await b.wait_for("server_stderr", where=stderr_note("hang "), start=mark)
            upstream_id = note_json(hang, "hang ")
            endpoint, session_id = c.endpoint, c.session_id
        finally:
            await c.close()

        closed = await b.wait_for("session_closed", where=lambda e: e.get("session") == session_id)
        assert closed["server"] == "f"
        cancelled = await b.wait_for(
            "server_stderr", where=stderr_note("notification notifications/cancelled "), start=mark
        )
        params = note_json(cancelled, "notification notifications/cancelled ")
        assert params["requestId"] == upstream_id, (params, upstream_id)
        assert cancelled["pid"] == hang["pid"]

        async with aiohttp.ClientSession() as http:
            async with http.post(endpoint, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}) as resp:
                assert resp.status == 404
            async with http.get(f"{b.base}/status") as resp:
                assert (await resp.json())["servers"]["f"]["sessions"] == 0


# ---------------------------------------------------------------------- bad bodies


async def test_body_not_json_400(bridge: Any) -> None:
    bodies = [b"{", b"not json at all", b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', b"", b"\xff\xfe"]
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        for body in bodies:
            status, text = await c.post(None, raw=body)
            assert status == 400, (body, status, text)
            reply = json.loads(text)
            assert reply["jsonrpc"] == "2.0" and reply["id"] is None, (body, reply)
            assert reply["error"]["code"] == -32700, (body, reply)
            message = reply["error"]["message"]
            assert message and "\n" not in message and "\r" not in message, (body, message)
        # Bad input changes nothing for the session.
        assert (await c.request("ping", request_id=1))["result"] == {}


INVALID_REQUESTS: list[tuple[str, Any]] = [
    ("missing jsonrpc", {"id": 1, "method": "ping"}),
    ("wrong jsonrpc", {"jsonrpc": "1.0", "id": 1, "method": "ping"}),
    ("method not a string", {"jsonrpc": "2.0", "id": 1, "method": 42}),
    ("method null", {"jsonrpc": "2.0", "id": 1, "method": None}),
    ("id true", {"jsonrpc": "2.0", "id": True, "method": "ping"}),
    ("id 1.5", {"jsonrpc": "2.0", "id": 1.5, "method": "ping"}),
    ("id null", {"jsonrpc": "2.0", "id": None, "method": "ping"}),
    ("id object", {"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}),
    ("id array", {"jsonrpc": "2.0", "id": [1], "method": "ping"}),
    ("params array", {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1, 2]}),
    ("params string", {"jsonrpc": "2.0", "method": "notifications/initialized", "params": "x"}),
    ("empty batch", []),
    ("not an object", 42),
    ("string", "ping"),
    ("batch with a bad member", [{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"id": 2, "method": "ping"}]),
    ("response without result or error", {"jsonrpc": "2.0", "id": 1}),
]


async def test_not_jsonrpc_400(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        wrong = []
        for label, body in INVALID_REQUESTS:
            status, text = await c.post(body)
            try:
                reply = json.loads(text)
                code, message = reply["error"]["code"], reply["error"]["message"]
            except (ValueError, KeyError, TypeError):
                wrong.append((label, status, text))
                continue
            if status != 400 or code != -32600 or not message or "\n" in message:
                wrong.append((label, status, text))
        assert not wrong, "\n".join(map(repr, wrong))
        # None of them reached the stream (a valid member of a rejected batch included),
        # and the session still works.
        assert await c.request("ping", request_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}
        assert not c._held, c._held


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_over_limit_413(bridge: Any, chunked: bool) -> None:
    limit = 64 * 1024
    async with bridge({"servers": {"f": faulty()}, "limits": {"max_message_bytes": "64KiB"}}) as b, RawSse(b.url("f")) as c:
        # Just under the limit is fine.
        text = "y" * (limit - 200)
        small = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("echo", {"text": text})}
        assert len(json.dumps(small)) <= limit
        status, _ = await c.post(small)
        assert status == 202
        assert (await c.response(1))["result"]["content"][0]["text"] == text

        big = json.dumps(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call("echo", {"text": "z" * (limit + 10)})}
        ).encode()
        assert c._http is not None
        if chunked:

            async def body() -> Any:
                for i in range(0, len(big), 8192):
                    yield big[i : i + 8192]

            data: Any = body()
        else:
            data = big
        async with c._http.post(c.endpoint, data=data, headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 413, (resp.status, await resp.text())
        # The session survives, and the oversized request was never forwarded.
        assert (await c.request("ping", request_id=3))["result"] == {}
        assert not c._held, c._held


# ----------------------------------------------------------------------- requests


async def test_batch_of_requests(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        batch = [
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("echo", {"text": "one"})},
            {"jsonrpc": "2.0", "id": "two", "method": "tools/call", "params": call("echo", {"text": "two"})},
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": 1}},
            {"jsonrpc": "2.0", "id": 3, "method": "ping"},
            {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
        ]
        status, text = await c.post(batch)
        assert status == 202, text
        assert (await c.response(1))["result"]["content"][0]["text"] == "one"
        assert (await c.response("two"))["result"]["content"][0]["text"] == "two"
        assert (await c.response(3))["result"] == {}
        tools = {t["name"] for t in (await c.response(4))["result"]["tools"]}
        assert {"echo", "crash", "hang"} <= tools
        assert not c._held, c._held


async def test_reused_inflight_id(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        mark = len(b.events)
        status, _ = await c.post({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": call("slow", {"ms": 1500})})
        assert status == 202
        await b.wait_for("server_stderr", where=stderr_note("slow "), start=mark)  # in flight upstream

        status, _ = await c.post({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": call("echo", {"text": "dup"})})
        assert status == 202
        dup = await c.response(5, timeout=1.0)  # at once, long before the slow call ends
        assert dup["error"]["code"] == -32600, dup
        assert "result" not in dup

        first = await c.response(5, timeout=5.0)
        assert first == {"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text", "text": "slept"}]}}
        # The rejected echo never ran; once finished, the id is free again.
        assert not c._held, c._held
        reuse = await c.request("tools/call", call("echo", {"text": "again"}), request_id=5)
        assert reuse["result"]["content"][0]["text"] == "again"


async def test_two_sessions_same_ids_isolated(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as a, RawSse(b.url("f")) as z:
        await asyncio.gather(a.initialize(), z.initialize())

        async def post_echo(c: RawSse, text: str) -> None:
            status, body = await c.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("echo", {"text": text})})
            assert status == 202, (status, body)

        async def answer(c: RawSse, label: str) -> str:
            try:
                reply = await c.response(1, timeout=3.0)
            except TimeoutError:
                raise AssertionError(f"session {label} got no response to its id 1; a={a._held} z={z._held}") from None
            return reply["result"]["content"][0]["text"]

        for i in range(40):
            want_a, want_z = f"a-{i}", f"z-{i}-" + "q" * i
            await asyncio.gather(post_echo(a, want_a), post_echo(z, want_z))
            got = await asyncio.gather(answer(a, "a"), answer(z, "z"))
            assert got == [want_a, want_z], (i, got)

        # A slow id 1 in one session while the other reuses id 1 again and again.
        status, _ = await a.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("slow", {"ms": 400})})
        assert status == 202
        for i in range(10):
            await post_echo(z, f"fast-{i}")
            assert await answer(z, "z") == f"fast-{i}"
        assert await answer(a, "a") == "slept"
        # Nothing else arrived anywhere.
        for c in (a, z):
            assert await c.request("ping", request_id="end") == {"jsonrpc": "2.0", "id": "end", "result": {}}
        assert not a._held and not z._held, (a._held, z._held)


async def test_ping_answered_by_bridge(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        # Before and after initialize.
        assert await c.request("ping", request_id="p0") == {"jsonrpc": "2.0", "id": "p0", "result": {}}
        await c.initialize()
        assert await c.request("ping", request_id=0) == {"jsonrpc": "2.0", "id": 0, "result": {}}
        # Answered by the bridge: the process never saw them (stderr is one ordered pipe,
        # so a ping note would come before this marker).
        mark = len(b.events)
        assert (await c.request("tools/call", call("noise", {"lines": 1}), request_id=1))["result"]
        marker = await b.wait_for("server_stderr", where=lambda e: e["line"].startswith("noise 0:"), start=mark)
        upto = b.events[: b.events.index(marker)]
        assert not [e for e in upto if e.get("event") == "server_stderr" and stderr_note("ping ")(e)]


async def test_initialize_from_cache_and_version_negotiation(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as old, RawSse(b.url("f")) as odd:
        reply = await old.initialize(version="2024-11-05")
        result = reply["result"]
        assert result["protocolVersion"] == "2024-11-05"
        assert result["serverInfo"] == {"name": "faulty", "version": "1.0.0"}
        assert "tools" in result["capabilities"]

        # The bridge's own initialize is the only one the process saw, and what it answered
        # is what a client with a version nobody knows is told.
        bridge_init = await b.wait_for("server_stderr", where=stderr_note("initialize "))
        upstream = note_json(bridge_init, "initialize ")
        assert upstream["client"] == "mcp-bridge", upstream
        reply = await odd.initialize(version="1999-01-01")
        assert reply["result"]["protocolVersion"] == upstream["answered"], (reply, upstream)
        assert reply["result"]["serverInfo"] == {"name": "faulty", "version": "1.0.0"}

        # Ordering marker: stderr is one pipe, so had a client's initialize reached the
        # process, its note would be logged before this tool's output.
        mark = len(b.events)
        assert (await old.request("tools/call", call("noise", {"lines": 1}), request_id=2))["result"]
        marker = await b.wait_for("server_stderr", where=lambda e: e["line"].startswith("noise 0:"), start=mark)
        upto = b.events[: b.events.index(marker)]
        inits = [e for e in upto if e.get("event") == "server_stderr" and stderr_note("initialize ")(e)]
        assert len(inits) == 1, inits
        # The clients' notifications/initialized were absorbed, too: only the bridge's arrived.
        initialized = [e for e in upto if e.get("event") == "server_stderr" and stderr_note("notification notifications/initialized")(e)]
        assert len(initialized) == 1, initialized


# --------------------------------------------------------------------- health


async def test_health_ready_status(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty(), "g": faulty()}}) as b, aiohttp.ClientSession() as http:
        async with http.get(f"{b.base}/healthz") as resp:
            assert resp.status == 200
        await ready(b, "f")
        await ready(b, "g")
        async with http.get(f"{b.base}/readyz") as resp:
            assert resp.status == 200, await resp.text()

        async with RawSse(b.url("f")) as c1, RawSse(b.url("f")) as c2:
            await c1.initialize()
            pid = int((await c1.request("tools/call", call("pid"), request_id=1))["result"]["content"][0]["text"])
            async with http.get(f"{b.base}/status") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("application/json")
                status = await resp.json()
            assert set(status["servers"]) == {"f", "g"}
            f = status["servers"]["f"]
            assert f["mode"] == "shared"
            assert f["sessions"] == 2
            assert len(f["processes"]) == 1
            proc = f["processes"][0]
            assert proc["pid"] == pid
            assert proc["restarts"] == 0
            assert status["servers"]["g"]["sessions"] == 0
            assert status["servers"]["g"]["processes"][0]["pid"] not in (None, pid)
            assert c2.session_id


class _Socket:
    """A transport whose unsent bytes the test decides: what the kernel has not taken yet."""

    def __init__(self) -> None:
        self.unsent = 0
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data
        self.unsent += len(data)

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def is_closing(self) -> bool:
        return False


def test_only_events_the_socket_has_not_taken_count_as_queued() -> None:
    """Found in review: a client reading steadily, whose socket is never quite empty when
    the next event comes, was counted as one more event behind each time, and dropped."""
    session = SseSession("s", None, queue_limit=4, queue_bytes=1 << 20)
    sock = _Socket()
    session.attach(sock, chunked=True)  # type: ignore[arg-type]
    for n in range(50):
        assert session.deliver(b'{"n": %d}' % n, None, False), n
        session.flush()
        sock.unsent = 5  # the kernel took all but the tail of the last write
    for _ in range(3):  # the client stops reading: with the last one, 4 are queued
        assert session.deliver(b"{}", None, False)
        session.flush()
    assert not session.deliver(b"{}", None, False)  # a fifth: too slow
    assert sock.written.count(b"event: message") == 53


def test_bytes_the_socket_has_not_taken_count_too() -> None:
    """Past `queue_bytes` not yet taken by the socket (however few events that is), the client is too slow."""
    session = SseSession("s", None, queue_limit=1000, queue_bytes=1000)
    sock = _Socket()
    session.attach(sock, chunked=True)  # type: ignore[arg-type]
    message = b'{"x": "%s"}' % (b"y" * 290)  # 300 bytes
    for _ in range(20):  # taken as fast as it comes: never behind
        assert session.deliver(message, None, False)
        session.flush()
        sock.unsent = 0
    for n in range(3):  # the client stops reading: 3 x 300 bytes and their framing are under 1000
        assert session.deliver(message, None, False), n
        session.flush()
    assert not session.deliver(message, None, False)  # a fourth: over 1000 bytes behind


async def test_a_post_names_only_an_http_sse_session(bridge: Bridge) -> None:
    """A Streamable session's id on the HTTP+SSE messages endpoint is an unknown session."""
    from test_modern import post
    from test_operations import INIT

    async with bridge({"servers": {"f": faulty()}}) as b:
        opened = await post(b.url("f", "mcp"), INIT, {"Accept": "application/json", "Content-Type": "application/json"})
        streamable_id = opened.headers["Mcp-Session-Id"]
        async with aiohttp.ClientSession() as http:
            url = f"{b.base}/servers/f/messages?session_id={streamable_id}"
            async with http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}) as resp:
                assert resp.status == 404, await resp.text()


async def test_a_post_whose_session_ends_while_its_body_arrives_is_refused(bridge: Bridge) -> None:
    """The fast path finds the session from the head; if it ends before the body is in (its
    stream closed, an administrator), the POST is refused as for an unknown session, and
    nothing of it is routed."""
    from test_operations import raw_answer, raw_request

    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        body = json.dumps({"jsonrpc": "2.0", "id": "late", "method": "tools/call", "params": call("echo", {"text": "x"})}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        try:
            request = raw_request("POST", f"/servers/f/messages?session_id={c.session_id}", body, "Content-Type: application/json")
            writer.write(request[: len(request) - len(body) // 2])  # the head and half the body
            await writer.drain()
            async with aiohttp.ClientSession() as http, http.delete(f"{b.base}/admin/sessions/{c.session_id}") as resp:
                assert resp.status == 200, await resp.text()
            writer.write(request[len(request) - len(body) // 2 :])
            status, _, answer = await raw_answer(reader)
            assert status == 404 and json.loads(answer)["error"]["message"] == "unknown session", answer
        finally:
            writer.close()
