"""The message-POST fast path (bridge/http/fastpath.py) on the wire against a real daemon:
keep-alive, pipelining, requests cut into pieces, a connection handed to aiohttp in the
middle, and every error answered the same way on both paths. Its head parser, which is
pure, is checked against aiohttp's in tests/unit/test_fastpath_head.py."""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import StreamReader
from aiohttp.base_protocol import BaseProtocol
from aiohttp.test_utils import make_mocked_request
from support.daemon import Bridge, demo, faulty
from support.rawclient import RawSse, call

from bridge.http.body import read_message
from bridge.http.errors import HttpError
from bridge.protocol.jsonrpc import MAX_DEPTH

SID = "0123456789abcdef0123456789abcdef"


# ------------------------------------------------------------------ on the wire


class Wire:
    """One raw TCP connection to the daemon: write bytes, read whole HTTP/1.1 responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        async with asyncio.timeout(timeout):
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            if headers.get("transfer-encoding") == "chunked":
                body = b""
                while size := int((await self.reader.readuntil(b"\r\n"))[:-2], 16):
                    body += (await self.reader.readexactly(size + 2))[:-2]
                await self.reader.readexactly(2)
            else:
                body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body

    async def closed(self, timeout: float = 10.0) -> bool:
        async with asyncio.timeout(timeout):
            return await self.reader.read() == b""


@pytest.fixture
async def daemon(bridge: Any) -> AsyncIterator[Bridge]:
    async with bridge({"servers": {"demo": demo()}, "limits": {"max_message_bytes": 4096}}) as b:
        yield b


async def _wire(b: Bridge) -> AsyncIterator[Wire]:
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    try:
        yield Wire(reader, writer)
    finally:
        writer.close()


def post(session: str, body: bytes, *extra: str, server: str = "demo") -> bytes:
    head = [f"POST /servers/{server}/messages?session_id={session} HTTP/1.1", "Host: 127.0.0.1", *extra]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in extra):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def echo(n: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": call("echo", {"text": f"t{n}"})}).encode()


async def _session(b: Bridge) -> RawSse:
    client = RawSse(b.url("demo"))
    await client.__aenter__()
    await client.initialize()
    return client


async def _answered(client: RawSse, n: int) -> None:
    reply = await client.response(n)
    assert reply["result"]["content"][0]["text"] == f"t{n}", reply


async def test_keep_alive_pipelining_and_split_requests(daemon: Bridge) -> None:
    client = await _session(daemon)
    try:
        async for wire in _wire(daemon):
            for n in (1, 2):  # one request after the other on one connection
                await wire.send(post(client.session_id, echo(n)))
                assert (await wire.response())[0] == 202
            await wire.send(b"".join(post(client.session_id, echo(n)) for n in (3, 4, 5)))  # pipelined
            assert [(await wire.response())[0] for _ in range(3)] == [202, 202, 202]
            for byte in post(client.session_id, echo(6)):  # one byte per write
                await wire.send(bytes([byte]))
            status, headers, body = await wire.response()
            assert (status, body, headers["content-type"]) == (202, b"Accepted", "text/plain; charset=utf-8")
            for n in range(1, 7):
                await _answered(client, n)
    finally:
        await client.close()


async def test_connection_handed_to_aiohttp_mid_stream(daemon: Bridge) -> None:
    """A fast POST, then requests aiohttp serves (GET, a chunked POST), then a POST again,
    all in one write: answered in order, and the chunked body's message is routed."""
    client = await _session(daemon)
    try:
        async for wire in _wire(daemon):
            body = echo(2)
            chunked = post(client.session_id, b"", "Transfer-Encoding: chunked")
            chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            await wire.send(
                post(client.session_id, echo(1))
                + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                + chunked
                + post(client.session_id, echo(3))
            )
            first, health, second, third = [await wire.response() for _ in range(4)]
            assert first[0] == 202 and second[0] == 202 and third[0] == 202
            assert (health[0], json.loads(health[2])) == (200, {"status": "alive"})
            for n in (1, 2, 3):
                await _answered(client, n)
    finally:
        await client.close()


async def test_over_the_limit_is_refused_before_the_body(daemon: Bridge) -> None:
    client = await _session(daemon)
    try:
        async for wire in _wire(daemon):
            await wire.send(post(client.session_id, b"", "Content-Length: 5000"))  # no body sent
            status, headers, body = await wire.response()
            assert status == 413 and headers["connection"] == "close"
            assert json.loads(body)["error"]["message"] == "body of 5000 bytes is over the limit of 4096"
            assert await wire.closed()
        async for wire in _wire(daemon):
            await wire.send(post(client.session_id, echo(1), "Connection: close"))
            status, headers, _ = await wire.response()
            assert (status, headers["connection"]) == (202, "close")
            assert await wire.closed()
        await _answered(client, 1)
    finally:
        await client.close()


