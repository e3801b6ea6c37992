"""Operators' edges: the one-line start, the `mcpServers` file, the admin API and `mcp-bridge ctl`.

Each runs the real daemon (conftest's `bridge`, or the one-liner through it) with
real server processes, and the official SDK as the client.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from conftest import PY, ROOT, SERVERS
from sdk import connect, text_of

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
    async with bridge({}, command=command, env={"MCP_BRIDGE_TOKEN_FILE": str(token_file)}) as b:
        url = b.url("default", "mcp")
        status, body = await post(url, INITIALIZE)
        assert status == 401, body
        status, body = await post(url, INITIALIZE, token=TOKEN)
        assert status == 200 and '"serverInfo"' in body, body


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
