"""Three real daemons on loopback sharing a peer key: any replica takes any request.

Each replica advertises its own 127.0.0.1 port; a session opened on one is
used through the others, which forward to its owner (transports/forward.py).
Killed replicas are SIGKILLed for real, and their server processes reaped by
the test. Every wait is on an event, a message or a stream's end, bounded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import os
import re
import signal
import socket
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
import test_modern as modern
from multidict import CIMultiDict
from support.daemon import Bridge, demo, faulty, pid_alive, run_bridge
from support.rawclient import RawSse
from support.rawstreamable import JSON_ONLY, SESSION, RawStreamable, text_of, tool_call

from bridge.core.cluster import EPOCH_HEADER, FORWARDED_HEADER, Cluster, Owner
from bridge.core.request_state import State, StateKeys
from bridge.http.forward import OWNER_GONE

KEY = "replicas-test-peer-key-0123456789abcdef"
DEMO = {"servers": {"demo": demo()}}
KILLED = -signal.SIGKILL
OWNER_GONE_WITHIN_S = 1.0
RESTARTED = "unknown session: the replica that owned it has restarted since; start a new session"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def replica(
    tmp_path: Path, port: int, config: dict[str, Any] | None = None, expect_exit: int = 0, advertise: int | None = None
) -> contextlib.AbstractAsyncContextManager[Bridge]:
    """One replica on `port`, advertising it (or `advertise`: a port in front of it); its own
    directory, so that replicas never share a config file."""
    home = tmp_path / f"r{port}"
    home.mkdir(parents=True, exist_ok=True)
    cfg = {**(config or DEMO), "cluster": {"peer_key": KEY}}
    return run_bridge(home, cfg, "--port", str(port), "--advertise", f"127.0.0.1:{advertise or port}", expect_exit=expect_exit)


@contextlib.asynccontextmanager
async def replicas(tmp_path: Path, n: int = 3, config: dict[str, Any] | None = None, killed: tuple[int, ...] = ()) -> AsyncIterator[list[Bridge]]:
    """`n` replicas; those at the indexes in `killed` are expected to end by SIGKILL."""
    async with contextlib.AsyncExitStack() as stack:
        started = await asyncio.gather(
            *(stack.enter_async_context(replica(tmp_path, free_port(), config, KILLED if i in killed else 0)) for i in range(n))
        )
        yield list(started)


async def kill(b: Bridge) -> None:
    """SIGKILL a replica, as a node failure would; its server processes are killed and waited for too."""
    pids = b.server_pids()
    b.proc.send_signal(signal.SIGKILL)
    await b.proc.wait()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    async with asyncio.timeout(5):
        while any(pid_alive(pid) for pid in pids):
            await asyncio.sleep(0.01)


def mcp(b: Bridge) -> str:
    return b.url("demo", "mcp")


async def forwarded_count(b: Bridge, outcome: str, headers: dict[str, str] | None = None) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{b.base}/metrics", headers=headers) as resp:
        assert resp.status == 200, resp.status
        text = await resp.text()
    line = f'mcp_bridge_forwarded_requests_total{{outcome="{outcome}"}} '
    return next(float(row[len(line) :]) for row in text.splitlines() if row.startswith(line))


class Decoy:
    """A listener that only counts the connections it is offered, and closes them."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Decoy:
        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


