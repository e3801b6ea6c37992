"""MCP 2026-07-28 (the stateless revision) as the bridge serves it to clients: no IO.

A 2026-07-28 request carries its own protocol version and client capabilities in
`params._meta`; this module says what such a request is (`envelope`), checks
it against the HTTP headers that mirror it (`check_headers`), answers what
the bridge answers itself (removed methods, `server/discover`), turns a legacy
server's answer into a 2026-07-28 result (`complete`), and seals and opens the
`requestState` of a call waiting for its client's input (`StateKeys`).

Everything here raises `StatelessError` for a request to refuse: the JSON-RPC
error it becomes and the HTTP status the spec gives it.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from bridge.protocol import jsonrpc, media
from bridge.protocol.jsonrpc import Message, RequestId
from bridge.protocol.mcp import (
    CACHEABLE,
    CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    HEADER_MISMATCH,
    LISTEN,
    LOG_LEVEL_KEY,
    LOG_LEVELS,
    MISSING_CAPABILITY,
    REMOVED,
    RESOURCE_NOT_FOUND_2025,
    SERVER_INFO_KEY,
    STATELESS_VERSION,
    STATELESS_VERSIONS,
    SUPPORTED_VERSIONS,
    UNSUPPORTED_VERSION,
    VERSION_KEY,
)

# Method -> the parameter `Mcp-Name` mirrors.
NAMED: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


# The HTTP status of an error answered as one JSON body, by code (as the official SDKs map them).
STATUS_FOR: Final = {
    jsonrpc.PARSE_ERROR: 400,
    jsonrpc.INVALID_REQUEST: 400,
    jsonrpc.INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_CAPABILITY: 400,
    UNSUPPORTED_VERSION: 400,
    jsonrpc.METHOD_NOT_FOUND: 404,
}


# subscriptions/listen filter field -> (the notification it asks for, the server capability it needs).
LIST_CHANGES: Final = {
    "toolsListChanged": ("notifications/tools/list_changed", "tools"),
    "promptsListChanged": ("notifications/prompts/list_changed", "prompts"),
    "resourcesListChanged": ("notifications/resources/list_changed", "resources"),
}


RESOURCE_UPDATED: Final = "notifications/resources/updated"


class StatelessError(Exception):
    """A 2026-07-28 request refused: its JSON-RPC error, and the HTTP status that carries it."""

    def __init__(self, code: int, message: str, data: Any = None, request_id: RequestId | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.request_id = request_id
        self.status = STATUS_FOR.get(code, 400) if status is None else status

    def body(self) -> bytes:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return jsonrpc.encode({"jsonrpc": "2.0", "id": self.request_id, "error": error})


def is_stateless(payload: Any) -> bool:
    """Whether a decoded POST body is a 2026-07-28 message: its `_meta` names a protocol version."""
    if payload.__class__ is not dict:
        return False
    params = payload.get("params")
    if params.__class__ is not dict:
        return False
    meta = params.get("_meta")
    return meta.__class__ is dict and VERSION_KEY in meta


class Envelope(msgspec.Struct, frozen=True):
    """What a 2026-07-28 request says about itself in `_meta`."""

    version: str
    capabilities: dict[str, Any]
    client_info: Any
    log_level: str | None


class Headers(msgspec.Struct, frozen=True):
    """The headers of a POST that mirror its body (None: absent); `params` by lower-case name."""

    version: str | None
    method: str | None
    name: str | None
    params: Mapping[str, str]
    repeated: str | None = None  # a mirroring header sent more than once


def admit(msg: Message, headers: Headers, accept: str, tools: Mapping[str, Mapping[str, tuple[str, ...]]] | None) -> Envelope:
    """Every check a 2026-07-28 request (already classified a request) passes before it is
    served, in the order the spec gives them: its envelope (-32602), the headers that mirror
    it (-32020), its version (-32022), a method the revision removed (-32601), and whether
    the client takes a form its answer can have (406). `tools`: the server's tools'
    `x-mcp-header` names, when the bridge has seen them. Returns the envelope, or raises
    StatelessError."""
    env = envelope(msg)
    method = msg["method"]
    tool = None
    if tools and method == "tools/call" and (name := msg["params"].get("name")).__class__ is str:
        tool = tools.get(name)
    check_headers(msg, env, headers, tool)
    if env.version not in STATELESS_VERSIONS:
        raise unsupported(msg, env)
    if method in REMOVED:
        raise removed(msg)
    sse, json = accepts(accept)
    if not sse and (method == LISTEN or not json):
        wanted = media.SSE if method == LISTEN else f"{media.JSON} or {media.SSE}"
        raise StatelessError(jsonrpc.INVALID_REQUEST, f"{method} needs Accept: {wanted}", request_id=msg["id"], status=406)
    return env


@functools.lru_cache(maxsize=128)  # as media.quality: clients send the same few values
def accepts(accept: str) -> tuple[bool, bool]:
    """Whether an Accept takes an SSE stream, and whether one JSON body (none: both). An
    answer that may be either is one JSON body; else (`Accept: text/event-stream` alone, say)
    it is a stream, of one event if need be."""
    return (not accept or media.quality(accept, media.SSE) > 0, not accept or media.quality(accept, media.JSON) > 0)


def envelope(msg: Message) -> Envelope:
    """The request's envelope, or -32602 naming what is missing or malformed."""
    params = msg.get("params")
    meta = params.get("_meta") if params.__class__ is dict else None
    if meta.__class__ is dict:  # the common request, whole, with no more lookups than it needs
        version, capabilities, level = meta.get(VERSION_KEY), meta.get(CAPABILITIES_KEY), meta.get(LOG_LEVEL_KEY)
        if version.__class__ is str and capabilities.__class__ is dict and (level is None or (level.__class__ is str and level in _LEVELS)):
            return Envelope(version, capabilities, meta.get(CLIENT_INFO_KEY), level)
    return _refuse_envelope(msg.get("id"), meta)


