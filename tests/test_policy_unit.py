"""Filters and views (bridge/policy.py), and the mux applying them, with no IO."""

from __future__ import annotations

from typing import Any

from bridge import jsonrpc
from bridge.config import Filter, parse
from bridge.mux import Discard, ToServer, ToSession
from bridge.policy import Rule, View, views
from test_mux import note, ready_mux, req, to_server, to_session


def test_a_rule_matches_exact_names_and_globs_and_deny_wins() -> None:
    rule = Rule.of(Filter(allow=("get_*", "echo", "v?"), deny=("get_secret*",)))
    assert rule is not None
    assert [n for n in ("echo", "get_time", "get_secret_key", "v1", "v10", "echo2", "x") if rule.admits(n)] == ["echo", "get_time", "v1"]
    assert Rule.of(Filter()) is None  # nothing to filter
    nothing = Rule.of(Filter(allow=()))
    assert nothing is not None and not nothing.admits("echo")
    assert not Rule.of(Filter(deny=("*",))).admits("anything")  # type: ignore[union-attr]
    assert Rule.of(Filter(allow=("a.b",))).admits("a.b") and not Rule.of(Filter(allow=("a.b",))).admits("aXb")  # type: ignore[union-attr]


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


def test_config_rejects_a_filter_for_an_unknown_server() -> None:
    import pytest
    from bridge.config import ConfigError

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

