"""Faults in the daemon's entry points: the app, the command line, ctl, the runtime."""

from __future__ import annotations

from faults.fault import Fault

TESTS: dict[str, tuple[str, ...]] = {}

FAULTS: list[Fault] = []  # fmt: skip
