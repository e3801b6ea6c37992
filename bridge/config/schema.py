"""The YAML config: parsed, interpolated and validated into frozen structs.

Validation walks the schema (the structs below) beside the data so that every
problem is reported, each with its key path (`servers.time.restart.window`),
rather than only the first. Leaf values are converted by msgspec.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import stat
import types
import typing
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from bridge.config import mcpservers

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
Mode = Literal["shared", "per-principal", "per-session"]
SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")  # a variable name, or a prefix ending in *
MIN_TOKEN = 16
MIN_PEER_KEY = 32  # characters of a cluster's peer key
SECRET_FILE_MAX = 64 * 1024


class Duration(float):
    """Seconds: a number, or a string such as `250ms`, `30s`, `5m`, `1h`."""


class Size(int):
    """Bytes: a number, or a string such as `512`, `64KiB`, `4MiB`, `1GiB`, `10MB`."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KB|MB|GB|KiB|MiB|GiB)?\s*$")
_SIZE_UNITS = {None: 1, "B": 1, "KB": 1000, "MB": 10**6, "GB": 10**9, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _dec_hook(cls: type, value: Any) -> Any:
    if cls is Duration:
        return Duration(_parse(value, _DURATION, _DURATION_UNITS, float, "a duration (like 30s, 5m)"))
    if cls is Size:
        return Size(_parse(value, _SIZE, _SIZE_UNITS, int, "a size (like 64KiB, 4MiB)"))
    raise NotImplementedError(cls)


def _parse(value: Any, pattern: re.Pattern[str], units: Mapping[str | None, float], cast: type, what: str) -> Any:
    if value.__class__ in (int, float) and value >= 0:
        return cast(value)
    match = pattern.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"expected {what}, got {value!r}")
    return cast(float(match.group(1)) * units[match.group(2)])


