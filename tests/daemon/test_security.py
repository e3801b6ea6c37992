"""Access rules and limits: who may talk to the bridge, and what it refuses.

The `Guard` rules are tested without HTTP; everything else runs the real daemon
(conftest `bridge`) on an ephemeral loopback port with real server processes.
Every wait is on a log event, a message or a process exit, bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import socket
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from support.daemon import PY, ROOT, Bridge, faulty
from support.rawclient import RawSse, call

from bridge.access import guard
from bridge.access.guard import Guard
from bridge.config.load import parse

# Tokens are long, distinct and easy to spot in a log line.
ALICE = "alice-tok-3f9c2b7e1d8a4c6f0b5e2d91"
BOB = "bob-tok-a71e55c0d94b3f2e8c6a1b07"
CAROL = "carol-tok-0c4d8e2f6a1b3c5d7e9f1a2b"
WRONG = "wrong-tok-5d5d5d5d5d5d5d5d5d5d5d5d"
SECRETS = (ALICE, BOB, CAROL, WRONG)
ENV = {"ALICE_TOKEN": ALICE, "CAROL_TOKEN": CAROL}
ORIGIN = "https://app.example.com"
EVIL_ORIGIN = "https://evil.example.com"
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def auth_config(**extra_security: Any) -> dict[str, Any]:
    """Two servers; alice and carol (tokens from the environment) may use `f`, bob (a sha256) every server."""
    return {
        "servers": {"f": faulty(), "g": faulty()},
        "security": {
            "tokens": [
                {"name": "alice", "token": "${ALICE_TOKEN}", "servers": ["f"]},
                {"name": "bob", "sha256": sha256_hex(BOB), "servers": ["*"]},
                {"name": "carol", "token": "${CAROL_TOKEN}", "servers": ["f"]},
            ],
            **extra_security,
        },
    }


async def fetch(
    method: str, url: str, headers: dict[str, str] | None = None, data: Any = None, ssl_context: Any = None
) -> tuple[int, Any, str | None]:
    """One request: status, headers, and the body (None for an event stream, which is left unread)."""
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, headers=headers, data=data, ssl=ssl_context) as resp:
            if resp.content_type == "text/event-stream":
                return resp.status, resp.headers, None
            return resp.status, resp.headers, await resp.text()


def jsonrpc_error(body: str | None) -> dict[str, Any]:
    """The JSON-RPC error object an HTTP error carries as its body."""
    assert body is not None
    reply = json.loads(body)
    assert reply["jsonrpc"] == "2.0" and "error" in reply, reply
    error = reply["error"]
    assert isinstance(error["code"], int) and isinstance(error["message"], str) and error["message"], reply
    assert "\n" not in error["message"], reply
    return error


def assert_no_secrets(b: Bridge, *texts: str | None, secrets_: Iterable[str] = SECRETS) -> None:
    """No token value in any log event the daemon wrote (JSON or not), nor in `texts`."""
    for event in b.events:
        line = json.dumps(event)
        for secret in secrets_:
            assert secret not in line, f"token {secret[:6]}... logged: {line[:300]}"
    for text in texts:
        for secret in secrets_:
            assert secret not in (text or ""), f"token {secret[:6]}... in {text[:300] if text else text}"


def rejections(b: Bridge, start: int = 0) -> list[dict[str, Any]]:
    return [e for e in b.events[start:] if e.get("event") == "request_rejected"]


def no_tracebacks(b: Bridge) -> None:
    bad = [e for e in b.events if e.get("event") == "unparsed" or e.get("level") in ("error", "critical")]
    assert not bad, "\n".join(json.dumps(e)[:300] for e in bad[:40])


async def echo(c: RawSse, text: str, request_id: Any) -> str:
    reply = await c.request("tools/call", call("echo", {"text": text}), request_id=request_id)
    assert "result" in reply, reply
    return reply["result"]["content"][0]["text"]


# =============================================================================== Guard


def make_guard(
    tokens: list[dict[str, Any]] | None = None,
    host: str = "127.0.0.1",
    origins: Iterable[str] = (),
    hosts: Iterable[str] = (),
    allow_unauthenticated: bool = False,
    environ: dict[str, str] | None = None,
) -> Guard:
    data = {
        "servers": {"f": {"command": "x"}, "g": {"command": "x"}},
        "listen": {"host": host, "port": 0},
        "security": {
            "tokens": tokens or [],
            "allowed_origins": list(origins),
            "allowed_hosts": list(hosts),
            "allow_unauthenticated": allow_unauthenticated,
        },
    }
    return Guard(parse(yaml.safe_dump(data), "<test>", environ or {}))


TOKENS = [
    {"name": "alice", "token": "${ALICE_TOKEN}", "servers": ["f"]},
    {"name": "bob", "sha256": sha256_hex(BOB), "servers": ["*"]},
    {"name": "carol", "token": "${CAROL_TOKEN}", "servers": ["f", "g"]},
    {"name": "dave", "sha256": sha256_hex("dave-tok-77777777777777777777").upper(), "servers": ["g"]},
]


def test_guard_plain_and_sha256_tokens() -> None:
    g = make_guard(TOKENS, environ=ENV)
    assert g.principals
    for header, name in [
        (f"Bearer {ALICE}", "alice"),
        (f"Bearer {BOB}", "bob"),
        (f"Bearer {CAROL}", "carol"),
        ("Bearer dave-tok-77777777777777777777", "dave"),  # configured as an upper-case digest
        (f"bearer {ALICE}", "alice"),  # the scheme is case-insensitive (RFC 7235)
        (f"BEARER {BOB}", "bob"),
        (f"Bearer   {ALICE}", "alice"),  # 1*SP between scheme and token (RFC 7235)
    ]:
        principal = g.authenticate(header)
        assert principal is not None and principal.name == name, (header, principal)
    # The token is what is compared, never its digest.
    assert g.authenticate(f"Bearer {sha256_hex(BOB)}") is None
    # No tokens configured: nothing to authenticate against, and no auth required.
    assert not make_guard().principals


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer    ",
        f"Basic {ALICE}",
        f"Token {ALICE}",
        ALICE,
        f"Bearer{ALICE}",
        f"Bearer {ALICE}x",
        f"Bearer {ALICE[:-1]}",
        f"Bearer {ALICE.upper()}",
        f"Bearer {WRONG}",
        f"Bearer {ALICE} {BOB}",
        "Bearer \u00e9\u00e8\u00ea-not-a-token",
        "Bearer \udcff\udcfe",  # how aiohttp hands over header bytes that are not UTF-8
        "Bearer \x00",
    ],
    ids=repr,
)
def test_guard_rejects_wrong_missing_malformed(header: str | None) -> None:
    g = make_guard(TOKENS, environ=ENV)
    assert g.authenticate(header) is None


@pytest.mark.parametrize("which", ["first", "middle", "last", "none"])
def test_guard_compares_every_token(monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    """Constant time: every configured digest is compared, wherever (or whether) the match is."""
    g = make_guard(TOKENS, environ=ENV)
    compared: list[tuple[bytes, bytes]] = []
    real = guard.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(guard.hmac, "compare_digest", spy)
    token = {"first": ALICE, "middle": BOB, "last": "dave-tok-77777777777777777777", "none": WRONG}[which]
    principal = g.authenticate(f"Bearer {token}")
    expected = {"first": "alice", "middle": "bob", "last": "dave", "none": None}[which]
    assert (principal.name if principal else None) == expected
    assert len(compared) == len(TOKENS), compared
    assert {b for _, b in compared} == {p.digest for p in g.principals}


def test_guard_servers_lists_and_star() -> None:
    g = make_guard(TOKENS, environ=ENV)
    by_name = {p.name: p for p in g.principals}
    assert by_name["alice"].may_use("f") and not by_name["alice"].may_use("g")
    assert by_name["bob"].may_use("f") and by_name["bob"].may_use("g") and by_name["bob"].may_use("added-later")
    assert by_name["carol"].may_use("f") and by_name["carol"].may_use("g") and not by_name["carol"].may_use("h")
    assert by_name["dave"].may_use("g") and not by_name["dave"].may_use("f")
    star_and_list = make_guard([{"name": "x", "token": ALICE, "servers": ["f", "*"]}])
    assert star_and_list.principals[0].may_use("g")


LOOPBACK_HOSTS_OK = [
    None,  # HTTP/1.0: no Host
    "localhost",
    "localhost:8080",
    "LOCALHOST:1",
    "127.0.0.1",
    "127.0.0.1:65535",
    "127.0.0.2:80",
    "[::1]",
    "[::1]:8080",
]
LOOPBACK_HOSTS_REFUSED = [
    "evil.example.com",
    "evil.example.com:8080",
    "EVIL.example.com",
    "127.0.0.1.evil.example.com",
    "localhost.evil.example.com",
    "localhost.evil.example.com:80",
    "0.0.0.0",
    "10.0.0.1:8080",
    "192.168.1.10",
    "[::]",
    "[2001:db8::1]:80",
    "",
    "localhost:http",  # a port is digits
    "127.0.0.1:8o",
]


@pytest.mark.parametrize("bind", ["127.0.0.1", "::1", "localhost"])
def test_guard_host_on_loopback(bind: str) -> None:
    g = make_guard(host=bind)
    for host in LOOPBACK_HOSTS_OK:
        assert g.host_allowed(host), (bind, host)
    for host in LOOPBACK_HOSTS_REFUSED:
        assert not g.host_allowed(host), (bind, host)


def test_guard_allowed_hosts_on_loopback() -> None:
    g = make_guard(hosts=["bridge.example.com", "other.example.com:8443", "Mixed.Example.COM"])
    for host in ["bridge.example.com", "bridge.example.com:443", "BRIDGE.Example.com", "other.example.com:8443", "localhost:1", "mixed.example.com"]:
        assert g.host_allowed(host), host
    for host in ["evil.example.com", "bridge.example.com.evil.example.com", "example.com", "other.example.com:9999", "bridge.example.com:x"]:
        assert not g.host_allowed(host), host


def test_guard_host_off_loopback() -> None:
    # Not bound to loopback: any Host, unless allowed_hosts narrows it.
    g = make_guard(host="0.0.0.0", allow_unauthenticated=True)
    for host in [None, "evil.example.com", "10.1.2.3:8080", "localhost", "bridge.example.com"]:
        assert g.host_allowed(host), host
    g = make_guard(host="0.0.0.0", allow_unauthenticated=True, hosts=["bridge.example.com"])
    for host in ["bridge.example.com", "bridge.example.com:8443", "Bridge.Example.Com"]:
        assert g.host_allowed(host), host
    for host in ["evil.example.com", "10.1.2.3:8080", "bridge.example.com.evil.example.com"]:
        assert not g.host_allowed(host), host


def test_guard_origin() -> None:
    g = make_guard(origins=[ORIGIN, "http://localhost:3000"])
    for origin in [None, ORIGIN, "http://localhost:3000"]:
        assert g.origin_allowed(origin), origin
    for origin in [
        EVIL_ORIGIN,
        "null",
        "",
        "http://app.example.com",  # another scheme
        "https://app.example.com:444",  # another port
        "https://app.example.com.evil.example.com",
        "https://sub.app.example.com",
        f"{ORIGIN}/",
        "HTTPS://APP.EXAMPLE.COM.EVIL",
        "http://localhost.evil.example.com",
        "file://localhost",
    ]:
        assert not g.origin_allowed(origin), origin
    # No allow-list: only pages served from loopback itself, and only while bound to loopback
    # (what the official SDKs accept, and what the conformance suite's rebinding check sends).
    g = make_guard()
    assert g.origin_allowed(None)
    for origin in ["http://localhost:8080", "http://127.0.0.1:8080", "https://[::1]:1", "http://localhost"]:
        assert g.origin_allowed(origin), origin
    for origin in [ORIGIN, "null", "http://10.0.0.1:8080"]:
        assert not g.origin_allowed(origin), origin
    public = make_guard(host="0.0.0.0", allow_unauthenticated=True)
    for origin in ["http://localhost:8080", "http://127.0.0.1:8080", ORIGIN]:
        assert not public.origin_allowed(origin), origin


def test_guard_host_cache_is_bounded_and_answers_right_when_full() -> None:
    g = make_guard(hosts=["bridge.example.com"])
    for round_ in range(2):  # the second round asks again what the first filled the cache with
        for i in range(3 * guard.HOST_CACHE):
            assert g.host_allowed(f"localhost:{i}"), (round_, i)
            assert not g.host_allowed(f"evil{i}.example.com"), (round_, i)
            assert g.host_allowed("bridge.example.com") and not g.host_allowed("evil.example.com"), (round_, i)
            assert len(g._hosts) <= guard.HOST_CACHE


def test_admit_checks_host_then_origin_then_token_then_server() -> None:
    g = make_guard(TOKENS, origins=[ORIGIN], environ=ENV)
    alice = f"Bearer {ALICE}"
    refusal = guard.admit(g, "evil.example.com", EVIL_ORIGIN, None, "g")
    assert isinstance(refusal, guard.Refusal) and (refusal.status, refusal.kind) == (403, "host")
    refusal = guard.admit(g, "localhost", EVIL_ORIGIN, None, "g")
    assert isinstance(refusal, guard.Refusal) and (refusal.status, refusal.kind) == (403, "origin")
    for header, kind in ((None, "missing_token"), (f"Bearer {WRONG}", "invalid_token")):
        refusal = guard.admit(g, "localhost", ORIGIN, header, "g")
        assert isinstance(refusal, guard.Refusal) and (refusal.status, refusal.kind) == (401, kind)
        assert refusal.headers == {"WWW-Authenticate": guard.WWW_AUTHENTICATE}
    refusal = guard.admit(g, "localhost", ORIGIN, alice, "g")
    assert isinstance(refusal, guard.Refusal) and (refusal.status, refusal.kind) == (403, "forbidden_server")
    assert refusal.detail == {"token": "alice"}
    for server in ("f", None):  # None: a path that names no server (/status, /metrics)
        principal = guard.admit(g, "localhost", None, alice, server)
        assert isinstance(principal, guard.Principal) and principal.name == "alice"
    assert guard.admit(make_guard(), "localhost", None, None, "f") is None  # no tokens: no auth


def test_admit_preflight_needs_no_token_but_the_same_host_and_origin() -> None:
    g = make_guard(TOKENS, origins=[ORIGIN], environ=ENV)
    assert guard.admit(g, "localhost:8080", ORIGIN, None, "g", preflight=True) is None
    for host, origin, kind in (("evil.example.com", ORIGIN, "host"), ("localhost", EVIL_ORIGIN, "origin")):
        refusal = guard.admit(g, host, origin, None, "f", preflight=True)
        assert isinstance(refusal, guard.Refusal) and (refusal.status, refusal.kind) == (403, kind), (host, origin)


# =================================================================== tokens end to end


async def test_token_auth_end_to_end(bridge: Any) -> None:
    async with bridge(auth_config(), env=ENV) as b:
        sse_f, sse_g = b.url("f"), b.url("g")
        bodies: list[str | None] = []

        # Missing, wrong or malformed: 401 with a Bearer challenge and a JSON-RPC error body.
        for headers in [{}, bearer(WRONG), {"Authorization": f"Basic {ALICE}"}, bearer(sha256_hex(BOB)), {"Authorization": "Bearer"}]:
            for url in (sse_f, sse_g, f"{b.base}/servers/f/messages?session_id={'0' * 32}"):
                method = "GET" if url.endswith("/sse") else "POST"
                status, resp_headers, body = await fetch(method, url, headers, data=json.dumps(PING) if method == "POST" else None)
                assert status == 401, (headers, url, status, body)
                assert resp_headers.get("WWW-Authenticate", "").startswith("Bearer"), resp_headers
                jsonrpc_error(body)
                bodies.append(body)

        # A good token for a server it is not allowed to use: 403.
        mark = len(b.events)
        status, resp_headers, body = await fetch("GET", sse_g, bearer(ALICE))
        assert status == 403, (status, body)
        assert "g" in jsonrpc_error(body)["message"]
        bodies.append(body)
        refused = [e for e in rejections(b, mark) if e.get("status") == 403]
        assert refused and refused[0].get("token") == "alice", rejections(b, mark)

        # Allowed: the token from the environment, and the one given as a sha256.
        async with RawSse(sse_f, headers=bearer(ALICE)) as a, RawSse(sse_g, headers=bearer(BOB)) as z:
            assert a.status == 200 and z.status == 200
            await asyncio.gather(a.initialize(), z.initialize())
            assert await echo(a, "from alice", 1) == "from alice"
            assert await echo(z, "from bob", 1) == "from bob"
            opened = {e["session"]: e for e in b.named("session_opened")}
            assert opened[a.session_id].get("owner") == "alice", opened[a.session_id]
            assert opened[z.session_id].get("owner") == "bob", opened[z.session_id]

            # The POST URL needs the token too: without it, 401, and nothing reaches the session.
            status, resp_headers, body = await fetch("POST", a.endpoint, {}, data=json.dumps(PING))
            assert status == 401 and resp_headers.get("WWW-Authenticate", "").startswith("Bearer"), (status, body)
            assert await a.request("ping", request_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}
            assert not a._held, a._held

        # 401 rejections are logged (no token name is known for them); none names a token value.
        unauthorized = [e for e in rejections(b) if e.get("status") == 401]
        assert len(unauthorized) >= 15, unauthorized
        assert_no_secrets(b, *bodies)
    no_tracebacks(b)


async def test_session_belongs_to_its_token(bridge: Any) -> None:
    """Another token, or none, gets exactly what an unknown session gets; the owner's session sees nothing."""
    async with bridge(auth_config(), env=ENV) as b, RawSse(b.url("f"), headers=bearer(ALICE)) as a:
        await a.initialize()
        unknown = a.endpoint.replace(a.session_id, secrets.token_hex(16))
        echo_msg = {"jsonrpc": "2.0", "id": "steal", "method": "tools/call", "params": call("echo", {"text": "stolen"})}

        for label, headers in [("carol", bearer(CAROL)), ("bob", bearer(BOB)), ("no token", {}), ("wrong", bearer(WRONG))]:
            real = await fetch("POST", a.endpoint, headers, data=json.dumps(echo_msg))
            fake = await fetch("POST", unknown, headers, data=json.dumps(echo_msg))
            # Same status, same body: nothing tells a real session id from a made-up one.
            assert (real[0], real[2]) == (fake[0], fake[2]), (label, real, fake)
            if label in ("carol", "bob"):
                assert real[0] == 404, (label, real)
                jsonrpc_error(real[2])
            else:
                assert real[0] in (401, 404), (label, real)

        # The session is untouched: nothing arrived for it, and its owner still uses it.
        assert await a.request("ping", request_id="mine") == {"jsonrpc": "2.0", "id": "mine", "result": {}}
        assert not a._held, a._held
        assert await echo(a, "still mine", 2) == "still mine"
        # Carol can of course open and use her own session on the same server.
        async with RawSse(b.url("f"), headers=bearer(CAROL)) as c:
            await c.initialize()
            assert await echo(c, "carol's", 1) == "carol's"
            # ...and alice cannot use it either.
            status, _, body = await fetch("POST", c.endpoint, bearer(ALICE), data=json.dumps(PING))
            assert status == 404, (status, body)
        assert not a._held, a._held
        assert_no_secrets(b)


