"""Who may talk to the bridge: Host and Origin checks, bearer tokens, CORS.

The rules only, free of HTTP: `transports/http.py` applies them to requests
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
from collections.abc import Callable
from dataclasses import dataclass

from . import logs
from .config import Config, is_loopback

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
HOST_CACHE = 256
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, Accept, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID"
CORS_EXPOSE = "Mcp-Session-Id, MCP-Protocol-Version, WWW-Authenticate"
WWW_AUTHENTICATE = 'Bearer realm="mcp-bridge"'


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    digest: bytes
    servers: frozenset[str] | None  # None: every server

    def may_use(self, server: str) -> bool:
        return self.servers is None or server in self.servers


class Guard:
    """The access rules of one config; pure, so they are tested without HTTP."""

    def __init__(self, config: Config) -> None:
        sec = config.security
        self.principals = tuple(
            Principal(
                t.name,
                bytes.fromhex(t.sha256) if t.sha256 is not None else hashlib.sha256((t.token or "").encode()).digest(),
                None if "*" in t.servers else frozenset(t.servers),
            )
            for t in sec.tokens
        )
        self.allowed_origins = frozenset(sec.allowed_origins)
        self.allowed_hosts = frozenset(h.lower() for h in sec.allowed_hosts)
        self.loopback = is_loopback(config.listen.host)
        self.metrics_path = config.metrics.path
        self._hosts: dict[str, bool] = {}  # every request asks; the answers are few

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal whose token this header carries, checked against every token in constant time."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        # Header bytes that are not UTF-8 arrive as surrogates: keep them, they just match nothing.
        digest = hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()
        found = None
        for principal in self.principals:
            if hmac.compare_digest(digest, principal.digest):
                found = principal
        return found

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
) -> Refusal | Principal | None:
    """The access rules, cheap-first: a Refusal, else the token's principal (None when
    no tokens are configured, and for a CORS preflight, which carries no token)."""
    if not guard.host_allowed(host):
        return Refusal(403, "host", "host not allowed", detail={"host": host})
    if origin is not None and not guard.origin_allowed(origin):
        return Refusal(403, "origin", "origin not allowed", detail={"origin": origin})
    if preflight or not guard.principals:
        return None
    principal = guard.authenticate(authorization)
    if principal is None:
        kind = "invalid_token" if authorization is not None else "missing_token"
        return Refusal(401, kind, kind.replace("_", " "), {"WWW-Authenticate": WWW_AUTHENTICATE})
    if server is not None and not principal.may_use(server):
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
