"""The multiplexer: everything that affects routing lives in this file.

A `Mux` sits between one upstream MCP server process and the client sessions
that share it. It does no IO: the gateway feeds it what it read and carries
out the `Action`s it returns, in order. It reads time only from the `clock` it
is given (tests pass a fake one) and asks for a wake-up with a `Timer` action.

Rules
-----
1. Ids. Every client request gets a fresh upstream id (a counter); the table
   `_calls` maps it back to (session, client id). Two sessions may use the
   same ids; one session may not reuse an id while it is in flight.
2. Tokens. A request's `_meta.progressToken` is replaced by its upstream id;
   `notifications/progress` goes only to the owner, with its own token back.
3. Cancellation. A client's `notifications/cancelled` is rewritten to the
   upstream id and the call is forgotten at once, so no late result reaches
   the client. A session that goes away cancels all of its calls upstream.
   Whatever cancels a call upstream (the client, its session closing, a
   timeout, shutdown) remembers it, so what the server still says of it is
   dropped without a warning.
4. Server requests. Requests from the server get a fresh downstream id and go
   to the session of the call that asked (see `_attribute`): the owner of a
   related task, else the call in its window, else among the sessions that
   declared the needed capability. stdio does not say which call asked, and
   servers ask early, so in shared mode a question that comes within
   `attribution_window` of a call's start belongs to that call. For that to
   name one call, calls that may lead to a question take turns (`_take_turn`)
   while some session can be asked: one from a session that can be asked goes
   alone, once no call is in its window, and holds the others until it asks,
   finishes or has had its window; calls of sessions that cannot be asked go
   together (a question then reaches nobody), but not beside one that may be
   asked. Held calls take turns by principal (the one served least recently
   goes next), so one principal's queue delays another's by one window at
   most. A question in the window of a call whose session cannot answer it
   gets the server an error; whether the call needs it is the server's to say,
   and when a stateless session's call that did not declare the capability
   then fails (an error, or a result marked `isError`), its answer is -32021
   naming the capabilities asked for (a server that asks for several and goes
   on with those it gets is answered as it answers).
   After the windows, a further question goes to the call that asked last;
   while only calls of sessions that cannot answer are in flight, to nobody.
   A request about no call in flight goes to a session only when every
   session able to answer is one principal's. With no such session, or when
   that session leaves, the server gets an error at once. `ping` and, with
   configured roots, `roots/list` are answered here. A request whose call is
   known (`server_request_for`: the era translator's form of a 2026-07-28
   server's input_required) goes to that call's session with no guess.
5. Shared state. In shared mode the bridge initializes the server itself,
   answers each client's `initialize` from the cached result and absorbs
   `notifications/initialized`; `ping` is answered here. Subscriptions are
   reference-counted per uri; the server's log level is the most verbose any
   session asked for, and each session only sees messages at its level.
   Tasks belong to the session that created them. A stateless session (a
   2026-07-28 request, see `adopt`) has no handshake: it is initialized from
   its request's own capabilities, and its `server/discover` is answered from
   the cached result like `initialize` (in per-session mode the bridge then
   initializes the process itself). It hears only about its own calls: log
   messages at the level its request asked for (none without one), and of
   list changes only those it listens to; a server request with no call in
   flight never goes to it.
6. Notifications from the server go to the sessions they concern: progress
   to the caller, `resources/updated` to subscribers, task and elicitation
   notices to their owner, list changes to every initialized session. Log
   messages (by level) and anything else are about the calls in flight, if
   any: they go only to the sessions of the principal whose calls those are,
   and are dropped while calls of several principals are in flight; with
   none in flight they are about the server and go to every session.
   Principals are trust boundaries: when in doubt, nothing crosses one.
7. Restarts. When the process exits every call sent to it fails at once;
   calls that arrive while it is down wait in the backlog. A new process is
   initialized (with the bridge's or the client's own `initialize`) and gets
   the live subscriptions and log level replayed before anything else.
8. Views. A session may see only part of the server (its principal's `View`):
   lists lose what it may not see, `resources/updated` for a uri it may not
   see does not reach it, and a request that names a hidden tool, prompt,
   resource or template (`_FILTERED`, `_REFERENCES`: every request of the
   schema that names one) is answered as the server answers a name it does
   not have, learned once per mux by a probe that carries nothing of the
   request. Nothing of that request reaches the server.
9. Slots. With `max_calls` set, at most that many client calls are written to
   the process and not yet ended: answered, failed, or cancelled (by their
   client, a timeout, their session closing; a cancelled call's slot frees at
   once, as a server answers no cancelled call). Past it a call waits in a
   queue that takes turns by principal as held calls do (rule 4), and is
   written when a slot frees; a held call let through waits there too, and
   its attribution window starts when it is written. While the process is
   not ready, calls wait in that queue rather than in the backlog. The queue
   and the backlog together hold at most `max_backlog` messages: a call past
   that is refused (-32003). A waiting call that is cancelled, times out or
   whose session closes leaves the queue, and the next goes. When the process
   exits, waiting calls stay for the next one (as the backlog does); they
   fail when the server fails or the bridge shuts down. The bridge's own calls
   never wait, nor do a client's `initialize`, `ping`, `resources/subscribe`,
   `resources/unsubscribe` and `logging/setLevel`: the handshake and state
   the mux shares between sessions, whose order upstream is the mux's to keep
   (rule 5), and not what the cap guards (a server's tools racing each other).
   With no cap, this rule costs a call one attribute test (`_send_call`).

Theory of operation
-------------------
Sessions are opened and closed by the shells. Each client message passes
through `from_client`, each server message through `from_server`; process
lifecycle events through `server_started`, `server_exited`, `server_failed`;
time through `expire` and `timer`. Each returns a list of actions. What a peer
gets wrong never raises: `from_client` raises `ProtocolError` for a message
that is not valid JSON-RPC, before any state changes, and everything else
becomes an error reply or a `Discard` to log. What the shell gets wrong does:
naming a session that is not open is a `KeyError`, opening one twice a
`ValueError`. In per-session mode the same code runs with one session and
passes `initialize` and `ping` through; subscriptions and the log level are
tracked as in shared mode, for routing and for the replay after a restart.
A per-session process started ahead of its session (the warm pool: `warm`)
is not initialized, since only its session knows the version and
capabilities to initialize it with: until a session opens, a new process
gets a `ping` instead (the spec allows one before `initialize`) and is READY
once anything answers it. From then on its mux is that of a process started
for its session: the session's own `initialize` passes through, or a
stateless session's is sent from its request (`adopt`).
"""

from __future__ import annotations

import enum
import itertools
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from bridge.access.policy import View
from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import NOTIFICATION, REQUEST, RESPONSE, Kind, Message, ProtocolError, RequestId
from bridge.protocol.mcp import LATEST_PROTOCOL_VERSION, LOG_LEVELS, MISSING_CAPABILITY, PROTOCOL_VERSIONS, RELATED_TASK

_LEVEL_INDEX = {name: i for i, name in enumerate(LOG_LEVELS)}
K = TypeVar("K")
V = TypeVar("V")
# Late replies to cancelled calls are expected; remember this many to drop them quietly.
_CANCELLED_MEMORY = 4096
# Task notices kept for a result still to come (see `_task_status`).
_EARLY_NOTES = 256
# Client requests that never wait for a slot (rule 9).
_UNCAPPED = frozenset({"initialize", "ping", "resources/subscribe", "resources/unsubscribe", "logging/setLevel"})
# The bridge's own requests that bring a process up (a ping: the probe of a warm one, see
# `server_started`): unanswered within limits.initialize_timeout, the process is restarted.
_HANDSHAKE = frozenset({"initialize", "ping"})
# Requests that cannot make the server ask the client anything: never held back.
_INERT = frozenset(
    {"ping", "tools/list", "prompts/list", "resources/list", "resources/templates/list", "logging/setLevel",
     "resources/subscribe", "resources/unsubscribe", "tasks/list", "tasks/get", "tasks/cancel"}
)  # fmt: skip


class State(enum.Enum):
    DOWN = "down"  # no process; calls wait in the backlog
    STARTING = "starting"  # process up, our initialize in flight
    READY = "ready"
    FAILED = "failed"  # crash loop; calls fail at once


# Read on every call, as globals: a member lookup on an Enum class is slow in Python 3.11 (jsonrpc.REQUEST).
_READY, _FAILED = State.READY, State.FAILED


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


class Timer(NamedTuple):
    """Call `Mux.timer()` after `delay` seconds (replacing any earlier timer)."""

    delay: float


Action = ToServer | ToSession | Broadcast | Discard | Abandoned | RestartServer | Timer


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


class Peer:
    """What the mux knows of one client session. One is made per session, and a 2026-07-28
    request is a session: written out rather than a dataclass, whose default factories
    cost a call each (seven of them, most for tables a request never fills)."""

    __slots__ = (
        "id", "principal", "view", "calls", "server_requests", "capabilities", "initialized", "can_answer",
        "protocol_version", "level", "subscriptions", "tasks", "client_tasks", "elicitations", "last_active",
        "waiting_init", "stateless", "notices",
    )  # fmt: skip

    def __init__(self, session: str, principal: str | None, view: View | None, last_active: int) -> None:
        self.id = session
        self.principal = principal  # who opened it: a trust boundary (None: no auth configured)
        self.view = view  # the tools, prompts and resources it may see; None: all
        self.calls: dict[RequestId, Call] = {}
        self.server_requests: dict[int, ServerRequest] = {}
        self.capabilities: dict[str, Any] = {}
        self.initialized = False
        self.can_answer = False  # declared a capability the server may ask it to use
        self.protocol_version: str | None = None
        self.level: int | None = None
        self.subscriptions: set[str] = set()
        self.tasks: set[str] = set()  # server-side tasks it created
        self.client_tasks: set[str] = set()  # its own tasks, polled by the server
        self.elicitations: set[str] = set()
        self.last_active = last_active
        self.waiting_init: RequestId | None = None
        # A 2026-07-28 request (or subscriptions/listen): adopted, never initialized by a
        # handshake; it hears only its own calls and the notifications in `notices`.
        self.stateless = False
        self.notices: frozenset[str] | None = None  # None: every list change (handshake-era sessions)


