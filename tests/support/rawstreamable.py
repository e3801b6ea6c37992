"""A bare Streamable HTTP client for tests that need to see exactly what goes over the wire.

`RawStreamable(url)` holds one session at the `/servers/{name}/mcp` endpoint:
`post` (a message or batch; the reply is an SSE `EventStream`, a JSON body, or
a bare status), `get` (the standalone stream, or a resumption with
`Last-Event-ID`), `delete`. After `initialize` every request carries the
`Mcp-Session-Id` and `MCP-Protocol-Version` headers unless told otherwise.

An `EventStream` parses SSE as it arrives and keeps every event with its `id`
(priming events, an id with empty data, included). `drop()` closes the
connection abruptly, as a client whose network went away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

SSE_AND_JSON = "application/json, text/event-stream"  # as the SDK clients send it: either answer, as the bridge sees fit
SSE_FIRST = "text/event-stream, application/json;q=0.9"  # a client that prefers a stream: it always gets one
JSON_ONLY = "application/json"
SESSION = "Mcp-Session-Id"
VERSION = "MCP-Protocol-Version"

Message = dict[str, Any]


@dataclass
class Event:
    id: str | None
    event: str
    data: str

    @property
    def priming(self) -> bool:
        return self.data == ""

    @property
    def message(self) -> Message:
        return json.loads(self.data)

    @property
    def seq(self) -> int:
        """The number at the end of the bridge's event ids (`<stream>_<n>`): one counter per session."""
        assert self.id is not None, "event without an id"
        return int(self.id.rpartition("_")[2])


