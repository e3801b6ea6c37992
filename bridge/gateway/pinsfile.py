"""The pins file (config `pins.path`): each pinned server's `Gate` (bridge/core/pins.py),
read at start and on reload, written on every change, and what a change is reported as.

The file is JSON, `{"version": 1, "servers": {NAME: ServerPins.to_json()}}`, written
whole to a temporary file in its directory and renamed over it, so that a reader never
sees half of it. A file that cannot be written (its mode has no write bit, or its
directory or file system refuses) is a lock: approvals are refused with its reason
(`ReadOnly`), and a change is approved by editing the file and reloading.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from bridge import logs
from bridge.core.pins import Gate, Listed, Mode, PinsError, Seen, ServerPins, changed_fields, from_json
from bridge.metrics import ServerMetrics

VERSION = 1


class ReadOnly(Exception):
    """The pins file cannot be written: the message says why."""


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read(path: str) -> dict[str, ServerPins]:
    """The servers of the pins file at `path` (none when there is no file yet). Raises
    PinsError naming the key, or the reason the file cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise PinsError(f"cannot read it: {exc}") from None
    except json.JSONDecodeError as exc:
        raise PinsError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("servers"), dict):
        raise PinsError(f'expected {{"version": {VERSION}, "servers": {{...}}}}')
    return from_json(data["servers"])


def render(servers: dict[str, ServerPins]) -> str:
    body = {"version": VERSION, "servers": {name: pins.to_json() for name, pins in sorted(servers.items())}}
    return json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all; raises ReadOnly with the reason it cannot."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o644
    except OSError as exc:
        raise ReadOnly(f"{path}: {exc.strerror}") from None
    if not mode & 0o222:
        raise ReadOnly(f"{path} is read-only (mode {mode:o}): approve by editing it and reloading")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temp = tempfile.mkstemp(prefix=".pins-", dir=directory)
    except OSError as exc:
        raise ReadOnly(f"{path}: cannot write in {directory}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except OSError as exc:
        os.unlink(temp)
        raise ReadOnly(f"{path}: {exc.strerror}") from None


class PinsFile:
    """Every pinned server's pins, and the file they are kept in."""

    def __init__(self, path: str, servers: dict[str, ServerPins]) -> None:
        self.path = path
        self.servers = servers
        self.gates: dict[str, Gate] = {}
        self.log = logs.get()

    @classmethod
    def open(cls, path: str) -> PinsFile:
        """Raises PinsError naming the file and the key."""
        try:
            return cls(path, read(path))
        except PinsError as exc:
            raise PinsError(f"pins.path: {path}: {exc}") from None

    def gate(self, server: str, mode: str) -> Gate | None:
        """The gate of `server` under `mode` (the same one across reloads: what is pending
        stays pending), or None when it pins nothing."""
        if mode == "off":
            return None
        gate = self.gates.get(server)
        if gate is None:
            gate = self.gates[server] = Gate(self.servers.setdefault(server, ServerPins()), Mode(mode), now)
        elif gate.mode is not Mode(mode):
            gate.mode = Mode(mode)
            gate.refresh()
        return gate

    def reload(self) -> None:
        """The file as it is now (a reload): pins edited in it replace those held; what is
        pending and not settled by the edit stays pending. Raises PinsError."""
        servers = self.open(self.path).servers
        for name, gate in self.gates.items():
            fresh = servers.setdefault(name, ServerPins())
            for kind, waiting in gate.pins.pending.items():
                for item, pending in waiting.items():
                    pin = fresh.pinned.get(kind, {}).get(item)
                    if (pin is None or pin.fingerprint != pending.fingerprint) and item not in fresh.pending.get(kind, {}):
                        fresh.pending.setdefault(kind, {})[item] = pending
            gate.pins = fresh
            gate.refresh()
        self.servers = servers

    def seen(self, server: str, seen: Seen, metrics: ServerMetrics) -> None:
        """What a list answer of `server` came to: reported, and the file written on first sight."""
        gate = self.gates.get(server)
        if gate is None:
            return
        log = self.log.bind(server=server)
        for change in seen.changes:
            withheld = gate.mode is Mode.HOLD
            outcome = "held" if withheld else "served"
            metrics.pin_changes[change.kind.value, outcome] += 1
            log.warning(
                "pin_changed", kind=change.kind.value, name=change.name, changed=list(change.changed), old=change.old, new=change.new, outcome=outcome
            )
        if seen.recorded:
            recorded = {kind.value: len(pins) for kind, pins in gate.pins.pinned.items() if kind in gate.pins.recorded}
            try:
                self.save()
            except ReadOnly as exc:
                log.warning("pins_not_written", reason=str(exc))
            log.info("pins_recorded", items=recorded, path=self.path)

    def save(self) -> None:
        write(self.path, render(self.servers))

    def settle(self, server: str, approve: bool, names: Iterable[str] | None, metrics: ServerMetrics) -> list[tuple[Listed, str]]:
        """Approve (or reject) what is pending of `server`, by name or all, and write the file.
        Raises KeyError for a server that pins nothing, ReadOnly (nothing changed) for a file
        that cannot be written."""
        gate = self.gates[server]
        before = render(self.servers)
        write(self.path, before)  # raises ReadOnly before anything changes
        settled = gate.approve(names) if approve else gate.reject(names)
        for kind, _ in settled:
            metrics.pin_changes[kind.value, "approved" if approve else "rejected"] += 1
        if settled:
            self.save()
        return settled

    def describe(self, server: str) -> dict[str, Any]:
        """What `GET /admin/pins` says of one server: its mode, how many items are pinned of
        each kind, and each pending item with a unified diff of the fields that changed."""
        gate = self.gates[server]
        pending = []
        for kind, waiting in sorted(gate.pins.pending.items(), key=lambda kv: kv[0].value):
            pinned = gate.pins.pinned.get(kind, {})
            for name, item in sorted(waiting.items()):
                pin = pinned.get(name)
                old = pin.fields if pin is not None else {}
                changed = list(changed_fields(kind, old, item.fields))
                pending.append(
                    {
                        "kind": kind.value,
                        "name": name,
                        "status": "rejected" if item.rejected else "pending",
                        "changed": changed,
                        "old": pin.fingerprint if pin is not None else None,
                        "new": item.fingerprint,
                        "diff": diff(old, item.fields) if item.fields else "",
                    }
                )
        return {
            "mode": gate.mode.value,
            "pinned": {kind.value: len(pins) for kind, pins in sorted(gate.pins.pinned.items(), key=lambda kv: kv[0].value)},
            "pending": pending,
        }


def diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A unified diff of two items' pinned fields, each field as indented JSON."""

    def lines(fields: dict[str, Any]) -> list[str]:
        return json.dumps(fields, indent=2, sort_keys=True, ensure_ascii=False).splitlines(keepends=True) if fields else []

    return "".join(difflib.unified_diff(lines(old), lines(new), "pinned", "offered"))
