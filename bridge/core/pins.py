"""Pins: what a server offers is fingerprinted, and a change is held for approval or warned about.

Rules, per server:
1. What is pinned: each tool, prompt and resource template a list answer names, by the
   fields a model is shown (`PINNED`), as the SHA-256 of those fields in canonical JSON
   (keys sorted, no spaces). An item's other fields (`title`, `_meta`, icons) may change.
2. First sight: a kind the pins file has no table of, for a server, is recorded and
   served (trust on first use) from its first list answer, every page of it
   (`Seen.recorded` on the last page). A kind with a table, even an empty one, is not
   first sight: its items are new (`mcp-bridge pins lock` writes a table of every kind
   ahead of time, so that nothing is taken on trust).
3. After that, an item whose fingerprint is pinned is served. A new item, or one whose
   fingerprint differs, is pending: withheld under `hold`, served under `warn`, reported
   once per fingerprint (`Seen.changes`). A pending item seen again unchanged is not
   reported again; one that changes again is. Under `hold`, a tool or prompt that is not
   pinned is withheld whether or not a list offered it (`Unpinned`): a server cannot have
   a name called that it never showed. At most `MAX_PENDING` items of a kind wait; past
   that, a new one is withheld (or served) unreported.
4. Approval pins what is pending (by name, or all that is not rejected); rejection keeps
   it withheld and stops its fingerprint being reported. An item that is no longer
   offered is just gone: its pin stays, so that its return unchanged is served.
5. Under `off` nothing is pinned or withheld.

Sans-IO: `ServerPins` is the table of one server, as JSON (`to_json`, `from_json`) for the
pins file the daemon reads and writes; `Gate` is where that server's muxes meet it.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec


class Mode(enum.Enum):
    OFF = "off"
    WARN = "warn"
    HOLD = "hold"


class Listed(enum.Enum):
    """What is pinned, named as in a list answer's key, with the field that names each item."""

    TOOL = "tools"
    PROMPT = "prompts"
    TEMPLATE = "resourceTemplates"


# Rule 1: the fields of each kind that are pinned, and the field that names an item.
PINNED: Mapping[Listed, tuple[str, ...]] = {
    Listed.TOOL: ("name", "description", "inputSchema", "outputSchema", "annotations"),
    Listed.PROMPT: ("name", "description", "arguments"),
    Listed.TEMPLATE: ("uriTemplate", "name", "description"),
}
NAMED_BY: Mapping[Listed, str] = {Listed.TOOL: "name", Listed.PROMPT: "name", Listed.TEMPLATE: "uriTemplate"}
# The list method whose answer offers each kind.
LISTED_BY: Mapping[str, Listed] = {"tools/list": Listed.TOOL, "prompts/list": Listed.PROMPT, "resources/templates/list": Listed.TEMPLATE}
# The kind of a principal's `View` (bridge/access/policy.py) that names the same items: a
# withheld item is hidden as a view hides one, by the same tables (bridge/core/mux/views.py).
VIEW_KIND: Mapping[Listed, str] = {Listed.TOOL: "tools", Listed.PROMPT: "prompts", Listed.TEMPLATE: "resources"}
# What a client is told when what it sees changes (an approval).
LIST_CHANGED: Mapping[Listed, str] = {
    Listed.TOOL: "notifications/tools/list_changed",
    Listed.PROMPT: "notifications/prompts/list_changed",
    Listed.TEMPLATE: "notifications/resources/list_changed",
}

_canonical = msgspec.json.Encoder(order="sorted")
MAX_PENDING = 1000  # per server and kind: a server that offers new names without end grows no table without end


class PinsError(ValueError):
    """A pins file that cannot be read as pins: the message names the key."""


def pinned_fields(kind: Listed, item: Mapping[str, Any]) -> dict[str, Any]:
    return {f: item[f] for f in PINNED[kind] if f in item}