class Struct(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Every config struct: frozen, unknown keys refused. (Each subclass repeats
    `frozen=True`, which msgspec inherits anyway, for type checkers.)"""


class TLS(Struct, frozen=True):
    cert: str
    key: str


class Listen(Struct, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 8080
    tls: TLS | None = None
    trusted_proxies: tuple[str, ...] = ()  # addresses or networks that may set X-Forwarded-*


class Filter(Struct, frozen=True):
    """Names (or uris) by exact value or glob (`*`, `?`): deny wins over allow; no allow list allows all."""

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()


class RateLimit(Struct, frozen=True):
    """Calls of one principal, across all servers: a token bucket and a cap on calls in flight."""

    per_second: Annotated[float, msgspec.Meta(gt=0)] | None = None  # refill rate; None: no rate limit
    burst: PositiveInt | None = None  # bucket size; None: max(1, per_second)
    in_flight: PositiveInt | None = None  # None: no cap


class Token(Struct, frozen=True):
    name: str
    token: str | None = None  # with token_file: the file's content, filled in by parse
    sha256: str | None = None
    token_file: str | None = None
    servers: tuple[str, ...] = ("*",)
    roles: tuple[Literal["admin"], ...] = ()  # admin: may use the admin API (/admin)
    rate_limit: RateLimit | None = None  # None: limits.per_principal
    # Per server name: narrows what the server's own filters let through, for this token.
    tools: dict[str, Filter] = {}
    prompts: dict[str, Filter] = {}
    resources: dict[str, Filter] = {}


class Introspection(Struct, frozen=True):
    """RFC 7662, for opaque access tokens."""

    url: str
    client_id: str
    client_secret: str | None = None  # with client_secret_file: the file's content, filled in by parse
    client_secret_file: str | None = None


# Signature algorithms a token may use: asymmetric only (no `none`, no HMAC, so no key confusion).
Algorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]


class AuthorizationServer(Struct, frozen=True):
    issuer: str
    jwks_uri: str | None = None  # None: from the issuer's metadata
    algorithms: tuple[Algorithm, ...] = ("RS256", "ES256")
    audience: str | None = None  # None: the bridge's resource URL (or a server's)
    principal_claim: str = "sub"
    scopes_claim: str = "scope"  # a space-separated string or a list (a group claim)
    leeway: Duration = Duration(30)
    introspection: Introspection | None = None


class OAuth(Struct, frozen=True):
    authorization_servers: tuple[AuthorizationServer, ...]
    resource: str | None = None  # the canonical public base URL; None: the listening address
    scopes: dict[str, tuple[str, ...]] = {}  # scope or group value -> servers ("*": all)
    admin: tuple[str, ...] = ()  # scope or group values that give the admin role (the admin API)


class Security(Struct, frozen=True):
    tokens: tuple[Token, ...] = ()
    oauth: OAuth | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    allow_unauthenticated: bool = False


DEFAULT_SLOW_BYTES = 16 * 1024 * 1024


class Limits(Struct, frozen=True):
    max_message_bytes: Size = Size(4 * 1024 * 1024)
    max_sessions: PositiveInt = 1000
    max_inflight: PositiveInt = 256
    session_queue: PositiveInt = 1024
    # Bytes of those messages; None: see slow_bytes.
    session_queue_bytes: Size | None = None
    request_timeout: Duration = Duration(300)
    session_idle_timeout: Duration = Duration(1800)
    drain_timeout: Duration = Duration(10)
    initialize_timeout: Duration = Duration(30)
    keepalive_timeout: Duration = Duration(75)  # an idle client connection is closed after this
    max_subscriptions: PositiveInt = 1000  # per session
    per_principal: RateLimit = RateLimit()  # for every principal whose token sets none
    server_backlog: PositiveInt = 1024  # messages waiting for a (re)starting server
    server_input_buffer: Size | None = None  # bytes written to a server that it has not read; None: 16 x max_message_bytes
    server_input_stall: Duration = Duration(30)  # a server whose input stays over half the bound this long is restarted
    max_processes: PositiveInt | None = 256  # server processes of the whole daemon, warm ones included; None: no cap
    request_state_ttl: Duration = Duration(300)  # a 2026-07-28 call waiting for its client's input (MRTR) ends after this

    def input_buffer(self) -> int:
        return self.server_input_buffer if self.server_input_buffer is not None else 16 * self.max_message_bytes

    @property
    def slow_bytes(self) -> int:
        """Bytes queued for a session before it is dropped as too slow: session_queue_bytes,
        by default 16 MiB or 4 of the largest messages, whichever is more. By count alone the
        worst case is session_queue x max_message_bytes (4 GiB with the defaults) per session;
        16 MiB still holds 1024 messages of 16 KiB, far more than calls usually return."""
        if self.session_queue_bytes is not None:
            return int(self.session_queue_bytes)  # a plain int: logs show Size as text
        return max(DEFAULT_SLOW_BYTES, 4 * self.max_message_bytes)


class SSE(Struct, frozen=True):
    keepalive: Duration = Duration(15)


class Streamable(Struct, frozen=True):
    resume_buffer: Size = Size(1024 * 1024)


class Metrics(Struct, frozen=True):
    enabled: bool = True
    path: str = "/metrics"


class Logging(Struct, frozen=True):
    format: Literal["json", "console"] = "json"
    level: LogLevel = "info"


class Restart(Struct, frozen=True):
    backoff_initial: Duration = Duration(0.5)
    backoff_max: Duration = Duration(30)
    max_restarts: PositiveInt = 5
    window: Duration = Duration(60)


class Rlimits(Struct, frozen=True):
    """Limits the kernel puts on a server process, set in the child before exec."""

    memory: Size | None = None  # a memory cgroup's memory.max where cgroup v2 allows, else address space (RLIMIT_AS)
    cpu_time: Duration | None = None  # CPU seconds (RLIMIT_CPU): SIGXCPU, then SIGKILL
    open_files: PositiveInt | None = None  # RLIMIT_NOFILE
    processes: PositiveInt | None = None  # RLIMIT_NPROC: per user, and not applied to root
    nice: Annotated[int, msgspec.Meta(ge=0, le=19)] | None = None

    def named(self) -> str:
        """The limits set, as the README names them: for messages and logs."""
        values = ((name, getattr(self, name)) for name in self.__struct_fields__)
        return ", ".join(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}" for name, value in values if value is not None)


class Pool(Struct, frozen=True):
    """Per-session and per-principal servers: processes started ahead, and a ceiling."""

    warm: Annotated[int, msgspec.Meta(ge=0)] = 0  # started before a session asks (per-principal: and initialized)
    max: PositiveInt | None = None  # this server's processes, warm ones included; None: only limits.max_processes
    wait: Duration = Duration(10)  # how long a new session waits for a slot before it is refused


class Sandbox(Struct, frozen=True):
    """Run the server under bubblewrap: a read-only root, a private /tmp, no network unless allowed."""

    writable: tuple[str, ...] = ()  # absolute paths the server may write (bound read-write)
    network: bool = False


UserId = Annotated[int, msgspec.Meta(ge=0)] | str  # a name, or a number


class Server(Struct, frozen=True):
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    inherit_env: tuple[str, ...] = ()  # daemon variables passed on, beyond the minimal ones
    cwd: str | None = None
    mode: Mode = "shared"
    principal_idle_timeout: Duration = Duration(300)  # per-principal: a process with no session is stopped after this
    roots: tuple[str, ...] | None = None
    restart: Restart = Restart()
    shutdown_timeout: Duration = Duration(5)
    attribution_window: Duration = Duration(0.25)
    max_concurrent_calls: PositiveInt | None = None  # client calls at a process at once; None: no cap
    max_sessions: PositiveInt | None = None
    rlimits: Rlimits = Rlimits()
    user: UserId | None = None  # run as this user (the daemon must be root)
    group: UserId | None = None  # and group; None: the user's own
    sandbox: Sandbox | None = None
    pool: Pool = Pool()
    era: Literal["auto", "legacy", "modern"] = "auto"  # which protocol the process speaks (README, Protocol eras)
    tools: Filter = Filter()  # which tools clients see and may call
    prompts: Filter = Filter()
    resources: Filter = Filter()  # by uri
    cache_scope: Literal["private", "public"] = "private"  # what 2026-07-28 clients may share of cacheable results


class Cluster(Struct, frozen=True):
    """Replicas behind one load balancer: session ids name the replica that owns them, and any
    replica forwards a request to its session's owner (bridge/core/cluster.py)."""

    advertise: str | None = None  # HOST:PORT its peers reach it at; --advertise overrides
    peer_key: str | None = None  # with peer_key_file: the file's content, filled in by parse
    peer_key_file: str | None = None
    previous_peer_key: str | None = None  # also accepted, while keys are rotated
    previous_peer_key_file: str | None = None
    connect_timeout: Duration = Duration(0.5)  # an owner not answering by then is gone: 404
    max_connections: PositiveInt = 1024  # to all peers together; streams forwarded hold one each


class Config(Struct, frozen=True):
    servers: dict[str, Server]
    listen: Listen = Listen()
    security: Security = Security()
    limits: Limits = Limits()
    sse: SSE = SSE()
    streamable: Streamable = Streamable()
    metrics: Metrics = Metrics()
    logging: Logging = Logging()
    cluster: Cluster | None = None


class ConfigError(Exception):
    """Every problem found in a config, each naming its key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = problems


def load(
    path: str | Path, environ: Mapping[str, str] | None = None, notes: list[str] | None = None, interpolate: bool = True
) -> Config:
    """The config in `path`: the YAML format, or an MCP client's `mcpServers` JSON (whose
    entries a bridge cannot serve are skipped, each described in `notes`); with `interpolate`
    False, its `${...}` are left as written (and so need not be set)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [f"cannot read: {exc}"]) from None
    return parse(text, str(path), os.environ if environ is None else environ, notes, interpolate)


