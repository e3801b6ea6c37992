"""Faults in the protocol layer: JSON-RPC, media types, 2026-07-28 checks, the protocol's constants."""

from __future__ import annotations

from faults.fault import Fault

TESTS = {
    'bridge/protocol/media.py': ('tests/unit/test_media.py',),
    'bridge/protocol/stateless.py': ('tests/unit/test_stateless.py',),
    'bridge/protocol/jsonrpc.py': ('tests/unit/test_jsonrpc.py', 'tests/unit/test_mux.py', 'tests/unit/test_mux_properties.py'),
    'bridge/protocol/mcp.py': ('tests/unit/test_stateless.py', 'tests/unit/test_mux.py'),
}

FAULTS = [
    Fault('rpc-error-data-null', 'bridge/protocol/jsonrpc.py', '    if data is not None:\n        err["data"] = data', '    err["data"] = data'),
    Fault('rpc-protocol-error-drops-id', 'bridge/protocol/jsonrpc.py', 'return error(self.request_id, self.code, self.message)', 'return error(None, self.code, self.message)'),
    Fault('rpc-bool-id', 'bridge/protocol/jsonrpc.py', 'return cls is int or cls is str', 'return isinstance(value, (int, str))'),
    Fault('rpc-null-params-refused', 'bridge/protocol/jsonrpc.py', 'if params is not None and params.__class__ is not dict:', 'if params.__class__ is not dict:'),
    Fault('rpc-result-and-error', 'bridge/protocol/jsonrpc.py', 'if ("result" in msg) == ("error" in msg):', 'if "result" not in msg and "error" not in msg:'),
    Fault('rpc-unsafe-id', 'bridge/protocol/jsonrpc.py', 'raise ProtocolError(INVALID_REQUEST, \'invalid request: "jsonrpc" must be "2.0"\', _safe_id(rid))', 'raise ProtocolError(INVALID_REQUEST, \'invalid request: "jsonrpc" must be "2.0"\', rid)'),
    Fault('rpc-sniff-quotes-kept', 'bridge/protocol/jsonrpc.py', 'return raw[1:-1].decode(', 'return raw.decode('),
    Fault('rpc-sniff-head-only', 'bridge/protocol/jsonrpc.py', 'match = _LEADING_ID.match(head) or _TRAILING_ID.search(tail)', 'match = _LEADING_ID.match(head)'),
    Fault('rpc-sniff-id-prefix', 'bridge/protocol/jsonrpc.py', '(-?\\d+|"[^"\\\\]*")\\s*[,}]\')', '(-?\\d+|"[^"\\\\]*")\')'),
    Fault('rpc-empty-params-dropped', 'bridge/protocol/jsonrpc.py', '    msg: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}\n    if params is not None:', '    msg: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}\n    if params:'),
    Fault('rpc-sniff-trailing-unanchored', 'bridge/protocol/jsonrpc.py', '(-?\\d+|"[^"\\\\]*")\\s*\\}\\s*$\')', '(-?\\d+|"[^"\\\\]*")\\s*\\}\')'),
    Fault('rpc-sniff-jsonrpc-first', 'bridge/protocol/jsonrpc.py', '(?:"jsonrpc"\\s*:\\s*"2\\.0"\\s*,\\s*)?', ''),
    Fault('rpc-sniff-negative', 'bridge/protocol/jsonrpc.py', '"id"\\s*:\\s*(-?\\d+|"[^"\\\\]*")\\s*[,}]\')', '"id"\\s*:\\s*(\\d+|"[^"\\\\]*")\\s*[,}]\')'),
    Fault('rpc-sniff-escapes', 'bridge/protocol/jsonrpc.py', '"id"\\s*:\\s*(-?\\d+|"[^"\\\\]*")\\s*[,}]\')', '"id"\\s*:\\s*(-?\\d+|"[^"]*")\\s*[,}]\')'),
    Fault('rpc-method-not-string', 'bridge/protocol/jsonrpc.py', '        if msg["method"].__class__ is not str:', '        if False:'),
    Fault('rpc-response-null-id', 'bridge/protocol/jsonrpc.py', "    if not is_id(rid):\n        raise ProtocolError(INVALID_REQUEST, 'invalid response", "    if False:\n        raise ProtocolError(INVALID_REQUEST, 'invalid response"),
    Fault('stateless-base64-not-canonical', 'bridge/protocol/stateless.py', 'return raw.decode() if base64.b64encode(raw).decode() == payload else None', 'return raw.decode()'),
    Fault('stateless-repeated-header-taken', 'bridge/protocol/stateless.py', '    if headers.repeated is not None:\n        raise _mismatch(', '    if False:\n        raise _mismatch('),
    Fault('stateless-version-header-unchecked', 'bridge/protocol/stateless.py', '    if headers.version != env.version:\n', '    if False:\n'),
    Fault('stateless-method-header-unchecked', 'bridge/protocol/stateless.py', '    if headers.method != method:\n', '    if False:\n'),
    Fault('stateless-name-header-unchecked', 'bridge/protocol/stateless.py', '        if value is not None and decode_header(headers.name) != value:', '        if False:'),
    Fault('stateless-missing-param-header-taken', 'bridge/protocol/stateless.py', '            if sent is None:\n                raise _mismatch(', '            if False:\n                raise _mismatch('),
    Fault('stateless-removed-method-served', 'bridge/protocol/stateless.py', '    if method in REMOVED:\n        raise removed(msg)', '    if False:\n        raise removed(msg)'),
    Fault('stateless-unknown-version-served', 'bridge/protocol/stateless.py', '    if env.version not in STATELESS_VERSIONS:\n        raise unsupported(msg, env)', '    if False:\n        raise unsupported(msg, env)'),
    Fault('stateless-listen-without-sse', 'bridge/protocol/stateless.py', '    if not sse and (method == LISTEN or not json):', '    if not sse and not json:'),
    Fault('stateless-bad-level-taken', 'bridge/protocol/stateless.py', '(level is None or (level.__class__ is str and level in _LEVELS))', '(level is None or level.__class__ is str)'),
    Fault('media-later-equal-range-wins', 'bridge/protocol/media.py', '        if specificity > best:', '        if specificity >= best:', equivalent='only two ranges of one specificity for one type differ (text/event-stream;q=0, text/event-stream): a contradiction RFC 9110 leaves open'),
    Fault('media-case-sensitive', 'bridge/protocol/media.py', '        media_range = media_range.strip().lower()', '        media_range = media_range.strip()'),
    Fault('media-bad-weight-guessed', 'bridge/protocol/media.py', '                return 0.0  # not a weight: refuse the range rather than guess', '                return 1.0  # not a weight: refuse the range rather than guess'),
    Fault('media-weight-over-one-taken', 'bridge/protocol/media.py', '            return q if 0.0 <= q <= 1.0 else 0.0', '            return q'),
    Fault('media-substring-match', 'bridge/protocol/media.py', '        if media_range == media_type:', '        if media_type in media_range:'),
    # mcp.py
    Fault('mcp-oldest-version-dropped', 'bridge/protocol/mcp.py', 'PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")', 'PROTOCOL_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")'),
    Fault('mcp-read-not-mrtr', 'bridge/protocol/mcp.py', 'MRTR_METHODS: Final = frozenset({"tools/call", "prompts/get", "resources/read"})', 'MRTR_METHODS: Final = frozenset({"tools/call", "prompts/get"})'),
    Fault('mcp-level-order', 'bridge/protocol/mcp.py', 'LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")', 'LOG_LEVELS = ("debug", "info", "warning", "notice", "error", "critical", "alert", "emergency")'),
]  # fmt: skip
