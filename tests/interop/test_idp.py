"""The sign-in harness (tests/support/idp.py, tests/node/idp.mjs) against oidc-provider alone.

What the bridge's OAuth tests rely on: the provider's discovery and registration,
the code flow with PKCE yielding a JWT access token for the requested resource,
tokens minted by the test verifying like the provider's, key rotation without a
restart, a restart on the same port, and the SDK's OAuth client signing in by
itself from a bare 401, against resource servers that are not the bridge (a
stand-in of a few lines, and the SDK's own server), so that the harness is
proven before the bridge serves OAuth.
"""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import httpx2
import jwt
import pytest
import uvicorn
from aiohttp import web
from jwt.algorithms import HMACAlgorithm
from jwt.utils import base64url_decode
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from support.idp import NEEDS_IDP, REDIRECT_URI, Idp, SignInError, SigningKey, authorize, idp, oauth_client, sdk_session, tampered  # noqa: F401

pytestmark = NEEDS_IDP

RESOURCE = "http://127.0.0.1:9/servers/x/mcp"


async def verify(p: Idp, token: str, audience: str) -> dict:
    """The token's claims, checked as a resource server would: against the keys the provider serves."""
    header = jwt.get_unverified_header(token)
    key = (await p.served_jwks())[header["kid"]]
    return jwt.decode(token, key, algorithms=["RS256", "ES256"], audience=audience, issuer=p.issuer)


async def test_discovery(idp):
    async with idp() as p:
        meta = await p.metadata()
        assert meta["issuer"] == p.issuer
        assert meta["code_challenge_methods_supported"] == ["S256"]
        assert meta["registration_endpoint"].startswith(p.issuer)
        assert meta["authorization_response_iss_parameter_supported"] is True
        assert {"mcp:time", "mcp:all"} <= set(meta["scopes_supported"])
        # RFC 8414's path, which the SDK tries first, names the same server.
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{p.issuer}/.well-known/oauth-authorization-server") as resp:
                assert resp.status == 200
                assert (await resp.json())["issuer"] == p.issuer


async def test_dynamic_registration(idp):
    async with idp() as p:
        client = await p.register(client_name="harness")
        assert client["client_id"]
        assert client["redirect_uris"] == [REDIRECT_URI]
        assert client["token_endpoint_auth_method"] == "none"
        confidential = await p.register(token_endpoint_auth_method="client_secret_basic")
        assert confidential["client_secret"]


async def test_code_flow_gives_a_jwt_for_the_resource(idp):
    async with idp() as p:
        token = await p.access_token("alice", RESOURCE, ["mcp:time", "mcp:all"])
        header = jwt.get_unverified_header(token)
        assert header["typ"] == "at+jwt"
        assert header["alg"] == "RS256"
        assert header["kid"] == p.key().kid
        claims = await verify(p, token, RESOURCE)
        assert claims["aud"] == RESOURCE
        assert claims["iss"] == p.issuer
        assert claims["sub"] == "alice"
        assert set(claims["scope"].split()) == {"mcp:time", "mcp:all"}
        assert claims["groups"] == ["mcp:all"]
        assert claims["exp"] > time.time()

        bob = await verify(p, await p.access_token("bob", RESOURCE, ["mcp:time"]), RESOURCE)
        assert (bob["sub"], bob["scope"], bob["groups"]) == ("bob", "mcp:time", ["mcp:time"])


async def test_es256_access_tokens(idp):
    async with idp(alg="ES256") as p:
        token = await p.access_token("bob", RESOURCE, ["mcp:time"])
        assert jwt.get_unverified_header(token)["alg"] == "ES256"
        assert (await verify(p, token, RESOURCE))["groups"] == ["mcp:time"]


async def test_refusals(idp):
    """What the provider itself refuses: a resource that is not on loopback, an unknown
    account, an authorization request without PKCE even from a confidential client."""
    async with idp() as p:
        with pytest.raises(SignInError, match="invalid_target"):
            await p.access_token("alice", "https://elsewhere.example/mcp", ["mcp:time"])
        with pytest.raises(SignInError, match="unknown account"):
            await p.access_token("mallory", RESOURCE, ["mcp:time"])
        client_id = (await p.register(token_endpoint_auth_method="client_secret_basic"))["client_id"]
        meta = await p.metadata()
        url = f"{meta['authorization_endpoint']}?response_type=code&client_id={client_id}&redirect_uri={REDIRECT_URI}&scope=mcp:time"
        with pytest.raises(SignInError, match="requires PKCE"):
            await authorize(url, "alice")