def parse(
    text: str,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
    notes: list[str] | None = None,
    interpolate: bool = True,
) -> Config:
    try:
        data = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(source, [f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"not valid YAML{where}: {reason}"]) from None
    if data is None:
        data = {}
    if mcpservers.is_mcp_servers(data):
        data, skipped = mcpservers.to_config(data)
        if notes is not None:
            notes += skipped
        try:
            return build(data, source, environ, interpolate)
        except ConfigError as exc:
            raise ConfigError(source, [mcpservers.in_file_terms(p) for p in exc.problems]) from None
    return build(data, source, environ, interpolate)


def build(data: Any, source: str, environ: Mapping[str, str] | None = None, interpolate: bool = True) -> Config:
    """A Config from parsed data (a file's, or one the command line made), every problem reported."""
    problems: list[str] = []
    if interpolate:
        data = _interpolate(data, "", os.environ if environ is None else environ, problems)
    _check(data, Config, "", problems)
    if problems:
        raise ConfigError(source, problems)
    config = msgspec.convert(data, Config, strict=False, dec_hook=_dec_hook)
    problems = _semantic_problems(config)
    config = _read_secret_files(config, problems)
    if problems:
        raise ConfigError(source, problems)
    return config


# ${VAR}, ${VAR:-default} and ${file:PATH} (not ${file:-x}: that is a variable named file);
# $${ escapes a literal ${.
_VAR = re.compile(r"\$(\$?)\{(?:file:([^}-][^}]*)|([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?)\}")