_CAPABILITY_FOR = {
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
    "elicitation/create": "elicitation",
}
_ASKABLE = frozenset(_CAPABILITY_FOR.values())  # what a session declares to be asked anything


def negotiate(client_version: object, server_version: str) -> str:
    """The version to tell a client: its own when we know it and the server speaks it."""
    if not isinstance(client_version, str) or client_version not in PROTOCOL_VERSIONS:
        return server_version
    if server_version in PROTOCOL_VERSIONS and PROTOCOL_VERSIONS.index(client_version) > PROTOCOL_VERSIONS.index(server_version):
        return server_version
    return client_version


def bridge_initialize_params(client_name: str, version: str) -> dict[str, Any]:
    # Declare what we can route so servers enable the matching tools.
    return {
        "protocolVersion": LATEST_PROTOCOL_VERSION,
        "capabilities": {
            "roots": {"listChanged": True},
            "sampling": {"context": {}, "tools": {}},
            "elicitation": {"form": {}, "url": {}},
        },
        "clientInfo": {"name": client_name, "version": version},
    }


class _Tally:
    """How many calls wait in a mux's queues, all of them together: what the mux asks
    after every event. An attribute, not `__len__`: a `__len__` is a Python call made
    through C each time."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting = 0


class _Turns:
    """Calls waiting their turn: held back for attribution (rule 4) or for a slot (rule 9).
    One queue per principal, first in, first out within it, and the principal served least
    recently goes next. So one principal's waiting calls delay another's by at most one
    turn (the attribution window, the slot) under way, however many they are."""

    __slots__ = ("_queues", "_served", "_turn", "_tally", "waiting")

    def __init__(self, tally: _Tally) -> None:
        self._queues: dict[str | None, deque[Message]] = {}
        self._served: dict[str | None, int] = {}  # principal -> turn it was last let through at
        self._turn = itertools.count()
        self._tally = tally  # shared by the mux's queues
        self.waiting = 0  # how many calls are in this one

    def push(self, principal: str | None, msg: Message) -> None:
        queue = self._queues.get(principal)
        if queue is None:
            queue = self._queues[principal] = deque()
        queue.append(msg)
        self.waiting += 1
        self._tally.waiting += 1

    def peek(self) -> Message:
        """The call `pop` returns next."""
        return self._queues[self._next()][0]

    def pop(self) -> Message:
        principal = self._next()
        queue = self._queues[principal]
        msg = queue.popleft()
        if not queue:
            del self._queues[principal]
        self.waiting -= 1
        self._tally.waiting -= 1
        return msg

    def _next(self) -> str | None:
        return min(self._queues, key=lambda p: self._served.get(p, -1))

    def served(self, principal: str | None) -> None:
        self._served[principal] = next(self._turn)

    def forget(self, principal: str | None) -> None:
        """The principal has no session left here."""
        self._served.pop(principal, None)

    def remove(self, upstream_id: int) -> bool:
        for principal, queue in self._queues.items():
            for i, msg in enumerate(queue):
                if msg["id"] == upstream_id:
                    del queue[i]
                    self.waiting -= 1
                    self._tally.waiting -= 1
                    if not queue:
                        del self._queues[principal]
                    return True
        return False

    def clear(self) -> None:
        self._queues.clear()
        self._tally.waiting -= self.waiting
        self.waiting = 0


class Mux:
    def __init__(
        self,
        *,
        shared: bool = True,
        roots: Iterable[str] | None = None,
        max_inflight: int = 0,
        max_backlog: int = 0,
        max_subscriptions: int = 0,
        attribution_window: float = 0.0,
        max_calls: int = 0,
        client_info: tuple[str, str] = ("mcp-bridge", "0"),
        clock: Callable[[], float] = time.monotonic,
        in_flight: Counter[str | None] | None = None,
        slot_waited: Callable[[float], None] | None = None,
        warm: bool = False,
    ) -> None:
        self.shared = shared
        self.roots = None if roots is None else tuple(roots)
        self.max_inflight = max_inflight  # per session; 0: no limit (as for the two below)
        self.max_backlog = max_backlog  # messages waiting for a process that is not ready
        self.max_subscriptions = max_subscriptions  # per session
        self.attribution_window = attribution_window
        self.max_calls = max_calls  # client calls at the process at once (rule 9); 0: no cap
        self.state = State.DOWN
        self.init_result: dict[str, Any] | None = None
        self._client_info = client_info
        self._clock = clock
        # Client calls in flight by principal, shared by every mux of the daemon (rate limits).
        self._in_flight: Counter[str | None] = Counter() if in_flight is None else in_flight
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self._peers: dict[str, Peer] = {}
        self._calls: dict[int, Call] = {}
        self._server_requests: dict[int, ServerRequest] = {}
        self._server_request_ids: dict[RequestId, int] = {}
        self._subscribers: dict[str, set[str]] = {}
        self._task_owner: dict[str, str] = {}
        self._client_task_owner: dict[str, str] = {}
        self._elicitation_owner: dict[str, str] = {}
        self._upstream_level: int | None = None
        self._backlog: list[Message] = []
        self._queued = _Tally()  # calls in `_held` and `_for_slot`
        # Calls held back until the one call allowed to ask (`_holder`) asks,
        # finishes or has had `attribution_window` seconds (rule 4).
        self._held = _Turns(self._queued)
        # Calls waiting for a slot (rule 9); `_slots` holds the upstream ids of the calls
        # written under the cap, some of which may have ended since (see `_free_slot`).
        self._for_slot = _Turns(self._queued)
        self._slots: set[int] = set()
        self._slot_waited = slot_waited  # told how long each call written under the cap waited
        self._by_principal: dict[str | None, int] = {}  # open sessions per principal
        self._holder: Call | None = None
        # Calls from sessions that cannot be asked, sent while some session can be: each may
        # still ask in its window, so no call that may be asked goes meanwhile (rule 4).
        self._blind: deque[Call] = deque()
        self._askable = 0  # open sessions that can be asked (Peer.can_answer)
        self._wake_at = 0.0  # when the last Timer asked for fires (0: none pending)
        self._cancelled: OrderedDict[int, None] = OrderedDict()
        # Per-session mode replays the client's own initialize after a restart.
        self._client_init: dict[str, Any] | None = None
        # Per-session mode for a stateless request: the bridge initializes the process itself.
        self._own_init = False
        # Per-session mode, a process started ahead of its session (the warm pool): probed,
        # not initialized, until its session opens (see `server_started`).
        self.warm = warm
        self._failure = "server unavailable"
        # How the server answers a request for a tool, prompt or resource it does not have,
        # learned by asking (see `_hidden`): probe -> the answer, with the probe's name in it.
        self._unknown: dict[Probe, bytes] = {}
        # Stateless sessions' calls whose server asked for a capability they did not declare
        # (rule 4): upstream id -> those capabilities. Empty but for that rare case.
        self._refused: dict[int, set[str]] = {}
        # Task status notices that came before the result naming their task's owner.
        self._early_notes: OrderedDict[str, list[Message]] = OrderedDict()
        self._early_count = 0

    # ----------------------------------------------------------------- sessions

    def open_session(self, session: str, principal: str | None = None, view: View | None = None) -> None:
        if session in self._peers:
            raise ValueError(f"session {session!r} already open")
        self._peers[session] = Peer(session, principal, view, next(self._seq))
        self._by_principal[principal] = self._by_principal.get(principal, 0) + 1

    def adopt(
        self,
        session: str,
        capabilities: dict[str, Any],
        version: str,
        client_info: Any,
        level: str | None,
        notices: frozenset[str] = frozenset(),
    ) -> list[Action]:
        """Make an open session a stateless one (a 2026-07-28 request carries its version and
        capabilities itself): initialized, with no handshake; it hears log messages only at
        `level` (none without one) and, of what is not about its calls, only `notices`."""
        peer = self._peers[session]
        peer.capabilities = capabilities
        self._can_answer(peer, not _ASKABLE.isdisjoint(capabilities))
        peer.protocol_version = version
        peer.initialized = peer.stateless = True
        peer.notices = notices
        out: list[Action] = []
        if not self.shared and self._client_init is None:
            info = client_info if client_info.__class__ is dict else {"name": "mcp-bridge-client", "version": "0"}
            self._client_init = {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": capabilities, "clientInfo": info}
            self._own_init = True
            if self.state is _READY:  # its process is up and not initialized (a warm one): now
                out = self._send_initialize(self._client_init)
        if level is None:
            return out
        peer.level = _LEVEL_INDEX[level]
        return out + self._sync_level()

    def set_view(self, session: str, view: View | None) -> None:
        """A reload changed what the session's principal may see: from its next message on."""
        self._peers[session].view = view

    def close_session(self, session: str) -> list[Action]:
        peer = self._peers.pop(session, None)
        if peer is None:
            return []
        out: list[Action] = []
        # Most sessions close with every table empty (a 2026-07-28 request's always does,
        # once answered): each is looked at, and walked only when it holds something.
        if peer.calls:
            for call in list(peer.calls.values()):
                self._forget_call(call)
                out.append(Abandoned(call))
                if call.sent:
                    out.append(self._cancel_upstream(call, "client session closed"))
                else:
                    self._unqueue(call)
        if peer.server_requests:
            for req in list(peer.server_requests.values()):
                self._forget_server_request(req)
                out.append(ToServer(jsonrpc.error(req.server_id, jsonrpc.SESSION_CLOSED, "client session closed")))
        for uri in peer.subscriptions:
            out += self._drop_subscriber(uri, session)
        for name in peer.tasks:
            self._task_owner.pop(name, None)
        for name in peer.client_tasks:
            self._client_task_owner.pop(name, None)
        for name in peer.elicitations:
            self._elicitation_owner.pop(name, None)
        if peer.level is not None:
            out += self._sync_level()
        if peer.can_answer:
            self._askable -= 1
        principal = peer.principal
        left = self._by_principal[principal] - 1
        if left:
            self._by_principal[principal] = left
        else:
            del self._by_principal[principal]
            self._held.forget(principal)
            self._for_slot.forget(principal)
        self._forget_early_notes()
        return self._settle(out) if self._queued.waiting else out

    def sessions(self) -> list[str]:
        return list(self._peers)

    def quiet(self, session: str) -> bool:
        """Whether the session has nothing in flight and owns nothing: no call, no server
        request, task, elicitation or subscription."""
        peer = self._peers[session]
        return not (peer.calls or peer.server_requests or peer.subscriptions or peer.tasks or peer.client_tasks or peer.elicitations)

    def peer(self, session: str) -> Peer:
        return self._peers[session]

    def inflight(self, session: str | None = None) -> int:
        if session is None:
            return sum(1 for c in self._calls.values() if c.session is not None)
        return len(self._peers[session].calls)

    def table_sizes(self) -> dict[str, int]:
        """How much each routing table holds: all zero once every session has closed."""
        return {
            "sessions": len(self._peers),
            "calls": len(self._calls),
            "server_requests": len(self._server_requests) + len(self._server_request_ids),
            "subscriptions": len(self._subscribers),
            "tasks": len(self._task_owner) + len(self._client_task_owner),
            "elicitations": len(self._elicitation_owner),
            "early_task_notes": self._early_count,
            "queued_calls": sum(1 for m in self._backlog if "method" in m and "id" in m) + self._held.waiting,
            "waiting_for_slot": self._for_slot.waiting,
        }

    def waiting_for_slot(self) -> int:
        """Client calls waiting for a slot under `max_calls` (rule 9)."""
        return self._for_slot.waiting

    def is_idle(self) -> bool:
        """True when no table holds anything: what every closed session must leave behind."""
        return not any(self.table_sizes().values())

    # ------------------------------------------------------------ from clients

    def from_client(self, session: str, payload: Any, kind: Kind | None = None) -> list[Action]:
        """A client's message or batch. `kind`: a single message's, when its endpoint has
        classified it already (a 2026-07-28 request): it is not classified again."""
        peer = self._peers[session]
        if payload.__class__ is list:
            if not payload:
                raise ProtocolError(jsonrpc.INVALID_REQUEST, "invalid request: empty batch")
            kinds = []
            for i, msg in enumerate(payload):
                try:
                    kinds.append(jsonrpc.classify(msg))
                except ProtocolError as exc:
                    raise ProtocolError(exc.code, f"batch[{i}]: {exc.message}", exc.request_id) from None
            out: list[Action] = []
            for msg, kind in zip(payload, kinds, strict=True):
                out += self._from_client(peer, msg, kind)
            return self._settle(out) if self._queued.waiting else out
        out = self._from_client(peer, payload, jsonrpc.classify(payload) if kind is None else kind)
        return self._settle(out) if self._queued.waiting else out

    def _from_client(self, peer: Peer, msg: Message, kind: Kind) -> list[Action]:
        peer.last_active = next(self._seq)
        if kind is REQUEST:
            if peer.view is not None and (hidden := self._hidden(peer, msg)) is not None:
                return hidden
            handler = _CLIENT_REQUESTS.get(msg["method"]) if self.shared else _PASSTHROUGH_REQUESTS.get(msg["method"])
            if handler is None:
                return self._forward_call(peer, msg)
            return handler(self, peer, msg)
        if kind is NOTIFICATION:
            handler = _CLIENT_NOTIFICATIONS.get(msg["method"])
            if handler is None:
                return self._to_server(msg)
            return handler(self, peer, msg)
        return self._client_response(peer, msg)

    def _forward_call(self, peer: Peer, msg: Message, *, task: bool | None = None) -> list[Action]:
        client_id = msg["id"]
        if client_id in peer.calls:
            return [self._reply_error(peer, client_id, jsonrpc.INVALID_REQUEST, f"request id {client_id!r} is already in flight")]
        if self.state is _FAILED:
            return [self._reply_error(peer, client_id, jsonrpc.SERVER_UNAVAILABLE, self._failure)]
        if self.max_inflight and len(peer.calls) >= self.max_inflight:
            return [
                self._reply_error(
                    peer, client_id, jsonrpc.TOO_MANY_REQUESTS, f"too many requests in flight (limit {self.max_inflight})"
                )
            ]
        upstream_id = next(self._ids)
        params = msg.get("params")
        method = msg["method"]
        call = Call(peer.id, client_id, upstream_id, method, self._clock(), principal=peer.principal)
        if params is not None:
            if (audited := _AUDITED.get(method)) is not None:
                target = params.get(audited)
                call.target = target if isinstance(target, str) else None
            meta = params.get("_meta")
            if meta.__class__ is dict and "progressToken" in meta:
                call.token = meta["progressToken"]
                meta["progressToken"] = upstream_id
            call.task = params.get("task").__class__ is dict if task is None else task
        peer.calls[client_id] = call
        self._calls[upstream_id] = call
        in_flight = self._in_flight
        in_flight[peer.principal] = in_flight.get(peer.principal, 0) + 1  # not `+=`: Counter's __missing__ is Python
        msg["id"] = upstream_id
        if self.attribution_window and (peer.can_answer or self._askable) and call.method not in _INERT:
            return self._take_turn(peer, call, msg)
        return self._send_call(call, msg)

    def _take_turn(self, peer: Peer, call: Call, msg: Message) -> list[Action]:
        """Rule 4: a call that may lead to a question goes now, or waits its turn. One that
        may be asked goes alone: once no call is in its window. Calls of sessions that cannot
        be asked go together, but not while one that may be asked is in its window."""
        held = self._held
        if held.waiting or self._holder_active():
            held.push(peer.principal, msg)
            return []
        if not peer.can_answer:
            return self._send_blind(call, msg)
        if self._blind_left():
            held.push(peer.principal, msg)  # `_settle`, which follows, asks for the wake-up
            return []
        return self._hold_with(call, msg)

    def _send_blind(self, call: Call, msg: Message) -> list[Action]:
        self._held.served(call.principal)
        self._blind.append(call)
        return self._send_call(call, msg)

    def _blind_left(self) -> float:
        """Seconds until no call of a session that cannot be asked is in its window."""
        blind = self._blind
        calls, window, now = self._calls, self.attribution_window, self._clock()
        while blind and ((c := blind[0]).asked or c.upstream_id not in calls or (c.sent and c.sent_at + window <= now)):
            blind.popleft()
        left = 0.0
        for c in blind:
            if not c.asked and c.upstream_id in calls:
                left = max(left, c.sent_at + window - now if c.sent else window)
        return left

    def _can_answer(self, peer: Peer, able: bool) -> None:
        self._askable += able - peer.can_answer
        peer.can_answer = able

    def _hidden(self, peer: Peer, msg: Message) -> list[Action] | None:
        """A request for a tool, prompt or resource the session may not see is answered as
        the server answers one it does not have; None when the request is not one of those.
        The first such request asks the server with a name it cannot have (and nothing of
        the request's own); its answer, with the name put back, is the answer from then on."""
        method = msg["method"]
        params = msg.get("params")
        named = _FILTERED.get(method)
        if named is None and (refs := _REFERENCES.get(method)) is not None and params.__class__ is dict:
            ref = params.get("ref")
            if ref.__class__ is dict and isinstance(of := ref.get("type"), str):
                named, params = refs.get(of), ref
        if named is None or params.__class__ is not dict:
            return None
        name = params.get(named.key)
        assert peer.view is not None
        if not isinstance(name, str) or peer.view.admits(named.kind, name):
            return None
        client_id = msg["id"]
        target = name if method in _AUDITED else None
        if named.probe is None:
            return self._hidden_unsubscribe(peer, client_id, name)
        probe = named.probe
        template = self._unknown.get(probe)
        if template is None:
            msg["method"], msg["params"] = probe.method, jsonrpc.decode(probe.params)
            out = self._forward_call(peer, msg)
            call = peer.calls.get(client_id)  # none if it was refused (a limit, a failed server)
            if call is not None:
                call.hidden, call.target, call.method = (name, probe), target, method
            return out
        call = Call(peer.id, client_id, 0, method, self._clock(), principal=peer.principal, target=target)
        answer = jsonrpc.decode(template.replace(probe.name, _escaped(name)))
        answer["id"] = client_id
        return [ToSession(peer.id, answer, client_id, True, call)]

    def _hidden_unsubscribe(self, peer: Peer, client_id: RequestId, uri: str) -> list[Action]:
        """An unsubscribe from a uri the session may not see is answered as one from a uri it
        does not hold (the mux answers those itself, the server never hears of them). One it
        holds from before a reload hid the uri is withdrawn, by the bridge, as when it closes."""
        peer.subscriptions.discard(uri)
        return [*self._drop_subscriber(uri, peer.id), self._reply(peer, client_id, {})]

    def _hold_with(self, call: Call, msg: Message) -> list[Action]:
        """Let `call` through as the one call that may ask the clients something now."""
        self._holder = call
        self._held.served(self._peers[_caller(call)[0]].principal)
        self._wake_at = self._clock() + self.attribution_window
        return [*self._send_call(call, msg), Timer(self.attribution_window)]

    def _holder_active(self) -> bool:
        return self._holder_left() > 0

    def _holder_left(self) -> float:
        """Seconds the holder may still ask in; 0 once it asked, finished or had its window."""
        holder = self._holder
        if holder is None or holder.asked or holder.upstream_id not in self._calls:
            return 0.0
        if not holder.sent:
            return self.attribution_window
        return max(0.0, holder.sent_at + self.attribution_window - self._clock())

    def _settle(self, out: list[Action]) -> list[Action]:
        """After any event: let held calls through, in turn, while they may go (see
        `_take_turn`), asking for a wake-up when the next waits for calls' windows to end;
        if a slot is free, write the next call waiting for one (rule 9)."""
        held = self._held
        while held.waiting and not self._holder_active():
            msg = held.peek()
            call = self._calls.get(msg["id"])
            if call is None:
                held.pop()
            elif not self._peers[_caller(call)[0]].can_answer:
                held.pop()
                out += self._send_blind(call, msg)
            elif left := self._blind_left():
                out += self._wake_in(left)
                break
            else:
                held.pop()
                out += self._hold_with(call, msg)
        if self._for_slot.waiting and self.state is _READY:
            self._release(out)
        return out

    def timer(self) -> list[Action]:
        self._wake_at = 0.0
        out = self._settle([])
        left = self._holder_left()
        if self._held.waiting and left and not out:
            out += self._wake_in(left)  # fired early: the window is not over yet
        return out

    def _wake_in(self, delay: float) -> list[Action]:
        """A Timer for `delay` from now, unless one already asked for fires by then."""
        now = self._clock()
        if now < self._wake_at <= now + delay:
            return []
        self._wake_at = now + delay
        return [Timer(delay)]

    def _send_call(self, call: Call, msg: Message) -> list[Action]:
        if self.max_calls and call.method not in _UNCAPPED:
            return self._send_in_turn(call, msg)
        if self.state is _READY:
            call.sent = True
            call.sent_at = self._clock()
            return [ToServer(msg)]
        if self._backlog_full():
            return [self._fail(call, jsonrpc.SERVER_UNAVAILABLE, self._backlog_full_reason())]
        self._backlog.append(msg)
        return []

    def _send_in_turn(self, call: Call, msg: Message) -> list[Action]:
        """Rule 8: write the call if a slot is free and no call waits for one, else queue it."""
        now = self._clock()
        if self.state is _READY and not self._for_slot.waiting and self._free_slot():
            return [self._take_slot(call, msg, now)]
        if self._backlog_full():
            return [self._fail(call, jsonrpc.SERVER_UNAVAILABLE, self._backlog_full_reason())]
        call.sent_at = now  # since when it waits
        self._for_slot.push(call.principal, msg)
        return []

    def _free_slot(self) -> bool:
        """Whether a call may be written now. `_slots` is pruned only when it looks full,
        so that a call ending (in `_forget_call`, on every path) costs nothing here."""
        slots = self._slots
        if len(slots) < self.max_calls:
            return True
        calls = self._calls
        self._slots = slots = {upstream_id for upstream_id in slots if upstream_id in calls}
        return len(slots) < self.max_calls

    def _take_slot(self, call: Call, msg: Message, since: float) -> ToServer:
        now = self._clock()
        if self._slot_waited is not None:
            self._slot_waited(now - since)
        call.sent = True
        call.sent_at = now
        self._slots.add(call.upstream_id)
        self._for_slot.served(call.principal)
        return ToServer(msg)

    def _release(self, out: list[Action]) -> None:
        """Write calls waiting for a slot, in turn, while slots are free (the process is ready)."""
        queue = self._for_slot
        while queue.waiting and self._free_slot():
            msg = queue.pop()
            call = self._calls.get(msg["id"])
            if call is not None:
                out.append(self._take_slot(call, msg, call.sent_at))

    def _to_server(self, msg: Message) -> list[Action]:
        if self.state is _READY:
            return [ToServer(msg)]
        if self.state is _FAILED:
            return []
        if self._backlog_full():
            return [Discard(self._backlog_full_reason(), {"method": msg.get("method", "response")})]
        self._backlog.append(msg)
        return []

    def _backlog_full(self) -> bool:
        return bool(self.max_backlog) and len(self._backlog) + self._for_slot.waiting >= self.max_backlog

    def _backlog_full_reason(self) -> str:
        waiting = len(self._backlog) + self._for_slot.waiting
        if self.state is _READY:  # so only calls wait, each for a slot
            return f"{waiting} calls already wait for one of the server's {self.max_calls} slots (max_concurrent_calls, limits.server_backlog)"
        return f"server is not ready and {waiting} messages wait for it (limits.server_backlog)"

    def not_written(self, upstream_id: RequestId, reason: str) -> list[Action]:
        """The shell could not write this request to the process (its input is full):
        the call ends with an error, as if the server had refused it."""
        call = self._calls.get(upstream_id) if upstream_id.__class__ is int else None
        if call is None or not call.sent:
            return []
        if call.session is None:
            self._forget_call(call)
            return [Discard(f"the bridge's {call.method} was not written", {"reason": reason})]
        return self._settle([self._fail(call, jsonrpc.SERVER_BUSY, reason)])

    def _reply(self, peer: Peer, client_id: RequestId, value: Any) -> ToSession:
        return ToSession(peer.id, jsonrpc.result(client_id, value), client_id, True)

    def _reply_error(self, peer: Peer, client_id: RequestId, code: int, message: str) -> ToSession:
        return ToSession(peer.id, jsonrpc.error(client_id, code, message), client_id, True)

    # Requests the shared mux answers or rewrites; everything else is forwarded.

    def _initialize(self, peer: Peer, msg: Message) -> list[Action]:
        params = msg.get("params") or {}
        caps = params.get("capabilities")
        peer.capabilities = caps if caps.__class__ is dict else {}
        self._can_answer(peer, not _ASKABLE.isdisjoint(peer.capabilities))
        peer.protocol_version = params.get("protocolVersion")  # provisional until answered
        return self._answer_when_ready(peer, msg["id"])

    def _answer_when_ready(self, peer: Peer, client_id: RequestId) -> list[Action]:
        """Answer from the cached initialize result, or once there is one (or the failure)."""
        if self.state is _FAILED:
            return [self._reply_error(peer, client_id, jsonrpc.SERVER_UNAVAILABLE, self._failure)]
        if self.state is not _READY or self.init_result is None:
            peer.waiting_init = client_id
            return []
        return self._answer_initialize(peer, client_id)

    def _answer_initialize(self, peer: Peer, client_id: RequestId) -> list[Action]:
        assert self.init_result is not None
        if peer.stateless:  # server/discover: the shell makes it from the server's initialize result
            return [self._reply(peer, client_id, self.init_result)]
        version = negotiate(peer.protocol_version, self.init_result.get("protocolVersion", LATEST_PROTOCOL_VERSION))
        peer.protocol_version = version
        peer.initialized = True
        out: list[Action] = [self._reply(peer, client_id, {**self.init_result, "protocolVersion": version})]
        if self.roots is None and "roots" in peer.capabilities:
            # The server may have asked for roots before anyone could answer.
            out += self._to_server(jsonrpc.notification("notifications/roots/list_changed"))
        return out

    def _discover(self, peer: Peer, msg: Message) -> list[Action]:
        """A stateless session's server/discover is answered, like initialize, from the cached result."""
        if not peer.stateless:
            return self._forward_call(peer, msg)
        return self._answer_when_ready(peer, msg["id"])

    def _passthrough_initialize(self, peer: Peer, msg: Message) -> list[Action]:
        params = msg.get("params")
        if params.__class__ is dict:
            self._client_init = params
            caps = params.get("capabilities")
            peer.capabilities = caps if caps.__class__ is dict else {}
        return self._forward_call(peer, msg)

    def _ping(self, peer: Peer, msg: Message) -> list[Action]:
        return [self._reply(peer, msg["id"], {})]

    def _subscribe(self, peer: Peer, msg: Message) -> list[Action]:
        uri = _text(msg, "uri")
        if uri is None:
            return [self._reply_error(peer, msg["id"], jsonrpc.INVALID_PARAMS, "resources/subscribe needs a string uri")]
        if self.max_subscriptions and uri not in peer.subscriptions and len(peer.subscriptions) >= self.max_subscriptions:
            return [
                self._reply_error(
                    peer, msg["id"], jsonrpc.TOO_MANY_REQUESTS,
                    f"too many subscriptions (limit {self.max_subscriptions}, limits.max_subscriptions)",
                )
            ]  # fmt: skip
        subscribers = self._subscribers.get(uri)
        if subscribers:
            subscribers.add(peer.id)
            peer.subscriptions.add(uri)
            return [self._reply(peer, msg["id"], {})]
        client_id = msg["id"]
        out = self._forward_call(peer, msg)
        call = peer.calls.get(client_id)
        if call is not None and call.method == "resources/subscribe":
            call.subscribe_uri = uri
            self._subscribers[uri] = {peer.id}
            peer.subscriptions.add(uri)
        return out

    def _unsubscribe(self, peer: Peer, msg: Message) -> list[Action]:
        uri = _text(msg, "uri")
        if uri is None:
            return [self._reply_error(peer, msg["id"], jsonrpc.INVALID_PARAMS, "resources/unsubscribe needs a string uri")]
        subscribers = self._subscribers.get(uri)
        if uri not in peer.subscriptions or subscribers is None or len(subscribers) > 1:
            if subscribers is not None:
                subscribers.discard(peer.id)
            peer.subscriptions.discard(uri)
            return [self._reply(peer, msg["id"], {})]
        del self._subscribers[uri]
        peer.subscriptions.discard(uri)
        if self.state is not _READY:
            return [*self._unsubscribe_queued(uri), self._reply(peer, msg["id"], {})]
        return self._forward_call(peer, msg)

    def _set_level(self, peer: Peer, msg: Message) -> list[Action]:
        level = _lookup(_LEVEL_INDEX, _text(msg, "level"))
        if level is None:
            return [self._reply_error(peer, msg["id"], jsonrpc.INVALID_PARAMS, f"level must be one of {', '.join(LOG_LEVELS)}")]
        peer.level = level
        wanted = self._wanted_level()
        if wanted == self._upstream_level:
            return [self._reply(peer, msg["id"], {})]
        self._upstream_level = wanted
        assert wanted is not None  # this session's level counts
        msg["params"]["level"] = LOG_LEVELS[wanted]
        return self._forward_call(peer, msg)

    def _owned_task(self, peer: Peer, msg: Message) -> list[Action]:
        task_id = _text(msg, "taskId")
        if task_id not in peer.tasks:
            return [self._reply_error(peer, msg["id"], jsonrpc.INVALID_PARAMS, f"unknown task {task_id!r}")]
        return self._forward_call(peer, msg)

    # Client notifications.

    def _initialized(self, peer: Peer, msg: Message) -> list[Action]:
        return [] if self.shared else self._to_server(msg)

    def _client_cancelled(self, peer: Peer, msg: Message) -> list[Action]:
        call = _lookup(peer.calls, _id(msg, "requestId"))
        if call is None:
            return []
        self._forget_call(call)
        if not call.sent:
            self._unqueue(call)
            return [Abandoned(call)]
        self._remember_cancelled(call.upstream_id)
        msg["params"]["requestId"] = call.upstream_id
        return [Abandoned(call), *self._to_server(msg)]

    def _roots_changed(self, peer: Peer, msg: Message) -> list[Action]:
        if self.roots is not None:
            return []
        return self._to_server(msg)

    # Client responses to server requests.

    def _client_response(self, peer: Peer, msg: Message) -> list[Action]:
        req = peer.server_requests.get(msg["id"])
        if req is None:
            return [Discard("response to an unknown server request", {"session": peer.id, "id": msg["id"]})]
        self._forget_server_request(req)
        if req.task and "result" in msg:
            task_id = _task_id(msg["result"])
            if task_id is not None:
                peer.client_tasks.add(task_id)
                self._client_task_owner[task_id] = peer.id
        msg["id"] = req.server_id
        return self._to_server(msg)

    # ------------------------------------------------------------- from server

    def from_server(self, payload: Any) -> list[Action]:
        if payload.__class__ is not list:
            out = self._from_server(payload)
        elif not payload:
            return [Discard("empty batch from server", {})]
        else:
            out = []
            for msg in payload:
                out += self._from_server(msg)
        return self._settle(out) if self._queued.waiting else out

    def _from_server(self, msg: Any) -> list[Action]:
        try:
            kind = jsonrpc.classify(msg)
        except ProtocolError as exc:
            return [Discard(exc.message, {})]
        if kind is RESPONSE:
            return self._server_response(msg)
        if kind is NOTIFICATION:
            handler = _SERVER_NOTIFICATIONS.get(msg["method"])
            return (handler or Mux._unowned_notification)(self, msg)
        return self._server_request(msg)

    def _server_response(self, msg: Message) -> list[Action]:
        upstream_id = msg["id"]
        call = self._calls.get(upstream_id)
        if call is None or not call.sent:  # a call still held back has an id the server has not seen
            if upstream_id in self._cancelled:
                return []
            return [Discard("response with an id the bridge never issued", {"id": upstream_id})]
        refused = self._refused.pop(upstream_id, None) if self._refused else None
        self._forget_call(call)
        if call.session is None:
            return self._internal_response(call, msg)
        peer = self._peers[call.session]
        out: list[Action] = []
        if refused is not None and _failed(msg):
            msg = _missing(upstream_id, refused)
        if call.hidden is not None:
            self._learn_unknown(call, msg)
        after = _AFTER_RESPONSE.get(call.method)
        if after is not None:
            out += after(self, peer, call, msg)
        msg["id"] = call.client_id
        out.append(ToSession(peer.id, msg, call.client_id, True, call))
        return out

    def response_too_large(self, upstream_id: RequestId | None, size: int) -> list[Action]:
        """The server answered a call with a line too long to carry: fail that call."""
        call = self._calls.get(upstream_id) if upstream_id.__class__ is int else None
        if call is None or call.session is None or not call.sent:
            return [Discard("server line over limits.max_message_bytes", {"size": size, "id": upstream_id})]
        message = f"response of {size} bytes is over the limit (limits.max_message_bytes)"
        out: list[Action] = [
            Discard("server line over limits.max_message_bytes", {"size": size, "id": upstream_id}),
            self._fail(call, jsonrpc.RESPONSE_TOO_LARGE, message),
        ]
        return self._settle(out) if self._queued.waiting else out

    def _learn_unknown(self, call: Call, msg: Message) -> None:
        """The server's answer to a probe (see `_hidden`): keep it, and give it the hidden name."""
        assert call.hidden is not None
        name, probe = call.hidden
        body = {k: v for k, v in msg.items() if k != "id"}
        template = jsonrpc.encode(body)
        self._unknown[probe] = template
        msg.clear()
        msg.update(jsonrpc.decode(template.replace(probe.name, _escaped(name))))

    def _after_list(self, peer: Peer, call: Call, msg: Message) -> list[Action]:
        """Take out of a list result what the session may not see."""
        view = peer.view
        result = msg.get("result")
        if view is None or not isinstance(result, dict):
            return []
        field, kind, key = _LISTS[call.method]
        items = result.get(field)
        if isinstance(items, list):
            result[field] = [item for item in items if not isinstance(item, dict) or view.admits(kind, item.get(key))]
        return []

    def _after_initialize(self, peer: Peer, call: Call, msg: Message) -> list[Action]:
        result = msg.get("result")
        if result.__class__ is dict:
            peer.initialized = True
            peer.protocol_version = result.get("protocolVersion")
            self.init_result = result
        return []

    def _after_subscribe(self, peer: Peer, call: Call, msg: Message) -> list[Action]:
        if "error" in msg and call.subscribe_uri is not None:
            self._undo_subscribe(call.subscribe_uri, peer.id)
        return []

    def _after_task_call(self, peer: Peer, call: Call, msg: Message) -> list[Action]:
        out: list[Action] = []
        if call.task and "result" in msg:
            task_id = _task_id(msg["result"])
            if task_id is not None:
                peer.tasks.add(task_id)
                self._task_owner[task_id] = peer.id
                early = self._early_notes.pop(task_id, [])
                self._early_count -= len(early)
                out = [ToSession(peer.id, note) for note in early]
        self._forget_early_notes()
        return out

    def _after_task_list(self, peer: Peer, call: Call, msg: Message) -> list[Action]:
        result = msg.get("result")
        if self.shared and result.__class__ is dict and result.get("tasks").__class__ is list:
            result["tasks"] = [t for t in result["tasks"] if t.__class__ is dict and t.get("taskId") in peer.tasks]
        return []

    def _internal_response(self, call: Call, msg: Message) -> list[Action]:
        if call.method == "ping":
            return self._probed()
        if call.method != "initialize":
            if "error" in msg:
                return [Discard(f"server refused the bridge's {call.method}", {"error": msg["error"]})]
            return []
        result = msg.get("result")
        if result.__class__ is not dict:
            return [RestartServer(f"initialize failed: {msg.get('error')}")]
        if self.shared or self._own_init:
            self.init_result = result
        out: list[Action] = [ToServer(jsonrpc.notification("notifications/initialized"))]
        out += self._replay()
        self.state = State.READY
        out += self._flush_backlog()
        for peer in self._peers.values():
            if peer.waiting_init is not None:
                client_id, peer.waiting_init = peer.waiting_init, None
                out += self._answer_initialize(peer, client_id)
        return out

    def server_request_for(self, upstream_id: RequestId, msg: Message) -> list[Action]:
        """A server request known to come from the call `upstream_id` (the era translator's
        form of a modern server's input_required): it goes to that call's session, if able."""
        call = self._calls.get(upstream_id) if upstream_id.__class__ is int else None
        out = self._server_request(msg, self._asked_by(call, msg))
        return self._settle(out) if self._queued.waiting else out

    def _server_request(self, msg: Message, asker: tuple[Peer | None, Call | None] | None = None) -> list[Action]:
        """`asker`: the session and call it belongs to, when known; else they are guessed."""
        method = msg["method"]
        server_id = msg["id"]
        if method == "ping":
            return [ToServer(jsonrpc.result(server_id, {}))]
        if method == "roots/list" and self.roots is not None:
            return [ToServer(jsonrpc.result(server_id, {"roots": [{"uri": uri} for uri in self.roots]}))]
        if server_id in self._server_request_ids:
            return [Discard("server reused a request id still in flight", {"id": server_id, "method": method})]
        peer, call = self._attribute(msg) if asker is None else asker
        if peer is None:
            self._missing_capability(method, call)
            return [ToServer(jsonrpc.error(server_id, jsonrpc.METHOD_NOT_FOUND, f"no connected client can handle {method}"))]
        related = None
        if call is not None:
            call.asked = next(self._seq)
            related = call.client_id
        downstream_id = next(self._ids)
        params = msg.get("params")
        req = ServerRequest(peer.id, server_id, downstream_id, method, related, params.__class__ is dict and "task" in params)
        peer.server_requests[downstream_id] = req
        self._server_requests[downstream_id] = req
        self._server_request_ids[server_id] = downstream_id
        if method == "elicitation/create" and params.__class__ is dict and params.get("elicitationId").__class__ is str:
            peer.elicitations.add(params["elicitationId"])
            self._elicitation_owner[params["elicitationId"]] = peer.id
        msg["id"] = downstream_id
        return [ToSession(peer.id, msg, related)]

    def _missing_capability(self, method: str, call: Call | None) -> None:
        """A server request its session cannot answer (the server is refused it), from `call`
        (the one attributed it), or with none attributed, from the one call in flight, if
        only one is. Whether the call needs it is the server's to say: if a stateless
        session's call that did not declare the capability then fails, it fails with the
        2026-07-28 error that says which (see `_server_response`); a server that asks for
        several capabilities and goes on with those it gets is answered as it answers."""
        wanted = _CAPABILITY_FOR.get(method)
        if wanted is None:
            return
        if call is None:
            sent = [c for c in self._calls.values() if c.sent and c.session is not None]
            if len(sent) != 1:
                return
            (call,) = sent
        call.asked = next(self._seq)  # its window is over: it asked
        peer = self._peers[_caller(call)[0]]
        if peer.stateless and wanted not in peer.capabilities:
            self._refused.setdefault(call.upstream_id, set()).add(wanted)

    def _attribute(self, msg: Message) -> tuple[Peer | None, Call | None]:
        """The session (and call) a server request most likely belongs to.

        stdio carries no link from a server request to the call that caused
        it, except a related task. Servers start handling calls in the order
        they arrive and ask early, so the first request from a burst of calls
        belongs to the oldest fresh call that has not asked yet; a call that
        already asked is the best guess for a further request; with no call
        in flight, the most recently active session. Only sessions that
        declared the capability qualify. Per-session mode needs no guess.
        """
        owner = self._owner_of(msg)
        if owner is not None:
            return owner, max(owner.calls.values(), key=lambda c: c.upstream_id, default=None)
        method = msg["method"]
        if method.startswith("tasks/"):
            return None, None  # a task we do not know belongs to nobody here
        wanted = _CAPABILITY_FOR.get(method)
        fresh_since = self._clock() - self.attribution_window
        asker: tuple[Call, Peer | None] | None = None  # the call that asked last, and its session if able
        newest: Call | None = None
        busy = False  # a client's call is in flight
        for call in self._calls.values():  # oldest first
            if call.session is None or not call.sent:
                continue
            peer = self._peers[call.session]
            busy = True
            able = peer.initialized and (wanted is None or _can_handle(peer.capabilities, wanted, msg))
            if not call.asked and call.sent_at > fresh_since and self.attribution_window:
                return (peer if able else None), call  # it asked, whether or not its session can answer
            if call.asked and (asker is None or call.asked > asker[0].asked):
                asker = call, peer if able else None
            if able:
                newest = call
        if asker is not None:
            return asker[1], asker[0]
        if newest is not None:
            return self._peers[_caller(newest)[0]], newest
        if busy:
            return None, None  # only calls of sessions that cannot answer are in flight: one of them asked
        # No call in flight: the request is about no one's call. It may still go to a session
        # when every session able to answer is one principal's; never across principals.
        candidates = [
            p for p in self._peers.values()
            if p.initialized and not p.stateless and (wanted is None or _can_handle(p.capabilities, wanted, msg))
        ]  # fmt: skip
        if len({p.principal for p in candidates}) != 1:
            return None, None
        return max(candidates, key=lambda p: p.last_active), None

    def _asked_by(self, call: Call | None, msg: Message) -> tuple[Peer | None, Call | None]:
        if call is None or call.session is None:
            return None, None
        peer = self._peers[call.session]
        wanted = _CAPABILITY_FOR.get(msg["method"])
        return (peer, call) if wanted is None or _can_handle(peer.capabilities, wanted, msg) else (None, call)

    def _owner_of(self, msg: Message) -> Peer | None:
        params = msg.get("params")
        if params.__class__ is not dict:
            return None
        sid = None
        meta = params.get("_meta")
        if meta.__class__ is dict and meta.get(RELATED_TASK).__class__ is dict:
            task_id = meta[RELATED_TASK].get("taskId")
            sid = _lookup(self._task_owner, task_id if isinstance(task_id, str) else None)
        if sid is None and msg["method"].startswith("tasks/"):
            sid = _lookup(self._client_task_owner, _text(msg, "taskId"))
        return _lookup(self._peers, sid)

    # Server notifications.

    def _broadcast(self, msg: Message) -> list[Action]:
        """A server-level notice (a list changed): every session may know it. Said even with
        no one here to hear it: the gateway may have listeners of it on other processes."""
        method = msg["method"]
        targets = tuple(p.id for p in self._peers.values() if p.initialized and (p.notices is None or method in p.notices))
        return [Broadcast(targets, msg)]

    def _unowned_notification(self, msg: Message, level: int | None = None) -> list[Action]:
        """A notification nothing names an owner for (a log message, a method the bridge does
        not know). While calls are in flight it may be about them, so it goes only to the
        principal whose calls those are, and with calls of several principals in flight it
        cannot be attributed and is dropped; with none in flight it is about the server,
        and goes to every session (at `level` or a lower threshold)."""
        busy = self._busy_principals()
        if len(busy) > 1:
            return [Discard("notification during calls of several principals", {"method": msg["method"]}, log=False)]
        targets = tuple(
            p.id
            for p in self._peers.values()
            if p.initialized and (not busy or p.principal in busy) and _hears(p, level)
        )
        return [Broadcast(targets, msg)] if targets else []

    def _busy_principals(self) -> set[str | None]:
        """The principals with calls the server is working on now (two at most: enough to decide)."""
        busy: set[str | None] = set()
        for call in self._calls.values():
            if call.sent and call.session is not None:
                busy.add(call.principal)
                if len(busy) > 1:
                    break
        return busy

    def _server_progress(self, msg: Message) -> list[Action]:
        token = _id(msg, "progressToken")
        call = self._calls.get(token) if isinstance(token, int) else None
        if call is None or call.session is None or call.token is None:
            return [Discard("progress for an unknown token", {"token": token})] if token not in self._cancelled else []
        msg["params"]["progressToken"] = call.token
        return [ToSession(call.session, msg, call.client_id)]

    def _server_cancelled(self, msg: Message) -> list[Action]:
        downstream_id = _lookup(self._server_request_ids, _id(msg, "requestId"))
        if downstream_id is None:
            return []
        req = self._server_requests[downstream_id]
        self._forget_server_request(req)
        msg["params"]["requestId"] = downstream_id
        return [ToSession(req.session, msg, req.related)]

    def _resource_updated(self, msg: Message) -> list[Action]:
        uri = _text(msg, "uri")
        if uri is None:
            return [Discard("resources/updated without a uri", {})]
        targets: set[str] = set()
        for sub, sessions in self._subscribers.items():
            if uri == sub or uri.startswith(sub if sub.endswith("/") else sub + "/"):
                targets |= sessions
        peers = self._peers
        visible = tuple(sid for sid in targets if (view := peers[sid].view) is None or view.admits("resources", uri))
        return [Broadcast(visible, msg)] if visible else []

    def _log_message(self, msg: Message) -> list[Action]:
        level = _lookup(_LEVEL_INDEX, _text(msg, "level"))
        return self._unowned_notification(msg, len(LOG_LEVELS) if level is None else level)  # unknown: shown to all

    def _task_status(self, msg: Message) -> list[Action]:
        task_id = _text(msg, "taskId")
        owner = _lookup(self._task_owner, task_id)
        if owner is None and task_id is not None and self._owner_of(msg) is None and self._task_call_in_flight():
            # Servers may report a task before the result that creates it (and tells us whose
            # it is) reaches us: keep it for that result, within a bound.
            self._early_notes.setdefault(task_id, []).append(msg)
            self._early_count += 1
            if self._early_count > _EARLY_NOTES:
                _, dropped = self._early_notes.popitem(last=False)
                self._early_count -= len(dropped)
                return [Discard("task status with no owner", {"dropped": len(dropped)}, log=False)]
            return []
        return self._owned_notification(msg, owner)

    def _task_call_in_flight(self) -> bool:
        return any(c.task and c.sent for c in self._calls.values())

    def _forget_early_notes(self) -> None:
        """Once no call that may create a task is in flight, no result will claim them."""
        if self._early_count and not self._task_call_in_flight():
            self._early_notes.clear()
            self._early_count = 0

    def _elicitation_complete(self, msg: Message) -> list[Action]:
        return self._owned_notification(msg, _lookup(self._elicitation_owner, _text(msg, "elicitationId")))

    def _owned_notification(self, msg: Message, owner: str | None) -> list[Action]:
        if owner is None:
            owner_peer = self._owner_of(msg)
            owner = owner_peer.id if owner_peer is not None else None
        if owner is None:  # routine: its session has left
            return [Discard(f"{msg['method']} for nothing a session owns", {}, log=False)]
        return [ToSession(owner, msg)]

    # ----------------------------------------------------------- process events

    def server_started(self) -> list[Action]:
        """A new process is running: initialize it (shared, or a per-session replay), or
        probe it (per-session, started ahead of its session)."""
        self._cancelled.clear()
        if self.shared:
            return self._send_initialize(bridge_initialize_params(*self._client_info))
        if self._client_init is not None and (self.init_result is not None or self._own_init):
            # Only an initialize the last process answered is replayed: one still
            # queued for this process reaches it by itself, and must be the only one.
            return self._send_initialize(self._client_init)
        # Nothing to replay an initialize from (none was ever answered): the new process
        # knows of no subscription or level but what is still queued for it, so the mux
        # must not believe it does.
        self._forget_upstream_state()
        if self.warm and not self._peers:
            # Started ahead of its session: only that session knows the version and
            # capabilities to initialize it with. Until it is shown to read its input it is
            # not READY (the pool hands out only ready ones): a ping, which the spec allows
            # before initialize, and any answer to it, an error too, shows that.
            self.state = State.STARTING
            call = Call(None, None, next(self._ids), "ping", self._clock(), sent=True)
            self._calls[call.upstream_id] = call
            return [ToServer(jsonrpc.request(call.upstream_id, "ping"))]
        self.state = State.READY
        return self._flush_backlog()

    def _send_initialize(self, params: dict[str, Any]) -> list[Action]:
        self.state = State.STARTING
        call = Call(None, None, next(self._ids), "initialize", self._clock(), sent=True)
        self._calls[call.upstream_id] = call
        return [ToServer(jsonrpc.request(call.upstream_id, "initialize", params))]

    def _probed(self) -> list[Action]:
        """The process started ahead answered the probe: READY, uninitialized, for its
        session's own initialize; or, for a stateless session adopted meanwhile, initialized
        now with that session's capabilities (see `adopt`)."""
        if self._own_init and self._client_init is not None:
            return self._send_initialize(self._client_init)
        self.state = State.READY
        return self._flush_backlog()

    def server_exited(self, reason: str = "server process exited") -> list[Action]:
        """The process is gone: everything sent to it fails now; the backlog waits."""
        out: list[Action] = []
        for call in [c for c in self._calls.values() if c.sent]:
            if call.session is None:
                self._forget_call(call)
            else:
                out.append(self._fail(call, jsonrpc.SERVER_EXITED, reason))
        for req in list(self._server_requests.values()):
            self._forget_server_request(req)
            out.append(ToSession(req.session, _cancelled(req.downstream_id, reason), req.related))
        if self.state is not _FAILED:
            self.state = State.DOWN
        self._forget_early_notes()
        return self._settle(out)

    def server_failed(self, reason: str) -> list[Action]:
        """The supervisor gave up for now: fail what waits, refuse what comes."""
        self.state = State.FAILED
        self._failure = reason
        out = self.server_exited(reason)
        self._backlog.clear()
        self._held.clear()
        self._for_slot.clear()
        for call in [c for c in self._calls.values() if not c.sent]:
            out.append(self._fail(call, jsonrpc.SERVER_UNAVAILABLE, reason))
        return out + self._refuse_waiting_inits(reason)

    def shutdown(self, reason: str) -> list[Action]:
        """The bridge is stopping: every client call gets an error now and is cancelled upstream."""
        out: list[Action] = []
        for call in [c for c in self._calls.values() if c.session is not None]:
            if call.sent:
                out.append(self._cancel_upstream(call, reason))
            else:
                self._unqueue(call)
            out.append(self._fail(call, jsonrpc.SERVER_UNAVAILABLE, reason))
        return out + self._refuse_waiting_inits(reason)

    def _refuse_waiting_inits(self, reason: str) -> list[Action]:
        out: list[Action] = []
        for peer in self._peers.values():
            if peer.waiting_init is not None:
                out.append(self._reply_error(peer, peer.waiting_init, jsonrpc.SERVER_UNAVAILABLE, reason))
                peer.waiting_init = None
        return out

    def expire(self, timeout: float, initialize_timeout: float | None = None) -> list[Action]:
        """Fail calls older than `timeout` seconds; an initialize unanswered for
        `initialize_timeout` (default `timeout`) restarts the server."""
        now = self._clock()
        deadline = now - timeout
        init_deadline = now - (timeout if initialize_timeout is None else initialize_timeout)
        out: list[Action] = []
        for call in list(self._calls.values()):
            if call.session is None:
                if call.method in _HANDSHAKE and call.started < init_deadline:
                    self._forget_call(call)
                    out.append(RestartServer(f"no answer to {call.method} within {now - call.started:.0f}s"))
                elif call.started < deadline:
                    self._forget_call(call)
                continue
            if call.started >= deadline:
                continue
            if call.sent:
                out.append(self._cancel_upstream(call, "request timed out"))
            else:
                self._unqueue(call)
            out.append(self._fail(call, jsonrpc.REQUEST_TIMEOUT, f"request timed out after {timeout:g}s"))
        return self._settle(out)

    # ------------------------------------------------------------------ helpers

    def _replay(self) -> list[Action]:
        out: list[Action] = []
        queued = {c.subscribe_uri for c in self._calls.values() if not c.sent}
        for uri in self._subscribers:
            if uri not in queued:
                out.append(self._internal_call("resources/subscribe", {"uri": uri}))
        if self._upstream_level is not None:
            out.append(self._internal_call("logging/setLevel", {"level": LOG_LEVELS[self._upstream_level]}))
        return out

    def _forget_upstream_state(self) -> None:
        queued = {c.subscribe_uri for c in self._calls.values() if not c.sent}
        for uri in [u for u in self._subscribers if u not in queued]:
            for session in self._subscribers.pop(uri):
                self._peers[session].subscriptions.discard(uri)
        self._upstream_level = None

    def _internal_call(self, method: str, params: dict[str, Any]) -> ToServer:
        call = Call(None, None, next(self._ids), method, self._clock(), sent=True)
        self._calls[call.upstream_id] = call
        return ToServer(jsonrpc.request(call.upstream_id, method, params))

    def _flush_backlog(self) -> list[Action]:
        """The process is ready: what waited for it goes, then calls waiting for a slot."""
        backlog, self._backlog = self._backlog, []
        for msg in backlog:
            call = self._calls.get(msg["id"]) if "method" in msg and "id" in msg else None
            if call is not None:
                call.sent = True
                call.sent_at = self._clock()
        out: list[Action] = [ToServer(m) for m in backlog]
        if self._for_slot.waiting:
            self._release(out)
        return out

    def _unqueue(self, call: Call) -> None:
        if self._held.remove(call.upstream_id) or self._for_slot.remove(call.upstream_id):
            return
        for i, msg in enumerate(self._backlog):
            if msg.get("id") == call.upstream_id and "method" in msg:
                del self._backlog[i]
                return

    def _fail(self, call: Call, code: int, message: str) -> ToSession:
        """End a client's call with an error from the bridge, undoing what it would have done."""
        self._forget_call(call)
        session, client_id = _caller(call)
        if call.subscribe_uri is not None:
            self._undo_subscribe(call.subscribe_uri, session)
        return ToSession(session, jsonrpc.error(client_id, code, message), client_id, True, call)

    def _undo_subscribe(self, uri: str, session: str) -> None:
        subscribers = self._subscribers.get(uri)
        if subscribers is not None:
            subscribers.discard(session)
            if not subscribers:
                del self._subscribers[uri]
        peer = self._peers.get(session)
        if peer is not None:
            peer.subscriptions.discard(uri)

    def _forget_call(self, call: Call) -> None:
        if self._calls.pop(call.upstream_id, None) is None or call.session is None or call.client_id is None:
            return
        if self._refused:
            self._refused.pop(call.upstream_id, None)
        in_flight, principal = self._in_flight, call.principal
        left = in_flight[principal] - 1
        if left:
            in_flight[principal] = left
        else:
            in_flight.pop(principal)  # not `del`: Counter's __delitem__ is Python
        peer = self._peers.get(call.session)
        if peer is not None:
            peer.calls.pop(call.client_id, None)

    def _forget_server_request(self, req: ServerRequest) -> None:
        self._server_requests.pop(req.downstream_id, None)
        self._server_request_ids.pop(req.server_id, None)
        peer = self._peers.get(req.session)
        if peer is not None:
            peer.server_requests.pop(req.downstream_id, None)

    def _cancel_upstream(self, call: Call, reason: str) -> ToServer:
        """Tell the server a call of ours is off. What it still sends about it (its answer,
        progress) is then dropped quietly: it is late, not foreign."""
        self._remember_cancelled(call.upstream_id)
        return ToServer(_cancelled(call.upstream_id, reason))

    def _remember_cancelled(self, upstream_id: int) -> None:
        self._cancelled[upstream_id] = None
        if len(self._cancelled) > _CANCELLED_MEMORY:
            self._cancelled.popitem(last=False)

    def _drop_subscriber(self, uri: str, session: str) -> list[Action]:
        subscribers = self._subscribers.get(uri)
        if subscribers is None:
            return []
        subscribers.discard(session)
        if subscribers:
            return []
        del self._subscribers[uri]
        if self.state is not _READY:
            return self._unsubscribe_queued(uri)
        return [self._internal_call("resources/unsubscribe", {"uri": uri})]

    def _unsubscribe_queued(self, uri: str) -> list[Action]:
        """The last subscriber left while no process is ready. The next process is only
        told of live subscriptions, so there is nothing to undo upstream; but the
        subscribe that is still queued (whichever session sent it: the first one to
        subscribe, not necessarily the last to leave) must not reach it either."""
        out: list[Action] = []
        for call in [c for c in self._calls.values() if c.subscribe_uri == uri and not c.sent]:
            self._forget_call(call)
            self._unqueue(call)
            session, client_id = _caller(call)
            out.append(ToSession(session, jsonrpc.result(client_id, {}), client_id, True, call))
        return out

    def _wanted_level(self) -> int | None:
        levels = [p.level for p in self._peers.values() if p.level is not None]
        return min(levels) if levels else None

    def _sync_level(self) -> list[Action]:
        wanted = self._wanted_level()
        if wanted is None or wanted == self._upstream_level:
            return []
        self._upstream_level = wanted
        if self.state is not _READY:
            return []
        return [self._internal_call("logging/setLevel", {"level": LOG_LEVELS[wanted]})]


