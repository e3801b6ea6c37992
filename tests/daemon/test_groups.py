"""Groups: several servers behind `/groups/NAME/`, driven by the official SDK and raw HTTP over
both 2025 transports (docs/how-to/groups.md). Real daemon, real server processes: the demo
server, mcp-server-time and tests/servers/faulty.py (a crash, a hang, pages)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from support import browser
from support.browser import CHROMIUM
from support.daemon import demo, faulty
from support.metrics import http_get, scrape
from support.rawstreamable import JSON_ONLY, RawStreamable, tool_call
from support.rawstreamable import text_of as rs_text_of
from support.sdk import TIME_SERVER, connect, text_of
from test_drain import in_flight
from test_fastpath import _wire
from test_modern import (
    INSPECTOR,
    MODERN,
    NODE22,
    PATHS,
    TS_CLIENT,
    _run_client,
    answering_client,
    error_of,
    headers_for,
    metric,
    post,
    request,
    retry,
    sdk_client,
)
from test_operations import reload
from test_operators import by_id, ctl, sign_in
from test_replicas import forwarded_count, replicas

from bridge.demo_server import GREET_NAMES, GREETING_TEMPLATE

pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")

ALICE = "alice-token-0123456789"
COUNTER = "demo://counter"
BOB = "bob-token-0123456789ab"
CAROL = "carol-token-0123456789a"


def team(**groups: dict[str, Any]) -> dict[str, Any]:
    return {
        "servers": {"demo": demo(), "time": TIME_SERVER, "f": faulty()},
        "groups": groups or {"team": {"servers": ["demo", "time", "f"]}},
    }


def url(b: Any, group: str, streamable: bool) -> str:
    return f"{b.base}/groups/{group}/{'mcp' if streamable else 'sse'}"


async def all_tools(session: Any) -> tuple[list[str], int]:
    """Every tool's name, following the cursors; and how many pages that took."""
    names, pages, cursor = [], 0, None
    while True:
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        names += [t.name for t in page.tools]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            return names, pages


@pytest.mark.parametrize("streamable", [True, False], ids=["streamable", "sse"])
async def test_a_group_lists_every_members_tools_prefixed_and_routes_each_call_to_its_member(bridge: Any, streamable: bool) -> None:
    async with bridge(team()) as b:
        async with connect(url(b, "team", streamable), streamable=streamable) as c:
            assert c.init.server_info.name == "team"
            assert c.init.capabilities.tools is not None and c.init.capabilities.resources is not None
            assert "## demo" in (c.init.instructions or "")
            names, _ = await all_tools(c.session)
            assert {"demo__echo", "demo__add", "time__get_current_time", "f__pid", "f__echo"} <= set(names)
            assert all(n.split("__", 1)[0] in ("demo", "time", "f") for n in names)
            assert text_of(await c.session.call_tool("demo__add", {"a": 2, "b": 40})) == "42"
            audit = await b.wait_for("audit", where=lambda e: e.get("method") == "tools/call" and e.get("name") == "add")
            assert (audit["group"], audit["server"], audit["outcome"]) == ("team", "demo", "result"), audit
            assert text_of(await c.session.call_tool("f__echo", {"text": "to f"})) == "to f"
            assert '"timezone": "UTC"' in text_of(await c.session.call_tool("time__get_current_time", {"timezone": "UTC"}))
            with pytest.raises(MCPError, match="Unknown tool: nobody__echo"):
                await c.session.call_tool("nobody__echo", {})
            c.wire.check_own_traffic()
        # initialize, the lists, and the calls: each member's share of the group's requests
        handed = {m: await metric(b, f'mcp_bridge_group_requests_total{{group="team",member="{m}"}}') for m in ("demo", "time", "f")}
        assert handed["demo"] >= 3 and handed["time"] >= 3 and handed["f"] >= 3, handed