def _interpolate(node: Any, path: str, environ: Mapping[str, str], problems: list[str]) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, _join(path, k), environ, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", environ, problems) for i, v in enumerate(node)]
    if not isinstance(node, str) or "${" not in node:
        return node

    def substitute(match: re.Match[str]) -> str:
        escaped, file, name, default = match.groups()
        if escaped:
            return match.group(0)[1:]
        if file is not None:
            try:
                return _read_secret_file(file).rstrip("\r\n")
            except (OSError, ValueError) as exc:
                problems.append(f"{path}: cannot read {file}: {_why(exc)}")
                return ""
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        problems.append(f"{path}: environment variable {name} is not set")
        return ""

    return _VAR.sub(substitute, node)


def _read_secret_file(path: str) -> str:
    """A file holding a secret, whole. Errors never quote its content."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not stall the daemon's loop
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")  # nor a device (/dev/zero) fill its memory
        with open(fd, "rb", closefd=False) as file:
            data = file.read(SECRET_FILE_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > SECRET_FILE_MAX:
        raise ValueError(f"larger than {SECRET_FILE_MAX} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None  # its message would quote a byte of the secret
    if "\0" in text:
        raise ValueError("contains a NUL byte")
    return text


def _why(exc: OSError | ValueError) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror  # without the path, which the problem names already
    return str(exc)


def _secret_from(path: str, where: str, problems: list[str]) -> str | None:
    """A secret file's content, stripped; None (and the problem noted at `where`) if unreadable."""
    try:
        return _read_secret_file(path).strip()
    except (OSError, ValueError) as exc:
        problems.append(f"{where}: cannot read {path}: {_why(exc)}")
        return None