# Every field the mux looks a table up by is a string or an id: a peer that sends a
# number, a list or an object there must not break (or match) a lookup.


def _text(msg: Message, name: str) -> str | None:
    """A string parameter, or None."""
    params = msg.get("params")
    value = params.get(name) if params.__class__ is dict else None
    return value if isinstance(value, str) else None


def _id(msg: Message, name: str) -> RequestId | None:
    """A parameter that names a request or a token (a string or an integer), or None."""
    params = msg.get("params")
    value = params.get(name) if params.__class__ is dict else None
    return value if jsonrpc.is_id(value) else None


def _hears(peer: Peer, level: int | None) -> bool:
    """Whether a notification about no one in particular (a log message at `level`, or
    another when None) reaches `peer`. A stateless session hears only while its own call is
    in flight, and log messages only at the level it asked for, if any."""
    if peer.stateless and (not peer.calls or (level is not None and peer.level is None)):
        return False
    return level is None or peer.level is None or level >= peer.level


def _lookup(table: Mapping[K, V], key: K | None) -> V | None:
    return None if key is None else table.get(key)


def _caller(call: Call) -> tuple[str, RequestId]:
    """The session and id a client's call is answered with (the bridge's own calls have none)."""
    assert call.session is not None and call.client_id is not None, f"{call.method} is the bridge's own call"
    return call.session, call.client_id


