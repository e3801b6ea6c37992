"""JSON-RPC 2.0 as MCP uses it: decode once, classify, build replies.

Every message is decoded exactly once into plain dicts and lists, classified
here, routed by the mux (which rewrites ids in place), and encoded exactly
once per destination. Faults in what a peer sent are raised as the one
`ProtocolError`, which knows the JSON-RPC error it should become.
"""

from __future__ import annotations

import enum
import re
from typing import Any, Final, TypeGuard

import msgspec

Message = dict[str, Any]
RequestId = str | int

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
# Implementation-defined codes (-32000..-32099), documented in docs/reference/errors.md.
SERVER_EXITED: Final = -32000
REQUEST_TIMEOUT: Final = -32001
SERVER_UNAVAILABLE: Final = -32003
TOO_MANY_REQUESTS: Final = -32004
SESSION_CLOSED: Final = -32005
RESPONSE_TOO_LARGE: Final = -32006
SERVER_BUSY: Final = -32007  # the server is not reading its input

_decoder = msgspec.json.Decoder()
encode = msgspec.json.Encoder().encode


class Kind(enum.Enum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"


# Python 3.11's EnumType has a __getattr__, which makes every `Kind.REQUEST` a slow lookup
# (70 ns, against 7 for a global): what is read for every message is read from these.
REQUEST, NOTIFICATION, RESPONSE = Kind.REQUEST, Kind.NOTIFICATION, Kind.RESPONSE


class ProtocolError(Exception):
    """A peer sent something that is not valid JSON-RPC (or not valid here)."""

    def __init__(self, code: int, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id

    def response(self) -> Message:
        return error(self.request_id, self.code, self.message)


# How deep a client's message may nest. msgspec decodes deeper documents than the rest of the
# path can take (the encode of a 976-deep request raised RecursionError after the mux had taken
# the call: a 500); no MCP message comes near this. A document nests at most half its length
# deep, so only a longer one is looked at, and only one with that many brackets is scanned.
MAX_DEPTH: Final = 512
_STRING_OR_BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def too_deep(data: bytes) -> bool:
    """Whether `data` nests arrays and objects deeper than MAX_DEPTH (brackets in strings aside)."""
    if len(data) <= 2 * MAX_DEPTH or data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False
    depth = 0
    for token in _STRING_OR_BRACKET.findall(data):
        if token in b"[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif token in b"]}":
            depth -= 1
    return False


def decode(data: bytes | str) -> Any:
    """Parse one JSON document; any failure is a PARSE_ERROR with a one-line reason."""
    try:
        return _decoder.decode(data)
    except msgspec.MsgspecError as exc:
        raise ProtocolError(PARSE_ERROR, f"parse error: {exc}") from None
    except RecursionError:
        raise ProtocolError(PARSE_ERROR, "parse error: JSON nested too deeply") from None


def is_id(value: object) -> TypeGuard[RequestId]:
    # bool is an int subclass and floats are not MCP ids: compare exact types.
    cls = value.__class__
    return cls is int or cls is str


def classify(msg: Any) -> Kind:
    """Return the kind of a decoded message, or raise INVALID_REQUEST saying why."""
    # A request or a response, as nearly every message is, with no more lookups than that
    # takes (it runs two or three times per call); anything else is `_classify`'s to judge.
    if msg.__class__ is dict and msg.get("jsonrpc") == "2.0":
        rid = msg.get("id")
        if rid.__class__ is int or rid.__class__ is str:
            method = msg.get("method")
            if method.__class__ is str:
                params = msg.get("params")
                if params is None or params.__class__ is dict:
                    return REQUEST
            elif method is None and "method" not in msg and ("result" in msg) is not ("error" in msg):
                return RESPONSE
    return _classify(msg)


def _classify(msg: Any) -> Kind:
    if msg.__class__ is not dict:
        raise ProtocolError(INVALID_REQUEST, "invalid request: message must be a JSON object")
    rid = msg.get("id")
    if msg.get("jsonrpc") != "2.0":
        raise ProtocolError(INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"', _safe_id(rid))
    if "method" in msg:
        if msg["method"].__class__ is not str:
            raise ProtocolError(INVALID_REQUEST, 'invalid request: "method" must be a string', _safe_id(rid))
        params = msg.get("params")
        if params is not None and params.__class__ is not dict:
            raise ProtocolError(INVALID_REQUEST, 'invalid request: "params" must be an object', _safe_id(rid))
        if "id" not in msg:
            return NOTIFICATION
        if not is_id(rid):
            raise ProtocolError(INVALID_REQUEST, 'invalid request: "id" must be a string or an integer')
        return REQUEST
    if not is_id(rid):
        raise ProtocolError(INVALID_REQUEST, 'invalid response: "id" must be a string or an integer')
    if ("result" in msg) == ("error" in msg):
        raise ProtocolError(INVALID_REQUEST, 'invalid response: needs exactly one of "result" and "error"', rid)
    return RESPONSE


# A top-level id at the very start or very end of an object's text: how the
# bridge names the request whose oversized response it had to drop.
# The id must end where the head shows it ending: `"id":1.5` is not id 1.
_LEADING_ID = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d+|"[^"\\]*")\s*[,}]')
_TRAILING_ID = re.compile(rb',\s*"id"\s*:\s*(-?\d+|"[^"\\]*")\s*\}\s*$')


def sniff_id(head: bytes, tail: bytes) -> RequestId | None:
    """The id of a message too large to parse, from its first and last bytes, if it shows."""
    match = _LEADING_ID.match(head) or _TRAILING_ID.search(tail)
    if match is None:
        return None
    raw = match.group(1)
    return raw[1:-1].decode("utf-8", "replace") if raw.startswith(b'"') else int(raw)


def _safe_id(rid: object) -> RequestId | None:
    return rid if is_id(rid) else None


def error(request_id: RequestId | None, code: int, message: str, data: Any = None) -> Message:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": err}


def result(request_id: RequestId, value: Any) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def request(request_id: RequestId, method: str, params: dict[str, Any] | None = None) -> Message:
    msg: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def notification(method: str, params: dict[str, Any] | None = None) -> Message:
    msg: Message = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg
