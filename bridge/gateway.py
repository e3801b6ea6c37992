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
import sys
import time
from collections.abc import Iterable
from typing import Any

from . import __version__, jsonrpc, logs
from .child import Child
from .config import Limits, Server
from .jsonrpc import ProtocolError
from .metrics import ServerMetrics
from .mux import Action, Broadcast, Discard, Mux, RestartServer, State, Timer, ToServer, ToSession
from .sessions import Session
from .supervisor import Status, Supervisor

encode = jsonrpc.encode


KEEPALIVE_PASSES = 5  # checks per keepalive interval: comments come every 4/5 to 5/5 of it
KEEPALIVE_SLICE = 64  # keepalives written between yields to the event loop
# Session ends the bridge chose, counted as drops (a client closing its stream is not one).
DROP_REASONS = frozenset({"slow", "idle", "server_gone", "shutdown"})


class SessionLimitError(Exception):
    """The server already has as many sessions as it may."""


class Upstream:
    """One server process and the mux in front of it; receives the supervisor's events."""

    def __init__(self, gateway: Gateway, label: str) -> None:
        self.gateway = gateway
        cfg = gateway.server
        self.mux = Mux(
            shared=cfg.mode == "shared",
            roots=cfg.roots,
            max_inflight=gateway.limits.max_inflight,
            attribution_window=cfg.attribution_window,
            client_info=("mcp-bridge", __version__),
        )
        self._timer: asyncio.TimerHandle | None = None
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
            on_line=self.on_line,
            on_oversize=self.on_oversize,
            on_batch=self.gateway.flush,
        )

    def send(self, data: bytes) -> None:
        child = self.child
        if child is None or not child.send(data):
            self._log.warning("server_write_failed", size=len(data))

    # Supervisor events.

    def on_started(self, child: Child) -> None:
        self.child = child
        self.gateway.apply(self, self.mux.server_started())

    def on_exited(self, code: int | None, delay: float) -> None:
        self.child = None
        self.gateway.metrics.restarts += 1
        reason = "server process could not be started" if code is None else f"server process exited with code {code}"
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
        await self.supervisor.stop()

    def ready(self) -> bool:
        return self.supervisor.status is Status.RUNNING and self.mux.state is State.READY


