"""What both HTTP paths share of the app's state: the live gateways and metrics (app keys), a
request's principal and gateway, opening a session, routing a message into it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bridge.access.guard import Guard
from bridge.access.oauth import OAuthVerifier
from bridge.access.policy import Throttled
from bridge.config.schema import Config
from bridge.gateway.gateway import Gateway, SessionLimitError
from bridge.gateway.group import Group, NoMember
from bridge.gateway.pinsfile import PinsFile
from bridge.gateway.sessions import Served, Session
from bridge.http.access import PRINCIPAL
from bridge.http.errors import RETRY_AFTER_S, HttpError
from bridge.metrics import Metrics
from bridge.process.pool import Slots
from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import Kind, ProtocolError

if TYPE_CHECKING:
    from bridge.traces.spans import Spans  # imported only when tracing is on (traces/settings.py)


@dataclass(slots=True)
class Live:
    """What a reload replaces: read through this on every request, never cached."""

    config: Config
    guard: Guard
    # Client calls in flight by principal, counted by every mux: outlives reloads.
    in_flight: Counter[str | None] = field(default_factory=Counter)
    processes: Slots = field(default_factory=lambda: Slots(None))  # every server's processes: outlives reloads
    oauth: OAuthVerifier | None = None  # its keys and checked tokens outlive reloads that keep security.oauth
    port: int | None = None  # the one bound, once it is
    draining: bool = False  # SIGTERM: /readyz is 503 from then on (app.drain)
    pins: PinsFile | None = None  # config pins.path, read again on every reload


LIVE = web.AppKey("live", Live)


GATEWAYS = web.AppKey("gateways", dict[str, Gateway])


GROUPS = web.AppKey("groups", dict[str, Group])


METRICS = web.AppKey("metrics", Metrics)


TRACES: web.AppKey[Spans] = web.AppKey("traces")  # only when tracing is on


def principal(request: web.Request) -> str | None:
    return request.get(PRINCIPAL)


SSE_ROUTE, MESSAGES_ROUTE, MCP_ROUTE = "/servers/{name}/sse", "/servers/{name}/messages", "/servers/{name}/mcp"
GROUP_SSE_ROUTE, GROUP_MESSAGES_ROUTE, GROUP_MCP_ROUTE = "/groups/{group}/sse", "/groups/{group}/messages", "/groups/{group}/mcp"


_MESSAGE_ROUTES = frozenset({SSE_ROUTE, MESSAGES_ROUTE, MCP_ROUTE})


def refused(request: web.Request, error: HttpError) -> None:
    """A refusal at a server's MCP endpoint is a JSON-RPC error sent to its client: counted
    (`mcp_bridge_errors_total`) as the fast path counts its own."""
    resource = request.match_info.route.resource
    if resource is not None and resource.canonical in _MESSAGE_ROUTES:
        gateway = request.app[GATEWAYS].get(request.match_info["name"])
        if gateway is not None:
            gateway.metrics.error_sent({"code": error.code})


def gateway_for(request: web.Request) -> Served:
    """What the request's path names: `/servers/{name}/...`, else `/groups/{group}/...`."""
    info = request.match_info
    name = info.get("name")
    if name is not None:
        return gateway_named(request.app[GATEWAYS], name)
    return group_named(request.app[GROUPS], info["group"])


def group_named(groups: dict[str, Group], name: str) -> Group:
    group = groups.get(name)
    if group is None:
        raise HttpError(404, f"unknown group {name!r}")
    return group


def gateway_named(gateways: dict[str, Gateway], name: str) -> Gateway:
    gateway = gateways.get(name)
    if gateway is None:
        raise HttpError(404, f"unknown server {name!r}")
    return gateway


async def open_session(gateway: Served, session: Session) -> None:
    """Open `session`, or 503 when the server is full or stopping, or no process came in time."""
    try:
        await gateway.open_session(session)
    except SessionLimitError as exc:
        raise unavailable(exc) from None
    except NoMember as exc:
        raise HttpError(403, str(exc)) from None


def unavailable(exc: SessionLimitError) -> HttpError:
    """The 503 for a session the server cannot open now (full, stopping, no process in time)."""
    if exc.retry_after is None:
        return HttpError(503, str(exc), headers={"Retry-After": RETRY_AFTER_S})
    return HttpError(503, str(exc), jsonrpc.SERVER_UNAVAILABLE, {"Retry-After": str(exc.retry_after)})


def route(gateway: Served, session: Session, payload: Any, kind: Kind | None = None) -> None:
    """Hand a POST's decoded body to the gateway; what it refuses is the POST's answer:
    400 for what is not valid JSON-RPC, 429 for calls over their principal's limits
    (nothing of the body is taken then)."""
    try:
        gateway.from_client(session, payload, kind)
    except ProtocolError as exc:
        raise HttpError(400, exc.message, exc.code, request_id=exc.request_id) from None
    except Throttled as exc:
        raise HttpError(429, exc.reason, jsonrpc.TOO_MANY_REQUESTS, {"Retry-After": str(exc.retry_after)}) from None
