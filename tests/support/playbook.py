"""A playbook for the sans-IO mux (mitmproxy's idiom): what goes in, and what must come out,
in order.

    up = Placeholder()
    assert (
        play(mux)
        >> client("a", req(1, "tools/call", name="x"))
        << to_server(req(up, "tools/call", name="x"))
        >> server(result(up, {}))
        << to_session("a", result(1, {}))
    )

`>>` feeds an event to the mux; `<<` names the action expected next among everything the
events so far returned, and the assertion runs the steps: every action must be expected,
in order, and nothing may be left over. A `Placeholder` in an expected message takes the
value found there (an id the mux picked), and an event names it to send that value back.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.core.mux import Action, Broadcast, Discard, Mux, Timer, ToServer, ToSession
from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import Kind

_UNSET: Any = object()


class Placeholder:
    """A value not known when the playbook is written: bound by the first expectation it is
    compared with, equal to that value from then on."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.value: Any = _UNSET

    def __eq__(self, other: object) -> bool:
        if self.value is _UNSET:
            self.value = other
            return True
        return bool(self.value == other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Placeholder({self.name or ''}={'?' if self.value is _UNSET else repr(self.value)})"


def _resolve(value: Any) -> Any:
    if isinstance(value, Placeholder):
        assert value.value is not _UNSET, f"{value!r} is sent before any expectation bound it"
        return value.value
    if isinstance(value, dict):
        return {k: _resolve(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    return value


class Clock:
    """The one clock tests give a mux: it moves only when told."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def req(rid: Any, method: str, **params: Any) -> dict[str, Any]:
    return jsonrpc.request(rid, method, params or None)


def note(method: str, **params: Any) -> dict[str, Any]:
    return jsonrpc.notification(method, params or None)


result, error = jsonrpc.result, jsonrpc.error


# ------------------------------------------------------------------- events


@dataclass(frozen=True)
class Event:
    what: str
    feed: Callable[[Mux], list[Action]]

    def __repr__(self) -> str:
        return self.what


def client(session: str, message: Any, kind: Kind | None = None) -> Event:
    """A message (or batch) from `session`'s client."""
    return Event(f">> client {session}: {message}", lambda mux: mux.from_client(session, copy.deepcopy(_resolve(message)), kind))


def server(message: Any) -> Event:
    """A line from the server process, decoded."""
    return Event(f">> server: {message}", lambda mux: mux.from_server(copy.deepcopy(_resolve(message))))


def opened(session: str, principal: str | None = None) -> Event:
    def feed(mux: Mux) -> list[Action]:
        mux.open_session(session, principal)
        return []

    return Event(f">> open {session} ({principal})", feed)


def closed(session: str) -> Event:
    return Event(f">> close {session}", lambda mux: mux.close_session(session))


def started() -> Event:
    return Event(">> process started", lambda mux: mux.server_started())


def exited(reason: str = "server process exited") -> Event:
    return Event(f">> process exited: {reason}", lambda mux: mux.server_exited(reason))


# ------------------------------------------------------------- expectations


@dataclass(frozen=True)
class Expected:
    what: str
    matches: Callable[[Action], bool] = field(repr=False)

    def __repr__(self) -> str:
        return self.what


def to_server(message: Any) -> Expected:
    return Expected(f"<< to server: {message}", lambda a: isinstance(a, ToServer) and message == a.message)


def to_session(session: str, message: Any, *, final: bool | None = None) -> Expected:
    """A message to one session; `final`: whether it ends its call (None: either)."""
    return Expected(
        f"<< to {session}: {message}",
        lambda a: isinstance(a, ToSession) and a.session == session and message == a.message and (final is None or a.final is final),
    )


def broadcast(sessions: set[str], message: Any) -> Expected:
    return Expected(f"<< to {sorted(sessions)}: {message}", lambda a: isinstance(a, Broadcast) and set(a.sessions) == sessions and message == a.message)


def discard(reason: str) -> Expected:
    """A dropped message whose reason starts with `reason`."""
    return Expected(f"<< discard: {reason}", lambda a: isinstance(a, Discard) and a.reason.startswith(reason))


def timer() -> Expected:
    return Expected("<< timer", lambda a: isinstance(a, Timer))


# ------------------------------------------------------------------- the play


class Play:
    def __init__(self, mux: Mux) -> None:
        self.mux = mux
        self.steps: list[Event | Expected] = []

    def __rshift__(self, event: Event) -> Play:
        self.steps.append(event)
        return self

    def __lshift__(self, expected: Expected) -> Play:
        self.steps.append(expected)
        return self

    def __bool__(self) -> bool:
        produced: deque[Action] = deque()
        done: list[str] = []
        for step in self.steps:
            if isinstance(step, Event):
                produced.extend(step.feed(self.mux))
                done.append(repr(step))
                continue
            if not produced:
                raise AssertionError("\n".join([*done, f"expected {step!r}, and nothing more came"]))
            action = produced.popleft()
            if not step.matches(action):
                raise AssertionError("\n".join([*done, f"expected {step!r}", f"got {action!r}"]))
            done.append(repr(step))
        if produced:
            raise AssertionError("\n".join([*done, "and then, not expected:", *map(repr, produced)]))
        return True


def play(mux: Mux) -> Play:
    return Play(mux)
