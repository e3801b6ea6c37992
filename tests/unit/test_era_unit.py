"""The era translator rule by rule, with no IO; and the mux's routing of the requests it makes."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core.mux import Mux, ToServer, ToSession
from bridge.core.translator import MAX_HELD, MAX_INPUTS, MAX_PARKED, MAX_ROUNDS, Ask, Decided, Deliver, Era, Translator, Wake, Write
from bridge.protocol import jsonrpc
from bridge.protocol.mcp import CAPABILITIES_KEY, LOG_LEVEL_KEY, SUBSCRIPTION_KEY, VERSION_KEY

CAPS = {"sampling": {}, "elicitation": {}}
DISCOVERED = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {"listChanged": True}, "resources": {"subscribe": True}},
    "instructions": "be kind",
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "m", "version": "2"}},
}


def req(rid: Any, method: str, **params: Any) -> dict[str, Any]:
    return jsonrpc.request(rid, method, params or None)


def writes(outs: list[Any]) -> list[dict[str, Any]]:
    return [o.message for o in outs if isinstance(o, Write)]


def delivered(outs: list[Any]) -> list[dict[str, Any]]:
    return [o.message for o in outs if isinstance(o, Deliver)]


def asks(outs: list[Any]) -> list[Ask]:
    return [o for o in outs if isinstance(o, Ask)]


def started() -> tuple[Translator, str]:
    t = Translator(client_info=("mcp-bridge", "9"))
    outs = t.start()
    (discover,) = writes(outs)
    assert discover["method"] == "server/discover" and discover["params"]["_meta"][VERSION_KEY] == "2026-07-28"
    assert Wake(t.discover_timeout) in outs
    return t, discover["id"]


def modern(version: str = "2025-06-18") -> Translator:
    t, discover = started()
    assert not t.from_mux(req(1, "initialize", protocolVersion=version, capabilities=CAPS, clientInfo={}))
    outs = t.from_server(jsonrpc.result(discover, DISCOVERED))
    assert Decided(Era.MODERN, "server/discover answered") in outs
    return t


def ask_inputs(t: Translator, call_id: int = 5, **inputs: Any) -> list[Ask]:
    (sent,) = writes(t.from_mux(req(call_id, "tools/call", name="greet", arguments={})))
    result = {"resultType": "input_required", "inputRequests": inputs, "requestState": "opaque"}
    return asks(t.from_server(jsonrpc.result(sent["id"], result)))


ELICIT = {"method": "elicitation/create", "params": {"message": "name?", "requestedSchema": {}}}
SAMPLE = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}


# ------------------------------------------------------------------ detection


@pytest.mark.parametrize(
    "answer", [jsonrpc.error("x", -32601, "Method not found"), jsonrpc.error("x", -32602, "not initialized")]
)
def test_any_error_makes_the_server_legacy_and_lets_the_held_messages_through(answer: dict[str, Any]) -> None:
    t, discover = started()
    init = req(1, "initialize", protocolVersion="2025-06-18", capabilities={}, clientInfo={})
    ping = req(2, "ping")
    assert t.from_mux(init) == [] and t.from_mux(ping) == []
    answer["id"] = discover
    outs = t.from_server(answer)
    assert isinstance(outs[0], Decided) and outs[0].era is Era.LEGACY
    assert writes(outs) == [init, ping]  # unchanged, in order
    assert writes(t.from_mux(req(3, "tools/list"))) == [req(3, "tools/list")]


def test_no_answer_within_the_timeout_makes_it_legacy_once_it_answers_initialize() -> None:
    t, _ = started()
    t.from_mux(req(1, "initialize"))
    outs = t.wake()
    assert outs[0].era is Era.LEGACY and not outs[0].final
    assert outs[0].reason.startswith(f"no answer to server/discover within {t.discover_timeout:g}s")
    assert writes(outs) == [req(1, "initialize")]
    assert t.wake() == []
    answer = jsonrpc.result(1, {"protocolVersion": "2025-06-18"})
    assert t.from_server(answer) == [Deliver(answer), Decided(Era.LEGACY, "answered initialize")]


def test_a_modern_server_slow_to_start_is_found_modern_late() -> None:
    t, discover = started()
    t.wake()  # the timeout: the initialize goes out
    assert writes(t.from_mux(req(1, "initialize", protocolVersion="2025-06-18", capabilities=CAPS))) == [
        req(1, "initialize", protocolVersion="2025-06-18", capabilities=CAPS)
    ]
    assert t.from_server(jsonrpc.error(1, -32022, "the initialize handshake is not accepted")) == []
    outs = t.from_server(jsonrpc.result(discover, DISCOVERED))
    assert outs[0] == Decided(Era.MODERN, "server/discover answered, after the timeout")
    (answer,) = delivered(outs)
    assert answer["id"] == 1 and answer["result"]["serverInfo"] == {"name": "m", "version": "2"}
    (sent,) = writes(t.from_mux(req(2, "tools/list")))
    assert sent["params"]["_meta"][VERSION_KEY] == "2026-07-28"


def test_a_late_refusal_of_the_initialize_after_discover_is_dropped() -> None:
    t, discover = started()
    t.wake()
    t.from_mux(req(1, "initialize", protocolVersion="2025-06-18", capabilities=CAPS))
    assert delivered(t.from_server(jsonrpc.result(discover, DISCOVERED)))
    assert t.from_server(jsonrpc.error(1, -32022, "not accepted")) == []


def test_a_result_without_our_version_is_legacy() -> None:
    t, discover = started()
    outs = t.from_server(jsonrpc.result(discover, {"supportedVersions": ["2099-01-01"]}))
    assert outs[0].era is Era.LEGACY


def test_configured_modern_waits_for_discover_and_refuses_what_waits_if_it_is_refused() -> None:
    t = Translator(client_info=("b", "1"), era="modern")
    (discover,) = writes(t.start())
    t.from_mux(req(1, "initialize"))
    assert t.wake() == []
    outs = t.from_server(jsonrpc.error(discover["id"], -32601, "Method not found"))
    assert outs[0].era is Era.MODERN and "configured era modern" in outs[0].reason
    (refused,) = delivered(outs)
    assert refused["id"] == 1 and refused["error"]["code"] == jsonrpc.SERVER_UNAVAILABLE
    # and what comes after is refused at once, not held for a discover that will not come
    (later,) = delivered(t.from_mux(req(2, "tools/list")))
    assert later["id"] == 2 and later["error"]["code"] == jsonrpc.SERVER_UNAVAILABLE
    assert t.from_mux(jsonrpc.notification("notifications/initialized")) == []


def test_held_messages_are_bounded() -> None:
    t, _ = started()
    for i in range(MAX_HELD):
        assert t.from_mux(req(i, "tools/list")) == []
    (refused,) = delivered(t.from_mux(req("over", "tools/list")))
    assert refused["error"]["code"] == jsonrpc.SERVER_UNAVAILABLE and refused["id"] == "over"


# ------------------------------------------------------------------ handshake and per request


def test_initialize_is_answered_from_discover() -> None:
    t, discover = started()
    t.from_mux(req(1, "initialize", protocolVersion="2025-03-26", capabilities=CAPS, clientInfo={}))
    outs = t.from_server(jsonrpc.result(discover, DISCOVERED))
    (answer,) = delivered(outs)
    assert answer == jsonrpc.result(
        1,
        {
            "protocolVersion": "2025-03-26",
            "capabilities": DISCOVERED["capabilities"],
            "serverInfo": {"name": "m", "version": "2"},
            "instructions": "be kind",
        },
    )
    (listen,) = writes(outs)  # the server can say its tools changed: listen for it
    assert listen["method"] == "subscriptions/listen" and listen["params"]["notifications"] == {"toolsListChanged": True}


def test_requests_get_the_modern_meta_and_the_log_level() -> None:
    t = modern()
    (sent,) = writes(t.from_mux(req(2, "tools/list", _meta={"progressToken": 2})))
    meta = sent["params"]["_meta"]
    assert meta["progressToken"] == 2 and meta[VERSION_KEY] == "2026-07-28" and meta[CAPABILITIES_KEY] == CAPS
    assert LOG_LEVEL_KEY not in meta
    assert delivered(t.from_mux(req(3, "logging/setLevel", level="info"))) == [jsonrpc.result(3, {})]
    (sent,) = writes(t.from_mux(req(4, "tools/list")))
    assert sent["params"]["_meta"][LOG_LEVEL_KEY] == "info"


def test_removed_methods_are_answered_or_absorbed_here() -> None:
    t = modern()
    assert delivered(t.from_mux(req(2, "ping"))) == [jsonrpc.result(2, {})]
    assert t.from_mux(jsonrpc.notification("notifications/initialized")) == []
    assert t.from_mux(jsonrpc.notification("notifications/roots/list_changed")) == []


# ------------------------------------------------------------------ input required


def test_input_required_becomes_server_requests_then_a_retry() -> None:
    t = modern()
    a, b = ask_inputs(t, 5, name=ELICIT, model=SAMPLE)
    assert a.upstream_id == 5 and b.upstream_id == 5
    assert (a.message["method"], b.message["method"]) == ("elicitation/create", "sampling/createMessage")
    assert a.message["id"] != b.message["id"] and all(isinstance(x.message["id"], str) for x in (a, b))
    assert t.from_mux(jsonrpc.result(a.message["id"], {"action": "accept", "content": {"name": "ada"}})) == []
    (retry,) = writes(t.from_mux(jsonrpc.result(b.message["id"], {"role": "assistant"})))
    assert retry["id"] not in (5, a.message["id"], b.message["id"])
    params = retry["params"]
    assert params["name"] == "greet" and params["requestState"] == "opaque"
    assert params["inputResponses"] == {"name": {"action": "accept", "content": {"name": "ada"}}, "model": {"role": "assistant"}}
    assert params["_meta"][VERSION_KEY] == "2026-07-28"
    final = delivered(t.from_server(jsonrpc.result(retry["id"], {"content": [], "resultType": "complete"})))
    assert final == [jsonrpc.result(5, {"content": [], "resultType": "complete"})]
    assert not any(t.table_sizes().values())


def test_a_client_error_fails_the_call_and_later_answers_are_dropped() -> None:
    t = modern()
    a, b = ask_inputs(t, 5, name=ELICIT, model=SAMPLE)
    (failed,) = delivered(t.from_mux(jsonrpc.error(a.message["id"], -32601, "no connected client can handle it")))
    assert failed["id"] == 5 and failed["error"]["code"] == -32601  # the client's code, not one of the bridge's
    assert failed["error"]["message"] == "the client could not give the input the server asked for (name): no connected client can handle it"
    assert t.from_mux(jsonrpc.result(b.message["id"], {})) == []
    assert not any(t.table_sizes().values())


def test_cancel_while_waiting_for_input_reaches_nobody_and_in_a_retry_names_the_retry() -> None:
    t = modern()
    ask_inputs(t, 5, name=ELICIT)
    assert t.from_mux(jsonrpc.notification("notifications/cancelled", {"requestId": 5})) == []
    assert not any(t.table_sizes().values())
    (a,) = ask_inputs(t, 6, name=ELICIT)
    (retry,) = writes(t.from_mux(jsonrpc.result(a.message["id"], {"action": "decline"})))
    (cancel,) = writes(t.from_mux(jsonrpc.notification("notifications/cancelled", {"requestId": 6})))
    assert cancel["params"]["requestId"] == retry["id"]
    assert not any(t.table_sizes().values())


def test_rounds_per_call_are_bounded() -> None:
    t = modern()
    (sent,) = writes(t.from_mux(req(5, "tools/call", name="greet")))
    again = {"resultType": "input_required", "requestState": "s"}  # no inputs: retried at once
    for _ in range(MAX_ROUNDS):
        (sent,) = writes(t.from_server(jsonrpc.result(sent["id"], again)))
    (failed,) = delivered(t.from_server(jsonrpc.result(sent["id"], again)))
    assert failed["id"] == 5 and f"{MAX_ROUNDS} times" in failed["error"]["message"]
    assert not any(t.table_sizes().values())


@pytest.mark.parametrize(
    "result",
    [
        {"resultType": "input_required"},
        {"resultType": "input_required", "inputRequests": {"x": {"params": {}}}},
        {"resultType": "input_required", "inputRequests": ["not", "an", "object"]},
    ],
)
def test_a_malformed_input_required_fails_the_call(result: dict[str, Any]) -> None:
    t = modern()
    (sent,) = writes(t.from_mux(req(5, "tools/call", name="greet")))
    (failed,) = delivered(t.from_server(jsonrpc.result(sent["id"], result)))
    assert failed["id"] == 5 and failed["error"]["code"] == jsonrpc.INTERNAL_ERROR
    assert not any(t.table_sizes().values())


def test_a_client_error_for_an_input_request_fails_the_call_with_the_clients_code() -> None:
    """Whatever code the client gave (a user declining in its own terms, a limit of its own)
    is the call's: the bridge does not turn it into an error of its own."""
    t = modern()
    for call_id, code in ((5, -32602), (6, 1234), (7, -32000)):
        (a,) = ask_inputs(t, call_id, name=ELICIT)
        (failed,) = delivered(t.from_mux(jsonrpc.error(a.message["id"], code, "declined")))
        assert failed["id"] == call_id and failed["error"]["code"] == code, failed
    assert not any(t.table_sizes().values())


