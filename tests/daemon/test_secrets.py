"""Secrets stay where they belong: a server's environment holds only what it needs,
and tokens can come from files that are read again on reload.

Real daemon (the `bridge` fixture) with a known environment, real server
processes (tests/servers/faulty.py, whose `environ` tool returns its whole
environment), real signals. Every wait is on a log event or a reply, bounded.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
from support.daemon import Bridge, faulty
from support.rawclient import RawSse, call

from bridge.process.env import CHILD_ENV

TOKEN = "bridge-token-0123456789abcdef"
# What the daemon holds and no server may see: the bridge's own token, cloud keys, anything else.
DAEMON_SECRETS = {
    "MCP_BRIDGE_TOKEN": TOKEN,
    "AWS_SECRET_ACCESS_KEY": "aws-secret-key-value",
    "AWS_ACCESS_KEY_ID": "aws-access-key-id-value",
    "OTHER_SECRET": "other-secret-value",
    "GLOBAL_SETTING": "not-under-the-GLOB_-prefix",
}
# Every variable of the minimal set (README "Server environment"), each with a value to find.
MINIMAL = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/someone",
    "USER": "someone",
    "LOGNAME": "someone",
    "SHELL": "/bin/sh",
    "TERM": "dumb",
    "TMPDIR": "/tmp/someone",
    "TZ": "Europe/Paris",
    "LANG": "C.UTF-8",
    "LANGUAGE": "en",
    "XDG_CONFIG_HOME": "/xdg/config",
    "XDG_CACHE_HOME": "/xdg/cache",
    "XDG_DATA_HOME": "/xdg/data",
    "XDG_STATE_HOME": "/xdg/state",
    "XDG_RUNTIME_DIR": "/xdg/run",
    "XDG_CONFIG_DIRS": "/etc/xdg",
    "XDG_DATA_DIRS": "/usr/share",
    "HTTP_PROXY": "http://proxy.example:3128",
    "HTTPS_PROXY": "http://proxy.example:3128",
    "NO_PROXY": "localhost,127.0.0.1",
    "ALL_PROXY": "socks5://proxy.example:1080",
    "http_proxy": "http://proxy.example:3128",
    "https_proxy": "http://proxy.example:3128",
    "no_proxy": "localhost,127.0.0.1",
    "all_proxy": "socks5://proxy.example:1080",
    "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
    "SSL_CERT_DIR": "/etc/ssl/certs",
    "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
    "CURL_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
    "NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/extra.pem",
    # LC_*: any name with the prefix
    "LC_ALL": "C.UTF-8",
    "LC_TIME": "C.UTF-8",
}
INHERITED = {"AWS_REGION": "eu-west-3", "GLOB_A": "glob-a", "GLOB_B": "glob-b"}


def text_of(reply: dict[str, Any]) -> str:
    assert "result" in reply, reply
    return reply["result"]["content"][0]["text"]


async def environ_of(c: RawSse) -> dict[str, str]:
    await c.initialize()
    status, body = await c.post({"jsonrpc": "2.0", "id": "env", "method": "tools/call", "params": call("environ")})
    assert status == 202, (status, body)
    return json.loads(text_of(await c.response("env", timeout=10)))


def test_the_minimal_list_here_is_the_bridges() -> None:
    assert set(MINIMAL) - {"LC_ALL", "LC_TIME"} | {"LC_*"} == set(CHILD_ENV)


async def test_a_server_sees_the_minimal_environment_its_inherit_env_and_its_env(bridge: Any) -> None:
    servers = {
        "f": {
            **faulty(),
            "env": {"OWN_SETTING": "own-value", "TZ": "UTC"},
            "inherit_env": ["AWS_REGION", "GLOB_*", "NOT_SET_ANYWHERE"],
        },
        "g": {**faulty(), "env": {"G_API_KEY": "g-api-key-value"}},
    }
    config = {"security": {"tokens": [{"name": "ops", "token": "${MCP_BRIDGE_TOKEN}"}]}, "servers": servers}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with bridge(config, env={**DAEMON_SECRETS, **MINIMAL, **INHERITED}) as b:
        async with RawSse(b.url("f"), headers=auth) as cf, RawSse(b.url("g"), headers=auth) as cg:
            seen_f, seen_g = await environ_of(cf), await environ_of(cg)

    for seen, own in ((seen_f, servers["f"]["env"]), (seen_g, servers["g"]["env"])):
        # The bridge's venv bin/ is appended to PATH, as before.
        assert seen["PATH"].startswith(MINIMAL["PATH"] + ":"), seen["PATH"]
        for name, value in {**MINIMAL, **own}.items():
            if name != "PATH":
                assert seen.get(name) == own.get(name, value), (name, seen.get(name))
        dump = json.dumps(seen)
        for name, value in DAEMON_SECRETS.items():
            assert name not in seen and value not in dump, name
        # Nothing beyond the minimal set (any LC_* the test runner has included), inherit_env and env.
        extra = {n for n in seen if n not in MINIMAL and not n.startswith("LC_") and n not in own}
        assert extra == (set(INHERITED) if own is servers["f"]["env"] else set()), extra

    assert {n: seen_f[n] for n in INHERITED} == INHERITED
    assert "NOT_SET_ANYWHERE" not in seen_f
    # One server's env never reaches another.
    assert "G_API_KEY" not in seen_f and "g-api-key-value" not in json.dumps(seen_f)
    assert "OWN_SETTING" not in seen_g and "AWS_REGION" not in seen_g


async def status_code(b: Bridge, token: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(b.base + "/status", headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status


async def sighup(b: Bridge, outcome: str) -> dict[str, Any]:
    mark = len(b.events)
    b.proc.send_signal(signal.SIGHUP)
    return await b.wait_for(outcome, start=mark, timeout=15)


async def test_token_file_is_read_again_on_reload_and_never_logged(bridge: Any, tmp_path: Path) -> None:
    first, second = "first-token-0123456789abcdef", "second-token-0123456789abcdef"
    path = tmp_path / "token"
    path.write_text(first + "\n")
    config = {"security": {"tokens": [{"name": "ops", "token_file": str(path)}]}, "servers": {"f": faulty()}}
    async with bridge(config) as b:
        assert await status_code(b, first) == 200
        assert await status_code(b, second) == 401

        path.write_text(second + "\n")
        reloaded = await sighup(b, "config_reloaded")
        assert reloaded["restarted"] == [] and reloaded["unchanged"] == 1, reloaded  # no server restarts for a token
        assert await status_code(b, first) == 401
        assert await status_code(b, second) == 200

        # A file that cannot be read rejects the reload, naming the key and the file; the token in force stays.
        path.unlink()
        rejected = await sighup(b, "reload_rejected")
        assert rejected["problems"] == [f"security.tokens[0].token_file: cannot read {path}: No such file or directory"]
        assert await status_code(b, second) == 200

    logged = "\n".join(json.dumps(e) for e in b.events)
    assert first not in logged and second not in logged