def _read_secret_files(config: Config, problems: list[str]) -> Config:
    """Each token_file's token and introspection client_secret_file, read now: at start and on
    every reload, so a rotated file takes effect."""
    tokens = list(config.security.tokens)
    for i, token in enumerate(tokens):
        if token.token_file is None or token.token is not None or token.sha256 is not None:
            continue  # no file, or more than one source (already reported)
        where = f"security.tokens[{i}].token_file"
        secret = _secret_from(token.token_file, where, problems)
        if secret is None:
            continue
        if len(secret) < MIN_TOKEN:
            problems.append(f"{where}: the token in {token.token_file} is too short (at least {MIN_TOKEN} characters)")
        tokens[i] = msgspec.structs.replace(token, token=secret)
    security = msgspec.structs.replace(config.security, tokens=tuple(tokens))
    oauth = security.oauth
    if oauth is not None:
        servers = list(oauth.authorization_servers)
        for i, server in enumerate(servers):
            intro = server.introspection
            if intro is None or intro.client_secret_file is None or intro.client_secret is not None:
                continue
            where = f"security.oauth.authorization_servers[{i}].introspection.client_secret_file"
            if (secret := _secret_from(intro.client_secret_file, where, problems)) is not None:
                servers[i] = msgspec.structs.replace(server, introspection=msgspec.structs.replace(intro, client_secret=secret))
        security = msgspec.structs.replace(security, oauth=msgspec.structs.replace(oauth, authorization_servers=tuple(servers)))
    config = msgspec.structs.replace(config, security=security)
    if (cluster := config.cluster) is not None:
        keys = {}
        for key in ("peer_key", "previous_peer_key"):
            path = getattr(cluster, key + "_file")
            if path is None or getattr(cluster, key) is not None:
                continue  # no file, or both (already reported)
            if (secret := _secret_from(path, f"cluster.{key}_file", problems)) is None:
                continue
            if len(secret) < MIN_PEER_KEY:
                problems.append(f"cluster.{key}_file: the key in {path} is too short (at least {MIN_PEER_KEY} characters)")
            keys[key] = secret
        config = msgspec.structs.replace(config, cluster=msgspec.structs.replace(cluster, **keys))
    return config


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _check(value: Any, annotation: Any, path: str, problems: list[str]) -> None:
    """Report every way `value` fails to fit `annotation`, recursing into structs and containers."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        _check_struct(value, annotation, path, problems)
    elif origin in (typing.Union, types.UnionType) and value is not None:
        others = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(others) == 1:
            _check(value, others[0], path, problems)
        else:
            _convert_leaf(value, annotation, path, problems)
    elif origin is dict and isinstance(value, dict):
        key_type, value_type = typing.get_args(annotation)
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(f"{_join(path, key)}: keys must be strings")
            _check(item, value_type, _join(path, key), problems)
    elif origin is tuple and isinstance(value, list):
        item_type = typing.get_args(annotation)[0]
        for i, item in enumerate(value):
            _check(item, item_type, f"{path}[{i}]", problems)
    else:
        _convert_leaf(value, annotation, path, problems)


def _check_struct(value: Any, cls: type[msgspec.Struct], path: str, problems: list[str]) -> None:
    if not isinstance(value, dict):
        problems.append(f"{path or '<top level>'}: expected a mapping, got {_show(value)}")
        return
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    for key in value:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{_join(path, key)}: unknown key{hint}")
    for name, info in fields.items():
        if name in value:
            _check(value[name], info.type, _join(path, name), problems)
        elif info.required:
            problems.append(f"{_join(path, name)}: required key is missing")


def _convert_leaf(value: Any, annotation: Any, path: str, problems: list[str]) -> None:
    try:
        msgspec.convert(value, annotation, strict=False, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        problems.append(f"{path}: {_describe(exc, value, annotation)}")


def _describe(exc: msgspec.ValidationError, value: Any, annotation: Any) -> str:
    text, _, where = str(exc).partition(" - at `$")
    if typing.get_origin(annotation) is Literal:
        choices = ", ".join(repr(c) for c in typing.get_args(annotation))
        return f"expected one of {choices}, got {_show(value)}"
    text = text[0].lower() + text[1:]
    if text.startswith("expected `") and "got" not in text:
        text += f", got {_show(value)}"
    return f"{text} (at {where.rstrip('`')})" if where else text


def _show(value: Any) -> str:
    return "nothing" if value is None else repr(value)


_HOST = re.compile(r"[A-Za-z0-9.:_-]+")  # a name, an IPv4 or (between brackets) IPv6 address


def is_loopback(host: str) -> bool:
    """A loopback name or address (RFC 6761: every *.localhost name is loopback)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _semantic_problems(config: Config) -> list[str]:
    problems: list[str] = []
    if not config.servers:
        problems.append("servers: at least one server is required")
    for name, server in config.servers.items():
        where = f"servers.{name}"
        if not SERVER_NAME.match(name):
            problems.append(f"{where}: name must be 1-64 letters, digits, '_', '.' or '-' (it is part of the URL)")
        if not server.command.strip():
            problems.append(f"{where}.command: must not be empty")
        if server.restart.backoff_initial > server.restart.backoff_max:
            problems.append(f"{where}.restart.backoff_initial: larger than backoff_max")
        for i, root in enumerate(server.roots or ()):
            if not root.startswith("file://"):
                problems.append(f"{where}.roots[{i}]: roots must be file:// URIs, got {root!r}")
        for i, path in enumerate(server.sandbox.writable if server.sandbox is not None else ()):
            if not os.path.isabs(path):
                problems.append(f"{where}.sandbox.writable[{i}]: must be an absolute path, got {path!r}")
        if server.pool != Pool() and server.mode == "shared":
            problems.append(f"{where}.pool: only for mode per-session or per-principal (a shared server has one process)")
        if server.pool.max is not None and server.pool.warm > server.pool.max:
            problems.append(f"{where}.pool.warm: larger than pool.max ({server.pool.max})")
        for i, pattern in enumerate(server.inherit_env):
            if not ENV_PATTERN.match(pattern):
                problems.append(
                    f"{where}.inherit_env[{i}]: expected a variable name or a prefix ending in '*' (like AWS_*), got {pattern!r}"
                )
    # Processes that run with no session: one per shared server, and every pool's warm ones.
    ahead = sum(1 if server.mode == "shared" else server.pool.warm for server in config.servers.values())
    if config.limits.max_processes is not None and ahead > config.limits.max_processes:
        problems.append(f"limits.max_processes: smaller than the shared servers and the pools' warm processes together ({ahead})")
    seen: set[str] = set()
    for i, token in enumerate(config.security.tokens):
        where = f"security.tokens[{i}]"
        if token.name in seen:
            problems.append(f"{where}.name: duplicate token name {token.name!r}")
        if "://" in token.name:
            problems.append(f"{where}.name: must not contain '://' (that names OAuth principals: issuer#subject)")
        seen.add(token.name)
        if sum(source is not None for source in (token.token, token.sha256, token.token_file)) != 1:
            problems.append(f"{where}: give exactly one of 'token', 'sha256' and 'token_file'")
        elif token.token is not None and len(token.token) < MIN_TOKEN:
            problems.append(f"{where}.token: too short (at least {MIN_TOKEN} characters)")
        elif token.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", token.sha256):
            problems.append(f"{where}.sha256: expected 64 hex digits")
        for j, server_name in enumerate(token.servers):
            if server_name != "*" and server_name not in config.servers:
                problems.append(f"{where}.servers[{j}]: no server named {server_name!r}")
        for kind in ("tools", "prompts", "resources"):
            for server_name in getattr(token, kind):
                if server_name not in config.servers:
                    problems.append(f"{where}.{kind}.{server_name}: no server named {server_name!r}")
    problems += _oauth_problems(config)
    for i, proxy in enumerate(config.listen.trusted_proxies):
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            problems.append(f"listen.trusted_proxies[{i}]: expected an address or a network like 10.0.0.0/8, got {proxy!r}")
    if config.limits.input_buffer() < config.limits.max_message_bytes:
        problems.append("limits.server_input_buffer: smaller than limits.max_message_bytes (no message would fit)")
    if config.limits.slow_bytes < config.limits.max_message_bytes:
        problems.append("limits.session_queue_bytes: smaller than limits.max_message_bytes (one message would drop a session)")
    if not config.metrics.path.startswith("/") or config.metrics.path.startswith("/servers/"):
        problems.append("metrics.path: must start with '/' and not be under /servers/")
    problems += listen_problems(config) + _cluster_key_problems(config)
    return problems