def test_input_requests_per_answer_are_bounded() -> None:
    """An input_required with MAX_INPUTS input requests becomes that many server requests; one
    with more fails the call (-32603) and asks the client nothing."""
    t = modern()
    inputs = {f"q{i}": ELICIT for i in range(MAX_INPUTS)}
    assert len(ask_inputs(t, 5, **inputs)) == MAX_INPUTS
    (sent,) = writes(t.from_mux(req(6, "tools/call", name="greet", arguments={})))
    result = {"resultType": "input_required", "inputRequests": {**inputs, "one_more": ELICIT}, "requestState": "s"}
    outs = t.from_server(jsonrpc.result(sent["id"], result))
    assert asks(outs) == []
    (failed,) = delivered(outs)
    assert failed["id"] == 6 and failed["error"]["code"] == jsonrpc.INTERNAL_ERROR
    assert failed["error"]["message"] == f"inputRequests must be an object of at most {MAX_INPUTS} requests"


def park(t: Translator, calls: range) -> list[Ask]:
    """One input request for each of `calls` (mux ids), each call answered input_required."""
    return [ask for call_id in calls for ask in ask_inputs(t, call_id, name=ELICIT)]


def test_parked_calls_are_bounded_and_a_forgotten_one_stops_counting() -> None:
    """At most MAX_PARKED calls wait for their clients' input: the next one fails (-32603).
    A parked call that ends otherwise (its client's error, a cancel, its retry's answer) frees
    its place."""
    t = modern()
    waiting = park(t, range(MAX_PARKED))
    assert len(waiting) == MAX_PARKED

    def refused(call_id: int) -> None:
        (sent,) = writes(t.from_mux(req(call_id, "tools/call", name="greet", arguments={})))
        outs = t.from_server(jsonrpc.result(sent["id"], {"resultType": "input_required", "inputRequests": {"name": ELICIT}}))
        (failed,) = delivered(outs)
        assert failed["id"] == call_id and failed["error"]["message"] == f"{MAX_PARKED} calls already wait for their clients' input"
        assert asks(outs) == []

    refused(-1)
    # Forgotten three ways: the client's error, a cancel, an answer that sends the call on.
    delivered(t.from_mux(jsonrpc.error(waiting[0].message["id"], -32601, "no")))
    assert t.from_mux(jsonrpc.notification("notifications/cancelled", {"requestId": 1})) == []
    (retry,) = writes(t.from_mux(jsonrpc.result(waiting[2].message["id"], {"action": "decline"})))
    for call_id in (-2, -3, -4):
        assert len(park(t, range(call_id, call_id + 1))) == 1, call_id  # each takes a place freed
    refused(-5)
    # The retry comes back input_required: it waits again, and there is no room for it.
    again = t.from_server(jsonrpc.result(retry["id"], {"resultType": "input_required", "inputRequests": {"name": ELICIT}}))
    (failed,) = delivered(again)
    assert failed["id"] == 2 and "already wait" in failed["error"]["message"]


