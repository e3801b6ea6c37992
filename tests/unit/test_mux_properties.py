"""Hypothesis state machine over the mux: random interleavings of sessions and a server.

A model server holds the tools/call requests it gets, answers them in any
order (sometimes after they were cancelled), reports progress, asks the
clients to sample, sends notifications, and dies and restarts. Model clients
all number their requests from 1 and all use the same progress token, so
every collision the mux must untangle happens. After every step:

- nothing reaches a session it does not belong to (responses by the who/n
  echo, progress by owner and token, log messages by level, updates by
  subscription, server requests by capability, and a server request made in
  a call's window by that call: its session or, when that session cannot
  answer, nobody, whatever else is in flight or waits for an answer);
- no response arrives twice, nor after its request was cancelled;
- every server request is answered exactly once (by a client or the bridge);
- the server sees at most one subscription per uri, and no unsubscribe
  without one.

At the end the server answers everything, every client request has had
exactly one response, and once all sessions close every mux table is empty.

The capped machines run the same rules with `max_calls` (servers.NAME.
max_concurrent_calls) and a small backlog bound: the server never holds more
client calls than the cap, and calls refused past the bound are answered too.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bridge.core.mux import Abandoned, Action, Broadcast, Discard, Mux, RestartServer, State, Timer, ToServer, ToSession
from bridge.protocol.mcp import LOG_LEVELS

URIS = ("res://a", "res://b", "res://b/child")
PRINCIPALS = ("alice", "bob")  # sessions alternate between two principals
LEVELS = list(LOG_LEVELS)


class Client:
    def __init__(self, sid: str, sampling: bool) -> None:
        self.sid = sid
        self.sampling = sampling
        self.next_id = 1
        self.outstanding: dict[Any, str] = {}  # id -> method
        self.cancelled: set[Any] = set()
        self.answered: set[Any] = set()
        self.tokens: dict[Any, Any] = {}  # request id -> its progress token
        self.server_requests: dict[Any, Any] = {}  # downstream id -> params
        self.level: int | None = None
        self.subscriptions: set[str] = set()
        self.subscribing: dict[Any, str] = {}  # request id -> uri, until answered
        self.initialized = False
        self.principal: str | None = None


class MuxMachine(RuleBasedStateMachine):
    shared = True
    warm = False
    max_sessions = 4
    max_calls = 0  # no cap
    max_backlog = 0  # no bound

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.in_flight: Counter[str | None] = Counter()
        self.mux = Mux(
            shared=self.shared, warm=self.warm, clock=lambda: self.now, max_inflight=50, attribution_window=1.0, in_flight=self.in_flight,
            max_calls=self.max_calls, max_backlog=self.max_backlog,
        )  # fmt: skip
        self.clients: dict[str, Client] = {}
        self.closed: set[str] = set()
        self.server_pending: dict[int, dict[str, Any]] = {}  # upstream id -> tools/call message
        self.server_asked: dict[str, int] = {}  # server request id -> answers received
        self.next_server_request = 0
        self.server_alive = False
        self.server_subscribed: set[str] = set()
        self.server_initialized = False
        self.counter = 0
        self.received_at: dict[int, float] = {}  # upstream id -> when the server got that tools/call
        self.latest: int | None = None  # the tools/call the server got last
        self.asked_about: set[int] = set()  # calls the server asked a question for

    # ------------------------------------------------------------------ engine

    def run(self, actions: list[Action]) -> None:
        work = deque(actions)
        while work:
            action = work.popleft()
            if isinstance(action, ToServer):
                work.extend(self.server_receives(action.message))
            elif isinstance(action, ToSession):
                self.client_receives(action.session, action.message)
            elif isinstance(action, Broadcast):
                assert len(set(action.sessions)) == len(action.sessions)
                for sid in action.sessions:
                    self.client_receives(sid, action.message)
            elif isinstance(action, RestartServer):
                raise AssertionError(f"unexpected restart: {action.reason}")
            elif isinstance(action, Abandoned):
                # Only a call its client gave up on: cancelled, or its session closed.
                sid, rid = action.call.session, action.call.client_id
                assert sid in self.closed or rid in self.clients[sid].cancelled, f"{sid}/{rid} abandoned while awaited"
            else:
                assert isinstance(action, (Discard, Timer))

    def server_receives(self, msg: dict[str, Any]) -> list[Action]:
        assert self.server_alive, f"message to a dead server: {msg}"
        method = msg.get("method")
        if "method" not in msg:  # an answer to one of our server requests
            sid = msg["id"]
            assert sid in self.server_asked, f"answer to a request never made: {msg}"
            self.server_asked[sid] += 1
            assert self.server_asked[sid] == 1, f"server request {sid} answered twice"
            return []
        if "id" not in msg:
            if method == "notifications/cancelled":
                self.server_pending.pop(msg["params"]["requestId"], None)
            return []
        if method == "tools/call":
            assert msg["id"] not in self.server_pending
            self.server_pending[msg["id"]] = msg
            self.received_at[msg["id"]] = self.now
            self.latest = msg["id"]
            return []
        result: dict[str, Any] = {}
        uri = msg.get("params", {}).get("uri")
        if method == "resources/subscribe":
            assert uri not in self.server_subscribed, f"server subscribed twice to {uri}"
            self.server_subscribed.add(uri)
        elif method == "resources/unsubscribe":
            assert uri in self.server_subscribed, f"server unsubscribed from {uri} it never subscribed to"
            self.server_subscribed.discard(uri)
        elif method == "initialize":
            assert not self.server_initialized, "a process was initialized twice"
            self.server_initialized = True
            self.server_subscribed.clear()  # a new process starts with none
            result = {"protocolVersion": "2025-06-18", "capabilities": {"logging": {}}, "serverInfo": {"name": "m", "version": "1"}}
        return self.mux.from_server({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    def client_receives(self, sid: str, msg: dict[str, Any]) -> None:
        assert sid in self.clients, f"message for closed/unknown session {sid}: {msg}"
        client = self.clients[sid]
        method = msg.get("method")
        if method is None:
            rid = msg["id"]
            assert rid not in client.cancelled, f"{sid} got a result for cancelled request {rid}"
            assert rid not in client.answered, f"{sid} got two responses for {rid}"
            assert rid in client.outstanding, f"{sid} got a response to {rid} it never sent: {msg}"
            if "result" in msg and client.outstanding[rid] == "tools/call":
                echo = msg["result"]
                assert echo == {"who": sid, "n": rid}, f"{sid}/{rid} got someone else's result {echo}"
            if rid == "init" and "result" in msg:
                client.initialized = True
            if "error" in msg and rid in client.subscribing:
                client.subscriptions.discard(client.subscribing[rid])
            client.subscribing.pop(rid, None)
            del client.outstanding[rid]
            client.tokens.pop(rid, None)
            client.answered.add(rid)
        elif "id" in msg:
            assert method == "sampling/createMessage"
            assert client.sampling, f"{sid} got sampling without the capability"
            client.server_requests[msg["id"]] = msg["params"]
        elif method == "notifications/progress":
            token = msg["params"]["progressToken"]
            owners = [rid for rid, tok in client.tokens.items() if tok == token and rid in client.outstanding]
            assert owners, f"{sid} got progress for token {token} it has no call for"
        elif method == "notifications/message":
            level = LEVELS.index(msg["params"]["level"])
            assert client.level is None or level >= client.level, f"{sid} got a {level} message below its level"
        elif method == "notifications/resources/updated":
            uri = msg["params"]["uri"]
            assert any(uri == s or uri.startswith(s + "/") for s in client.subscriptions), f"{sid} not subscribed to {uri}"
        elif method == "notifications/cancelled":
            client.server_requests.pop(msg["params"]["requestId"], None)
        elif method == "notifications/custom/thing":
            assert client.initialized
        else:
            assert method == "notifications/tools/list_changed"
            assert client.initialized

    # ------------------------------------------------------------------- rules

    @initialize()
    def start(self) -> None:
        self.server_alive = True
        self.run(self.mux.server_started())

    @precondition(lambda self: self.counter < self.max_sessions if not self.shared else len(self.clients) < self.max_sessions)
    @rule(sampling=st.booleans())
    def open_session(self, sampling: bool) -> None:
        self.counter += 1
        sid = f"s{self.counter}"
        client = self.clients[sid] = Client(sid, sampling)
        client.principal = PRINCIPALS[self.counter % len(PRINCIPALS)]
        self.mux.open_session(sid, client.principal)
        caps = {"sampling": {}} if sampling else {}
        client.outstanding["init"] = "initialize"
        self.send(client, {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": caps, "clientInfo": {}}})

    def send(self, client: Client, msg: dict[str, Any]) -> None:
        self.run(self.mux.from_client(client.sid, msg))

    def pick(self, data: st.DataObject, items: Any) -> Any:
        return data.draw(st.sampled_from(sorted(items, key=str)))

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), progress=st.booleans())
    def call(self, data: st.DataObject, progress: bool) -> None:
        client = self.clients[self.pick(data, self.clients)]
        rid = client.next_id
        client.next_id += 1
        params: dict[str, Any] = {"name": "echo", "who": client.sid, "n": rid}
        if progress:
            params["_meta"] = {"progressToken": "tok"}
            client.tokens[rid] = "tok"
        client.outstanding[rid] = "tools/call"
        self.send(client, {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})

    @precondition(lambda self: any(any(m == "tools/call" for m in c.outstanding.values()) for c in self.clients.values()))
    @rule(data=st.data())
    def reuse_id_in_flight(self, data: st.DataObject) -> None:
        client = self.clients[self.pick(data, [c.sid for c in self.clients.values() if "tools/call" in c.outstanding.values()])]
        rid = self.pick(data, [r for r, m in client.outstanding.items() if m == "tools/call"])
        actions = self.mux.from_client(client.sid, {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {}})
        assert len(actions) == 1 and isinstance(actions[0], ToSession) and actions[0].message["error"]["code"] == -32600

    @precondition(lambda self: any(any(m == "tools/call" for m in c.outstanding.values()) for c in self.clients.values()))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        client = self.clients[self.pick(data, [c.sid for c in self.clients.values() if "tools/call" in c.outstanding.values()])]
        rid = self.pick(data, [r for r, m in client.outstanding.items() if m == "tools/call"])
        del client.outstanding[rid]
        client.tokens.pop(rid, None)
        client.cancelled.add(rid)
        self.send(client, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}})

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), uri=st.sampled_from(URIS), subscribe=st.booleans())
    def subscription(self, data: st.DataObject, uri: str, subscribe: bool) -> None:
        client = self.clients[self.pick(data, self.clients)]
        rid = client.next_id
        client.next_id += 1
        client.outstanding[rid] = "resources/subscribe"
        if subscribe:
            client.subscriptions.add(uri)
            client.subscribing[rid] = uri
        else:
            client.subscriptions.discard(uri)
        method = "resources/subscribe" if subscribe else "resources/unsubscribe"
        self.send(client, {"jsonrpc": "2.0", "id": rid, "method": method, "params": {"uri": uri}})

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), level=st.sampled_from(LEVELS))
    def set_level(self, data: st.DataObject, level: str) -> None:
        client = self.clients[self.pick(data, self.clients)]
        rid = client.next_id
        client.next_id += 1
        client.outstanding[rid] = "logging/setLevel"
        client.level = LEVELS.index(level)
        self.send(client, {"jsonrpc": "2.0", "id": rid, "method": "logging/setLevel", "params": {"level": level}})

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        sid = self.pick(data, self.clients)
        del self.clients[sid]
        self.closed.add(sid)
        self.run(self.mux.close_session(sid))

    @precondition(lambda self: self.server_pending and self.server_alive)
    @rule(data=st.data())
    def server_answers(self, data: st.DataObject) -> None:
        upstream_id = self.pick(data, self.server_pending)
        msg = self.server_pending.pop(upstream_id)
        echo = {"who": msg["params"]["who"], "n": msg["params"]["n"]}
        self.run(self.mux.from_server({"jsonrpc": "2.0", "id": upstream_id, "result": echo}))

    @precondition(lambda self: self.server_alive)
    @rule(upstream_id=st.integers(min_value=1, max_value=60))
    def server_answers_late(self, upstream_id: int) -> None:
        """A response for an id that is unknown or long cancelled must go nowhere."""
        if upstream_id in self.server_pending:
            return
        self.run(self.mux.from_server({"jsonrpc": "2.0", "id": upstream_id, "result": {"who": "nobody", "n": 0}}))

    @precondition(lambda self: self.server_alive and any("_meta" in m["params"] for m in self.server_pending.values()))
    @rule(data=st.data())
    def server_progress(self, data: st.DataObject) -> None:
        msg = self.server_pending[self.pick(data, [i for i, m in self.server_pending.items() if "_meta" in m["params"]])]
        token = msg["params"]["_meta"]["progressToken"]
        self.run(self.mux.from_server({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": 1}}))

    @precondition(lambda self: self.server_alive)
    @rule()
    def server_asks_sampling(self) -> None:
        self.next_server_request += 1
        sid = f"q{self.next_server_request}"
        self.server_asked[sid] = 0
        actions = self.mux.from_server({"jsonrpc": "2.0", "id": sid, "method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}})
        if not self.server_pending:  # about no call: never to a session when several principals could answer
            able = {c.principal for c in self.clients.values() if c.sampling and c.initialized}
            if len(able) > 1:
                assert not any(isinstance(a, ToSession) for a in actions), "an unattributable request reached a session"
        self.run(actions)

    @precondition(lambda self: self.server_pending and self.server_alive)
    @rule(data=st.data())
    def server_asks_about_a_call(self, data: st.DataObject) -> None:
        """A request whose call is known (the era translator's, for a 2026-07-28 server's
        input_required) reaches that call's session or nobody, never another."""
        upstream_id = self.pick(data, self.server_pending)
        caller = self.server_pending[upstream_id]["params"]["who"]
        self.next_server_request += 1
        sid = f"q{self.next_server_request}"
        self.server_asked[sid] = 0
        ask = {"jsonrpc": "2.0", "id": sid, "method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}}
        actions = self.mux.server_request_for(upstream_id, ask)
        assert all(a.session == caller for a in actions if isinstance(a, ToSession)), "asked another session"
        if not self.clients[caller].sampling:
            assert not any(isinstance(a, ToSession) for a in actions), "asked a session without the capability"
        self.run(actions)

    def _fresh_live_call(self) -> bool:
        """The call the server got last came just now (in its window), is not asked about yet,
        and its client still waits for it."""
        msg = self.server_pending.get(self.latest) if self.latest is not None else None
        if msg is None or self.received_at[self.latest] != self.now or self.latest in self.asked_about:
            return False
        client = self.clients.get(msg["params"]["who"])
        return client is not None and msg["params"]["n"] in client.outstanding

    @precondition(lambda self: self.server_alive and self._fresh_live_call())
    @rule()
    def server_asks_for_the_call_it_just_got(self) -> None:
        """Servers ask early: a question in a call's window is that call's. It reaches that
        call's session, or nobody when the session cannot answer; never another session,
        whatever else is in flight, waits its turn, or waits for its own question's answer."""
        assert self.latest is not None
        self.asked_about.add(self.latest)
        caller = self.server_pending[self.latest]["params"]["who"]
        self.next_server_request += 1
        sid = f"q{self.next_server_request}"
        self.server_asked[sid] = 0
        actions = self.mux.from_server({"jsonrpc": "2.0", "id": sid, "method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}})
        asked = [a.session for a in actions if isinstance(a, ToSession) and a.message.get("method") == "sampling/createMessage"]
        assert asked in ([], [caller]), f"the question of {caller}'s call reached {asked}"
        client = self.clients[caller]
        assert asked or not (client.sampling and client.initialized), f"{caller} can answer, and was not asked"
        self.run(actions)

    @precondition(lambda self: any(c.server_requests for c in self.clients.values()))
    @rule(data=st.data())
    def client_answers_sampling(self, data: st.DataObject) -> None:
        client = self.clients[self.pick(data, [c.sid for c in self.clients.values() if c.server_requests])]
        downstream_id = self.pick(data, client.server_requests)
        del client.server_requests[downstream_id]
        self.send(client, {"jsonrpc": "2.0", "id": downstream_id, "result": {"role": "assistant", "content": {"type": "text", "text": "x"}, "model": "m"}})

    @precondition(lambda self: self.server_alive)
    @rule(kind=st.sampled_from(["list_changed", "log", "updated", "custom"]), level=st.sampled_from(LEVELS), uri=st.sampled_from(URIS))
    def server_notifies(self, kind: str, level: str, uri: str) -> None:
        if kind == "list_changed":
            msg = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        elif kind == "log":
            msg = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": level, "data": "x"}}
        elif kind == "custom":
            msg = {"jsonrpc": "2.0", "method": "notifications/custom/thing", "params": {"x": 1}}
        else:
            msg = {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}}
        actions = self.mux.from_server(msg)
        if kind in ("log", "custom"):
            # About the calls in flight, if any: only their principal may see it.
            busy = {self.clients[m["params"]["who"]].principal for m in self.server_pending.values() if m["params"]["who"] in self.clients}
            for action in actions:
                if isinstance(action, Broadcast):
                    assert len(busy) <= 1, f"{kind} delivered while principals {busy} have calls in flight"
                    assert all(self.clients[sid].principal in busy for sid in action.sessions) or not busy, (busy, action.sessions)
        self.run(actions)

    @precondition(lambda self: self.server_alive)
    @rule()
    def server_dies(self) -> None:
        self.server_alive = False
        self.server_initialized = False
        self.server_pending.clear()
        for sid in self.server_asked:
            self.server_asked[sid] = max(self.server_asked[sid], 1)  # a dead server needs no answer
        self.run(self.mux.server_exited("died"))

    @precondition(lambda self: not self.server_alive)
    @rule()
    def server_restarts(self) -> None:
        self.server_alive = True
        self.server_subscribed.clear()  # a new process, initialized or not, holds no subscription
        self.run(self.mux.server_started())

    @precondition(lambda self: not self.server_alive and self.mux.state is not State.FAILED)
    @rule()
    def server_crash_loops(self) -> None:
        self.run(self.mux.server_failed("crash loop"))

    @rule(seconds=st.sampled_from([0.5, 2.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        # A timeout gives the call its one response and cancels it upstream.
        self.run(self.mux.expire(timeout=10.0, initialize_timeout=1000.0))
        self.run(self.mux.timer())  # held calls go once the window of the one before ends

    # ----------------------------------------------------------- invariants

    @invariant()
    def calls_in_flight_are_counted_by_principal(self) -> None:
        """The count rate limits read (shared by every mux) matches the calls the mux holds."""
        held: Counter[str | None] = Counter()
        for sid, client in self.clients.items():
            held[client.principal] += self.mux.inflight(sid)
        assert +held == +self.in_flight, (held, self.in_flight)

    @invariant()
    def the_server_holds_no_more_calls_than_the_cap(self) -> None:
        """Every tools/call the model server holds is a client's; none may be past the cap."""
        if self.max_calls:
            assert len(self.server_pending) <= self.max_calls, (len(self.server_pending), self.max_calls)

    @invariant()
    def tables_match_clients(self) -> None:
        for sid, client in self.clients.items():
            inflight = {r for r, m in client.outstanding.items() if m != "initialize" or not self.shared}
            assert self.mux.inflight(sid) <= len(client.outstanding)
            assert inflight >= set(self.mux.peer(sid).calls), f"mux holds calls {sid} no longer waits for"

    def teardown(self) -> None:
        if not self.server_alive:
            self.server_restarts()
        for _ in range(1000):
            tables = self.mux.table_sizes()
            if not self.server_pending and not tables["queued_calls"] and not tables["waiting_for_slot"]:
                break
            if not self.server_pending:
                self.now += 5.0
                self.run(self.mux.timer())
                continue
            upstream_id, msg = next(iter(self.server_pending.items()))
            del self.server_pending[upstream_id]
            self.run(self.mux.from_server({"jsonrpc": "2.0", "id": upstream_id, "result": {"who": msg["params"]["who"], "n": msg["params"]["n"]}}))
        for client in list(self.clients.values()):
            for downstream_id in list(client.server_requests):
                del client.server_requests[downstream_id]
                self.send(client, {"jsonrpc": "2.0", "id": downstream_id, "result": {}})
            assert not client.outstanding, f"{client.sid} never got responses to {client.outstanding}"
        for sid in list(self.clients):
            del self.clients[sid]
            self.run(self.mux.close_session(sid))
        assert all(n == 1 for n in self.server_asked.values()), self.server_asked
        assert self.mux.is_idle(), "mux tables not empty after every session closed"


class PerSessionMuxMachine(MuxMachine):
    """The same rules in per-session mode: one session, whose own initialize reaches the
    server (and is replayed to the next process after a restart)."""

    shared = False
    max_sessions = 1


class CappedMuxMachine(MuxMachine):
    """Shared mode with servers.NAME.max_concurrent_calls (rule 9): calls wait for a slot,
    taking turns by principal, within a bound shared with the backlog."""

    max_calls = 2
    max_backlog = 4


class CappedPerSessionMuxMachine(PerSessionMuxMachine):
    max_calls = 1
    max_backlog = 3


class WarmPerSessionMuxMachine(PerSessionMuxMachine):
    """Per-session mode on a process started ahead of its session (the warm pool): probed
    with a ping until the session opens, then as above, the session's own initialize
    included (and replayed after a restart)."""

    warm = True


MuxMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
for machine in (PerSessionMuxMachine, CappedMuxMachine, CappedPerSessionMuxMachine):
    machine.TestCase.settings = MuxMachine.TestCase.settings
TestMux = MuxMachine.TestCase
TestPerSessionMux = PerSessionMuxMachine.TestCase
TestCappedMux = CappedMuxMachine.TestCase
TestCappedPerSessionMux = CappedPerSessionMuxMachine.TestCase
WarmPerSessionMuxMachine.TestCase.settings = MuxMachine.TestCase.settings
TestWarmPerSessionMux = WarmPerSessionMuxMachine.TestCase


class _Picks:
    """Stands in for Hypothesis' data object: hands out the recorded draws in order."""

    def __init__(self, *values: Any) -> None:
        self._values = deque(values)

    def draw(self, strategy: Any) -> Any:
        return self._values.popleft()


def test_regression_subscribed_twice_around_a_restart() -> None:
    """The sequence Hypothesis kept (shared/repro/mux-subscribed-twice), step by step:
    the server died; b subscribed (queued), a joined, both left, a subscribed again;
    the restarted server got res://b twice."""
    m = MuxMachine()
    m.start()
    m.server_answers_late(upstream_id=1)
    m.open_session(sampling=False)
    m.set_level(_Picks("s1"), level="debug")
    m.open_session(sampling=False)
    m.open_session(sampling=False)
    m.server_dies()
    m.open_session(sampling=False)
    m.set_level(_Picks("s1"), level="debug")
    m.subscription(_Picks("s2"), subscribe=True, uri="res://b")
    m.subscription(_Picks("s1"), subscribe=False, uri="res://a")
    m.subscription(_Picks("s1"), subscribe=True, uri="res://b")
    m.subscription(_Picks("s2"), subscribe=False, uri="res://b")
    m.subscription(_Picks("s1"), subscribe=False, uri="res://b")
    m.subscription(_Picks("s1"), subscribe=False, uri="res://a")
    m.subscription(_Picks("s1"), subscribe=True, uri="res://b")
    m.tables_match_clients()
    m.teardown()


def test_regression_a_question_in_the_window_of_a_call_that_cannot_answer_reaches_nobody() -> None:
    """Two principals: bob's session (it can be asked) has asked its question and waits for
    its client's answer (a 2026-07-28 call parked on it); then alice's session, which cannot be
    asked, calls, and the server asks at once: the question is alice's call's, so it reaches
    nobody (the server gets an error), and bob's session is not asked a second time."""
    m = MuxMachine()
    m.start()
    m.open_session(sampling=True)  # s1, bob
    m.open_session(sampling=False)  # s2, alice
    assert (m.clients["s1"].principal, m.clients["s2"].principal) == ("bob", "alice")
    m.call(_Picks("s1"), progress=False)
    m.server_asks_for_the_call_it_just_got()
    assert len(m.clients["s1"].server_requests) == 1  # asked, not answered yet
    m.call(_Picks("s2"), progress=False)
    assert m.latest is not None and m.server_pending[m.latest]["params"]["who"] == "s2"
    m.server_asks_for_the_call_it_just_got()
    assert len(m.clients["s1"].server_requests) == 1 and not m.clients["s2"].server_requests
    m.teardown()
