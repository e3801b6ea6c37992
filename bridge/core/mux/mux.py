"""The `Mux`: one server process and the client sessions that share it (the rules are in
this package's docstring). It holds the decisions that cross its tables; each table is a
small class of its own module, and the per-message path (`from_client` -> `_forward_call`,
`from_server` -> `_server_response`) stays inline here."""

from __future__ import annotations

import itertools
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from bridge.access.policy import View
from bridge.core.mux import attribution, views
from bridge.core.mux.actions import (
    Abandoned,
    Action,
    Broadcast,
    Call,
    Discard,
    PinsSeen,
    RestartServer,
    ServerRequest,
    Timer,
    ToServer,
    ToSession,
    caller,
)
from bridge.core.mux.notices import Owners
from bridge.core.mux.peer import ASKABLE, CAPABILITY_FOR, Peer, hears
from bridge.core.mux.shared import LEVEL_INDEX, Levels, Subscriptions
from bridge.core.mux.states import PEER_TRANSITIONS, TRANSITIONS, PeerState, State, Waiting, move
from bridge.core.mux.turns import Tally, Turns
from bridge.core.mux.views import AUDITED
from bridge.core.pins import Gate
from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import NOTIFICATION, REQUEST, RESPONSE, Kind, Message, ProtocolError, RequestId
from bridge.protocol.mcp import LATEST_PROTOCOL_VERSION, LOG_LEVELS, MISSING_CAPABILITY, MRTR_METHODS, PROTOCOL_VERSIONS, RELATED_TASK

