"""The 2026-07-28 endpoint's parts that need no process or socket
(bridge/http/endpoints/stateless_2026.py): a kept session, a request's queue, a step that
fails, the order of a call's answer."""

from __future__ import annotations

import json
from typing import Any


def test_a_kept_session_takes_nothing_said_while_it_waits() -> None:
    from bridge.gateway.sessions import Spares
    from bridge.http.endpoints.stateless_2026 import StatelessSession

    class Gateway:
        def quiet(self, session: StatelessSession) -> bool:
            return True

    head = type("Head", (), {"gateway": Gateway()})()
    session = StatelessSession("s", "alice", 10, 1000)
    session.spare_key, session.post = ("alice", b"{}"), head
    assert session.deliver(b'{"jsonrpc":"2.0","method":"notifications/message","params":{}}', None, False)
    spares = Spares(2)
    assert session.keep(spares) and spares.count == 1 and not session.queue
    assert not session.attached()  # idle-reaped like any session
    assert session.deliver(b'{"jsonrpc":"2.0","method":"notifications/message","params":{}}', None, False)
    assert not session.queue
    assert not StatelessSession("s", "bob", 10, 1000).keep(spares)  # none kept without a kind
    session.end("idle")  # closed while kept: no longer among the spares
    assert spares.count == 0 and spares.take(("alice", b"{}")) is None and session.attached()


def test_a_requests_queue_is_bounded_by_count_and_bytes() -> None:
    from bridge.http.endpoints.stateless_2026 import StatelessSession

    session = StatelessSession("s", None, 3, 100)
    assert session.deliver(b"a" * 60, None, False)
    assert not session.deliver(b"b" * 60, None, False)  # over the bytes: the gateway drops it as too slow
    assert session.pop() == (b"a" * 60, None, False)
    assert all(session.deliver(b"c", None, False) for _ in range(3))
    assert not session.deliver(b"d", None, False)  # over the count
    session.ask_again([b"x" * 97])
    assert [item[0] for item in session.queue] == [b"x" * 97, b"c", b"c", b"c"]
    assert not session.deliver(b"", None, False)


def test_a_bug_in_a_step_ends_its_request_with_a_500_not_the_flush_that_ran_it() -> None:
    """A Driver runs inside the gateway's flush of a server's output: what it raises must
    end its own request (500, its session closed) and reach no further."""
    from bridge.http.endpoints.stateless_2026 import Driver, StatelessSession

    closed: list[str] = []
    answers: list[int] = []

    class Gateway:
        name = "s"
        spares: dict[Any, Any] = {}

        def close_session(self, session: StatelessSession, reason: str) -> None:
            closed.append(reason)
            session.end(reason)

    class Head:
        gateway = Gateway()

    class Reply:
        def watch(self, left: object) -> None:
            pass

        def error(self, exc: Any) -> None:
            answers.append(exc.status)

    class Broken(Driver):
        def step(self) -> None:
            raise RuntimeError("a bug")

    session = StatelessSession("s", None, 10, 1000)
    Broken(Head(), session, Reply()).start()  # type: ignore[arg-type]
    session.deliver(b"{}", None, False)
    session.flush()  # its step runs, and raises
    session.deliver(b"{}", None, False)
    session.flush()  # its driver is gone: nothing runs again
    assert answers == [500] and closed == ["internal error"] and session.driver is None and session.ended


def test_a_calls_answer_with_nothing_before_it_goes_at_its_delivery_else_in_turn() -> None:
    """The common call: its final response, delivered with nothing queued before it, is
    the answer at that delivery (no queue, no flush); one that came after a progress
    notification is sent in turn at the flush, after it, on a stream."""
    from bridge.http.endpoints.stateless_2026 import Exchange, StatelessSession
    from bridge.protocol import stateless

    class Gateway:
        name = "s"
        spares: dict[Any, Any] = {}
        server = type("Server", (), {"cache_scope": "private"})()

        def close_session(self, session: StatelessSession, reason: str) -> None:
            session.end(reason)

        def identity(self, session: StatelessSession) -> stateless.Server:
            return stateless.Server({"name": "x", "version": "1"}, "private")

    class Head:
        gateway = Gateway()
        accept = "application/json, text/event-stream"

    class Reply:
        def __init__(self) -> None:
            self.whole_body: bytes | None = None
            self.events: list[bytes] = []

        def watch(self, left: object) -> None:
            pass

        def whole(self, status: int, body: bytes) -> None:
            self.whole_body = body

        def open_stream(self, session_id: str | None, first: bytes = b"") -> Reply:
            self.events.append(first)
            return self

        def write(self, data: bytes) -> None:
            self.events.append(data)

        def end_stream(self, last: bytes = b"") -> None:
            self.events.append(last)

    def answer(session: StatelessSession) -> bytes:  # as the gateway delivers a final response
        message = {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}
        session.finish(message)
        return json.dumps(message, separators=(",", ":")).encode()

    quick, quick_reply = StatelessSession("s", None, 10, 1000), Reply()
    Exchange(Head(), None, quick, 7, "tools/call", 7, quick_reply, "", {}).start()  # type: ignore[arg-type]
    assert quick.deliver(answer(quick), 7, True)
    assert not quick.queue and quick.ended and json.loads(quick_reply.whole_body or b"")["result"]["resultType"] == "complete"

    slow, slow_reply = StatelessSession("s", None, 10, 1000), Reply()
    Exchange(Head(), None, slow, 7, "tools/call", 7, slow_reply, "", {}).start()  # type: ignore[arg-type]
    progress = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}'
    assert slow.deliver(progress, 7, False) and slow.deliver(answer(slow), 7, True)
    assert len(slow.queue) == 2 and not slow.ended and slow_reply.events == []
    slow.flush()
    assert slow_reply.whole_body is None and slow.ended
    assert b"notifications/progress" in slow_reply.events[0] and b'"resultType":"complete"' in slow_reply.events[-1]
