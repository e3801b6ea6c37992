"""One server process and the mux in front of it (`Upstream`): the supervisor's events, the
process's output through the era translator into the mux, and what the mux writes to it.
What it needs of the gateway that owns it is `Host`."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from structlog.typing import FilteringBoundLogger

from bridge import __version__
from bridge.config.schema import Limits, Server
from bridge.core.mux import Action, Mux, State
from bridge.core.pins import Gate
from bridge.core.translator import Ask, Decided, Deliver, Era, Out, Translator, Wake
from bridge.core.translator import Write as WriteOut
from bridge.metrics import ServerMetrics
from bridge.process import confine
from bridge.process.child import GONE, SENT, Child
from bridge.process.pool import Pool
from bridge.process.supervisor import Status, Supervisor
from bridge.protocol import jsonrpc, stateless
from bridge.protocol.jsonrpc import Message, ProtocolError

NOT_READING = "server is not reading its input (limits.server_input_buffer)"


if TYPE_CHECKING:
    from bridge.traces.spans import Spans  # imported only when tracing is on


class Host(Protocol):
    """What an upstream needs of its gateway: the server's config and limits, where to count
    and log, the pool its slot is from, and the interpreter of its mux's actions."""

    name: str
    server: Server
    limits: Limits
    metrics: ServerMetrics
    log: FilteringBoundLogger
    in_flight: Counter[str | None]
    pool: Pool[Upstream]
    launch: confine.Launch
    child_env: dict[str, str]
    accepting: bool
    pins: Gate | None
    traces: Spans | None

    def apply(self, upstream: Upstream, actions: list[Action], flush: bool = True) -> None: ...

    def flush(self) -> None: ...

    def upstreams(self) -> Iterable[Upstream]: ...


