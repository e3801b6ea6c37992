"""The official `mcp` SDK as a real client, with the raw JSON-RPC traffic recorded.

`connect(url, ...)` opens `mcp.client.sse.sse_client` + `mcp.ClientSession`
(initialized) and returns a `Client`: the SDK session plus `wire`, which holds
every JSON-RPC message the session received from and sent to the bridge, as
plain dicts, in order. Tests use the SDK for the behaviour and `wire` to check
exactly what crossed the bridge (ids, progress tokens, server requests), and
wait on it with `wire.wait_for` instead of sleeping.

A message is recorded when the SDK's dispatcher reads it, so when an SDK call
returns, everything the bridge sent that session before the response is
already in `wire.received`: a server round trip is a barrier.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

PY = sys.executable
TIME_SERVER = {"command": PY, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}

Message = dict[str, Any]


def _raw(item: Any) -> Message | None:
    if isinstance(item, SessionMessage):
        return item.message.model_dump(by_alias=True, mode="json", exclude_none=True)
    return None


class Wire:
    """What one SDK session received and sent, in order."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self.sent: list[Message] = []
        self.errors: list[Exception] = []
        self._changed = asyncio.Event()

    def _got(self, item: Any) -> None:
        raw = _raw(item)
        if raw is not None:
            self.received.append(raw)
        elif isinstance(item, Exception):
            self.errors.append(item)
        self._changed.set()

    def _put(self, item: Any) -> None:
        raw = _raw(item)
        if raw is not None:
            self.sent.append(raw)
            self._changed.set()

    async def wait_for(
        self, predicate: Callable[[Message], bool], timeout: float = 10.0, start: int = 0, *, sent: bool = False
    ) -> Message:
        """The first received (or, with `sent`, sent) message from index `start` matching `predicate`."""
        messages = self.sent if sent else self.received
        async with asyncio.timeout(timeout):
            seen = start
            while True:
                for msg in messages[seen:]:
                    if predicate(msg):
                        return msg
                seen = len(messages)
                self._changed.clear()
                await self._changed.wait()

    # Views of the received traffic.

    def notifications(self, method: str) -> list[Message]:
        return [m for m in self.received if m.get("method") == method and "id" not in m]

    def server_requests(self, method: str | None = None) -> list[Message]:
        return [m for m in self.received if "method" in m and "id" in m and (method is None or m["method"] == method)]

    def responses(self) -> list[Message]:
        return [m for m in self.received if "method" not in m]

    def sent_requests(self, method: str | None = None) -> list[Message]:
        return [m for m in self.sent if "method" in m and "id" in m and (method is None or m["method"] == method)]

    def sent_request_ids(self) -> list[Any]:
        return [m["id"] for m in self.sent_requests()]

    def sent_responses(self) -> list[Message]:
        return [m for m in self.sent if "method" not in m]

    def progress_tokens_sent(self) -> set[Any]:
        tokens = set()
        for m in self.sent_requests():
            meta = (m.get("params") or {}).get("_meta") or {}
            if "progressToken" in meta:
                tokens.add(meta["progressToken"])
        return tokens

    def check_own_traffic(self) -> None:
        """Every response answers a request this session sent, exactly once;
        every progress notification carries a token this session issued."""
        sent_ids = self.sent_request_ids()
        answered = [m["id"] for m in self.responses()]
        assert len(answered) == len(set(answered)), f"a request was answered twice: {sorted(map(str, answered))}"
        stray = [m for m in self.responses() if m["id"] not in sent_ids]
        assert not stray, f"responses to requests this session never sent: {stray}"
        tokens = self.progress_tokens_sent()
        foreign = [m for m in self.notifications("notifications/progress") if m["params"]["progressToken"] not in tokens]
        assert not foreign, f"progress for tokens this session never issued: {foreign}"


class _RecordingReader:
    """Read-stream wrapper: records each item, then hands it to the SDK.

    Closing it does not close the transport's stream: `sse_client` closes that
    itself when it exits. (If the session closed it, a message arriving between
    the session's exit and `sse_client`'s would make the SDK's SSE reader fail
    with BrokenResourceError and the test with it.)
    """

    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner = inner
        self._wire = wire

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        item = await self._inner.receive()
        self._wire._got(item)
        return item

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def __aiter__(self) -> _RecordingReader:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _RecordingReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _RecordingWriter:
    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner = inner
        self._wire = wire

    async def send(self, item: Any) -> None:
        self._wire._put(item)
        await self._inner.send(item)

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _RecordingWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@dataclass
class Client:
    session: ClientSession
    wire: Wire
    init: types.InitializeResult
    name: str = ""
    sampled: list[types.CreateMessageRequestParams] = field(default_factory=list)
    roots_asked: int = 0
    logs: list[types.LoggingMessageNotificationParams] = field(default_factory=list)