class Gateway:
    def __init__(self, name: str, server: Server, limits: Limits, metrics: ServerMetrics, keepalive: float) -> None:
        self.name = name
        self.metrics = metrics
        self.keepalive = keepalive
        self.server = server
        self.limits = limits
        self.max_sessions = server.max_sessions or limits.max_sessions
        self.sessions: dict[str, Session] = {}
        self.log = logs.get(server=name)
        self.child_env = _child_env(server.env)
        self._shared: Upstream | None = None
        self._upstreams: dict[str, Upstream] = {}  # session id -> its upstream
        self._stopping: set[asyncio.Task[None]] = set()
        self._unflushed: dict[Session, None] = {}  # sessions delivered to since the last flush, in order
        self._ticker: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self.accepting = True

    @property
    def shared(self) -> bool:
        return self.server.mode == "shared"

    def upstreams(self) -> Iterable[Upstream]:
        if self._shared is not None:
            return (self._shared,)
        return self._upstreams.values()

    async def start(self) -> None:
        if self.shared:
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
        await asyncio.gather(*(u.stop() for u in self.upstreams()), *self._stopping)

    def update_limits(self, limits: Limits) -> None:
        """Take new limits without touching sessions: they apply to what comes next."""
        self.limits = limits
        self.max_sessions = self.server.max_sessions or limits.max_sessions
        for upstream in self.upstreams():
            upstream.mux.max_inflight = limits.max_inflight
            if upstream.child is not None:
                upstream.child.set_line_limit(limits.max_message_bytes)

    # ----------------------------------------------------------------- sessions

    def open_session(self, session: Session) -> None:
        if not self.accepting:
            raise SessionLimitError(f"server {self.name!r} is shutting down")
        if len(self.sessions) >= self.max_sessions:
            self.metrics.sessions_dropped["limit"] += 1
            raise SessionLimitError(f"server {self.name!r} has {len(self.sessions)} sessions (limit {self.max_sessions})")
        self.sessions[session.id] = session
        if self.shared:
            assert self._shared is not None
            upstream = self._shared
        else:
            upstream = Upstream(self, f"{self.name}[{session.id[:8]}]")
            upstream.supervisor.start()
        self._upstreams[session.id] = upstream
        upstream.mux.open_session(session.id)
        self.metrics.sessions_opened[session.transport] += 1
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
        if not self.shared:
            task = asyncio.get_running_loop().create_task(upstream.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        self.log.info(
            "session_closed",
            session=session.id,
            transport=session.transport,
            reason=reason,
            duration_s=round(time.monotonic() - session.created, 3),
        )

    def negotiated_version(self, session: Session) -> str | None:
        """The protocol version this session's initialize settled on; None before (or after a failed) one."""
        upstream = self._upstreams.get(session.id)
        if upstream is None:
            return None
        peer = upstream.mux.peer(session.id)
        return peer.protocol_version if peer.initialized else None

    def from_client(self, session: Session, payload: Any) -> None:
        """Route one decoded client message (or batch); raises ProtocolError if invalid."""
        session.last_seen = time.monotonic()
        upstream = self._upstreams[session.id]
        actions = upstream.mux.from_client(session.id, payload)
        count = self.metrics.message
        for msg in payload if payload.__class__ is list else (payload,):
            count("from_client", msg.get("method", "response"))
        self.apply(upstream, actions)

    # ------------------------------------------------------------------ actions

    def apply(self, upstream: Upstream, actions: list[Action], flush: bool = True) -> None:
        slow: list[Session] = []
        metrics = self.metrics
        unflushed = self._unflushed
        for action in actions:
            cls = action.__class__
            if cls is ToServer:
                upstream.send(encode(action.message) + b"\n")  # type: ignore[union-attr]
            elif cls is ToSession:
                session = self.sessions.get(action.session)  # type: ignore[union-attr]
                if session is None:
                    continue
                data = encode(action.message)  # type: ignore[union-attr]
                metrics.bytes_out += len(data)
                unflushed[session] = None
                if not session.deliver(data, action.related, action.final):  # type: ignore[union-attr]
                    slow.append(session)
                call = action.call  # type: ignore[union-attr]
                if call is not None:
                    metrics.request_done(call.method, time.monotonic() - call.started)
            elif cls is Broadcast:
                data = encode(action.message)  # type: ignore[union-attr]
                for sid in action.sessions:  # type: ignore[union-attr]
                    session = self.sessions.get(sid)
                    if session is not None:
                        metrics.bytes_out += len(data)
                        unflushed[session] = None
                        if not session.deliver(data, None, False):
                            slow.append(session)
            elif cls is Discard:
                metrics.dropped_messages += 1
                self.log.warning("message_dropped", reason=action.reason, **action.detail)  # type: ignore[union-attr]
            elif cls is RestartServer:
                upstream.supervisor.restart(action.reason)  # type: ignore[union-attr]
            elif cls is Timer:
                upstream.set_timer(action.delay)  # type: ignore[union-attr]
        for session in dict.fromkeys(slow):  # once each, however many messages it missed
            limits = self.limits
            self.log.warning(
                "session_too_slow", session=session.id, queue_limit=limits.session_queue, queue_bytes=limits.slow_bytes
            )
            self.close_session(session, "slow")
        if flush:
            self.flush()

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

    def processes_up(self) -> int:
        return sum(1 for u in self.upstreams() if u.child is not None)

    def crash_looping(self) -> bool:
        return any(u.supervisor.status is Status.FAILED for u in self.upstreams())

    def readiness(self) -> str | None:
        """None when ready, else the reason this server cannot serve now."""
        if self.shared:
            assert self._shared is not None
            if self._shared.ready():
                return None
            sup = self._shared.supervisor
            if sup.status is Status.FAILED:
                return sup.failure or "crash loop"
            return f"server is {sup.status.value}, protocol {self._shared.mux.state.value}"
        if shutil.which(self.server.command, path=self.child_env.get("PATH")) is None:
            return f"command {self.server.command!r} not found"
        failed = [u for u in self._upstreams.values() if u.supervisor.status is Status.FAILED]
        if failed and len(failed) == len(self._upstreams):
            return failed[0].supervisor.failure or "crash loop"
        return None


def _child_env(overrides: dict[str, str]) -> dict[str, str]:
    # Commands installed beside the bridge (its own venv's bin/) should resolve
    # even when that directory is not on PATH; appended, so it shadows nothing.
    env = {**os.environ, **overrides}
    own_bin = os.path.dirname(sys.executable)
    path = env.get("PATH", "")
    if own_bin not in path.split(os.pathsep):
        env["PATH"] = f"{path}{os.pathsep}{own_bin}" if path else own_bin
    return env

