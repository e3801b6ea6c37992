"""OAuth access tokens checked by bridge/access/oauth.py and bridge/access/guard.py, without IO:
the issuer's keys are put in place by the test (the real provider is in tests/interop/test_oauth.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bridge.access import guard as guard_module
from bridge.access.guard import Guard, Principal, Refusal, admit
from bridge.access.oauth import NeedsFetch, OAuthVerifier, TokenRefused, Unavailable
from bridge.config.load import parse

ISSUER = "http://127.0.0.1:9999/realms/ops"
BASE = "http://127.0.0.1:8080"
CONFIG = f"""
listen: {{host: 127.0.0.1, port: 8080}}
servers: {{time: {{command: x}}, files: {{command: x}}}}
security:
  oauth:
    authorization_servers:
      - {{issuer: "{ISSUER}", algorithms: [RS256, ES256], scopes_claim: groups}}
    scopes: {{"mcp:time": [time], "mcp:all": ["*"]}}
"""
RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC = ec.generate_private_key(ec.SECP256R1())


def jwk(key: Any, kid: str) -> jwt.PyJWK:
    data = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()) if isinstance(key, rsa.RSAPrivateKey) else jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    return jwt.PyJWK({**data, "kid": kid, "use": "sig"})


def guard(now: float | None = None, text: str = CONFIG) -> Guard:
    config = parse(text, environ={})
    assert config.security.oauth is not None
    clock = [time.monotonic() if now is None else now]
    verifier = OAuthVerifier(config.security.oauth, clock=lambda: clock[0])
    keys = verifier.issuers[ISSUER]
    keys.keys = {"r1": jwk(RSA, "r1"), "e1": jwk(EC, "e1")}
    keys.fetched_at = keys.attempted_at = clock[0]
    return Guard(config, verifier)


def token(claims: dict[str, Any] | None = None, *, key: Any = RSA, alg: str = "RS256", kid: str | None = "r1", drop: tuple[str, ...] = ()) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "sub": "alice", "aud": f"{BASE}/servers/time/mcp", "exp": now + 300, "iat": now, "groups": ["mcp:time"], **(claims or {})}
    for name in drop:
        body.pop(name)
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid} if kid is not None else None)


def check(g: Guard, tok: str, server: str | None = "time") -> Refusal | Principal | None:
    return admit(g, "127.0.0.1:8080", None, f"Bearer {tok}", server)


def test_a_valid_token_names_its_principal_by_issuer_and_subject() -> None:
    g = guard()
    for tok in (token(), token(kid="e1", key=EC, alg="ES256"), token({"aud": BASE}), token({"aud": [f"{BASE}/servers/time/sse", "other"]})):
        principal = check(g, tok)
        assert isinstance(principal, Principal), principal
        assert principal.name == f"{ISSUER}#alice" and principal.oauth and principal.servers == frozenset({"time"})


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: token({"exp": int(time.time()) - 120}), "token expired"),
        (lambda: token({"nbf": int(time.time()) + 120}), "token not yet valid"),
        (lambda: token({"iss": "http://127.0.0.1:9999/realms/other"}), "token from an unknown issuer"),
        (lambda: token({"aud": f"{BASE}/servers/files/mcp"}), "token is for another resource"),
        (lambda: token({"aud": "https://elsewhere.example.com"}), "token is for another resource"),
        (lambda: token(drop=("exp",)), "token refused"),
        (lambda: token(drop=("sub",)), "token refused"),
        (lambda: token(key=rsa.generate_private_key(public_exponent=65537, key_size=2048)), "token signature does not verify"),
        (lambda: "not.a.jwt", "not a JWT access token"),
    ],
    ids=["expired", "not_yet_valid", "issuer", "other_server", "other_resource", "no_exp", "no_sub", "signature", "not_jwt"],
)
def test_refused_tokens_get_401_invalid_token_naming_the_reason(make: Callable[[], str], reason: str) -> None:
    tok = make()  # now, not when the tests were collected: times are relative to now
    refusal = check(guard(), tok)
    assert isinstance(refusal, Refusal) and refusal.status == 401, refusal
    assert refusal.reason.startswith(reason), refusal.reason
    header = (refusal.headers or {})["WWW-Authenticate"]
    assert header.startswith(f'Bearer resource_metadata="{BASE}/.well-known/oauth-protected-resource/servers/time/mcp"')
    assert 'error="invalid_token"' in header and tok not in header


def test_alg_none_and_hmac_with_the_public_key_are_refused() -> None:
    claims = {"iss": ISSUER, "sub": "mallory", "aud": BASE, "exp": int(time.time()) + 300, "groups": ["mcp:all"]}
    unsigned = jwt.encode(claims, None, algorithm="none", headers={"kid": "r1"})
    public_pem = RSA.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "r1"}).encode()).rstrip(b"=")
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=")
    signature = base64.urlsafe_b64encode(hmac.new(public_pem, header + b"." + payload, hashlib.sha256).digest()).rstrip(b"=")
    confused = (header + b"." + payload + b"." + signature).decode()
    for tok in (unsigned, confused):
        refusal = check(guard(), tok)
        assert isinstance(refusal, Refusal) and refusal.status == 401 and "algorithm" in refusal.reason, refusal


def test_a_tampered_payload_is_refused() -> None:
    head, _, rest = token().partition(".")
    _, _, signature = rest.partition(".")
    forged = base64.urlsafe_b64encode(json.dumps({"iss": ISSUER, "sub": "alice", "aud": BASE, "exp": 9999999999, "groups": ["mcp:all"]}).encode()).rstrip(b"=").decode()
    refusal = check(guard(), f"{head}.{forged}.{signature}")
    assert isinstance(refusal, Refusal) and refusal.reason == "token signature does not verify"


def test_a_token_without_the_scope_for_a_server_gets_403_insufficient_scope() -> None:
    refusal = check(guard(), token({"aud": BASE}), server="files")
    assert isinstance(refusal, Refusal) and refusal.status == 403 and refusal.kind == "insufficient_scope"
    header = (refusal.headers or {})["WWW-Authenticate"]
    assert 'error="insufficient_scope"' in header and 'scope="mcp:all"' in header
    everything = check(guard(), token({"aud": BASE, "groups": ["mcp:all"]}), server="files")
    assert isinstance(everything, Principal) and everything.servers is None


def test_no_token_gets_401_pointing_at_the_metadata_with_the_scope_it_needs() -> None:
    refusal = admit(guard(), "127.0.0.1:8080", None, None, "time", transport="sse")
    assert isinstance(refusal, Refusal) and refusal.status == 401
    assert (refusal.headers or {})["WWW-Authenticate"] == (
        f'Bearer resource_metadata="{BASE}/.well-known/oauth-protected-resource/servers/time/sse", scope="mcp:all mcp:time"'
    )


def test_an_unknown_kid_fetches_keys_once_then_refuses_or_says_unavailable() -> None:
    g = guard(now=1000.0)
    verifier = g.oauth
    assert verifier is not None
    keys = verifier.issuers[ISSUER]
    keys.attempted_at = 1000.0 - 31  # the last fetch was long enough ago
    with pytest.raises(NeedsFetch):
        check(g, token(kid="r2"))
    keys.attempted_at = 1000.0  # fetched now, and it still has no r2
    refusal = check(g, token(kid="r2"))
    assert isinstance(refusal, Refusal) and refusal.reason == "token signed with an unknown key"
    keys.error = "connection refused"  # the fetch failed: the issuer is down
    refusal = check(g, token(kid="r3"))
    assert isinstance(refusal, Refusal) and refusal.status == 503 and (refusal.headers or {})["Retry-After"] == "5"
    assert isinstance(check(g, token()), Principal)  # keys already held keep working
    with pytest.raises(TokenRefused):
        verifier.check(token({"exp": int(time.time()) - 100}), frozenset({BASE}))
    assert not isinstance(Unavailable(ISSUER), TokenRefused)


def test_static_tokens_keep_working_beside_oauth() -> None:
    config = parse(CONFIG + "  tokens: [{name: ci, token: ci-token-0123456789ab, servers: [files]}]\n", environ={})
    assert config.security.oauth is not None
    g = Guard(config, OAuthVerifier(config.security.oauth))
    principal = admit(g, "127.0.0.1:8080", None, "Bearer ci-token-0123456789ab", "files")
    assert isinstance(principal, Principal) and principal.name == "ci" and not principal.oauth


async def test_opaque_tokens_are_introspected_once_and_remembered(aiohttp_server: Any) -> None:
    """RFC 7662: an opaque token is asked about once; the answer holds until the token
    expires (active) or for a while (not active), so a flood of bogus tokens is not a
    flood of requests to the identity provider."""
    from aiohttp import web

    asked: list[str] = []

    async def introspect(request: web.Request) -> web.Response:
        assert request.headers["Authorization"].startswith("Basic ")
        form = await request.post()
        asked.append(str(form["token"]))
        if form["token"] == "opaque-good":
            return web.json_response(
                {"active": True, "sub": "bob", "aud": BASE, "exp": int(time.time()) + 300, "groups": ["mcp:time"]}
            )
        return web.json_response({"active": False})

    app = web.Application()
    app.router.add_post("/introspect", introspect)
    server = await aiohttp_server(app)
    config = parse(
        CONFIG.replace(
            "scopes_claim: groups}",
            f"scopes_claim: groups, introspection: {{url: 'http://127.0.0.1:{server.port}/introspect', client_id: bridge, client_secret: s3cret}}}}",
        ),
        environ={},
    )
    assert config.security.oauth is not None
    verifier = OAuthVerifier(config.security.oauth)
    try:
        for opaque in ("opaque-good", "opaque-dead"):
            with pytest.raises(NeedsFetch):
                verifier.check(opaque, frozenset({BASE}))
            await verifier.fetch(opaque)
        identity = verifier.check("opaque-good", frozenset({BASE}))
        assert identity.name == f"{ISSUER}#bob" and identity.servers == frozenset({"time"})
        with pytest.raises(TokenRefused, match="not active"):
            verifier.check("opaque-dead", frozenset({BASE}))
        for _ in range(3):
            verifier.check("opaque-good", frozenset({BASE}))
            with pytest.raises(TokenRefused):
                verifier.check("opaque-dead", frozenset({BASE}))
        assert asked == ["opaque-good", "opaque-dead"]
        await server.close()  # the identity provider goes away
        with pytest.raises(NeedsFetch):
            verifier.check("opaque-new", frozenset({BASE}))
        await verifier.fetch("opaque-new")
        with pytest.raises(Unavailable):
            verifier.check("opaque-new", frozenset({BASE}))
        assert verifier.check("opaque-good", frozenset({BASE})).name == f"{ISSUER}#bob"  # cached: still fine
    finally:
        await verifier.close()


def test_a_remembered_token_is_refused_once_past_its_exp_and_the_leeway() -> None:
    """A token accepted once is remembered, so later requests skip its signature check; the
    memory never outlives the token: accepted up to its exp plus the issuer's leeway (30 s),
    refused from then on, by the wall clock (injected here)."""
    config = parse(CONFIG, environ={})
    assert config.security.oauth is not None
    wall = [time.time()]
    verifier = OAuthVerifier(config.security.oauth, wall=lambda: wall[0])
    keys = verifier.issuers[ISSUER]
    keys.keys = {"r1": jwk(RSA, "r1")}
    keys.fetched_at = keys.attempted_at = time.monotonic()
    exp = int(wall[0]) + 300
    tok, audiences = token({"exp": exp, "aud": BASE}), frozenset({BASE})
    assert verifier.check(tok, audiences).expires == exp + 30  # checked, and remembered
    for now in (exp - 1, exp + 29.5):
        wall[0] = now
        assert verifier.check(tok, audiences).name == f"{ISSUER}#alice", now
    wall[0] = exp + 30
    with pytest.raises(TokenRefused, match="^token expired$"):
        verifier.check(tok, audiences)
    assert verifier.outcomes == {"ok": 3, "expired": 1}


async def test_only_an_introspection_answer_of_json_true_is_active(aiohttp_server: Any) -> None:
    """RFC 7662: `active` is a boolean, and a token is active only when it is `true`. An answer
    that is not, whatever claims it carries (an identity provider may send them along), or
    whose `active` is "true", 1 or missing, leaves the token refused as not active."""
    from aiohttp import web

    claims = {"sub": "bob", "aud": BASE, "exp": int(time.time()) + 300, "groups": ["mcp:time"]}
    answers: dict[str, dict[str, Any]] = {
        "active-true": {"active": True, **claims},
        "active-false": {"active": False, **claims},
        "active-string": {"active": "true", **claims},
        "active-one": {"active": 1, **claims},
        "active-null": {"active": None, **claims},
        "active-missing": claims,
    }

    async def introspect(request: web.Request) -> web.Response:
        return web.json_response(answers[str((await request.post())["token"])])

    app = web.Application()
    app.router.add_post("/introspect", introspect)
    server = await aiohttp_server(app)
    config = parse(
        CONFIG.replace(
            "scopes_claim: groups}",
            f"scopes_claim: groups, introspection: {{url: 'http://127.0.0.1:{server.port}/introspect', client_id: bridge, client_secret: s}}}}",
        ),
        environ={},
    )
    assert config.security.oauth is not None
    verifier = OAuthVerifier(config.security.oauth)
    try:
        for opaque in answers:
            with pytest.raises(NeedsFetch):
                verifier.check(opaque, frozenset({BASE}))
            await verifier.fetch(opaque)
        assert verifier.check("active-true", frozenset({BASE})).name == f"{ISSUER}#bob"  # the same claims, active
        for opaque in [name for name in answers if name != "active-true"]:
            with pytest.raises(TokenRefused, match="^token is not active$"):
                verifier.check(opaque, frozenset({BASE}))
        assert verifier.outcomes == {"ok": 1, "inactive": len(answers) - 1}
    finally:
        await verifier.close()


def test_the_resource_url_comes_from_config_or_a_trusted_proxy_only() -> None:
    proxied = CONFIG.replace("listen: {host: 127.0.0.1, port: 8080}", "listen: {host: 127.0.0.1, port: 8080, trusted_proxies: [10.0.0.0/8]}")
    g = guard(text=proxied)
    forwarded = ("https", "mcp.example.com", "/bridge/")
    assert g.resource_for("10.1.2.3", forwarded) == "https://mcp.example.com/bridge"
    assert g.resource_for("192.0.2.7", forwarded) == BASE  # not a trusted proxy: its headers change nothing
    assert g.resource_for("10.1.2.3", (None, None, None)) == BASE
    pinned = parse(proxied.replace("    authorization_servers:", "    resource: https://bridge.example.com/\n    authorization_servers:"), environ={})
    assert pinned.security.oauth is not None
    assert Guard(pinned, OAuthVerifier(pinned.security.oauth)).resource_for("10.1.2.3", forwarded) == "https://bridge.example.com"
    # A token for the proxied resource is good through the proxy, and only there.
    tok = token({"aud": "https://mcp.example.com/bridge/servers/time/mcp"})
    assert isinstance(admit(g, "127.0.0.1:8080", None, f"Bearer {tok}", "time", resource=g.resource_for("10.1.2.3", forwarded)), Principal)
    refused = admit(g, "127.0.0.1:8080", None, f"Bearer {tok}", "time", resource=g.resource_for("192.0.2.7", forwarded))
    assert isinstance(refused, Refusal) and refused.reason == "token is for another resource"


def test_without_a_resource_url_the_bridge_is_where_it_listens() -> None:
    from bridge.config.schema import ConfigError

    with pytest.raises(ConfigError) as raised:
        parse(CONFIG.replace("host: 127.0.0.1, port: 8080", "host: 0.0.0.0, port: 8080"), environ={})
    assert raised.value.problems[0].startswith("security.oauth.resource: required when listening on every address")
    config = parse(CONFIG.replace("port: 8080", "port: 0"), environ={})  # the port bound is known once bound
    assert config.security.oauth is not None
    assert Guard(config, OAuthVerifier(config.security.oauth), 43210).resource == "http://127.0.0.1:43210"


def test_a_scope_or_group_listed_under_oauth_admin_gives_the_admin_role() -> None:
    g = guard(text=CONFIG.replace('    scopes: {"mcp:time": [time], "mcp:all": ["*"]}', '    scopes: {"mcp:time": [time], "mcp:all": ["*"]}\n    admin: [ops-admins]'))
    admin = check(g, token({"aud": BASE, "groups": ["mcp:all", "ops-admins"]}), server=None)
    plain = check(g, token({"aud": BASE, "groups": ["mcp:all"]}), server=None)
    assert isinstance(admin, Principal) and admin.admin and g.admin_allowed(admin)
    assert isinstance(plain, Principal) and not plain.admin and not g.admin_allowed(plain)


@pytest.mark.parametrize("claim", ["sub", "oid"])
def test_a_token_whose_principal_claim_is_empty_is_refused(claim: str) -> None:
    """The principal is `issuer#<claim>`: an empty one would name a principal every such token
    shares (`issuer#`), so the token is refused, whichever claim names the principal."""
    text = CONFIG if claim == "sub" else CONFIG.replace("scopes_claim: groups}", f"scopes_claim: groups, principal_claim: {claim}}}")
    g = guard(text=text)
    assert isinstance(check(g, token({claim: "carol"})), Principal)
    refusal = check(g, token({claim: ""}))
    assert isinstance(refusal, Refusal) and refusal.status == 401, refusal
    assert refusal.reason == f"token has no usable {claim!r} claim", refusal.reason
    assert g.oauth is not None and g.oauth.outcomes == {"ok": 1, "invalid": 1}


async def test_an_introspection_answer_naming_another_issuer_is_not_this_issuers(aiohttp_server: Any) -> None:
    """RFC 7662 answers may carry `iss`: an issuer's endpoint that answers for a token another
    issuer made (a shared or misconfigured identity provider) does not vouch for it, so the
    principal is not named after this issuer; an answer with no `iss`, or this issuer's, is."""
    from aiohttp import web

    claims = {"active": True, "sub": "bob", "aud": BASE, "exp": int(time.time()) + 300, "groups": ["mcp:time"]}
    answers: dict[str, dict[str, Any]] = {
        "ours": {**claims, "iss": ISSUER},
        "no-iss": claims,
        "theirs": {**claims, "iss": "http://127.0.0.1:9999/realms/other"},
        "no-sub": {**claims, "sub": ""},
    }

    async def introspect(request: web.Request) -> web.Response:
        return web.json_response(answers[str((await request.post())["token"])])

    app = web.Application()
    app.router.add_post("/introspect", introspect)
    server = await aiohttp_server(app)
    config = parse(
        CONFIG.replace(
            "scopes_claim: groups}",
            f"scopes_claim: groups, introspection: {{url: 'http://127.0.0.1:{server.port}/introspect', client_id: bridge, client_secret: s}}}}",
        ),
        environ={},
    )
    assert config.security.oauth is not None
    verifier = OAuthVerifier(config.security.oauth)
    try:
        for opaque in answers:
            with pytest.raises(NeedsFetch):
                verifier.check(opaque, frozenset({BASE}))
            await verifier.fetch(opaque)
        for opaque in ("ours", "no-iss"):
            assert verifier.check(opaque, frozenset({BASE})).name == f"{ISSUER}#bob", opaque
        for opaque in ("theirs", "no-sub"):
            with pytest.raises(TokenRefused, match="^token is not active$"):
                verifier.check(opaque, frozenset({BASE}))
    finally:
        await verifier.close()


