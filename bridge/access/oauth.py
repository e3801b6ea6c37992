"""Who is calling, when the caller signed in with OAuth: access tokens -> an Identity.

The bridge is an OAuth 2.1 resource server (MCP authorization, RFC 9728, RFC 8707).
A JWT access token is checked with PyJWT against its issuer's keys: the signature
with a key from the issuer's JWKS (only the configured asymmetric algorithms, so
never `none` and no HMAC made with a public key), `iss`, `aud` (this bridge's
resource URL, or the server's), `exp` and `nbf` with a leeway. An opaque token is
asked about at the issuer's introspection endpoint (RFC 7662).

Checking is synchronous whenever it can be: the keys are cached, and so is every
token already checked, until it expires. When a check needs the network (keys not
fetched yet, a `kid` not among them, an opaque token not seen before) `check`
raises `NeedsFetch`; the caller awaits `fetch()` and checks again. The fast path,
which cannot wait, hands such a request to aiohttp. Keys are fetched again on an
unknown `kid` at most once per `REFRESH_EVERY` seconds per issuer; while an
issuer cannot be reached, tokens signed with keys already held keep working and
the rest get `Unavailable` (503 with Retry-After), never a hang.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from bridge import logs
from bridge.config.schema import AuthorizationServer, OAuth

if TYPE_CHECKING:
    # Imported where tokens are checked, not here: PyJWT with `cryptography` is about
    # 9 MiB of resident memory, for a daemon that may never see an OAuth token.
    import jwt

REFRESH_EVERY = 30.0  # seconds between two fetches of an issuer's keys for an unknown kid
FETCH_TIMEOUT = 5.0
MAX_KEYS = 64  # per issuer: a JWKS larger than this is cut
MAX_CACHED = 10_000  # tokens checked, kept until they expire
RETRY_AFTER_S = 5  # what a 503 for an unreachable issuer tells the client


@dataclass(frozen=True, slots=True)
class Identity:
    """A signed-in principal: `issuer#subject`, never equal to a static token's name."""

    name: str
    servers: frozenset[str] | None  # from its scopes or groups; None: every server
    scopes: frozenset[str]
    audiences: frozenset[str]  # what the token may be used for (RFC 8707)
    expires: float | None


class TokenRefused(Exception):
    """The token is not valid here: 401 `invalid_token` with this one-line reason."""

    def __init__(self, reason: str, kind: str = "invalid_token") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind  # the metric's reason word


class Unavailable(Exception):
    """The token's issuer cannot be reached to check it: 503, try again later."""

    def __init__(self, issuer: str) -> None:
        super().__init__(f"the authorization server {issuer} cannot be reached")
        self.issuer = issuer
        self.retry_after = RETRY_AFTER_S


class NeedsFetch(Exception):
    """Checking this token needs the network first: await `OAuthVerifier.fetch(token)`."""


class IssuerKeys:
    """One issuer's signing keys, as fetched from its JWKS, and how fetching went."""

    def __init__(self, config: AuthorizationServer) -> None:
        self.config = config
        self.keys: dict[str | None, jwt.PyJWK] = {}
        self.fetched_at: float | None = None  # last success (monotonic)
        self.attempted_at = -REFRESH_EVERY  # last attempt, success or not
        self.error: str | None = None  # why the last attempt failed
        self.refreshes = 0
        self.failures = 0
        self._lock = asyncio.Lock()

    def state(self) -> str:
        if self.fetched_at is None:
            return f"no keys yet: {self.error}" if self.error else "no keys yet"
        return "ok" if self.error is None else f"keys cached; last refresh failed: {self.error}"

    def may_refresh(self, now: float) -> bool:
        return now - self.attempted_at >= REFRESH_EVERY

    async def refresh(self, http: aiohttp.ClientSession, clock: Callable[[], float]) -> None:
        import jwt

        async with self._lock:
            if not self.may_refresh(clock()):
                return  # another request fetched while this one waited
            self.attempted_at = clock()
            try:
                uri = self.config.jwks_uri or await _jwks_uri(http, self.config.issuer)
                document = await _get_json(http, uri)
                keys: dict[str | None, jwt.PyJWK] = {}
                for entry in document.get("keys", [])[:MAX_KEYS] if isinstance(document, dict) else []:
                    try:
                        key = jwt.PyJWK(entry)
                    except (jwt.PyJWKError, jwt.InvalidKeyError):
                        continue  # a key type or algorithm this bridge does not take
                    if entry.get("use", "sig") == "sig":
                        keys[entry.get("kid")] = key
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.failures += 1
                self.error = _one_line(exc)
                logs.get().warning("oauth_keys_failed", issuer=self.config.issuer, error=self.error)
                return
            self.keys, self.fetched_at, self.error = keys, clock(), None
            self.refreshes += 1
            logs.get().info("oauth_keys_fetched", issuer=self.config.issuer, keys=len(keys))


