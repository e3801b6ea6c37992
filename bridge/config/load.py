"""Reading a config: YAML parsed, `${VAR}` and `${file:...}` interpolated, secret files read, every
value checked against `schema` with its key path, then the rules no type can say (names,
bounds that depend on each other, tokens, OAuth, listen and cluster). Every problem found is
reported at once, each naming its key.
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
from typing import Any, Literal

import msgspec
import yaml

from bridge.config import mcpservers
from bridge.config.schema import (
    ENV_PATTERN,
    MIN_PEER_KEY,
    MIN_TOKEN,
    SECRET_FILE_MAX,
    SERVER_NAME,
    Config,
    ConfigError,
    Group,
    Pool,
    Server,
    Token,
    dec_hook,
    group_members,
    is_loopback,
)

_HOST = re.compile(r"[A-Za-z0-9.:_-]+")  # a name, an IPv4 or (between brackets) IPv6 address


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
    config = msgspec.convert(data, Config, strict=False, dec_hook=dec_hook)
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
        msgspec.convert(value, annotation, strict=False, dec_hook=dec_hook)
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


def _semantic_problems(config: Config) -> list[str]:
    problems: list[str] = []
    if not config.servers:
        problems.append("servers: at least one server is required")
    for name, server in config.servers.items():
        problems += _server_problems(f"servers.{name}", name, server)
    seen: set[str] = set()
    for i, token in enumerate(config.security.tokens):
        problems += _token_problems(f"security.tokens[{i}]", token, seen, config)
    problems += _oauth_problems(config)
    for i, proxy in enumerate(config.listen.trusted_proxies):
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            problems.append(f"listen.trusted_proxies[{i}]: expected an address or a network like 10.0.0.0/8, got {proxy!r}")
    problems += _limits_problems(config)
    if not config.metrics.path.startswith("/") or config.metrics.path.startswith("/servers/"):
        problems.append("metrics.path: must start with '/' and not be under /servers/")
    problems += listen_problems(config) + _cluster_key_problems(config)
    for name, group in config.groups.items():
        problems += _group_problems(f"groups.{name}", name, group, config)
    pinned = [name for name, server in config.servers.items() if server.pin != "off"]
    if pinned and config.pins is None:
        problems.append(f"pins.path: required when a server pins (servers.{pinned[0]}.pin is {config.servers[pinned[0]].pin!r})")
    return problems


def _server_problems(where: str, name: str, server: Server) -> list[str]:
    problems: list[str] = []
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
            problems.append(f"{where}.inherit_env[{i}]: expected a variable name or a prefix ending in '*' (like AWS_*), got {pattern!r}")
    return problems


# What may separate a member's name from its tools' (bridge/core/group.py, rule 1): a tool name may hold no other.
SEPARATOR = re.compile(r"[A-Za-z0-9_.\-]{1,8}\Z")


def _group_problems(where: str, name: str, group: Group, config: Config) -> list[str]:
    """A group's name, members and separator: every name it shows keeps to MCP's tool-name
    rules but for what a server itself offers, and splits back to one member only."""
    problems: list[str] = []
    if not SERVER_NAME.match(name):
        problems.append(f"{where}: name must be 1-64 letters, digits, '_', '.' or '-' (it is part of the URL)")
    if not SEPARATOR.match(group.separator):
        problems.append(f"{where}.separator: 1 to 8 of A-Z a-z 0-9 _ - . (a tool name may hold no other), got {group.separator!r}")
    if not group.servers:
        problems.append(f"{where}.servers: at least one server is required")
    for i, member in enumerate(group.servers):
        if member != "*" and member not in config.servers:
            problems.append(f"{where}.servers[{i}]: unknown server {member!r}")
        elif group.servers.index(member) != i:
            problems.append(f"{where}.servers[{i}]: {member!r} is listed twice")
    members = group_members(config, name)
    for member in members:
        for other in members:
            if other != member and other.startswith(member + group.separator):
                problems.append(f"{where}.servers: {member!r} followed by {group.separator!r} begins {other!r}: a tool name would name either")
    if group.list_timeout <= 0:
        problems.append(f"{where}.list_timeout: must be more than 0")
    return problems


def _token_problems(where: str, token: Token, seen: set[str], config: Config) -> list[str]:
    problems: list[str] = []
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
    return problems


def _limits_problems(config: Config) -> list[str]:
    problems: list[str] = []
    limits = config.limits
    # Processes that run with no session: one per shared server, and every pool's warm ones.
    ahead = sum(1 if server.mode == "shared" else server.pool.warm for server in config.servers.values())
    if limits.max_processes is not None and ahead > limits.max_processes:
        problems.append(f"limits.max_processes: smaller than the shared servers and the pools' warm processes together ({ahead})")
    if limits.input_buffer() < limits.max_message_bytes:
        problems.append("limits.server_input_buffer: smaller than limits.max_message_bytes (no message would fit)")
    if limits.slow_bytes < limits.max_message_bytes:
        problems.append("limits.session_queue_bytes: smaller than limits.max_message_bytes (one message would drop a session)")
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