async def test_a_token_naming_an_unknown_kid_fetches_the_keys_again(aiohttp_server: Any) -> None:
    """Key rotation: the issuer's JWKS holds one key, then another. A token naming the new key's
    `kid` makes the keys be fetched again (NeedsFetch, then `fetch`) and is then accepted; it is
    never checked against the one key held (which would refuse it as a bad signature, and would
    take a token another key signed for that key's). A token with no kid is checked against
    the one key held."""
    from aiohttp import web

    rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    served = {"keys": [json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(RSA.public_key())) | {"kid": "r1", "use": "sig"}]}
    fetched: list[int] = []

    async def jwks(request: web.Request) -> web.Response:
        fetched.append(len(served["keys"]))
        return web.json_response(served)

    app = web.Application()
    app.router.add_get("/jwks", jwks)
    server = await aiohttp_server(app)
    config = parse(CONFIG.replace("scopes_claim: groups}", f"scopes_claim: groups, jwks_uri: 'http://127.0.0.1:{server.port}/jwks'}}"), environ={})
    assert config.security.oauth is not None
    verifier = OAuthVerifier(config.security.oauth)
    audiences = frozenset({BASE})
    try:
        await verifier.start()
        assert list(verifier.issuers[ISSUER].keys) == ["r1"] and len(fetched) == 1
        assert verifier.check(token({"aud": BASE}), audiences).name == f"{ISSUER}#alice"
        assert verifier.check(token({"aud": BASE, "sub": "nokid"}, kid=None), audiences).name == f"{ISSUER}#nokid"
        # The issuer rotates its key: a token of the new key names a kid not held.
        served["keys"] = [json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rotated.public_key())) | {"kid": "r2", "use": "sig"}]
        fresh = token({"aud": BASE, "sub": "dave"}, key=rotated, kid="r2")
        with pytest.raises(NeedsFetch):
            verifier.check(fresh, audiences)
        await verifier.fetch(fresh)
        assert len(fetched) == 2 and list(verifier.issuers[ISSUER].keys) == ["r2"]
        assert verifier.check(fresh, audiences).name == f"{ISSUER}#dave"
        # A token naming r2 but signed with the old key: checked against r2, and refused.
        with pytest.raises(TokenRefused, match="^token signature does not verify$"):
            verifier.check(token({"aud": BASE, "sub": "mallory"}, kid="r2"), audiences)
    finally:
        await verifier.close()