async def test_refusals_at_a_group_are_exact(bridge: Any) -> None:
    async with bridge(team()) as b, aiohttp.ClientSession() as http:
        async with RawStreamable(url(b, "team", True)) as raw:
            await raw.initialize()
            response, _ = await raw.request("tools/call", {"name": "nobody__echo", "arguments": {}})
            assert response["error"]["code"] == -32602 and response["error"]["message"] == "Unknown tool: nobody__echo"
            response, _ = await raw.request("resources/read", {"uri": "nowhere://x"})
            assert response["error"]["code"] == -32002 and response["error"]["data"] == {"uri": "nowhere://x"}
            response, _ = await raw.request("tools/list", {"cursor": "not-ours"})
            assert response["error"] == {"code": -32602, "message": "invalid cursor"}
            response, _ = await raw.request("sampling/createMessage", {})
            assert response["error"]["code"] == -32601
            response, _ = await raw.request("ping")
            assert response["result"] == {}
        async with http.post(f"{b.base}/groups/nobody/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}) as resp:
            assert resp.status == 404 and (await resp.json())["error"]["message"] == "unknown group 'nobody'"


async def test_pages_of_several_members_merge_under_one_cursor(bridge: Any) -> None:
    config = {
        "servers": {"f1": faulty(FAULTY_PAGE_SIZE="4"), "f2": faulty(FAULTY_PAGE_SIZE="5")},
        "groups": {"two": {"servers": ["*"], "separator": "."}},
    }
    async with bridge(config) as b:
        async with connect(url(b, "two", True), streamable=True) as paged, connect(f"{b.base}/servers/f1/mcp", streamable=True) as direct:
            names, pages = await all_tools(paged.session)
            own, _ = await all_tools(direct.session)
            assert pages == -(-len(own) // 4)  # as many as the member with the smaller pages needs
            assert names.count("f1.echo") == 1 and sorted(names) == sorted([f"f1.{n}" for n in own] + [f"f2.{n}" for n in own])
            assert text_of(await paged.session.call_tool("f2.echo", {"text": "two"})) == "two"


async def test_a_member_that_crashes_fails_the_calls_it_held_at_once_and_the_rest_answer(bridge: Any) -> None:
    async with bridge(team()) as b:
        async with connect(url(b, "team", True), streamable=True) as c:
            hung = asyncio.ensure_future(c.session.call_tool("f__hang", {}))
            await b.wait_for("server_stderr", where=lambda e: e.get("line", "").startswith("faulty: hang "))
            started = time.monotonic()
            crashed = asyncio.ensure_future(c.session.call_tool("f__crash", {}))
            results = await asyncio.wait_for(asyncio.gather(hung, crashed, return_exceptions=True), 10)
            assert time.monotonic() - started < 5
            for result in results:  # each names the member, as every error the bridge makes for one does
                assert isinstance(result, MCPError) and result.error.code == -32000, result
                assert str(result) == "member 'f' of group 'team': server process exited with code 3"
            assert text_of(await c.session.call_tool("demo__add", {"a": 1, "b": 1})) == "2"
            await b.wait_for("server_started", where=lambda e: e.get("server") == "f", start=0)
            assert text_of(await c.session.call_tool("f__echo", {"text": "back"})) == "back"  # restarted, in the same group session


async def test_a_token_sees_only_the_members_it_may_use_and_their_filters(bridge: Any) -> None:
    config = {
        **team(),
        "security": {
            "tokens": [
                {"name": "alice", "token": ALICE, "servers": ["demo", "time"], "tools": {"demo": {"deny": ["countdown"]}}},
                {"name": "bob", "token": BOB, "servers": ["f"]},
                {"name": "carol", "token": CAROL, "servers": ["lone"]},
            ]
        },
    }
    config["servers"] = {**config["servers"], "lone": demo()}
    async with bridge(config) as b:
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with connect(url(b, "team", True), streamable=True, headers=headers) as alice:
            names, _ = await all_tools(alice.session)
            assert "demo__add" in names and "time__get_current_time" in names
            assert "demo__countdown" not in names and not [n for n in names if n.startswith("f__")]
            with pytest.raises(MCPError, match="Unknown tool: f__echo"):
                await alice.session.call_tool("f__echo", {"text": "x"})
        async with connect(url(b, "team", False), headers={"Authorization": f"Bearer {BOB}"}) as bob:
            names, _ = await all_tools(bob.session)
            assert names and all(n.startswith("f__") for n in names)
            status = json.loads((await http_get(f"{b.base}/status", {"Authorization": f"Bearer {BOB}"}))[1])
            assert status["groups"] == {"team": {"members": ["f"], "sessions": 1}}, status  # its own, none of alice's
        async with aiohttp.ClientSession() as http:
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}}
            async with http.post(url(b, "team", True), json=init, headers={"Accept": "application/json"}) as resp:
                assert resp.status == 401
            async with RawStreamable(url(b, "team", True), headers={"Authorization": f"Bearer {ALICE}"}) as raw:
                await raw.initialize()  # alice's session: another token naming it finds nothing
                stolen = await raw.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers={"Authorization": f"Bearer {BOB}"})
                assert stolen.status == 404 and stolen.json["error"]["message"] == "unknown session"
            carol = {"Accept": "application/json", "Authorization": f"Bearer {CAROL}"}
            async with http.post(url(b, "team", True), json=init, headers=carol) as resp:
                body = await resp.json()
                assert resp.status == 403 and body["error"]["message"] == "token not allowed for any server of group 'team'", body


