"""Filters and views (bridge/access/policy.py), and the mux applying them, with no IO."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from test_mux import note, ready_mux, req, to_server, to_session

from bridge.access.policy import RateLimiter, Rule, Throttled, View, views
from bridge.config.load import parse
from bridge.config.schema import Filter, RateLimit
from bridge.core.mux import Discard, ToServer, ToSession
from bridge.protocol import jsonrpc


def test_a_rule_matches_exact_names_and_globs_and_deny_wins() -> None:
    rule = Rule.of(Filter(allow=("get_*", "echo", "v?"), deny=("get_secret*",)))
    assert rule is not None
    assert [n for n in ("echo", "get_time", "get_secret_key", "v1", "v10", "echo2", "x") if rule.admits(n)] == ["echo", "get_time", "v1"]
    assert Rule.of(Filter()) is None  # nothing to filter
    nothing = Rule.of(Filter(allow=()))
    assert nothing is not None and not nothing.admits("echo")
    assert not Rule.of(Filter(deny=("*",))).admits("anything")  # type: ignore[union-attr]
    assert Rule.of(Filter(allow=("a.b",))).admits("a.b") and not Rule.of(Filter(allow=("a.b",))).admits("aXb")  # type: ignore[union-attr]
    assert not rule.admits("ECHO") and Rule.of(Filter(deny=("secret*",))).admits("Secret")  # type: ignore[union-attr]  # names are case-sensitive


def test_a_tokens_filter_narrows_the_servers() -> None:
    config = parse(
        """
servers:
  s: {command: x, tools: {deny: [danger]}}
  t: {command: x}
security:
  tokens:
    - {name: ops, token: ops-token-0123456789}
    - {name: ci, token: ci-token-01234567890, tools: {s: {allow: ["read_*", danger]}}}
"""
    )
    default, by_token = views(config, "s")
    assert default is not None and by_token["ops"] is not None and by_token["ci"] is not None
    assert default.admits("tools", "write") and not default.admits("tools", "danger")
    assert by_token["ci"].admits("tools", "read_file") and not by_token["ci"].admits("tools", "write")
    assert not by_token["ci"].admits("tools", "danger")  # the server's deny still holds
    assert views(config, "t") == (None, {"ops": None, "ci": None})


def test_a_tokens_filter_narrows_only_its_own_kind() -> None:
    config = parse(
        """
servers:
  s: {command: x}
security:
  tokens:
    - {name: ci, token: ci-token-01234567890, prompts: {s: {deny: [internal]}}, resources: {s: {allow: ["file:///public/*"]}}}