class Relay:
    """A loopback hop that keeps every byte sent through it: piped on to `upstream` (a
    replica's port), or, with none, answered with `answer` after each request's head and body.
    At most `limit` connections; later ones are closed at once."""

    def __init__(self, upstream: int | None = None, answer: bytes = b"", limit: int = 8) -> None:
        self.upstream, self.answer, self.limit = upstream, answer, limit
        self.received = bytearray()
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    def heads(self) -> list[tuple[bytes, CIMultiDict[str]]]:
        """Each request head that went through: its request line and its fields, in order."""
        found = []
        for line, block in re.findall(rb"((?:POST|GET|DELETE) \S+ HTTP/1\.1)\r\n(.*?)\r\n\r\n", bytes(self.received), re.S):
            fields = CIMultiDict((k.strip(), v.strip()) for k, _, v in (f.decode("latin-1").partition(":") for f in block.split(b"\r\n")))
            found.append((line, fields))
        return found

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        if self.connections > self.limit:
            writer.close()
            return
        if self.upstream is None:
            await self._answer(reader, writer)
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers.append(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer, keep=True), self._pipe(up_reader, writer, keep=False))

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, keep: bool) -> None:
        try:
            while data := await source.read(1 << 16):
                if keep:
                    self.received += data
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.received += head
                length = re.search(rb"\r\ncontent-length:\s*(\d+)", head, re.I)
                self.received += await reader.readexactly(int(length[1]) if length else 0)
                writer.write(self.answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


# ------------------------------------------------------------------ sessions


async def test_sse_session_posts_through_the_other_replicas(tmp_path: Path) -> None:
    async with replicas(tmp_path) as (a, b, c), RawSse(a.url("demo")) as client:
        assert client.session_id.startswith(Cluster(f"127.0.0.1:{a.port}", KEY).new_id(None).split(".")[0] + ".")
        for n, via in enumerate((b, c, a, b)):
            client.endpoint = f"{via.base}/servers/demo/messages?session_id={client.session_id}"
            if n == 0:
                await client.initialize()
            reply = await client.request("tools/call", {"name": "echo", "arguments": {"text": f"via {via.port}"}}, request_id=n + 1)
            assert reply["result"]["content"][0]["text"] == f"via {via.port}"
        assert await forwarded_count(b, "forwarded") >= 3 and await forwarded_count(c, "forwarded") >= 1


async def test_streamable_session_used_through_each_replica(tmp_path: Path) -> None:
    """Opened on one; JSON and stream answers, its GET stream, a server request answered,
    and DELETE, each through a different replica."""
    async with replicas(tmp_path) as (a, b, c), RawStreamable(mcp(a)) as client:
        await client.initialize(capabilities={"sampling": {}})
        client.url = mcp(b)
        reply = await client.post(tool_call("add", {"a": 2, "b": 3}, 1), accept=JSON_ONLY)
        assert reply.status == 200 and reply.content_type == "application/json" and text_of(reply.json) == "5"
        assert reply.headers[SESSION] == client.session_id

        client.url = mcp(c)
        streamed = await client.post(tool_call("countdown", {"steps": 3, "interval_ms": 10}, 2, token="t"))
        assert streamed.stream is not None
        response, before = await streamed.stream.response(2)
        assert text_of(response) == "done" and [m["params"]["progress"] for m in before] == [1, 2, 3]

        client.url = mcp(b)
        get = await client.get()
        assert get.status == 200 and get.stream is not None
        client.url = mcp(a)
        await client.request("tools/call", {"name": "log", "arguments": {"level": "info", "message": "to all"}})
        assert (await get.stream.message())["params"]["data"] == "to all"

        client.url = mcp(c)
        asked = await client.post(tool_call("sample", {"prompt": "2+2?"}, "s"))
        assert asked.stream is not None
        ask = await asked.stream.message()
        assert ask["method"] == "sampling/createMessage"
        client.url = mcp(b)
        answer = {"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "4"}, "model": "m"}}
        assert (await client.post(answer)).status == 202
        response, _ = await asked.stream.response("s")
        assert text_of(response) == "4"

        client.url = mcp(c)
        assert (await client.delete()).status == 204
        await get.stream.until_end()  # the session's GET stream, through b, ends with it
        for via in (a, b, c):
            client.url = mcp(via)
            gone = await client.post(tool_call("echo", {"text": "x"}, 9))
            assert gone.status == 404, (via.port, gone.status, gone.text)


async def test_a_compressed_body_is_forwarded_as_sent_and_read_by_the_owner(tmp_path: Path) -> None:
    """A compressed body for another replica's session, on both message endpoints, is relayed
    as the client sent it and decoded, or refused with its reason, by the owner. It was
    decompressed by the forwarder and sent on under its Content-Encoding and compressed
    length: the owner answered 500 to a good body, and a bad one read as the owner gone."""
    bomb = gzip.compress(bytes(8 << 20))  # 8 KiB that grow past the default 4 MiB limit
    async with replicas(tmp_path, n=2) as (a, b), RawStreamable(mcp(a)) as client, RawSse(a.url("demo")) as sse:
        await client.initialize()
        await sse.initialize()
        sse.endpoint = f"{b.base}/servers/demo/messages?session_id={sse.session_id}"
        headers = {SESSION: client.session_id, "MCP-Protocol-Version": client.protocol_version, "Accept": JSON_ONLY}
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            for n, (coding, encode, status, code) in enumerate(
                [("gzip", gzip.compress, 200, None), ("deflate", zlib.compress, 200, None), ("gzip", lambda _: b"not gzip", 400, -32700),
                 ("gzip", lambda _: bomb, 413, -32600), ("br", lambda body: body, 415, -32600)]  # fmt: skip
            ):
                body = json.dumps(tool_call("echo", {"text": f"zipped {n}"}, n)).encode()
                async with http.post(mcp(b), data=encode(body), headers={**headers, "Content-Encoding": coding}) as resp:
                    got, answer = resp.status, await resp.json()
                sse_status, sse_text = await sse.post(None, raw=encode(body), headers={"Content-Encoding": coding})
                if status == 200:
                    assert got == 200 and text_of(answer) == f"zipped {n}", answer
                    assert sse_status == 202, sse_text
                    assert text_of(await sse.response(n)) == f"zipped {n}"
                else:
                    assert (got, answer["error"]["code"]) == (status, code), (coding, got, answer)
                    assert (sse_status, json.loads(sse_text)["error"]) == (status, answer["error"]), sse_text
        assert await forwarded_count(b, "forwarded") == 10 and await forwarded_count(b, "owner_gone") == 0
    assert [e for e in a.events + b.events if e.get("level") in ("error", "critical")] == []


async def test_resume_through_a_third_replica_after_the_proxy_died(tmp_path: Path) -> None:
    async with replicas(tmp_path, killed=(1,)) as (a, b, c), RawStreamable(mcp(a)) as client:
        await client.initialize()
        client.url = mcp(b)
        steps = 8
        reply = await client.post(tool_call("countdown", {"steps": steps, "interval_ms": 80}, 5, token="p"))
        assert reply.stream is not None
        await reply.stream.wait_events(3)  # priming and two progress steps
        await kill(b)
        await reply.stream.ended.wait()
        assert reply.stream.error is not None, "a stream cut by its proxy's death read as complete"
        before = list(reply.stream.events)

        client.url = mcp(c)
        resumed = await client.get(before[-1].id)
        assert resumed.status == 200 and resumed.stream is not None
        after = await resumed.stream.until_end(timeout=15)
        got = [e.message for e in before + after if not e.priming]
        assert [m["params"]["progress"] for m in got if "method" in m] == list(range(1, steps + 1))
        assert [m["id"] for m in got if "id" in m] == [5] and text_of(got[-1]) == "done"


# ----------------------------------------------------------------- failures


async def test_owner_killed_answers_404_within_a_second(tmp_path: Path) -> None:
    async with replicas(tmp_path, killed=(0,)) as (a, b, c), RawStreamable(mcp(a)) as client, RawSse(a.url("demo")) as sse:
        await client.initialize()
        await sse.initialize()
        client.url = mcp(b)
        get = await client.get()
        assert get.stream is not None and get.status == 200
        await kill(a)
        await get.stream.ended.wait()
        assert get.stream.error is not None, "the owner's death ended a forwarded stream as a success"

        for via in (b, c):
            client.url = mcp(via)
            started = time.monotonic()
            gone = await client.post(tool_call("echo", {"text": "x"}, 1))
            assert time.monotonic() - started < OWNER_GONE_WITHIN_S
            assert (gone.status, gone.json["error"]) == (404, {"code": -32005, "message": OWNER_GONE}), gone.text
            sse.endpoint = f"{via.base}/servers/demo/messages?session_id={sse.session_id}"
            status, text = await sse.post({"jsonrpc": "2.0", "id": 2, "method": "ping"})
            assert (status, json.loads(text)["error"]) == (404, {"code": -32005, "message": OWNER_GONE}), text
        assert await forwarded_count(b, "owner_gone") == 2

        async with RawStreamable(mcp(b)) as fresh:  # the client's next session works
            await fresh.initialize()
            fresh.url = mcp(c)
            assert text_of((await fresh.request("tools/call", {"name": "echo", "arguments": {"text": "again"}}))[0]) == "again"


async def test_a_silent_owner_is_gone_after_a_bounded_wait(tmp_path: Path) -> None:
    """An owner that accepts connections but answers nothing (stopped, cut off) is not waited
    on for ever: after request_timeout + keepalive of silence the request gets 404."""
    config = {**DEMO, "limits": {"request_timeout": "1s"}, "sse": {"keepalive": "1s"}}
    async with replicas(tmp_path, n=2, config=config) as (a, b), RawStreamable(mcp(a)) as client:
        await client.initialize()
        client.url = mcp(b)
        a.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            async with asyncio.timeout(10):
                gone = await client.post(tool_call("echo", {"text": "x"}, 1))
            assert gone.status == 404 and time.monotonic() - started < 5, (gone.status, time.monotonic() - started)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        assert await forwarded_count(b, "owner_gone") == 1


async def test_a_restarted_owner_refuses_its_old_ids(tmp_path: Path) -> None:
    async with replicas(tmp_path, n=2) as (a, b):
        port = a.port
        async with RawStreamable(mcp(a)) as client:
            await client.initialize()
        old = client.session_id
        assert old is not None
        await a.stop()
        async with replica(tmp_path / "again", port) as restarted:
            async with aiohttp.ClientSession() as http:
                ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
                headers = {SESSION: old, "Content-Type": "application/json", "Accept": JSON_ONLY}
                async with http.post(mcp(restarted), data=ping, headers=headers) as resp:
                    assert resp.status == 404 and EPOCH_HEADER in resp.headers
                    assert (await resp.json())["error"] == {"code": -32005, "message": RESTARTED}
                for _ in range(2):  # through a peer: asked once, then known dead
                    async with http.post(mcp(b), data=ping, headers=headers) as resp:
                        assert resp.status == 404
                        assert (await resp.json())["error"] == {"code": -32005, "message": RESTARTED}
            assert await forwarded_count(b, "owner_restarted") == 2
            assert await forwarded_count(restarted, "stale") == 2  # one from the client, one forwarded


async def test_forged_ids_get_404_and_no_connection(tmp_path: Path) -> None:
    tokens = {"security": {"tokens": [{"name": "alice", "token": "alice-token-0123456789"}, {"name": "bob", "token": "bob-token-0123456789ab"}]}}
    async with replicas(tmp_path, n=2, config={**DEMO, **tokens}) as (a, b), Decoy() as decoy:
        alice = {"Authorization": "Bearer alice-token-0123456789"}
        bob = {"Authorization": "Bearer bob-token-0123456789ab"}
        async with RawStreamable(mcp(a), headers=alice) as client:
            await client.initialize()
        real = client.session_id
        assert real is not None
        address, epoch, random, mac = real.split(".")
        decoy_address = Cluster(f"127.0.0.1:{decoy.port}", KEY).new_id("alice").split(".")[0]
        forged = [
            f"{decoy_address}.{epoch}.{random}.{mac}",  # another owner, the MAC kept
            f"{address}.{epoch}.{random[:-2]}AA.{mac}",  # the random part changed
            f"{decoy_address}.{epoch}.{random}.{'A' * 22}",
            Cluster(f"127.0.0.1:{decoy.port}", "another-key-entirely-0123456789abcdef").new_id("alice"),  # a foreign key
            "not-an-id",
        ]
        async with aiohttp.ClientSession() as http:
            ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
            for sid in forged:
                async with http.post(mcp(b), data=ping, headers={**alice, SESSION: sid, "Accept": JSON_ONLY}) as resp:
                    assert resp.status == 404, (sid, resp.status)
                    assert (await resp.json())["error"] == {"code": -32600, "message": "unknown session"}, sid
            # The real id, by another principal: 404 from b itself, nothing sent to its owner.
            async with http.post(mcp(b), data=ping, headers={**bob, SESSION: real, "Accept": JSON_ONLY}) as resp:
                assert resp.status == 404
                assert (await resp.json())["error"] == {"code": -32600, "message": "unknown session"}
            async with http.post(mcp(b), data=ping, headers={**alice, SESSION: real, "Accept": JSON_ONLY}) as resp:
                assert resp.status == 200
        assert decoy.connections == 0
        assert await forwarded_count(b, "invalid", alice) == len(forged) + 1
        assert await forwarded_count(b, "forwarded", alice) == 1


async def test_no_second_hop(tmp_path: Path) -> None:
    async with replicas(tmp_path, n=2) as (a, b), Decoy() as decoy, aiohttp.ClientSession() as http:
        # A valid id (the peer key) naming the decoy: b would forward it there...
        sid = Cluster(f"127.0.0.1:{decoy.port}", KEY).new_id(None)
        ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
        headers = {SESSION: sid, "Accept": JSON_ONLY}
        async with http.post(mcp(b), data=ping, headers={**headers, FORWARDED_HEADER: f"127.0.0.1:{a.port}"}) as resp:
            assert resp.status == 404  # ...but not a request a peer already forwarded
            assert (await resp.json())["error"] == {"code": -32600, "message": "unknown session: forwarded to a replica that does not own it"}
        assert decoy.connections == 0
        assert await forwarded_count(b, "second_hop") == 1
        async with http.post(mcp(b), data=ping, headers=headers) as resp:
            assert resp.status == 404  # the decoy closes the connection: an owner gone
            assert (await resp.json())["error"] == {"code": -32005, "message": OWNER_GONE}
        assert decoy.connections == 1


def head_of(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    return int(lines[0].split()[1]), {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}, body


def complete(raw: bytes) -> bool:
    """Whether `raw` holds a whole answer: its Content-Length, or its last chunk."""
    if b"\r\n\r\n" not in raw:
        return False
    _, fields, body = head_of(raw)
    if "content-length" in fields:
        return len(body) >= int(fields["content-length"])
    return fields.get("transfer-encoding") == "chunked" and body.endswith(b"\r\n0\r\n\r\n")


async def cut_off(via: Bridge, request: bytes, owner: Bridge, under_way: Any) -> tuple[bytes, bool]:
    """The raw bytes a client gets through `via` for `request` when `owner` is SIGKILLed once
    what has come satisfies `under_way`, read up to the connection's end or the answer's; and
    whether the connection ended. The client reads little (a small receive buffer), so the
    owner is mid-answer when it dies."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", via.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    received = bytearray()
    try:
        writer.write(request)
        async with asyncio.timeout(15):
            while not under_way(bytes(received)):
                chunk = await reader.read(4096)
                assert chunk, f"the connection ended before the answer was under way: {bytes(received[:300])!r}"
                received += chunk
        await kill(owner)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                while not complete(bytes(received)):
                    if not (chunk := await reader.read(1 << 16)):
                        return bytes(received), True
                    received += chunk
        return bytes(received), False
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["fast", "aiohttp"])
async def test_an_owner_dying_mid_answer_ends_the_clients_answer_as_broken(tmp_path: Path, path: str) -> None:
    """SIGKILL the owner while a forwarded answer is under way: the client through another
    replica sees it cut short, as HTTP says an answer is broken (the connection closes before
    its end), never as a complete one. A JSON body stops short of its Content-Length; an SSE
    stream (chunked) has no last chunk. On either HTTP path of the replica forwarding."""
    config = {"servers": {"f": faulty(), "demo": demo()}, "limits": {"max_message_bytes": "32MiB"}}
    big = 16 << 20  # more than the kernel's buffers between owner and client hold: the owner dies mid-write
    async with replicas(tmp_path, n=3, config=config, killed=(0, 1)) as (a, c, b):
        for owner, server, body, accept, under_way in (
            (a, "f", tool_call("big", {"bytes": big}, 1), JSON_ONLY, lambda raw: len(raw.partition(b"\r\n\r\n")[2]) > 0),
            (c, "demo", tool_call("countdown", {"steps": 50, "interval_ms": 100}, 2, token="t"), "text/event-stream", lambda raw: raw.count(b"progress") >= 2),
        ):
            async with RawStreamable(owner.url(server, "mcp")) as client:
                await client.initialize()
            fields = (f"{SESSION}: {client.session_id}", f"MCP-Protocol-Version: {client.protocol_version}", f"Accept: {accept}")
            request = raw_post(b, json.dumps(body).encode(), *fields, server=server, chunked=path == "aiohttp")
            raw, closed = await cut_off(b, request, owner, under_way)
            status, fields_got, rest = head_of(raw)
            assert status == 200, raw[:300]
            assert not complete(raw), f"the answer cut by its owner's death reads as complete ({accept}): {raw[-100:]!r}"
            assert closed, f"the answer cut by its owner's death neither ended nor closed ({accept}, {len(raw)} bytes)"
            if accept == JSON_ONLY:
                length = int(fields_got["content-length"])
                assert length > big and 0 < len(rest) < length, (length, len(rest))
            else:
                assert fields_got.get("transfer-encoding") == "chunked" and b"progress" in rest, raw[:300]
        assert await forwarded_count(b, "broken") == 2 and await forwarded_count(b, "forwarded") == 0
        assert len(b.named("forward_broken")) == 2


# ------------------------------------------------------- 2026-07-28 and MRTR


def sample_call(prompt: str, progress: bool = False) -> dict[str, Any]:
    extra = {"progressToken": "p"} if progress else {}
    return modern.request("tools/call", {"name": "sample", "arguments": {"prompt": prompt}}, capabilities={"sampling": {}}, **extra)


async def input_required(url: str, call: dict[str, Any]) -> dict[str, Any]:
    answer = await modern.post(url, call, modern.headers_for(call))
    result = answer.json()["result"]
    assert result["resultType"] == "input_required", result
    return result


def with_claims(state: str, **claims: Any) -> str:
    """`state` with some claims changed and its signature kept (so no longer valid)."""
    header, payload, signature = state.split(".")
    decoded = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    encoded = base64.urlsafe_b64encode(json.dumps({**decoded, **claims}).encode()).rstrip(b"=").decode()
    return f"{header}.{encoded}.{signature}"


async def test_mrtr_retry_through_another_replica_reaches_the_parked_call(tmp_path: Path) -> None:
    """Answered input_required by a; the retry, sent to b, is forwarded to a and completes
    the call: as one JSON body (fast path), as a stream of events (aiohttp's path, a chunked
    body), and with a Content-Length on aiohttp's path (a repeated header takes it there)."""
    cases = (("fast", False, False), ("aiohttp", True, False), ("fast", False, True))
    async with replicas(tmp_path) as (a, b, c):
        async with aiohttp.ClientSession() as http, http.get(f"{a.base}/status") as resp:
            epoch = (await resp.json())["cluster"]["epoch"]
        for n, (path, progress, repeated) in enumerate(cases):
            call = sample_call(f"via {path}?", progress)
            result = await input_required(mcp(a), call)
            claims = jwt.decode(result["requestState"], options={"verify_signature": False})
            assert (claims["o"], claims["e"]) == (f"127.0.0.1:{a.port}", epoch)
            again = modern.retry(call, result, f"answered via {path}")
            headers: Any = modern.headers_for(again)
            if repeated:
                headers = CIMultiDict([*headers.items(), ("X-Forwarded-Proto", "http"), ("X-Forwarded-Proto", "http")])
            answer = await modern.post(mcp(b), again, headers, path)
            assert answer.status == 200, answer.body
            final = answer.final()
            assert final["id"] == 2 and final["result"]["content"][0]["text"] == f"answered via {path}", final
            assert final["result"]["resultType"] == "complete"
            if progress:
                assert answer.content_type == "text/event-stream"
                assert [e["params"]["message"] for e in answer.events() if e.get("method") == "notifications/progress"] == ["sampled"]
            assert await forwarded_count(b, "forwarded") == n + 1
        assert a.named("input_expired") == [] and a.named("input_refused") == []
        assert await forwarded_count(c, "forwarded") == 0


async def test_stateless_requests_are_served_where_they_arrive(tmp_path: Path) -> None:
    """No session: never forwarded, even with a stray Mcp-Session-Id, another replica's or
    nobody's (2026-07-28 ignores the header); subscriptions/listen too."""
    async with replicas(tmp_path) as (a, b, c), RawStreamable(mcp(c)) as legacy, aiohttp.ClientSession() as http:
        await legacy.initialize()
        assert legacy.session_id is not None
        for n, (stray, path) in enumerate(((legacy.session_id, "fast"), (legacy.session_id, "aiohttp"), ("not-an-id", "fast"))):
            echo = modern.request("tools/call", {"name": "echo", "arguments": {"text": f"here {n}"}})
            answer = await modern.post(mcp(b), echo, {**modern.headers_for(echo), SESSION: stray}, path)
            assert answer.status == 200 and answer.json()["result"]["content"][0]["text"] == f"here {n}", answer.body
        listen = modern.request("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
        async with http.post(mcp(b), json=listen, headers={**modern.headers_for(listen), SESSION: legacy.session_id}) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            async with asyncio.timeout(5):
                while not (line := await resp.content.readline()).startswith(b"data: "):
                    pass
            assert json.loads(line[6:])["method"] == "notifications/subscriptions/acknowledged"
        assert await forwarded_count(b, "forwarded") == 0 and await forwarded_count(b, "invalid") == 0


async def test_mrtr_owner_killed_retry_answered_at_once(tmp_path: Path) -> None:
    async with replicas(tmp_path, killed=(0,)) as (a, b, c):
        call = sample_call("lost?")
        result = await input_required(mcp(a), call)
        await kill(a)
        again = modern.retry(call, result)
        started = time.monotonic()
        answer = await modern.post(mcp(b), again, modern.headers_for(again))
        assert time.monotonic() - started < OWNER_GONE_WITHIN_S
        error = modern.error_of(answer)
        assert answer.status == 400 and error["code"] == -32602 and "gone; start the call anew" in error["message"], error
        assert answer.json()["id"] == 2
        assert await forwarded_count(b, "owner_gone") == 1
        # The client starts the call anew: it works, parked on b and resumed through c.
        call = sample_call("anew?")
        result = await input_required(mcp(b), call)
        again = modern.retry(call, result, "anew")
        assert (await modern.post(mcp(c), again, modern.headers_for(again))).final()["result"]["content"][0]["text"] == "anew"


async def test_mrtr_state_of_a_restarted_owner_is_refused(tmp_path: Path) -> None:
    async with replicas(tmp_path, n=2) as (a, b):
        port = a.port
        call = sample_call("before the restart?")
        result = await input_required(mcp(a), call)
        await a.stop()
        async with replica(tmp_path / "again", port) as restarted:
            again = modern.retry(call, result)
            answer = await modern.post(mcp(restarted), again, modern.headers_for(again))  # its own, from an earlier life
            assert answer.status == 400 and EPOCH_HEADER in answer.headers
            assert "restarted since; start the call anew" in modern.error_of(answer)["message"]
            for _ in range(2):  # through a peer: asked once, then known dead
                answer = await modern.post(mcp(b), again, modern.headers_for(again))
                assert answer.status == 400 and "restarted since; start the call anew" in modern.error_of(answer)["message"]
            assert await forwarded_count(b, "owner_restarted") == 2
            assert await forwarded_count(restarted, "stale") == 2  # one from the client, one forwarded


async def test_mrtr_tampered_state_refused_with_no_connection(tmp_path: Path) -> None:
    async with replicas(tmp_path, n=2) as (a, b), Decoy() as decoy:
        call = sample_call("tampered?")
        result = await input_required(mcp(a), call)
        state = result["requestState"]
        claims = jwt.decode(state, options={"verify_signature": False})
        decoy_address = f"127.0.0.1:{decoy.port}"
        forged = [
            with_claims(state, o=decoy_address),  # another owner, the signature kept
            with_claims(state, k="another-parked-call"),
            state[:-3] + ("AAA" if not state.endswith("AAA") else "BBB"),
            jwt.encode({**claims, "o": decoy_address}, "another-key-entirely-0123456789abcdef", algorithm="HS256"),
        ]
        for bad in forged:
            again = modern.retry(call, {**result, "requestState": bad})
            answer = await modern.post(mcp(b), again, modern.headers_for(again))
            assert answer.status == 400 and "not valid" in modern.error_of(answer)["message"], answer.body
        assert decoy.connections == 0
        assert await forwarded_count(b, "forwarded") == 0 and await forwarded_count(b, "owner_gone") == 0
        # The real state still completes the call (a tampered copy elsewhere cannot end it).
        again = modern.retry(call, result, "intact")
        assert (await modern.post(mcp(b), again, modern.headers_for(again))).final()["result"]["content"][0]["text"] == "intact"


async def test_an_mrtr_retry_already_forwarded_is_never_forwarded_again(tmp_path: Path) -> None:
    """A retry whose requestState names another replica, arriving with a peer's forwarding mark,
    was sent here by a peer that took this replica for the holder: it is refused (400, -32602)
    with no connection anywhere, on both HTTP paths, rather than forwarded a second time; the
    same retry from a client is forwarded (here to a decoy that hangs up: the holder is gone)."""
    async with replicas(tmp_path, n=1) as (b,), Decoy() as decoy:
        holder = Cluster(f"127.0.0.1:{decoy.port}", KEY)  # a valid state (the peer key) naming the decoy
        state = StateKeys(holder.derived("requestState"), Owner(holder.advertise, holder.epoch)).seal(
            State("parked-elsewhere", None, "tools/call", "digest", "demo"), 60
        )
        call = sample_call("held elsewhere?")
        again = modern.retry(call, {"inputRequests": {"k": {}}, "requestState": state})
        marked = {**modern.headers_for(again), FORWARDED_HEADER: "127.0.0.1:9"}
        for path in ("fast", "aiohttp"):
            answer = await modern.post(mcp(b), again, marked, path)
            assert answer.status == 400, answer.body
            assert modern.error_of(answer) == {
                "code": -32602, "message": "requestState names a call that cannot go on: forwarded to a replica that does not own it; start the call anew"
            }  # fmt: skip
        assert decoy.connections == 0 and await forwarded_count(b, "second_hop") == 2
        answer = await modern.post(mcp(b), again, modern.headers_for(again))
        assert answer.status == 400 and "the replica that held it is gone" in modern.error_of(answer)["message"], answer.body
        assert decoy.connections == 1 and await forwarded_count(b, "owner_gone") == 1


# ---------------------------------------------------------------- operations


# ------------------------------------------------------- what a forward carries


# A client's fields that are meant for the one connection they came on (RFC 9110, 7.6.1), the
# first named by the Connection field; none may reach the owner.
HOP_BY_HOP_FIELDS = ("X-Secret: s", "Keep-Alive: timeout=5", "TE: trailers", "Proxy-Authorization: Basic eDp5", "Upgrade: h2c", "Proxy-Connection: keep-alive")


def raw_post(b: Bridge, body: bytes, *fields: str, server: str = "demo", chunked: bool = False) -> bytes:
    """A POST as bytes; `chunked` sends its body in chunks, which only aiohttp's path reads."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = [f"POST /servers/{server}/mcp HTTP/1.1", f"Host: 127.0.0.1:{b.port}", framing, *fields]
    if chunked:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def exchange(b: Bridge, request: bytes) -> tuple[int, dict[str, str], Any]:
    """One request on its own connection: the status, the fields (lower-case), the JSON body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    try:
        writer.write(request)
        async with asyncio.timeout(10):
            head, _, rest = (await reader.readuntil(b"\r\n\r\n")).partition(b"\r\n")
            fields = dict((k.strip().lower(), v.strip()) for k, _, v in (f.decode("latin-1").partition(":") for f in rest.split(b"\r\n") if f))
            body = await reader.readexactly(int(fields["content-length"]))
        return int(head.split()[1]), fields, json.loads(body)
    finally:
        writer.close()


async def test_forwards_keep_every_end_to_end_field_in_order_and_no_hop_by_hop_one(tmp_path: Path) -> None:
    """What the owner receives, seen on the wire by a hop in front of it (the owner advertises
    the hop's address): a session's request and an MRTR retry forwarded by b, on both HTTP
    paths, carry each X-Forwarded-For the client sent, in order (b forwarded only the last), the
    forwarding mark, and none of the client's hop-by-hop fields."""
    a_port = free_port()
    async with Relay(upstream=a_port) as hop, replica(tmp_path, a_port, advertise=hop.port) as a, replica(tmp_path, free_port()) as b, RawStreamable(
        mcp(a)
    ) as client:
        await client.initialize()
        proxies = ("X-Forwarded-For: 198.51.100.7", "X-Forwarded-For: 10.0.0.2")
        mark = f"127.0.0.1:{b.port}"

        def forwarded(target: bytes) -> CIMultiDict[str]:
            *_, (line, fields) = hop.heads()
            assert line == b"POST " + target + b" HTTP/1.1", line
            return fields

        # A session's request, on the fast path's hand-off (Upgrade) and on aiohttp's.
        body = json.dumps(tool_call("echo", {"text": "through"}, 1)).encode()
        for extra in (("Connection: close, X-Secret", *HOP_BY_HOP_FIELDS), ("Connection: X-Secret", "X-Secret: s", "Keep-Alive: 5")):
            session = (f"{SESSION}: {client.session_id}", f"MCP-Protocol-Version: {client.protocol_version}", f"Accept: {JSON_ONLY}")
            status, _, answer = await exchange(b, raw_post(b, body, *proxies, *session, *extra))
            assert status == 200 and text_of(answer) == "through", answer
            fields = forwarded(b"/servers/demo/mcp")
            assert fields.getall("X-Forwarded-For") == ["198.51.100.7", "10.0.0.2"], fields
            assert fields.getall(FORWARDED_HEADER) == [mark], fields
            leaked = [f for f in HOP_BY_HOP_FIELDS if f.partition(":")[0] in fields]
            assert not leaked and "x-secret" not in fields.get("Connection", "").lower(), fields

        # An MRTR retry parked on a, sent to b: fast path (Content-Length), aiohttp's (chunked).
        for path in ("fast", "aiohttp"):
            call = sample_call(f"via {path}?")
            result = await input_required(mcp(a), call)
            again = modern.retry(call, result, f"answered via {path}")
            headers = CIMultiDict([*modern.headers_for(again).items(), *(p.split(": ") for p in proxies)])
            answer = await modern.post(mcp(b), again, headers, path)  # type: ignore[arg-type]
            assert answer.status == 200 and answer.final()["result"]["content"][0]["text"] == f"answered via {path}", answer.body
            fields = forwarded(b"/servers/demo/mcp")
            assert fields.getall("X-Forwarded-For") == ["198.51.100.7", "10.0.0.2"], (path, fields)
            assert fields.getall(FORWARDED_HEADER) == [mark], fields
        assert await forwarded_count(b, "forwarded") == 4


async def test_an_owners_hop_by_hop_fields_are_not_relayed(tmp_path: Path) -> None:
    """The owner's answer reaches the client with its end-to-end fields only: not those its
    Connection field names, nor Keep-Alive, Proxy-Authenticate, Upgrade, Trailer."""
    answer = b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}'
    head = ("HTTP/1.1 200 OK", "Content-Type: application/json", f"Content-Length: {len(answer)}", "Connection: X-Owner-Secret",
            "X-Owner-Secret: s", "Keep-Alive: timeout=5", "Proxy-Authenticate: Basic", "Upgrade: h2c", "Trailer: X-T", "X-Owner-Kept: k")  # fmt: skip
    async with Relay(answer=("\r\n".join(head) + "\r\n\r\n").encode() + answer) as owner, replica(tmp_path, free_port()) as b:
        sid = Cluster(f"127.0.0.1:{owner.port}", KEY).new_id(None)
        body = json.dumps(tool_call("echo", {"text": "x"}, 1)).encode()
        status, fields, got = await exchange(b, raw_post(b, body, f"{SESSION}: {sid}", f"Accept: {JSON_ONLY}", "Connection: close"))
        assert status == 200 and got == json.loads(answer), got
        assert fields.get("x-owner-kept") == "k", fields
        leaked = [name for name in ("x-owner-secret", "keep-alive", "proxy-authenticate", "upgrade", "trailer") if name in fields]
        assert not leaked, fields


async def test_a_forward_that_reaches_a_replica_not_owning_the_session_goes_no_further(tmp_path: Path) -> None:
    """A session id naming an address that leads to another replica (here a hop in front of b):
    a forwards it there, and b, seeing a's mark, refuses it (404, -32600) rather than forwarding
    it once more (unmarked, it went round b and the hop until connections ran out)."""
    async with replicas(tmp_path, n=2) as (a, b), Relay(upstream=b.port) as hop:
        sid = Cluster(f"127.0.0.1:{hop.port}", KEY).new_id(None)
        body = json.dumps(tool_call("echo", {"text": "x"}, 1)).encode()
        status, _, answer = await exchange(a, raw_post(a, body, f"{SESSION}: {sid}", f"Accept: {JSON_ONLY}"))
        assert status == 404, answer
        assert answer["error"] == {"code": -32600, "message": "unknown session: forwarded to a replica that does not own it"}, answer
        assert [fields.getall(FORWARDED_HEADER) for _, fields in hop.heads()] == [[f"127.0.0.1:{a.port}"]]
        assert await forwarded_count(b, "second_hop") == 1 and await forwarded_count(b, "forwarded") == 0
        assert await forwarded_count(a, "forwarded") == 1


async def test_status_names_the_replica_and_its_epoch(tmp_path: Path) -> None:
    async with replicas(tmp_path, n=1) as (a,), RawStreamable(mcp(a)) as client, aiohttp.ClientSession() as http:
        await client.initialize()
        async with http.get(f"{a.base}/status") as resp:
            cluster = (await resp.json())["cluster"]
        assert cluster["advertise"] == f"127.0.0.1:{a.port}" and not cluster["draining"]
        assert client.session_id is not None and client.session_id.split(".")[1] == cluster["epoch"]


async def test_a_draining_replica_finishes_its_calls_and_ends_its_idle_sessions(tmp_path: Path) -> None:
    """SIGTERM: /readyz says 503 at once; a call in flight on one of the replica's sessions,
    made through another replica, is answered, and that session still serves its client's
    next request; an idle session ends at once (its client is told so through any replica,
    and starts a new one elsewhere); no new session opens there; the replica stops as soon
    as its calls are done, long before drain_timeout."""
    config = {**DEMO, "limits": {"drain_timeout": "60s"}}
    async with (
        replicas(tmp_path, n=2, config=config) as (a, b),
        RawStreamable(mcp(a)) as busy,
        RawStreamable(mcp(a)) as idle,
        aiohttp.ClientSession() as http,
    ):
        await busy.initialize()
        await idle.initialize()
        busy.url = mcp(b)  # its calls are forwarded to a
        call = asyncio.create_task(busy.request("tools/call", {"name": "countdown", "arguments": {"steps": 10, "interval_ms": 100}}))
        async with asyncio.timeout(10):
            while True:
                async with http.get(f"{a.base}/status") as resp:
                    if (await resp.json())["servers"]["demo"]["in_flight"]:
                        break
                await asyncio.sleep(0.02)
        mark = len(a.events)
        a.proc.send_signal(signal.SIGTERM)
        await a.wait_for("draining", start=mark)
        async with http.get(f"{a.base}/readyz") as resp:
            assert resp.status == 503 and "draining" in (await resp.json())["servers"]["drain"]
        await a.wait_for("session_closed", where=lambda e: e["session"] == idle.session_id, start=mark)
        idle.url = mcp(b)
        gone = await idle.post({"jsonrpc": "2.0", "id": 9, "method": "ping"})
        assert gone.status == 404 and gone.json["error"]["code"] == -32600, (gone.status, gone.text)
        async with RawStreamable(mcp(a)) as late:
            refused = await late.post({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}}, session=False)
            assert refused.status == 503
        response, _ = await call
        assert text_of(response) == "done"
        listed, _ = await busy.request("tools/list")  # its follow-up, through b
        assert "countdown" in {t["name"] for t in listed["result"]["tools"]}
        async with asyncio.timeout(10):  # well before the drain timeout
            assert await a.proc.wait() == 0
        assert not a.named("drain_timeout")
