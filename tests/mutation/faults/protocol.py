"""Faults in JSON-RPC framing and classification."""

from __future__ import annotations

from faults.fault import Fault

TESTS = {
    'bridge/protocol/jsonrpc.py': ('tests/unit/test_jsonrpc.py', 'tests/unit/test_mux.py', 'tests/unit/test_mux_properties.py'),
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
]  # fmt: skip
