"""The aiohttp application: routes, startup, reload, drain and shutdown, health and status."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import msgspec
from aiohttp import web
from prometheus_client.exposition import choose_encoder

from bridge import logs
from bridge.access import policy
from bridge.access.guard import WELL_KNOWN, Guard
from bridge.access.oauth import OAuthVerifier
from bridge.config.schema import NEEDS_RESTART, Config, group_members
from bridge.core.cluster import Cluster
from bridge.core.pins import PinsError
from bridge.gateway import health
from bridge.gateway.gateway import DRAIN_QUIET_S, Gateway
from bridge.gateway.group import Group
from bridge.gateway.pinsfile import PinsFile
from bridge.http import access, errors, forward, state, traced
from bridge.http.endpoints import sse_2024, streamable_2025
from bridge.http.endpoints.post import POSTS, Posts, post_mcp
from bridge.http.state import GATEWAYS, GROUPS, LIVE, METRICS, Live
from bridge.metrics import Forwarding, Metrics, ServerMetrics
from bridge.ops import admin, statuspage
from bridge.process.pool import Slots
from bridge.traces import settings as trace_settings

DRAIN_POLL_S = 0.05
TRACES_FLUSH_S = 2.0  # at shutdown, what is queued for the collector gets this long


def create_app(config: Config) -> web.Application:
    gateways: dict[str, Gateway] = {}
    metrics = Metrics(gateways.values)
    oauth = OAuthVerifier(config.security.oauth) if config.security.oauth is not None else None
    live = Live(config, Guard(config, oauth), oauth=oauth, processes=Slots(config.limits.max_processes))
    live.pins = PinsFile.open(config.pins.path) if config.pins is not None else None  # checked by the config's load
    metrics.oauth = lambda: live.oauth
    # Bodies are read, limited (limits.max_message_bytes, reloadable) and decompressed by the
    # transports (body.read_message), never by aiohttp.
    app = web.Application(
        middlewares=[access.middleware(lambda: live.guard, metrics.rejected, state.refused)], handler_args={"auto_decompress": False}
    )
    app.on_response_prepare.append(access.cors_hook(lambda: live.guard))
    app[LIVE] = live
    app[METRICS] = metrics
    app[GATEWAYS] = gateways
    traces = trace_settings.start(config)
    if traces is not None:
        app[state.TRACES] = traces
        metrics.traces = traces
        app.on_cleanup.append(_stop_traces)
        # After the access check (a refused request has no span), before forwarding (whose span is its child).
        app.middlewares.append(traced.middleware(traces, "https" if config.listen.tls is not None else "http"))
    forwarder = _add_cluster(app, config) if config.cluster is not None else None
    app[POSTS] = Posts(forwarder)
    if forwarder is not None:
        forwarder.traces = traces
    limiter = policy.RateLimiter.of(config, live.in_flight, metrics.rate_limited)
    for name, server in config.servers.items():
        gateways[name] = Gateway(
            name, server, config.limits, metrics.server(name), config.sse.keepalive, live.in_flight, live.processes
        )
        _apply_policy(gateways[name], config, limiter)
        gateways[name].set_pins(live.pins)
        gateways[name].traces = traces
        _mint_cluster_ids(app, gateways[name])
    groups: dict[str, Group] = {}
    app[GROUPS] = groups
    metrics.groups = groups.values
    for name in config.groups:
        groups[name] = _group(app, config, name)
    for sse, messages, mcp in ((state.SSE_ROUTE, state.MESSAGES_ROUTE, state.MCP_ROUTE), (state.GROUP_SSE_ROUTE, state.GROUP_MESSAGES_ROUTE, state.GROUP_MCP_ROUTE)):
        app.router.add_get(sse, sse_2024.stream, allow_head=False)  # a HEAD must not open a session
        app.router.add_post(messages, sse_2024.post_message, expect_handler=access.expect_continue)
        app.router.add_post(mcp, post_mcp, expect_handler=access.expect_continue)
        app.router.add_get(mcp, streamable_2025.get, allow_head=False)
        app.router.add_delete(mcp, streamable_2025.delete)
    app.router.add_get(WELL_KNOWN, protected_resource)
    app.router.add_get(WELL_KNOWN + "/servers/{name}/{transport:mcp|sse}", protected_resource)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status)
    admin.add_routes(app, server_status, group_status)
    statuspage.add_routes(app)
    if config.metrics.enabled:
        app.router.add_get(config.metrics.path, scrape)
    app.on_startup.append(_start_gateways)
    # Shutdown, not cleanup: open streams only end once their sessions close.
    app.on_shutdown.append(_stop_gateways)
    app.on_cleanup.append(_close_oauth)
    return app


def _group(app: web.Application, config: Config, name: str) -> Group:
    """A group of the app's servers; its principals' servers by the live guard's say."""
    live, gateways = app[LIVE], app[GATEWAYS]
    group = Group(
        name, config.groups[name], group_members(config, name), gateways, config.limits, ServerMetrics(name),
        config.sse.keepalive, lambda principal: live.guard.servers_of(principal),
    )  # fmt: skip
    _mint_cluster_ids(app, group)
    group.traces = app.get(state.TRACES)
    return group


