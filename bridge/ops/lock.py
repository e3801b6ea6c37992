"""`mcp-bridge pins lock`: record what each pinned server offers now, ahead of any client, in
the pins file (a lock file to keep in version control and mount read-only).

Each pinned server is started as the daemon starts it (its command, arguments, environment,
working directory, sandbox and limits), initialized as the daemon initializes a shared
process, and asked for every page of its tools, prompts and resource templates; a kind it
does not declare is recorded empty, so that nothing it offers later is taken on trust
(bridge/core/pins.py, rule 2). The other servers in the file keep what it holds of them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

from bridge import __version__
from bridge.config.schema import Config, Server
from bridge.core.mux import bridge_initialize_params
from bridge.core.pins import Listed, Mode, ServerPins
from bridge.gateway import pinsfile
from bridge.process import confine
from bridge.process.child import Child
from bridge.process.env import child_env
from bridge.protocol import jsonrpc

MAX_PAGES = 1000  # a server whose cursors never end is refused, not followed forever
# The capability a server declares for each kind it lists.
CAPABILITY = {Listed.TOOL: "tools", Listed.PROMPT: "prompts", Listed.TEMPLATE: "resources"}
METHOD = {Listed.TOOL: "tools/list", Listed.PROMPT: "prompts/list", Listed.TEMPLATE: "resources/templates/list"}


class LockError(Exception):
    """A server that could not be asked what it offers: the message names it and why."""


class _Asker:
    """One server process, asked one request at a time."""

    def __init__(self, name: str, server: Server, config: Config) -> None:
        launch = confine.launch(server)
        self.name = name
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._ids = iter(range(1, 1 << 62))
        self.child = Child(
            server=name,
            command=launch.argv[0],
            args=launch.argv[1:],
            env=child_env(server, os.environ, launch.identity),
            cwd=launch.cwd,
            max_line=config.limits.max_message_bytes,
            input_limit=config.limits.input_buffer(),
            rlimits=server.rlimits,
            identity=launch.identity,
            memory_groups=launch.memory_groups,
            on_line=self._line,
            on_oversize=lambda size, head, tail: None,
        )

    def _line(self, line: bytes) -> None:
        try:
            msg = jsonrpc.decode(line)
        except jsonrpc.ProtocolError:
            return
        rid = msg.get("id") if isinstance(msg, dict) else None
        if isinstance(rid, int) and (future := self._waiting.pop(rid, None)) is not None and not future.done():
            future.set_result(msg)

    async def ask(self, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        rid = next(self._ids)
        future = self._waiting[rid] = asyncio.get_running_loop().create_future()
        self.child.send(jsonrpc.encode(jsonrpc.request(rid, method, params)) + b"\n")
        try:
            async with asyncio.timeout(timeout):
                msg: dict[str, Any] = await future
        except TimeoutError:
            raise LockError(f"servers.{self.name}: no answer to {method} in {timeout:g} s") from None
        result = msg.get("result")
        if not isinstance(result, dict):
            raise LockError(f"servers.{self.name}: {method} failed: {msg.get('error')}")
        return result


async def offered(name: str, server: Server, config: Config, timeout: float) -> dict[Listed, list[dict[str, Any]]]:
    """Every item of every kind `server` offers a client the daemon initializes it for."""
    asker = _Asker(name, server, config)
    try:
        await asker.child.start()
    except OSError as exc:
        raise LockError(f"servers.{name}: cannot start {server.command!r}: {exc.strerror or exc}") from None
    try:
        init = await asker.ask("initialize", bridge_initialize_params("mcp-bridge", __version__), timeout)
        asker.child.send(jsonrpc.encode(jsonrpc.notification("notifications/initialized")) + b"\n")
        capabilities = init.get("capabilities")
        if not isinstance(capabilities, dict):
            capabilities = {}
        found: dict[Listed, list[dict[str, Any]]] = {}
        for kind in Listed:
            found[kind] = []
            if CAPABILITY[kind] not in capabilities:
                continue
            cursor: str | None = None
            for _ in range(MAX_PAGES):
                page = await asker.ask(METHOD[kind], {"cursor": cursor} if cursor is not None else {}, timeout)
                items = page.get(kind.value)
                found[kind] += [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
                cursor = page.get("nextCursor") if isinstance(page.get("nextCursor"), str) else None
                if cursor is None:
                    break
            else:
                raise LockError(f"servers.{name}: {METHOD[kind]} still had pages after {MAX_PAGES}")
        return found
    finally:
        await asker.child.stop(server.shutdown_timeout)


async def lock(config: Config, path: str, names: Iterable[str], timeout: float) -> dict[str, dict[str, int]]:
    """Record what the servers `names` offer in the pins file at `path`, and write it; how
    many items of each kind each has. Raises LockError, PinsError or pinsfile.ReadOnly."""
    servers = pinsfile.read(path)
    counts: dict[str, dict[str, int]] = {}
    now = pinsfile.now()
    for name in names:
        pins = ServerPins()
        for kind, items in (await offered(name, config.servers[name], config, timeout)).items():
            pins.see(kind, items, Mode.HOLD, now)
        servers[name] = pins
        counts[name] = {kind.value: len(pins.pinned.get(kind, {})) for kind in Listed}
    pinsfile.write(path, pinsfile.render(servers))
    return counts
