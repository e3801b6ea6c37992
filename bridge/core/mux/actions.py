"""What the mux asks its shell to do, and the records of what is in flight: the `Action`s
returned by every `Mux` entry point (the gateway carries them out in order), `Call` (a
request upstream) and `ServerRequest` (a server's request downstream)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from bridge.core.mux.views import Probe
from bridge.core.pins import Seen
from bridge.protocol.jsonrpc import Message, RequestId


class ToServer(NamedTuple):
    message: Message


class ToSession(NamedTuple):
    session: str
    message: Message
    # The client request this message belongs to (its own id), if any: the
    # Streamable HTTP shell picks the stream by it. `final` marks its response.
    related: RequestId | None = None
    final: bool = False
    call: Call | None = None


class Broadcast(NamedTuple):
    sessions: tuple[str, ...]
    message: Message


class Discard(NamedTuple):
    """Something a peer sent was dropped; the gateway counts it, and logs it once unless
    dropping it is routine (`log` False: a server's chatter nobody may see)."""

    reason: str
    detail: dict[str, Any]
    log: bool = True


class Abandoned(NamedTuple):
    """A client's call ended with no answer to its session: cancelled, or its session closed."""

    call: Call


class RestartServer(NamedTuple):
    reason: str


class PinsSeen(NamedTuple):
    """A list answer recorded what its server offers, or found it changed (bridge/core/pins.py):
    the gateway reports the changes and writes the pins file."""

    seen: Seen


class Timer(NamedTuple):
    """Call `Mux.timer()` after `delay` seconds (replacing any earlier timer)."""

    delay: float


Action = ToServer | ToSession | Broadcast | Discard | Abandoned | PinsSeen | RestartServer | Timer


@dataclass(slots=True, eq=False)
class Call:
    """A request in flight upstream: a client's, or the bridge's own (session None)."""

    session: str | None
    client_id: RequestId | None
    upstream_id: int
    method: str
    started: float
    token: Any = None  # the client's progress token, when it asked for progress
    sent: bool = False
    task: bool = False  # task-augmented: the result names a task the session will own
    subscribe_uri: str | None = None
    asked: int = 0  # when a server request was last attributed to this call (0: never)
    # When it was written; while it waits for a slot (rule 9), since when it waits
    # (a field of its own would cost every call its default).
    sent_at: float = 0.0
    principal: str | None = None
    target: str | None = None  # the tool or prompt name, or resource uri, of an audited call
    hidden: tuple[str, Probe] | None = None  # a probe for a name the session may not see: that name, and the probe


@dataclass(slots=True, eq=False)
class ServerRequest:
    session: str
    server_id: RequestId
    downstream_id: int
    method: str
    related: RequestId | None
    task: bool


def caller(call: Call) -> tuple[str, RequestId]:
    """The session and id a client's call is answered with (the bridge's own calls have none)."""
    assert call.session is not None and call.client_id is not None, f"{call.method} is the bridge's own call"
    return call.session, call.client_id
