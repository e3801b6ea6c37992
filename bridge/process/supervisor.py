"""Keeps one server process alive: restarts with backoff and jitter, crash loops.

The supervisor owns the process lifecycle and reports it through callbacks;
it never touches messages. A process that exits is restarted after
`backoff_initial * 2**(n-1)` seconds (n: exits within `window`), capped at
`backoff_max`, with +-20% jitter so that many servers do not restart in step.
More than `max_restarts` exits within `window` is a crash loop: the server is
marked failed and tried again after `backoff_max`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from bridge import logs
from bridge.config.schema import Restart
from bridge.process.child import Child


class Status(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    FAILED = "failed"
    STOPPED = "stopped"


class Events(Protocol):
    def on_started(self, child: Child) -> None: ...

    def on_exited(self, code: int | None, delay: float) -> None: ...

    def on_failed(self, reason: str) -> None: ...


class Supervisor:
    def __init__(
        self,
        *,
        server: str,
        make_child: Callable[[], Child],
        restart: Restart,
        shutdown_timeout: float,
        events: Events,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.server = server
        self.status = Status.STOPPED
        self.child: Child | None = None
        self.restarts = 0
        self.last_exit: int | None = None
        self.started_at: float | None = None
        self.failure: str | None = None
        self._make_child = make_child
        self._policy = restart
        self._shutdown_timeout = shutdown_timeout
        self._events = events
        self._clock = clock
        self._jitter = jitter
        self._exits: deque[float] = deque()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._log = logs.get(server=server)

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"supervisor:{self.server}")

    async def stop(self) -> None:
        self._stopping = True
        child = self.child
        if child is not None and child.returncode is None:
            with contextlib.suppress(Exception):
                await child.stop(self._shutdown_timeout)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.status = Status.STOPPED

    def restart(self, reason: str) -> None:
        """Kill the running process (e.g. it never answered initialize); the loop restarts it."""
        child = self.child
        if child is not None and child.returncode is None:
            self._log.warning("server_restart_forced", pid=child.pid, reason=reason)
            child.signal_group(signal.SIGKILL)

    def next_delay(self, now: float) -> tuple[float, bool]:
        """Record an exit at `now`; return (delay before the next start, crash loop?)."""
        policy = self._policy
        self._exits.append(now)
        while self._exits and self._exits[0] < now - policy.window:
            self._exits.popleft()
        recent = len(self._exits)
        if recent > policy.max_restarts:
            return policy.backoff_max, True
        base = min(policy.backoff_max, policy.backoff_initial * 2 ** (recent - 1))
        return base * (0.8 + 0.4 * self._jitter()), False

    async def _run(self) -> None:
        while not self._stopping:
            code = await self._run_once()
            if self._stopping:
                break
            self.restarts += 1
            delay, crash_loop = self.next_delay(self._clock())
            child = self.child
            tail = child.stderr_tail() if child else []
            self._log.warning(
                "server_exited",
                pid=child.pid if child else None,
                exit_code=code,
                restart_in_s=round(delay, 3),
                stderr_tail=tail,
                stderr_suppressed=child.stderr_suppressed() if child else 0,
            )
            self._events.on_exited(code, delay)
            if crash_loop:
                self.status = Status.FAILED
                self.failure = f"crash loop: {len(self._exits)} exits within {self._policy.window:g}s"
                self._log.error("server_crash_loop", reason=self.failure, retry_in_s=round(delay, 3), stderr_tail=tail)
                self._events.on_failed(self.failure)
            else:
                self.status = Status.BACKOFF
            await asyncio.sleep(delay)

    async def _run_once(self) -> int | None:
        self.status = Status.STARTING
        child = self._make_child()
        try:
            await child.start()
        except OSError as exc:
            self.child = None
            self.last_exit = None
            self._log.error("server_spawn_failed", command=child.command, error=str(exc))
            return None
        self.child = child
        self.started_at = time.time()
        self.status = Status.RUNNING
        self._log.info("server_started", pid=child.pid, command=child.command)
        self._events.on_started(child)
        code = await child.wait()
        self.last_exit = code
        if self._stopping:
            self._log.info("server_stopped", pid=child.pid, exit_code=code, stderr_suppressed=child.stderr_suppressed())
        return code