class Upstream:
    """One server process and the mux in front of it; receives the supervisor's events."""

    def __init__(self, gateway: Host, label: str, warm: bool = False) -> None:
        self.gateway = gateway
        cfg = gateway.server
        limits = gateway.limits
        per_session = cfg.mode == "per-session"
        # Started warm (ahead of its session or principal). Per session it is left uninitialized
        # for its session's own initialize (see the mux's `warm`); per principal it is initialized
        # by the bridge as any per-principal process is. Per session there is one session to a
        # process: nothing to attribute, so no call is held back.
        self.warm = warm
        self.holds_slot = True  # one of the pool's slots, until it has stopped for good
        self._announce = False  # in the pool and not ready yet: tell the pool once it is
        self._attribution_window = 0.0 if per_session else cfg.attribution_window
        self.mux = Mux(
            shared=not per_session,
            warm=warm and per_session,
            roots=cfg.roots,
            max_inflight=limits.max_inflight,
            max_backlog=limits.server_backlog,
            max_subscriptions=limits.max_subscriptions,
            attribution_window=self._attribution_window,
            max_calls=cfg.max_concurrent_calls or 0,
            client_info=("mcp-bridge", __version__),
            in_flight=gateway.in_flight,
            slot_waited=gateway.metrics.slot_waits.observe,
        )
        self.mux.set_pins(gateway.pins)
        self._timer: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None  # armed while the server's input is backed up
        self.refused = 0  # messages not written since its input backed up
        self.child: Child | None = None
        self.last_limit: str | None = None  # the limit that most likely ended its last process
        # The era of the running process (core/translator.py); a translator only while it is
        # found out, and for a modern server.
        self.era = Era.DETECTING
        self.translator: Translator | None = None
        self._wake: asyncio.TimerHandle | None = None
        self.supervisor = Supervisor(
            server=label,
            make_child=self._make_child,
            restart=cfg.restart,
            shutdown_timeout=cfg.shutdown_timeout,
            events=self,
        )
        self._log = gateway.log
        self._identity = stateless.Server(None, cfg.cache_scope)
        self._identity_of: dict[str, Any] | None = None  # the initialize result it was made from

    def identity(self) -> stateless.Server:
        """What a 2026-07-28 answer from this process is decorated with: made once per
        initialize result (a restarted process has a new one), not per answer."""
        init = self.mux.init_result
        if init is not self._identity_of:
            self._identity_of = init
            self._identity = stateless.Server(init.get("serverInfo") if init else None, self.gateway.server.cache_scope)
        return self._identity

    def _make_child(self) -> Child:
        launch = self.gateway.launch
        return Child(
            server=self.gateway.name,
            command=launch.argv[0],
            args=launch.argv[1:],
            env=self.gateway.child_env,
            cwd=launch.cwd,
            max_line=self.gateway.limits.max_message_bytes,
            input_limit=self.gateway.limits.input_buffer(),
            rlimits=self.gateway.server.rlimits,
            identity=launch.identity,
            memory_groups=launch.memory_groups,
            on_line=self.on_line,
            on_oversize=self.on_oversize,
            on_batch=self.gateway.flush,
            on_input_blocked=self.on_input_blocked,
        )

    def send(self, data: bytes) -> bool:
        """Write to the process; False when its input is full and the message was not written."""
        child = self.child
        result = GONE if child is None else child.send(data)
        if result is SENT:
            return True
        if result is GONE:
            # It is exiting: the exit fails what is in flight.
            self._log.warning("server_write_failed", size=len(data))
            return True
        self.refused += 1
        return False

    def buffered(self) -> int:
        """Bytes written to the process's stdin that it has not read yet, beyond the pipe's own."""
        child = self.child
        return child.stdin_buffered() if child is not None else 0

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
        self._announce = self.warm and self in self.gateway.pool.warm
        era = self.gateway.server.era
        self.mux.set_limits(attribution_window=self._attribution_window)
        actions: list[Action] = []
        if era == "legacy":
            self.era, self.translator = Era.LEGACY, None
        else:
            self.era = Era.DETECTING
            self.translator = Translator(client_info=("mcp-bridge", __version__), era=era)
            actions = self._carry(self.translator.start())
        self.gateway.apply(self, actions + self.mux.server_started())

    def on_exited(self, code: int | None, delay: float) -> None:
        self.child = None
        self._cancel_stall()
        if self.era is Era.DETECTING and self.translator is not None:
            # A legacy server may die of a request it does not know: `era: legacy` spares it.
            self._log.warning("server_exited_during_discover", exit_code=code)
        self.translator = None
        self._cancel_wake()
        self.gateway.metrics.restarts += 1
        reason = "server process could not be started" if code is None else f"server process exited with code {code}"
        rlimits = self.gateway.server.rlimits
        self.last_limit = None
        if code is not None and (limits := rlimits.named()) and (last := self.supervisor.child) is not None:
            cause = confine.exit_cause(code, rlimits, last.oom_kills, last.stderr_tail())
            likely = cause.likely() if cause is not None else "one of them may have stopped it"
            reason += f"; it runs under limits ({limits}): {likely}"
            if cause is not None:
                self.last_limit = cause.limit
                self.gateway.metrics.limit_kills[cause.limit] += 1
            self._log.warning(
                "server_exited_under_limits",
                exit_code=code,
                rlimits=limits,
                likely=likely,
                limit=self.last_limit,
                said=cause.said if cause is not None else None,
            )
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
            actions = self.mux.from_server(payload) if self.translator is None else self._through(payload)
        except Exception:
            # A bug must not stop this server's output from being read: log it, drop the line.
            self._log.exception("internal_error", where="from_server", size=len(line))
            return
        if (traces := self.gateway.traces) is not None and traces.open:  # (`open`: a traced call in flight)
            traces.from_server(actions)
        self.gateway.apply(self, actions, flush=False)  # the child calls flush after the read's last line
        if self._announce and self.mux.state is State.READY:
            self._announce = False
            self._log.debug("server_warm", pid=self._pid())
            self.gateway.pool.slots.changed()  # a session may be waiting for it

    # The era translator (only while the process has one).

    def translate(self, message: Message) -> list[Action]:
        """One message from the mux, through the translator, to the process (or back to the mux)."""
        assert self.translator is not None
        return self._carry(self.translator.from_mux(message))

    def _through(self, payload: Any) -> list[Action]:
        out: list[Action] = []
        for msg in payload if payload.__class__ is list else (payload,):
            translator = self.translator  # none from the message on that made the server legacy
            out += self.mux.from_server(msg) if translator is None else self._carry(translator.from_server(msg))
        return out

    def _carry(self, outs: list[Out]) -> list[Action]:
        """Do what the translator says; what is for the mux becomes the mux's actions."""
        actions: list[Action] = []
        for out in outs:
            match out:
                case WriteOut(message):
                    if not self.send(jsonrpc.encode(message) + b"\n"):
                        self.gateway.metrics.dropped_messages += 1
                        origin = self.translator.origin(message["id"]) if self.translator and "id" in message else None
                        if "method" in message and origin is not None:
                            actions += self.mux.not_written(origin, NOT_READING)
                case Deliver(message):
                    actions += self.mux.from_server(message)
                case Ask(upstream_id, message):
                    actions += self.mux.server_request_for(upstream_id, message)
                case Wake(delay):
                    self._cancel_wake()
                    self._wake = asyncio.get_running_loop().call_later(delay, self._on_wake)
                case Decided(era, reason, final):
                    self.era = era
                    self._cancel_wake()
                    self._log.info("server_era", era=era.value, reason=reason, final=final, pid=self._pid())
                    if era is Era.LEGACY and final:
                        self.translator = None
                    elif era is Era.MODERN:
                        # Its questions come as input_required for a known call: nothing to attribute,
                        # so calls need not take turns.
                        self.mux.set_limits(attribution_window=0.0)
        return actions

    def _on_wake(self) -> None:
        self._wake = None
        if self.translator is not None:
            self.gateway.apply(self, self._carry(self.translator.wake()))

    def _cancel_wake(self) -> None:
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None

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

    def start(self) -> None:
        self.supervisor.start()

    async def stop(self) -> None:
        """Stop the process for good; its slot frees once it has exited."""
        if self._timer is not None:
            self._timer.cancel()
        self._cancel_stall()
        self._cancel_wake()
        await self.supervisor.stop()
        if self.holds_slot:
            self.holds_slot = False
            self.gateway.pool.release()

    async def restart(self, reason: str) -> None:
        """Stop the process gently and start a new one; what is still in flight fails with `reason`."""
        self._log.info("server_restarting", pid=self._pid(), reason=reason)
        await self.supervisor.stop()
        self.child = None
        self.translator = None
        self._cancel_stall()
        self._cancel_wake()
        self.gateway.apply(self, self.mux.server_exited(reason))
        # Meanwhile the gateway may have stopped (reload, shutdown) or, per session, its session
        # closed and this process retired: then it stays stopped.
        if self.gateway.accepting and any(u is self for u in self.gateway.upstreams()):
            self.supervisor.start()

    def ready(self) -> bool:
        return self.supervisor.status is Status.RUNNING and self.mux.state is State.READY
