"""Operators' edges: the one-line start, the `mcpServers` file, the admin API and `mcp-bridge ctl`.

Each runs the real daemon (conftest's `bridge`, or the one-liner through it) with
real server processes, and the official SDK as the client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from support import browser
from support.browser import CHROMIUM, Page
from support.daemon import PY, ROOT, SERVERS
from support.sdk import Client, connect, text_of

NODE_DIR = ROOT / "tests" / "node"
EVERYTHING_BIN = NODE_DIR / "node_modules" / ".bin" / "mcp-server-everything"
NPX = shutil.which("npx")
TOKEN = "one-line-token-0123456789"
ADMIN_TOKEN = "admin-token-abcdefghijklmnop"
USER_TOKEN = "user-token-abcdefghijklmnopq"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`mcp-bridge ARGS` to its end (for what exits at once: --check, config convert, ctl)."""
    return subprocess.run([PY, "-m", "bridge", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


async def post(url: str, body: Any, token: str | None = None) -> tuple[int, str]:
    """A Streamable HTTP POST: its status and body (a JSON answer, or the events of a stream)."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.text()


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


# ======================================================================== one line


async def test_one_liner_serves_a_python_server(bridge):
    async with bridge({}, "--name", "demo", "--mode", "per-session", command=[PY, "-m", "bridge.demo_server"]) as b:
        listening = b.named("listening")[0]
        assert listening["servers"] == ["demo"]
        async with connect(b.url("demo", "mcp"), streamable=True) as c:
            assert text_of(await c.session.call_tool("echo", {"text": "one line"})) == "one line"
        async with connect(b.url("demo")) as c:  # HTTP+SSE too
            assert text_of(await c.session.call_tool("add", {"a": 2, "b": 3})) == "5"
        started = b.named("server_started")
        assert len(started) == 2, started  # --mode per-session: a process per session


@pytest.mark.node
@pytest.mark.skipif(NPX is None or not EVERYTHING_BIN.exists(), reason="needs npx and `npm ci --prefix tests/node`")
async def test_one_liner_serves_server_everything_through_npx(bridge):
    # --no: npx runs the installed package and never downloads one.
    command = [NPX, "--prefix", str(NODE_DIR), "--no", "mcp-server-everything", "stdio"]
    async with bridge({}, command=command) as b:
        async with connect(b.url("default", "mcp"), streamable=True) as c:
            assert c.init.server_info.name == "mcp-servers/everything"
            result = await c.session.call_tool("echo", {"message": "through npx"})
            assert "through npx" in text_of(result)


async def test_one_liner_takes_its_token_from_the_environment(bridge, tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    command = [PY, "-m", "bridge.demo_server"]
    env = {"MCP_BRIDGE_TOKEN_FILE": str(token_file), "MCP_BRIDGE_ADMIN_TOKEN": ADMIN_TOKEN}
    async with bridge({}, command=command, env=env) as b:
        url = b.url("default", "mcp")
        status, body = await post(url, INITIALIZE)
        assert status == 401, body
        status, body = await post(url, INITIALIZE, token=TOKEN)
        assert status == 200 and '"serverInfo"' in body, body
        # The admin token is the admin API's; the client token is not.
        assert (await api("GET", b.base + "/admin/servers", token=ADMIN_TOKEN))[0] == 200
        assert (await api("GET", b.base + "/admin/servers", token=TOKEN))[0] == 403


def test_one_liner_refuses_what_it_cannot_serve(tmp_path: Path):
    # No token off loopback: refused, naming the variables that would give one.
    result = cli("--check", "--host", "0.0.0.0", "--", PY, "-m", "bridge.demo_server")
    assert result.returncode == 2 and "MCP_BRIDGE_TOKEN" in result.stderr, result.stderr
    # A bad token and a bad name, each in the command line's terms, with the key path.
    env = {"PATH": "/usr/bin:/bin", "MCP_BRIDGE_TOKEN": "short"}
    result = cli("--check", "--name", "a b", "--", "x", env=env)
    assert result.returncode == 2, result
    assert "MCP_BRIDGE_TOKEN (security.tokens[0].token): too short" in result.stderr, result.stderr
    assert "--name (servers.a b): name must be" in result.stderr, result.stderr
    # Both a file and a command; --name with a file.
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"servers": {"d": {"command": PY}}}))
    assert cli("--config", str(config), "--", PY).returncode == 2
    assert cli("--config", str(config), "--name", "x").returncode == 2
    # --check says what would be served.
    result = cli("--check", "--port", "9999", "--name", "demo", "--", PY, "-m", "bridge.demo_server")
    assert result.returncode == 0, result.stderr
    assert "http://127.0.0.1:9999/servers/demo/mcp" in result.stdout, result.stdout
    assert "http://127.0.0.1:9999/servers/demo/sse" in result.stdout, result.stdout


# ==================================================================== mcpServers

# The shape desktop assistants and IDEs write: stdio entries with args and env, and a remote one.
CLIENT_FILE = {
    "mcpServers": {
        "demo": {"command": PY, "args": ["-m", "bridge.demo_server"], "env": {"DEMO_GREETING": "hi"}},
        "faulty": {"type": "stdio", "command": PY, "args": [str(SERVERS / "faulty.py")], "cwd": str(ROOT), "autoApprove": []},
        "remote": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer x"}},
        "off": {"command": "nothing-here", "disabled": True},
    }
}


async def test_mcp_servers_file_is_served(bridge, tmp_path: Path):
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(CLIENT_FILE, indent=2))
    async with bridge(path) as b:
        assert b.named("listening")[0]["servers"] == ["demo", "faulty"]
        skipped = {e["note"] for e in b.named("config_entry_skipped")}
        assert any(n.startswith("mcpServers.remote: skipped: a remote server") for n in skipped), skipped
        assert any(n.startswith("mcpServers.off: skipped: disabled") for n in skipped), skipped
        async with connect(b.url("demo", "mcp"), streamable=True) as c:
            assert text_of(await c.session.call_tool("echo", {"text": "from json"})) == "from json"


def test_mcp_servers_file_problems_name_their_key_paths(tmp_path: Path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"bad": {"command": PY, "args": "-m x", "colour": 1}, "ok": {"command": PY}}}))
    result = cli("--check", "--config", str(path))
    assert result.returncode == 2, result
    assert f"{path}: mcpServers.bad.args: expected `array`" in result.stderr, result.stderr
    assert f"{path}: mcpServers.bad.colour: unknown key" in result.stderr, result.stderr
    path.write_text('{"mcpServers": {"x": {"command": "a",}}}')
    result = cli("--check", "--config", str(path))
    assert result.returncode == 2 and "not valid JSON at line 1" in result.stderr, result.stderr
    path.write_text(json.dumps({"mcpServers": {"r": {"url": "https://x.example/mcp"}}}))
    result = cli("--check", "--config", str(path))
    assert result.returncode == 2 and "mcpServers: at least one server is required" in result.stderr, result.stderr


def test_config_convert_prints_the_equivalent_yaml(tmp_path: Path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(CLIENT_FILE))
    result = cli("config", "convert", str(path))
    assert result.returncode == 0, result.stderr
    assert "# mcpServers.remote: skipped" in result.stdout, result.stdout
    converted = yaml.safe_load(result.stdout)
    assert converted == {
        "servers": {
            "demo": {"command": PY, "args": ["-m", "bridge.demo_server"], "env": {"DEMO_GREETING": "hi"}},
            "faulty": {"command": PY, "args": [str(SERVERS / "faulty.py")], "cwd": str(ROOT)},
        }
    }
    # The YAML serves the same servers.
    yaml_path = tmp_path / "servers.yaml"
    yaml_path.write_text(result.stdout)
    check = cli("--check", "--config", str(yaml_path))
    assert check.returncode == 0 and "2 servers: demo, faulty" in check.stdout, check


def test_config_convert_keeps_variables_as_written_and_needs_none_set(tmp_path: Path):
    """The output keeps `${...}` for the daemon to fill in, so converting needs none of them set
    (nor a `${file:...}` readable); serving the file still does."""
    path = tmp_path / "mcp.json"
    entry = {"command": "${API_BIN}", "args": ["--key", "${API_KEY}", "${file:/nonexistent/secret}"], "env": {"T": "${API_T:-x}"}}
    path.write_text(json.dumps({"mcpServers": {"api": entry}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("API_")}
    result = cli("config", "convert", str(path), env=env)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout) == {"servers": {"api": entry}}
    check = cli("--check", "--config", str(path), env=env)
    assert check.returncode == 2, check
    assert f"{path}: mcpServers.api.command: environment variable API_BIN is not set" in check.stderr, check.stderr
    assert f"{path}: mcpServers.api.args[2]: cannot read /nonexistent/secret" in check.stderr, check.stderr
    # What is wrong with the file itself is still found.
    path.write_text(json.dumps({"mcpServers": {"api": {**entry, "args": "${API_KEY}"}}}))
    result = cli("config", "convert", str(path), env=env)
    assert result.returncode == 2 and "mcpServers.api.args: expected `array`" in result.stderr, result


@pytest.mark.parametrize(("host", "loopback", "family"), [("0.0.0.0", "127.0.0.1", "IPv4"), ("::", "[::1]", "IPv6")])
def test_check_on_every_address_prints_urls_a_client_can_use(tmp_path: Path, host: str, loopback: str, family: str):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"servers": {"demo": {"command": PY}}, "security": {"tokens": [{"name": "t", "token": TOKEN}]}}))
    result = cli("--check", "--config", str(path), "--host", host, "--port", "8080")
    assert result.returncode == 0, result.stderr
    assert f"http://{loopback}:8080/servers/demo/mcp  Streamable HTTP" in result.stdout, result.stdout
    assert f"http://{loopback}:8080/servers/demo/sse  HTTP+SSE" in result.stdout, result.stdout
    assert "0.0.0.0:" not in result.stdout and "[::]:" not in result.stdout, result.stdout
    (note,) = [line for line in result.stdout.splitlines() if line.startswith(f"  (listening on every {family} address ({host})")]
    assert f"the URLs say {loopback.strip('[]')}, for clients on this machine" in note, note
    from bridge.cli import host_addresses

    addresses = host_addresses(socket.AF_INET if family == "IPv4" else socket.AF_INET6)
    assert f"(its own: {', '.join(addresses)}))" in note if addresses else "(its name, or an address of it))" in note, note


def test_the_hosts_addresses_are_those_other_machines_can_reach():
    from bridge.cli import host_addresses

    found = host_addresses()
    assert len(found) == len(set(found))
    for address in found:
        ip = ipaddress.ip_address(address.strip("[]"))
        assert not ip.is_loopback and not ip.is_link_local, address
        assert address.startswith("[") == (ip.version == 6), address
    assert set(host_addresses(socket.AF_INET)) | set(host_addresses(socket.AF_INET6)) == set(found)


# ====================================================================== admin API


def admin_config(**limits: Any) -> dict[str, Any]:
    return {
        "servers": {"demo": {"command": PY, "args": ["-m", "bridge.demo_server"]}},
        "security": {
            "tokens": [
                {"name": "ops", "token": ADMIN_TOKEN, "roles": ["admin"]},
                {"name": "alice", "token": USER_TOKEN},
            ]
        },
        "limits": {"drain_timeout": "5s", **limits},
    }


async def api(method: str, url: str, token: str | None = ADMIN_TOKEN) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as http, http.request(method, url, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


ALICE = {"Authorization": f"Bearer {USER_TOKEN}"}


async def call_in_flight(client: Client, steps: int = 300) -> asyncio.Task[Any]:
    """A demo `countdown` of `steps` tenths of a second (30 s), once the server is working on it
    (its first progress arrived)."""
    progressed = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        progressed.set()

    call = asyncio.create_task(client.session.call_tool("countdown", {"steps": steps, "interval_ms": 100}, progress_callback=on_progress))
    async with asyncio.timeout(10):
        await progressed.wait()
    return call


async def test_admin_api_refuses_everyone_but_admins(bridge):
    async with bridge(admin_config()) as b:
        for method, path in (
            ("GET", "/admin/servers"),
            ("GET", "/admin/sessions"),
            ("DELETE", "/admin/sessions/x"),
            ("POST", "/admin/servers/demo/restart"),
            ("POST", "/admin/reload"),
        ):
            status, body = await api(method, b.base + path, token=USER_TOKEN)
            assert status == 403 and "admin role" in body["error"]["message"], (path, status, body)
            status, body = await api(method, b.base + path, token=None)
            assert status == 401, (path, status, body)
        refused = [e for e in b.named("request_rejected") if e["status"] == 403]
        assert len(refused) == 5 and all(e["token"] == "alice" for e in refused), refused
        assert not b.named("audit") and not b.named("server_restarting")
        status, body = await api("GET", b.base + "/admin/servers")
        assert status == 200 and [s["name"] for s in body["servers"]] == ["demo"], body


async def test_admin_lists_and_ends_sessions(bridge):
    async with bridge(admin_config()) as b:
        url = b.url("demo", "mcp")
        async with connect(url, streamable=True, headers=ALICE) as ended, connect(url, streamable=True, headers=ALICE) as other:
            call = await call_in_flight(ended)
            status, body = await api("GET", b.base + "/admin/sessions?server=demo&principal=alice")
            assert status == 200, body
            by_flight = sorted(body["sessions"], key=lambda s: s["in_flight"])
            assert [s["in_flight"] for s in by_flight] == [0, 1], body
            target = by_flight[1]
            assert target["principal"] == "alice" and target["transport"] == "streamable", target
            assert target["protocol_version"] and target["age_s"] >= 0 and target["idle_s"] >= 0, target
            assert (await api("GET", b.base + "/admin/sessions?principal=nobody"))[1] == {"sessions": []}

            status, body = await api("DELETE", f"{b.base}/admin/sessions/{target['id']}")
            assert status == 200 and body == {"ended": target["id"], "server": "demo", "calls_failed": 1}, body
            # Its call in flight fails at once, is cancelled upstream, and the session is gone.
            with pytest.raises(Exception, match="ended by an administrator"):
                async with asyncio.timeout(10):
                    await call
            await b.wait_for("audit", where=lambda e: e.get("method") == "tools/call" and e["outcome"] == "cancelled")
            await b.wait_for("session_closed", where=lambda e: e["session"] == target["id"] and e["reason"] == "ended")
            audit = await b.wait_for("audit", where=lambda e: e.get("method") == "admin/end_session")
            assert audit["principal"] == "ops" and audit["session"] == target["id"] and audit["logger"] == "mcp_bridge.audit"
            with pytest.raises(Exception):
                async with asyncio.timeout(10):
                    await ended.session.call_tool("echo", {"text": "after"})
            # Other sessions are untouched.
            assert text_of(await other.session.call_tool("echo", {"text": "still here"})) == "still here"
        status, body = await api("DELETE", f"{b.base}/admin/sessions/{target['id']}")
        assert status == 404, body
        async with aiohttp.ClientSession() as http, http.get(b.base + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as resp:
            text = await resp.text()
            assert 'mcp_bridge_sessions_dropped_total{reason="ended",server="demo"} 1.0' in text
            assert 'mcp_bridge_errors_total{code="-32005",server="demo"} 1.0' in text  # the error its call got


async def test_admin_ending_a_2026_request_fails_its_call_and_counts_it_ended(bridge):
    async with bridge(admin_config()) as b:
        envelope = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "progressToken": "p",
        }
        call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "countdown", "arguments": {"steps": 300, "interval_ms": 100}, "_meta": envelope}}  # fmt: skip
        headers = {**ALICE, "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
                   "Mcp-Method": "tools/call", "Mcp-Name": "countdown"}  # fmt: skip
        async with aiohttp.ClientSession() as http, http.post(b.url("demo", "mcp"), json=call, headers=headers) as stream:
            # Its first progress opened the answer as a stream: the call is under way.
            assert stream.status == 200 and stream.content_type == "text/event-stream"
            first = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 10)
            assert b"notifications/progress" in first, first
            status, body = await api("GET", b.base + "/admin/sessions?server=demo")
            [target] = [s for s in body["sessions"] if s["in_flight"] == 1]
            assert target["transport"] == "stateless" and target["principal"] == "alice", body
            status, body = await api("DELETE", f"{b.base}/admin/sessions/{target['id']}")
            assert status == 200 and body["calls_failed"] == 1, body
            async with asyncio.timeout(10):
                rest = await stream.content.read()  # to the end of the stream
        final = [json.loads(line[6:]) for line in rest.decode().splitlines() if line.startswith("data: ") and '"id"' in line][-1]
        assert final["id"] == 7 and "ended by an administrator" in final["error"]["message"], rest
        await b.wait_for("audit", where=lambda e: e.get("method") == "tools/call" and e["outcome"] == "cancelled")
        async with aiohttp.ClientSession() as http, http.get(b.base + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as resp:
            text = await resp.text()
            assert 'mcp_bridge_sessions_dropped_total{reason="ended",server="demo"} 1.0' in text
            assert 'mcp_bridge_errors_total{code="-32005",server="demo"} 1.0' in text  # the error its call got


async def test_admin_ending_an_sse_session_ends_its_stream(bridge):
    async with bridge(admin_config()) as b:
        async with aiohttp.ClientSession() as http, http.get(b.url("demo"), headers=ALICE) as stream:
            assert stream.status == 200
            first = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 10)
            session_id = first.decode().split("session_id=")[1].split()[0]
            status, body = await api("GET", b.base + "/admin/sessions")
            assert [(s["id"], s["transport"]) for s in body["sessions"]] == [(session_id, "sse")], body
            status, body = await api("DELETE", f"{b.base}/admin/sessions/{session_id}")
            assert status == 200, body
            async with asyncio.timeout(10):
                rest = await stream.content.read()  # to the end of the stream
            assert b"event: message" not in rest, rest


async def test_admin_restarts_a_server_and_its_sessions_recover(bridge):
    async with bridge(admin_config(drain_timeout="1s")) as b:
        url = b.url("demo", "mcp")
        async with connect(url, streamable=True, headers=ALICE) as c, connect(b.url("demo"), headers=ALICE) as s:
            assert text_of(await c.session.call_tool("echo", {"text": "before"})) == "before"
            old = b.server_pids()
            # A call that outlasts the drain (limits.drain_timeout) fails when the process stops.
            slow = await call_in_flight(c)
            restart = asyncio.create_task(api("POST", f"{b.base}/admin/servers/demo/restart"))
            await b.wait_for("audit", where=lambda e: e.get("method") == "admin/restart_server")
            status, body = await api("POST", f"{b.base}/admin/servers/demo/restart")  # while it drains
            assert status == 409 and "already restarting" in body["error"]["message"], body
            status, body = await restart
            assert status == 200 and body == {"restarted": "demo", "processes": 1}, body
            with pytest.raises(Exception, match="restarted by ops"):
                async with asyncio.timeout(10):
                    await slow
            await b.wait_for("server_started", where=lambda e: e["pid"] not in old)
            audit = await b.wait_for("audit", where=lambda e: e.get("method") == "admin/restart_server")
            assert audit["principal"] == "ops" and audit["server"] == "demo", audit
            # The stopped process was stopped gently (not a crash, not a forced kill).
            assert not b.named("server_restart_forced") and not b.named("server_exited")
            assert text_of(await c.session.call_tool("echo", {"text": "after"})) == "after"
            assert text_of(await s.session.call_tool("echo", {"text": "sse after"})) == "sse after"
        assert (await api("POST", f"{b.base}/admin/servers/nope/restart"))[0] == 404


async def test_admin_sessions_are_filtered_by_server_and_idle_is_since_the_last_request(bridge):
    """`?server=` lists that server's sessions only (none for a server with none, or no such
    server); `idle_s` counts from the client's last request, so a session used after it opened
    is less idle than it is old."""
    config = admin_config()
    config["servers"]["other"] = config["servers"]["demo"]
    async with bridge(config) as b:
        async with connect(b.url("demo", "mcp"), streamable=True, headers=ALICE) as used, connect(b.url("other"), headers=ALICE):
            assert text_of(await used.session.call_tool("echo", {"text": "now"})) == "now"
            status, body = await api("GET", b.base + "/admin/sessions")
            assert status == 200 and sorted((s["server"], s["transport"]) for s in body["sessions"]) == [("demo", "streamable"), ("other", "sse")]
            for server, transport in (("demo", "streamable"), ("other", "sse")):
                status, body = await api("GET", f"{b.base}/admin/sessions?server={server}")
                assert status == 200 and [(s["server"], s["transport"]) for s in body["sessions"]] == [(server, transport)], body
            assert (await api("GET", b.base + "/admin/sessions?server=nope"))[1] == {"sessions": []}
            (demo_session,) = (await api("GET", b.base + "/admin/sessions?server=demo"))[1]["sessions"]
            assert 0 <= demo_session["idle_s"] < demo_session["age_s"], demo_session


def test_idle_s_is_the_time_since_the_clients_last_request_not_the_sessions_age() -> None:
    from bridge.gateway.sessions import Session
    from bridge.ops.admin import describe

    class Listed(Session):
        transport = "streamable"

        def attached(self) -> bool:
            return False

    class Gateway:
        name = "demo"

        def negotiated_version(self, session: Session) -> str:
            return "2025-06-18"

        def session_inflight(self, session: Session) -> int:
            return 0

    session = Listed("demo", "alice")
    session.created, session.last_seen = 1000.0, 1060.0  # opened, then last used a minute later
    listed = describe(Gateway(), session, 1075.5)  # type: ignore[arg-type]
    assert (listed["age_s"], listed["idle_s"], listed["principal"], listed["attached"]) == (75.5, 15.5, "alice", False), listed


async def test_an_admin_restart_lets_the_calls_in_flight_and_their_follow_ups_finish_first(bridge):
    """The restart waits up to limits.drain_timeout for the calls in flight, then for a quiet
    pause (0.5 s with no request): a call that ends in time gets its answer from the old
    process, and so does the request its client sends next, a moment later (the official
    SDKs list the tools after a call's result); only then is the process restarted."""
    config = admin_config(drain_timeout="30s")
    config["servers"] = {"f": {"command": PY, "args": [str(SERVERS / "faulty.py")]}}
    async with bridge(config) as b:
        async with connect(b.url("f", "mcp"), streamable=True, headers=ALICE) as c:
            old = text_of(await c.session.call_tool("pid", {}))
            mark = len(b.events)
            slow = asyncio.create_task(c.session.call_tool("slow", {"ms": 1000}))
            await b.wait_for("server_stderr", where=lambda e: e["line"].startswith("faulty: slow"), start=mark)
            restart = asyncio.create_task(api("POST", f"{b.base}/admin/servers/f/restart"))
            await b.wait_for("audit", where=lambda e: e.get("method") == "admin/restart_server", start=mark)
            async with asyncio.timeout(10):
                assert text_of(await slow) == "slept"
            await asyncio.sleep(0.25)  # the client's next request comes a moment after the answer, within the quiet pause
            assert text_of(await c.session.call_tool("pid", {})) == old, "the follow-up did not reach the process that answered"
            assert not restart.done()
            status, body = await restart
            assert status == 200 and body == {"restarted": "f", "processes": 1}, body
            started = await b.wait_for("server_started", where=lambda e: str(e["pid"]) != old, start=mark)
            assert text_of(await c.session.call_tool("pid", {})) == str(started["pid"])
            assert not b.named("server_exited")


async def test_an_admin_hanging_up_mid_restart_does_not_cancel_it(bridge):
    """The admin's connection drops while the restart waits for a call in flight: the restart
    goes on (the call is answered, the process restarted), and the next one is not refused as
    already under way."""
    async with bridge(admin_config(drain_timeout="30s")) as b:
        async with connect(b.url("demo", "mcp"), streamable=True, headers=ALICE) as c:
            old = b.server_pids()
            call = await call_in_flight(c, steps=15)
            mark = len(b.events)
            reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
            request = f"POST /admin/servers/demo/restart HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: 0\r\n\r\n"
            writer.write(request.encode())
            await b.wait_for("audit", where=lambda e: e.get("method") == "admin/restart_server", start=mark)
            writer.transport.abort()  # hung up, before any answer
            async with asyncio.timeout(10):
                assert text_of(await call) == "done"
            try:
                await b.wait_for("server_started", timeout=10, where=lambda e: e["pid"] not in old)
            except TimeoutError:
                raise AssertionError("the restart ended with its admin's connection: no new process") from None
            assert text_of(await c.session.call_tool("echo", {"text": "after"})) == "after"
            status, body = await api("POST", f"{b.base}/admin/servers/demo/restart")
            assert status == 200 and body == {"restarted": "demo", "processes": 1}, body


async def test_admin_reload(bridge):
    async with bridge(admin_config()) as b:
        config = yaml.safe_load(b.config_path.read_text())
        config["servers"]["second"] = {"command": PY, "args": ["-m", "bridge.demo_server"]}
        b.config_path.write_text(yaml.safe_dump(config))
        status, body = await api("POST", f"{b.base}/admin/reload")
        assert status == 200 and body == {"reloaded": True, "servers": ["demo", "second"]}, body
        await b.wait_for("config_reloaded")
        config["servers"]["second"]["mode"] = "sometimes"
        b.config_path.write_text(yaml.safe_dump(config))
        status, body = await api("POST", f"{b.base}/admin/reload")
        assert status == 422 and body["reloaded"] is False, body
        assert any(p.startswith("servers.second.mode: expected one of") for p in body["problems"]), body
        outcomes = [(e["principal"], e["outcome"]) for e in b.named("audit") if e.get("method") == "admin/reload"]
        assert outcomes == [("ops", "done"), ("ops", "rejected")], outcomes


async def test_admin_api_without_tokens_is_loopback_only(bridge):
    from bridge.access.guard import Guard
    from bridge.config.load import parse
    from bridge.http.access import check_access
    from bridge.http.errors import HttpError

    async with bridge({"servers": {"demo": {"command": PY, "args": ["-m", "bridge.demo_server"]}}}) as b:
        status, body = await api("GET", b.base + "/admin/servers", token=None)
        assert status == 200 and body["servers"][0]["name"] == "demo", body
    # Open to anyone off loopback (allow_unauthenticated): never the admin API.
    config = parse(yaml.safe_dump({
        "listen": {"host": "0.0.0.0"}, "security": {"allow_unauthenticated": True}, "servers": {"d": {"command": PY}},
    }))  # fmt: skip
    reasons: list[str] = []
    common = {"method": "GET", "server": None, "host": "bridge.example", "origin": None, "authorization": None, "remote": "10.0.0.1"}
    check_access(Guard(config), reasons.append, path="/status", **common)
    with pytest.raises(HttpError) as refused:
        check_access(Guard(config), reasons.append, path="/admin/servers", **common)
    assert refused.value.status == 403 and reasons == ["not_admin"]


# ============================================================================ ctl


async def ctl(b: Any, token_file: Path | None, *args: str) -> tuple[int, str, str]:
    """`mcp-bridge ctl` against the daemon, as a subprocess (the daemon's log keeps being read meanwhile)."""
    auth = ["--token-file", str(token_file)] if token_file is not None else []
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "bridge", "ctl", "--url", b.base, *auth, *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_ctl_every_action(bridge, tmp_path: Path):
    admin, user = tmp_path / "admin-token", tmp_path / "user-token"
    admin.write_text(ADMIN_TOKEN + "\n")
    user.write_text(USER_TOKEN)
    async with bridge(admin_config()) as b:
        async with connect(b.url("demo", "mcp"), streamable=True, headers=ALICE) as c:
            code, out, err = await ctl(b, admin, "servers")
            assert code == 0, err
            header, row = out.splitlines()
            assert header.split()[:3] == ["SERVER", "MODE", "READY"] and row.split()[:4] == ["demo", "shared", "yes", "1"], out
            code, out, err = await ctl(b, admin, "sessions", "--json")
            assert code == 0, err
            (listed,) = json.loads(out)["sessions"]
            assert listed["principal"] == "alice" and listed["transport"] == "streamable", listed
            code, out, err = await ctl(b, admin, "sessions", "--server", "demo")
            assert code == 0 and listed["id"] in out and "alice" in out, (out, err)
            for flag, value in (("--server", "other"), ("--principal", "bob")):  # filters the admin API applies
                code, out, err = await ctl(b, admin, "sessions", flag, value, "--json")
                assert code == 0 and json.loads(out)["sessions"] == [], (flag, out, err)

            for asked in (listed["id"], listed["id"][:12]):
                code, out, err = await ctl(b, user, "end", asked)
                assert code == 1 and "403" in err and "admin role" in err, (code, out, err)
            code, out, err = await ctl(b, None, "servers")
            assert code == 1 and "401" in err, (code, out, err)

            code, out, err = await ctl(b, admin, "restart", "demo")
            assert code == 0 and out.strip() == "restarted demo (1 processes)", (out, err)
            assert text_of(await c.session.call_tool("echo", {"text": "recovered"})) == "recovered"
            code, out, err = await ctl(b, admin, "end", "0123456789abcdef-none")
            assert code == 1 and "404 no session '0123456789abcdef-none'" in err, (code, out, err)
            # What the status page shows of an id, or any unique prefix of it, will do.
            code, out, err = await ctl(b, admin, "end", listed["id"][:12])
            assert code == 0 and out.startswith(f"ended session {listed['id']} of demo"), (out, err)
            code, out, err = await ctl(b, admin, "end", listed["id"], "--json")
            assert code == 1 and json.loads(out)["error"]["message"] == f"no session {listed['id']!r}", (out, err)
        code, out, err = await ctl(b, admin, "reload")
        assert code == 0 and out.strip() == "reloaded: serving demo", (out, err)
        assert [e["method"] for e in b.named("audit") if e["principal"] == "ops"] == [
            "admin/restart_server", "admin/end_session", "admin/reload",
        ]  # fmt: skip
        assert [e["session"] for e in b.named("audit") if e["method"] == "admin/end_session"] == [listed["id"]]
    # A daemon that is gone: exit 2, said plainly.
    code, out, err = await ctl(b, admin, "servers")
    assert code == 2 and "cannot reach" in err, (code, err)


def test_ending_a_session_by_prefix_needs_exactly_one_match() -> None:
    from types import SimpleNamespace

    from bridge.http.errors import HttpError
    from bridge.ops.admin import _session

    a, b = SimpleNamespace(sessions={"4f0c1a": "s1", "4f0c9b": "s2"}), SimpleNamespace(sessions={"77e2": "s3", "4f": "s4"})
    gateways: Any = {"a": a, "b": b}
    assert _session(gateways, "4f0c9b") == (a, "s2") and _session(gateways, "4f") == (b, "s4")  # an exact id first
    assert _session(gateways, "4f0c1") == (a, "s1") and _session(gateways, "7") == (b, "s3")
    for asked, status, message in (
        ("4f0c", 409, "2 sessions have ids that start with '4f0c': give more of the id"),
        ("4f0c1a0", 404, "no session '4f0c1a0'"),
        ("x", 404, "no session 'x'"),
    ):
        with pytest.raises(HttpError) as refused:
            _session(gateways, asked)
        assert (refused.value.status, refused.value.message) == (status, message)


# ==================================================================== status page

ARTIFACTS = Path(os.environ.get("MCP_BRIDGE_TEST_ARTIFACTS", ROOT / "tests" / "artifacts"))


def by_id(element: str, js: str) -> str:
    return f"document.getElementById({json.dumps(element)}){js}"


async def sign_in(page: Page, token: str) -> None:
    await page.wait_for(by_id("signin", ".hidden === false"))
    await page.evaluate(by_id("token", f".value = {json.dumps(token)}") + "; " + by_id("signin", ".requestSubmit()"))


VISIBLE_BUTTONS = "[...document.querySelectorAll('button')].filter(b => b.offsetParent !== null).map(b => b.textContent)"
VISIBLE_HEADERS = "[...document.querySelectorAll('#servers th')].filter(th => !th.hidden).map(th => th.textContent)"


def sessions_shown(server: str) -> str:
    return f"document.querySelector('tr[data-server={server}] td.sessions')?.textContent"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian package chromium)")
async def test_status_page_assets_are_served_to_anyone_locked_down(bridge):
    """The page and its assets hold nothing of the daemon, so no token is needed; each comes
    with headers that let it run only its own script, never inside another site's frame,
    never sniffed as another type, and never tell another site where it came from."""
    async with bridge(admin_config()) as b, aiohttp.ClientSession() as http:
        for path, kind in (("/ui", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")):
            async with http.get(b.base + path) as resp:
                assert resp.status == 200 and resp.content_type == kind, path
                csp = {d.split()[0]: d.split()[1:] for d in resp.headers["Content-Security-Policy"].split("; ")}
                assert csp["default-src"] == ["'none'"] and csp["script-src"] == ["'self'"], csp
                assert csp["frame-ancestors"] == csp["form-action"] == csp["base-uri"] == ["'none'"], csp
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
                assert resp.headers["Referrer-Policy"] == "no-referrer"


async def test_status_page_in_a_browser(bridge, tmp_path: Path):
    config = admin_config()
    config["servers"]["private"] = {"command": PY, "args": ["-m", "bridge.demo_server"]}
    config["security"]["tokens"][1]["servers"] = ["demo"]  # alice may not use private
    async with bridge(config) as b:
        async with aiohttp.ClientSession() as http, http.get(b.base + "/ui") as resp:
            assert resp.status == 200 and resp.content_type == "text/html"
            csp = resp.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp, csp
        async with browser.launch(tmp_path) as page:
            await page.navigate(b.base + "/ui")
            # Without a token: a sign-in form, nothing of the daemon.
            await sign_in(page, "not-a-token-at-all-000")
            await page.wait_for(by_id("signin-error", ".textContent === 'That token was refused.'"))
            assert "demo" not in await page.evaluate("document.body.innerText")
            # A client's token: read-only, its own servers only, and no server's stderr.
            await sign_in(page, USER_TOKEN)
            await page.wait_for(sessions_shown("demo") + " === '0'")
            assert await page.evaluate(by_id("viewer", ".textContent")) == "read-only"
            assert await page.evaluate(by_id("sessions-part", ".hidden")) is True
            assert await page.evaluate(VISIBLE_BUTTONS) == ["Sign out"]
            assert await page.evaluate("[...document.querySelectorAll('tr[data-server]')].map(r => r.dataset.server)") == ["demo"]
            assert await page.evaluate(VISIBLE_HEADERS) == ["Server", "Mode", "Ready", "Sessions", "In flight", "Processes", "Restarts"]
            assert await page.evaluate("document.querySelectorAll('td.stderr').length") == 0
            await page.evaluate(by_id("signout", ".click()"))
            # An admin: sessions too, and the actions; counts follow sessions opening and closing.
            await sign_in(page, ADMIN_TOKEN)
            await page.wait_for(by_id("viewer", ".textContent === 'admin'"))
            url = b.url("demo", "mcp")
            async with connect(url, streamable=True, headers=ALICE), connect(b.url("demo"), headers=ALICE):
                await page.wait_for(sessions_shown("demo") + " === '2'")
                await page.wait_for("document.querySelectorAll('tr[data-session]').length === 2")
                assert await page.evaluate("document.querySelector('tr[data-server=demo] td.name').textContent") == "demo"
                assert await page.evaluate(VISIBLE_BUTTONS) == ["Sign out", "Reload config", "Restart", "Restart", "End", "End"]
                assert "Stderr (last lines)" in await page.evaluate(VISIBLE_HEADERS)
                assert await page.evaluate("document.querySelectorAll('td.stderr').length") == 2
                # The whole id, as `mcp-bridge ctl end` takes it.
                _, listed = await api("GET", b.base + "/admin/sessions")
                shown = await page.evaluate("[...document.querySelectorAll('tr[data-session] td.mono')].map(td => td.textContent)")
                assert sorted(shown) == sorted(s["id"] for s in listed["sessions"]), (shown, listed)
                await page.screenshot(ARTIFACTS / "status-page.png")
            await page.wait_for(sessions_shown("demo") + " === '0'")
            await page.wait_for("document.querySelectorAll('tr[data-session]').length === 0")
        assert not page.errors, page.errors
        assert page.requests and all(u.startswith(b.base + "/") for u in page.requests), page.requests
        assert (ARTIFACTS / "status-page.png").stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian package chromium)")
async def test_status_page_without_tokens_on_loopback(bridge, tmp_path: Path):
    # No authentication configured: loopback's viewers are admins, with no sign-in (as with
    # a proxy in front that adds each request's Authorization header).
    async with bridge({"servers": {"demo": {"command": PY, "args": ["-m", "bridge.demo_server"]}}}) as b:
        async with browser.launch(tmp_path) as page:
            await page.navigate(b.base + "/ui")
            await page.wait_for(by_id("viewer", ".textContent === 'admin'"))
            assert await page.evaluate(by_id("signin", ".hidden")) is True
            await page.wait_for(sessions_shown("demo") + " === '0'")
        assert not page.errors and not page.http_errors, (page.errors, page.http_errors)
