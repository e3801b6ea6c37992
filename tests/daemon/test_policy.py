"""What a principal may see: tool filters and the audit record, end to end.

Real daemon, the fault-injection server, the official SDK client over both
transports, two tokens: alice sees what the server's own filter lets through,
bob's token narrows it further.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from support.daemon import demo, faulty
from support.rawclient import RawSse, call
from test_modern import PATHS, headers_for, post, request

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"

CONFIG = {
    "servers": {"f": {**faulty(), "tools": {"deny": ["crash", "deaf", "env*"]}}},
    "security": {
        "tokens": [
            {"name": "alice", "token": ALICE},
            {"name": "bob", "token": BOB, "tools": {"f": {"allow": ["echo", "grow", "grown-*", "hang"], "deny": ["grown-secret"]}}},
        ]
    },
    "limits": {"request_timeout": "1s"},
}


@contextlib.asynccontextmanager
async def sdk(url: str, token: str, transport: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    if transport == "sse":
        opened = sse_client(url + "/sse", headers=headers)
    else:
        opened = streamable_http_client(url + "/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=30))
    async with opened as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _names(session: ClientSession) -> set[str]:
    return {tool.name for tool in (await session.list_tools()).tools}


async def _error(session: ClientSession, name: str) -> types.ErrorData:
    with pytest.raises(Exception) as raised:
        await session.call_tool(name, {"text": "x"})
    error = getattr(raised.value, "error", None)
    assert isinstance(error, types.ErrorData), raised.value
    return error


@pytest.mark.parametrize("transport", ["sse", "streamable"])
async def test_hidden_tools_are_absent_and_unknown_even_after_the_list_changes(bridge: Any, transport: str) -> None:
    async with bridge(CONFIG) as b:
        url = f"{b.base}/servers/f"
        async with sdk(url, ALICE, transport) as alice, sdk(url, BOB, transport) as bob:
            alice_sees = await _names(alice)
            assert {"echo", "pid", "grow"} <= alice_sees and not {"crash", "deaf", "env"} & alice_sees
            assert await _names(bob) == {"echo", "grow", "hang"}

            # A hidden tool is unknown: the answer the server gives for a tool it does not have.
            truly_unknown = await _error(alice, "no-such-tool")
            for hidden in ("pid", "crash", "no-such-tool"):
                refused = await _error(bob, hidden)
                assert (refused.code, refused.message) == (truly_unknown.code, truly_unknown.message.replace("no-such-tool", hidden))
            assert (await _error(alice, "crash")).message.endswith("crash")  # the server's filter: hidden from alice too

            # The server's tools change: lists stay filtered after list_changed.
            grown = await bob.call_tool("grow", {"names": [f"grown-{transport}", "grown-secret"]})
            assert not grown.is_error
            assert await _names(bob) == {"echo", "grow", "hang", f"grown-{transport}"}
            assert {f"grown-{transport}", "grown-secret"} <= await _names(alice)
            assert (await _error(bob, "grown-secret")).code == truly_unknown.code

        audits = b.named("audit")
        bobs = [e for e in audits if e["principal"] == "bob" and e["name"] == "pid"]
        assert [(e["outcome"], e["code"], e["method"], e["server"]) for e in bobs] == [("error", truly_unknown.code, "tools/call", "f")]


async def test_every_outcome_is_audited_once_without_arguments_or_results(bridge: Any) -> None:
    async with bridge(CONFIG) as b, RawSse(b.url("f"), {"Authorization": f"Bearer {BOB}"}) as c:
        await c.initialize()
        secret = "argument-that-must-not-be-logged"
        assert "result" in await c.request("tools/call", call("echo", {"text": secret}), request_id="ok")
        assert "error" in await c.request("tools/call", call("pid"), request_id="hidden")
        assert (await c.request("tools/call", call("hang"), request_id="slow"))["error"]["code"] == -32001
        status, _ = await c.post({"jsonrpc": "2.0", "id": "gone", "method": "tools/call", "params": call("hang")})
        assert status == 202
        await b.wait_for("server_stderr", where=lambda e: '"gone"' in e.get("line", "") or "hang" in e.get("line", ""))
        await c.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "gone"}})
        await b.wait_for("audit", where=lambda e: e["outcome"] == "cancelled")
        outcomes = sorted((e["name"], e["outcome"]) for e in b.named("audit"))
        assert outcomes == [("echo", "result"), ("hang", "cancelled"), ("hang", "timeout"), ("pid", "error")]
        for event in b.named("audit"):
            assert event["principal"] == "bob" and event["session"] == c.session_id and event["logger"] == "mcp_bridge.audit"
            assert event["duration_ms"] >= 0
        assert not [e for e in b.events if secret in str(e)]


# ------------------------------------------------- prompts, resources, templates

DEMO_CONFIG = {
    "servers": {"demo": demo()},
    "security": {
        "tokens": [
            {"name": "alice", "token": ALICE},
            # bob may not see the prompt greet, nor the template demo://greeting/{name} and what it names
            {"name": "bob", "token": BOB, "prompts": {"demo": {"deny": ["greet"]}}, "resources": {"demo": {"deny": ["demo://greeting/*"]}}},
        ]
    },
}
PROMPT = types.PromptReference(type="ref/prompt", name="greet")
TEMPLATE = types.ResourceTemplateReference(type="ref/resource", uri="demo://greeting/{name}")


async def _refused(request: Any) -> types.ErrorData:
    with pytest.raises(Exception) as raised:
        await request
    error = getattr(raised.value, "error", None)
    assert isinstance(error, types.ErrorData), raised.value
    return error


@pytest.mark.parametrize("transport", ["sse", "streamable"])
async def test_a_hidden_prompt_or_template_is_unknown_to_every_method_that_names_it(bridge: Any, transport: str) -> None:
    async with bridge(DEMO_CONFIG) as b:
        url = f"{b.base}/servers/demo"
        async with sdk(url, ALICE, transport) as alice, sdk(url, BOB, transport) as bob:
            # alice sees both, and completes them.
            assert [p.name for p in (await alice.list_prompts()).prompts] == ["greet"]
            assert [t.uri_template for t in (await alice.list_resource_templates()).resource_templates] == [TEMPLATE.uri]
            assert (await alice.complete(PROMPT, {"name": "name", "value": "Al"})).completion.values == ["Alice", "Alan"]
            assert (await alice.complete(TEMPLATE, {"name": "name", "value": "C"})).completion.values == ["Carol", "Charlie"]
            assert (await alice.read_resource("demo://greeting/Alice")).contents[0].text == "Hello, Alice!"  # type: ignore[union-attr]
            unknown_prompt = await _refused(alice.complete(PROMPT.model_copy(update={"name": "nope"}), {"name": "name", "value": "Al"}))
            unknown_template = await _refused(alice.complete(TEMPLATE.model_copy(update={"uri": "demo://nope/{name}"}), {"name": "name", "value": "C"}))
            unknown_resource = await _refused(alice.read_resource("demo://nope/Alice"))

            # bob sees neither, and every method that names one answers as for one the server does not have.
            assert (await bob.list_prompts()).prompts == [] and (await bob.list_resource_templates()).resource_templates == []
            for refused, unknown, name, hidden in (
                (await _refused(bob.complete(PROMPT, {"name": "name", "value": "Al"})), unknown_prompt, "nope", "greet"),
                (await _refused(bob.get_prompt("greet", {"name": "Al"})), unknown_prompt, "nope", "greet"),
                (await _refused(bob.complete(TEMPLATE, {"name": "name", "value": "C"})), unknown_template, "demo://nope/{name}", TEMPLATE.uri),
                (await _refused(bob.read_resource("demo://greeting/Alice")), unknown_resource, "demo://nope/Alice", "demo://greeting/Alice"),
            ):
                assert (refused.code, refused.message) == (unknown.code, unknown.message.replace(name, hidden)), refused


@pytest.mark.parametrize("path", PATHS)
async def test_a_2026_completion_of_a_hidden_prompt_or_template_is_unknown(bridge: Any, path: str) -> None:
    async with bridge(DEMO_CONFIG) as b:
        url = b.url("demo", "mcp")

        async def ask(token: str, ref: dict[str, Any]) -> Any:
            msg = request("completion/complete", {"ref": ref, "argument": {"name": "name", "value": "Al"}})
            answer = await post(url, msg, {**headers_for(msg), "Authorization": f"Bearer {token}"}, path)
            return answer.status, answer.json()

        status, body = await ask(ALICE, {"type": "ref/prompt", "name": "greet"})
        assert status == 200 and body["result"]["completion"]["values"] == ["Alice", "Alan"], body
        for ref, key, unknown in (({"type": "ref/prompt", "name": "greet"}, "name", "nope"), ({"type": "ref/resource", "uri": TEMPLATE.uri}, "uri", "demo://nope/{name}")):
            expected = await ask(ALICE, {**ref, key: unknown})
            status, body = await ask(BOB, ref)
            assert status == expected[0] and "error" in body, body
            assert body["error"] == {**expected[1]["error"], "message": expected[1]["error"]["message"].replace(unknown, ref[key])}, body