def test_a_retry_the_process_had_no_room_for_is_the_muxs_call() -> None:
    t = modern()
    (a,) = ask_inputs(t, 5, name=ELICIT)
    (retry,) = writes(t.from_mux(jsonrpc.result(a.message["id"], {"action": "decline"})))
    assert t.origin(retry["id"]) == 5
    assert t.origin(7) == 7
    assert not any(t.table_sizes().values())


# ------------------------------------------------------------------ subscriptions


def ack(listen: dict[str, Any], honored: list[str] | None = None) -> dict[str, Any]:
    """The acknowledgment of `listen`, agreeing to all it asked for (or to `honored` uris)."""
    agreed = dict(listen["params"]["notifications"])
    if honored is not None:
        agreed["resourceSubscriptions"] = honored
    params = {"_meta": {SUBSCRIPTION_KEY: listen["id"]}, "notifications": agreed}
    return jsonrpc.notification("notifications/subscriptions/acknowledged", params)


def updated(listen: str, uri: str) -> dict[str, Any]:
    return jsonrpc.notification("notifications/resources/updated", {"_meta": {SUBSCRIPTION_KEY: listen}, "uri": uri})


def test_subscriptions_are_one_listen_replaced_when_the_set_changes() -> None:
    t, discover = started()
    t.from_server(jsonrpc.result(discover, {**DISCOVERED, "capabilities": {"resources": {"subscribe": True}}}))
    (first,) = writes(t.from_mux(req(2, "resources/subscribe", uri="a://1")))
    assert first["params"]["notifications"] == {"resourceSubscriptions": ["a://1"]}
    assert first["params"]["_meta"][VERSION_KEY] == "2026-07-28"
    assert delivered(t.from_server(ack(first))) == [jsonrpc.result(2, {})]
    assert delivered(t.from_server(updated(first["id"], "a://1"))) == [
        jsonrpc.notification("notifications/resources/updated", {"uri": "a://1"})
    ]
    (second,) = writes(t.from_mux(req(3, "resources/subscribe", uri="a://2")))
    assert second["params"]["notifications"]["resourceSubscriptions"] == ["a://1", "a://2"]
    # Until the new listen is acknowledged the old one still speaks; the new one not yet.
    assert delivered(t.from_server(updated(first["id"], "a://1")))
    assert not delivered(t.from_server(updated(second["id"], "a://2")))
    outs = t.from_server(ack(second))
    assert writes(outs) == [jsonrpc.notification("notifications/cancelled", {"requestId": first["id"], "reason": "replaced"})]
    assert delivered(outs) == [jsonrpc.result(3, {})]
    assert not delivered(t.from_server(updated(first["id"], "a://1")))
    outs = t.from_mux(req(4, "resources/unsubscribe", uri="a://1"))
    assert delivered(outs) == [jsonrpc.result(4, {})]
    (third,) = writes(outs)
    assert third["params"]["notifications"]["resourceSubscriptions"] == ["a://2"]
    # Nothing left to listen for: the one never acknowledged and the live one are cancelled.
    cancels = writes(t.from_mux(req(5, "resources/unsubscribe", uri="a://2")))
    assert [c["params"]["requestId"] for c in cancels] == [third["id"], second["id"]]
    assert not delivered(t.from_server(ack(third)))