def _refuse_envelope(rid: RequestId | None, meta: Any) -> Envelope:
    """`envelope` for what its common case did not take: -32602 saying what is wrong."""
    # No _meta at all, or no version in it: a session-less request that the dispatcher
    # (http/endpoints/post.py) took for a 2026-07-28 one. A legacy client that sent it gets a 400 without a 2026-07-28
    # error code (so a dual-era client falls back) that says how its sessions begin.
    meta = meta if meta.__class__ is dict else {}
    if VERSION_KEY not in meta or CAPABILITIES_KEY not in meta:
        missing = [key for key in (VERSION_KEY, CAPABILITIES_KEY) if key not in meta]
        hint = "" if VERSION_KEY in meta else " (a request without Mcp-Session-Id is a 2026-07-28 one; a 2025 session begins with initialize)"
        raise StatelessError(jsonrpc.INVALID_PARAMS, f"params._meta is missing {', '.join(missing)}{hint}", request_id=rid)
    version, capabilities = meta[VERSION_KEY], meta[CAPABILITIES_KEY]
    if not isinstance(version, str):
        raise StatelessError(jsonrpc.INVALID_PARAMS, f"params._meta[{VERSION_KEY!r}] must be a string", request_id=rid)
    if not isinstance(capabilities, dict):
        raise StatelessError(jsonrpc.INVALID_PARAMS, f"params._meta[{CAPABILITIES_KEY!r}] must be an object", request_id=rid)
    level = meta.get(LOG_LEVEL_KEY)
    if level is not None and level not in LOG_LEVELS:
        raise StatelessError(jsonrpc.INVALID_PARAMS, f"params._meta[{LOG_LEVEL_KEY!r}] must be one of {', '.join(LOG_LEVELS)}", request_id=rid)
    return Envelope(version, capabilities, meta.get(CLIENT_INFO_KEY), level)


_LEVELS = frozenset(LOG_LEVELS)


_ENVELOPE_KEYS = frozenset({VERSION_KEY, CAPABILITIES_KEY, CLIENT_INFO_KEY, LOG_LEVEL_KEY})


def strip_envelope(params: dict[str, Any]) -> None:
    """Take the envelope out of a request for a legacy server: servers on the newer SDKs
    refuse a request that carries it on a connection that began with initialize."""
    meta = params["_meta"]
    if meta.keys() <= _ENVELOPE_KEYS:  # the usual `_meta`: the envelope alone, compared in one C call
        del params["_meta"]
        return
    for key in _ENVELOPE_KEYS:
        meta.pop(key, None)


def check_headers(msg: Message, env: Envelope, headers: Headers, tool_headers: Mapping[str, tuple[str, ...]] | None) -> None:
    """-32020 when a header that mirrors the body is missing, repeated or differs from it.
    `tool_headers`: the called tool's `x-mcp-header` names (lower case) and the argument
    path each mirrors, when the bridge has seen its schema."""
    rid = msg.get("id")
    if headers.repeated is not None:
        raise _mismatch(rid, f"{headers.repeated} appears more than once")
    if headers.version != env.version:
        raise _mismatch(rid, f"MCP-Protocol-Version {headers.version!r} does not match the body's {env.version!r}")
    method = msg["method"]
    if headers.method != method:
        raise _mismatch(rid, f"Mcp-Method {headers.method!r} does not match the body's {method!r}")
    key = NAMED.get(method)
    if key is not None:
        value = msg["params"].get(key)
        if value is not None and decode_header(headers.name) != value:
            raise _mismatch(rid, f"Mcp-Name {headers.name!r} does not match the body's {key} {value!r}")
    if tool_headers:
        arguments = msg["params"].get("arguments")
        for name, path in tool_headers.items():
            value = _at(arguments, path)
            sent = headers.params.get(name)
            rendered = _render(value)
            if rendered is None:
                if sent is not None:
                    raise _mismatch(rid, f"Mcp-Param-{name} is sent but argument {'.'.join(path)} is absent")
                continue
            if sent is None:
                raise _mismatch(rid, f"Mcp-Param-{name} is missing for argument {'.'.join(path)}")
            if not _same(decode_header(sent), value, rendered):
                raise _mismatch(rid, f"Mcp-Param-{name} does not match argument {'.'.join(path)}")