def changed_fields(kind: Listed, old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """The pinned fields of `kind` that differ between two items (all those set, for a new one)."""
    return tuple(f for f in PINNED[kind] if old.get(f) != new.get(f))


def fingerprint(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical.encode(fields)).hexdigest()


@dataclass(frozen=True, slots=True)
class Pin:
    fingerprint: str
    fields: dict[str, Any]  # what was pinned, so that a change can be shown field by field
    first_seen: str  # ISO 8601, UTC


@dataclass(frozen=True, slots=True)
class Change:
    """An item offered that is not what is pinned (rule 3): new (`old` None) or changed."""

    kind: Listed
    name: str
    changed: tuple[str, ...]  # the pinned fields that differ (all of them, for a new item)
    old: str | None  # fingerprints
    new: str


@dataclass(frozen=True, slots=True)
class Seen:
    """What a list answer's items come to."""

    withheld: frozenset[str]  # names to leave out of the list and answer as unknown
    changes: tuple[Change, ...]  # to report: new since last reported
    recorded: bool = False  # first sight (rule 2)


class Unpinned(frozenset[str]):
    """The names of a kind `hold` withholds: those pending, and every one not pinned (rule 3).
    Equal to the set of those pending, so that a change to what is withheld is seen."""

    __slots__ = ("pinned",)
    pinned: frozenset[str]

    def __new__(cls, pending: Iterable[str], pinned: Iterable[str]) -> Unpinned:
        self = super().__new__(cls, pending)
        self.pinned = frozenset(pinned)
        return self

    def __contains__(self, name: object) -> bool:
        return frozenset.__contains__(self, name) or name not in self.pinned


@dataclass(slots=True)
class Pending:
    fingerprint: str
    fields: dict[str, Any]
    rejected: bool = False


@dataclass(slots=True)
class ServerPins:
    """One server's pins: what is pinned, and what is pending approval, by kind and name."""

    pinned: dict[Listed, dict[str, Pin]] = field(default_factory=dict)
    pending: dict[Listed, dict[str, Pending]] = field(default_factory=dict)
    recorded: set[Listed] = field(default_factory=set)  # kinds with a table: seen whole once, or in the file (rule 2)

    def see(self, kind: Listed, items: Iterable[Mapping[str, Any]], mode: Mode, now: str, last_page: bool = True) -> Seen:
        """Rules 2, 3 and 5 for the items of one list answer, or of one page of it
        (`last_page`: the answer had no `nextCursor`)."""
        if mode is Mode.OFF:
            return Seen(frozenset(), ())
        named_by = NAMED_BY[kind]
        offered = [(item[named_by], pinned_fields(kind, item)) for item in items if isinstance(item.get(named_by), str)]
        if kind not in self.recorded:
            table = self.pinned.setdefault(kind, {})
            for name, fields in offered:
                table[name] = Pin(fingerprint(fields), fields, now)
            if last_page:
                self.recorded.add(kind)
            return Seen(frozenset(), (), recorded=last_page)
        pinned, pending = self.pinned.setdefault(kind, {}), self.pending.setdefault(kind, {})
        withheld: set[str] = set()
        changes: list[Change] = []
        for name, fields in offered:
            new = fingerprint(fields)
            pin = pinned.get(name)
            if pin is not None and pin.fingerprint == new:
                pending.pop(name, None)  # changed back: nothing to approve
                continue
            waiting = pending.get(name)
            if waiting is None and len(pending) >= MAX_PENDING:
                if mode is Mode.HOLD:
                    withheld.add(name)
                continue
            if waiting is None or waiting.fingerprint != new:
                pending[name] = waiting = Pending(new, fields)
                old_fields = pin.fields if pin is not None else {}
                changed = changed_fields(kind, old_fields, fields)
                changes.append(Change(kind, name, changed, pin.fingerprint if pin is not None else None, new))
            if mode is Mode.HOLD or waiting.rejected:
                withheld.add(name)
        return Seen(frozenset(withheld), tuple(changes))

    def withheld(self, mode: Mode) -> dict[Listed, frozenset[str]]:
        """What rule 3 withholds now, by kind: under `hold`, what is pending, and of tools
        and prompts whose list has been recorded, every name that is not pinned
        (`Unpinned`); under `warn`, what was rejected."""
        if mode is Mode.OFF:
            return {}
        out: dict[Listed, frozenset[str]] = {}
        for kind in Listed:
            waiting = self.pending.get(kind, {})
            names = frozenset(n for n, p in waiting.items() if mode is Mode.HOLD or p.rejected)
            if mode is Mode.HOLD and kind is not Listed.TEMPLATE and kind in self.recorded:
                out[kind] = Unpinned(names, self.pinned.get(kind, {}))
            elif names:
                out[kind] = names
        return out

    def approve(self, now: str, names: Iterable[str] | None = None) -> list[tuple[Listed, str]]:
        """Rule 4: pin what is pending (the items named, of any kind; without names, all
        that is not rejected: a rejected item is approved only by its name)."""
        wanted = None if names is None else set(names)
        approved = []
        for kind, waiting in self.pending.items():
            for name in [n for n, p in waiting.items() if (n in wanted if wanted is not None else not p.rejected)]:
                p = waiting.pop(name)
                self.pinned.setdefault(kind, {})[name] = Pin(p.fingerprint, p.fields, now)
                approved.append((kind, name))
        return approved

    def reject(self, names: Iterable[str] | None = None) -> list[tuple[Listed, str]]:
        """Rule 4: keep what is pending withheld, and its fingerprint unreported."""
        wanted = None if names is None else set(names)
        rejected = []
        for kind, waiting in self.pending.items():
            for name, p in waiting.items():
                if (wanted is None or name in wanted) and not p.rejected:
                    p.rejected = True
                    rejected.append((kind, name))
        return rejected

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind in Listed:
            pins = self.pinned.get(kind, {})
            if pins or kind in self.recorded:
                out[kind.value] = {name: {"fingerprint": p.fingerprint, "first_seen": p.first_seen, "fields": p.fields} for name, p in sorted(pins.items())}
        rejected = {kind.value: sorted(f"{n} {p.fingerprint}" for n, p in waiting.items() if p.rejected) for kind, waiting in self.pending.items()}
        if any(rejected.values()):
            out["rejected"] = {k: v for k, v in rejected.items() if v}
        return out


class _PinFile(msgspec.Struct, forbid_unknown_fields=True):
    fingerprint: str
    first_seen: str
    fields: dict[str, Any]


def from_json(data: Mapping[str, Any]) -> dict[str, ServerPins]:
    """The pins file's `servers` map, checked: a PinsError names the key that is wrong."""
    servers: dict[str, ServerPins] = {}
    kinds = {k.value: k for k in Listed}
    for server, tables in data.items():
        if not isinstance(tables, dict):
            raise PinsError(f"servers.{server}: expected an object")
        pins = servers[server] = ServerPins()
        for key, table in tables.items():
            where = f"servers.{server}.{key}"
            if not isinstance(table, dict):
                raise PinsError(f"{where}: expected an object")
            if key == "rejected":
                for kind_name, entries in table.items():
                    if kind_name not in kinds or not isinstance(entries, list) or not all(isinstance(e, str) and " " in e for e in entries):
                        raise PinsError(f"{where}.{kind_name}: expected one of {sorted(kinds)} holding 'NAME FINGERPRINT' strings")
                    waiting = pins.pending.setdefault(kinds[kind_name], {})
                    for entry in entries:
                        name, _, fp = entry.rpartition(" ")
                        waiting[name] = Pending(fp, {}, rejected=True)
                continue
            if key not in kinds:
                raise PinsError(f"{where}: unknown kind (expected one of {sorted(kinds)} or rejected)")
            kind = kinds[key]
            pins.recorded.add(kind)
            pinned = pins.pinned.setdefault(kind, {})
            for name, pin in table.items():
                try:
                    got = msgspec.convert(pin, _PinFile)
                except msgspec.ValidationError as exc:
                    raise PinsError(f"{where}.{name}: {exc}") from None
                if fingerprint(got.fields) != got.fingerprint:
                    raise PinsError(f"{where}.{name}: fingerprint does not match fields")
                pinned[name] = Pin(got.fingerprint, got.fields, got.first_seen)
    return servers


class Gate:
    """One server's pins where its muxes meet them. Every mux of the server holds the same
    `withheld` (the views' kind -> names), changed in place: what one process's list
    answer withholds, a request on another is refused for. `see` judges one list answer
    (rules 2-5) and takes out of it what is withheld."""

    def __init__(self, pins: ServerPins, mode: Mode, now: Callable[[], str]) -> None:
        self.pins = pins
        self.mode = mode
        self._now = now  # wall time, ISO 8601: when an item was first seen or approved
        self.withheld: dict[str, frozenset[str]] = {}
        self.refresh()

    def refresh(self) -> None:
        """`withheld` after a change to the table (an answer seen, an approval, a mode)."""
        now = {VIEW_KIND[kind]: names for kind, names in self.pins.withheld(self.mode).items()}
        self.withheld.clear()
        self.withheld.update(now)

    def see(self, method: str, result: dict[str, Any]) -> Seen | None:
        """A list answer's result: judged, and what is withheld taken out of it in place.
        None for a method that lists nothing pinned, or a result with no list."""
        kind = LISTED_BY.get(method)
        if kind is None or not isinstance(items := result.get(kind.value), list):
            return None
        offered = [item for item in items if isinstance(item, dict)]
        seen = self.pins.see(kind, offered, self.mode, self._now(), last_page=result.get("nextCursor") is None)
        self.refresh()
        if (names := self.withheld.get(VIEW_KIND[kind])) is not None:
            named_by = NAMED_BY[kind]
            result[kind.value] = [item for item in items if not isinstance(item, dict) or item.get(named_by) not in names]
        return seen

    def approve(self, names: Iterable[str] | None = None) -> list[tuple[Listed, str]]:
        approved = self.pins.approve(self._now(), names)
        self.refresh()
        return approved

    def reject(self, names: Iterable[str] | None = None) -> list[tuple[Listed, str]]:
        rejected = self.pins.reject(names)
        self.refresh()
        return rejected


def kinds_changed(before: Mapping[str, frozenset[str]], after: Mapping[str, frozenset[str]]) -> list[Listed]:
    """The kinds whose withheld names differ between two `Gate.withheld` tables."""
    return [kind for kind, view_kind in VIEW_KIND.items() if before.get(view_kind, frozenset()) != after.get(view_kind, frozenset())]
