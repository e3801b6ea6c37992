"""One stdio server process: spawn, newline framing, stderr to the log, stop escalation.

stdout and stderr are read by an asyncio protocol, so each complete line is
handed to the owner synchronously from the data callback: no task wake-up
per message on the server side, and, for stdout, not a turn of the loop later
either (`_Stdout`). `on_batch` follows the lines of each read,
so that the owner can write what they produced in one go.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import resource
import signal
import subprocess
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bridge import logs
from bridge.config.schema import Rlimits
from bridge.process import cgroups
from bridge.process.confine import Identity, spawn_as

STDERR_LINE_LIMIT = 16 * 1024
# A server may write to stderr as fast as it likes; the log takes a burst of this many
# lines per process, then this many a second, and says how many it left out.
STDERR_BURST, STDERR_RATE = 100, 10.0
# The last lines of stderr (each cut to a length) are kept, logged or not, for /status and
# the exit events: what a crashing server said last, in at most 20 x 512 bytes per process.
TAIL_LINES, TAIL_LINE_BYTES = 20, 512
EDGE = 256  # bytes kept from each end of a dropped line
# Of a stop's shutdown_timeout, the last part (at most half) is SIGTERM's: a server that
# ignores the end of its input (server-everything does) gets the signal that long before
# SIGKILL, and a stop never outlasts shutdown_timeout.
STOP_TERM_GRACE_S = 1.0


class LineFramer:
    """Splits a byte stream into lines of at most `limit` bytes.

    A longer line is dropped whole and reported once through `on_oversize`
    with its size and its first and last bytes (enough to find a top-level
    id); reading resumes after its newline, so one bad line costs nothing else.
    """

    __slots__ = ("_buf", "_dropping", "_head", "limit", "_on_line", "_on_oversize", "_tail")

    def __init__(self, limit: int, on_line: Callable[[bytes], None], on_oversize: Callable[[int, bytes, bytes], None]) -> None:
        self.limit = limit
        self._on_line = on_line
        self._on_oversize = on_oversize
        self._buf = bytearray()
        self._dropping = 0  # bytes of an oversized line dropped so far, 0 if none
        self._head = b""
        self._tail = b""

    def feed(self, data: bytes) -> None:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if self._dropping:
                tail = (self._tail + data[start:end])[-EDGE:]
                self._on_oversize(self._dropping + end - start, self._head, tail)
                self._dropping = 0
            elif self._buf:
                self._buf += data[start:end]
                self._emit(bytes(self._buf))
                self._buf.clear()
            else:
                self._emit(data[start:end])
            start = end + 1
        if start < len(data):
            if self._dropping:
                self._dropping += len(data) - start
                self._tail = (self._tail + data[start:])[-EDGE:]
            else:
                self._buf += data[start:] if start else data
                if len(self._buf) > self.limit:
                    self._dropping = len(self._buf)
                    self._head, self._tail = bytes(self._buf[:EDGE]), bytes(self._buf[-EDGE:])
                    self._buf = bytearray()

    def _emit(self, line: bytes) -> None:
        if len(line) > self.limit:
            self._on_oversize(len(line), line[:EDGE], line[-EDGE:])
        elif line.strip():
            self._on_line(line)

    def pending(self) -> int:
        return len(self._buf) + self._dropping


class Write(enum.Enum):
    SENT = "sent"
    FULL = "full"  # the server has not read what it was sent: nothing more until it does
    GONE = "gone"  # stdin is closed


# Read on every message, as globals: a member lookup on an Enum class is slow in Python 3.11 (jsonrpc.REQUEST).
SENT, FULL, GONE = Write.SENT, Write.FULL, Write.GONE


_NO_RLIMITS = Rlimits()  # the default: none set (a frozen struct, shared)


class Child:
    """A running stdio MCP server in its own process group.

    What it has not read of its stdin is bounded by `input_limit` bytes: a write
    that would go past it is refused (`Write.FULL`). `on_input_blocked(True)` is
    called once more than half of that is waiting, `on_input_blocked(False)`
    once it has read it down again, so the owner can tell a server that stopped
    reading from one that is merely busy.
    """

    def __init__(
        self,
        *,
        server: str,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,  # the whole environment; None: the daemon's
        cwd: str | None = None,
        max_line: int,
        input_limit: int,
        rlimits: Rlimits = _NO_RLIMITS,
        identity: Identity | None = None,  # run as this user; None: as the daemon
        memory_groups: cgroups.Groups | None = None,  # rlimits.memory by a cgroup; None: by RLIMIT_AS
        on_line: Callable[[bytes], None],
        on_oversize: Callable[[int, bytes, bytes], None],
        on_batch: Callable[[], None] = lambda: None,
        on_input_blocked: Callable[[bool], None] = lambda blocked: None,
    ) -> None:
        self.server = server
        self.command = command
        self.args = tuple(args)
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.pid: int | None = None
        self.returncode: int | None = None
        self._stdout = LineFramer(max_line, on_line, on_oversize)
        self._on_batch = on_batch
        self.input_limit = input_limit
        self.rlimits = rlimits
        self.identity = identity
        self._memory_groups = memory_groups
        self._memory_group: cgroups.MemoryGroup | None = None
        self.oom_kills = 0  # processes the memory cgroup's OOM killer ended, known once it has exited
        self._on_input_blocked = on_input_blocked
        self._stderr = LineFramer(STDERR_LINE_LIMIT, self._stderr_line, self._stderr_oversize)
        self._stderr_throttle = logs.Throttle(STDERR_RATE, STDERR_BURST)
        self._stderr_tail: deque[bytes] = deque(maxlen=TAIL_LINES)
        self._transport: asyncio.SubprocessTransport | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._exited: asyncio.Future[int] | None = None
        self._closed: asyncio.Future[None] | None = None
        self._log = logs.get(server=server)

    async def start(self) -> None:
        """Spawn the process; raises OSError when it cannot be started."""
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        self._closed = loop.create_future()
        group = None
        if self.rlimits.memory is not None and self._memory_groups is not None:
            group = self._memory_group = self._memory_groups.create(self.server, int(self.rlimits.memory))
        try:
            await self._spawn(loop, group)
        except BaseException:
            if group is not None:
                with contextlib.suppress(OSError):  # the spawn's own error is the one to report
                    await group.remove()
            raise
        finally:
            if group is not None:
                group.spawned()
        self._log = self._log.bind(pid=self.pid)

    async def _spawn(self, loop: asyncio.AbstractEventLoop, group: cgroups.MemoryGroup | None) -> None:
        report, told = os.pipe()  # what the child could not do before exec, in its words
        try:
            await loop.subprocess_exec(
                lambda: _Protocol(self),
                self.command,
                *self.args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_preexec(self.rlimits, group, told),
                **spawn_as(self.identity),
            )
        except subprocess.SubprocessError as exc:
            os.close(told)
            told = -1
            said = os.read(report, 1024).decode("utf-8", "replace")  # the child has exited: this does not wait
            raise OSError(f"{said or exc} (before exec)") from None
        finally:
            os.close(report)
            if told >= 0:
                os.close(told)

    def send(self, data: bytes) -> Write:
        """Write one framed message (ending in a newline), unless stdin is gone or full."""
        stdin = self._stdin
        if stdin is None or stdin.is_closing():
            return GONE
        if stdin.get_write_buffer_size() + len(data) > self.input_limit:
            return FULL
        stdin.write(data)
        return SENT

    def set_limits(self, max_line: int, input_limit: int) -> None:
        self._stdout.limit = max_line
        self.input_limit = input_limit
        if self._stdin is not None:
            self._stdin.set_write_buffer_limits(high=input_limit // 2)

    def stdin_buffered(self) -> int:
        stdin = self._stdin
        return stdin.get_write_buffer_size() if stdin is not None and not stdin.is_closing() else 0

    async def wait(self) -> int:
        assert self._exited is not None
        return await asyncio.shield(self._exited)

    async def stop(self, timeout: float) -> int:
        """Stop within `timeout`: close stdin; a group still running at `timeout` less the
        SIGTERM grace gets SIGTERM, and at `timeout` SIGKILL."""
        assert self._exited is not None
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.close()
        grace = min(STOP_TERM_GRACE_S, timeout / 2)
        waited = 0.0
        for sig, wait in ((signal.SIGTERM, timeout - grace), (signal.SIGKILL, grace)):
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(self._exited), wait)
            waited += wait
            self._log.info("server_stop_escalated", signal=sig.name, after_s=round(waited, 3))
            self.signal_group(sig)
        return await asyncio.shield(self._exited)

    def signal_group(self, sig: int) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    # Called by the protocol.

    def _connected(self, transport: asyncio.SubprocessTransport) -> None:
        # Before subprocess_exec returns: a start cancelled right here still
        # has a transport to reap the process with.
        self._transport = transport
        self._stdin = transport.get_pipe_transport(0)  # type: ignore[assignment]
        if self._stdin is not None:
            self._stdin.set_write_buffer_limits(high=self.input_limit // 2)
        self.pid = transport.get_pid()
        stdout = transport.get_pipe_transport(1)
        if isinstance(stdout, asyncio.ReadTransport) and isinstance(inner := stdout.get_protocol(), asyncio.Protocol):
            stdout.set_protocol(_Stdout(inner, self))

    def _data(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._stdout.feed(data)
            self._on_batch()  # every line of this read is handed over
        else:
            self._stderr.feed(data)

    def stderr_tail(self) -> list[str]:
        """The last lines the process wrote to stderr, oldest first."""
        return [line.decode("utf-8", "replace").rstrip() for line in self._stderr_tail]

    def stderr_suppressed(self) -> int:
        """Lines of stderr left out of the log since the last one logged."""
        return self._stderr_throttle.suppressed

    def _stderr_line(self, line: bytes) -> None:
        self._stderr_tail.append(line[:TAIL_LINE_BYTES])
        if (held := self._stderr_throttle.allow()) is not None:
            self._log.info("server_stderr", line=line.decode("utf-8", "replace").rstrip(), **suppressed(held))

    def _stderr_oversize(self, size: int, head: bytes, tail: bytes) -> None:
        self._stderr_tail.append(head[:TAIL_LINE_BYTES])
        if (held := self._stderr_throttle.allow()) is not None:
            self._log.warning("server_stderr_line_dropped", size=size, limit=STDERR_LINE_LIMIT, **suppressed(held))

    def _process_exited(self) -> None:
        # Whatever the leader left behind in its group dies with it; this also
        # closes pipes a grandchild still holds, so the exit is seen promptly.
        self.signal_group(signal.SIGKILL)
        assert self._transport is not None
        self.returncode = self._transport.get_returncode()
        asyncio.get_running_loop().create_task(self._finish())

    async def _finish(self) -> None:
        assert self._closed is not None and self._exited is not None
        # Let the last stdout bytes arrive before the exit is reported.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._closed), 2.0)
        if (group := self._memory_group) is not None:
            self.oom_kills = group.oom_kills()
            try:
                await group.remove()
            except OSError as exc:
                self._log.warning("memory_cgroup_not_removed", path=str(group.path), error=str(exc))
        if self._transport is not None:
            self._transport.close()
        if not self._exited.done():
            self._exited.set_result(self.returncode if self.returncode is not None else -1)

    def _connection_lost(self) -> None:
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)


def suppressed(held: int) -> dict[str, int]:
    """The field saying how many stderr lines the log left out, when any were."""
    return {"suppressed": held} if held else {}


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, child: Child) -> None:
        self._child = child

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._child._connected(transport)  # type: ignore[arg-type]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._child._data(fd, data)

    def process_exited(self) -> None:
        self._child._process_exited()

    def pause_writing(self) -> None:
        self._child._on_input_blocked(True)

    def resume_writing(self) -> None:
        self._child._on_input_blocked(False)

    def connection_lost(self, exc: Any) -> None:
        self._child._connection_lost()


class _Stdout(asyncio.Protocol):
    """stdout's reads, handed over as they come. asyncio's subprocess transport defers
    each pipe callback with call_soon: a turn of the loop (an epoll_wait) per read of
    the server's output, before any of it reaches a client. Its own pipe protocol
    still hears the end of the pipe, so the transport's exit and close are as before."""

    __slots__ = ("_child", "_inner")

    def __init__(self, inner: asyncio.Protocol, child: Child) -> None:
        self._inner = inner
        self._child = child

    def data_received(self, data: bytes) -> None:
        self._child._data(1, data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)


