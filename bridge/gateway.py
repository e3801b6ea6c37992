"""One gateway per configured server: its process(es), mux(es) and sessions.

This is the only place that carries out what a mux decides. Shells hand it
client messages; upstream processes hand it lines; it turns both into mux
calls and applies the returned actions: bytes to a process, bytes to
sessions, log lines for what was dropped, restarts.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from . import __version__, jsonrpc, logs
from .child import Child, Write
from .config import Limits, RateLimit, Server
from .jsonrpc import Message, ProtocolError
from .metrics import ServerMetrics
from .mux import Abandoned, Action, Broadcast, Call, Discard, Mux, RestartServer, State, Timer, ToServer, ToSession
from .policy import RateLimiter, Throttled, View
from .sessions import Session
from .supervisor import Status, Supervisor

encode = jsonrpc.encode


KEEPALIVE_PASSES = 5  # checks per keepalive interval: comments come every 4/5 to 5/5 of it
KEEPALIVE_SLICE = 64  # keepalives written between yields to the event loop
# Session ends the bridge chose, counted as drops (a client closing its stream is not one).
DROP_REASONS = frozenset({"slow", "idle", "server_gone", "shutdown", "ended"})  # ended: by an administrator
RESTART_POLL_S = 0.05  # how often a graceful restart looks whether the calls in flight have ended
NOT_READING = "server is not reading its input (limits.server_input_buffer)"


class SessionLimitError(Exception):
    """The server already has as many sessions as it may."""


class Upstream:
    """One server process and the mux in front of it; receives the supervisor's events."""

    def __init__(self, gateway: Gateway, label: str) -> None:
        self.gateway = gateway
        cfg = gateway.server
        limits = gateway.limits
        self.mux = Mux(
            shared=cfg.mode != "per-session",
            roots=cfg.roots,
            max_inflight=limits.max_inflight,
            max_backlog=limits.server_backlog,
            max_subscriptions=limits.max_subscriptions,
            attribution_window=cfg.attribution_window,
            client_info=("mcp-bridge", __version__),
            in_flight=gateway.in_flight,
        )
        self._timer: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None  # armed while the server's input is backed up
        self.refused = 0  # messages not written since its input backed up
        self.child: Child | None = None
        self.supervisor = Supervisor(
            server=label,
            make_child=self._make_child,
            restart=cfg.restart,
            shutdown_timeout=cfg.shutdown_timeout,
            events=self,
        )
        self._log = gateway.log

    def _make_child(self) -> Child:
        cfg = self.gateway.server
        return Child(
            server=self.gateway.name,
            command=cfg.command,
            args=cfg.args,
            env=self.gateway.child_env,
            cwd=cfg.cwd,
            max_line=self.gateway.limits.max_message_bytes,
            input_limit=self.gateway.limits.input_buffer(),
            rlimits=cfg.rlimits,
            on_line=self.on_line,
            on_oversize=self.on_oversize,
            on_batch=self.gateway.flush,
            on_input_blocked=self.on_input_blocked,
        )

    def send(self, data: bytes) -> bool:
        """Write to the process; False when its input is full and the message was not written."""
        child = self.child
        result = Write.GONE if child is None else child.send(data)
        if result is Write.SENT:
            return True
        if result is Write.GONE:
            # It is exiting: the exit fails what is in flight.
            self._log.warning("server_write_failed", size=len(data))
            return True
        self.refused += 1
        return False

    def on_input_blocked(self, blocked: bool) -> None:
        """More than half of limits.server_input_buffer waits in the server's stdin (or no longer)."""
        child = self.child
        limits = self.gateway.limits
        if blocked:
            self._log.warning("server_input_blocked", pid=self._pid(), buffered=child.stdin_buffered() if child else None)
            self._stall = asyncio.get_running_loop().call_later(limits.server_input_stall, self._stalled)
        else:
            self._log.info("server_input_resumed", pid=self._pid(), refused=self.refused)
            self._cancel_stall()

    def _stalled(self) -> None:
        self._stall = None
        limits = self.gateway.limits
        self._log.error("server_stalled", pid=self._pid(), refused=self.refused, after_s=limits.server_input_stall)
        self.supervisor.restart(f"server stopped reading its input for {limits.server_input_stall:g}s")

    def _cancel_stall(self) -> None:
        self.refused = 0
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    # Supervisor events.

    def on_started(self, child: Child) -> None:
        self.child = child
        self.gateway.apply(self, self.mux.server_started())

    def on_exited(self, code: int | None, delay: float) -> None:
        self.child = None
        self._cancel_stall()
        self.gateway.metrics.restarts += 1
        reason = "server process could not be started" if code is None else f"server process exited with code {code}"
        if code is not None and (limits := self.gateway.server.rlimits.named()):
            # The kernel does not say which limit ended a process, except CPU time (SIGXCPU).
            likely = "its CPU time limit stopped it" if code == -signal.SIGXCPU else "one of them may have stopped it"
            reason += f"; it runs under limits ({limits}): {likely}"
            self._log.warning("server_exited_under_limits", exit_code=code, rlimits=limits, likely=likely)
        self.gateway.apply(self, self.mux.server_exited(reason))

    def on_failed(self, reason: str) -> None:
        self.gateway.apply(self, self.mux.server_failed(reason))

    # Child output.

    def on_line(self, line: bytes) -> None:
        try:
            payload = jsonrpc.decode(line)
        except ProtocolError as exc:
            self._log.warning("server_line_skipped", reason=exc.message, size=len(line), pid=self._pid())
            return
        count = self.gateway.metrics.message
        for msg in payload if payload.__class__ is list else (payload,):
            count("from_server", msg.get("method", "response") if msg.__class__ is dict else None)
        try:
            actions = self.mux.from_server(payload)
        except Exception:
            # A bug must not stop this server's output from being read: log it, drop the line.
            self._log.exception("internal_error", where="from_server", size=len(line))
            return
        self.gateway.apply(self, actions, flush=False)  # the child calls flush after the read's last line

    def on_oversize(self, size: int, head: bytes, tail: bytes) -> None:
        self.gateway.apply(self, self.mux.response_too_large(jsonrpc.sniff_id(head, tail), size))

    def _pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    def set_timer(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.gateway.apply(self, self.mux.timer())

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._cancel_stall()
        await self.supervisor.stop()

    async def restart(self, reason: str) -> None:
        """Stop the process gently and start a new one; what is still in flight fails with `reason`."""
        self._log.info("server_restarting", pid=self._pid(), reason=reason)
        await self.supervisor.stop()
        self.child = None
        self._cancel_stall()
        self.gateway.apply(self, self.mux.server_exited(reason))
        # Meanwhile the gateway may have stopped (reload, shutdown) or, per session, its session
        # closed and this process retired: then it stays stopped.
        if self.gateway.accepting and any(u is self for u in self.gateway.upstreams()):
            self.supervisor.start()

    def ready(self) -> bool:
        return self.supervisor.status is Status.RUNNING and self.mux.state is State.READY


class Gateway:
    def __init__(
        self,
        name: str,
        server: Server,
        limits: Limits,
        metrics: ServerMetrics,
        keepalive: float,
        in_flight: Counter[str | None] | None = None,
    ) -> None:
        self.name = name
        self.metrics = metrics
        self.keepalive = keepalive
        self.server = server
        self.limits = limits
        self.in_flight: Counter[str | None] = Counter() if in_flight is None else in_flight  # by principal, daemon-wide
        self.max_sessions = server.max_sessions or limits.max_sessions
        self.sessions: dict[str, Session] = {}
        self.log = logs.get(server=name)
        self.child_env = child_env(server, os.environ)
        self._shared: Upstream | None = None
        self._upstreams: dict[str, Upstream] = {}  # session id -> its upstream
        self._by_principal: dict[str | None, Upstream] = {}  # per-principal mode
        self._retiring: dict[str | None, asyncio.TimerHandle] = {}  # per-principal: processes with no session
        self._stopping: set[asyncio.Task[None]] = set()
        self._unflushed: dict[Session, None] = {}  # sessions delivered to since the last flush, in order
        self._ticker: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self.accepting = True
        self.restarting = False  # an admin restart is under way (Gateway.restart)
        self.limiter = RateLimiter(RateLimit(), {}, self.in_flight, Counter())  # none, until the app sets its own
        self._throttled_log = logs.Throttle(1.0, 10)
        self._default_view: View | None = None
        self._views: dict[str, View | None] = {}  # principal -> what it may see (policy.views)
        self.audit = logs.get(server=name).bind(logger="mcp_bridge.audit")  # operators route it by this name

    def upstreams(self) -> Iterable[Upstream]:
        if self._shared is not None:
            return (self._shared,)
        if self.server.mode == "per-principal":
            return self._by_principal.values()
        return self._upstreams.values()

    async def start(self) -> None:
        if self.server.mode == "shared":
            self._shared = Upstream(self, self.name)
            self._shared.supervisor.start()
        loop = asyncio.get_running_loop()
        self._ticker = loop.create_task(self._tick(), name=f"tick:{self.name}")
        self._pinger = loop.create_task(self._keepalives(), name=f"keepalive:{self.name}")

    async def stop(self, reason: str = "shutdown") -> None:
        """Refuse new sessions, answer every call still in flight with an error, end
        every session (their streams flush what is queued), then stop the processes."""
        self.accepting = False
        message = "bridge shutting down" if reason == "shutdown" else "server removed or reconfigured"
        for upstream in list(self.upstreams()):
            self.apply(upstream, upstream.mux.shutdown(message))
        for session in list(self.sessions.values()):
            self.close_session(session, reason)
        for task in (self._ticker, self._pinger):
            if task is not None:
                task.cancel()
        for timer in self._retiring.values():
            timer.cancel()
        self._retiring.clear()
        await asyncio.gather(*(u.stop() for u in self.upstreams()), *self._stopping)

    def update_limits(self, limits: Limits) -> None:
        """Take new limits without touching sessions: they apply to what comes next."""
        self.limits = limits
        self.max_sessions = self.server.max_sessions or limits.max_sessions
        for upstream in self.upstreams():
            mux = upstream.mux
            mux.max_inflight, mux.max_backlog, mux.max_subscriptions = (
                limits.max_inflight, limits.server_backlog, limits.max_subscriptions,
            )  # fmt: skip
            if upstream.child is not None:
                upstream.child.set_limits(limits.max_message_bytes, limits.input_buffer())

    def set_views(self, default: View | None, by_principal: dict[str, View | None]) -> None:
        """What each principal may see of this server (at start, and on every reload: open
        sessions see the new views from their next message on)."""
        self._default_view, self._views = default, by_principal
        for sid, session in self.sessions.items():
            self._upstreams[sid].mux.set_view(sid, self.view(session.owner))

    def view(self, principal: str | None) -> View | None:
        return self._default_view if principal is None else self._views.get(principal, self._default_view)

    # ----------------------------------------------------------------- sessions

    def open_session(self, session: Session) -> None:
        if not self.accepting:
            raise SessionLimitError(f"server {self.name!r} is shutting down")
        if len(self.sessions) >= self.max_sessions:
            self.metrics.sessions_dropped["limit"] += 1
            raise SessionLimitError(f"server {self.name!r} has {len(self.sessions)} sessions (limit {self.max_sessions})")
        self.sessions[session.id] = session
        if self._shared is not None:
            upstream = self._shared
        elif self.server.mode == "per-principal":
            upstream = self._principal_upstream(session.owner)
        else:
            upstream = Upstream(self, f"{self.name}[{session.id[:8]}]")
            upstream.supervisor.start()
        self._upstreams[session.id] = upstream
        upstream.mux.open_session(session.id, session.owner, self.view(session.owner))
        self.metrics.sessions_opened[session.transport] += 1
        if session.logged:
            self.log.info("session_opened", session=session.id, transport=session.transport, owner=session.owner)

    def session(self, session_id: str | None, owner: str | None) -> Session | None:
        """The live session with this id, if `owner` opened it; anyone else gets None."""
        session = self.sessions.get(session_id) if session_id else None
        if session is None or session.owner != owner:
            return None
        return session

    def close_session(self, session: Session, reason: str) -> None:
        if self.sessions.pop(session.id, None) is None:
            return
        upstream = self._upstreams.pop(session.id)
        self.apply(upstream, upstream.mux.close_session(session.id))
        session.end(reason)
        if reason in DROP_REASONS:
            self.metrics.sessions_dropped[reason] += 1
        if self.server.mode == "per-session":
            self._stop_later(upstream)
        elif self.server.mode == "per-principal" and not upstream.mux.sessions() and session.owner not in self._retiring:
            self._retiring[session.owner] = asyncio.get_running_loop().call_later(
                self.server.principal_idle_timeout, self._retire, session.owner
            )
        if not session.logged:
            return
        self.log.info(
            "session_closed",
            session=session.id,
            transport=session.transport,
            reason=reason,
            duration_s=round(time.monotonic() - session.created, 3),
        )

    def end_session(self, session: Session, message: str) -> int:
        """End a session from outside (the admin API): each of its calls in flight gets an
        error with `message` first, then it closes (the calls are cancelled upstream, its
        streams end). How many calls were in flight."""
        upstream = self._upstreams.get(session.id)
        if upstream is None:
            return 0
        pending = list(upstream.mux.peer(session.id).calls)
        for request_id in pending:
            session.deliver(encode(jsonrpc.error(request_id, jsonrpc.SESSION_CLOSED, message)), request_id, True)
        session.flush()
        self.close_session(session, "ended")
        return len(pending)

    def session_inflight(self, session: Session) -> int:
        upstream = self._upstreams.get(session.id)
        return upstream.mux.inflight(session.id) if upstream is not None else 0

    async def restart(self, reason: str, drain_timeout: float) -> int:
        """Restart this server's processes gracefully: wait up to `drain_timeout` for the calls
        in flight to end, then stop each process (SIGTERM, then shutdown_timeout) and start it
        again. Sessions stay open: their calls wait for the new process, as after a crash.
        How many processes were restarted."""
        self.restarting = True
        try:
            deadline = time.monotonic() + drain_timeout
            while self.inflight() and time.monotonic() < deadline:
                await asyncio.sleep(RESTART_POLL_S)
            upstreams = list(self.upstreams())
            await asyncio.gather(*(u.restart(reason) for u in upstreams))
        finally:
            self.restarting = False
        return len(upstreams)

    def _principal_upstream(self, principal: str | None) -> Upstream:
        """Per-principal mode: the process this principal's sessions share, started on first use."""
        retiring = self._retiring.pop(principal, None)
        if retiring is not None:
            retiring.cancel()
        upstream = self._by_principal.get(principal)
        if upstream is None:
            upstream = self._by_principal[principal] = Upstream(self, f"{self.name}[{principal or '-'}]")
            upstream.supervisor.start()
        return upstream

    def _retire(self, principal: str | None) -> None:
        """Per-principal mode: stop a process that has had no session for principal_idle_timeout."""
        self._retiring.pop(principal, None)
        upstream = self._by_principal.get(principal)
        if upstream is None or upstream.mux.sessions():
            return
        del self._by_principal[principal]
        self.log.info("server_retired", principal=principal, idle_s=self.server.principal_idle_timeout)
        self._stop_later(upstream)

    def _stop_later(self, upstream: Upstream) -> None:
        task = asyncio.get_running_loop().create_task(upstream.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def negotiated_version(self, session: Session) -> str | None:
        """The protocol version this session's initialize settled on; None before (or after a failed) one."""
        upstream = self._upstreams.get(session.id)
        if upstream is None:
            return None
        peer = upstream.mux.peer(session.id)
        return peer.protocol_version if peer.initialized else None

    def adopt(self, session: Session, capabilities: dict[str, Any], version: str, client_info: Any, level: str | None,
              notices: frozenset[str] = frozenset()) -> None:  # fmt: skip
        """Make an open session a stateless (2026-07-28) one: see `Mux.adopt`."""
        upstream = self._upstreams[session.id]
        self.apply(upstream, upstream.mux.adopt(session.id, capabilities, version, client_info, level, notices))

    def init_result(self, session: Session) -> dict[str, Any] | None:
        """The initialize result of the process serving this session, once it has one."""
        upstream = self._upstreams.get(session.id)
        return upstream.mux.init_result if upstream is not None else None

    def from_client(self, session: Session, payload: Any) -> None:
        """Route one decoded client message (or batch); raises ProtocolError if invalid, and
        Throttled, with nothing of it taken, when it carries calls over its principal's limits."""
        session.last_seen = time.monotonic()
        upstream = self._upstreams[session.id]
        if self.limiter.active and (calls := _calls(payload)):
            try:
                self.limiter.admit(session.owner, calls)
            except Throttled as exc:
                if (held := self._throttled_log.allow()) is not None:
                    self.log.info("rate_limited", principal=session.owner, limit=exc.limit, calls=calls, suppressed=held)
                raise
        actions = upstream.mux.from_client(session.id, payload)
        count = self.metrics.message
        for msg in payload if payload.__class__ is list else (payload,):
            count("from_client", msg.get("method", "response"))
        self.metrics.eras[session.era] += len(payload) if payload.__class__ is list else 1
        self.apply(upstream, actions)

    # ------------------------------------------------------------------ actions

    def apply(self, upstream: Upstream, actions: list[Action], flush: bool = True) -> None:
        """Carry out `actions` in order. What the mux says about a message the server's
        input had no room for is appended to `actions` and carried out in turn."""
        slow: list[Session] = []
        metrics = self.metrics
        unflushed = self._unflushed
        for action in actions:
            match action:
                case ToServer(message):
                    if not upstream.send(encode(message) + b"\n"):
                        metrics.dropped_messages += 1
                        if "method" in message and "id" in message:
                            actions += upstream.mux.not_written(message["id"], NOT_READING)
                case ToSession(sid, message, related, final, call):
                    session = self.sessions.get(sid)
                    if session is None:
                        continue
                    data = encode(message)
                    metrics.bytes_out += len(data)
                    if "error" in message:
                        metrics.error_sent(message["error"])
                    unflushed[session] = None
                    if not session.deliver(data, related, final):
                        slow.append(session)
                    if call is not None:
                        metrics.request_done(call.method, time.monotonic() - call.started)
                        if call.target is not None:
                            self._audit(call, message)
                case Broadcast(sids, message):
                    data = encode(message)
                    for sid in sids:
                        session = self.sessions.get(sid)
                        if session is not None:
                            metrics.bytes_out += len(data)
                            unflushed[session] = None
                            if not session.deliver(data, None, False):
                                slow.append(session)
                case Discard(reason, detail, log):
                    metrics.dropped_messages += 1
                    if log:
                        self.log.warning("message_dropped", reason=reason, **detail)
                case Abandoned(call):
                    if call.target is not None:
                        self._audit(call, None)
                case RestartServer(reason):
                    upstream.supervisor.restart(reason)
                case Timer(delay):
                    upstream.set_timer(delay)
        for session in dict.fromkeys(slow):  # once each, however many messages it missed
            limits = self.limits
            self.log.warning(
                "session_too_slow", session=session.id, queue_limit=limits.session_queue, queue_bytes=limits.slow_bytes
            )
            self.close_session(session, "slow")
        if flush:
            self.flush()

    def _audit(self, call: Call, answer: Message | None) -> None:
        """One `audit` event per tools/call, prompts/get and resources/read that ended: who, what,
        how it ended (result, error, cancelled, timeout), how long it took. Never arguments or results."""
        code = None
        if answer is None:
            outcome = "cancelled"
        elif isinstance(error := answer.get("error"), dict):
            code = error.get("code")
            outcome = "timeout" if code == jsonrpc.REQUEST_TIMEOUT else "error"
        else:
            outcome = "result"
        self.audit.info(
            "audit",
            principal=call.principal,
            session=call.session,
            method=call.method,
            name=call.target,
            outcome=outcome,
            code=code,
            duration_ms=round((time.monotonic() - call.started) * 1000, 3),
        )

    def flush(self) -> None:
        """Write out what the sessions were given since the last flush: one write per session."""
        if self._unflushed:
            sessions = list(self._unflushed)
            self._unflushed.clear()
            for session in sessions:
                session.flush()

    # -------------------------------------------------------------------- time

    async def _tick(self) -> None:
        """Once a second: time out requests and initializes, reap idle sessions."""
        while True:
            await asyncio.sleep(1.0)
            limits = self.limits  # read each time: a reload may have replaced it
            for upstream in list(self.upstreams()):
                self.apply(upstream, upstream.mux.expire(limits.request_timeout, limits.initialize_timeout))
            idle_before = time.monotonic() - limits.session_idle_timeout
            for session in [s for s in self.sessions.values() if s.last_seen < idle_before and not s.attached()]:
                self.close_session(session, "idle")

    async def _keepalives(self) -> None:
        """A comment on every stream once per `keepalive` seconds.

        Checked a few times per interval, so each pass writes to the slice of the
        sessions that opened in one part of it; and a pass yields to the loop after
        every few writes, so that requests never wait behind thousands of them.
        """
        while True:
            await asyncio.sleep(self.keepalive / KEEPALIVE_PASSES)
            now = time.monotonic()
            due = now - self.keepalive * (1 - 1 / KEEPALIVE_PASSES)
            pinged = 0
            for session in [s for s in self.sessions.values() if s.last_pinged < due]:
                session.last_pinged = now
                session.keepalive()
                pinged += 1
                if pinged % KEEPALIVE_SLICE == 0:
                    await asyncio.sleep(0)

    # ------------------------------------------------------------------ health

    def session_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for session in self.sessions.values():
            counts[session.transport] = counts.get(session.transport, 0) + 1
        return counts

    def inflight(self) -> int:
        return sum(u.mux.inflight() for u in self.upstreams())

    def pids(self) -> list[int]:
        return [u.child.pid for u in self.upstreams() if u.child is not None and u.child.pid is not None]

    def processes_up(self) -> int:
        return sum(1 for u in self.upstreams() if u.child is not None)

    def crash_looping(self) -> bool:
        return any(u.supervisor.status is Status.FAILED for u in self.upstreams())

    def readiness(self) -> str | None:
        """None when ready, else the reason this server cannot serve now."""
        if self._shared is not None:
            if self._shared.ready():
                return None
            sup = self._shared.supervisor
            if sup.status is Status.FAILED:
                return sup.failure or "crash loop"
            return f"server is {sup.status.value}, protocol {self._shared.mux.state.value}"
        if shutil.which(self.server.command, path=self.child_env.get("PATH")) is None:
            return f"command {self.server.command!r} not found"
        upstreams = list(self.upstreams())
        failed = [u for u in upstreams if u.supervisor.status is Status.FAILED]
        if failed and len(failed) == len(upstreams):
            return failed[0].supervisor.failure or "crash loop"
        return None


# What every server gets of the daemon's environment (a name, or a prefix ending
# in `*`). Nothing else: the bridge's tokens and keys, and other servers'
# secrets, live in the rest. Listed in the README ("Server environment").
CHILD_ENV = (
    # to run at all: programs, user, shell, terminal, temporary files, time zone, locale
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", "LANG", "LANGUAGE", "LC_*",
    # where tools keep caches and settings (uv and others; read-only containers point them at a volume)
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
    "XDG_CONFIG_DIRS", "XDG_DATA_DIRS",
    # the network as the host reaches it: npx/uvx downloads and servers' own calls
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
)


def child_env(server: Server, environ: Mapping[str, str]) -> dict[str, str]:
    """A server's environment: the CHILD_ENV and `inherit_env` variables of `environ`,
    then the server's own `env` over them."""
    patterns = CHILD_ENV + server.inherit_env
    names = {p for p in patterns if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    env = {k: v for k, v in environ.items() if k in names or k.startswith(prefixes)}
    env.update(server.env)
    # Commands installed beside the bridge (its own venv's bin/) should resolve
    # even when that directory is not on PATH; appended, so it shadows nothing.
    own_bin = os.path.dirname(sys.executable)
    path = env.get("PATH", "")
    if own_bin not in path.split(os.pathsep):
        env["PATH"] = f"{path}{os.pathsep}{own_bin}" if path else own_bin
    return env


# Requests a rate limit counts: every call but the session's own handshake and pings.
_UNCOUNTED = frozenset({"initialize", "ping"})


def _calls(payload: Any) -> int:
    if payload.__class__ is dict:
        return 1 if "id" in payload and payload.get("method", "initialize") not in _UNCOUNTED else 0
    return sum(1 for m in payload if m.__class__ is dict and "id" in m and m.get("method", "initialize") not in _UNCOUNTED)
