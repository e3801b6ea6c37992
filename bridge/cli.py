"""Command line: arguments, exit codes (0 clean stop, 2 bad config or arguments, 1 anything else)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import msgspec
from aiohttp import web

from . import __version__, logs, runtime
from .app import apply_config, create_app, drain, listening
from .config import Config, ConfigError, listen_problems, load
from .transports import fastpath
from .transports.common import GATEWAYS, LIVE

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# Many clients connect at once (each session holds a connection); the kernel caps this at somaxconn.
LISTEN_BACKLOG = 4096
# Once the gateways have stopped, how long a connection may take to write its stream's last
# events and end it, on either path: a client that does not read must not hold up the exit.
CLOSE_GRACE_S = 5.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mcp-bridge", description="Serve stdio MCP servers over HTTP+SSE and Streamable HTTP."
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="YAML config file")
    parser.add_argument("--host", help="listen address (overrides listen.host)")
    parser.add_argument("--port", type=int, help="listen port, 0 for any free port (overrides listen.port)")
    parser.add_argument("--check", action="store_true", help="validate the config, print what is wrong, exit")
    parser.add_argument("--log-format", choices=["json", "console"], help="overrides logging.format")
    parser.add_argument("--log-level", choices=list(logs.LEVELS), help="overrides logging.level")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="event loop (uvloop: pip install uvloop)")
    parser.add_argument("--version", action="version", version=f"mcp-bridge {__version__}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = _load(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{exc.source}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        print(f"{args.config}: ok ({len(config.servers)} servers: {', '.join(config.servers)})")
        return EXIT_OK
    logs.setup(args.log_format or config.logging.format, args.log_level or config.logging.level)
    log = logs.get()
    try:
        _run(serve(config, lambda: _load(args)), args.loop)
    except OSError as exc:
        log.error("startup_failed", error=str(exc))
        return EXIT_ERROR
    except Exception:
        log.exception("daemon_crashed")
        return EXIT_ERROR
    return EXIT_OK


def _run(main: Coroutine[Any, Any, None], loop: str) -> None:
    if loop == "uvloop":
        import uvloop  # optional: measured mixed here (README, Performance)

        uvloop.run(main)
    else:
        asyncio.run(main)


def _load(args: argparse.Namespace) -> Config:
    """The config file with the command line's overrides applied; ConfigError lists every problem."""
    config = load(args.config)
    host = args.host or config.listen.host
    port = config.listen.port if args.port is None else args.port
    problems = listen_problems(config, host)
    if not 0 <= port <= 65535:
        problems.append(f"--port: {port} is not a port number")
    if problems:
        raise ConfigError(args.config, problems)
    return msgspec.structs.replace(config, listen=msgspec.structs.replace(config.listen, host=host, port=port))


async def serve(config: Config, reload_config: Callable[[], Config]) -> None:
    """Serve until SIGTERM or SIGINT, then drain and stop; SIGHUP reloads the config."""
    log = logs.get()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads: set[asyncio.Task[None]] = set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)  # first, so that a signal during startup stops cleanly
    runtime.raise_open_file_limit()
    runtime.tune_allocator()
    app = create_app(config)

    def on_hup() -> None:
        task = loop.create_task(_reload(app, reload_config))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    idle = config.limits.keepalive_timeout
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, keepalive_timeout=idle, shutdown_timeout=CLOSE_GRACE_S
    )
    await runner.setup()
    connections = fastpath.Connections()
    gateways = app[GATEWAYS]
    collector = loop.create_task(
        runtime.keep_collections_short(
            lambda: connections.accepted + sum(g.metrics.opened() for g in gateways.values()),
            lambda: sum(len(g.sessions) for g in gateways.values()),
        )
    )
    server: asyncio.Server | None = None
    try:
        server = await loop.create_server(
            lambda: fastpath.Connection(app, runner.server, connections, idle),  # type: ignore[arg-type]
            config.listen.host,
            config.listen.port,
            ssl=_tls(config),
            backlog=LISTEN_BACKLOG,
            reuse_address=True,
        )
        bound = [s.getsockname() for s in server.sockets]
        if bound:
            listening(app, bound[0][1])
        log.info(
            "listening",
            host=config.listen.host,
            port=bound[0][1] if bound else config.listen.port,
            tls=config.listen.tls is not None,
            servers=list(config.servers),
            version=__version__,
            loop=type(loop).__module__.split(".")[0],
        )
        await stop.wait()
        log.info("stopping")
        await asyncio.gather(*reloads)
        await drain(app, app[LIVE].config.limits.drain_timeout)
    finally:
        collector.cancel()
        if server is not None:
            server.close()
        # Both paths stop taking requests; then the gateways stop (every stream gets its last
        # events and ends) while aiohttp waits for its handlers; then the fast path for its own.
        connections.stop_taking()
        await runner.cleanup()
        await connections.wait_closed(CLOSE_GRACE_S)
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Stopped: closing the loop would restore the default action, and a second
            # signal during the interpreter's exit would turn a clean stop into a kill.
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)
    log.info("stopped")


async def _reload(app: web.Application, reload_config: Callable[[], Config]) -> None:
    log = logs.get()
    try:
        new = reload_config()
    except ConfigError as exc:
        log.error("reload_rejected", config=exc.source, problems=exc.problems)
        return
    await apply_config(app, new)


def _tls(config: Config) -> ssl.SSLContext | None:
    tls = config.listen.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    return context
