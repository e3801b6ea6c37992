"""A bare HTTP+SSE client for tests that need to see exactly what goes over the wire."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

import aiohttp


class RawSse:
    """One SSE session: `async with RawSse(url) as c:` then `c.post`, `c.request`, `c.next`."""

    def __init__(self, url: str, headers: Mapping[str, str] | None = None, read_bufsize: int = 16 * 1024 * 1024) -> None:
        self.url = url
        # aiohttp refuses a line longer than twice this; a message event is one line.
        self.read_bufsize = read_bufsize
        self.headers = dict(headers or {})
        self.endpoint = ""
        self.session_id = ""
        self.status = 0
        self.comments = 0
        self._http: aiohttp.ClientSession | None = None
        self._resp: aiohttp.ClientResponse | None = None
        self._inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._held: list[dict[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None
        self._endpoint_seen = asyncio.Event()

    async def __aenter__(self) -> RawSse:
        self._http = aiohttp.ClientSession(read_bufsize=self.read_bufsize)
        self._resp = await self._http.get(self.url, headers=self.headers)
        self.status = self._resp.status
        if self.status != 200:
            return self
        self._reader = asyncio.get_running_loop().create_task(self._read())
        async with asyncio.timeout(10):
            await self._endpoint_seen.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._resp is not None:
            self._resp.close()
        if self._http is not None:
            await self._http.close()

    async def _read(self) -> None:
        assert self._resp is not None
        event, data = "message", []
        try:
            async for raw in self._resp.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith(":"):
                    self.comments += 1
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                elif line == "" and data:
                    self._dispatch(event, "\n".join(data))
                    event, data = "message", []
        except (aiohttp.ClientError, ConnectionError):
            pass
        finally:
            self._inbox.put_nowait(None)

    def _dispatch(self, event: str, data: str) -> None:
        if event == "endpoint":
            self.endpoint = urljoin(self.url, data)
            self.session_id = data.split("session_id=", 1)[1]
            self._endpoint_seen.set()
        else:
            self._inbox.put_nowait(json.loads(data))

    async def post(self, message: Any, *, raw: bytes | None = None, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
        assert self._http is not None
        body = raw if raw is not None else json.dumps(message).encode()
        async with self._http.post(
            self.endpoint, data=body, headers={"Content-Type": "application/json", **self.headers, **(headers or {})}
        ) as resp:
            return resp.status, await resp.text()

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next message on the stream; AssertionError if the stream ended."""
        if self._held:
            return self._held.pop(0)
        async with asyncio.timeout(timeout):
            msg = await self._inbox.get()
        if msg is None:
            self._inbox.put_nowait(None)
            raise AssertionError("stream ended")
        return msg

    async def expect_end(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait for the stream to end; returns any messages that came first."""
        got = list(self._held)
        self._held.clear()
        async with asyncio.timeout(timeout):
            while (msg := await self._inbox.get()) is not None:
                got.append(msg)
        self._inbox.put_nowait(None)
        return got

    async def response(self, request_id: Any, timeout: float = 10.0) -> dict[str, Any]:
        """The response with this id; other messages are kept for `next`."""
        for i, msg in enumerate(self._held):
            if msg.get("id") == request_id and "method" not in msg:
                return self._held.pop(i)
        async with asyncio.timeout(timeout):
            while True:
                msg = await self._inbox.get()
                if msg is None:
                    self._inbox.put_nowait(None)
                    raise AssertionError(f"stream ended before the response to {request_id!r}")
                if msg.get("id") == request_id and "method" not in msg:
                    return msg
                self._held.append(msg)

    async def request(self, method: str, params: dict[str, Any] | None = None, request_id: Any = 1) -> dict[str, Any]:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            msg["params"] = params
        status, text = await self.post(msg)
        assert status == 202, (status, text)
        return await self.response(request_id)

    async def initialize(self, capabilities: dict[str, Any] | None = None, version: str = "2025-06-18") -> dict[str, Any]:
        reply = await self.request(
            "initialize",
            {"protocolVersion": version, "capabilities": capabilities or {}, "clientInfo": {"name": "raw", "version": "0"}},
            request_id="init",
        )
        await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply


def call(name: str, arguments: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
    if meta:
        params["_meta"] = meta
    return params
