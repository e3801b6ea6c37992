"""Faults in the gateway: its sessions, placements and processes' glue."""

from __future__ import annotations

from faults.fault import Fault

TESTS: dict[str, tuple[str, ...]] = {
    'bridge/gateway/sessions.py': ('tests/unit/test_sessions_unit.py',),
}

FAULTS: list[Fault] = [
    Fault('sessions-id-short', 'bridge/gateway/sessions.py', '    return secrets.token_hex(16)  # 128 bits from the OS CSPRNG', '    return secrets.token_hex(4)  # 128 bits from the OS CSPRNG'),
    Fault('spares-unbounded', 'bridge/gateway/sessions.py', '        if self.count >= self.limit:\n            return False', '        if False:\n            return False'),
    Fault('spares-first-kept-taken-first', 'bridge/gateway/sessions.py', '        session = kept.pop()', '        session = kept.pop(0)'),
    Fault('spares-dropped-twice', 'bridge/gateway/sessions.py', '        if kept is not None and session in kept:', '        if kept is not None:'),
    Fault('spares-drop-miscounts', 'bridge/gateway/sessions.py', '                del self._by_kind[kind]\n            self.count -= 1', '                del self._by_kind[kind]'),
]  # fmt: skip
