"""The one part of an answer that waits (bridge/http/reply.py `later`): what its step raises
becomes the reply's error, a bug a 500 (-32603) and never a hang, and the client going
cancels it. A reply that records what it is told stands in for both HTTP paths; aiohttp's
own reply is checked over a loopback socket for what only a socket shows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bridge.http.aiohttp_reply import AiohttpReply
from bridge.http.errors import HttpError
from bridge.http.reply import chunk, later
from bridge.protocol import jsonrpc


class _Reply:
    def __init__(self) -> None:
        self.errors: list[HttpError] = []
        self.left: Callable[[], object] | None = None

    def error(self, exc: HttpError) -> None:
        self.errors.append(exc)

    def watch(self, left: Callable[[], object]) -> None:
        self.left = left


async def test_a_bug_in_a_waiting_step_is_a_500_not_a_hang() -> None:
    async def step() -> None:
        raise RuntimeError("a bug")

    reply = _Reply()
    await later(reply, step(), "test")  # type: ignore[arg-type]
    (error,) = reply.errors
    assert (error.status, error.code) == (500, jsonrpc.INTERNAL_ERROR)


async def test_a_refusal_in_a_waiting_step_is_the_answer() -> None:
    async def step() -> None:
        raise HttpError(503, "no process in time", jsonrpc.SERVER_UNAVAILABLE)

    reply = _Reply()
    await later(reply, step(), "test")  # type: ignore[arg-type]
    assert [(e.status, e.message) for e in reply.errors] == [(503, "no process in time")]


async def test_the_client_going_cancels_the_step() -> None:
    started, never = asyncio.Event(), asyncio.Event()

    async def step() -> None:
        started.set()
        await never.wait()

    reply = _Reply()
    task = later(reply, step(), "test")  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        await started.wait()
    assert reply.left is not None
    reply.left()  # the client went
    async with asyncio.timeout(5):
        await task
    assert task.done() and not task.cancelled() and reply.errors == []  # returned, not re-raised: no frame kept


def test_a_chunk_names_its_size_in_hex() -> None:
    assert chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"


async def test_an_error_once_a_stream_is_under_way_breaks_it_on_aiohttps_path(aiohttp_server: Any) -> None:
    """Nothing can be said once a stream's head went out: an error then (a bug mid-step)
    closes the connection, so the client reads a broken answer, never a complete one
    that happens to lack its response."""
    first_read = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        reply = AiohttpReply(request)
        reply.open_stream("sid", b"data: {}\n\n")

        async def fail_once_read() -> None:
            await first_read.wait()
            reply.error(HttpError(500, "a bug"))

        failing = asyncio.get_running_loop().create_task(fail_once_read())
        try:
            return await reply.send()
        finally:
            await failing

    app = web.Application()
    app.router.add_post("/", handler)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as http, http.post(f"http://127.0.0.1:{server.port}/") as resp:
        assert resp.status == 200 and resp.headers["Mcp-Session-Id"] == "sid"
        async with asyncio.timeout(10):
            assert await resp.content.readuntil(b"\n\n") == b"data: {}\n\n"
            first_read.set()
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.content.read()