def test_a_subscription_the_server_does_not_honor_is_refused() -> None:
    t, discover = started()
    t.from_server(jsonrpc.result(discover, DISCOVERED))
    (listen,) = writes(t.from_mux(req(2, "resources/subscribe", uri="a://1")))
    (refused,) = delivered(t.from_server(ack(listen, honored=[])))
    assert refused["id"] == 2 and refused["error"]["code"] == jsonrpc.INVALID_PARAMS
    (again,) = writes(t.from_mux(req(3, "resources/subscribe", uri="a://1")))  # asked afresh, not assumed
    assert again["params"]["notifications"]["resourceSubscriptions"] == ["a://1"]


def test_a_refused_listen_fails_the_subscribes_waiting_for_it() -> None:
    t, discover = started()
    t.from_server(jsonrpc.result(discover, DISCOVERED))
    (listen,) = writes(t.from_mux(req(2, "resources/subscribe", uri="a://1")))
    (failed,) = delivered(t.from_server(jsonrpc.error(listen["id"], -32601, "no listen here")))
    assert failed["id"] == 2 and "refused subscriptions/listen" in failed["error"]["message"]


# ------------------------------------------------------------------ the mux's side


def test_the_mux_routes_an_ask_to_the_calling_session_if_it_can_answer() -> None:
    mux = Mux()
    (init,) = [a.message for a in mux.server_started() if isinstance(a, ToServer)]
    mux.from_server(jsonrpc.result(init["id"], {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {}}))
    for sid, caps in (("a", {"elicitation": {}}), ("b", {"elicitation": {}}), ("c", {})):
        mux.open_session(sid)
        mux.from_client(sid, req(0, "initialize", protocolVersion="2025-06-18", capabilities=caps, clientInfo={}))
    calls = {}
    for sid in ("a", "b", "c"):
        (sent,) = [a.message for a in mux.from_client(sid, req(1, "tools/call", name="greet")) if isinstance(a, ToServer)]
        calls[sid] = sent["id"]
    ask = jsonrpc.request("mcp-bridge-era-1", "elicitation/create", {"message": "?"})
    (to_b,) = [a for a in mux.server_request_for(calls["b"], dict(ask)) if isinstance(a, ToSession)]
    assert to_b.session == "b" and to_b.related == 1
    (refused,) = [a.message for a in mux.server_request_for(calls["c"], dict(ask, id="mcp-bridge-era-2")) if isinstance(a, ToServer)]
    assert refused["id"] == "mcp-bridge-era-2" and refused["error"]["code"] == jsonrpc.METHOD_NOT_FOUND