def _task_id(result: object) -> str | None:
    if isinstance(result, dict):
        task = result.get("task")
        if isinstance(task, dict) and isinstance(task.get("taskId"), str):
            return str(task["taskId"])
    return None


def _cancelled(request_id: RequestId, reason: str) -> Message:
    return jsonrpc.notification("notifications/cancelled", {"requestId": request_id, "reason": reason})


def _failed(answer: Message) -> bool:
    """Whether a call's answer says it failed: an error, or a result marked `isError`."""
    if "error" in answer:
        return True
    result = answer.get("result")
    return result.__class__ is dict and result.get("isError") is True


def _missing(upstream_id: int, capabilities: set[str]) -> Message:
    """A failed call's answer, as 2026-07-28 says it: the capabilities its server asked for
    that the request did not declare (rule 4)."""
    message = f"the server asked for {', '.join(sorted(capabilities))}, which this request did not declare in its client capabilities"
    return jsonrpc.error(upstream_id, MISSING_CAPABILITY, message, {"requiredCapabilities": {c: {} for c in sorted(capabilities)}})


def _escaped(name: str) -> bytes:
    """`name` as it appears inside a JSON string."""
    return jsonrpc.encode(name)[1:-1]


class Probe(NamedTuple):
    """A request for a name no server has, with nothing of a client's request in it: the
    server's answer to it is its answer to a name it does not have (see `Mux._hidden`)."""

    method: str
    params: bytes  # encoded: each probe decodes its own copy, for the era translator to add its `_meta` to
    name: bytes  # the name it asks for, as its answer may quote it