async def test_minted_tokens_verify_like_the_providers(idp):
    async with idp() as p:
        claims = await verify(p, p.mint(RESOURCE, {"sub": "bob"}), RESOURCE)
        assert (claims["sub"], claims["iss"]) == ("bob", p.issuer)
        ec_claims = await verify(p, p.mint(RESOURCE, key=p.key("ES256")), RESOURCE)
        assert ec_claims["sub"] == "alice"
        assert "exp" not in jwt.decode(p.mint(RESOURCE, {"exp": None}), options={"verify_signature": False})

        with pytest.raises(jwt.ExpiredSignatureError):
            await verify(p, p.mint(RESOURCE, {"exp": int(time.time()) - 60}), RESOURCE)
        with pytest.raises(jwt.InvalidAudienceError):
            await verify(p, p.mint("http://127.0.0.1:9/other"), RESOURCE)
        real = await p.access_token("bob", RESOURCE, ["mcp:time"])
        forged = tampered(real, {"groups": ["mcp:all"]})
        assert jwt.decode(forged, options={"verify_signature": False})["groups"] == ["mcp:all"]
        with pytest.raises(jwt.InvalidSignatureError):
            await verify(p, forged, RESOURCE)
        assert jwt.get_unverified_header(p.mint(RESOURCE, algorithm="none"))["alg"] == "none"
        # The confusion token: HS256 whose secret is the public key's PEM, what a verifier
        # that took the key for an HMAC secret would accept.
        confused = p.mint(RESOURCE, algorithm="HS256")
        assert jwt.get_unverified_header(confused) == {"alg": "HS256", "typ": "at+jwt", "kid": p.key().kid}
        signed, _, signature = confused.rpartition(".")
        hs256 = HMACAlgorithm(HMACAlgorithm.SHA256)
        assert hs256.verify(signed.encode(), p.key().public_pem(), base64url_decode(signature))


async def test_rotation_without_restart(idp):
    async with idp() as p:
        old = p.key()
        client_before = await p.register()
        new = SigningKey.rsa()
        await p.rotate([new, old])
        assert {k.key_id for k in (await p.served_jwks()).keys} == {new.kid, old.kid}
        token = await p.access_token("alice", RESOURCE, ["mcp:time"])
        assert jwt.get_unverified_header(token)["kid"] == new.kid
        # Tokens signed before still verify while the old key is served.
        assert (await verify(p, p.mint(RESOURCE, key=old), RESOURCE))["sub"] == "alice"

        await p.rotate([new])
        assert [k.key_id for k in (await p.served_jwks()).keys] == [new.kid]
        # A file it cannot use leaves the keys as they were.
        with pytest.raises(AssertionError, match="no keys"):
            await p.rotate([])
        assert [k.key_id for k in (await p.served_jwks()).keys] == [new.kid]
        with pytest.raises(KeyError):
            await verify(p, p.mint(RESOURCE, key=old), RESOURCE)
        # Clients registered before the rotation are still known.
        meta = await p.metadata()
        url = (
            f"{meta['authorization_endpoint']}?response_type=code&client_id={client_before['client_id']}"
            f"&redirect_uri={REDIRECT_URI}&scope=mcp:time&code_challenge={'a' * 43}&code_challenge_method=S256"
        )
        assert (await authorize(url, "bob")).code


async def test_stop_and_start_on_the_same_port(idp):
    async with idp() as p:
        port = p.port
        await p.stop()
        with pytest.raises(aiohttp.ClientConnectionError):
            await p.metadata()
        p.keys = [SigningKey.rsa()]
        await p.start()
        assert p.port == port
        assert (await p.metadata())["issuer"] == f"http://127.0.0.1:{port}"
        assert [k.key_id for k in (await p.served_jwks()).keys] == [p.keys[0].kid]