def _mismatch(rid: RequestId | None, what: str) -> StatelessError:
    return StatelessError(HEADER_MISMATCH, f"header mismatch: {what}", request_id=rid)


def unsupported(msg: Message, env: Envelope) -> StatelessError:
    """-32022 for a request whose version is none of STATELESS_VERSIONS, with the supported list."""
    return StatelessError(
        UNSUPPORTED_VERSION,
        "Unsupported protocol version",
        {"supported": list(SUPPORTED_VERSIONS), "requested": env.version},
        msg.get("id"),
    )


def removed(msg: Message) -> StatelessError:
    return StatelessError(
        jsonrpc.METHOD_NOT_FOUND, f"method {msg['method']!r} was removed in protocol version {STATELESS_VERSION}", request_id=msg.get("id")
    )


def decode_header(value: str | None) -> str | None:
    """A header value in the spec's `=?base64?...?=` form decoded; None when it does not decode."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    payload = value[9:-2]
    try:
        raw = base64.b64decode(payload, validate=True)
        return raw.decode() if base64.b64encode(raw).decode() == payload else None
    except (binascii.Error, UnicodeDecodeError):
        return None


def _at(arguments: Any, path: tuple[str, ...]) -> Any:
    node = arguments
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _render(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return None


def _same(sent: str | None, value: Any, rendered: str) -> bool:
    if sent is None:
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(sent) == float(value)  # the spec: compare numbers as numbers (42.0 is 42)
        except ValueError:
            return False
    return sent == rendered


def tool_headers(tool: Any) -> tuple[str, dict[str, tuple[str, ...]]] | None:
    """A tool definition's name and its `x-mcp-header` names (lower case) with the argument
    paths they mirror: only through `properties`, as the spec allows; None when it has none."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        return None
    found: dict[str, tuple[str, ...]] = {}
    stack: list[tuple[tuple[str, ...], Any]] = [((), tool.get("inputSchema"))]
    while stack and len(found) < 64:
        path, schema = stack.pop()
        if not isinstance(schema, dict):
            continue
        header = schema.get("x-mcp-header")
        if path and isinstance(header, str) and header:
            found[header.lower()] = path
        properties = schema.get("properties")
        if isinstance(properties, dict) and len(path) < 8:
            stack.extend(((*path, k), v) for k, v in properties.items() if isinstance(k, str))
    return (tool["name"], found) if found else None


class Server(msgspec.Struct, frozen=True):
    """What results of one server are decorated with."""

    info: Any  # the server's serverInfo, from its initialize result
    cache_scope: str  # "private" or "public" (servers.NAME.cache_scope)


def discover(init_result: Mapping[str, Any]) -> dict[str, Any]:
    """`server/discover`, from the legacy server's initialize result."""
    capabilities = init_result.get("capabilities")
    capabilities = {k: v for k, v in capabilities.items() if k != "tasks"} if isinstance(capabilities, dict) else {}
    result: dict[str, Any] = {"supportedVersions": list(SUPPORTED_VERSIONS), "capabilities": capabilities}
    instructions = init_result.get("instructions")
    if isinstance(instructions, str):
        result["instructions"] = instructions
    return result


def complete(message: dict[str, Any], method: str, server: Server) -> int:
    """Make a legacy server's final answer, decoded as the mux delivers it, what a 2026-07-28
    client reads, in place, and say the HTTP status it goes with: every result gets a
    `resultType` and the server's info, cacheable ones `ttlMs` and `cacheScope`; the 2025
    code for a missing resource becomes the one 2026-07-28 uses."""
    result = message.get("result")
    if result is None:
        error = message.get("error")
        if not isinstance(error, dict):
            return 200
        code = error.get("code")
        if code == RESOURCE_NOT_FOUND_2025:
            error["code"] = code = jsonrpc.INVALID_PARAMS
        return STATUS_FOR.get(code, 200) if isinstance(code, int) else 200
    if result.__class__ is not dict:
        return 200  # not an object: nothing to decorate
    kind = result.setdefault("resultType", "complete")
    meta = result.get("_meta")
    if meta.__class__ is not dict:
        meta = result["_meta"] = {}
    if server.info is not None:
        meta[SERVER_INFO_KEY] = server.info
    if method in CACHEABLE and kind == "complete":
        result.setdefault("ttlMs", 0)  # the bridge cannot know how long a legacy server's answer holds
        result["cacheScope"] = server.cache_scope
    return 200


# An object with its members left unparsed: an answer gets another id without its result
# being decoded (a 1 MiB tool result: 0.7 ms rather than 1.9 ms for a full decode and encode).
_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def with_id(data: bytes, request_id: RequestId) -> bytes:
    """An encoded answer with the id of the request that carries it (a retry's)."""
    message: dict[str, Any] = _MEMBERS.decode(data)
    message["id"] = request_id
    return jsonrpc.encode(message)


def input_required(requests: Mapping[str, Any], state: str, server: Server) -> dict[str, Any]:
    result = {"resultType": "input_required", "inputRequests": dict(requests), "requestState": state}
    if server.info is not None:
        result["_meta"] = {SERVER_INFO_KEY: server.info}
    return result
