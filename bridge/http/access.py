"""The access rules of `access.guard` applied to one HTTP request, for both paths.

`check_access` is the one place a request is admitted: refusals counted and logged once,
the caller's principal, and whether it is a CORS preflight (whose answer,
`PREFLIGHT_HEADERS`, is defined here). aiohttp's path runs it in `middleware`; the fast
path calls it with what it parsed. Also `Expect: 100-continue` and the CORS hook.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, web
from aiohttp.typedefs import Handler, Middleware

from bridge import logs
from bridge.access.guard import (
    ADMIN_PATH,
    CORS_HEADERS,
    CORS_METHODS,
    NOT_FORWARDED,
    OPEN_PATHS,
    WELL_KNOWN,
    Forwarded,
    Guard,
    Principal,
    Refusal,
    admit,
    cors_headers,
    refused,
)
from bridge.access.oauth import NeedsFetch
from bridge.http.errors import INTERNAL_ERROR, RETRY_AFTER_S, HttpError, render

# Set on an aiohttp request by the middleware: the name of the token that made it.
PRINCIPAL: web.RequestKey[str | None] = web.RequestKey("mcp_bridge.principal")


# And the token's principal itself (its servers, whether it is an admin): what /status shows it.
CALLER: web.RequestKey[Principal | None] = web.RequestKey("mcp_bridge.caller")


class Access:
    """What the access rules decided for one admitted request. Its responses carry the
    CORS headers `security.cors_headers` gives for its Origin (each path adds them)."""

    __slots__ = ("caller", "preflight", "principal")

    def __init__(self, caller: Principal | None, preflight: bool) -> None:
        self.caller = caller  # None when no authentication is configured, and for a preflight
        self.principal = caller.name if caller is not None else None  # the token's name
        self.preflight = preflight  # a CORS preflight: answered with PREFLIGHT_HEADERS, no handler


PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": CORS_METHODS,
    "Access-Control-Allow-Headers": CORS_HEADERS,
    "Access-Control-Max-Age": "600",
}


def check_access(
    guard: Guard,
    count: Callable[[str], None],
    *,
    method: str,
    path: str,
    server: str | None,
    host: str | None,
    origin: str | None,
    authorization: str | None,
    remote: str | None,
    forwarded: Forwarded = NOT_FORWARDED,
) -> Access:
    """The access rules for one request; a refusal is counted (`count` is told its reason
    word), logged once and raised as an HttpError."""
    preflight = origin is not None and method == "OPTIONS"
    transport = "mcp" if path.endswith("/mcp") else "sse"  # which metadata a 401 points to
    resource = guard.resource_for(remote, forwarded) if guard.oauth is not None else ""
    result = admit(guard, host, origin, authorization, server, preflight, transport, resource)
    if not preflight and path.startswith(ADMIN_PATH) and not isinstance(result, Refusal) and not guard.admin_allowed(result):
        result = Refusal(403, "not_admin", "the admin API needs a token with the admin role", detail={"token": result.name if result is not None else None})
    if isinstance(result, Refusal):
        refused(count, result, path, remote)
        raise HttpError(result.status, result.reason, headers=result.headers)
    return Access(result, preflight)


def middleware(guard: Callable[[], Guard], count: Callable[[str], None], refused: Callable[[web.Request, HttpError], None]) -> Middleware:
    """aiohttp's side of this layer, in one middleware (the per-request path is hot): the
    access check against the live `guard()`, the preflight answer, and the one place an
    HttpError becomes a response. `refused` hears of each HttpError a handler raised (past
    the access check: a refusal of what the request carried)."""

    @web.middleware
    async def http_layer(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path not in OPEN_PATHS and not request.path.startswith(WELL_KNOWN):
                headers = request.headers
                checking = guard()
                check = functools.partial(
                    check_access,
                    checking,
                    count,
                    method=request.method,
                    path=request.path,
                    server=request.match_info.get("name"),
                    host=headers.get("Host"),
                    origin=headers.get("Origin"),
                    authorization=headers.get("Authorization"),
                    remote=request.remote,
                    forwarded=forwarded(request),
                )
                try:
                    access = check()
                except NeedsFetch:
                    # An access token whose issuer's keys must be fetched first (at most once
                    # per issuer and interval): the one place a request waits on the network.
                    assert checking.oauth is not None
                    await checking.oauth.fetch(_token(headers.get("Authorization")))
                    try:
                        access = check()
                    except NeedsFetch:
                        raise HttpError(503, "the authorization server's keys are being fetched", headers={"Retry-After": RETRY_AFTER_S}) from None
                if access.preflight:
                    return web.Response(status=204, headers=PREFLIGHT_HEADERS)
                request[PRINCIPAL], request[CALLER] = access.principal, access.caller
            try:
                return await handler(request)
            except HttpError as exc:
                refused(request, exc)
                raise
        except HttpError as exc:
            return render(exc)
        except web.HTTPMethodNotAllowed as exc:
            # aiohttp's router answers these in plain text: the JSON-RPC body every refusal has.
            return render(HttpError(405, f"{request.method} is not allowed here", headers={"Allow": exc.headers.get("Allow", "")}))
        except web.HTTPNotFound:
            return render(HttpError(404, "no such path"))
        except (web.HTTPException, ConnectionError):
            raise  # aiohttp's other answers, and a client gone: aiohttp's
        except Exception:
            logs.get().exception("internal_error", where="handler", path=request.path, method=request.method)
            return render(INTERNAL_ERROR)

    return http_layer


def forwarded(request: web.Request) -> Forwarded:
    headers = request.headers
    return headers.get("X-Forwarded-Proto"), headers.get("X-Forwarded-Host"), headers.get("X-Forwarded-Prefix")


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """`Expect` on a message POST (which the fast path leaves to aiohttp): 100 Continue to
    an HTTP/1.1 `100-continue`, a 417 with a JSON-RPC error body to anything else. As
    aiohttp's own, but nothing is written to a client that has already gone: aiohttp's
    write to the closing transport raises, and its request is logged as an error with a
    traceback."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return None
    if expect.lower() != "100-continue":
        return render(HttpError(417, f"unknown Expect: {expect[:40]}"))
    transport = request.transport
    if transport is None or transport.is_closing():
        return None  # its handler finds it gone
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the 100 is not part of the answer's size
    return None


def cors_hook(guard: Callable[[], Guard]) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """A response-prepare hook, so that streams and errors get CORS headers too."""

    async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
        cors = cors_headers(guard(), request.headers.get("Origin"))
        if cors is not None:
            vary = cors.pop("Vary")
            response.headers.update(cors)
            response.headers.add("Vary", vary)

    return add_cors_headers


def _token(authorization: str | None) -> str:
    return (authorization or "").partition(" ")[2].strip()