async def _stand_in_resource_server(p: Idp) -> tuple[web.Application, list[dict]]:
    """A resource server of the MCP authorization spec, minimal: 401 with
    resource_metadata without a valid token, its metadata, and 200 with a token
    for its URL. Its URL is only known once it listens, so it reads it from the request."""
    seen: list[dict] = []

    def resource(request: web.Request) -> str:
        return f"http://{request.host}/servers/x/mcp"

    async def metadata(request: web.Request) -> web.Response:
        return web.json_response(
            {"resource": resource(request), "authorization_servers": [p.issuer], "scopes_supported": ["mcp:time"]}
        )

    async def mcp(request: web.Request) -> web.Response:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme == "Bearer":
            try:
                seen.append(await verify(p, token, resource(request)))
                return web.json_response({"ok": True})
            except (jwt.InvalidTokenError, KeyError):
                pass
        challenge = f'Bearer resource_metadata="http://{request.host}/.well-known/oauth-protected-resource/servers/x/mcp"'
        return web.Response(status=401, headers={"WWW-Authenticate": challenge})

    app = web.Application()
    app.router.add_get("/.well-known/oauth-protected-resource/servers/x/mcp", metadata)
    app.router.add_post("/servers/x/mcp", mcp)
    return app, seen


async def test_sdk_signs_in_from_a_bare_401(idp, aiohttp_server):
    async with idp() as p:
        app, seen = await _stand_in_resource_server(p)
        server = await aiohttp_server(app, host="127.0.0.1")
        url = f"http://127.0.0.1:{server.port}/servers/x/mcp"
        auth = oauth_client(url, "bob")
        async with httpx2.AsyncClient(auth=auth, timeout=10) as http:
            first = await http.post(url, json={})
            again = await http.post(url, json={})
        assert (first.status_code, again.status_code) == (200, 200)
        # One sign-in: the second request reused the token.
        assert len({c["jti"] for c in seen}) == 1
        assert seen[0]["aud"] == url
        assert (seen[0]["sub"], seen[0]["groups"]) == ("bob", ["mcp:time"])
        assert seen[0]["scope"] == "mcp:time"
        assert auth.context.storage.client_info.client_id


class _JwtVerifier:
    """The SDK server's `TokenVerifier` over the provider's keys: the SDK's own resource
    server stands in for the bridge in `test_sdk_session_signs_in`."""

    def __init__(self, p: Idp, resource: str) -> None:
        self.p = p
        self.resource = resource

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            claims = await verify(self.p, token, self.resource)
        except (jwt.InvalidTokenError, KeyError):
            return None
        scopes = claims["scope"].split()
        return AccessToken(token=token, client_id=claims["client_id"], scopes=scopes, expires_at=claims["exp"],
                           resource=claims["aud"], subject=claims["sub"], claims=claims)  # fmt: skip


@pytest.mark.parametrize("transport", ["streamable", "sse"])
async def test_sdk_session_signs_in(idp, transport):
    """The SDK's client session over Streamable HTTP or HTTP+SSE against the SDK's own
    resource server: the first request meets a 401, `oauth_client` signs alice in, the
    tool sees her."""
    async with idp() as p:
        # Bound and listening before uvicorn runs: the resource URL is known up front and
        # the client's first connection waits in the backlog instead of being refused.
        sock = socket.create_server(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/{'mcp' if transport == 'streamable' else 'sse'}"
        settings = AuthSettings(
            issuer_url=p.issuer, resource_server_url=url, required_scopes=["mcp:time"], validate_token_resource=True
        )
        server = MCPServer("reference", token_verifier=_JwtVerifier(p, url), auth=settings)

        @server.tool()
        def whoami() -> str:
            token = get_access_token()
            assert token is not None
            return f"{token.subject} {token.claims['groups']}"

        app = server.streamable_http_app() if transport == "streamable" else server.sse_app()
        uv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        serving = asyncio.get_running_loop().create_task(uv.serve(sockets=[sock]))
        try:
            auth = oauth_client(url, "alice")
            async with sdk_session(url, auth, transport) as session:
                async with asyncio.timeout(20):
                    await session.initialize()
                    result = await session.call_tool("whoami", {})
            assert [c.text for c in result.content] == ["alice ['mcp:all']"]
            claims = jwt.decode(auth.context.current_tokens.access_token, options={"verify_signature": False})
            assert (claims["aud"], claims["scope"]) == (url, "mcp:time")
        finally:
            uv.should_exit = True
            async with asyncio.timeout(10):
                await serving
