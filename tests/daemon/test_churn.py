"""Churn: 10,000 sessions open and close against one shared server, each leaving
a subscription and a call in flight behind; afterwards every mux table is
empty and the daemon's memory has not grown by more than 20 MiB."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from support.daemon import Bridge, demo

CYCLES = 10_000
WARMUP = 500
CONCURRENCY = 64
MAX_GROWTH_KIB = 20 * 1024


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def next_event(content: aiohttp.StreamReader) -> tuple[str, str]:
    event, data = "message", ""
    while True:
        line = (await content.readline()).decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and data:
            return event, data


async def one_session(http: aiohttp.ClientSession, b: Bridge, n: int) -> None:
    async with http.get(b.url("demo")) as stream:
        _, endpoint = await next_event(stream.content)
        post = f"{b.base}{endpoint}"

        async def send(msg: dict[str, Any]) -> None:
            async with http.post(post, json=msg) as resp:
                assert resp.status == 202, await resp.text()

        await send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "churn", "version": "0"}}})
        assert json.loads((await next_event(stream.content))[1])["id"] == 1
        await send({"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": "demo://counter"}})
        params = {"name": "countdown", "arguments": {"steps": 100, "interval_ms": 50}, "_meta": {"progressToken": n}}
        await send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params})
        while json.loads((await next_event(stream.content))[1]).get("id") != 2:
            pass  # the subscribe is answered: this session holds a subscription and a call in flight


async def churn(b: Bridge, start: int, count: int) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(start, start + count):
        queue.put_nowait(n)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY * 2)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def worker() -> None:
            while not queue.empty():
                n = queue.get_nowait()
                async with asyncio.timeout(20):
                    await one_session(http, b, n)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def settled_status(b: Bridge) -> dict[str, Any]:
    """/status once every session is closed and every call is answered or cancelled."""
    async with aiohttp.ClientSession() as http, asyncio.timeout(30):
        while True:
            async with http.get(f"{b.base}/status") as resp:
                status = (await resp.json())["servers"]["demo"]
            tables = status["processes"][0]["tables"]
            if status["sessions"] == 0 and not any(tables.values()):
                return status
            await asyncio.sleep(0.1)  # bounded by the timeout: waiting for cancellations to land


async def test_ten_thousand_sessions_leave_nothing_behind(bridge: Any) -> None:
    config = {
        "servers": {"demo": demo()},
        "limits": {"max_sessions": CONCURRENCY * 4},
    }
    async with bridge(config, "--log-level", "info") as b:
        await churn(b, 0, WARMUP)
        await settled_status(b)
        before = rss_kib(b.proc.pid)
        await churn(b, WARMUP, CYCLES)
        status = await settled_status(b)
        after = rss_kib(b.proc.pid)
        print(f"churn: {CYCLES} sessions, RSS {before} KiB -> {after} KiB ({after - before:+d} KiB)")
        assert after - before < MAX_GROWTH_KIB
        assert status["processes"][0]["restarts"] == 0