async def test_a_group_session_ends_with_its_members_sessions_and_a_reload_keeps_the_others(bridge: Any) -> None:
    async with bridge(team()) as b:
        async with RawStreamable(url(b, "team", True)) as raw:
            await raw.initialize()
            opened = [e for e in b.named("session_opened") if e.get("transport") == "group"]
            assert sorted(e["server"] for e in opened) == ["demo", "f", "time"]
            gone = await raw.delete()
            assert gone.status == 204
            closed = await b.wait_for("session_closed", where=lambda e: e.get("group") == "team")
            assert closed["reason"] == "client ended session"
            for member in ("demo", "time", "f"):
                await b.wait_for("session_closed", where=lambda e, m=member: e.get("server") == m and e.get("transport") == "group")
            again = await raw.post({"jsonrpc": "2.0", "id": 9, "method": "ping"})
            assert again.status == 404


@pytest.mark.parametrize("streamable", [True, False], ids=["streamable", "sse"])
async def test_a_members_list_changed_reaches_every_group_session_and_updates_only_the_subscriber(bridge: Any, streamable: bool) -> None:
    async with bridge(team()) as b:
        address = url(b, "team", streamable)
        async with connect(address, streamable=streamable) as a, connect(address, streamable=streamable) as other:
            await a.session.list_resources()  # the group learns which member lists which URI
            await other.session.list_resources()
            await a.session.subscribe_resource(COUNTER)
            assert text_of(await other.session.call_tool("demo__bump", {})) == "1"
            await a.wire.wait_for(lambda m: m.get("method") == "notifications/resources/updated")
            assert text_of(await other.session.call_tool("f__grow", {"names": ["grown"]})) == "grown"
            for c in (a, other):
                await c.wire.wait_for(lambda m: m.get("method") == "notifications/tools/list_changed")
                names, _ = await all_tools(c.session)
                assert "f__grown" in names
            assert not other.wire.notifications("notifications/resources/updated")  # it never subscribed
            await a.session.list_resource_templates()
            read = await a.session.read_resource("demo://greeting/Alice")  # by the member whose template matches
            assert read.contents[0].text == "Hello, Alice!"  # type: ignore[union-attr]
            a.wire.check_own_traffic()
            other.wire.check_own_traffic()