def _cluster_key_problems(config: Config) -> list[str]:
    cluster = config.cluster
    if cluster is None:
        return []
    problems: list[str] = []
    for key, required in (("peer_key", True), ("previous_peer_key", False)):
        value, path = getattr(cluster, key), getattr(cluster, key + "_file")
        if value is not None and path is not None:
            problems.append(f"cluster: give one of '{key}' and '{key}_file'")
        elif required and value is None and path is None:
            problems.append(f"cluster: give '{key}' or '{key}_file' (the key every replica shares)")
        elif value is not None and len(value) < MIN_PEER_KEY:
            problems.append(f"cluster.{key}: too short (at least {MIN_PEER_KEY} characters)")
    return problems


def cluster_problems(config: Config) -> list[str]:
    """With a cluster block, the address peers reach this replica at (from the file or
    --advertise, so checked once both are known)."""
    cluster = config.cluster
    if cluster is None:
        return []
    if cluster.advertise is None:
        return ["cluster.advertise: required (HOST:PORT its peers reach this replica at; or --advertise)"]
    host, sep, port = cluster.advertise.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not bare or not port.isdigit() or not 0 < int(port) < 65536 or not _HOST.fullmatch(bare):
        return [f"cluster.advertise: expected HOST:PORT (like 10.0.0.7:8080 or [fd00::7]:8080), got {cluster.advertise!r}"]
    return []