async def test_status_and_metrics_need_auth_probes_do_not(bridge: Any) -> None:
    async with bridge(auth_config(), env=ENV) as b:
        # Both servers up and initialized, so /readyz has a reason to say ready.
        async with RawSse(b.url("f"), headers=bearer(BOB)) as c1, RawSse(b.url("g"), headers=bearer(BOB)) as c2:
            await asyncio.gather(c1.initialize(), c2.initialize())
            for path in ("/status", "/metrics"):
                for headers in ({}, bearer(WRONG)):
                    status, resp_headers, body = await fetch("GET", b.base + path, headers)
                    assert status == 401, (path, headers, status, body)
                    assert resp_headers.get("WWW-Authenticate", "").startswith("Bearer")
            status, _, status_body = await fetch("GET", f"{b.base}/status", bearer(BOB))
            assert status == 200, status_body
            assert json.loads(status_body or "")["servers"]["f"]["sessions"] == 1
            status, _, metrics_body = await fetch("GET", f"{b.base}/metrics", bearer(BOB))
            assert status == 200, metrics_body
            assert "mcp_bridge" in (metrics_body or "")
            for path in ("/healthz", "/readyz"):
                for headers in ({}, bearer(WRONG), {"Authorization": "garbage"}):
                    status, _, body = await fetch("GET", b.base + path, headers)
                    assert status == 200, (path, headers, status, body)
            assert_no_secrets(b, status_body, metrics_body, secrets_=(*SECRETS, sha256_hex(ALICE), sha256_hex(CAROL)))