class EventStream:
    """One SSE response being read: events as they arrive, and how it ended."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.status = resp.status
        self.headers = resp.headers
        self.events: list[Event] = []  # everything received so far, in order
        self.error: BaseException | None = None  # set if the stream broke rather than ended
        self.ended = asyncio.Event()
        self._read_upto = 0  # index in `events` of the next one `next` returns
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        ident: str | None = None
        event, data, has_data = "message", [], False
        try:
            async for raw in self.resp.content:
                line = raw.decode().rstrip("\r\n")
                if line == "":
                    if has_data or ident is not None:
                        self.events.append(Event(ident, event, "\n".join(data)))
                        self._changed.set()
                    ident, event, data, has_data = None, "message", [], False
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "id":
                    ident = value
                elif name == "event":
                    event = value
                elif name == "data":
                    data.append(value)
                    has_data = True
        except (aiohttp.ClientError, ConnectionError) as exc:
            self.error = exc
        finally:
            self.ended.set()
            self._changed.set()

    async def next(self, timeout: float = 10.0) -> Event:
        """The next event not yet returned; AssertionError if the stream ends first."""
        async with asyncio.timeout(timeout):
            while self._read_upto >= len(self.events):
                if self.ended.is_set():
                    raise AssertionError(f"stream ended (error: {self.error!r}) after {len(self.events)} events")
                self._changed.clear()
                await self._changed.wait()
        event = self.events[self._read_upto]
        self._read_upto += 1
        return event

    async def message(self, timeout: float = 10.0) -> Message:
        """The next JSON-RPC message, skipping priming events."""
        while True:
            event = await self.next(timeout)
            if not event.priming:
                return event.message

    async def response(self, request_id: Any, timeout: float = 10.0) -> tuple[Message, list[Message]]:
        """Read up to the response to `request_id`: (it, the messages that came before it)."""
        before: list[Message] = []
        while True:
            msg = await self.message(timeout)
            if msg.get("id") == request_id and "method" not in msg:
                return msg, before
            before.append(msg)

    async def until_end(self, timeout: float = 10.0) -> list[Event]:
        """Every event not yet returned, once the stream has ended."""
        async with asyncio.timeout(timeout):
            await self.ended.wait()
        rest = self.events[self._read_upto :]
        self._read_upto = len(self.events)
        return rest

    async def wait_events(self, count: int, timeout: float = 10.0) -> list[Event]:
        """Wait until `count` events have arrived in total (without consuming them)."""
        async with asyncio.timeout(timeout):
            while len(self.events) < count:
                if self.ended.is_set():
                    raise AssertionError(f"stream ended after {len(self.events)} of {count} events")
                self._changed.clear()
                await self._changed.wait()
        return self.events[:count]

    def drop(self) -> None:
        """Close the connection now, whatever is in flight on it."""
        self._task.cancel()
        self.resp.close()

    async def close(self) -> None:
        self.drop()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing whatever state it is in
            pass


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    text: str = ""
    stream: EventStream | None = None
    content_type: str = ""

    @property
    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class RawStreamable:
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    protocol_version: str | None = None
    streams: list[EventStream] = field(default_factory=list)
    _http: aiohttp.ClientSession | None = None
    _ids: int = 0

    async def __aenter__(self) -> RawStreamable:
        # Each client gets its own pool, so that dropping a stream never touches another's connection.
        self._http = aiohttp.ClientSession(read_bufsize=4 * 1024 * 1024)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for stream in self.streams:
            await stream.close()
        if self._http is not None:
            await self._http.close()

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _headers(self, accept: str | None, session: bool | str, version: bool | str, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = dict(self.headers)
        if accept is not None:
            headers["Accept"] = accept
        sid = session if isinstance(session, str) else (self.session_id if session else None)
        if sid:
            headers[SESSION] = sid
        ver = version if isinstance(version, str) else (self.protocol_version if version else None)
        if ver:
            headers[VERSION] = ver
        headers.update(extra or {})
        return headers

    async def _send(self, method: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        assert self._http is not None
        resp = await self._http.request(method, self.url, data=body, headers=headers)
        content_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        if resp.status == 200 and content_type == "text/event-stream":
            stream = EventStream(resp)
            self.streams.append(stream)
            return Reply(resp.status, resp.headers, stream=stream, content_type=content_type)
        try:
            text = await resp.text()
        finally:
            resp.release()
        return Reply(resp.status, resp.headers, text=text, content_type=content_type)

    async def post(
        self,
        payload: Any,
        *,
        accept: str | None = SSE_AND_JSON,
        session: bool | str = True,
        version: bool | str = True,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        hdrs = self._headers(accept, session, version, {"Content-Type": "application/json", **(headers or {})})
        return await self._send("POST", json.dumps(payload).encode(), hdrs)

    async def get(
        self,
        last_event_id: str | None = None,
        *,
        accept: str | None = "text/event-stream",
        session: bool | str = True,
        version: bool | str = True,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        extra = dict(headers or {})
        if last_event_id is not None:
            extra["Last-Event-ID"] = last_event_id
        return await self._send("GET", None, self._headers(accept, session, version, extra))

    async def delete(
        self, *, session: bool | str = True, version: bool | str = True, headers: Mapping[str, str] | None = None
    ) -> Reply:
        return await self._send("DELETE", None, self._headers(None, session, version, headers))

    # Conveniences for the happy path.

    async def initialize(
        self,
        version: str = "2025-11-25",
        capabilities: dict[str, Any] | None = None,
        *,
        accept: str = SSE_AND_JSON,
        initialized: bool = True,
    ) -> Message:
        """Open the session: initialize (its response), then notifications/initialized (202)."""
        request = {
            "jsonrpc": "2.0",
            "id": "init",
            "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": capabilities or {},
                "clientInfo": {"name": "raw-streamable", "version": "0"},
            },
        }
        reply = await self.post(request, accept=accept, session=False, version=False)
        assert reply.status == 200, (reply.status, reply.text)
        if reply.stream is not None:
            response, _ = await reply.stream.response("init")
            await reply.stream.until_end()
        else:
            response = reply.json
        assert "result" in response, response
        self.session_id = reply.headers[SESSION]
        self.protocol_version = response["result"]["protocolVersion"]
        if initialized:
            done = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert done.status == 202, (done.status, done.text)
        return response

    async def request(self, method: str, params: dict[str, Any] | None = None, request_id: Any = None) -> tuple[Message, list[Message]]:
        """POST one request and read its stream to the end: (the response, the messages before it)."""
        rid = self.next_id() if request_id is None else request_id
        msg: Message = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        reply = await self.post(msg)
        assert reply.status == 200, (reply.status, reply.text)
        if reply.stream is None:
            return reply.json, []
        response, before = await reply.stream.response(rid)
        rest = await reply.stream.until_end()
        assert not [e for e in rest if not e.priming], f"events after the response: {rest}"
        return response, before


def request(method: str, params: dict[str, Any] | None = None, request_id: Any = 1) -> Message:
    msg: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def tool_call(name: str, arguments: dict[str, Any] | None = None, request_id: Any = 1, token: Any = None) -> Message:
    params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return request("tools/call", params, request_id)


def notification(method: str, params: dict[str, Any] | None = None) -> Message:
    msg: Message = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def text_of(response: Message) -> str:
    assert "result" in response, response
    return "".join(c.get("text", "") for c in response["result"].get("content", []))
