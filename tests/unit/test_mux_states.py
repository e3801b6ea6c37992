"""The mux's state tables (bridge/core/mux/states.py): what they allow, what they refuse,
and that the mux moves through them as its rules say. That docs/architecture.md shows these
tables as they are is checked with the module map (tests/release/test_layers.py)."""

from __future__ import annotations

import pytest

from bridge.core.mux import IllegalTransition, Mux, PeerState, State, ToServer
from bridge.core.mux.states import PEER_TRANSITIONS, TRANSITIONS, markdown, move


def test_every_process_state_is_reachable_from_down_and_can_fail() -> None:
    seen, todo = {State.DOWN}, [State.DOWN]
    while todo:
        for after in TRANSITIONS[todo.pop()].values():
            if after not in seen:
                seen.add(after)
                todo.append(after)
    assert seen == set(State)
    assert all(row.get("failed") is State.FAILED for row in TRANSITIONS.values())


def test_a_failed_server_stays_failed_when_its_process_exits() -> None:
    assert move(TRANSITIONS, State.FAILED, "exited") is State.FAILED
    assert move(TRANSITIONS, State.READY, "exited") is State.DOWN


@pytest.mark.parametrize(
    ("table", "state", "event"),
    [
        (TRANSITIONS, State.READY, "initialized"),  # an initialize answered twice
        (TRANSITIONS, State.READY, "started"),  # started with no exit between
        (TRANSITIONS, State.DOWN, "probed"),
        (PEER_TRANSITIONS, PeerState.STATELESS, "initialized"),  # a 2026-07-28 request has no handshake
        (PEER_TRANSITIONS, PeerState.READY, "adopted"),
        (PEER_TRANSITIONS, PeerState.OPEN, "closed"),
    ],
)
def test_a_pair_the_table_does_not_hold_is_refused(table, state, event) -> None:
    with pytest.raises(IllegalTransition, match=f"'{event}' in state {state.name}"):
        move(table, state, event)


def test_the_markdown_table_has_a_row_per_state_and_a_column_per_event() -> None:
    text = markdown(TRANSITIONS)
    rows = text.splitlines()
    assert len(rows) == 2 + len(State)
    assert rows[0].count("|") == 2 + len({e for row in TRANSITIONS.values() for e in row})
    assert "| FAILED | STARTING | STARTING | READY | FAILED | FAILED |  |  |" in rows


def test_a_shared_mux_goes_down_starting_ready_and_failed_stays_failed() -> None:
    mux = Mux(shared=True, clock=lambda: 0.0)
    assert mux.state is State.DOWN
    (init,) = mux.server_started()
    assert isinstance(init, ToServer) and mux.state is State.STARTING
    mux.from_server({"jsonrpc": "2.0", "id": init.message["id"], "result": {"protocolVersion": "2025-06-18", "capabilities": {}}})
    assert mux.state is State.READY
    mux.server_exited()
    assert mux.state is State.DOWN
    mux.server_failed("crash loop")
    assert mux.state is State.FAILED
    mux.server_exited()
    assert mux.state is State.FAILED
    mux.server_started()
    assert mux.state is State.STARTING


def test_a_peer_is_open_until_its_handshake_and_a_stateless_one_never_has_one() -> None:
    mux = Mux(shared=True, clock=lambda: 0.0)
    (init,) = mux.server_started()
    mux.from_server({"jsonrpc": "2.0", "id": init.message["id"], "result": {"protocolVersion": "2025-06-18", "capabilities": {}}})
    mux.open_session("a")
    assert mux.peer("a").state is PeerState.OPEN
    mux.from_client("a", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}}})
    assert mux.peer("a").state is PeerState.READY
    mux.open_session("b")
    mux.adopt("b", {}, "2026-07-28", {"name": "c", "version": "1"}, None)
    assert mux.peer("b").state is PeerState.STATELESS
