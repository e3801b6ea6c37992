"""Faults in the admin API and the status page."""

from __future__ import annotations

from faults.fault import Fault

TESTS: dict[str, tuple[str, ...]] = {}

FAULTS: list[Fault] = []  # fmt: skip
