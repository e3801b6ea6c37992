"""A real mcp-bridge daemon on an ephemeral loopback port, for a test to start and stop.

`run_bridge` (the `bridge` fixture of tests/conftest.py) starts `python -m bridge` as a subprocess with a config written to a
temporary file, waits for its `listening` log event, and on exit sends
SIGTERM, expects exit code 0 and checks that every server process it started
is gone. Its JSON log is parsed as it arrives so tests wait on events, not
on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ROOT / "tests" / "servers"
PY = sys.executable


def faulty(**env: str) -> dict[str, Any]:
    """Config for the fault-injection server."""
    server: dict[str, Any] = {"command": PY, "args": [str(SERVERS / "faulty.py")]}
    if env:
        server["env"] = env
    return server


def demo(**extra: Any) -> dict[str, Any]:
    return {"command": PY, "args": ["-m", "bridge.demo_server"], **extra}


class Bridge:
    def __init__(self, proc: asyncio.subprocess.Process, config_path: Path) -> None:
        self.proc = proc
        self.config_path = config_path
        self.events: list[dict[str, Any]] = []
        self.port = 0
        self._changed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, server: str, path: str = "sse") -> str:
        return f"{self.base}/servers/{server}/{path}"

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "unparsed", "line": line.decode(errors="replace")}
            self.events.append(event)
            self._changed.set()

    async def wait_for(
        self, event: str, timeout: float = 10.0, where: Callable[[dict[str, Any]], bool] | None = None, start: int = 0
    ) -> dict[str, Any]:
        """The first log event named `event` (from index `start`) that satisfies `where`."""
        async with asyncio.timeout(timeout):
            seen = start
            while True:
                for item in self.events[seen:]:
                    if item.get("event") == event and (where is None or where(item)):
                        return item
                seen = len(self.events)
                if self.proc.returncode is not None and self._reader.done():
                    raise AssertionError(f"bridge exited ({self.proc.returncode}) before logging {event}")
                self._changed.clear()
                await self._changed.wait()

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    def server_pids(self) -> set[int]:
        return {e["pid"] for e in self.named("server_started")}

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        async with asyncio.timeout(timeout):
            code = await self.proc.wait()
            await self._reader
        return code


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@contextlib.asynccontextmanager
async def run_bridge(
    tmp_path: Path,
    config: dict[str, Any] | Path,
    *args: str,
    env: dict[str, str] | None = None,
    expect_exit: int = 0,
    command: list[str] | None = None,
) -> AsyncIterator[Bridge]:
    """`config` is written to a file; or is a file, served on a free loopback port; or, with
    `command`, the one-liner `mcp-bridge ARGS -- COMMAND` runs instead (on a free loopback port)."""
    on_free_port = ["--host", "127.0.0.1", "--port", "0"]
    if isinstance(config, Path):
        config_path = config
        source = ["--config", str(config), *on_free_port]
    else:
        config_path = tmp_path / "servers.yaml"
        config_path.write_text(yaml.safe_dump({"listen": {"host": "127.0.0.1", "port": 0}, **config}))
        source = ["--config", str(config_path)] if command is None else on_free_port
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "bridge", *source, "--log-level", "debug", *args, *(["--", *command] if command else []),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    bridge = Bridge(proc, config_path)
    try:
        listening = await bridge.wait_for("listening", timeout=20)
        bridge.port = listening["port"]
        yield bridge
    finally:
        code = await bridge.stop()
        leftovers = [pid for pid in bridge.server_pids() if pid_alive(pid)]
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    assert code == expect_exit, f"bridge exited with {code}"
    assert not leftovers, f"server processes left behind: {leftovers}"
