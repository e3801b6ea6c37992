"""What the mux knows of one client session (`Peer`), and what it may be asked: the
capability each server request needs (rule 4) and whether a session's declared
capabilities cover a given request."""

from __future__ import annotations

from typing import Any

from bridge.access.policy import View
from bridge.core.mux.actions import Call, ServerRequest
from bridge.core.mux.states import PeerState
from bridge.protocol.jsonrpc import Message, RequestId

# Server request -> the client capability answering it needs.
CAPABILITY_FOR = {
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
    "elicitation/create": "elicitation",
}
ASKABLE = frozenset(CAPABILITY_FOR.values())  # what a session declares to be asked anything

_OPEN, _STATELESS = PeerState.OPEN, PeerState.STATELESS


class Peer:
    """One client session. One is made per session, and a 2026-07-28 request is a session:
    written out rather than a dataclass, whose default factories cost a call each (seven of
    them, most for tables a request never fills). Its `state` changes only through
    `states.PEER_TRANSITIONS` (`Mux._peer_moves`)."""

    __slots__ = (
        "id", "principal", "view", "calls", "server_requests", "capabilities", "state", "can_answer",
        "protocol_version", "level", "subscriptions", "tasks", "client_tasks", "elicitations", "last_active",
        "waiting_init", "notices",
    )  # fmt: skip

    def __init__(self, session: str, principal: str | None, view: View | None, last_active: int) -> None:
        self.id = session
        self.principal = principal  # who opened it: a trust boundary (None: no auth configured)
        self.view = view  # the tools, prompts and resources it may see; None: all
        self.calls: dict[RequestId, Call] = {}
        self.server_requests: dict[int, ServerRequest] = {}
        self.capabilities: dict[str, Any] = {}
        self.state = _OPEN
        self.can_answer = False  # declared a capability the server may ask it to use
        self.protocol_version: str | None = None
        self.level: int | None = None
        self.subscriptions: set[str] = set()
        self.tasks: set[str] = set()  # server-side tasks it created
        self.client_tasks: set[str] = set()  # its own tasks, polled by the server
        self.elicitations: set[str] = set()
        self.last_active = last_active
        self.waiting_init: RequestId | None = None  # its initialize, waiting for the process to be ready
        self.notices: frozenset[str] | None = None  # list changes it hears; None: every one (handshake-era sessions)

    def owns_nothing(self) -> bool:
        """Nothing in flight and nothing owned: no call, no server request, task, elicitation or subscription."""
        return not (self.calls or self.server_requests or self.subscriptions or self.tasks or self.client_tasks or self.elicitations)


def can_handle(capabilities: dict[str, Any], wanted: str, msg: Message) -> bool:
    """Whether a session that declared `capabilities` can answer the server request `msg`,
    which needs `wanted`: sampling with tools or context, and URL elicitation, need the
    sub-capability too."""
    cap = capabilities.get(wanted)
    if cap.__class__ is not dict:
        return False
    params = msg.get("params")
    if params.__class__ is not dict:
        return True
    if wanted == "sampling":
        if ("tools" in params or "toolChoice" in params) and "tools" not in cap:
            return False
        return params.get("includeContext", "none") == "none" or "context" in cap
    if wanted == "elicitation" and params.get("mode") == "url":
        return "url" in cap
    return True


def hears(peer: Peer, level: int | None) -> bool:
    """Whether a notification about no one in particular (a log message at `level`, or
    another when None) reaches `peer`. A stateless session hears only while its own call is
    in flight, and log messages only at the level it asked for, if any."""
    if peer.state is _STATELESS and (not peer.calls or (level is not None and peer.level is None)):
        return False
    return level is None or peer.level is None or level >= peer.level