CASES = {
    "unknown session": ("nope", echo(1), "demo"),
    "unknown server": (None, echo(1), "other"),
    "not json": (None, b"{", "demo"),
    "not json-rpc": (None, b'{"jsonrpc": "1.0"}', "demo"),
    "empty batch": (None, b"[]", "demo"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_errors_are_the_same_on_both_paths(daemon: Bridge, case: str) -> None:
    client = await _session(daemon)
    session, body, server = CASES[case]
    session = session or client.session_id
    try:
        answers = []
        async for wire in _wire(daemon):
            await wire.send(post(session, body, server=server))  # the fast path
            fast = await wire.response()
            chunked = post(session, b"", "Transfer-Encoding: chunked", server=server)
            await wire.send(chunked + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))  # aiohttp
            slow = await wire.response()
            answers = [(status, json.loads(text)) for status, _, text in (fast, slow)]
            await wire.send(post(client.session_id, echo(7)))  # the connection is still good
            assert (await wire.response())[0] == 202
        assert answers[0] == answers[1], answers
        assert 400 <= answers[0][0] < 500 and answers[0][1]["error"]["message"], answers
        await _answered(client, 7)
    finally:
        await client.close()


async def test_tokens_origins_and_cors(bridge: Any) -> None:
    config = {
        "servers": {"demo": demo(), "other": demo()},
        "security": {
            "tokens": [{"name": "t", "token": "secret-token-1234567890abcdef", "servers": ["demo"]}],
            "allowed_origins": ["https://app.example.com"],
        },
    }
    auth = "Authorization: Bearer secret-token-1234567890abcdef"
    async with bridge(config) as b:
        client = RawSse(b.url("demo"), headers={"Authorization": auth.split(": ")[1]})
        await client.__aenter__()
        try:
            await client.initialize()
            sid = client.session_id
            expected = [
                (post(sid, echo(1)), 401),
                (post(sid, echo(1), "Authorization: Bearer wrong-token-000000000000000"), 401),
                (post(sid, echo(1), auth, server="other"), 403),
                (post(sid, echo(1), auth, "Origin: https://evil.example.com"), 403),
            ]
            for request, status in expected:
                async for wire in _wire(b):
                    await wire.send(request)
                    got, headers, body = await wire.response()
                    assert got == status, (request, got, body)
                    assert json.loads(body)["error"]["message"]
                    if status == 401:
                        assert headers["www-authenticate"] == 'Bearer realm="mcp-bridge"'
            async for wire in _wire(b):
                await wire.send(post(sid, echo(2), auth, "Origin: https://app.example.com"))
                status, headers, _ = await wire.response()
                assert status == 202
                assert headers["access-control-allow-origin"] == "https://app.example.com"
                assert headers["vary"] == "Origin"
            await _answered(client, 2)
            rejected = [e["reason"] for e in b.named("request_rejected")]
            assert rejected == ["missing token", "invalid token", "token not allowed for server 'other'", "origin not allowed"]
        finally:
            await client.close()


async def test_http10_stream_gets_unchunked_events(daemon: Bridge) -> None:
    """Events are written to the socket directly; an HTTP/1.0 stream has no chunked framing."""
    async for wire in _wire(daemon):
        await wire.send(b"GET /servers/demo/sse HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        async with asyncio.timeout(10):
            head = await wire.reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
            endpoint = (await wire.reader.readuntil(b"\n\n")).decode()
        assert endpoint.startswith("event: endpoint\ndata: /servers/demo/messages?session_id=")
        session = endpoint.rstrip("\n").rsplit("=", 1)[1]
        async for poster in _wire(daemon):
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
            for body in (json.dumps(init).encode(), b'{"jsonrpc":"2.0","method":"notifications/initialized"}', echo(1)):
                await poster.send(post(session, body))
                assert (await poster.response())[0] == 202
        events = []
        async with asyncio.timeout(10):
            while len(events) < 2:
                events.append((await wire.reader.readuntil(b"\n\n")).decode())
        assert all(e.startswith("event: message\ndata: {") for e in events), events
        assert json.loads(events[1].split("data: ", 1)[1])["result"]["content"][0]["text"] == "t1"


SSE_FIRST = "text/event-stream, application/json;q=0.9"


def mcp_post(body: bytes, *extra: str, accept: str = "application/json, text/event-stream", server: str = "demo") -> bytes:
    head = [f"POST /servers/{server}/mcp HTTP/1.1", "Host: 127.0.0.1", f"Accept: {accept}", *extra]
    if not any(h.lower().startswith("transfer-encoding") for h in extra):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _mcp_session(wire: Wire) -> str:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
    await wire.send(mcp_post(json.dumps(init).encode(), accept="application/json"))
    status, headers, body = await wire.response()
    assert status == 200 and json.loads(body)["result"]["protocolVersion"] == "2025-06-18", body
    session = headers["mcp-session-id"]
    await wire.send(mcp_post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', f"Mcp-Session-Id: {session}"))
    assert (await wire.response())[0] == 202
    return session


async def test_streamable_post_holds_the_connection_until_its_stream_ends(daemon: Bridge) -> None:
    async for wire in _wire(daemon):
        session = await _mcp_session(wire)
        sid = f"Mcp-Session-Id: {session}"
        ping = b'{"jsonrpc":"2.0","id":"p","method":"ping"}'
        await wire.send(mcp_post(echo(1), sid, accept=SSE_FIRST) + mcp_post(ping, sid, accept="application/json"))  # pipelined
        status, headers, body = await wire.response()
        assert (status, headers["content-type"], headers["transfer-encoding"]) == (200, "text/event-stream", "chunked")
        events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
        assert [e["result"]["content"][0]["text"] for e in events] == ["t1"]
        status, _, body = await wire.response()
        assert (status, json.loads(body)) == (200, {"jsonrpc": "2.0", "id": "p", "result": {}})


MCP_CASES = {
    "no session header": (None, echo(1), ()),
    "unknown session": ("nope", echo(1), ()),
    "unsupported version": ("", echo(1), ("MCP-Protocol-Version: 1999-01-01",)),
    "empty batch": ("", b"[]", ()),
    "not json": ("", b"{", ()),
}


@pytest.mark.parametrize("case", sorted(MCP_CASES))
async def test_streamable_errors_are_the_same_on_both_paths(daemon: Bridge, case: str) -> None:
    async for wire in _wire(daemon):
        session, body, extra = MCP_CASES[case]
        real = await _mcp_session(wire)
        headers = (*extra, f"Mcp-Session-Id: {session or real}") if session is not None else extra
        await wire.send(mcp_post(body, *headers))  # the fast path
        fast = await wire.response()
        await wire.send(mcp_post(b"", *headers, "Transfer-Encoding: chunked") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        slow = await wire.response()  # aiohttp
        answers = [(status, json.loads(text)) for status, _, text in (fast, slow)]
        assert answers[0] == answers[1], answers
        assert 400 <= answers[0][0] < 500 and answers[0][1]["error"]["message"], answers


# ------------------------------------------------------------------ found in review


@pytest.mark.parametrize(
    "shape",
    ["many headers", "long value", "long target", "NUL in target", "LF in target", "DEL in target", "fragment"],
)
async def test_heads_aiohttp_refuses_are_left_to_it(daemon: Bridge, shape: str) -> None:
    """Whatever the fast path cannot vouch for goes to aiohttp, which refuses it with a 400."""
    client = await _session(daemon)
    try:
        sid = client.session_id
        extra: tuple[str, ...] = ()
        target = f"/servers/demo/messages?session_id={sid}"
        if shape == "many headers":
            extra = tuple(f"X-A{i}: b" for i in range(200))
        elif shape == "long value":
            extra = ("X-A: " + "b" * 20_000,)
        elif shape == "long target":
            target += "&x=" + "y" * 20_000
        elif shape == "fragment":
            target += "#f"
        else:
            target += {"NUL in target": "&x=\x00", "LF in target": "&x=\n", "DEL in target": "&x=\x7f"}[shape]
        head = [f"POST {target} HTTP/1.1", "Host: 127.0.0.1", *extra, f"Content-Length: {len(echo(1))}"]
        async for wire in _wire(daemon):
            await wire.send(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + echo(1))
            status = (await wire.response())[0]
        assert status in (202, 400, 404, 431) and (status == 202) == (shape == "fragment"), status
    finally:
        await client.close()


async def test_a_refused_body_is_read_and_dropped_before_closing(daemon: Bridge) -> None:
    """Closing with the body unread would reset the connection under a client still sending
    it, and a reset can destroy the 413 on its way: the rest is read and dropped first."""
    client = await _session(daemon)
    try:
        async for wire in _wire(daemon):
            wire.writer.write(post(client.session_id, b"x" * 300_000))  # over the limit of 4096
            await wire.writer.drain()  # the whole body gets through: no reset
            status, headers, _ = await wire.response()
            assert (status, headers["connection"]) == (413, "close")
            assert await wire.closed()
    finally:
        await client.close()


async def test_a_large_refused_body_is_not_read_whole(bridge: Any) -> None:
    """A request refused before its body (here 401: no token) that declares a body larger than
    what is worth reading to keep the connection is answered at once, with Connection: close,
    and the connection closes: the client never has to send, nor the bridge to take in, the
    megabytes it declared (on either message endpoint)."""
    config = {"servers": {"demo": demo()}, "limits": {"max_message_bytes": "8MiB"}, "security": {"tokens": [{"name": "a", "token": "a" * 32}]}}
    async with bridge(config) as b:
        for endpoint in ("mcp", f"messages?session_id={SID}"):
            async for wire in _wire(b):
                head = f"POST /servers/demo/{endpoint} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {4 << 20}\r\n\r\n"
                await wire.send(head.encode() + b"{" + b" " * 1023)  # 1 KiB of the 4 MiB declared, and no more
                try:
                    status, headers, body = await wire.response(timeout=5)
                except TimeoutError:
                    raise AssertionError(f"{endpoint}: no answer until the declared body is all sent") from None
                assert (status, headers["connection"]) == (401, "close"), (status, headers)
                assert json.loads(body)["error"]["code"] == -32600
                assert await wire.closed(timeout=5)


async def test_x_forwarded_fields_from_a_trusted_proxy_are_read_as_on_aiohttps_path(bridge: Any) -> None:
    """Behind a trusted proxy, the resource URL a 401 points a client to (RFC 9728) is the one
    the proxy's X-Forwarded-Proto, -Host and -Prefix say the client sees, on the fast path as on
    aiohttp's (a chunked body); from a proxy not trusted, they change nothing."""
    oauth = {"authorization_servers": [{"issuer": "http://127.0.0.1:9/realms/x", "jwks_uri": "http://127.0.0.1:9/jwks"}], "scopes": {"mcp:all": ["*"]}}
    for trusted, resource in (("127.0.0.0/8", "https://mcp.example.com/bridge"), ("10.0.0.0/8", None)):
        config = {"listen": {"host": "127.0.0.1", "port": 0, "trusted_proxies": [trusted]}, "servers": {"demo": demo()}, "security": {"oauth": oauth}}
        async with bridge(config) as b:
            expected = f'Bearer resource_metadata="{resource or b.base}/.well-known/oauth-protected-resource/servers/demo/mcp", scope="mcp:all"'
            head = "POST /servers/demo/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: mcp.example.com\r\nX-Forwarded-Prefix: /bridge/\r\n"
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
            async for wire in _wire(b):
                await wire.send(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
                fast = await wire.response()
                await wire.send(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                slow = await wire.response()
            for status, headers, _ in (fast, slow):
                assert (status, headers["www-authenticate"]) == (401, expected), (trusted, status, headers)


async def test_a_head_sent_byte_by_byte_is_not_activity(bridge: Any) -> None:
    config = {"servers": {"demo": demo()}, "limits": {"keepalive_timeout": "1s"}}
    async with bridge(config) as b:
        async for wire in _wire(b):
            await wire.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")
            start = asyncio.get_running_loop().time()
            closed = False
            for _ in range(40):  # at most 8 s, one byte every 0.2 s
                try:
                    await wire.send(b"a")
                    closed = await asyncio.wait_for(wire.reader.read(), 0.2) == b""
                except TimeoutError:
                    continue
                except ConnectionError:
                    closed = True
                if closed:
                    break
            assert closed and asyncio.get_running_loop().time() - start < 4
        async for wire in _wire(b):  # a connection in use is kept
            for _ in range(3):
                await wire.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert (await wire.response())[0] == 200


async def test_a_streamed_answer_to_connection_close_says_so_once_and_closes(daemon: Bridge) -> None:
    async for wire in _wire(daemon):
        session = await _mcp_session(wire)
        await wire.send(mcp_post(echo(1), f"Mcp-Session-Id: {session}", "Connection: close"))
        async with asyncio.timeout(10):
            head = (await wire.reader.readuntil(b"\r\n\r\n")).decode().lower()
        assert head.count("\r\nconnection:") == 1 and "\r\nconnection: close\r\n" in head, head
        assert b'"t1"' in await asyncio.wait_for(wire.reader.read(), 10)  # the stream, then the close


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\nHost: 127.0.0.1\n\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\n\n",
        b"POST /servers/demo/messages?session_id=x HTTP/1.1\nHost: 127.0.0.1\nContent-Length: 2\n\n{}",
        b"POST /servers/demo/mcp HTTP/1.1\r\nHost: 127.0.0.1\nContent-Length: 2\r\n\r\n{}",
    ],
)
async def test_a_head_with_bare_lf_is_answered_at_once(daemon: Bridge, head: bytes) -> None:
    """Such a head never has the CRLF CRLF the fast path waits for: aiohttp refuses it with a 400
    at once, rather than the idle timeout (75 s) closing the connection."""
    async for wire in _wire(daemon):
        await wire.send(head)
        status, _, body = await wire.response()  # within the 10 s Wire allows
        assert status == 400, body


@pytest.mark.parametrize(
    ("accept", "answer"),
    [
        # Both as much: the bridge's choice, one JSON body for an answer there within HOLD_S.
        ("application/json, text/event-stream", "application/json"),
        ("application/json, text/event-stream;q=0", "application/json"),
        ("application/json;q=0.5, text/event-stream;q=0.9", "text/event-stream"),
        ("application/json, text/event-stream;q=0.5", "application/json"),
        ("*/*", "application/json"),
        ("text/*, application/json;q=0", "text/event-stream"),
        ("text/html", 406),
        ("application/json;q=0, text/event-stream;q=0", 406),
        ("application/jsonl, text/event-streamer", 406),
    ],
)
async def test_accept_decides_a_posts_answer_the_same_on_both_paths(daemon: Bridge, accept: str, answer: str | int) -> None:
    async for wire in _wire(daemon):
        sid = f"Mcp-Session-Id: {await _mcp_session(wire)}"
        got = []
        for n, chunked in ((1, False), (2, True)):  # the fast path, then aiohttp
            body = echo(n)
            if chunked:
                await wire.send(mcp_post(b"", sid, "Transfer-Encoding: chunked", accept=accept) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            else:
                await wire.send(mcp_post(body, sid, accept=accept))
            status, headers, text = await wire.response()
            got.append((status, headers["content-type"], json.loads(text) if status != 200 else None))
        assert got[0] == got[1], got
        status, content_type, error = got[0]
        if answer == 406:
            assert status == 406 and error["error"]["message"] == "POST needs Accept: application/json or text/event-stream"
        else:
            assert (status, content_type) == (200, answer), got


async def test_a_compressed_body_is_read_as_aiohttp_reads_it(daemon: Bridge) -> None:
    """aiohttp decompresses a body that says it is compressed; the fast path does not, so such
    a request is aiohttp's (it was parsed raw: -32700)."""
    async for wire in _wire(daemon):
        sid = f"Mcp-Session-Id: {await _mcp_session(wire)}"
        answers = []
        for n, extra in ((1, ()), (2, ("Content-Encoding: gzip",))):
            await wire.send(mcp_post(gzip.compress(echo(n)) if extra else echo(n), sid, *extra, accept="application/json"))
            status, _, text = await wire.response()
            answers.append((status, json.loads(text)))
        assert [status for status, _ in answers] == [200, 200], answers
        assert [reply["result"]["content"][0]["text"] for _, reply in answers] == ["t1", "t2"], answers


async def test_a_compressed_body_over_the_limit_once_decompressed_is_refused(daemon: Bridge) -> None:
    """A small body that decompresses to far more than limits.max_message_bytes (4 KiB here) is
    refused as over the limit, and the connection's next request is served."""
    bomb = gzip.compress(b"[" + b" " * (2 << 20) + b"]")  # 2 MiB from about 2 KiB
    assert len(bomb) < 4096  # declared small enough to be read at all
    async for wire in _wire(daemon):
        sid = f"Mcp-Session-Id: {await _mcp_session(wire)}"
        await wire.send(mcp_post(bomb, sid, "Content-Encoding: gzip"))
        status, _, text = await wire.response()
        assert status == 413 and "over the limit" in json.loads(text)["error"]["message"], (status, text)
        await wire.send(mcp_post(echo(3), sid, accept="application/json"))
        status, _, text = await wire.response()
        assert status == 200 and json.loads(text)["result"]["content"][0]["text"] == "t3", (status, text)


def _raw_deflate(body: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(body) + packer.flush()


_BOMB = gzip.compress(b"[" + b" " * (2 << 20) + b"]")  # 2 MiB from about 2 KiB
_NOT_OURS = "unsupported Content-Encoding {!r}: a body may be gzip or deflate"
# Every way a compressed body can fail, with its answer: (Content-Encoding, body, status, code, message).
UNDECODABLE = [
    ("gzip", b'{"not": "gzip"}', 400, -32700, "body does not decode as gzip: incorrect header check"),
    ("deflate", b"\x78\x9c not deflate", 400, -32700, "body does not decode as deflate: invalid stored block lengths"),
    ("deflate", b"\xff\xff not deflate", 400, -32700, "body does not decode as deflate: invalid block type"),
    ("gzip", gzip.compress(echo(9))[:-6], 400, -32700, "body does not decode as gzip: it ends before its compressed data does"),
    ("deflate", zlib.compress(echo(9))[:-3], 400, -32700, "body does not decode as deflate: it ends before its compressed data does"),
    ("gzip", b"", 400, -32700, "body does not decode as gzip: it ends before its compressed data does"),
    ("gzip", gzip.compress(echo(9)) + b"junk", 400, -32700, "body does not decode as gzip: data after its end (incorrect header check)"),
    ("deflate", zlib.compress(echo(9)) + b"junk", 400, -32700, "body does not decode as deflate: data after its end"),
    ("gzip", gzip.compress(b"[]") * 65, 400, -32700, "body does not decode as gzip: more than 64 gzip members"),
    ("br", b"\x0b\x02\x80{}\x03", 415, -32600, _NOT_OURS.format("br")),
    ("zstd", b"(\xb5/\xfd\x00\x00", 415, -32600, _NOT_OURS.format("zstd")),
    ("compress", echo(9), 415, -32600, _NOT_OURS.format("compress")),  # never taken as plain JSON
    ("gzip, gzip", gzip.compress(gzip.compress(echo(9))), 415, -32600, _NOT_OURS.format("gzip, gzip")),
    ("gzip, identity, br", b"x", 415, -32600, _NOT_OURS.format("gzip, br")),
    ("gzip", _BOMB, 413, -32600, "body is over the limit of 4096 bytes once decompressed"),
]
# Codings that decode: (Content-Encoding, how the body is encoded).
DECODED: list[tuple[str, Any]] = [
    ("gzip", gzip.compress),
    ("X-GZIP", gzip.compress),
    ("deflate", zlib.compress),
    ("deflate", _raw_deflate),  # without zlib's header, as some clients send it
    ("gzip", lambda body: gzip.compress(body[:10]) + gzip.compress(body[10:])),  # two members
    ("identity", lambda body: body),
    ("", lambda body: body),
]


def _framed(request: bytes, chunked: bool) -> bytes:
    """`request` (built with a Content-Length) as it is, or with its body sent chunked."""
    head, _, body = request.partition(b"\r\n\r\n")
    if not chunked:
        return request
    head = b"\r\n".join(line for line in head.split(b"\r\n") if not line.lower().startswith(b"content-length"))
    return head + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"


@pytest.mark.parametrize("endpoint", ["mcp", "messages"])
async def test_every_compressed_body_gets_its_answer_and_the_connection_goes_on(daemon: Bridge, endpoint: str) -> None:
    """Both message endpoints, with a Content-Length (which the fast path hands to aiohttp) and
    chunked: a body that does not decode is a 400 (-32700) with the reason, a coding the bridge
    does not decode a 415 offering those it does, a bomb a 413; no 500 and nothing logged as an
    error (aiohttp decoded these itself: a 500 and two tracebacks, an unknown coding read as
    plain JSON, a truncated one taken). Each connection goes on to serve its next request."""
    sse = await _session(daemon) if endpoint == "messages" else None
    try:
        async for wire in _wire(daemon):
            if sse is None:
                sid = f"Mcp-Session-Id: {await _mcp_session(wire)}"

                def request(body: bytes, *extra: str) -> bytes:
                    return mcp_post(body, sid, *extra, accept="application/json")
            else:
                session = sse.session_id

                def request(body: bytes, *extra: str) -> bytes:
                    return post(session, body, *extra)

            n = 10

            async def served() -> None:
                nonlocal n
                n += 1
                await wire.send(request(echo(n)))
                status, _, text = await wire.response()
                if sse is None:
                    assert status == 200 and json.loads(text)["result"]["content"][0]["text"] == f"t{n}", (status, text)
                else:
                    assert status == 202, (status, text)
                    await _answered(sse, n)

            for chunked in (False, True):
                for coding, body, status, code, message in UNDECODABLE:
                    await wire.send(_framed(request(body, f"Content-Encoding: {coding}"), chunked))
                    got, headers, text = await wire.response()
                    error = json.loads(text)["error"]
                    assert (got, error["code"], error["message"]) == (status, code, message), (coding, chunked, got, text)
                    assert headers.get("accept-encoding") == ("gzip, deflate" if status == 415 else None), headers
                    await served()
                # A compressed body over the limit as sent, with no length to refuse it by.
                wide = gzip.compress(bytes(range(256)) * 32, compresslevel=0)
                await wire.send(_framed(request(wide, "Content-Encoding: gzip"), chunked))
                got, _, text = await wire.response()
                error = json.loads(text)["error"]
                limit = "over the limit of 4096 bytes" if chunked else f"body of {len(wide)} bytes is over the limit of 4096"
                assert (got, error["code"]) == (413, -32600) and error["message"].endswith(limit), text
                if chunked:
                    await served()
                for coding, encode in DECODED:
                    n += 1
                    await wire.send(_framed(request(encode(echo(n)), f"Content-Encoding: {coding}"), chunked))
                    status, _, text = await wire.response()
                    if sse is None:
                        assert status == 200 and json.loads(text)["result"]["content"][0]["text"] == f"t{n}", (coding, status, text)
                    else:
                        assert status == 202, (coding, status, text)
                        await _answered(sse, n)
    finally:
        if sse is not None:
            await sse.__aexit__(None, None, None)
    assert [e for e in daemon.events if e.get("level") in ("error", "critical")] == []
    assert daemon.named("Unhandled exception") == [] and daemon.named("internal_error") == []


async def test_a_compressed_bomb_is_refused_having_decompressed_no_more_than_the_limit() -> None:
    """A 64 MiB bomb from 64 KiB, under a 64 KiB limit: refused 413 with little more than the
    limit ever decompressed (aiohttp's own decoding went on to decompress the rest)."""
    limit = 64 << 10
    bomb = gzip.compress(bytes(64 << 20))
    assert len(bomb) < limit
    reader = StreamReader(BaseProtocol(asyncio.get_running_loop()), 2**16)
    reader.feed_data(bomb)
    reader.feed_eof()
    request = make_mocked_request("POST", "/servers/demo/mcp", headers={"Content-Encoding": "gzip"}, payload=reader)
    gateway: Any = SimpleNamespace(limits=SimpleNamespace(max_message_bytes=limit), metrics=SimpleNamespace(bytes_in=0))
    tracemalloc.start()
    try:
        with pytest.raises(HttpError) as refused:
            await read_message(request, gateway)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (refused.value.status, refused.value.message) == (413, f"body is over the limit of {limit} bytes once decompressed")
    assert peak < 4 * limit, peak


async def test_a_notification_post_is_answered_the_same_on_both_paths(daemon: Bridge) -> None:
    async for wire in _wire(daemon):
        sid = f"Mcp-Session-Id: {await _mcp_session(wire)}"
        body = json.dumps({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}).encode()
        await wire.send(mcp_post(body, sid))  # the fast path
        fast = await wire.response()
        await wire.send(mcp_post(b"", sid, "Transfer-Encoding: chunked") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        slow = await wire.response()  # aiohttp
        answers = [(status, headers.get("content-type"), headers.get("mcp-session-id"), text) for status, headers, text in (fast, slow)]
        assert answers[0] == answers[1] and answers[0][0] == 202 and answers[0][3] in ("", b""), answers


@pytest.mark.parametrize(("accept", "status"), [("text/event-stream;q=0", 406), ("application/json", 406), ("text/*", 200), ("*/*;q=0.1", 200)])
async def test_accept_decides_a_get(daemon: Bridge, accept: str, status: int) -> None:
    async for wire in _wire(daemon):
        sid = await _mcp_session(wire)
        await wire.send(f"GET /servers/demo/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nMcp-Session-Id: {sid}\r\nAccept: {accept}\r\n\r\n".encode())
        async with asyncio.timeout(10):
            head = (await wire.reader.readuntil(b"\r\n\r\n")).decode()
        assert head.startswith(f"HTTP/1.1 {status} "), head


async def test_refusals_while_draining_are_the_same_on_both_paths(bridge: Any) -> None:
    """While it drains, a new Streamable session is refused the same way by both paths
    (503, Retry-After, one JSON-RPC error body); the stream of the call being drained ends."""
    config = {"servers": {"f": faulty()}, "limits": {"drain_timeout": "3s"}}
    init = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                       "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}).encode()  # fmt: skip
    hang = json.dumps({"jsonrpc": "2.0", "id": "h", "method": "tools/call", "params": call("hang")}).encode()
    async with bridge(config) as b:
        async for wire in _wire(b):
            await wire.send(mcp_post(init, accept="application/json", server="f"))
            status, headers, _ = await wire.response()
            assert status == 200
            sid = f"Mcp-Session-Id: {headers['mcp-session-id']}"
            mark = len(b.events)
            async for streaming in _wire(b):
                await streaming.send(mcp_post(hang, sid, server="f"))
                await b.wait_for("server_stderr", where=lambda e: e.get("line", "").startswith("faulty: hang "), start=mark)
                b.proc.send_signal(signal.SIGTERM)
                await b.wait_for("draining", start=mark)
                answers = []
                for chunked in (False, True):  # the fast path, then aiohttp
                    if chunked:
                        request = mcp_post(b"", "Transfer-Encoding: chunked", accept="application/json", server="f")
                        request += b"%x\r\n%s\r\n0\r\n\r\n" % (len(init), init)
                    else:
                        request = mcp_post(init, accept="application/json", server="f")
                    await wire.send(request)
                    status, headers, body = await wire.response()
                    answers.append((status, headers.get("retry-after"), headers["content-type"], json.loads(body)))
                assert answers[0] == answers[1], answers
                assert answers[0][:2] == (503, "5") and "shutting down" in answers[0][3]["error"]["message"], answers
                status, headers, body = await streaming.response(timeout=15)  # the stream ends, with its error
                assert status == 200 and b"-32003" in body, body


@pytest.mark.parametrize("route", ["messages", "mcp"])
async def test_a_client_gone_during_expect_continue_is_not_an_error(daemon: Bridge, route: str) -> None:
    """`Expect` goes to aiohttp. A client that sent its whole request and left at once used
    to get a 100 Continue written to its closing transport: the write raised, the request
    was dropped and logged as an error with a traceback (found in review). Now nothing is
    written to it, the call runs (and is audited) and nothing is logged as an error."""
    client = await _session(daemon)
    try:
        if route == "messages":
            data = post(client.session_id, echo(7), "Expect: 100-continue")
        else:
            async for wire in _wire(daemon):
                session = await _mcp_session(wire)
            data = mcp_post(echo(7), f"Mcp-Session-Id: {session}", "Expect: 100-continue")
        start = len(daemon.events)
        _, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
        writer.write(data)
        await writer.drain()
        writer.transport.abort()
        await daemon.wait_for("audit", where=lambda e: e.get("name") == "echo", start=start)
        errors = [e for e in daemon.events[start:] if e.get("level") in ("error", "critical")]
        assert errors == [], errors
    finally:
        await client.close()


async def test_an_unknown_expectation_is_417_with_a_json_rpc_error(daemon: Bridge) -> None:
    async for wire in _wire(daemon):
        await wire.send(mcp_post(echo(1), "Expect: something-else"))
        status, headers, body = await wire.response()
    assert status == 417 and headers["content-type"].startswith("application/json"), (status, headers)
    assert "something-else" in json.loads(body)["error"]["message"], body


async def test_a_body_nested_past_the_bound_is_refused_on_both_paths(daemon: Bridge) -> None:
    """A request nested deeper than jsonrpc.MAX_DEPTH is a 400 / -32700 naming the bound, on
    the fast path (plain) and on aiohttp's (compressed), before anything of it is taken (it
    was a 500 at 976 deep: decoded, then unencodable after the mux had taken the call); the
    connection and the session go on."""
    depth = MAX_DEPTH + 1
    deep = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":' + b"[" * depth + b"]" * depth + b"}}}"
    async for wire in _wire(daemon):
        sid = f"Mcp-Session-Id: {await _mcp_session(wire)}"
        for body, extra in ((deep, ()), (gzip.compress(deep), ("Content-Encoding: gzip",))):
            await wire.send(mcp_post(body, sid, *extra, accept="application/json"))
            status, _, text = await wire.response()
            error = json.loads(text)["error"]
            assert (status, error["code"], error["message"]) == (400, -32700, f"parse error: JSON nested deeper than {MAX_DEPTH}"), (status, text)
        await wire.send(mcp_post(echo(4), sid, accept="application/json"))
        status, _, text = await wire.response()
        assert status == 200 and json.loads(text)["result"]["content"][0]["text"] == "t4", (status, text)