class OAuthVerifier:
    """Checks OAuth access tokens for the issuers in `security.oauth`."""

    def __init__(self, config: OAuth, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self.issuers = {server.issuer: IssuerKeys(server) for server in config.authorization_servers}
        self._clock = clock
        self._wall = wall
        self._checked: OrderedDict[bytes, Identity] = OrderedDict()
        # Opaque tokens an issuer said are not active, or could not be asked about: digest ->
        # until when that answer holds (so a flood of bogus tokens is not a flood of requests).
        self._inactive: OrderedDict[bytes, tuple[float, bool]] = OrderedDict()
        self._introspecting = [s for s in config.authorization_servers if s.introspection is not None]
        self._http: aiohttp.ClientSession | None = None
        self._retrying: asyncio.Task[None] | None = None
        self.outcomes: dict[str, int] = {}  # reason word -> count: a metric

    async def start(self) -> None:
        """Fetch every issuer's keys once, so that the first requests need not wait; an issuer
        that cannot be reached now is tried again in the background until it gives them."""
        await asyncio.gather(*(self._first_keys(keys) for keys in self.issuers.values()))
        if any(keys.fetched_at is None for keys in self.issuers.values()):
            self._retrying = asyncio.get_running_loop().create_task(self._until_keys())

    async def _first_keys(self, issuer: IssuerKeys) -> None:
        await self._refresh(issuer)
        issuer.attempted_at = -REFRESH_EVERY  # the first unknown kid may fetch again at once

    async def _until_keys(self) -> None:
        while missing := [keys for keys in self.issuers.values() if keys.fetched_at is None]:
            await asyncio.sleep(RETRY_AFTER_S)
            await asyncio.gather(*(self._first_keys(keys) for keys in missing))

    async def close(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
            self._retrying = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    def check(self, token: str, audiences: frozenset[str]) -> Identity:
        """The identity `token` proves for a request to one of `audiences`; raises
        TokenRefused, Unavailable, or NeedsFetch (then `await fetch(token)` and ask again)."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        identity = self._checked.get(digest)
        if identity is None:
            identity = self._verify(token, digest)
            self._remember(digest, identity)
        elif identity.expires is not None and identity.expires <= self._wall():
            del self._checked[digest]
            raise self._refuse(TokenRefused("token expired", "expired"))
        if not identity.audiences & audiences:
            raise self._refuse(TokenRefused("token is for another resource", "audience"))
        self._count("ok")
        return identity

    async def fetch(self, token: str) -> None:
        """Do the IO the last `check` of this token needed: its issuer's keys, or for an
        opaque token, the introspection."""
        issuer = self._issuer_of(token)
        if issuer is not None:
            await self._refresh(issuer)
        elif self._introspecting:
            await self._introspect(token)

    def _verify(self, token: str, digest: bytes) -> Identity:
        import jwt

        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            if not self._introspecting:
                raise self._refuse(TokenRefused("not a JWT access token", "malformed")) from None
            return self._introspected(digest)
        iss = unverified.get("iss")
        issuer = self.issuers.get(iss) if isinstance(iss, str) else None
        if issuer is None:
            raise self._refuse(TokenRefused("token from an unknown issuer", "issuer"))
        server = issuer.config
        alg = header.get("alg")
        if alg not in server.algorithms:
            raise self._refuse(TokenRefused(f"token algorithm {alg!r} not accepted", "algorithm"))
        key = issuer.keys.get(header.get("kid"))
        if key is None and header.get("kid") is None and len(issuer.keys) == 1:
            key = next(iter(issuer.keys.values()))
        if key is None:
            if issuer.may_refresh(self._clock()):
                raise NeedsFetch()
            if issuer.error is not None:
                raise Unavailable(server.issuer)
            raise self._refuse(TokenRefused("token signed with an unknown key", "unknown_key"))
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                issuer=server.issuer,
                leeway=server.leeway,
                options={"verify_aud": False, "require": ["exp", "iss", "aud", server.principal_claim]},
            )
        except jwt.ExpiredSignatureError:
            raise self._refuse(TokenRefused("token expired", "expired")) from None
        except jwt.ImmatureSignatureError:
            raise self._refuse(TokenRefused("token not yet valid", "not_yet_valid")) from None
        except jwt.InvalidSignatureError:
            raise self._refuse(TokenRefused("token signature does not verify", "signature")) from None
        except jwt.PyJWTError as exc:
            raise self._refuse(TokenRefused(f"token refused: {_one_line(exc)}", "invalid")) from None
        return self._identity(server, claims)

    def _identity(self, server: AuthorizationServer, claims: dict[str, Any]) -> Identity:
        subject = claims[server.principal_claim]
        if not isinstance(subject, str) or not subject:
            raise self._refuse(TokenRefused(f"token has no usable {server.principal_claim!r} claim", "invalid"))
        audience = claims["aud"]
        audiences = frozenset([audience] if isinstance(audience, str) else [a for a in audience if isinstance(a, str)])
        raw = claims.get(server.scopes_claim, "")
        scopes = frozenset(raw.split() if isinstance(raw, str) else [s for s in raw if isinstance(s, str)] if isinstance(raw, list) else [])
        servers: set[str] = set()
        everything = False
        for scope in scopes:
            for name in self.config.scopes.get(scope, ()):
                everything |= name == "*"
                servers.add(name)
        expires = claims.get("exp")
        return Identity(
            f"{server.issuer}#{subject}",
            None if everything else frozenset(servers),
            scopes,
            audiences,
            float(expires) + server.leeway if isinstance(expires, int | float) else None,
        )

    def _introspected(self, digest: bytes) -> Identity:
        """An opaque token: what introspection said of it, if it was asked (else NeedsFetch)."""
        answer = self._inactive.get(digest)
        if answer is None or answer[0] <= self._clock():
            raise NeedsFetch()
        if answer[1]:
            raise Unavailable(self._introspecting[0].issuer)
        raise self._refuse(TokenRefused("token is not active", "inactive"))

    async def _introspect(self, token: str) -> None:
        """Ask each issuer with an introspection endpoint about an opaque token (RFC 7662)."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT))
        down = False
        for server in self._introspecting:
            intro = server.introspection
            assert intro is not None
            headers = {"Accept": "application/json", "Authorization": aiohttp.encode_basic_auth(intro.client_id, intro.client_secret or "")}
            try:
                async with self._http.post(intro.url, data={"token": token}, headers=headers) as resp:
                    resp.raise_for_status()
                    claims = json.loads(await resp.content.read(1 << 16))
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                down = True
                logs.get().warning("oauth_introspection_failed", issuer=server.issuer, error=_one_line(exc))
                continue
            if isinstance(claims, dict) and claims.get("active") is True and claims.get("iss", server.issuer) == server.issuer:
                try:
                    identity = self._identity(server, {"iss": server.issuer, **claims})
                except (KeyError, TokenRefused):
                    continue  # active, but without the claims a principal needs
                if identity.expires is not None and identity.expires > self._wall():
                    self._remember(digest, identity)
                    return
        # Not active anywhere (or nobody could say): remember that for a while.
        self._inactive[digest] = (self._clock() + (RETRY_AFTER_S if down else REFRESH_EVERY), down)
        if len(self._inactive) > MAX_CACHED:
            self._inactive.popitem(last=False)

    def scopes_for(self, server: str) -> list[str]:
        """The scopes (or group values) that grant `server`: what a 403 says is needed."""
        return sorted(scope for scope, names in self.config.scopes.items() if server in names or "*" in names)

    def _issuer_of(self, token: str) -> IssuerKeys | None:
        import jwt

        try:
            iss = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.PyJWTError:
            return None
        return self.issuers.get(iss) if isinstance(iss, str) else None

    async def _refresh(self, issuer: IssuerKeys) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT))
        await issuer.refresh(self._http, self._clock)

    def _remember(self, digest: bytes, identity: Identity) -> None:
        checked = self._checked
        checked[digest] = identity
        if len(checked) > MAX_CACHED:
            checked.popitem(last=False)

    def _refuse(self, refusal: TokenRefused) -> TokenRefused:
        self._count(refusal.kind)
        return refusal

    def _count(self, reason: str) -> None:
        self.outcomes[reason] = self.outcomes.get(reason, 0) + 1


async def _jwks_uri(http: aiohttp.ClientSession, issuer: str) -> str:
    """The issuer's jwks_uri from its metadata (RFC 8414, then OpenID Connect discovery)."""
    base = issuer.rstrip("/")
    for path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
        try:
            document = await _get_json(http, base + path)
        except (aiohttp.ClientResponseError, ValueError):
            continue
        if isinstance(document, dict) and isinstance(document.get("jwks_uri"), str):
            return str(document["jwks_uri"])
    raise ValueError(f"no jwks_uri in {issuer}'s metadata")


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url, headers={"Accept": "application/json"}) as resp:
        resp.raise_for_status()
        body = await resp.content.read(1 << 20)  # a metadata document or key set, not more
    return json.loads(body)


def _one_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]

