"""Faults in the HTTP layer: access checks, bodies, forwarding."""

from __future__ import annotations

from faults.fault import Fault

TESTS = {
    'bridge/http/access.py': ('tests/daemon/test_security.py', 'tests/daemon/test_app.py'),
    'bridge/http/body.py': ('tests/daemon/test_fastpath.py',),
    'bridge/http/forward.py': ('tests/unit/test_cluster.py', 'tests/daemon/test_replicas.py'),
}

FAULTS = [
    Fault('sec-preflight-before-checks', 'bridge/http/access.py', '    result = admit(', '    if preflight and guard.origin_allowed(origin):\n        return Access(None, True)\n    result = admit('),
    Fault('sec-options-without-origin-open', 'bridge/http/access.py', 'preflight = origin is not None and method == "OPTIONS"', 'preflight = method == "OPTIONS"'),
    Fault('sec-probes-guarded', 'bridge/http/access.py', 'if request.path not in OPEN_PATHS and not request.path.startswith(WELL_KNOWN):', 'if True:'),
    Fault('body-bomb-decompressed-whole', 'bridge/http/body.py', 'piece = decoder.decompress(pending, limit + 1 - size)', 'piece = decoder.decompress(pending)'),
    Fault('body-truncated-taken', 'bridge/http/body.py', '    if decoder is None or not decoder.eof:\n        raise _undecodable', '    if decoder is None:\n        raise _undecodable'),
    Fault('body-stacked-codings-decoded-once', 'bridge/http/body.py', '    if len(codings) > 1 or codings[0] not in _CODINGS:', '    if codings[0] not in _CODINGS:'),
    Fault('body-as-sent-unbounded', 'bridge/http/body.py', '        if taken > limit:\n', '        if False:\n'),
    Fault('fwd-connection-named-forwarded', 'bridge/http/forward.py', 'skipped = HOP_BY_HOP | connection_named(headers) | dropped', 'skipped = HOP_BY_HOP | dropped'),
    Fault('fwd-te-forwarded', 'bridge/http/forward.py', '"proxy-connection", "te", "trailer"', '"proxy-connection", "trailer"'),
    Fault('fwd-not-marked', 'bridge/http/forward.py', '        out[FORWARDED_HEADER] = self.cluster.advertise\n', ''),
    Fault('fwd-last-repeat-only', 'bridge/http/forward.py', 'out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in skipped)', 'out = CIMultiDict({k: v for k, v in headers.items() if k.lower() not in skipped})'),
    Fault('fwd-owners-connection-named-relayed', 'bridge/http/forward.py', 'skipped = _OWN_RESPONSE_HEADERS | connection_named(upstream.headers)', 'skipped = _OWN_RESPONSE_HEADERS'),
]  # fmt: skip