def _oauth_problems(config: Config) -> list[str]:
    oauth = config.security.oauth
    if oauth is None:
        return []
    problems: list[str] = []
    if oauth.resource is not None and not _is_base_url(oauth.resource):
        problems.append(f"security.oauth.resource: expected an http(s) URL with no query or fragment, got {oauth.resource!r}")
    if not oauth.authorization_servers:
        problems.append("security.oauth.authorization_servers: at least one is required")
    for i, server in enumerate(oauth.authorization_servers):
        where = f"security.oauth.authorization_servers[{i}]"
        for key in ("issuer", "jwks_uri"):
            value = getattr(server, key)
            if value is not None and not _is_base_url(value):
                problems.append(f"{where}.{key}: expected an http(s) URL, got {value!r}")
        if not server.algorithms:
            problems.append(f"{where}.algorithms: at least one is required")
        intro = server.introspection
        if intro is not None and (intro.client_secret is None) == (intro.client_secret_file is None):
            problems.append(f"{where}.introspection: give exactly one of 'client_secret' and 'client_secret_file'")
    for scope, names in oauth.scopes.items():
        for j, name in enumerate(names):
            if name != "*" and name not in config.servers:
                problems.append(f"security.oauth.scopes.{scope}[{j}]: no server named {name!r}")
    return problems


def _is_base_url(value: str) -> bool:
    parts = urllib.parse.urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.query and not parts.fragment


def listen_problems(config: Config, host: str | None = None) -> list[str]:
    """Refuse to serve off loopback with no auth unless the config says so."""
    host = config.listen.host if host is None else host
    security = config.security
    if security.oauth is not None and security.oauth.resource is None and host in ("0.0.0.0", "::", ""):
        return [
            "security.oauth.resource: required when listening on every address "
            "(it is the URL clients reach the bridge at, which tokens must name)"
        ]
    if security.tokens or security.oauth is not None or security.allow_unauthenticated or is_loopback(host):
        return []
    return [
        f"listen.host: {host!r} is not loopback and security.tokens is empty; "
        "add tokens or set security.allow_unauthenticated: true"
    ]