def test_the_servers_a_principal_may_use_are_known_after_its_check_for_what_opens_later() -> None:
    """A group opens its members' sessions after the request's check: `servers_of` says what
    that principal's token granted, static or OAuth (as it last signed in), and nothing for a
    name it has never seen."""
    g = guard(text=CONFIG + "  tokens: [{name: ci, token: ci-token-0123456789ab, servers: [files]}]\n")
    assert g.servers_of("ci") == frozenset({"files"}) and g.servers_of(None) is None
    assert g.servers_of(f"{ISSUER}#alice") == frozenset()  # not signed in yet: nothing
    assert isinstance(check(g, token({"aud": BASE})), Principal)
    assert g.servers_of(f"{ISSUER}#alice") == frozenset({"time"})
    assert isinstance(check(g, token({"aud": BASE, "groups": ["mcp:all"]})), Principal)
    assert g.servers_of(f"{ISSUER}#alice") is None  # as its newest token grants: every server


def test_the_principals_remembered_are_bounded_the_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard_module, "SIGNED_IN_KEPT", 2)
    g = guard()
    for who in ("alice", "bob", "alice", "carol"):  # alice's second sign-in makes bob the oldest
        assert isinstance(check(g, token({"aud": BASE, "sub": who})), Principal)
    assert [g.servers_of(f"{ISSUER}#{who}") for who in ("alice", "bob", "carol")] == [frozenset({"time"}), frozenset(), frozenset({"time"})]
