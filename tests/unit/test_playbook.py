"""The playbook (tests/support/playbook.py) fails where a mux does not do what it says."""

from __future__ import annotations

import pytest
from support import playbook as pb
from support.playbook import req

from bridge.core.mux import Mux


def ready() -> Mux:
    mux = Mux(clock=pb.Clock())
    mux.server_started()
    mux.from_server(pb.result(1, {"protocolVersion": "2025-06-18", "capabilities": {}}))
    mux.open_session("a")
    return mux


def test_an_action_other_than_the_one_expected_fails_naming_both() -> None:
    with pytest.raises(AssertionError, match=r"(?s)expected << to server.*tools/list.*got ToServer.*tools/call"):
        assert pb.play(ready()) >> pb.client("a", req(1, "tools/call")) << pb.to_server(req(pb.Placeholder(), "tools/list"))


def test_an_action_nobody_expected_fails() -> None:
    with pytest.raises(AssertionError, match="not expected"):
        assert pb.play(ready()) >> pb.client("a", req(1, "tools/call"))


def test_an_expected_action_that_never_comes_fails() -> None:
    with pytest.raises(AssertionError, match="nothing more came"):
        assert pb.play(ready()) >> pb.client("a", pb.note("notifications/initialized")) << pb.to_server(pb.note("x"))


def test_a_placeholder_keeps_the_first_value_it_met() -> None:
    up = pb.Placeholder()
    assert up == 5 and up == 5 and up != 6
    with pytest.raises(AssertionError, match="before any expectation bound it"):
        pb.server(pb.result(pb.Placeholder(), {})).feed(ready())