def _preexec(limits: Rlimits, group: cgroups.MemoryGroup | None, report: int) -> Callable[[], None] | None:
    """What the child runs between fork and exec (after subprocess has taken on its user):
    join its memory cgroup, take on its limits (None: nothing to do). Only syscalls: nothing
    that could wait on a lock another thread of the daemon held. What fails is written to
    `report`, for the daemon's error."""
    settings = [
        (name, kind, int(value))
        for name, kind, value in (
            ("memory", resource.RLIMIT_AS, limits.memory if group is None else None),
            ("cpu_time", resource.RLIMIT_CPU, limits.cpu_time),
            ("open_files", resource.RLIMIT_NOFILE, limits.open_files),
            ("processes", resource.RLIMIT_NPROC, limits.processes),
        )
        if value is not None
    ]
    nice = limits.nice
    join = group.join_fd if group is not None else None
    if not settings and nice is None and join is None:
        return None

    def apply() -> None:
        step = "joining its memory cgroup"
        try:
            if join is not None:
                os.write(join, b"0")
            for name, kind, value in settings:
                step = f"setting rlimits.{name}"
                # CPU time: the soft limit sends SIGXCPU, which ends the process and says why;
                # a hard limit equal to it would SIGKILL at the same moment, which says nothing.
                resource.setrlimit(kind, (value, value + 1 if kind == resource.RLIMIT_CPU else value))
            if nice is not None:
                step = "setting rlimits.nice"
                os.nice(nice)
        except (OSError, ValueError) as exc:
            os.write(report, f"{step}: {exc}".encode())
            raise

    return apply
