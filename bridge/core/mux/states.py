"""The states of a mux's process and of each of its peers, and the only ways they change.

Each machine is a table, (state, event) -> next state, applied by `move`, which raises on
a pair the table does not hold: a mux that tried one has a bug, and says so where it is.
The state tables in docs/architecture.md are generated from these (docs/generate.py).

Process (`State`): the process a mux sends to, as the mux sees it.

- `initialize`: the bridge's own initialize was written (shared mode; a per-session
  replay after a restart; a stateless session's, see `Mux.adopt`).
- `probe`: a process started ahead of its session (the warm pool) was sent a `ping`.
- `started`: a per-session process with nothing to initialize it from: the client's own
  initialize, queued, will.
- `probed`: anything answered the probe.  `initialized`: the initialize was answered.
- `exited`: the process is gone; a FAILED server stays FAILED until it starts again.
- `failed`: the supervisor gave up for now (a crash loop).

Peer (`PeerState`): a client session.

- `initialized`: its handshake is done (the shared mux answered its initialize from the
  cached result, or its own initialize was answered in per-session mode).
- `adopted`: a 2026-07-28 request (or `subscriptions/listen`): initialized from the
  request's own capabilities, with no handshake (`Mux.adopt`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar


class State(enum.Enum):
    DOWN = "down"  # no process; calls wait in the backlog
    STARTING = "starting"  # process up, our initialize (or the warm probe) in flight
    READY = "ready"
    FAILED = "failed"  # crash loop; calls fail at once


class PeerState(enum.Enum):
    OPEN = "open"  # opened, no handshake yet: hears nothing the server says to all
    READY = "ready"  # its handshake is done
    STATELESS = "stateless"  # a 2026-07-28 request: hears only its own calls and its `notices`


class Waiting(enum.Enum):
    """Why a client's call is not written to its process yet (`Mux.waiting`); the values
    name the events of a traced call's span (traces/spans.py, rule 5)."""

    HELD = "held"  # its turn to be the call a question is attributed to (rule 4)
    SERVER = "waiting_for_server"  # the process starting, restarting or initializing
    SLOT = "waiting_for_slot"  # a slot under `max_calls` (rule 9)


S = TypeVar("S", State, PeerState)

_DOWN, _STARTING, _READY, _FAILED = State.DOWN, State.STARTING, State.READY, State.FAILED

TRANSITIONS: dict[State, dict[str, State]] = {
    _DOWN: {"initialize": _STARTING, "probe": _STARTING, "started": _READY, "exited": _DOWN, "failed": _FAILED},
    _STARTING: {"initialize": _STARTING, "probed": _READY, "initialized": _READY, "exited": _DOWN, "failed": _FAILED},
    _READY: {"initialize": _STARTING, "exited": _DOWN, "failed": _FAILED},
    _FAILED: {"initialize": _STARTING, "probe": _STARTING, "started": _READY, "exited": _FAILED, "failed": _FAILED},
}

PEER_TRANSITIONS: dict[PeerState, dict[str, PeerState]] = {
    PeerState.OPEN: {"initialized": PeerState.READY, "adopted": PeerState.STATELESS},
    # A client may initialize again; the answer changes nothing but its version.
    PeerState.READY: {"initialized": PeerState.READY},
    PeerState.STATELESS: {},
}


class IllegalTransition(RuntimeError):
    """A mux tried a change of state its tables do not hold."""


def move(table: Mapping[S, Mapping[str, S]], state: S, event: str) -> S:
    """The state after `event` in `state`."""
    try:
        return table[state][event]
    except KeyError:
        raise IllegalTransition(f"{event!r} in state {state.name}") from None


def markdown(table: Mapping[S, Mapping[str, S]]) -> str:
    """The table as docs show it: one row per state, one column per event."""
    events = list(dict.fromkeys(event for row in table.values() for event in row))
    lines = ["| State | " + " | ".join(f"`{e}`" for e in events) + " |", "|---" * (len(events) + 1) + "|"]
    for state, row in table.items():
        cells = [row[e].name if e in row else "" for e in events]
        lines.append(f"| {state.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
