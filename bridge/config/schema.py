"""The config's schema: every key of the YAML config as a frozen struct, with its default.

`config/load.py` walks these structs beside the data so that every problem is reported,
each with its key path (`servers.time.restart.window`), rather than only the first. Leaf
values are converted by msgspec (`dec_hook`: durations and sizes with units).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

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


def dec_hook(cls: type, value: Any) -> Any:
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
        """The limits set, as docs/reference/config.md names them: for messages and logs."""
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
    era: Literal["auto", "legacy", "modern"] = "auto"  # which protocol the process speaks (docs/explanation/eras.md)
    tools: Filter = Filter()  # which tools clients see and may call
    prompts: Filter = Filter()
    resources: Filter = Filter()  # by uri
    cache_scope: Literal["private", "public"] = "private"  # what 2026-07-28 clients may share of cacheable results
    pin: Literal["off", "warn", "hold"] = "off"  # what it offers fingerprinted, and a change held or warned about (pins.path)


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


class Pins(Struct, frozen=True):
    """Where the fingerprints of what pinned servers offer are kept (bridge/core/pins.py)."""

    path: str  # a JSON file the daemon reads at start and on reload, and writes (atomically)


class Group(Struct, frozen=True):
    """Several servers behind one endpoint, `/groups/NAME/` (bridge/core/group.py, docs/how-to/groups.md)."""

    servers: list[str]  # its members, in the order the group lists them; ["*"]: every server, in config order
    separator: str = "__"  # between a member's name and its tool's or prompt's: MEMBER__TOOL
    list_timeout: Duration = Duration(5)  # a member's list later than this is left out (its entries come with list_changed)


class Sampler(Struct, frozen=True):
    ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None  # of root traces sampled (a client's trace: as its parent says); unset: OTEL_TRACES_SAMPLER_ARG, else 1


class Traces(Struct, frozen=True):
    """OpenTelemetry traces of the requests the bridge serves (bridge/traces.py, docs/how-to/tracing.md).
    Each key left unset takes the standard OTEL_* variable's value, else its default."""

    endpoint: str | None = None  # the collector: http/protobuf a URL (http://collector:4318/v1/traces), grpc host:port; unset: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    protocol: Literal["http/protobuf", "grpc"] | None = None  # unset: OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, else http/protobuf
    headers: dict[str, str] = {}  # sent with each export (an API key, say); with OTEL_EXPORTER_OTLP_(TRACES_)HEADERS's
    sampler: Sampler = Sampler()
    service_name: str | None = None  # unset: OTEL_SERVICE_NAME, else mcp-bridge
    queue_size: PositiveInt = 2048  # spans waiting for export; past it they are dropped (and counted)


class Telemetry(Struct, frozen=True):
    traces: Traces | None = None  # off unless set (or OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is)


class Config(Struct, frozen=True):
    servers: dict[str, Server]
    groups: dict[str, Group] = {}  # several servers behind one endpoint each
    listen: Listen = Listen()
    security: Security = Security()
    limits: Limits = Limits()
    sse: SSE = SSE()
    streamable: Streamable = Streamable()
    metrics: Metrics = Metrics()
    logging: Logging = Logging()
    cluster: Cluster | None = None
    pins: Pins | None = None
    telemetry: Telemetry = Telemetry()


def group_members(config: Config, group: str) -> tuple[str, ...]:
    """A group's members, in its order: `*` stands for every server, in the config's order,
    not already named; a name that is not a server's is left out (config load refuses it)."""
    members: dict[str, None] = {}
    for name in config.groups[group].servers:
        for member in config.servers if name == "*" else (name,):
            if member in config.servers:
                members.setdefault(member)
    return tuple(members)


# What a reload (SIGHUP, the admin API) cannot change in a running daemon: a change to one
# of these keys is logged (`reload_needs_restart`) and waits for the next start. A change
# to a server's keys restarts that server's processes; everything else applies at once.
NEEDS_RESTART = ("listen", "metrics", "logging", "cluster", "limits.keepalive_timeout", "telemetry")


class ConfigError(Exception):
    """Every problem found in a config, each naming its key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = problems


def is_loopback(host: str) -> bool:
    """A loopback name or address (RFC 6761: every *.localhost name is loopback)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