# ================================================================ refusing to start


async def run_cli(tmp_path: Path, config: dict[str, Any], *args: str, timeout: float = 20.0) -> tuple[int, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "bridge", "--config", str(path), *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
async def test_refuses_public_bind_without_tokens(tmp_path: Path, host: str) -> None:
    servers = {"f": faulty()}
    public = {"servers": servers, "listen": {"host": host, "port": 0}}
    loopback = {"servers": servers, "listen": {"host": "127.0.0.1", "port": 0}}
    refused = await asyncio.gather(
        run_cli(tmp_path / "check", public, "--check"),
        run_cli(tmp_path / "start", public),  # starting for real: it must never get as far as listening
        run_cli(tmp_path / "flag", loopback, "--check", "--host", host),  # the address from the command line
    )
    for code, text in refused:
        assert code == 2, (code, text)
        assert "listen.host" in text and "token" in text and "listening" not in text, text


async def test_public_bind_accepted_with_tokens_or_explicit_opt_out(tmp_path: Path) -> None:
    servers = {"f": faulty()}
    public = {"servers": servers, "listen": {"host": "0.0.0.0", "port": 0}}
    configs = [
        {**public, "security": {"tokens": [{"name": "a", "sha256": sha256_hex(ALICE)}]}},
        {**public, "security": {"allow_unauthenticated": True}},
        *({"servers": servers, "listen": {"host": h, "port": 0}} for h in ("127.0.0.1", "::1", "localhost")),
    ]
    results = await asyncio.gather(*(run_cli(tmp_path / str(i), cfg, "--check") for i, cfg in enumerate(configs)))
    for cfg, (code, text) in zip(configs, results):
        assert code == 0, (cfg, code, text)


async def test_public_bind_with_allow_unauthenticated_starts(bridge: Any) -> None:
    config = {"servers": {"f": faulty()}, "listen": {"host": "0.0.0.0", "port": 0}, "security": {"allow_unauthenticated": True}}
    async with bridge(config) as b:
        listening = b.named("listening")[0]
        assert listening["host"] == "0.0.0.0", listening
        async with RawSse(b.url("f")) as c:  # talked to over 127.0.0.1 only
            await c.initialize()
            assert await echo(c, "open", 1) == "open"


# =========================================================== Origin, CORS and Host


async def test_origin_and_cors(bridge: Any) -> None:
    config = auth_config(allowed_origins=[ORIGIN])
    async with bridge(config, env=ENV) as b, aiohttp.ClientSession() as http:
        auth = bearer(BOB)
        # An Origin not on the list: 403 before anything else, with no CORS headers.
        for headers in ({"Origin": EVIL_ORIGIN, **auth}, {"Origin": EVIL_ORIGIN}, {"Origin": "null", **auth}):
            status, resp_headers, body = await fetch("GET", b.url("f"), headers)
            assert status == 403, (headers, status, body)
            jsonrpc_error(body)
            assert "Access-Control-Allow-Origin" not in resp_headers
        assert any("origin" in str(e.get("reason", "")).lower() for e in rejections(b)), rejections(b)

        # The allowed origin: the stream opens and carries the CORS headers.
        async with http.get(b.url("f"), headers={"Origin": ORIGIN, **auth}) as stream:
            assert stream.status == 200
            assert stream.headers.get("Access-Control-Allow-Origin") == ORIGIN, stream.headers
            endpoint = ""
            async with asyncio.timeout(10):
                while not endpoint:
                    line = (await stream.content.readline()).decode()
                    assert line, "stream ended"
                    if line.startswith("data:"):
                        endpoint = line[5:].strip()
            post_url = b.base + endpoint

            # POST from the allowed origin: accepted, CORS headers, the reply on the stream.
            async with http.post(post_url, json=PING, headers={"Origin": ORIGIN, **auth}) as resp:
                assert resp.status == 202, await resp.text()
                assert resp.headers.get("Access-Control-Allow-Origin") == ORIGIN
            # From another origin: 403, and it never reaches the session.
            async with http.post(post_url, json={**PING, "id": 2}, headers={"Origin": EVIL_ORIGIN, **auth}) as resp:
                assert resp.status == 403
                assert "Access-Control-Allow-Origin" not in resp.headers
            async with http.post(post_url, json={**PING, "id": 3}, headers=auth) as resp:  # no Origin: not a browser
                assert resp.status == 202
                assert "Access-Control-Allow-Origin" not in resp.headers
            got = []
            async with asyncio.timeout(10):
                while len(got) < 2:
                    line = (await stream.content.readline()).decode()
                    assert line, "stream ended"
                    if line.startswith("data:"):
                        got.append(json.loads(line[5:]))
            assert [m["id"] for m in got] == [1, 3], got

        # Preflight: no credentials (browsers never send them on one), allowed origin: 2xx with the lists.
        preflight = {
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, mcp-session-id",
        }
        for path in ("/servers/f/messages?session_id=x", "/servers/f/sse", "/servers/g/messages"):
            status, resp_headers, body = await fetch("OPTIONS", b.base + path, preflight)
            assert 200 <= status < 300, (path, status, body)
            assert resp_headers.get("Access-Control-Allow-Origin") == ORIGIN, resp_headers
            methods = {m.strip().upper() for m in resp_headers.get("Access-Control-Allow-Methods", "").split(",")}
            assert {"GET", "POST"} <= methods, resp_headers
            allowed = {h.strip().lower() for h in resp_headers.get("Access-Control-Allow-Headers", "").split(",")}
            assert {"mcp-session-id", "authorization", "content-type"} <= allowed, resp_headers
        # OPTIONS with no Origin is no preflight: it needs a token like any request.
        status, _, body = await fetch("OPTIONS", b.url("f"), {"Access-Control-Request-Method": "POST"})
        assert status == 401, (status, body)
        # A preflight from another origin: 403, no CORS headers.
        status, resp_headers, body = await fetch("OPTIONS", f"{b.base}/servers/f/messages", {**preflight, "Origin": EVIL_ORIGIN})
        assert status == 403, (status, body)
        assert "Access-Control-Allow-Origin" not in resp_headers
        assert "Access-Control-Allow-Methods" not in resp_headers
    no_tracebacks(b)


async def test_host_header_dns_rebinding(bridge: Any) -> None:
    config = {"servers": {"f": faulty()}, "security": {"allowed_hosts": ["bridge.example.com"]}}
    async with bridge(config) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        for host in ("evil.example.com", "evil.example.com:8080", "localhost.evil.example.com", "10.0.0.1"):
            for method, url in (("GET", b.url("f")), ("POST", c.endpoint), ("GET", f"{b.base}/status"), ("GET", f"{b.base}/metrics")):
                status, _, body = await fetch(method, url, {"Host": host}, data=json.dumps(PING) if method == "POST" else None)
                assert status in (403, 421), (host, method, url, status, body)
            # A CORS preflight is refused on its Host like any request, before its Origin is looked at.
            preflight = {"Host": host, "Origin": f"http://localhost:{b.port}", "Access-Control-Request-Method": "POST"}
            status, headers, body = await fetch("OPTIONS", c.endpoint, preflight)
            assert status == 403 and "Access-Control-Allow-Methods" not in headers, (host, status, body)
        assert any("host" in str(e.get("reason", "")).lower() for e in rejections(b)), rejections(b)
        assert not c._held  # the refused POSTs never reached the session
        for host in ("localhost:1234", "localhost", "127.0.0.1", f"127.0.0.1:{b.port}", "[::1]:9", "bridge.example.com:8443"):
            status, _, body = await fetch("GET", b.url("f"), {"Host": host})
            assert status == 200, (host, status, body)
            status, _, body = await fetch("POST", c.endpoint, {"Host": host}, data=json.dumps({**PING, "id": host}))
            assert status == 202, (host, status, body)
            assert (await c.response(host))["result"] == {}
            preflight = {"Host": host, "Origin": f"http://localhost:{b.port}", "Access-Control-Request-Method": "POST"}
            status, headers, body = await fetch("OPTIONS", c.endpoint, preflight)
            assert status == 204 and "POST" in headers["Access-Control-Allow-Methods"], (host, status, body)
        # Probes stay open whatever the Host.
        status, _, _ = await fetch("GET", f"{b.base}/healthz", {"Host": "evil.example.com"})
        assert status == 200


async def raw_status(port: int, request: bytes, timeout: float = 5.0) -> tuple[int, bytes]:
    """Send bytes exactly as given; the status code and the head of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(timeout):
            head = await reader.readuntil(b"\r\n\r\n")
            body = await reader.read(2000)
        return int(head.split()[1]), head + body
    finally:
        writer.close()


async def test_non_utf8_headers_refused_cleanly(bridge: Any) -> None:
    """Header bytes that are not UTF-8 are refused like any other bad value: never a 500."""
    async with bridge(auth_config(allowed_origins=[ORIGIN]), env=ENV) as b:
        ok_host = f"Host: 127.0.0.1:{b.port}\r\n".encode()
        cases = [
            (b"Authorization: Bearer \xff\xfe\r\n" + ok_host, {401}),
            (b"Authorization: Bearer " + ALICE.encode() + b"\xe9\r\n" + ok_host, {401}),
            (b"Authorization: \xc3\x28 " + ALICE.encode() + b"\r\n" + ok_host, {401}),
            (b"Host: \xff.example.com\r\n" + b"Authorization: Bearer " + BOB.encode() + b"\r\n", {400, 403, 421}),
            (b"Origin: https://\xff.example.com\r\n" + ok_host + b"Authorization: Bearer " + BOB.encode() + b"\r\n", {403}),
        ]
        wrong = []
        for headers, expected in cases:
            for path in (b"/servers/f/sse", b"/status"):
                status, answer = await raw_status(b.port, b"GET " + path + b" HTTP/1.1\r\n" + headers + b"Connection: close\r\n\r\n")
                if status not in expected:
                    wrong.append((headers, path, status, sorted(expected)))
        assert not wrong, "\n".join(map(repr, wrong))
        # And the daemon is fine.
        status, _, _ = await fetch("GET", f"{b.base}/status", bearer(BOB))
        assert status == 200
    no_tracebacks(b)


# ====================================================================== TLS


async def test_tls_sdk_client(bridge: Any, tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    import httpx2
    from mcp import ClientSession
    from mcp.client.sse import sse_client

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    key_path.write_bytes(cert.private_key_pem.bytes())
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    config = {"servers": {"f": faulty()}, "listen": {"host": "127.0.0.1", "port": 0, "tls": {"cert": str(cert_path), "key": str(key_path)}}}
    async with bridge(config) as b:
        assert b.named("listening")[0].get("tls") is True
        base = f"https://127.0.0.1:{b.port}"

        def factory(headers: Any = None, timeout: Any = None, auth: Any = None) -> httpx2.AsyncClient:
            return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, verify=client_ctx)

        async with asyncio.timeout(30):
            async with sse_client(f"{base}/servers/f/sse", httpx_client_factory=factory, timeout=10) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=10) as session:
                    await session.initialize()
                    result = await session.call_tool("echo", {"text": "over tls"})
                    assert not result.is_error
                    assert result.content[0].text == "over tls"  # type: ignore[union-attr]

        status, _, body = await fetch("GET", f"{base}/healthz", ssl_context=client_ctx)
        assert status == 200, body
        # Without the CA the certificate is not trusted; plain HTTP gets no answer from a TLS port.
        with pytest.raises(aiohttp.ClientSSLError):
            await fetch("GET", f"{base}/healthz", ssl_context=ssl.create_default_context())
        try:
            status, _, _ = await fetch("GET", f"http://127.0.0.1:{b.port}/healthz")
        except aiohttp.ClientError:
            status = None
        assert status != 200


# ================================================================== session ids


async def test_session_ids_unguessable(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b:
        gate = asyncio.Semaphore(20)

        async def one() -> str:
            async with gate, RawSse(b.url("f")) as c:
                assert c.status == 200
                return c.session_id

        async with asyncio.timeout(60):
            ids = await asyncio.gather(*(one() for _ in range(100)))
        assert len(set(ids)) == 100, ids
        for sid in ids:
            if re.fullmatch(r"[0-9a-f]+", sid):
                bits = 4 * len(sid)
            else:
                assert re.fullmatch(r"[A-Za-z0-9_-]+", sid), sid
                bits = 6 * len(sid)
            assert bits >= 128, (sid, bits)
        # Not a counter or a timestamp dressed up: no long shared prefix or suffix, and
        # (for hex ids) about as many one bits as zero bits.
        ordered = sorted(ids)
        for x, y in zip(ordered, ordered[1:]):
            assert len(_common_prefix(x, y)) < 10, (x, y)
        tails = sorted(s[::-1] for s in ids)
        for x, y in zip(tails, tails[1:]):
            assert len(_common_prefix(x, y)) < 10, (x, y)
        if all(re.fullmatch(r"[0-9a-f]+", s) for s in ids):
            ones = sum(bin(int(s, 16)).count("1") for s in ids)
            total = sum(4 * len(s) for s in ids)
            assert abs(ones - total / 2) < 6 * (total**0.5) / 2, (ones, total)


def _common_prefix(x: str, y: str) -> str:
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return x[:n]


# ====================================================================== limits


async def test_body_over_limit_413(bridge: Any) -> None:
    limit = 64 * 1024
    config = {"servers": {"f": faulty()}, "limits": {"max_message_bytes": "64KiB"}}
    async with bridge(config) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        fits = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("echo", {"text": "y"})}).encode()
        fits = fits[:-1] + b" " * (limit - len(fits)) + b"}"  # exactly the limit, padded with whitespace
        assert len(fits) == limit
        status, text = await c.post(None, raw=fits)
        assert status == 202, (status, text)
        assert (await c.response(1))["result"]["content"][0]["text"] == "y"

        over = fits[:-1] + b" }"
        assert len(over) == limit + 1
        status, text = await c.post(None, raw=over)
        assert status == 413, (status, text)
        jsonrpc_error(text)

        huge = over * 4

        async def chunks() -> Any:  # no Content-Length: chunked
            for i in range(0, len(huge), 8192):
                yield huge[i : i + 8192]

        assert c._http is not None
        async with c._http.post(c.endpoint, data=chunks(), headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 413, (resp.status, await resp.text())

        # A Content-Length far over the limit is refused at once, without waiting for a body.
        path = c.endpoint.split(str(b.port), 1)[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        try:
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {10 * 1024**3}\r\n\r\n{{".encode()
            )
            await writer.drain()
            async with asyncio.timeout(5):
                status_line = await reader.readline()
            assert status_line.split()[1] == b"413", status_line
        finally:
            writer.close()

        # None of it reached the server or the session, which still works.
        assert await c.request("ping", request_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}
        assert not c._held, c._held
    no_tracebacks(b)


async def test_max_sessions_503(bridge: Any) -> None:
    config = {"servers": {"f": faulty(), "g": {**faulty(), "max_sessions": 1}}, "limits": {"max_sessions": 3}}
    async with bridge(config) as b:
        async with RawSse(b.url("f")) as s1, RawSse(b.url("f")) as s2, RawSse(b.url("f")) as s3:
            assert {s1.status, s2.status, s3.status} == {200}
            for _ in range(3):
                status, headers, body = await fetch("GET", b.url("f"))
                assert status == 503, (status, body)
                assert re.fullmatch(r"[1-9][0-9]*", headers.get("Retry-After", "")), headers
                jsonrpc_error(body)
            # The per-server max_sessions wins over the global one.
            async with RawSse(b.url("g")) as g1:
                assert g1.status == 200
                status, headers, body = await fetch("GET", b.url("g"))
                assert status == 503 and "Retry-After" in headers, (status, body)
            # The sessions that are in keep working.
            await s1.initialize()
            assert await echo(s1, "in", 1) == "in"
            # One leaves: there is room again.
            gone = s3.session_id
            await s3.close()
            await b.wait_for("session_closed", where=lambda e: e.get("session") == gone)
            async with RawSse(b.url("f")) as s4:
                assert s4.status == 200
                await s4.initialize()
                assert await echo(s4, "room", 1) == "room"
    no_tracebacks(b)


async def test_max_inflight_per_session(bridge: Any) -> None:
    config = {"servers": {"f": faulty()}, "limits": {"max_inflight": 2}}
    async with bridge(config) as b, RawSse(b.url("f")) as c, RawSse(b.url("f")) as other:
        await asyncio.gather(c.initialize(), other.initialize())
        mark = len(b.events)
        for rid in (1, 2):
            status, _ = await c.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call("hang")})
            assert status == 202
        for n in (1, 2):
            await b.wait_for("server_stderr", where=_hangs_seen(b, mark, n), start=mark)

        # One more: refused at once with -32004, nothing queued.
        status, _ = await c.post({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call("echo", {"text": "3"})})
        assert status == 202
        reply = await c.response(3, timeout=2.0)
        assert "result" not in reply and reply["error"]["code"] == -32004, reply
        # A batch over the limit: each request in it refused the same way.
        status, _ = await c.post([
            {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": call("echo", {"text": "4"})},
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": call("echo", {"text": "5"})},
        ])  # fmt: skip
        assert status == 202
        for rid in (4, 5):
            reply = await c.response(rid, timeout=2.0)
            assert reply["error"]["code"] == -32004, reply

        # The limit is per session: another session on the same server is not affected.
        assert await echo(other, "other", 1) == "other"
        assert await echo(other, "other", 2) == "other"

        # Cancelling one frees a slot.
        status, _ = await c.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
        assert status == 202
        assert await echo(c, "freed", 6) == "freed"
        assert not c._held and not other._held, (c._held, other._held)
    no_tracebacks(b)


def _hangs_seen(b: Bridge, mark: int, n: int) -> Any:
    def check(_: dict[str, Any]) -> bool:
        notes = [e for e in b.events[mark:] if e.get("event") == "server_stderr" and e.get("line", "").startswith("faulty: hang ")]
        return len(notes) >= n

    return check


async def test_reader_that_never_reads_is_closed(bridge: Any) -> None:
    """A session that never reads its stream is closed once `session_queue` fills; the
    shared server and another session on it keep going, correct and prompt, throughout."""
    config = {"servers": {"f": faulty()}, "limits": {"session_queue": 4}}
    async with bridge(config) as b, RawSse(b.url("f")) as good:
        await good.initialize()
        loop = asyncio.get_running_loop()

        # The stalled client: a raw socket with a tiny receive buffer that sends the GET and
        # never calls recv. Its session id comes from the log.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        mark = len(b.events)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", b.port))
            await loop.sock_sendall(
                sock, f"GET /servers/f/sse HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\nAccept: text/event-stream\r\n\r\n".encode()
            )
            stalled = (await b.wait_for("session_opened", start=mark))["session"]
            assert stalled != good.session_id
            post_url = f"{b.base}/servers/f/messages?session_id={stalled}"

            good_results: list[tuple[str, str, float]] = []
            enough = [10_000]  # lowered once the stalled session is gone

            async def well_behaved() -> None:
                for i in range(10_000):
                    if len(good_results) >= enough[0]:
                        return
                    text = f"good-{i}"
                    started = loop.time()
                    got = await echo(good, text, f"g{i}")
                    good_results.append((text, got, loop.time() - started))

            good_task = asyncio.create_task(well_behaved())
            payload = "s" * (256 * 1024)
            statuses = []
            async with aiohttp.ClientSession() as http:
                for i in range(400):
                    msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call("echo", {"text": payload})}
                    async with http.post(post_url, json=msg) as resp:
                        statuses.append(resp.status)
                    if resp.status != 202 or any(e.get("session") == stalled for e in b.named("session_closed")):
                        break
                    assert not good_task.done(), good_task
            too_slow = await b.wait_for("session_too_slow", where=lambda e: e.get("session") == stalled, start=mark)
            assert too_slow["server"] == "f"
            closed = await b.wait_for("session_closed", where=lambda e: e.get("session") == stalled, start=mark)
            assert closed["reason"] == "slow", closed
            assert set(statuses[:-1]) <= {202}, statuses
            # Its URL is gone now.
            status, _, _ = await fetch("POST", post_url, data=json.dumps(PING))
            assert status == 404

            # The well-behaved session kept going throughout, and goes on: 20 more calls.
            assert good_results, "the well-behaved session got no answer while the other one stalled"
            n = len(good_results)
            enough[0] = n + 20
            await asyncio.wait_for(good_task, 20)
            assert len(good_results) >= n + 20, (n, len(good_results))
            wrong = [(t, g) for t, g, _ in good_results if t != g]
            assert not wrong, wrong[:5]
            assert max(d for _, _, d in good_results) < 5.0, max(d for _, _, d in good_results)

            # The bridge hung up on the stalled socket: draining it reaches the end.
            drained = 0
            async with asyncio.timeout(15):
                while drained < 256 * 1024 * 1024:
                    try:
                        chunk = await loop.sock_recv(sock, 1 << 20)
                    except ConnectionResetError:
                        break
                    if not chunk:
                        break
                    drained += len(chunk)
        finally:
            sock.close()

        # Closed and counted.
        status, _, metrics = await fetch("GET", f"{b.base}/metrics")
        assert status == 200, metrics
        assert re.search(r'mcp_bridge_sessions_dropped_total\{[^}]*reason="slow"[^}]*\} 1\.0', metrics or ""), metrics
        async with RawSse(b.url("f")) as fresh:
            await fresh.initialize()
            assert await echo(fresh, "fresh", 1) == "fresh"
    no_tracebacks(b)
