"""Command line: arguments, exit codes (0 clean stop, 2 bad config or arguments, 1 anything else)."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import ipaddress
import os
import signal
import socket
import ssl
import struct
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import msgspec
import yaml
from aiohttp import web

from bridge import __version__, logs, runtime
from bridge.app import apply_config, create_app, drain, listening
from bridge.config import mcpservers
from bridge.config.load import build, cluster_problems, listen_problems, load
from bridge.config.schema import Config, ConfigError, Mode
from bridge.core.pins import PinsError
from bridge.gateway import pinsfile
from bridge.http import fastpath
from bridge.http.endpoints.post import POSTS
from bridge.http.state import GATEWAYS, LIVE
from bridge.ops import admin
from bridge.process import confine

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# Many clients connect at once (each session holds a connection); the kernel caps this at somaxconn.
LISTEN_BACKLOG = 4096
# Once the gateways have stopped, how long a connection may take to write its stream's last
# events and end it, on either path: a client that does not read must not hold up the exit.
CLOSE_GRACE_S = 5.0
ONE_LINE_NAME = "default"
ONE_LINE_SOURCE = "command line"
MODES = get_args(Mode)
# The one-liner's static tokens: (name, roles, variable); VARIABLE_FILE names a file holding it.
ONE_LINE_TOKENS: tuple[tuple[str, list[str], str], ...] = (
    ("default", [], "MCP_BRIDGE_TOKEN"),
    ("admin", ["admin"], "MCP_BRIDGE_ADMIN_TOKEN"),
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The daemon's options; `-- COMMAND [ARGS...]` after them serves that one command (`command`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="mcp-bridge",
        description="Serve stdio MCP servers over HTTP+SSE and Streamable HTTP.",
        usage="%(prog)s (--config FILE | [--name NAME] [--mode MODE] -- COMMAND [ARGS...]) [options]",
        epilog="Also: `mcp-bridge config convert FILE`, `mcp-bridge config schema`, `mcp-bridge ctl --help`.",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML config file, or an MCP client's mcpServers JSON")
    parser.add_argument("--name", help=f"with -- COMMAND: the server's name in its URLs (default {ONE_LINE_NAME!r})")
    parser.add_argument("--mode", choices=MODES, help="with -- COMMAND: the server's mode (default shared)")
    parser.add_argument("--host", help="listen address (overrides listen.host)")
    parser.add_argument("--port", type=int, help="listen port, 0 for any free port (overrides listen.port)")
    parser.add_argument("--advertise", metavar="HOST:PORT", help="the address other replicas reach this one at (overrides cluster.advertise)")
    parser.add_argument("--check", action="store_true", help="validate the config, print what is wrong or what would be served, exit")
    parser.add_argument("--log-format", choices=["json", "console"], help="overrides logging.format")
    parser.add_argument("--log-level", choices=list(logs.LEVELS), help="overrides logging.level")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="event loop (uvloop: pip install uvloop)")
    parser.add_argument("--version", action="version", version=f"mcp-bridge {__version__}")
    args = parser.parse_args(argv)
    args.command = command
    if (args.config is None) == (not command):
        parser.error("give either --config FILE or -- COMMAND [ARGS...]")
    if args.config is not None and (args.name is not None or args.mode is not None):
        parser.error("--name and --mode are for -- COMMAND; a config file names and sets up its own servers")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["config"]:
        return convert_main(argv[1:])
    if argv[:1] == ["pins"]:
        return pins_main(argv[1:])
    if argv[:1] == ["ctl"]:
        from bridge import ctl  # the client side: none of it is loaded by the daemon

        return ctl.main(argv[1:])
    args = parse_args(argv)
    notes: list[str] = []
    try:
        config = _load(args, notes)
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_USAGE
    if args.check:
        for note in notes:
            print(f"{args.config}: {note}")
        print(describe(config, args.config or ONE_LINE_SOURCE))
        return EXIT_OK
    logs.setup(args.log_format or config.logging.format, args.log_level or config.logging.level)
    log = logs.get()
    _log_notes(args, notes)
    try:
        _run(serve(config, lambda: _reload_config(args)), args.loop)
    except OSError as exc:
        log.error("startup_failed", error=str(exc))
        return EXIT_ERROR
    except Exception:
        log.exception("daemon_crashed")
        return EXIT_ERROR
    return EXIT_OK


def _run(main: Coroutine[Any, Any, None], loop: str) -> None:
    if loop == "uvloop":
        import uvloop  # optional: measured mixed here (bench/RESULTS.md)

        uvloop.run(main)
    else:
        asyncio.run(main)


def _load(args: argparse.Namespace, notes: list[str] | None = None) -> Config:
    """The config (the file, or the one command) with the command line's overrides applied;
    ConfigError lists every problem."""
    source = args.config or ONE_LINE_SOURCE
    config = load(args.config, notes=notes) if args.config is not None else one_line_config(args, os.environ)
    host = args.host or config.listen.host
    port = config.listen.port if args.port is None else args.port
    problems = listen_problems(config, host)
    if problems and args.config is None:
        problems = [f"--host: {host!r} is not loopback and no token is set; set MCP_BRIDGE_TOKEN or MCP_BRIDGE_TOKEN_FILE"]
    if not 0 <= port <= 65535:
        problems.append(f"--port: {port} is not a port number")
    config = msgspec.structs.replace(config, listen=msgspec.structs.replace(config.listen, host=host, port=port))
    if args.advertise is not None:
        if config.cluster is None:
            problems.append("--advertise: needs a cluster block in the config (with the peer key the replicas share)")
        else:
            config = msgspec.structs.replace(config, cluster=msgspec.structs.replace(config.cluster, advertise=args.advertise))
    problems += cluster_problems(config)
    problems += confine.host_problems(config)
    if config.pins is not None:
        try:
            pinsfile.read(config.pins.path)
        except PinsError as exc:
            problems.append(f"pins.path: {config.pins.path}: {exc}")
    if problems:
        raise ConfigError(source, problems)
    return config


def _reload_config(args: argparse.Namespace) -> Config:
    notes: list[str] = []
    config = _load(args, notes)
    _log_notes(args, notes)
    return config


def _log_notes(args: argparse.Namespace, notes: list[str]) -> None:
    for note in notes:
        logs.get().warning("config_entry_skipped", config=args.config, note=note)


def _print_problems(exc: ConfigError) -> None:
    for problem in exc.problems:
        print(f"{exc.source}: {problem}", file=sys.stderr)


def one_line_config(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    """The config of `mcp-bridge [options] -- COMMAND [ARGS...]`: that one command as server
    `--name`, static tokens from the environment (ONE_LINE_TOKENS), validated as a file is."""
    server: dict[str, Any] = {"command": args.command[0], "args": args.command[1:]}
    if args.mode is not None:
        server["mode"] = args.mode
    tokens: list[dict[str, Any]] = []
    terms = {f"servers.{args.name or ONE_LINE_NAME}": "--name"}  # key paths, in the command line's terms
    problems: list[str] = []
    for name, roles, variable in ONE_LINE_TOKENS:
        value, path = environ.get(variable), environ.get(variable + "_FILE")
        if value is not None and path is not None:
            problems.append(f"{variable}: set both it and {variable}_FILE; give one")
        elif value is not None or path is not None:
            terms[f"security.tokens[{len(tokens)}]"] = variable if value is not None else variable + "_FILE"
            source = {"token": value} if value is not None else {"token_file": path}
            tokens.append({"name": name, **source, "roles": roles})
    if problems:
        raise ConfigError(ONE_LINE_SOURCE, problems)
    data = {"servers": {args.name or ONE_LINE_NAME: server}, "security": {"tokens": tokens}}
    try:
        # Arguments are the shell's, already expanded: a `${` in them is meant literally.
        return build(data, ONE_LINE_SOURCE, environ, interpolate=False)
    except ConfigError as exc:
        raise ConfigError(ONE_LINE_SOURCE, [_in_terms(p, terms) for p in exc.problems]) from None


def _in_terms(problem: str, terms: Mapping[str, str]) -> str:
    path, sep, rest = problem.partition(": ")
    for key, term in terms.items():
        if path == key or path.startswith(key + "."):
            return f"{term} ({path}){sep}{rest}"
    return problem


# A wildcard listen address -> the loopback address of its family, which a URL can name.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
_EVERY = {
    "0.0.0.0": ("every IPv4 address (0.0.0.0)", socket.AF_INET),
    "::": ("every IPv6 address (::)", socket.AF_INET6),  # asyncio binds it IPv6 only
    "": ("every address (an empty host)", None),
}
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def describe(config: Config, source: str) -> str:
    """What `--check` prints for a valid config: each server's endpoints, mode and protocol eras.
    A wildcard listen address is no address a client can use: the URLs name loopback, and a
    note names the addresses other machines can use instead."""
    listen = config.listen
    shown = _WILDCARDS.get(listen.host, listen.host)
    host = f"[{shown}]" if ":" in shown else shown
    base = f"{'https' if listen.tls is not None else 'http'}://{host}:{listen.port}"
    lines = [f"{source}: ok ({len(config.servers)} servers: {', '.join(config.servers)})"]
    for name, server in config.servers.items():
        lines.append(f"  {name} (mode {server.mode}): {server.command} {' '.join(server.args)}".rstrip())
        lines += [f"    {line}" for line in confine.describe(server)]
        if server.max_concurrent_calls is not None:
            cap = server.max_concurrent_calls
            lines.append(f"    at most {cap} call{'s' if cap > 1 else ''} at once to each process (max_concurrent_calls); more wait their turn")
        lines.append(f"    {base}/servers/{name}/mcp  Streamable HTTP (protocol 2025-03-26 and later)")
        lines.append(f"    {base}/servers/{name}/sse  HTTP+SSE (protocol 2024-11-05)")
    if listen.host in _WILDCARDS:
        every, family = _EVERY[listen.host]
        found = host_addresses(family)
        which = f"its own: {', '.join(found)}" if found else "its name, or an address of it"
        lines.append(
            f"  (listening on {every}: the URLs say {shown}, for clients on this machine; clients elsewhere"
            f" use in its place an address of this machine they can reach ({which}))"
        )
    if listen.port == 0:
        lines.append("  (port 0: the port chosen is logged in the `listening` event)")
    return "\n".join(lines)


def host_addresses(family: socket.AddressFamily | None = None) -> list[str]:
    """This machine's addresses other machines may reach it at (no loopback, no link-local:
    a URL with one needs an interface name), IPv4 then IPv6, as a URL writes them; only
    `family`'s when given. Read from the kernel (Linux); what cannot be read is left out."""
    found: list[str] = []
    if family in (None, socket.AF_INET):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                for _, name in socket.if_nameindex():
                    try:
                        packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                    except OSError:
                        continue  # no IPv4 address
                    found.append(socket.inet_ntoa(packed[20:24]))
        except OSError:
            pass
    if family in (None, socket.AF_INET6):
        try:
            with open("/proc/net/if_inet6", encoding="ascii") as table:
                for line in table:
                    digits = line.split()[0]
                    found.append(str(ipaddress.IPv6Address(bytes.fromhex(digits))))
        except (OSError, ValueError, IndexError):
            pass
    usable = [a for a in dict.fromkeys(found) if not (ip := ipaddress.ip_address(a)).is_loopback and not ip.is_link_local]
    return [f"[{a}]" if ":" in a else a for a in usable]


