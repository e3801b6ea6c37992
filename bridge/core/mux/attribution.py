"""Rule 4, attribution: which session a server request is for, when stdio does not say.

stdio carries no link from a server request to the call that caused it, except a related
task (the mux looks that up first, in its owners). Servers start handling calls in the
order they arrive and ask early, so the first request from a burst of calls belongs to the
oldest fresh call that has not asked yet (fresh: written within `window`); a call that
already asked is the best guess for a further request; with no call in flight, the most
recently active session, and only when every session able to answer is one principal's.
Only sessions that declared the capability qualify. Per-session mode needs no guess. The
turns that make the guess name one call (`Mux._take_turn`) are the mux's, as they hold
calls back.
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.core.mux.actions import Call, caller
from bridge.core.mux.peer import CAPABILITY_FOR, Peer, can_handle
from bridge.core.mux.states import PeerState
from bridge.protocol.jsonrpc import Message

_OPEN, _READY = PeerState.OPEN, PeerState.READY


def guess(msg: Message, calls: Mapping[int, Call], peers: Mapping[str, Peer], now: float, window: float) -> tuple[Peer | None, Call | None]:
    """The session (None: nobody's) and call a server request most likely belongs to.
    `calls` in the order they were made; `now` and `window` as the mux's clock and
    attribution window."""
    method = msg["method"]
    if method.startswith("tasks/"):
        return None, None  # a task we do not know belongs to nobody here
    wanted = CAPABILITY_FOR.get(method)
    fresh_since = now - window
    asker: tuple[Call, Peer | None] | None = None  # the call that asked last, and its session if able
    newest: Call | None = None
    busy = False  # a client's call is in flight
    for call in calls.values():  # oldest first
        if call.session is None or not call.sent:
            continue
        peer = peers[call.session]
        busy = True
        able = peer.state is not _OPEN and (wanted is None or can_handle(peer.capabilities, wanted, msg))
        if not call.asked and call.sent_at > fresh_since and window:
            return (peer if able else None), call  # it asked, whether or not its session can answer
        if call.asked and (asker is None or call.asked > asker[0].asked):
            asker = call, peer if able else None
        if able:
            newest = call
    if asker is not None:
        return asker[1], asker[0]
    if newest is not None:
        return peers[caller(newest)[0]], newest
    if busy:
        return None, None  # only calls of sessions that cannot answer are in flight: one of them asked
    # No call in flight: the request is about no one's call. It may still go to a session
    # when every session able to answer is one principal's; never across principals.
    candidates = [
        p for p in peers.values()
        if p.state is _READY and (wanted is None or can_handle(p.capabilities, wanted, msg))
    ]  # fmt: skip
    if len({p.principal for p in candidates}) != 1:
        return None, None
    return max(candidates, key=lambda p: p.last_active), None


def asked_by(peer: Peer, call: Call, msg: Message) -> tuple[Peer | None, Call]:
    """A request known to come from `call`: its session, if that can answer it."""
    wanted = CAPABILITY_FOR.get(msg["method"])
    return (peer, call) if wanted is None or can_handle(peer.capabilities, wanted, msg) else (None, call)
