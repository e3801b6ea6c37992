"""Faults in the gateway: its sessions, placements and processes' glue."""

from __future__ import annotations

from faults.fault import Fault

TESTS: dict[str, tuple[str, ...]] = {}

FAULTS: list[Fault] = []  # fmt: skip
