"""The admin API under /admin: JSON for operators and `mcp-bridge ctl`.

Who may use it is decided with every other access rule (`http/access.py`,
`Guard.admin_allowed`): a token with `roles: [admin]`, or anyone on a
loopback bind when no authentication is configured. Every action that
changes something is an `audit` event naming the admin.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from bridge import logs
from bridge.gateway.gateway import Gateway
from bridge.gateway.group import Group
from bridge.gateway.pinsfile import ReadOnly
from bridge.gateway.sessions import Session
from bridge.http.errors import HttpError
from bridge.http.state import GATEWAYS, GROUPS, LIVE, principal

# The daemon's reload (what SIGHUP does): the problems that kept the config from loading.
Reload = Callable[[], Awaitable[list[str]]]
RELOAD: web.AppKey[Reload] = web.AppKey("admin_reload")
StatusOf = Callable[[Gateway], dict[str, object]]
GroupStatusOf = Callable[[Group], dict[str, object]]
ENDED_MESSAGE = "session ended by an administrator"
LOOPBACK_ADMIN = "(loopback, no tokens)"
_RESTARTS: set[asyncio.Task[int]] = set()  # restarts under way, held until done  # who the audit names when no authentication is configured


def add_routes(app: web.Application, status_of: StatusOf, group_status_of: GroupStatusOf) -> None:
    """The admin routes; `status_of` is what /status says of one server, `group_status_of` of one group."""

    async def servers(request: web.Request) -> web.Response:
        gateways = request.app[GATEWAYS]
        return web.json_response(
            {"servers": [{"name": name, "command": g.server.command, "args": list(g.server.args), **status_of(g)} for name, g in gateways.items()]}
        )

    async def groups(request: web.Request) -> web.Response:
        return web.json_response({"groups": [{"name": name, **group_status_of(g)} for name, g in request.app[GROUPS].items()]})

    app.router.add_get("/admin/servers", servers)
    app.router.add_get("/admin/groups", groups)
    app.router.add_get("/admin/sessions", sessions)
    app.router.add_delete("/admin/sessions/{id}", end_session)
    app.router.add_post("/admin/servers/{name}/restart", restart)
    app.router.add_post("/admin/reload", reload)
    app.router.add_get("/admin/pins", pins)
    app.router.add_post("/admin/pins/{name}/{verdict:approve|reject}", settle_pins)


async def sessions(request: web.Request) -> web.Response:
    """Every session, or those of `?server=` and `?principal=`."""
    server = request.query.get("server")
    owner = request.query.get("principal")
    now = time.monotonic()
    found = [
        describe(g, s, now)
        for name, g in request.app[GATEWAYS].items()
        if server is None or name == server
        for s in list(g.sessions.values())
        if owner is None or s.owner == owner
    ]
    return web.json_response({"sessions": found})


def describe(gateway: Gateway, session: Session, now: float) -> dict[str, Any]:
    return {
        "id": session.id,
        "server": gateway.name,
        "principal": session.owner,
        "transport": session.transport,
        "protocol_version": gateway.negotiated_version(session),
        "age_s": round(now - session.created, 3),
        "in_flight": gateway.session_inflight(session),
        "idle_s": round(now - session.last_seen, 3),  # since its client's last request
        "attached": session.attached(),
    }


async def end_session(request: web.Request) -> web.Response:
    gateway, session = _session(request.app[GATEWAYS], request.match_info["id"])
    failed = gateway.end_session(session, ENDED_MESSAGE)
    _audit(request, "end_session", server=gateway.name, session=session.id, principal_of_session=session.owner, calls_failed=failed)
    return web.json_response({"ended": session.id, "server": gateway.name, "calls_failed": failed})


def _session(gateways: dict[str, Gateway], asked: str) -> tuple[Gateway, Session]:
    """The session with this id, else the one session whose id starts with it (what a person
    copies off a table); a prefix of several is refused, naming how many."""
    for gateway in gateways.values():
        if (session := gateway.sessions.get(asked)) is not None:
            return gateway, session
    found = [(g, s) for g in gateways.values() for sid, s in list(g.sessions.items()) if sid.startswith(asked)]
    if not found:
        raise HttpError(404, f"no session {asked!r}")
    if len(found) > 1:
        raise HttpError(409, f"{len(found)} sessions have ids that start with {asked!r}: give more of the id")
    return found[0]


async def restart(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    gateway = request.app[GATEWAYS].get(name)
    if gateway is None:
        raise HttpError(404, f"no server named {name!r}")
    if gateway.restarting:
        raise HttpError(409, f"server {name!r} is already restarting")
    _audit(request, "restart_server", server=name)
    drain = request.app[LIVE].config.limits.drain_timeout
    # Shielded: an admin who hangs up mid-way must not leave the server stopped.
    task = asyncio.get_running_loop().create_task(gateway.restart(f"restarted by {_admin(request)}", drain))
    _RESTARTS.add(task)
    task.add_done_callback(_RESTARTS.discard)
    count = await asyncio.shield(task)
    return web.json_response({"restarted": name, "processes": count})


async def reload(request: web.Request) -> web.Response:
    reload_config = request.app.get(RELOAD)
    if reload_config is None:
        raise HttpError(503, "this daemon has no config to reload")
    problems = await reload_config()
    _audit(request, "reload", outcome="rejected" if problems else "done")
    if problems:
        return web.json_response({"reloaded": False, "problems": problems}, status=422)
    gateways = request.app[GATEWAYS]
    return web.json_response({"reloaded": True, "servers": list(gateways)})


async def pins(request: web.Request) -> web.Response:
    """Each pinned server's mode, pinned counts and pending items, with a diff of each change."""
    pins_file = request.app[LIVE].pins
    if pins_file is None:
        raise HttpError(404, "no server is pinned (servers.NAME.pin, pins.path)")
    gateways = request.app[GATEWAYS]
    servers = {name: pins_file.describe(name) for name, g in sorted(gateways.items()) if g.pins is not None}
    return web.json_response({"path": pins_file.path, "servers": servers})


