"""Who may talk to the bridge: Host and Origin checks, bearer tokens, CORS.

The rules only, free of HTTP: `http/access.py` applies them to requests
on both HTTP paths.

Order matters and is cheap-first: a request from a page that a DNS-rebinding
attacker controls is refused on its Host or Origin before any token is
looked at. Probes (`/healthz`, `/readyz`) are always open. Tokens are kept
only as SHA-256 digests and compared in constant time; logs name a token by
its configured `name`, never by its value.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from bridge import logs
from bridge.access.oauth import OAuthVerifier, TokenRefused, Unavailable
from bridge.config.schema import Config, is_loopback

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/ui", "/ui/app.js", "/ui/app.css"})  # the probes; the status page's static files
ADMIN_PATH = "/admin/"  # the admin API: only for admins (Guard.admin_allowed)
WELL_KNOWN = "/.well-known/oauth-protected-resource"  # and under it, per server: open, like the probes
Forwarded = tuple[str | None, str | None, str | None]  # X-Forwarded-Proto, -Host, -Prefix of a request
NOT_FORWARDED: Forwarded = (None, None, None)
HOST_CACHE = 256
SIGNED_IN_KEPT = 10_000  # OAuth principals whose servers are remembered (Guard.servers_of)
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, Accept, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID, Mcp-Method, Mcp-Name"
CORS_EXPOSE = "Mcp-Session-Id, MCP-Protocol-Version, WWW-Authenticate"
WWW_AUTHENTICATE = 'Bearer realm="mcp-bridge"'


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    digest: bytes  # of its static token; empty for a principal signed in with OAuth
    servers: frozenset[str] | None  # None: every server
    oauth: bool = False
    admin: bool = False  # `roles: [admin]`: may use the admin API

    def may_use(self, server: str) -> bool:
        return self.servers is None or server in self.servers


class Guard:
    """The access rules of one config; pure, so they are tested without HTTP."""

    def __init__(self, config: Config, oauth: OAuthVerifier | None = None, port: int | None = None) -> None:
        sec = config.security
        self.oauth = oauth
        signin = sec.oauth
        self.configured_resource = signin.resource.rstrip("/") if signin is not None and signin.resource else None
        self.resource = self.configured_resource or default_resource(config, port)
        self.trusted_proxies = tuple(ipaddress.ip_network(p, strict=False) for p in config.listen.trusted_proxies)
        issuers = signin.authorization_servers if signin is not None else ()
        self.extra_audience = frozenset(s.audience for s in issuers if s.audience is not None)
        self.admin_scopes = frozenset(signin.admin if signin is not None else ())
        self.principals = tuple(
            Principal(
                t.name,
                bytes.fromhex(t.sha256) if t.sha256 is not None else hashlib.sha256((t.token or "").encode()).digest(),
                None if "*" in t.servers else frozenset(t.servers),
                admin="admin" in t.roles,
            )
            for t in sec.tokens
        )
        self.allowed_origins = frozenset(sec.allowed_origins)
        self.allowed_hosts = frozenset(h.lower() for h in sec.allowed_hosts)
        self.loopback = is_loopback(config.listen.host)
        self.metrics_path = config.metrics.path
        self._hosts: dict[str, bool] = {}  # every request asks; the answers are few
        self._by_name = {p.name: p.servers for p in self.principals}
        self._signed_in: dict[str, frozenset[str] | None] = {}  # OAuth principals' servers, as last signed in

    def servers_of(self, principal: str | None) -> frozenset[str] | None:
        """The servers `principal` may use (None: every one), for what is opened in its name
        later than its request's check (a group's member sessions): a static token's, or what
        an OAuth principal's access token granted when it last signed in."""
        if principal is None:
            return None
        if principal in self._by_name:
            return self._by_name[principal]
        return self._signed_in.get(principal, frozenset())

    @property
    def authenticating(self) -> bool:
        return bool(self.principals) or self.oauth is not None

    def admin_allowed(self, principal: Principal | None) -> bool:
        """The admin API (ADMIN_PATH): a token with the admin role; with no authentication
        configured, anyone who reaches a loopback bind (never an open non-loopback one)."""
        if principal is not None:
            return principal.admin
        return not self.authenticating and self.loopback

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal whose static token this header carries, checked against every token
        in constant time."""
        token = _bearer(authorization)
        if token is None:
            return None
        # Header bytes that are not UTF-8 arrive as surrogates: keep them, they just match nothing.
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for principal in self.principals:
            if hmac.compare_digest(digest, principal.digest):
                found = principal
        return found

    def sign_in(self, authorization: str | None, server: str | None, transport: str, resource: str) -> Principal | Refusal:
        """The principal an OAuth access token proves, for a request to `server` (or to the
        bridge itself); may raise NeedsFetch. Only when `oauth` is set."""
        assert self.oauth is not None
        token = _bearer(authorization)
        if token is None:
            return _unauthenticated(authorization, self.challenge(resource, server, transport))
        try:
            identity = self.oauth.check(token, self.audiences(resource, server))
        except TokenRefused as exc:
            challenge = self.challenge(resource, server, transport, error="invalid_token", description=exc.reason)
            return Refusal(401, "invalid_token", exc.reason, {"WWW-Authenticate": challenge})
        except Unavailable as exc:
            return Refusal(503, "oauth_unavailable", str(exc), {"Retry-After": str(exc.retry_after)})
        signed_in = self._signed_in
        signed_in.pop(identity.name, None)  # the newest last: the oldest give way
        signed_in[identity.name] = identity.servers
        if len(signed_in) > SIGNED_IN_KEPT:
            del signed_in[next(iter(signed_in))]
        return Principal(identity.name, b"", identity.servers, oauth=True, admin=not identity.scopes.isdisjoint(self.admin_scopes))

    def resource_for(self, remote: str | None, forwarded: Forwarded) -> str:
        """The bridge's resource URL as this request's client sees it: `security.oauth.resource`
        if set; else what a trusted proxy says (X-Forwarded-Proto, -Host, -Prefix); else
        where it listens. Nobody else can change it: tokens are checked against it."""
        if self.configured_resource is not None:
            return self.configured_resource
        proto, host, prefix = forwarded
        if host and self.trusts(remote):
            return f"{(proto or 'https').split(',')[0].strip()}://{host.split(',')[0].strip()}{(prefix or '').rstrip('/')}"
        return self.resource

    def trusts(self, remote: str | None) -> bool:
        if remote is None or not self.trusted_proxies:
            return False
        try:
            address = ipaddress.ip_address(remote)
        except ValueError:
            return False
        return any(address in network for network in self.trusted_proxies)

    def audiences(self, resource: str, server: str | None) -> frozenset[str]:
        """What a token's `aud` may name to be used here (RFC 8707): the bridge, or the server."""
        base = {resource, *self.extra_audience}
        if server is not None:
            base |= {f"{resource}/servers/{server}/mcp", f"{resource}/servers/{server}/sse"}
        return frozenset(base)

    def metadata_url(self, resource: str, server: str | None, transport: str = "mcp") -> str:
        """Where the protected resource metadata of this server (or the bridge) is (RFC 9728)."""
        path = f"/servers/{server}/{transport}" if server is not None else ""
        return f"{resource}/.well-known/oauth-protected-resource{path}"

    def challenge(
        self, resource: str, server: str | None, transport: str = "mcp", error: str | None = None, description: str | None = None
    ) -> str:
        """The WWW-Authenticate value of a 401 (or, with `insufficient_scope`, a 403; RFC 6750)."""
        if self.oauth is None:
            return WWW_AUTHENTICATE
        parts = [f'resource_metadata="{self.metadata_url(resource, server, transport)}"']
        needed = self.oauth.scopes_for(server) if server is not None else []
        if needed:
            parts.append(f'scope="{" ".join(needed)}"')
        if error is not None:
            parts.append(f'error="{error}"')
        if description is not None:
            # A quoted-string: the reasons are the bridge's own one-liners, but keep them quotable.
            parts.append(f'error_description="{description.replace(chr(92), "/").replace(chr(34), chr(39))}"')
        return "Bearer " + ", ".join(parts)

    def host_allowed(self, host: str | None) -> bool:
        """When bound to loopback, only loopback names (any port) or listed hosts: no DNS rebinding."""
        if host is None:
            return True
        known = self._hosts.get(host)
        if known is None:
            if len(self._hosts) >= HOST_CACHE:
                self._hosts.clear()
            known = self._hosts[host] = self._host_allowed(host)
        return known

    def _host_allowed(self, host: str) -> bool:
        name = _strip_port(host.lower())
        if host.lower() in self.allowed_hosts or name in self.allowed_hosts:
            return True
        if not self.loopback:
            return not self.allowed_hosts
        return is_loopback(name)

    def origin_allowed(self, origin: str | None) -> bool:
        """Listed origins; when bound to loopback, also pages served from loopback itself."""
        if origin is None or origin in self.allowed_origins:
            return True
        if not self.loopback:
            return False
        scheme, sep, rest = origin.partition("://")
        return bool(sep) and scheme in ("http", "https") and is_loopback(_strip_port(rest.lower()))


