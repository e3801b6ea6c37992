"""Command line: arguments, exit codes (0 clean stop, 2 bad config or arguments, 1 anything else)."""

from __future__ import annotations

import argparse
import asyncio
import resource
import signal
import ssl
import sys
from collections.abc import Sequence

import msgspec
from aiohttp import web

from . import __version__, logs
from .app import create_app
from .config import Config, ConfigError, listen_problems, load

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


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
    parser.add_argument("--version", action="version", version=f"mcp-bridge {__version__}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{exc.source}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    host = args.host or config.listen.host
    port = config.listen.port if args.port is None else args.port
    problems = listen_problems(config, host)
    if not 0 <= port <= 65535:
        problems.append(f"--port: {port} is not a port number")
    if problems:
        for problem in problems:
            print(f"{args.config}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        print(f"{args.config}: ok ({len(config.servers)} servers: {', '.join(config.servers)})")
        return EXIT_OK
    logs.setup(args.log_format or config.logging.format, args.log_level or config.logging.level)
    log = logs.get()
    config = msgspec.structs.replace(config, listen=msgspec.structs.replace(config.listen, host=host, port=port))
    try:
        asyncio.run(serve(config))
    except OSError as exc:
        log.error("startup_failed", error=str(exc))
        return EXIT_ERROR
    except Exception:
        log.exception("daemon_crashed")
        return EXIT_ERROR
    return EXIT_OK


async def serve(config: Config) -> None:
    log = logs.get()
    raise_open_file_limit()
    runner = web.AppRunner(create_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        host, port = config.listen.host, config.listen.port
        site = web.TCPSite(runner, host, port, ssl_context=_tls(config))
        await site.start()
        bound = [s.getsockname() for s in site._server.sockets] if site._server else []  # type: ignore[union-attr]
        log.info(
            "listening",
            host=host,
            port=bound[0][1] if bound else port,
            tls=config.listen.tls is not None,
            servers=list(config.servers),
            version=__version__,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping")
    finally:
        await runner.cleanup()
    log.info("stopped")


def _tls(config: Config) -> ssl.SSLContext | None:
    tls = config.listen.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    return context


def raise_open_file_limit() -> None:
    """Each SSE session holds a socket: take as many descriptors as the system allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    logs.get().info("open_file_limit", soft=soft, hard=hard)