async def settle_pins(request: web.Request) -> web.Response:
    """Approve or reject what is pending of one server: all of it, or `{"names": [...]}`."""
    name, verdict = request.match_info["name"], request.match_info["verdict"]
    gateway = request.app[GATEWAYS].get(name)
    pins_file = request.app[LIVE].pins
    if gateway is None or gateway.pins is None or pins_file is None:
        raise HttpError(404, f"no pinned server named {name!r}")
    names: list[str] | None = None
    if request.can_read_body:
        try:
            body = await request.json()
        except ValueError:
            raise HttpError(400, 'expected a JSON body: {"names": ["..."]}, or none for all') from None
        if not isinstance(body, dict) or set(body) - {"names"} or not isinstance(body.get("names", []), list) or not all(isinstance(n, str) for n in body.get("names", [])):
            raise HttpError(400, 'expected {"names": ["..."]}, or no body for all')
        names = body.get("names")
    before = dict(gateway.pins.withheld)
    try:
        settled = pins_file.settle(name, verdict == "approve", names, gateway.metrics)
    except ReadOnly as exc:
        raise HttpError(409, str(exc)) from None
    items = [{"kind": kind.value, "name": item} for kind, item in settled]
    _audit(request, f"pins_{verdict}", server=name, items=items)
    gateway.withheld_changed(before)
    return web.json_response({"approved" if verdict == "approve" else "rejected": items, "server": name})


def _admin(request: web.Request) -> str:
    name = principal(request)
    return name if name is not None else LOOPBACK_ADMIN


def _audit(request: web.Request, action: str, **detail: Any) -> None:
    logs.get().bind(logger="mcp_bridge.audit").info(
        "audit", principal=_admin(request), method=f"admin/{action}", remote=request.remote, **detail
    )