def group_post(body: bytes, *extra: str) -> bytes:
    head = ["POST /groups/team/mcp HTTP/1.1", "Host: 127.0.0.1", "Accept: application/json", *extra]
    if not any(h.lower().startswith("transfer-encoding") for h in extra):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_both_http_paths_answer_a_group_alike(bridge: Any) -> None:
    """The fast path serves a group's POSTs as aiohttp's path does (a chunked body goes there)."""
    async with bridge(team()) as b:
        async for wire in _wire(b):
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
            await wire.send(group_post(json.dumps(init).encode()))
            status, headers, body = await wire.response()
            assert status == 200 and json.loads(body)["result"]["serverInfo"]["name"] == "team", body
            session = f"Mcp-Session-Id: {headers['mcp-session-id']}"
            await wire.send(group_post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', session))
            assert (await wire.response())[0] == 202
            bodies = {
                "call": {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "demo__add", "arguments": {"a": 2, "b": 3}}},
                "unknown": {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "demo_add", "arguments": {}}},
                "batch": [{"jsonrpc": "2.0", "id": 7, "method": "ping"}, {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "f__echo", "arguments": {"text": "x"}}}],
            }  # fmt: skip
            for case, payload in bodies.items():
                data = json.dumps(payload).encode()
                answers = []
                for chunked in (False, True):
                    if chunked:
                        await wire.send(group_post(b"", session, "Transfer-Encoding: chunked") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
                    else:
                        await wire.send(group_post(data, session))
                    status, _, answer = await wire.response()
                    answers.append((status, json.loads(answer)))
                assert answers[0] == answers[1], (case, answers)
                assert answers[0][0] == 200, (case, answers)
            assert answers[0][1][1]["result"]["content"][0]["text"] == "x"
            for chunked in (False, True):
                data = json.dumps(bodies["call"]).encode()
                extra = ("Mcp-Session-Id: nope",)
                await wire.send(group_post(data, *extra) if not chunked else group_post(b"", *extra, "Transfer-Encoding: chunked") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
                status, _, answer = await wire.response()
                assert status == 404 and json.loads(answer)["error"]["message"] == "unknown session"


async def test_a_reload_that_changes_the_members_tells_open_sessions_and_keeps_the_rest(bridge: Any) -> None:
    config = {**team(), "groups": {"team": {"servers": ["demo", "f"]}}}
    async with bridge(config) as b:
        async with connect(url(b, "team", True), streamable=True) as c:
            names, _ = await all_tools(c.session)
            assert {n.split("__")[0] for n in names} == {"demo", "f"}
            f_sessions = [e["session"] for e in b.named("session_opened") if e.get("server") == "f" and e.get("transport") == "group"]
            demo_session = next(e["session"] for e in b.named("session_opened") if e.get("server") == "demo" and e.get("transport") == "group")
            mark = len(c.wire.received)
            await reload(b, lambda cfg: cfg["groups"]["team"].update(servers=["time", "demo"]))
            await c.wire.wait_for(lambda m: m.get("method") == "notifications/tools/list_changed", start=mark)
            async with asyncio.timeout(10):
                while {n.split("__")[0] for n in (await all_tools(c.session))[0]} != {"demo", "time"}:
                    await c.wire.wait_for(lambda m: m.get("method") == "notifications/tools/list_changed", start=len(c.wire.received) - 1)
            assert '"timezone": "UTC"' in text_of(await c.session.call_tool("time__get_current_time", {"timezone": "UTC"}))
            assert text_of(await c.session.call_tool("demo__add", {"a": 1, "b": 2})) == "3"
            with pytest.raises(MCPError, match="Unknown tool: f__echo"):
                await c.session.call_tool("f__echo", {"text": "x"})
            closed = {e["session"]: e["reason"] for e in b.named("session_closed")}
            assert [closed.get(s) for s in f_sessions] == ["group_changed"] and demo_session not in closed
            body = json.loads((await http_get(f"{b.base}/status"))[1])
            assert body["groups"]["team"]["members"] == ["time", "demo"] and body["groups"]["team"]["sessions"] == {"streamable": 1}
            code, out, err = await ctl(b, None, "groups")
            assert code == 0 and out.split("\n")[1].split() == ["team", "time,demo", "yes", "1"], (out, err)
            samples = await scrape(b)
            assert samples.get("mcp_bridge_group_sessions_open", group="team", transport="streamable") == 1
            assert samples.get("mcp_bridge_sessions_open", server="demo", transport="group") == 1


@pytest.mark.parametrize("streamable", [True, False], ids=["streamable", "sse"])
async def test_a_drain_answers_a_group_call_in_flight_then_the_daemon_exits(bridge: Any, streamable: bool) -> None:
    config = {**team(), "limits": {"drain_timeout": "10s"}}
    async with bridge(config) as b, connect(url(b, "team", streamable), streamable=streamable) as c:
        call = asyncio.ensure_future(c.session.call_tool("demo__countdown", {"steps": 10, "interval_ms": 100}))
        await in_flight(b)
        b.proc.send_signal(signal.SIGTERM)
        assert text_of(await asyncio.wait_for(call, 20)) == "done"
        draining = await b.wait_for("draining")
        assert draining["in_flight"] == 1, draining  # at its member
        assert await b.stop() == 0
        assert not b.named("drain_timeout")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian package chromium)")
async def test_the_status_page_shows_groups_to_each_viewer_as_status_does(bridge: Any, tmp_path: Path) -> None:
    config = {**team(), "security": {"tokens": [{"name": "admin", "token": ALICE, "roles": ["admin"]}, {"name": "bob", "token": BOB, "servers": ["f"]}]}}
    async with bridge(config) as b, browser.launch(tmp_path) as page:
        await page.navigate(b.base + "/ui")
        await sign_in(page, BOB)
        await page.wait_for("document.querySelector('tr[data-group=team]') !== null")
        row = "[...document.querySelectorAll('tr[data-group=team] td')].map(td => td.textContent)"
        assert await page.evaluate(row) == ["team", "f", "-", "0"]  # the members it may use, its own sessions
        await page.evaluate(by_id("signout", ".click()"))
        await sign_in(page, ALICE)
        await page.wait_for(by_id("viewer", ".textContent === 'admin'"))
        async with connect(url(b, "team", True), streamable=True, headers={"Authorization": f"Bearer {BOB}"}):
            await page.wait_for("document.querySelector('tr[data-group=team] td.sessions')?.textContent === '1'")
            assert await page.evaluate(row) == ["team", "demo, time, f", "ready", "1"]
    assert not page.errors, page.errors


@pytest.mark.skipif(not (INSPECTOR.exists() and NODE22.exists()), reason="the Inspector or Node.js 22 is not installed: run `npm ci --prefix tests/node`")
@pytest.mark.parametrize("era", ["legacy", "auto"])  # auto asks server/discover first, is refused, and initializes
async def test_the_inspector_cli_lists_and_calls_a_grouped_tool(bridge: Any, era: str) -> None:
    async with bridge(team()) as b:
        inspector = [str(NODE22), str(INSPECTOR), "--cli", url(b, "team", True), "--transport", "http", "--protocol-era", era]
        listed = json.loads(await _run_client(*inspector, "--method", "tools/list"))
        assert {"demo__echo", "time__get_current_time", "f__echo"} <= {t["name"] for t in listed["tools"]}
        called = json.loads(await _run_client(*inspector, "--method", "tools/call", "--tool-name", "demo__echo", "--tool-arg", "text=hello-group"))
        assert called["content"][0]["text"] == "hello-group"


async def test_a_member_session_an_admin_ends_is_gone_for_its_group_session_and_its_tools_withdrawn(bridge: Any) -> None:
    config = {**team(), "servers": {**team()["servers"], "f": {**faulty(), "mode": "per-session"}}}
    async with bridge(config) as b, connect(url(b, "team", True), streamable=True) as c:
        with pytest.raises(MCPError) as crashed:  # a per-session member's process exits: restarted, as for a direct session
            await c.session.call_tool("f__crash", {})
        assert str(crashed.value) == "member 'f' of group 'team': server process exited with code 3"
        assert text_of(await c.session.call_tool("f__echo", {"text": "back"})) == "back"
        member = next(e["session"] for e in b.named("session_opened") if e.get("server") == "f" and e.get("transport") == "group")
        mark = len(c.wire.received)
        async with aiohttp.ClientSession() as http, http.delete(f"{b.base}/admin/sessions/{member}") as resp:
            assert resp.status == 200, await resp.text()
        await c.wire.wait_for(lambda m: m.get("method") == "notifications/tools/list_changed", start=mark)
        names, _ = await all_tools(c.session)
        assert not [n for n in names if n.startswith("f__")] and "demo__add" in names
        with pytest.raises(MCPError) as gone:
            await c.session.call_tool("f__echo", {"text": "again"})
        assert gone.value.error.code == -32003 and str(gone.value) == "member 'f' of group 'team': its session ended (ended)"
        assert text_of(await c.session.call_tool("demo__add", {"a": 1, "b": 1})) == "2"


async def test_a_slow_members_list_is_left_out_at_the_timeout_and_announced_when_it_comes(bridge: Any) -> None:
    config = {
        "servers": {"demo": demo(), "f": faulty(FAULTY_SLOW_LIST_MS="1500")},
        "groups": {"team": {"servers": ["demo", "f"], "list_timeout": "300ms"}},
    }
    async with bridge(config) as b, connect(url(b, "team", True), streamable=True) as c:
        started = time.monotonic()
        names = [t.name for t in (await c.session.list_tools()).tools]
        assert time.monotonic() - started < 1.2, "the list waited for the slow member"
        assert names and all(n.startswith("demo__") for n in names)
        await c.wire.wait_for(lambda m: m.get("method") == "notifications/tools/list_changed", timeout=5)


async def test_a_group_session_is_used_through_each_replica(tmp_path: Path) -> None:
    """Opened on one replica; a call, a member's server request answered, and DELETE, each
    through another: the id names its owner, which every replica forwards to."""
    config = {"servers": {"demo": demo(), "f": faulty()}, "groups": {"team": {"servers": ["demo", "f"]}}}
    async with replicas(tmp_path, 3, config) as (a, b, c), RawStreamable(f"{a.base}/groups/team/mcp") as client:
        await client.initialize(capabilities={"sampling": {}})
        client.url = f"{b.base}/groups/team/mcp"
        reply = await client.post(tool_call("demo__add", {"a": 2, "b": 3}, 1), accept=JSON_ONLY)
        assert reply.status == 200 and rs_text_of(reply.json) == "5", reply.text
        client.url = f"{c.base}/groups/team/mcp"
        asked = await client.post(tool_call("demo__sample", {"prompt": "2+2?"}, "s"))
        assert asked.stream is not None
        ask = await asked.stream.message()
        assert ask["method"] == "sampling/createMessage"
        client.url = f"{b.base}/groups/team/mcp"
        answer = {"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "4"}, "model": "m"}}
        assert (await client.post(answer)).status == 202
        response, _ = await asked.stream.response("s")
        assert rs_text_of(response) == "4"
        assert await forwarded_count(b, "forwarded") >= 2 and await forwarded_count(c, "forwarded") >= 1
        client.url = f"{c.base}/groups/team/mcp"
        assert (await client.delete()).status == 204
        for via in (a, b):
            client.url = f"{via.base}/groups/team/mcp"
            assert (await client.post(tool_call("demo__echo", {"text": "x"}, 9))).status == 404


async def test_a_2026_07_28_retry_through_a_group_at_another_replica_resumes_the_call_at_its_holder(tmp_path: Path) -> None:
    config = {"servers": {"demo": demo(), "f": faulty()}, "groups": {"team": {"servers": ["demo", "f"]}}}
    async with replicas(tmp_path, 2, config) as (a, b):
        call = request("tools/call", {"name": "demo__sample", "arguments": {"prompt": "where?"}}, capabilities={"sampling": {}})
        first = (await post(f"{a.base}/groups/team/mcp", call, headers_for(call))).json()["result"]
        assert first["resultType"] == "input_required", first
        again = retry(call, first, "at the holder")
        final = (await post(f"{b.base}/groups/team/mcp", again, headers_for(again))).final()
        assert final["id"] == 2 and final["result"]["content"][0]["text"] == "at the holder", final
        assert await forwarded_count(b, "forwarded") >= 1


@pytest.mark.parametrize("mode", ["shared", "per-principal", "per-session"])
async def test_a_members_question_reaches_the_group_session_whose_call_asked_in_every_mode(bridge: Any, mode: str) -> None:
    config = {"servers": {"demo": demo(mode=mode), "time": TIME_SERVER}, "groups": {"team": {"servers": ["demo", "time"]}}}

    def answer(client: Any, params: types.CreateMessageRequestParams) -> str:
        return f"{client.name} answers"

    async with bridge(config) as b:
        address = url(b, "team", True)
        async with connect(address, name="A", sampling=answer, streamable=True) as a, connect(address, name="B", sampling=answer, streamable=True) as other:
            results = await asyncio.gather(a.session.call_tool("demo__sample", {"prompt": "a?"}), other.session.call_tool("demo__sample", {"prompt": "b?"}))
            assert [text_of(r) for r in results] == ["A answers", "B answers"]
            assert len(a.sampled) == 1 and len(other.sampled) == 1
            a.wire.check_own_traffic()
            other.wire.check_own_traffic()


# ------------------------------------------------------------------ 2026-07-28

SERVER_INFO = "io.modelcontextprotocol/serverInfo"


@pytest.mark.parametrize("path", PATHS)
async def test_2026_07_28_requests_through_a_group_merge_route_and_resume(bridge: Any, path: str) -> None:
    async with bridge(team(team={"servers": ["f", "time", "demo"]})) as b:  # the one with resources last
        at = url(b, "team", True)

        async def ask(method: str, params: dict[str, Any] | None = None, rid: int = 1, **meta: Any) -> Any:
            msg = request(method, params, rid, **meta)
            return await post(at, msg, headers_for(msg), path)

        discovered = (await ask("server/discover")).json()["result"]
        assert discovered["_meta"][SERVER_INFO] == {"name": "team", "version": "group"}, discovered
        assert {"tools", "prompts", "resources"} <= set(discovered["capabilities"]) and "## demo" in discovered["instructions"]
        assert discovered["resultType"] == "complete" and discovered["cacheScope"] == "private"
        listed = (await ask("tools/list")).json()["result"]
        names = {t["name"] for t in listed["tools"]}
        assert {"demo__echo", "demo__sample", "time__get_current_time", "f__echo"} <= names, names
        assert listed["_meta"][SERVER_INFO]["name"] == "team" and listed["ttlMs"] == 0

        echoed = (await ask("tools/call", {"name": "demo__echo", "arguments": {"text": "through"}})).json()["result"]
        assert echoed["content"][0]["text"] == "through" and echoed["_meta"][SERVER_INFO]["name"] == "mcp-bridge-demo"
        audit = await b.wait_for("audit", where=lambda e: e.get("name") == "echo")
        assert (audit["group"], audit["server"], audit["outcome"]) == ("team", "demo", "result"), audit
        now = (await ask("tools/call", {"name": "time__get_current_time", "arguments": {"timezone": "UTC"}})).json()["result"]
        assert json.loads(now["content"][0]["text"])["timezone"] == "UTC"
        # A URI no list here has shown: each member is asked, and the one that has it answers
        # (the others serve no resources/read: the one that does says what it does not have).
        read = (await ask("resources/read", {"uri": COUNTER})).json()["result"]
        assert read["contents"][0]["uri"] == COUNTER
        gone = await ask("resources/read", {"uri": "nowhere://x"})
        # No member has it: the first that says so answers (f serves no resources/read at all: -32601).
        assert gone.status == 400 and error_of(gone) == {"code": -32602, "message": "Unknown resource: nowhere://x", "data": {"uri": "nowhere://x"}}, gone.body
        assert "demo__greet" in {p["name"] for p in (await ask("prompts/list")).json()["result"]["prompts"]}
        greeting = (await ask("prompts/get", {"name": "demo__greet", "arguments": {"name": "Ada"}})).json()["result"]
        assert "Ada" in greeting["messages"][0]["content"]["text"]
        for ref in ({"type": "ref/prompt", "name": "demo__greet"}, {"type": "ref/resource", "uri": GREETING_TEMPLATE}):
            completed = (await ask("completion/complete", {"ref": ref, "argument": {"name": "name", "value": "a"}})).json()
            assert completed["result"]["completion"]["values"] == [n for n in GREET_NAMES if n.lower().startswith("a")], (ref, completed)

        unknown = await ask("tools/call", {"name": "nobody__echo", "arguments": {}})
        assert unknown.status == 400 and error_of(unknown) == {"code": -32602, "message": "Unknown tool: nobody__echo"}
        cursor = await ask("tools/list", {"cursor": "not-ours"})
        assert cursor.status == 400 and error_of(cursor) == {"code": -32602, "message": "invalid cursor"}
        removed = await ask("ping")
        assert removed.status == 404 and error_of(removed)["code"] == -32601
        msg = request("tools/call", {"name": "demo__echo", "arguments": {"text": "x"}})
        mismatch = await post(at, msg, headers_for(msg, Mcp_Name="echo"), path)
        assert mismatch.status == 400 and error_of(mismatch)["code"] == -32020, mismatch.body

        # MRTR: the member's question, its requestState; the retry (by the group's name) resumes the call there.
        call = request("tools/call", {"name": "demo__sample", "arguments": {"prompt": "p"}}, capabilities={"sampling": {}})
        first = (await post(at, call, headers_for(call), path)).json()["result"]
        assert first["resultType"] == "input_required", first
        again = retry(call, first, "answered through the group")
        final = (await post(at, again, headers_for(again), path)).final()
        assert final["id"] == 2 and final["result"]["content"][0]["text"] == "answered through the group", final
        assert b.named("input_expired") == [] and b.named("session_opened") == []
        handed = {m: await metric(b, f'mcp_bridge_group_requests_total{{group="team",member="{m}"}}') for m in ("time", "f", "demo")}
        assert handed["demo"] >= 10 and handed["time"] >= 5 and handed["f"] >= 4, handed  # lists to each, calls to one


async def test_a_2026_07_28_list_pages_across_members_and_leaves_out_a_slow_one(bridge: Any) -> None:
    config = {
        "servers": {"f1": faulty(FAULTY_PAGE_SIZE="4"), "f2": faulty(FAULTY_PAGE_SIZE="5"), "slow": faulty(FAULTY_SLOW_LIST_MS="4000")},
        "groups": {"two": {"servers": ["f1", "f2"], "separator": "."}, "late": {"servers": ["f1", "slow"], "list_timeout": "0.5s"}},
    }
    async with bridge(config) as b:
        names: list[str] = []
        cursor = None
        for _ in range(50):
            msg = request("tools/list", {"cursor": cursor} if cursor else {})
            result = (await post(url(b, "two", True), msg, headers_for(msg))).json()["result"]
            names += [t["name"] for t in result["tools"]]
            cursor = result.get("nextCursor")
            if cursor is None:
                break
        own = sorted(n[3:] for n in names if n.startswith("f1."))
        assert own and sorted(names) == sorted([f"f1.{n}" for n in own] + [f"f2.{n}" for n in own])
        msg = request("tools/list")
        started = time.monotonic()
        result = (await post(url(b, "late", True), msg, headers_for(msg))).json()["result"]
        assert time.monotonic() - started < 3
        shown = {t["name"] for t in result["tools"]}
        assert "f1__echo" in shown and not any(n.startswith("slow__") for n in shown), shown


async def test_sdk_clients_at_2026_07_28_through_a_group(bridge: Any) -> None:
    async with bridge(team()) as b:
        async with answering_client(url(b, "team", True)) as client:
            assert {"demo__echo", "f__echo"} <= {t.name for t in (await client.list_tools()).tools}
            assert (await client.call_tool("demo__sample", {"prompt": "py"})).content[0].text == "sampled: py"
            assert (await client.call_tool("f__echo", {"text": "f"})).content[0].text == "f"
        async with sdk_client(url(b, "team", True), mode="auto") as client:
            assert (await client.call_tool("demo__add", {"a": 1, "b": 2})).content[0].text == "3"
        out = await _run_client("node", str(TS_CLIENT), url(b, "team", True), "demo__")
        seen = json.loads(out.decode().strip().splitlines()[-1])
        assert "demo__echo" in seen["tools"] and seen["echoed"] == "from typescript", seen
        assert seen["sampled"] == "ts answers ts prompt" and seen["serverInfo"] == "mcp-bridge-demo"
        assert b.named("session_opened") == [] and b.named("input_expired") == []


async def test_a_listen_at_a_group_hears_every_member_on_one_stream(bridge: Any) -> None:
    from mcp.client.subscriptions import ResourceUpdated

    async with bridge(team(team={"servers": ["time", "f", "demo"]})) as b:  # acknowledgements merge in the group's order
        at = url(b, "team", True)

        async def open_stateless() -> float:
            return sum([await metric(b, f'mcp_bridge_sessions_open{{server="{m}",transport="stateless"}}') for m in ("demo", "time", "f")])

        async with sdk_client(at, mode=MODERN) as client, sdk_client(at, mode=MODERN) as other:
            async with client.listen(tools_list_changed=True, resource_subscriptions=[COUNTER, "nowhere://x"]) as sub:
                assert sub.honored.tools_list_changed and sub.honored.resource_subscriptions == [COUNTER], sub.honored
                assert (await other.call_tool("demo__bump", {})).content
                async with asyncio.timeout(10):
                    event = await anext(aiter(sub))
                assert event == ResourceUpdated(uri=COUNTER)
                listening = await open_stateless()
            # The client closed its stream: each member's listen has ended too (what is left open is kept calls' sessions).
            for _ in range(100):
                if await open_stateless() == listening - 3:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("a member's listen outlived the client's stream")