def _probe(method: str, name: str, params: dict[str, Any]) -> Probe:
    return Probe(method, jsonrpc.encode(params), _escaped(name))


_HIDDEN_TOOL, _HIDDEN_PROMPT, _HIDDEN_RESOURCE = "mcp-bridge-hidden-tool", "mcp-bridge-hidden-prompt", "mcp-bridge://hidden"
_HIDDEN_ARGUMENT = {"name": "mcp-bridge-hidden-argument", "value": ""}  # not the client's: what it typed stays here
# Subscribing to a probe's uri would leave a subscription behind: a hidden subscribe is asked as a read.
_READ_PROBE = _probe("resources/read", _HIDDEN_RESOURCE, {"uri": _HIDDEN_RESOURCE})


class Named(NamedTuple):
    """Where a request names something a view may hide, and how to learn what the server
    answers for a name it does not have."""

    kind: str  # tools, prompts or resources: the filter that applies
    key: str  # the parameter holding the name (of `ref`, for a reference)
    probe: Probe | None  # None: the mux answers it itself (`Mux._hidden_unsubscribe`)


# Requests that name something a view may hide: method -> where the name is. Every such
# request of the MCP schema up to 2026-07-28 (whose `subscriptions/listen` subscribes
# through `resources/subscribe`).
_FILTERED = {
    "tools/call": Named("tools", "name", _probe("tools/call", _HIDDEN_TOOL, {"name": _HIDDEN_TOOL})),
    "prompts/get": Named("prompts", "name", _probe("prompts/get", _HIDDEN_PROMPT, {"name": _HIDDEN_PROMPT})),
    "resources/read": Named("resources", "uri", _READ_PROBE),
    "resources/subscribe": Named("resources", "uri", _READ_PROBE),
    "resources/unsubscribe": Named("resources", "uri", None),
}
# Requests that name it in a typed `ref`: method -> ref type -> where. A `ref/resource`
# names a resource by its uri or a template by its uriTemplate: the resources filter
# applies to both, as in the lists.
_REFERENCES = {
    "completion/complete": {
        "ref/prompt": Named("prompts", "name", _probe("completion/complete", _HIDDEN_PROMPT, {
            "ref": {"type": "ref/prompt", "name": _HIDDEN_PROMPT}, "argument": _HIDDEN_ARGUMENT})),
        "ref/resource": Named("resources", "uri", _probe("completion/complete", _HIDDEN_RESOURCE, {
            "ref": {"type": "ref/resource", "uri": _HIDDEN_RESOURCE}, "argument": _HIDDEN_ARGUMENT})),
    },
}  # fmt: skip
# List results a view filters: method -> (the list's field, kind, the field naming an item).
_LISTS = {
    "tools/list": ("tools", "tools", "name"),
    "prompts/list": ("prompts", "prompts", "name"),
    "resources/list": ("resources", "resources", "uri"),
    "resources/templates/list": ("resourceTemplates", "resources", "uriTemplate"),
}
# Calls audited (see the gateway): method -> the parameter naming what was used.
_AUDITED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def _can_handle(capabilities: dict[str, Any], wanted: str, msg: Message) -> bool:
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


