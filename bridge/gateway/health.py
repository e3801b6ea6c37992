"""What a server and its processes look like now, as frozen structs: the one source of
`/status`, the admin API's `/admin/servers` and the status page (which reads `/status`).

`ServerHealth` is an administrator's view (every process, its routing tables and stderr);
`PrincipalHealth` is what a principal without the admin role may see of a server it may
use: its own sessions and calls in flight, the processes that serve it with its own calls
on each, and nothing of other principals (no stderr: a shared process's mixes everyone's
traffic, and servers print secrets there). Fields left UNSET are not part of a view.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from bridge.process import confine, procstat

if TYPE_CHECKING:
    from bridge.gateway.gateway import Gateway
    from bridge.gateway.upstream import Upstream


class ProcessHealth(msgspec.Struct, frozen=True):
    pid: int | None
    warm: bool  # started ahead, not taken yet
    state: str  # the supervisor's: starting, running, backoff, failed, stopped
    protocol: str  # the mux's: the handshake's state
    era: str  # which MCP the process speaks: detecting, legacy or modern
    uptime_s: float | None
    restarts: int
    last_exit_code: int | None
    last_exit_limit: str | None  # the limit that most likely ended it
    failure: str | None
    in_flight: int  # calls on it (a principal's view: that principal's)
    rss_bytes: int | None
    cpu_seconds: float | None
    tables: dict[str, int] | msgspec.UnsetType = msgspec.UNSET  # the mux's table sizes (administrators)
    stderr_tail: list[str] | msgspec.UnsetType = msgspec.UNSET  # (administrators)


class ServerHealth(msgspec.Struct, frozen=True):
    mode: str
    rlimits: str | None  # what each process runs under (as the config names them)
    memory_limit: dict[str, str | None] | None  # how rlimits.memory is enforced here, and why
    user: str | None
    sandbox: Any
    ready: bool
    sessions: int
    in_flight: int
    pool: dict[str, Any]
    processes: list[ProcessHealth]
    # servers.NAME.pin: what waits for approval, each item's kind, name, status (pending,
    # rejected) and changed fields (the diff: GET /admin/pins). None: it pins nothing.
    pins: dict[str, Any] | None = None


class PrincipalHealth(msgspec.Struct, frozen=True):
    mode: str
    ready: bool
    sessions: int  # the principal's own
    in_flight: int  # the principal's own calls
    processes: list[ProcessHealth]


def of_server(gateway: Gateway) -> ServerHealth:
    now = time.time()
    pool = gateway.pool
    processes = []
    for upstream in gateway.upstreams():
        last = upstream.supervisor.child  # the running process, or the last one to run
        processes.append(
            _process(
                upstream, now, upstream.mux.inflight(), tables=upstream.mux.table_sizes(), stderr_tail=last.stderr_tail() if last is not None else []
            )
        )
    server = gateway.server
    memory = None
    if server.rlimits.memory is not None:
        mechanism, why = confine.memory_mechanism()
        memory = {"by": mechanism, "why": why}
    identity = gateway.launch.identity
    return ServerHealth(
        mode=server.mode,
        rlimits=server.rlimits.named() or None,
        memory_limit=memory,
        user=identity.describe() if identity is not None else None,
        sandbox=msgspec.to_builtins(server.sandbox),
        ready=gateway.readiness() is None,
        sessions=len(gateway.sessions),
        in_flight=gateway.inflight(),
        pool={**pool.sizes(), "waiting": pool.waiting(), "target": pool.settings.warm, "max": pool.settings.max},
        processes=processes,
        pins=_pins(gateway),
    )


def _pins(gateway: Gateway) -> dict[str, Any] | None:
    if gateway.pins is None or gateway.pins_file is None:
        return None
    shown = gateway.pins_file.describe(gateway.name)
    return {"mode": shown["mode"], "pending": [{k: p[k] for k in ("kind", "name", "status", "changed")} for p in shown["pending"]]}


def of_principal(gateway: Gateway, principal: str) -> PrincipalHealth:
    now = time.time()
    serving = gateway.serving(principal)
    return PrincipalHealth(
        mode=gateway.server.mode,
        ready=gateway.readiness() is None,
        sessions=sum(1 for s in gateway.sessions.values() if s.owner == principal),
        in_flight=sum(serving.values()),
        processes=[_process(upstream, now, in_flight) for upstream, in_flight in serving.items()],
    )


def _process(upstream: Upstream, now: float, in_flight: int, **admin_only: Any) -> ProcessHealth:
    sup = upstream.supervisor
    child = upstream.child
    usage = procstat.usage(child.pid) if child is not None and child.pid is not None else None
    return ProcessHealth(
        pid=child.pid if child is not None else None,
        warm=upstream.warm and upstream in upstream.gateway.pool.warm,
        state=sup.status.value,
        protocol=upstream.mux.state.value,
        era=upstream.era.value,
        uptime_s=round(now - sup.started_at, 3) if child is not None and sup.started_at else None,
        restarts=sup.restarts,
        last_exit_code=sup.last_exit,
        last_exit_limit=upstream.last_limit,
        failure=sup.failure,
        in_flight=in_flight,
        rss_bytes=usage.rss_bytes if usage is not None else None,
        cpu_seconds=usage.cpu_seconds if usage is not None else None,
        **admin_only,
    )