"""
    )
    _, by_token = views(config, "s")
    ci = by_token["ci"]
    assert ci is not None
    assert not ci.admits("prompts", "internal") and ci.admits("tools", "internal") and ci.admits("resources", "file:///public/internal")
    assert not ci.admits("resources", "file:///private/x") and ci.admits("prompts", "file:///private/x")


def test_a_name_that_is_not_a_string_is_left_to_the_server() -> None:
    assert VIEW.admits("prompts", None) and VIEW.admits("prompts", 7) and not VIEW.admits("prompts", "private")
    mux = filtered_mux()
    (fwd,) = to_server(mux.from_client("a", req(1, "prompts/list")))
    listed = {"prompts": [{"name": "public"}, {"name": "private"}, {"title": "no name"}, {"name": 7}]}
    (answer,) = to_session(mux.from_server(jsonrpc.result(fwd["id"], listed)), "a")
    assert answer["result"]["prompts"] == [{"name": "public"}, {"title": "no name"}, {"name": 7}]


def test_config_rejects_a_filter_for_an_unknown_server() -> None:
    import pytest

    from bridge.config.schema import ConfigError

    with pytest.raises(ConfigError) as raised:
        parse("servers: {s: {command: x}}\nsecurity: {tokens: [{name: a, token: aaaaaaaaaaaaaaaa, prompts: {nope: {deny: [x]}}}]}")
    assert raised.value.problems == ["security.tokens[0].prompts.nope: no server named 'nope'"]


VIEW = View(
    tools=(Rule.of(Filter(deny=("secret*",))),),  # type: ignore[arg-type]
    prompts=(Rule.of(Filter(allow=("public",))),),  # type: ignore[arg-type]
    resources=(Rule.of(Filter(deny=("file:///private/*",))),),  # type: ignore[arg-type]
)


def filtered_mux() -> Any:
    """Session a sees through VIEW; session b sees everything."""
    mux = ready_mux()
    mux.open_session("a", "alice", VIEW)
    mux.open_session("b", "bob")
    for sid in "ab":
        mux.from_client(sid, req(0, "initialize", protocolVersion="2025-06-18", capabilities={}, clientInfo={}))
    return mux


def test_lists_show_each_session_what_it_may_see() -> None:
    mux = filtered_mux()
    tools = {"tools": [{"name": "echo"}, {"name": "secret_key"}, {"name": "secretary"}]}
    for sid, names in (("a", ["echo"]), ("b", ["echo", "secret_key", "secretary"])):
        (fwd,) = to_server(mux.from_client(sid, req(1, "tools/list")))
        (answer,) = to_session(mux.from_server(jsonrpc.result(fwd["id"], jsonrpc.decode(jsonrpc.encode(tools)))), sid)
        assert [t["name"] for t in answer["result"]["tools"]] == names
    (fwd,) = to_server(mux.from_client("a", req(2, "resources/list")))
    listed = {"resources": [{"uri": "file:///public/a"}, {"uri": "file:///private/b"}], "nextCursor": "c"}
    (answer,) = to_session(mux.from_server(jsonrpc.result(fwd["id"], listed)), "a")
    assert answer["result"] == {"resources": [{"uri": "file:///public/a"}], "nextCursor": "c"}
    (fwd,) = to_server(mux.from_client("a", req(3, "prompts/list")))
    (answer,) = to_session(mux.from_server(jsonrpc.result(fwd["id"], {"prompts": [{"name": "public"}, {"name": "internal"}]})), "a")
    assert answer["result"]["prompts"] == [{"name": "public"}]


def test_a_hidden_tool_is_answered_as_the_server_answers_an_unknown_one() -> None:
    mux = filtered_mux()
    (probe,) = to_server(mux.from_client("a", req(7, "tools/call", name="secret_key", arguments={"x": "do not send"})))
    assert probe["params"] == {"name": "mcp-bridge-hidden-tool"}  # neither the name nor the arguments
    server_says = jsonrpc.error(probe["id"], -32602, "Tool mcp-bridge-hidden-tool not found")
    (answer,) = to_session(mux.from_server(server_says), "a")
    assert answer == jsonrpc.error(7, -32602, "Tool secret_key not found")
    # Learned: the next hidden call never reaches the server.
    actions = mux.from_client("a", req(8, "tools/call", name='secret"2', arguments={}))
    assert to_server(actions) == []
    (answer,) = to_session(actions, "a")
    assert answer == jsonrpc.error(8, -32602, 'Tool secret"2 not found')
    (call,) = [a.call for a in actions if isinstance(a, ToSession)]
    assert call is not None and (call.target, call.principal) == ('secret"2', "alice")
    # b sees everything: its call goes through untouched.
    (fwd,) = to_server(mux.from_client("b", req(7, "tools/call", name="secret_key")))
    assert fwd["params"]["name"] == "secret_key"


def test_a_hidden_prompt_and_resource_are_refused_the_same_way() -> None:
    mux = filtered_mux()
    (probe,) = to_server(mux.from_client("a", req(1, "prompts/get", name="internal")))
    assert probe["params"] == {"name": "mcp-bridge-hidden-prompt"}
    (answer,) = to_session(mux.from_server(jsonrpc.error(probe["id"], -32602, "Unknown prompt: mcp-bridge-hidden-prompt")), "a")
    assert answer["error"]["message"] == "Unknown prompt: internal"
    (probe,) = to_server(mux.from_client("a", req(2, "resources/subscribe", uri="file:///private/b")))
    assert (probe["method"], probe["params"]) == ("resources/read", {"uri": "mcp-bridge://hidden"})
    not_found = {"jsonrpc": "2.0", "id": probe["id"], "error": {"code": -32002, "message": "Resource not found", "data": {"uri": "mcp-bridge://hidden"}}}
    (answer,) = to_session(mux.from_server(not_found), "a")
    assert answer["error"] == {"code": -32002, "message": "Resource not found", "data": {"uri": "file:///private/b"}}
    assert mux.table_sizes()["subscriptions"] == 0


PROBE_ARGUMENT = {"name": "mcp-bridge-hidden-argument", "value": ""}


def complete(rid: Any, ref: dict[str, Any], argument: str = "who", value: str = "typed-by-alice") -> dict[str, Any]:
    return req(rid, "completion/complete", ref=ref, argument={"name": argument, "value": value})


def test_a_completion_for_a_hidden_prompt_is_answered_as_for_an_unknown_one() -> None:
    mux = filtered_mux()
    # prompts/get has learned its answer already: a completion asks its own question.
    (probe,) = to_server(mux.from_client("a", req(1, "prompts/get", name="internal")))
    mux.from_server(jsonrpc.error(probe["id"], -32602, "Unknown prompt: mcp-bridge-hidden-prompt"))
    (probe,) = to_server(mux.from_client("a", complete(2, {"type": "ref/prompt", "name": "internal"})))
    assert probe["method"] == "completion/complete"
    assert probe["params"] == {"ref": {"type": "ref/prompt", "name": "mcp-bridge-hidden-prompt"}, "argument": PROBE_ARGUMENT}
    server_says = jsonrpc.error(probe["id"], -32602, "No prompt named mcp-bridge-hidden-prompt to complete")
    (answer,) = to_session(mux.from_server(server_says), "a")
    assert answer == jsonrpc.error(2, -32602, "No prompt named internal to complete")
    # Learned: the next one never reaches the server, and is not audited (no completion is).
    actions = mux.from_client("a", complete(3, {"type": "ref/prompt", "name": "private"}, value="more"))
    assert to_server(actions) == []
    (answer,) = to_session(actions, "a")
    assert answer == jsonrpc.error(3, -32602, "No prompt named private to complete")
    assert [a.call.target for a in actions if isinstance(a, ToSession)] == [None]  # type: ignore[union-attr]
    # A prompt it may see, and any prompt for b, go through untouched.
    for sid, name in (("a", "public"), ("b", "internal")):
        (fwd,) = to_server(mux.from_client(sid, complete(4, {"type": "ref/prompt", "name": name})))
        assert fwd["params"]["ref"]["name"] == name and fwd["params"]["argument"] == {"name": "who", "value": "typed-by-alice"}


def test_a_completion_for_a_hidden_resource_or_template_is_answered_as_for_an_unknown_one() -> None:
    mux = filtered_mux()
    (probe,) = to_server(mux.from_client("a", complete(1, {"type": "ref/resource", "uri": "file:///private/{name}"}, "name")))
    assert probe["params"] == {"ref": {"type": "ref/resource", "uri": "mcp-bridge://hidden"}, "argument": PROBE_ARGUMENT}
    # A server that completes nothing for what it does not have: that answer, as it is.
    (answer,) = to_session(mux.from_server(jsonrpc.result(probe["id"], {"completion": {"values": [], "hasMore": False}})), "a")
    assert answer == jsonrpc.result(1, {"completion": {"values": [], "hasMore": False}})
    actions = mux.from_client("a", complete(2, {"type": "ref/resource", "uri": "file:///private/b"}))
    assert to_server(actions) == [] and to_session(actions, "a") == [jsonrpc.result(2, {"completion": {"values": [], "hasMore": False}})]
    (fwd,) = to_server(mux.from_client("a", complete(3, {"type": "ref/resource", "uri": "file:///public/{name}"})))
    assert fwd["params"]["ref"]["uri"] == "file:///public/{name}"


@pytest.mark.parametrize(
    "params",
    [
        {"ref": {"type": "ref/prompt", "name": 7}, "argument": {"name": "x", "value": ""}},  # not a name: the server's to refuse
        {"ref": {"type": ["ref/prompt"], "name": "internal"}},
        {"ref": {"type": "ref/other", "name": "internal"}},
        {"ref": "internal"},
        {},
    ],
)
def test_a_completion_that_names_nothing_the_view_knows_goes_to_the_server_as_it_is(params: dict[str, Any]) -> None:
    mux = filtered_mux()
    (fwd,) = to_server(mux.from_client("a", req(1, "completion/complete", **params)))
    assert fwd.get("params", {}) == params


def test_unsubscribing_from_a_hidden_uri_is_answered_as_for_one_not_held() -> None:
    mux = filtered_mux()
    for sid in "ab":  # subscribed while a could still see it
        mux.set_view(sid, None)
        actions = mux.from_client(sid, req(1, "resources/subscribe", uri="file:///private/b"))
        for sub in to_server(actions):
            mux.from_server(jsonrpc.result(sub["id"], {}))
    mux.set_view("a", VIEW)  # a reload hides it from a
    # Never held, or held: {} from the bridge, as for any uri a session does not hold.
    for uri in ("file:///private/never", "file:///private/b"):
        actions = mux.from_client("a", req(2, "resources/unsubscribe", uri=uri))
        assert to_server(actions) == [] and to_session(actions, "a") == [jsonrpc.result(2, {})]
    assert mux.peer("a").subscriptions == set() and mux.table_sizes()["subscriptions"] == 1  # b still holds it
    assert to_session(mux.from_server(note("notifications/resources/updated", uri="file:///private/b"))) != []
    # The last holder of a subscription a reload hid: the bridge withdraws it, as when a session closes.
    mux.set_view("b", VIEW)
    actions = mux.from_client("b", req(2, "resources/unsubscribe", uri="file:///private/b"))
    (unsub,) = to_server(actions)
    assert unsub["params"] == {"uri": "file:///private/b"} and unsub["id"] != 2
    assert to_session(actions, "b") == [jsonrpc.result(2, {})]
    assert to_session(mux.from_server(jsonrpc.result(unsub["id"], {}))) == []
    assert mux.table_sizes()["subscriptions"] == 0


def test_updates_for_a_hidden_resource_reach_only_those_who_may_see_it() -> None:
    mux = filtered_mux()
    (sub,) = to_server(mux.from_client("b", req(1, "resources/subscribe", uri="file:///")))
    mux.from_server(jsonrpc.result(sub["id"], {}))
    mux.from_client("a", req(1, "resources/subscribe", uri="file:///"))
    (both,) = mux.from_server(note("notifications/resources/updated", uri="file:///public/x"))
    assert set(both.sessions) == {"a", "b"}  # type: ignore[union-attr]
    (only_b,) = mux.from_server(note("notifications/resources/updated", uri="file:///private/x"))
    assert only_b.sessions == ("b",)  # type: ignore[union-attr]


def test_a_reload_changes_what_an_open_session_sees() -> None:
    mux = filtered_mux()
    mux.set_view("a", None)
    (fwd,) = to_server(mux.from_client("a", req(1, "tools/call", name="secret_key")))
    assert fwd["params"]["name"] == "secret_key"
    assert not [a for a in mux.from_server(jsonrpc.result(fwd["id"], {})) if isinstance(a, (Discard, ToServer))]



def test_resource_templates_are_filtered_by_their_uri_template() -> None:
    mux = filtered_mux()
    (fwd,) = to_server(mux.from_client("a", req(1, "resources/templates/list")))
    listed = {"resourceTemplates": [{"uriTemplate": "file:///public/{name}"}, {"uriTemplate": "file:///private/{name}"}]}
    (answer,) = to_session(mux.from_server(jsonrpc.result(fwd["id"], listed)), "a")
    assert [t["uriTemplate"] for t in answer["result"]["resourceTemplates"]] == ["file:///public/{name}"]


# ------------------------------------------------------------------ rate limits


def limiter(default: RateLimit, **rules: RateLimit) -> tuple[RateLimiter, Counter[str | None], Counter[tuple[str | None, str]]]:
    in_flight: Counter[str | None] = Counter()
    refused: Counter[tuple[str | None, str]] = Counter()
    return RateLimiter(default, rules, in_flight, refused), in_flight, refused


def test_calls_in_flight_are_capped_per_principal_counting_every_call_of_a_batch() -> None:
    limits, in_flight, refused = limiter(RateLimit(in_flight=3), ci=RateLimit(in_flight=1))
    in_flight["ops"] = 1
    limits.admit("ops", 2)  # 1 + 2: at the cap, not over it
    in_flight["ops"] = 2
    with pytest.raises(Throttled) as raised:
        limits.admit("ops", 2)
    assert (raised.value.limit, raised.value.retry_after) == ("in_flight", 1)
    assert refused == {("ops", "in_flight"): 2}
    limits.admit("ci", 1)
    in_flight["ci"] = 1
    with pytest.raises(Throttled):
        limits.admit("ci", 1)  # its token's own cap, not the default
    limits.admit(None, 3)  # no tokens configured: the default


def test_the_rate_limit_allows_its_burst_and_says_when_to_try_again() -> None:
    limits, _, refused = limiter(RateLimit(per_second=0.25))  # burst: max(1, per_second)
    limits.admit("ops", 1)
    with pytest.raises(Throttled) as raised:
        limits.admit("ops", 1)
    assert (raised.value.limit, raised.value.retry_after) == ("rate", 4)  # one call at 0.25 a second
    assert refused == {("ops", "rate"): 1}
    fast, _, _ = limiter(RateLimit(per_second=5))
    fast.admit("ops", 5)  # a bucket starts full: a burst of per_second calls