def _add_cluster(app: web.Application, config: Config) -> forward.Forwarder:
    """Session ids that name this replica, and forwarding to the replica a request's session names."""
    settings = config.cluster
    assert settings is not None and settings.advertise is not None and settings.peer_key is not None  # config.cluster_problems
    cluster = Cluster(settings.advertise, settings.peer_key, settings.previous_peer_key)
    metrics = app[METRICS]
    metrics.forwarding = Forwarding()
    # A live owner says something within a request's timeout, and on a stream within a keepalive.
    silence = config.limits.request_timeout + config.sse.keepalive
    forwarder = forward.Forwarder(cluster, settings, config.listen.tls is not None, silence, metrics.forwarding)
    app[forward.CLUSTER] = cluster
    app[forward.FORWARDER] = forwarder
    app.middlewares.append(forward.middleware(forwarder))  # after the access check: the principal is known
    app.on_startup.append(lambda _: forwarder.start())
    app.on_cleanup.append(lambda _: forwarder.close())
    return forwarder


def _mint_cluster_ids(app: web.Application, gateway: Gateway | Group) -> None:
    if (cluster := app.get(forward.CLUSTER)) is not None:
        gateway.new_id = cluster.new_id


def listening(app: web.Application, port: int) -> None:
    """The port the daemon is bound to (with `--port 0`, known only now): the default
    OAuth resource URL is where it listens."""
    live = app[LIVE]
    live.port = port
    if live.oauth is not None:
        live.guard = Guard(live.config, live.oauth, port)