def _strip_port(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else host


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request may not proceed: an HTTP status, a metric reason word, a one-line text."""

    status: int
    kind: str
    reason: str
    headers: dict[str, str] | None = None
    detail: dict[str, str | None] | None = None


def admit(
    guard: Guard,
    host: str | None,
    origin: str | None,
    authorization: str | None,
    server: str | None,
    preflight: bool = False,
    transport: str = "mcp",
    resource: str = "",
) -> Refusal | Principal | None:
    """The access rules, cheap-first: a Refusal, else the token's principal (None when
    no tokens are configured, and for a CORS preflight, which carries no token). With
    OAuth, a token that is not a static one is an access token: may raise NeedsFetch."""
    if not guard.host_allowed(host):
        return Refusal(403, "host", "host not allowed", detail={"host": host})
    if origin is not None and not guard.origin_allowed(origin):
        return Refusal(403, "origin", "origin not allowed", detail={"origin": origin})
    if preflight or not guard.authenticating:
        return None
    principal = guard.authenticate(authorization)
    if principal is None:
        if guard.oauth is None:
            return _unauthenticated(authorization, WWW_AUTHENTICATE)
        signed_in = guard.sign_in(authorization, server, transport, resource or guard.resource)
        if isinstance(signed_in, Refusal):
            return signed_in
        principal = signed_in
    if server is not None and not principal.may_use(server):
        if principal.oauth:
            challenge = guard.challenge(resource or guard.resource, server, transport, error="insufficient_scope")
            return Refusal(
                403, "insufficient_scope", f"no scope of this token grants server {server!r}",
                {"WWW-Authenticate": challenge}, detail={"principal": principal.name},
            )  # fmt: skip
        return Refusal(403, "forbidden_server", f"token not allowed for server {server!r}", detail={"token": principal.name})
    return principal


def refused(count: Callable[[str], None], refusal: Refusal, path: str, remote: str | None) -> None:
    """Count and log a refusal once, whichever HTTP path saw it."""
    count(refusal.kind)
    logs.get().warning(
        "request_rejected", status=refusal.status, reason=refusal.reason, path=path, remote=remote, **(refusal.detail or {})
    )


def cors_headers(guard: Guard, origin: str | None) -> dict[str, str] | None:
    """The CORS headers of a response to a request from `origin`; None when it gets none."""
    if origin is None or not guard.origin_allowed(origin):
        return None
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Expose-Headers": CORS_EXPOSE, "Vary": "Origin"}


def _unauthenticated(authorization: str | None, challenge: str) -> Refusal:
    """401 for a request with no token, or one that is no token of ours."""
    kind = "invalid_token" if authorization is not None else "missing_token"
    return Refusal(401, kind, kind.replace("_", " "), {"WWW-Authenticate": challenge})


def _bearer(authorization: str | None) -> str | None:
    """The token of a `Bearer` Authorization header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def default_resource(config: Config, port: int | None = None) -> str:
    """The bridge's resource URL when `security.oauth.resource` is not set: where it listens
    (`port`: the one bound, when the config says 0)."""
    listen = config.listen
    host = f"[{listen.host}]" if ":" in listen.host else listen.host
    return f"{'https' if listen.tls is not None else 'http'}://{host}:{listen.port if port is None else port}"
