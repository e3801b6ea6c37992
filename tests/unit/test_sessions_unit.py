"""Sessions (bridge/gateway/sessions.py) without IO: their ids, and the spares a transport keeps."""

from __future__ import annotations

from bridge.gateway.sessions import Registry, Session, Spares, new_session_id


def test_session_ids_are_128_random_bits() -> None:
    ids = {new_session_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert Session("s", "alice").id != Session("s", "alice").id


def test_spares_are_bounded_taken_last_kept_first_and_give_way_oldest_first() -> None:
    spares = Spares(3)
    a, b, c, d = (Session("s", None, sid) for sid in "abcd")
    assert spares.keep("k", a) and spares.keep("k", b) and spares.keep("j", c)
    assert not spares.keep("k", d) and spares.count == 3  # full
    assert spares.oldest() is a
    assert spares.take("k") is b and spares.take("k") is a and spares.take("k") is None
    spares.drop("j", c)
    spares.drop("j", c)  # once only
    assert spares.count == 0 and not spares and spares.all() == [] and spares.oldest() is None


def test_dropping_a_session_no_longer_kept_changes_nothing() -> None:
    spares = Spares(4)
    a, b = Session("s", None, "a"), Session("s", None, "b")
    spares.keep("k", a)
    spares.keep("k", b)
    assert spares.take("k") is b
    spares.drop("k", b)  # taken already: not kept
    assert spares.count == 1 and spares.all() == [a]


def test_a_session_is_found_only_by_the_principal_that_opened_it() -> None:
    registry = Registry()
    registry.sessions = {"a": Session("s", "alice", "a"), "n": Session("s", None, "n")}
    assert registry.session("a", "alice") is registry.sessions["a"]
    assert registry.session("a", "bob") is None and registry.session("a", None) is None
    assert registry.session("n", None) is registry.sessions["n"] and registry.session("n", "alice") is None
    assert registry.session(None, "alice") is None and registry.session("", "alice") is None
    assert registry.session_counts() == {"none": 2}