async def _stop_traces(app: web.Application) -> None:
    """Export what is queued, for TRACES_FLUSH_S at most: a collector that is down never holds
    up the daemon's exit (the exporting thread is a daemon thread, left to the exit)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def flush() -> None:
        try:
            app[state.TRACES].shutdown()
        finally:
            loop.call_soon_threadsafe(_settle, done)

    threading.Thread(target=flush, name="traces-shutdown", daemon=True).start()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done, TRACES_FLUSH_S)


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


async def _close_oauth(app: web.Application) -> None:
    if (oauth := app[LIVE].oauth) is not None:
        await oauth.close()


async def _start_gateways(app: web.Application) -> None:
    for gateway in app[GATEWAYS].values():
        await gateway.start()
    for group in app[GROUPS].values():
        await group.start()
    if (oauth := app[LIVE].oauth) is not None:
        await oauth.start()  # failing is not fatal: /readyz says so until keys come


async def _stop_gateways(app: web.Application) -> None:
    await asyncio.gather(*(g.stop() for g in app[GROUPS].values()))  # first: their members' sessions end with them
    await asyncio.gather(*(g.stop() for g in app[GATEWAYS].values()))


async def drain(app: web.Application, timeout: float) -> None:
    """SIGTERM: go unready, open no session a client would hold on to, and wait up to
    `timeout` seconds for what is under way: the calls in flight (and the requests forwarded
    to other replicas for them), then a pause of DRAIN_QUIET_S with no request, for an
    answer's follow-up. Idle sessions close at once, the others as they go quiet; streams
    relayed from other replicas end now (their clients resume them elsewhere)."""
    live = app[LIVE]
    live.draining = True  # /readyz: 503, so that the balancer sends nothing new
    servers = list(app[GATEWAYS].values())  # what is in flight is at these: a group's calls are its members'
    gateways: list[Gateway | Group] = [*app[GROUPS].values(), *servers]  # a group first: it closes its members' sessions
    for gateway in gateways:
        gateway.begin_drain()
    forwarder = app.get(forward.FORWARDER)
    if forwarder is not None:
        forwarder.begin_drain()
    log = logs.get()
    log.info("draining", in_flight=sum(g.inflight() for g in servers), timeout_s=timeout)
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        busy = [g.drain_step(now, DRAIN_QUIET_S) for g in gateways]  # every gateway's step, each time
        if not any(busy) and (forwarder is None or not forwarder.calls()):
            return
        if now >= deadline:
            log.warning("drain_timeout", in_flight=sum(g.inflight() for g in servers))
            return
        await asyncio.sleep(DRAIN_POLL_S)


def _at(config: Config, path: str) -> object:
    value: object = config
    for name in path.split("."):
        value = getattr(value, name)
    return value


async def apply_config(app: web.Application, new: Config) -> None:
    """Move the running app to `new`: start added servers, stop removed ones,
    restart changed ones; unchanged servers and their sessions are untouched."""
    log = logs.get()
    live = app[LIVE]
    old = live.config
    for key in NEEDS_RESTART:
        if _at(new, key) != _at(old, key):
            log.warning("reload_needs_restart", key=key)
    gateways = app[GATEWAYS]
    metrics = app[METRICS]
    removed = [name for name in old.servers if name not in new.servers]
    changed = [name for name in new.servers if name in old.servers and new.servers[name] != old.servers[name]]
    added = [name for name in new.servers if name not in old.servers]
    withheld = {name: dict(g.pins.withheld) for name, g in gateways.items() if g.pins is not None and name not in changed}
    live.pins = _reload_pins(live.pins, new, old)
    stopping = [gateways.pop(name) for name in removed + changed]
    for gateway in stopping:
        metrics.retired[gateway.name] = gateway.metrics
    await asyncio.gather(*(gateway.stop("server_gone") for gateway in stopping))
    live.processes.limit = new.limits.max_processes
    for name in changed + added:
        gateways[name] = Gateway(
            name, new.servers[name], new.limits, metrics.server(name), new.sse.keepalive, live.in_flight, live.processes
        )
        _mint_cluster_ids(app, gateways[name])
        gateways[name].set_pins(live.pins)
        gateways[name].traces = app.get(state.TRACES)
        await gateways[name].start()
    live.processes.changed()  # a higher cap may let waiting sessions in
    limiter = policy.RateLimiter.of(new, live.in_flight, metrics.rate_limited)
    for name, gateway in gateways.items():
        _apply_policy(gateway, new, limiter)
        if name not in changed and name not in added:
            gateway.update_limits(new.limits)
            gateway.keepalive = new.sse.keepalive
            gateway.set_pins(live.pins)
            if (before := withheld.get(name)) is not None:
                gateway.withheld_changed(before)  # an approval made in the file
    oauth = live.oauth
    if new.security.oauth != old.security.oauth:
        oauth = OAuthVerifier(new.security.oauth) if new.security.oauth is not None else None
        if oauth is not None:
            await oauth.start()
        if live.oauth is not None:
            await live.oauth.close()
    live.config, live.guard, live.oauth = new, Guard(new, oauth, live.port), oauth
    await _reload_groups(app, old, new)
    log.info("config_reloaded", added=added, removed=removed, restarted=changed, unchanged=len(gateways) - len(added) - len(changed))


async def _reload_groups(app: web.Application, old: Config, new: Config) -> None:
    """Groups removed end their sessions; groups added start; the others take their new
    members and limits, their open sessions the members that joined and left (`Group.update`)."""
    groups = app[GROUPS]
    for name in [n for n in groups if n not in new.groups]:
        await groups.pop(name).stop("server_gone")
    for name in new.groups:
        if name in groups:
            groups[name].update(new.groups[name], group_members(new, name), new.limits, new.sse.keepalive)
        else:
            groups[name] = _group(app, new, name)
            await groups[name].start()


def _reload_pins(current: PinsFile | None, new: Config, old: Config) -> PinsFile | None:
    """The pins file after a reload: the same one read again (what it holds now replaces what
    was held; what is pending stays pending), another one, or none."""
    if new.pins is None:
        return None
    try:
        if current is not None and old.pins == new.pins:
            current.reload()
            return current
        return PinsFile.open(new.pins.path)
    except PinsError as exc:  # changed since the config's load read it
        logs.get().error("pins_not_reloaded", error=str(exc))
        return current


def _apply_policy(gateway: Gateway, config: Config, limiter: policy.RateLimiter) -> None:
    """What each principal may see of the gateway's server, and the daemon's one rate limiter."""
    gateway.set_views(*policy.views(config, gateway.name))
    gateway.limiter = limiter


async def scrape(request: web.Request) -> web.Response:
    # The Prometheus text format, or OpenMetrics when the scraper asks for it (it alone
    # carries the request-duration exemplars of traced calls).
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return web.Response(body=encode(request.app[METRICS].registry), headers={"Content-Type": content_type})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    problems = {name: reason for name, g in request.app[GATEWAYS].items() if (reason := g.readiness()) is not None}
    if request.app[LIVE].draining:
        problems["drain"] = "draining: finishing the calls in flight, taking no new sessions"
    body: dict[str, object] = {"status": "ready"}
    oauth = request.app[LIVE].oauth
    if oauth is not None:
        # Keys cached: ready (an issuer that is down now only matters for new keys).
        issuers = {issuer: keys.state() for issuer, keys in oauth.issuers.items()}
        body["authorization_servers"] = issuers
        if any(keys.fetched_at is None for keys in oauth.issuers.values()):
            problems["oauth"] = "no keys yet from " + ", ".join(i for i, k in oauth.issuers.items() if k.fetched_at is None)
    if problems:
        return web.json_response({**body, "status": "not ready", "servers": problems}, status=503)
    return web.json_response(body)


async def protected_resource(request: web.Request) -> web.Response:
    """OAuth 2.0 protected resource metadata (RFC 9728) of the bridge, or of one server
    (`/servers/NAME/mcp` or `/sse`): where to sign in, and the scopes that grant it."""
    live = request.app[LIVE]
    guard, oauth = live.guard, live.oauth
    name = request.match_info.get("name")
    if oauth is None or (name is not None and name not in request.app[GATEWAYS]):
        raise errors.HttpError(404, "no protected resource here")
    base = guard.resource_for(request.remote, access.forwarded(request))
    resource = base + (f"/servers/{name}/{request.match_info['transport']}" if name is not None else "")
    scopes = oauth.scopes_for(name) if name is not None else sorted(oauth.config.scopes)
    return web.json_response(
        {
            "resource": resource,
            "authorization_servers": list(oauth.issuers),
            "scopes_supported": scopes,
            "bearer_methods_supported": ["header"],
            "resource_name": f"mcp-bridge {name}" if name is not None else "mcp-bridge",
        }
    )


async def status(request: web.Request) -> web.Response:
    """All of it for an admin, and where no authentication is configured; a token without the
    admin role sees only the servers it may use, and of each only its own part (`principal_status`)."""
    gateways = request.app[GATEWAYS]
    caller = request.get(access.CALLER)
    groups = request.app[GROUPS]
    if caller is not None and not caller.admin:
        mine: dict[str, object] = {"servers": {name: principal_status(g, caller.name) for name, g in gateways.items() if caller.may_use(name)}}
        if own_groups := {name: group_status(g, caller.name) for name, g in groups.items() if g.allowed(caller.name)}:
            mine["groups"] = own_groups
        return web.json_response(mine)
    slots = request.app[LIVE].processes
    body: dict[str, object] = {
        "servers": {name: server_status(g) for name, g in gateways.items()},

        "processes": {"running": slots.used, "max": slots.limit, "waiting": len(slots.waiters)},
    }
    if groups:
        body["groups"] = {name: group_status(g) for name, g in groups.items()}
    if (forwarder := request.app.get(forward.FORWARDER)) is not None:
        cluster = forwarder.cluster
        body["cluster"] = {"advertise": cluster.advertise, "epoch": cluster.epoch, "forwarding": forwarder.in_flight, "draining": request.app[LIVE].draining}
    return web.json_response(body)


def server_status(gateway: Gateway) -> dict[str, object]:
    """What an admin sees of a server (`health.of_server`), as JSON."""
    status: dict[str, object] = msgspec.to_builtins(health.of_server(gateway))
    return status


def group_status(group: Group, principal: str | None = None) -> dict[str, object]:
    """A group as an admin sees it, or, for `principal`, the members it may use and its own sessions."""
    if principal is not None:
        return {"members": list(group.allowed(principal)), "sessions": sum(1 for s in group.sessions.values() if s.owner == principal)}
    not_ready = group.readiness()
    return {
        "members": list(group.members),
        "separator": group.config.separator,
        "sessions": group.session_counts(),
        "ready": not_ready is None,
        "not_ready": not_ready,
        "names_left_out": dict(group.names_left_out),
    }


def principal_status(gateway: Gateway, principal: str) -> dict[str, object]:
    """What a principal without the admin role sees of a server it may use (`health.of_principal`)."""
    status: dict[str, object] = msgspec.to_builtins(health.of_principal(gateway, principal))
    return status


