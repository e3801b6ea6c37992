"""Sign-in with OAuth, end to end: a real authorization server (oidc-provider, started
by tests/support/idp.py on loopback), the real daemon, and the official SDK's OAuth client.

alice's groups open every server, bob's only `time`. Refusals are tokens the
provider's own key signs with something wrong in them (Idp.mint), each its own test.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from mcp import ClientSession
from support.daemon import Bridge, demo
from support.idp import NEEDS_IDP, Idp, SigningKey, idp, oauth_client, sdk_session, tampered  # noqa: F401
from support.rawstreamable import RawStreamable
from support.sdk import TIME_SERVER

pytestmark = NEEDS_IDP


def config(p: Idp, **issuer: Any) -> dict[str, Any]:
    return {
        "servers": {"time": TIME_SERVER, "demo": demo()},
        "security": {
            "oauth": {
                "authorization_servers": [{"issuer": p.issuer, "algorithms": ["RS256", "ES256"], "scopes_claim": "groups", **issuer}],
                "scopes": {"mcp:time": ["time"], "mcp:all": ["*"]},
            }
        },
    }


@contextlib.asynccontextmanager
async def signed_in(b: Bridge, server: str, user: str, transport: str) -> AsyncIterator[ClientSession]:
    """An SDK session that starts from a bare 401 and signs `user` in by itself."""
    url = b.url(server, "mcp" if transport == "streamable" else "sse")
    async with sdk_session(url, oauth_client(url, user), transport) as session:
        await session.initialize()
        yield session


@pytest.mark.parametrize("transport", ["streamable", "sse"])
async def test_the_sdk_signs_in_from_a_bare_401_and_calls_a_tool(bridge: Any, idp: Any, transport: str) -> None:
    async with idp() as p, bridge(config(p)) as b:
        async with signed_in(b, "time", "bob", transport) as session:
            result = await session.call_tool("get_current_time", {"timezone": "UTC"})
            assert not result.is_error and "datetime" in result.content[0].text  # type: ignore[union-attr]
        opened = [e for e in b.named("session_opened") if e["transport"] == ("streamable" if transport == "streamable" else "sse")]
        assert opened and opened[-1]["owner"] == f"{p.issuer}#bob"
        assert not [e for e in b.events if "eyJ" in json.dumps(e)], "a token reached the log"


async def _post(b: Bridge, server: str, token: str | None, body: Any = None) -> aiohttp.ClientResponse:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    init = body or {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}}
    async with aiohttp.ClientSession() as http:
        resp = await http.post(b.url(server, "mcp"), json=init, headers=headers)
        await resp.read()
        return resp


async def test_two_users_see_different_servers_and_not_each_others_sessions(bridge: Any, idp: Any) -> None:
    async with idp() as p, bridge(config(p)) as b:
        base = b.base
        alice = await p.access_token("alice", f"{base}/servers/demo/mcp", ["mcp:all"])
        bob = await p.access_token("bob", f"{base}/servers/demo/mcp", ["mcp:time"])
        assert (await _post(b, "demo", alice)).status == 200
        refused = await _post(b, "demo", bob)
        assert refused.status == 403
        assert 'error="insufficient_scope"' in refused.headers["WWW-Authenticate"]
        assert 'scope="mcp:all"' in refused.headers["WWW-Authenticate"]
        # Sessions belong to their principal: bob's token for `time` cannot use alice's.
        alice_time = await p.access_token("alice", f"{base}/servers/time/mcp", ["mcp:all"])
        bob_time = await p.access_token("bob", f"{base}/servers/time/mcp", ["mcp:time"])
        async with RawStreamable(b.url("time", "mcp"), {"Authorization": f"Bearer {alice_time}"}) as a:
            await a.initialize()
            stranger = await a.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers={"Authorization": f"Bearer {bob_time}"})
            assert stranger.status == 404
            again = await p.access_token("alice", f"{base}/servers/time/mcp", ["mcp:all"])  # another token of hers
            mine = await a.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, headers={"Authorization": f"Bearer {again}"})
            assert mine.status == 200


async def test_metadata_names_the_resource_and_the_authorization_server(bridge: Any, idp: Any) -> None:
    async with idp() as p, bridge(config(p)) as b, aiohttp.ClientSession() as http:
        for path, resource, scopes in (
            ("", b.base, ["mcp:all", "mcp:time"]),
            ("/servers/time/mcp", b.url("time", "mcp"), ["mcp:all", "mcp:time"]),
            ("/servers/demo/sse", b.url("demo", "sse"), ["mcp:all"]),
        ):
            async with http.get(f"{b.base}/.well-known/oauth-protected-resource{path}") as resp:
                assert resp.status == 200
                document = await resp.json()
            assert document["resource"] == resource and document["authorization_servers"] == [p.issuer]
            assert document["scopes_supported"] == scopes and document["bearer_methods_supported"] == ["header"]
        bare = await _post(b, "time", None)
        assert bare.status == 401
        assert bare.headers["WWW-Authenticate"] == (
            f'Bearer resource_metadata="{b.base}/.well-known/oauth-protected-resource/servers/time/mcp", scope="mcp:all mcp:time"'
        )
        async with http.get(f"{b.base}/readyz") as resp:
            ready = await resp.json()  # (the servers may still be starting: not the point here)
        assert ready["authorization_servers"] == {p.issuer: "ok"} and "oauth" not in ready.get("servers", {})
        assert (await _post(b, "time", p.mint(b.url("time", "mcp"), {"exp": 1}))).status == 401
        async with http.get(f"{b.base}/metrics", headers={"Authorization": f"Bearer {p.mint(b.base)}"}) as resp:
            assert resp.status == 200
            metrics = await resp.text()
        assert 'mcp_bridge_oauth_tokens_total{outcome="ok"} 1.0' in metrics
        assert 'mcp_bridge_oauth_tokens_total{outcome="expired"} 1.0' in metrics
        assert f'mcp_bridge_oauth_key_fetches_total{{issuer="{p.issuer}",result="ok"}} 1.0' in metrics


REFUSALS = {
    "expired": ({"exp": -120}, None, "token expired"),
    "not_yet_valid": ({"nbf": 120}, None, "token not yet valid"),
    "wrong_issuer": ({"iss": "http://127.0.0.1:1/other"}, None, "token from an unknown issuer"),
    "wrong_audience": ({"aud": "http://127.0.0.1:1/servers/time/mcp"}, None, "token is for another resource"),
    "alg_none": ({}, "none", "token algorithm 'none' not accepted"),
    "hmac_with_the_public_key": ({}, "HS256", "token algorithm 'HS256' not accepted"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
async def test_a_bad_token_is_refused_with_invalid_token(bridge: Any, idp: Any, case: str) -> None:
    claims, algorithm, reason = REFUSALS[case]
    async with idp() as p, bridge(config(p)) as b:
        now_relative = {k: (v + _now() if k in ("exp", "nbf") else v) for k, v in claims.items()}
        token = p.mint(b.url("time", "mcp"), now_relative, algorithm=algorithm)
        resp = await _post(b, "time", token)
        assert resp.status == 401, resp.status
        challenge = resp.headers["WWW-Authenticate"]
        assert 'error="invalid_token"' in challenge and f'error_description="{reason}' in challenge, challenge
        assert token not in json.dumps(b.events)


async def test_a_tampered_token_and_an_unknown_key_are_refused(bridge: Any, idp: Any) -> None:
    async with idp() as p, bridge(config(p)) as b:
        good = p.mint(b.url("time", "mcp"), {"groups": ["mcp:time"]})
        assert (await _post(b, "time", good)).status == 200
        forged = tampered(good, {"groups": ["mcp:all"]})
        resp = await _post(b, "demo", forged)
        assert resp.status == 401 and "signature does not verify" in resp.headers["WWW-Authenticate"]
        stranger = p.mint(b.url("time", "mcp"), key=SigningKey.rsa())  # a key the provider never served
        resp = await _post(b, "time", stranger)
        assert resp.status == 401 and "unknown key" in resp.headers["WWW-Authenticate"]
        missing = p.mint(b.url("demo", "mcp"), {"groups": ["mcp:time"]})
        assert (await _post(b, "demo", missing)).status == 403


async def test_key_rotation_is_picked_up_without_a_restart(bridge: Any, idp: Any) -> None:
    async with idp() as p, bridge(config(p)) as b:
        assert (await _post(b, "time", p.mint(b.url("time", "mcp")))).status == 200
        new = SigningKey.rsa()
        await p.rotate([new, *p.keys])
        token = await p.access_token("alice", b.url("time", "mcp"), ["mcp:all"])
        assert json.loads(_header(token))["kid"] == new.kid
        assert (await _post(b, "time", token)).status == 200  # an unknown kid: keys fetched again
        fetched = b.named("oauth_keys_fetched")
        assert len(fetched) == 2


async def test_the_provider_down_keys_cached_work_a_new_key_gets_503(bridge: Any, idp: Any) -> None:
    async with idp() as p, bridge(config(p)) as b:
        known = p.mint(b.url("time", "mcp"))
        await p.stop()
        assert (await _post(b, "time", known)).status == 200
        unseen = p.mint(b.url("time", "mcp"), key=SigningKey.rsa())
        resp = await _post(b, "time", unseen)
        assert resp.status == 503 and resp.headers["Retry-After"] == "5"
        async with aiohttp.ClientSession() as http, http.get(f"{b.base}/readyz") as resp:
            ready = await resp.json()
        assert "oauth" not in ready.get("servers", {})  # keys cached: still ready, and it says what is wrong
        assert ready["authorization_servers"][p.issuer].startswith("keys cached; last refresh failed")


def _now() -> int:
    import time

    return int(time.time())


def _header(token: str) -> str:
    import base64

    head = token.split(".")[0]
    return base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)).decode()


async def test_not_ready_until_some_key_of_every_issuer_was_fetched(bridge: Any, idp: Any) -> None:
    async with idp() as p:
        issuer = p.issuer
        await p.stop()  # never reachable while this bridge runs
        async with bridge(config(p)) as b, aiohttp.ClientSession() as http:
            async with http.get(f"{b.base}/readyz") as resp:
                assert resp.status == 503
                ready = await resp.json()
            assert ready["servers"]["oauth"] == f"no keys yet from {issuer}"
            assert ready["authorization_servers"][issuer].startswith("no keys yet")
            resp = await _post(b, "time", p.mint(b.url("time", "mcp")))
            assert resp.status == 503 and resp.headers["Retry-After"] == "5"
        await p.start()  # (so that the fixture's stop has something to stop)