_CLIENT_REQUESTS: dict[str, Callable[[Mux, Peer, Message], list[Action]]] = {
    "initialize": Mux._initialize,
    "server/discover": Mux._discover,
    "ping": Mux._ping,
    "resources/subscribe": Mux._subscribe,
    "resources/unsubscribe": Mux._unsubscribe,
    "logging/setLevel": Mux._set_level,
    "tasks/get": Mux._owned_task,
    "tasks/result": Mux._owned_task,
    "tasks/cancel": Mux._owned_task,
}
# Per-session mode: the client's own initialize and ping reach its process, and tasks are
# all its own; subscriptions and the log level are still tracked, so that updates are
# routed by the same rule as in shared mode and a restarted process gets them replayed.
_PASSTHROUGH_REQUESTS: dict[str, Callable[[Mux, Peer, Message], list[Action]]] = {
    "initialize": Mux._passthrough_initialize,
    "server/discover": Mux._discover,
    "resources/subscribe": Mux._subscribe,
    "resources/unsubscribe": Mux._unsubscribe,
    "logging/setLevel": Mux._set_level,
}
_CLIENT_NOTIFICATIONS: dict[str, Callable[[Mux, Peer, Message], list[Action]]] = {
    "notifications/initialized": Mux._initialized,
    "notifications/cancelled": Mux._client_cancelled,
    "notifications/roots/list_changed": Mux._roots_changed,
}
_AFTER_RESPONSE: dict[str, Callable[[Mux, Peer, Call, Message], list[Action]]] = {
    "initialize": Mux._after_initialize,
    "tools/list": Mux._after_list,
    "prompts/list": Mux._after_list,
    "resources/list": Mux._after_list,
    "resources/templates/list": Mux._after_list,
    "resources/subscribe": Mux._after_subscribe,
    "tools/call": Mux._after_task_call,
    "tasks/list": Mux._after_task_list,
}
_SERVER_NOTIFICATIONS: dict[str, Callable[[Mux, Message], list[Action]]] = {
    "notifications/tools/list_changed": Mux._broadcast,
    "notifications/prompts/list_changed": Mux._broadcast,
    "notifications/resources/list_changed": Mux._broadcast,
    "notifications/progress": Mux._server_progress,
    "notifications/cancelled": Mux._server_cancelled,
    "notifications/resources/updated": Mux._resource_updated,
    "notifications/message": Mux._log_message,
    "notifications/tasks/status": Mux._task_status,
    "notifications/elicitation/complete": Mux._elicitation_complete,
}