@contextlib.asynccontextmanager
async def connect(
    url: str,
    *,
    name: str = "",
    sampling: Callable[[Client, types.CreateMessageRequestParams], str | Awaitable[str]] | None = None,
    roots: list[str] | None = None,
    elicit: Callable[[types.ElicitRequestParams], dict[str, Any]] | None = None,
    read_timeout: float | None = 30.0,
    initialize: bool = True,
    streamable: bool = False,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[Client]:
    """An initialized SDK client session over HTTP+SSE, or with `streamable` over Streamable HTTP
    (`url` is then the server's `/mcp` endpoint); `headers` go with every request (a token).

    `sampling(client, params)` returns (or awaits) the text of the assistant's answer;
    when given, the session declares the sampling capability. `roots` makes
    the session declare roots and answer `roots/list` with those uris. `elicit(params)`
    returns the content the session accepts an elicitation with (declaring elicitation).
    Log notifications are collected in `client.logs`.
    """
    wire = Wire()
    holder: list[Client] = []

    async def on_sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        client = holder[0]
        client.sampled.append(params)
        assert sampling is not None
        text = sampling(client, params)
        if inspect.isawaitable(text):
            text = await text
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=text), model=f"model-{client.name}"
        )

    async def on_roots(ctx: Any) -> types.ListRootsResult:
        client = holder[0]
        client.roots_asked += 1
        return types.ListRootsResult(roots=[types.Root(uri=uri, name=uri.rsplit("/", 1)[-1]) for uri in roots or []])

    async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert elicit is not None
        return types.ElicitResult(action="accept", content=elicit(params))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        if holder:
            holder[0].logs.append(params)

    if streamable:
        client = httpx2.AsyncClient(headers=headers, timeout=30) if headers else None
        transport = streamable_http_client(url, http_client=client)
    else:
        transport = sse_client(url, timeout=10.0, headers=headers)
    async with transport as (read, write):
        async with ClientSession(
            _RecordingReader(read, wire),  # type: ignore[arg-type]
            _RecordingWriter(write, wire),  # type: ignore[arg-type]
            read_timeout_seconds=read_timeout,
            sampling_callback=on_sampling if sampling is not None else None,
            list_roots_callback=on_roots if roots is not None else None,
            elicitation_callback=on_elicit if elicit is not None else None,
            logging_callback=on_log,
        ) as session:
            client = Client(session, wire, None, name)  # type: ignore[arg-type]
            holder.append(client)
            if initialize:
                client.init = await session.initialize()
            yield client


async def gather_sessions(url: str, n: int, body: Callable[[Client, int], Awaitable[Any]], **connect_kwargs: Any) -> list[Any]:
    """Run `body(client, i)` in n concurrent sessions (named s0, s1, ...), all connected before
    any body starts; returns the bodies' results in order. One failure cancels the rest."""
    barrier = asyncio.Barrier(n)

    async def one(i: int) -> Any:
        async with connect(url, name=f"s{i}", **connect_kwargs) as client:
            async with asyncio.timeout(30):
                await barrier.wait()
            return await body(client, i)

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(i)) for i in range(n)]
    return [t.result() for t in tasks]


def text_of(result: types.CallToolResult) -> str:
    assert not result.is_error, f"tool failed: {result.content}"
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def prompt_text(params: types.CreateMessageRequestParams) -> str:
    parts = []
    for message in params.messages:
        content = message.content if isinstance(message.content, list) else [message.content]
        parts += [c.text for c in content if isinstance(c, types.TextContent)]
    return "".join(parts)


def dump(messages: list[Message]) -> str:
    return "\n".join(json.dumps(m)[:300] for m in messages)


def own_progress_token(client: Client, steps: int) -> Any:
    """The token of this session's one tools/call, after checking that the wire carried
    exactly `steps` progress notifications, all with that token, and nothing of others'."""
    (call,) = client.wire.sent_requests("tools/call")
    token = call["params"]["_meta"]["progressToken"]
    progress = client.wire.notifications("notifications/progress")
    assert [m["params"]["progressToken"] for m in progress] == [token] * steps
    client.wire.check_own_traffic()
    return token