K = TypeVar("K")
V = TypeVar("V")
# Late replies to cancelled calls are expected; remember this many to drop them quietly.
CANCELLED_MEMORY = 4096
# Client requests that never wait for a slot (rule 9).
_UNCAPPED = frozenset({"initialize", "ping", "resources/subscribe", "resources/unsubscribe", "logging/setLevel"})
# The bridge's own requests that bring a process up (a ping: the probe of a warm one, see
# `server_started`): unanswered within limits.initialize_timeout, the process is restarted.
_HANDSHAKE = frozenset({"initialize", "ping"})
_NOTHING: Mapping[str, frozenset[str]] = {}  # withheld by no pins
# Requests that cannot make the server ask the client anything: never held back.
_INERT = frozenset(
    {"ping", "tools/list", "prompts/list", "resources/list", "resources/templates/list", "logging/setLevel",
     "resources/subscribe", "resources/unsubscribe", "tasks/list", "tasks/get", "tasks/cancel"}
)  # fmt: skip
# Read on every call, as globals: a member lookup on an Enum class is slow in Python 3.11 (jsonrpc.REQUEST).
_READY, _FAILED = State.READY, State.FAILED
_OPEN, _STATELESS = PeerState.OPEN, PeerState.STATELESS


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
        self._subscriptions = Subscriptions()
        self._owners = Owners()
        self._levels = Levels()
        self._backlog: list[Message] = []
        self._queued = Tally()  # calls in `_held` and `_for_slot`
        # Calls held back until the one call allowed to ask (`_holder`) asks,
        # finishes or has had `attribution_window` seconds (rule 4).
        self._held = Turns(self._queued)
        # Calls waiting for a slot (rule 9); `_slots` holds the upstream ids of the calls
        # written under the cap, some of which may have ended since (see `_free_slot`).
        self._for_slot = Turns(self._queued)
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
        self._unknown: dict[views.Probe, bytes] = {}
        # The server's pins (rule 8): what it offers that is withheld (`Gate.withheld`, one
        # dict for every mux of the server, changed in place; empty when nothing is).
        self.pins: Gate | None = None
        self._withheld: Mapping[str, frozenset[str]] = _NOTHING
        # Stateless sessions' calls whose server asked for a capability they did not declare
        # (rule 4): upstream id -> those capabilities. Empty but for that rare case.
        self._refused: dict[int, set[str]] = {}

    def set_limits(
        self, *, max_inflight: int | None = None, max_backlog: int | None = None, max_subscriptions: int | None = None,
        attribution_window: float | None = None,
    ) -> None:
        """New limits (a reload; an era found out): they apply to what comes next. None: unchanged."""
        if max_inflight is not None:
            self.max_inflight = max_inflight
        if max_backlog is not None:
            self.max_backlog = max_backlog
        if max_subscriptions is not None:
            self.max_subscriptions = max_subscriptions
        if attribution_window is not None:
            self.attribution_window = attribution_window

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
        self._can_answer(peer, not ASKABLE.isdisjoint(capabilities))
        peer.protocol_version = version
        peer.state = move(PEER_TRANSITIONS, peer.state, "adopted")
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
        peer.level = LEVEL_INDEX[level]
        return out + self._sync_level()

    def set_view(self, session: str, view: View | None) -> None:
        """A reload changed what the session's principal may see: from its next message on."""
        self._peers[session].view = view

    def set_pins(self, gate: Gate | None) -> None:
        """The server's pins (rule 8), for every list answer and request from now on."""
        self.pins = gate
        self._withheld = gate.withheld if gate is not None else _NOTHING

    def announce(self, method: str) -> list[Action]:
        """A list change the bridge made (an approval of pins): said as the server's own are."""
        return self._broadcast(jsonrpc.notification(method))

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
        if peer.tasks or peer.client_tasks or peer.elicitations:
            self._owners.forget(peer)
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
        return self._peers[session].owns_nothing()

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
            **self._subscriptions.sizes(),
            **self._owners.sizes(),
            "queued_calls": sum(1 for m in self._backlog if "method" in m and "id" in m) + self._held.waiting,
            "waiting_for_slot": self._for_slot.waiting,
        }

    def waiting_for_slot(self) -> int:
        """Client calls waiting for a slot under `max_calls` (rule 9)."""
        return self._for_slot.waiting

    def call(self, upstream_id: int) -> Call | None:
        """A call in flight, by the id the mux gave it at the server."""
        return self._calls.get(upstream_id)

    def waiting(self, session: str, client_id: RequestId) -> Waiting | None:
        """Why a client's call is not written to the server yet; None once it is (or when
        there is no such call). Asked of traced calls only (traces/spans.py, rule 5)."""
        peer = self._peers.get(session)
        call = peer.calls.get(client_id) if peer is not None else None
        if call is None or call.sent:
            return None
        if self._held.holds(call.principal, call.upstream_id):
            return Waiting.HELD
        if self.state is not _READY:
            return Waiting.SERVER
        return Waiting.SLOT

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
            if (peer.view is not None or self._withheld) and (hidden := self._hidden(peer, msg)) is not None:
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
            if (audited := AUDITED.get(method)) is not None:
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
        self._prune_blind(self._clock())  # bounded by the calls of one window, however long no holder comes
        self._blind.append(call)
        return self._send_call(call, msg)

    def _prune_blind(self, now: float) -> None:
        """Forget, from the oldest, calls of sessions that cannot be asked whose window is over."""
        blind, calls, window = self._blind, self._calls, self.attribution_window
        while blind and ((c := blind[0]).asked or c.upstream_id not in calls or (c.sent and c.sent_at + window <= now)):
            blind.popleft()

    def _blind_left(self) -> float:
        """Seconds until no call of a session that cannot be asked is in its window."""
        now = self._clock()
        self._prune_blind(now)
        calls, window = self._calls, self.attribution_window
        left = 0.0
        for c in self._blind:
            if not c.asked and c.upstream_id in calls:
                left = max(left, c.sent_at + window - now if c.sent else window)
        return left

    def _can_answer(self, peer: Peer, able: bool) -> None:
        if able and not peer.can_answer and not self._askable and self.attribution_window:
            # Calls went at once while no session could be asked: they are now calls of
            # sessions that cannot be, and one that may be asked waits for their windows.
            self._blind.extend(c for c in self._calls.values() if c.session is not None and not c.asked and c.method not in _INERT)
        self._askable += able - peer.can_answer
        peer.can_answer = able

    def _hidden(self, peer: Peer, msg: Message) -> list[Action] | None:
        """A request for a tool, prompt or resource the session may not see, or its server's
        pins withhold, is answered as the server answers one it does not have; None when the
        request is not one of those. The first such request asks the server with a name it
        cannot have (and nothing of the request's own); its answer, with the name put back,
        is the answer from then on."""
        hidden = views.hidden_name(peer.view, self._withheld, msg)
        if hidden is None:
            return None
        named, name = hidden
        method = msg["method"]
        client_id = msg["id"]
        target = name if method in AUDITED else None
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
        answer = jsonrpc.decode(template.replace(probe.name, views.escaped(name)))
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
        self._held.served(self._peers[caller(call)[0]].principal)
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
            elif not self._peers[caller(call)[0]].can_answer:
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
        self._can_answer(peer, not ASKABLE.isdisjoint(peer.capabilities))
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
        if peer.state is _STATELESS:  # server/discover: the shell makes it from the server's initialize result
            return [self._reply(peer, client_id, self.init_result)]
        version = negotiate(peer.protocol_version, self.init_result.get("protocolVersion", LATEST_PROTOCOL_VERSION))
        peer.protocol_version = version
        peer.state = move(PEER_TRANSITIONS, peer.state, "initialized")
        out: list[Action] = [self._reply(peer, client_id, {**self.init_result, "protocolVersion": version})]
        if self.roots is None and "roots" in peer.capabilities:
            # The server may have asked for roots before anyone could answer.
            out += self._to_server(jsonrpc.notification("notifications/roots/list_changed"))
        return out

    def _discover(self, peer: Peer, msg: Message) -> list[Action]:
        """A stateless session's server/discover is answered, like initialize, from the cached result."""
        if peer.state is not _STATELESS:
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
        subscribers = self._subscriptions.by_uri.get(uri)
        if subscribers:
            subscribers.add(peer.id)
            peer.subscriptions.add(uri)
            return [self._reply(peer, msg["id"], {})]
        client_id = msg["id"]
        out = self._forward_call(peer, msg)
        call = peer.calls.get(client_id)
        if call is not None and call.method == "resources/subscribe":
            call.subscribe_uri = uri
            self._subscriptions.by_uri[uri] = {peer.id}
            peer.subscriptions.add(uri)
        return out

    def _unsubscribe(self, peer: Peer, msg: Message) -> list[Action]:
        uri = _text(msg, "uri")
        if uri is None:
            return [self._reply_error(peer, msg["id"], jsonrpc.INVALID_PARAMS, "resources/unsubscribe needs a string uri")]
        subscribers = self._subscriptions.by_uri.get(uri)
        if uri not in peer.subscriptions or subscribers is None or len(subscribers) > 1:
            if subscribers is not None:
                subscribers.discard(peer.id)
            peer.subscriptions.discard(uri)
            return [self._reply(peer, msg["id"], {})]
        del self._subscriptions.by_uri[uri]
        peer.subscriptions.discard(uri)
        if self.state is not _READY:
            return [*self._unsubscribe_queued(uri), self._reply(peer, msg["id"], {})]
        return self._forward_call(peer, msg)

    def _set_level(self, peer: Peer, msg: Message) -> list[Action]:
        level = _lookup(LEVEL_INDEX, _text(msg, "level"))
        if level is None:
            return [self._reply_error(peer, msg["id"], jsonrpc.INVALID_PARAMS, f"level must be one of {', '.join(LOG_LEVELS)}")]
        peer.level = level
        wanted = self._levels.wanted(self._peers.values())
        if wanted == self._levels.upstream:
            return [self._reply(peer, msg["id"], {})]
        self._levels.upstream = wanted
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
                self._owners.claim_client_task(peer, task_id)
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
        msg.update(jsonrpc.decode(template.replace(probe.name, views.escaped(name))))

    def _after_list(self, peer: Peer, call: Call, msg: Message) -> list[Action]:
        """Judge a list result by the server's pins, and take out of it what they withhold
        and what the session may not see."""
        result = msg.get("result")
        if result.__class__ is not dict:
            return []
        out: list[Action] = []
        if self.pins is not None and (seen := self.pins.see(call.method, result)) is not None and (seen.changes or seen.recorded):
            out.append(PinsSeen(seen))
        if peer.view is not None:
            views.filter_list(peer.view, call.method, result)
        return out

    def _after_initialize(self, peer: Peer, call: Call, msg: Message) -> list[Action]:
        result = msg.get("result")
        if result.__class__ is dict:
            peer.state = move(PEER_TRANSITIONS, peer.state, "initialized")
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
                out = [ToSession(peer.id, note) for note in self._owners.claim_task(peer, task_id)]
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
        self.state = move(TRANSITIONS, self.state, "initialized")
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
        if peer.state is _STATELESS and call is not None and call.method not in MRTR_METHODS:
            # Only these end in input_required: a question during another is the server's error.
            refusal = f"{method} during {call.method}: 2026-07-28 asks the client only during tools/call, prompts/get and resources/read"
            return [ToServer(jsonrpc.error(server_id, jsonrpc.METHOD_NOT_FOUND, refusal))]
        related = None
        if call is not None:
            if method != "roots/list":  # servers ask for roots of their own accord: no sign the call asked
                call.asked = next(self._seq)
            related = call.client_id
        downstream_id = next(self._ids)
        params = msg.get("params")
        req = ServerRequest(peer.id, server_id, downstream_id, method, related, params.__class__ is dict and "task" in params)
        peer.server_requests[downstream_id] = req
        self._server_requests[downstream_id] = req
        self._server_request_ids[server_id] = downstream_id
        if method == "elicitation/create" and params.__class__ is dict and params.get("elicitationId").__class__ is str:
            self._owners.claim_elicitation(peer, params["elicitationId"])
        msg["id"] = downstream_id
        return [ToSession(peer.id, msg, related)]

    def _missing_capability(self, method: str, call: Call | None) -> None:
        """A server request its session cannot answer (the server is refused it), from `call`
        (the one attributed it), or with none attributed, from the one call in flight, if
        only one is. Its window goes on: only a question put to its session ends it (rule
        4). Whether the call needs it is the server's to say: if a stateless
        session's call that did not declare the capability then fails, it fails with the
        2026-07-28 error that says which (see `_server_response`); a server that asks for
        several capabilities and goes on with those it gets is answered as it answers."""
        wanted = CAPABILITY_FOR.get(method)
        if wanted is None:
            return
        if call is None:
            sent = [c for c in self._calls.values() if c.sent and c.session is not None]
            if len(sent) != 1:
                return
            (call,) = sent
        peer = self._peers[caller(call)[0]]
        if peer.state is _STATELESS and wanted not in peer.capabilities:
            self._refused.setdefault(call.upstream_id, set()).add(wanted)

    def _attribute(self, msg: Message) -> tuple[Peer | None, Call | None]:
        owner = self._owner_of(msg)
        if owner is not None:
            return owner, max(owner.calls.values(), key=lambda c: c.upstream_id, default=None)
        return attribution.guess(msg, self._calls, self._peers, self._clock(), self.attribution_window)

    def _asked_by(self, call: Call | None, msg: Message) -> tuple[Peer | None, Call | None]:
        if call is None or call.session is None:
            return None, None
        return attribution.asked_by(self._peers[call.session], call, msg)

    def _owner_of(self, msg: Message) -> Peer | None:
        params = msg.get("params")
        if params.__class__ is not dict:
            return None
        sid = None
        meta = params.get("_meta")
        if meta.__class__ is dict and meta.get(RELATED_TASK).__class__ is dict:
            task_id = meta[RELATED_TASK].get("taskId")
            sid = _lookup(self._owners.tasks, task_id if isinstance(task_id, str) else None)
        if sid is None and msg["method"].startswith("tasks/"):
            sid = _lookup(self._owners.client_tasks, _text(msg, "taskId"))
        return _lookup(self._peers, sid)

    # Server notifications.

    def _broadcast(self, msg: Message) -> list[Action]:
        """A server-level notice (a list changed): every session may know it. Said even with
        no one here to hear it: the gateway may have listeners of it on other processes."""
        method = msg["method"]
        targets = tuple(p.id for p in self._peers.values() if p.state is not _OPEN and (p.notices is None or method in p.notices))
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
            if p.state is not _OPEN and (not busy or p.principal in busy) and hears(p, level)
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
        targets = self._subscriptions.matching(uri)
        peers = self._peers
        visible = tuple(sid for sid in targets if (view := peers[sid].view) is None or view.admits("resources", uri))
        return [Broadcast(visible, msg)] if visible else []

    def _log_message(self, msg: Message) -> list[Action]:
        level = _lookup(LEVEL_INDEX, _text(msg, "level"))
        return self._unowned_notification(msg, len(LOG_LEVELS) if level is None else level)  # unknown: shown to all

    def _task_status(self, msg: Message) -> list[Action]:
        task_id = _text(msg, "taskId")
        owner = _lookup(self._owners.tasks, task_id)
        if owner is None and task_id is not None and self._owner_of(msg) is None and self._task_call_in_flight():
            if dropped := self._owners.keep_early(task_id, msg):
                return [Discard("task status with no owner", {"dropped": dropped}, log=False)]
            return []
        return self._owned_notification(msg, owner)

    def _task_call_in_flight(self) -> bool:
        return any(c.task and c.sent for c in self._calls.values())

    def _forget_early_notes(self) -> None:
        """Once no call that may create a task is in flight, no result will claim them."""
        if self._owners.has_early() and not self._task_call_in_flight():
            self._owners.drop_early()

    def _elicitation_complete(self, msg: Message) -> list[Action]:
        return self._owned_notification(msg, _lookup(self._owners.elicitations, _text(msg, "elicitationId")))

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
            self.state = move(TRANSITIONS, self.state, "probe")
            call = Call(None, None, next(self._ids), "ping", self._clock(), sent=True)
            self._calls[call.upstream_id] = call
            return [ToServer(jsonrpc.request(call.upstream_id, "ping"))]
        self.state = move(TRANSITIONS, self.state, "started")
        return self._flush_backlog()

    def _send_initialize(self, params: dict[str, Any]) -> list[Action]:
        self.state = move(TRANSITIONS, self.state, "initialize")
        call = Call(None, None, next(self._ids), "initialize", self._clock(), sent=True)
        self._calls[call.upstream_id] = call
        return [ToServer(jsonrpc.request(call.upstream_id, "initialize", params))]

    def _probed(self) -> list[Action]:
        """The process started ahead answered the probe: READY, uninitialized, for its
        session's own initialize; or, for a stateless session adopted meanwhile, initialized
        now with that session's capabilities (see `adopt`)."""
        if self._own_init and self._client_init is not None:
            return self._send_initialize(self._client_init)
        self.state = move(TRANSITIONS, self.state, "probed")
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
        self.state = move(TRANSITIONS, self.state, "exited")
        self._forget_early_notes()
        return self._settle(out)

    def server_failed(self, reason: str) -> list[Action]:
        """The supervisor gave up for now: fail what waits, refuse what comes."""
        self.state = move(TRANSITIONS, self.state, "failed")
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
        for uri in self._subscriptions.by_uri:
            if uri not in queued:
                out.append(self._internal_call("resources/subscribe", {"uri": uri}))
        if self._levels.upstream is not None:
            out.append(self._internal_call("logging/setLevel", {"level": LOG_LEVELS[self._levels.upstream]}))
        return out

    def _forget_upstream_state(self) -> None:
        queued = {c.subscribe_uri for c in self._calls.values() if not c.sent}
        for uri in [u for u in self._subscriptions.by_uri if u not in queued]:
            for session in self._subscriptions.by_uri.pop(uri):
                self._peers[session].subscriptions.discard(uri)
        self._levels.upstream = None

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
        session, client_id = caller(call)
        if call.subscribe_uri is not None:
            self._undo_subscribe(call.subscribe_uri, session)
        return ToSession(session, jsonrpc.error(client_id, code, message), client_id, True, call)

    def _undo_subscribe(self, uri: str, session: str) -> None:
        self._subscriptions.leave(uri, session)
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
        if len(self._cancelled) > CANCELLED_MEMORY:
            self._cancelled.popitem(last=False)

    def _drop_subscriber(self, uri: str, session: str) -> list[Action]:
        if not self._subscriptions.leave(uri, session):
            return []
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
            session, client_id = caller(call)
            out.append(ToSession(session, jsonrpc.result(client_id, {}), client_id, True, call))
        return out

    def _sync_level(self) -> list[Action]:
        wanted = self._levels.wanted(self._peers.values())
        if wanted is None or wanted == self._levels.upstream:
            return []
        self._levels.upstream = wanted
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


def _lookup(table: Mapping[K, V], key: K | None) -> V | None:
    return None if key is None else table.get(key)


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