def pins_main(argv: Sequence[str]) -> int:
    """`mcp-bridge pins lock --config F`: record what the pinned servers offer now in the pins
    file (pins.path, or --output), ahead of any client."""
    parser = argparse.ArgumentParser(prog="mcp-bridge pins")
    sub = parser.add_subparsers(dest="action", required=True)
    lock_args = sub.add_parser("lock", help="start each pinned server, and write what it offers to the pins file")
    lock_args.add_argument("--config", required=True, metavar="F")
    lock_args.add_argument("--output", metavar="PATH", help="the file to write (default: the config's pins.path)")
    lock_args.add_argument("--server", action="append", metavar="NAME", help="only this server (repeatable; default: every pinned one)")
    lock_args.add_argument("--timeout", type=float, default=30.0, metavar="S", help="how long each answer may take (default 30)")
    args = parser.parse_args(argv)
    from bridge.ops import lock  # only this command needs it

    try:
        config = load(args.config)
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_USAGE
    path = args.output or (config.pins.path if config.pins is not None else None)
    if path is None:
        print(f"{args.config}: no pins.path, and no --output", file=sys.stderr)
        return EXIT_USAGE
    names = args.server or [name for name, server in config.servers.items() if server.pin != "off"]
    unknown = [name for name in names if name not in config.servers]
    if unknown or not names:
        print(f"{args.config}: " + (f"no server named {unknown[0]!r}" if unknown else "no server pins (servers.NAME.pin)"), file=sys.stderr)
        return EXIT_USAGE
    logs.setup("console", "warning")
    try:
        counts = asyncio.run(lock.lock(config, path, names, args.timeout))
    except (lock.LockError, PinsError, pinsfile.ReadOnly) as exc:
        print(f"{path}: {exc}" if isinstance(exc, PinsError) else str(exc), file=sys.stderr)
        return EXIT_ERROR
    for name, kinds in counts.items():
        print(f"{name}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items()))
    print(f"wrote {path}")
    return EXIT_OK


def convert_main(argv: Sequence[str]) -> int:
    """`mcp-bridge config convert FILE`: an mcpServers JSON file as the equivalent YAML config;
    `mcp-bridge config schema`: the config's JSON Schema."""
    parser = argparse.ArgumentParser(prog="mcp-bridge config")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("convert", help="print the YAML config equivalent to an mcpServers JSON file").add_argument("file")
    sub.add_parser("schema", help="print the config's JSON Schema (what config/servers.schema.json holds)")
    args = parser.parse_args(argv)
    if args.action == "schema":
        from bridge.config import jsonschema  # only this command needs it

        print(jsonschema.render(), end="")
        return EXIT_OK
    notes: list[str] = []
    try:
        # The same validation as serving it, but its ${VAR}s stay as written (the output keeps
        # them for the daemon to fill in): they need not be set where it is converted.
        load(args.file, notes=notes, interpolate=False)
        data = yaml.safe_load(Path(args.file).read_text(encoding="utf-8"))
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_USAGE
    if not mcpservers.is_mcp_servers(data):
        print(f"{args.file}: not an mcpServers file (it is already in the YAML format)", file=sys.stderr)
        return EXIT_USAGE
    converted, _ = mcpservers.to_config(data)
    print(mcpservers.to_yaml(converted, notes), end="")
    return EXIT_OK


async def serve(config: Config, reload_config: Callable[[], Config]) -> None:
    """Serve until SIGTERM or SIGINT, then drain and stop; SIGHUP reloads the config."""
    log = logs.get()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads: set[asyncio.Task[list[str]]] = set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)  # first, so that a signal during startup stops cleanly
    runtime.raise_open_file_limit()
    runtime.tune_allocator()
    app = create_app(config)

    def on_hup() -> None:
        task = loop.create_task(_reload(app, reload_config))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    app[admin.RELOAD] = lambda: _reload(app, reload_config)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    idle = config.limits.keepalive_timeout
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, keepalive_timeout=idle, shutdown_timeout=CLOSE_GRACE_S
    )
    await runner.setup()
    connections = fastpath.Connections()
    posts = app[POSTS]
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
            lambda: fastpath.Connection(app, posts, runner.server, connections, idle),  # type: ignore[arg-type]
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


async def _reload(app: web.Application, reload_config: Callable[[], Config]) -> list[str]:
    """Load the config again and apply it; the problems that kept it from loading, if any."""
    log = logs.get()
    try:
        new = reload_config()
    except ConfigError as exc:
        log.error("reload_rejected", config=exc.source, problems=exc.problems)
        return exc.problems
    await apply_config(app, new)
    return []


def _tls(config: Config) -> ssl.SSLContext | None:
    tls = config.listen.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    return context
