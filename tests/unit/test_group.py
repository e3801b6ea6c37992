"""What a group adds to its members' sessions (bridge/core/group.py), rule by rule, with no IO."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.group import (
    FANOUT_ID,
    Asked,
    Cursor,
    CursorError,
    GroupSession,
    Names,
    Routes,
    ToClient,
    ToMember,
    merge_initialize,
    merge_list,
)
from bridge.protocol import jsonrpc

NAMES = Names(("github", "files", "time"), "__")


def test_a_name_is_shown_with_its_member_and_split_back() -> None:
    assert NAMES.show("github", "search_issues") == "github__search_issues"
    assert NAMES.split("github__search_issues") == ("github", "search_issues")
    assert NAMES.split("time__get__current") == ("time", "get__current")  # the first separator after the member
    assert NAMES.split("github__") is None and NAMES.split("nobody__x") is None and NAMES.split(7) is None
    assert NAMES.show("github", "has space") is None and NAMES.show("github", "x" * 121) is None  # past 128
    assert NAMES.show("github", "x" * 120) == "github__" + "x" * 120


def test_lists_merge_in_the_members_order_named_and_paged() -> None:
    routes = Routes()
    page = merge_list(
        "tools/list", NAMES,
        [("github", {"tools": [{"name": "search", "description": "d"}, {"name": "bad name"}], "nextCursor": "g2"}), ("time", {"tools": [{"name": "now"}]})],
        routes,
    )  # fmt: skip
    assert [t["name"] for t in page.result["tools"]] == ["github__search", "time__now"]
    assert page.result["tools"][0]["description"] == "d"
    assert page.left_out == [("github", "bad name")]
    assert Cursor.decode(page.result["nextCursor"], NAMES.members) == {"github": "g2"}
    last = merge_list("resources/list", NAMES, [("files", {"resources": [{"uri": "file:///a"}]})], routes)
    assert last.result == {"resources": [{"uri": "file:///a"}]}  # a URI is shown as it is; no more pages


@pytest.mark.parametrize("cursor", ["", "!!", "e30", "eyJub2JvZHkiOiJ4In0", 7, "x" * 20000])  # e30: {}; the other: {"nobody": "x"}
def test_a_cursor_the_group_did_not_give_is_refused(cursor: Any) -> None:
    with pytest.raises(CursorError):
        Cursor.decode(cursor, NAMES.members)


@given(st.dictionaries(st.sampled_from(NAMES.members), st.text(max_size=40), min_size=1))
def test_a_cursor_round_trips(more: dict[str, str]) -> None:
    cursor = Cursor.encode(more)
    assert cursor is not None and Cursor.decode(cursor, NAMES.members) == more


def test_a_uri_goes_to_the_member_that_listed_it_else_to_one_whose_template_matches() -> None:
    routes = Routes(limit=2)
    merge_list("resources/templates/list", NAMES, [("files", {"resourceTemplates": [{"uriTemplate": "file:///{path}"}]}),
                                                   ("github", {"resourceTemplates": [{"uriTemplate": "repo://{+path}"}]})], routes)  # fmt: skip
    routes.listed("time", "file:///clock")
    assert routes.member_of("file:///clock", NAMES.members) == "time"  # listed beats a template
    assert routes.member_of("file:///notes", NAMES.members) == "files"
    assert routes.member_of("file:///a/b", NAMES.members) is None  # {path} is one segment
    assert routes.member_of("repo://a/b/c", NAMES.members) == "github"  # {+path} is anything
    assert routes.member_of("other://x", NAMES.members) is None
    routes.listed("time", "time://1")
    routes.listed("time", "time://2")
    assert routes.member_of("file:///clock", NAMES.members) == "files"  # bounded: the oldest URI forgotten
    routes.forget("files")
    assert routes.member_of("file:///notes", NAMES.members) is None


def init(version: str, capabilities: dict[str, Any], instructions: str | None = None) -> dict[str, Any]:
    out = {"protocolVersion": version, "capabilities": capabilities, "serverInfo": {"name": "x", "version": "1"}}
    return out | ({"instructions": instructions} if instructions else {})


def test_initialize_declares_what_one_member_has_and_the_version_all_speak() -> None:
    merged = merge_initialize("team", "2025-11-25", [
        ("github", init("2025-11-25", {"tools": {"listChanged": True}}, "Use search first.")),
        ("files", init("2025-06-18", {"tools": {}, "resources": {"subscribe": True, "listChanged": False}, "experimental": {"x": {}}})),
        ("time", init("2025-11-25", {"logging": {}})),
    ])  # fmt: skip
    assert merged["capabilities"] == {"tools": {"listChanged": True}, "resources": {"subscribe": True}, "logging": {}}
    assert merged["protocolVersion"] == "2025-06-18"  # the oldest: what every member speaks
    assert merged["serverInfo"]["name"] == "team" and merged["instructions"] == "## github\n\nUse search first."
    same = merge_initialize("team", "2025-11-25", [("a", init("2025-11-25", {})), ("b", init("2025-11-25", {}))])
    assert same["protocolVersion"] == "2025-11-25" and same["capabilities"] == {} and "instructions" not in same


def test_a_server_request_is_answered_back_to_its_member_under_its_own_id() -> None:
    asked = Asked(limit=2)
    first, second = asked.ask("github", 1), asked.ask("files", 1)  # the same id from two members
    assert first != second
    assert asked.answered(second) == ("files", 1) and asked.answered(second) is None  # once
    asked.ask("time", "t")
    asked.ask("time", "u")  # past the limit: the oldest is forgotten
    assert asked.answered(first) is None and len(asked) == 2
    asked.forget("time")
    assert len(asked) == 0


# ------------------------------------------------------------------- one session



def req(rid: Any, method: str, **params: Any) -> dict[str, Any]:
    return jsonrpc.request(rid, method, params)


def answer_all(session: GroupSession, outs: list[Any], result: Any) -> list[Any]:
    """Each member answers the group's own request it was sent with `result(member, params)`."""
    back: list[Any] = []
    for out in outs:
        assert isinstance(out, ToMember) and str(out.message["id"]).startswith(FANOUT_ID), out
        back += session.from_member(out.member, jsonrpc.result(out.message["id"], result(out.member, out.message.get("params") or {})))
    return back


def ready() -> GroupSession:
    session = GroupSession("team", Names(("github", "time"), "__"))
    outs = session.from_client(req(0, "initialize", protocolVersion="2025-11-25", capabilities={"sampling": {}}, clientInfo={}))
    assert {o.member for o in outs} == {"github", "time"} and all(o.message["params"]["capabilities"] == {"sampling": {}} for o in outs)
    (done,) = answer_all(session, outs, lambda m, p: init("2025-11-25", {"tools": {"listChanged": True}}))
    assert done == ToClient(jsonrpc.result(0, done.message["result"]), 0, True) and done.message["result"]["serverInfo"]["name"] == "team"
    assert session.from_client(jsonrpc.notification("notifications/initialized")) == [
        ToMember("github", jsonrpc.notification("notifications/initialized")), ToMember("time", jsonrpc.notification("notifications/initialized")),
    ]  # fmt: skip
    return session


def test_a_call_goes_to_its_member_by_its_own_name_and_its_answer_comes_back_as_it_is() -> None:
    session = ready()
    (out,) = session.from_client(req(7, "tools/call", name="time__now", arguments={"tz": "UTC"}))
    assert out == ToMember("time", req(7, "tools/call", name="now", arguments={"tz": "UTC"}))
    progress = jsonrpc.notification("notifications/progress", {"progressToken": "t", "progress": 1})
    assert session.from_member("time", progress, 7) == [ToClient(progress, 7, False)]
    assert session.from_member("time", jsonrpc.result(7, {"content": []}), 7, True) == [ToClient(jsonrpc.result(7, {"content": []}), 7, True)]
    (refused,) = session.from_client(req(8, "tools/call", name="nobody__now"))
    assert refused.message["error"] == {"code": -32602, "message": "Unknown tool: nobody__now"}


def test_lists_are_asked_of_every_member_merged_and_paged_by_the_groups_cursor() -> None:
    session = ready()
    outs = session.from_client(req(1, "tools/list"))
    (page,) = answer_all(session, outs, lambda m, p: {"tools": [{"name": "a"}], **({"nextCursor": "n"} if m == "github" else {})})
    assert [t["name"] for t in page.message["result"]["tools"]] == ["github__a", "time__a"]
    outs = session.from_client(req(2, "tools/list", cursor=page.message["result"]["nextCursor"]))
    assert [(o.member, o.message["params"]) for o in outs] == [("github", {"cursor": "n"})]  # only the member with more
    (last,) = answer_all(session, outs, lambda m, p: {"tools": [{"name": "b"}]})
    assert last.message["result"] == {"tools": [{"name": "github__b"}]}
    (bad,) = session.from_client(req(3, "tools/list", cursor="forged"))
    assert bad.message["error"]["code"] == -32602


def test_a_resource_goes_to_the_member_that_listed_it_and_one_nobody_listed_is_not_found() -> None:
    session = ready()
    outs = session.from_client(req(1, "resources/list"))
    answer_all(session, outs, lambda m, p: {"resources": [{"uri": f"{m}://doc", "name": "doc"}]})
    (out,) = session.from_client(req(2, "resources/read", uri="time://doc"))
    assert out == ToMember("time", req(2, "resources/read", uri="time://doc"))
    (missing,) = session.from_client(req(3, "resources/read", uri="other://doc"))
    assert missing.message["error"]["code"] == -32002 and missing.message["error"]["data"] == {"uri": "other://doc"}


def test_a_members_question_reaches_the_client_under_the_groups_id_and_the_answer_goes_back() -> None:
    session = ready()
    ask = req(5, "sampling/createMessage", messages=[])
    (asked_github,) = session.from_member("github", ask, 9)
    (asked_time,) = session.from_member("time", ask, 10)  # the same id from another member
    assert asked_github.message["id"] != asked_time.message["id"] and asked_github.related == 9
    withdrawn = jsonrpc.notification("notifications/cancelled", {"requestId": 5})
    (told,) = session.from_member("time", withdrawn)
    assert told.message["params"]["requestId"] == asked_time.message["id"]
    assert session.from_client(jsonrpc.result(asked_github.message["id"], {"role": "assistant"})) == [ToMember("github", jsonrpc.result(5, {"role": "assistant"}))]
    assert session.from_client(jsonrpc.result(asked_github.message["id"], {})) == []  # answered once


def test_a_member_that_goes_fails_what_waits_on_it_and_the_rest_answer() -> None:
    session = ready()
    session.from_client(req(7, "tools/call", name="time__now"))
    outs = session.from_client(req(8, "tools/list"))
    gone = session.member_gone("time", "its server failed")
    assert [o.message["id"] for o in gone] == [7] and "member 'time' of group 'team': its server failed" in gone[0].message["error"]["message"]
    (page,) = [o for out in outs if out.member == "github" for o in session.from_member("github", jsonrpc.result(out.message["id"], {"tools": [{"name": "a"}]}))]
    assert page.message["result"]["tools"] == [{"name": "github__a"}]  # the list comes without it
    (cancel,) = session.from_client(req(9, "tools/call", name="github__a")) and session.from_client(jsonrpc.notification("notifications/cancelled", {"requestId": 9}))
    assert cancel == ToMember("github", jsonrpc.notification("notifications/cancelled", {"requestId": 9}))


def test_an_answer_to_the_groups_request_counts_only_from_the_member_asked() -> None:
    session = ready()
    outs = session.from_client(req(1, "tools/list"))
    by_member = {o.member: o.message["id"] for o in outs}
    assert session.from_member("time", jsonrpc.result(by_member["github"], {"tools": [{"name": "forged"}]})) == []
    assert session.from_member("time", jsonrpc.result(by_member["time"], {"tools": [{"name": "now"}]})) == []  # github has not answered
    (page,) = session.from_member("github", jsonrpc.result(by_member["github"], {"tools": [{"name": "search"}]}))
    assert [t["name"] for t in page.message["result"]["tools"]] == ["github__search", "time__now"]


def test_a_list_is_answered_by_its_timeout_and_a_late_member_is_announced() -> None:
    session = ready()
    outs = session.from_client(req(1, "tools/list"))
    by_member = {o.member: o.message["id"] for o in outs}
    assert session.from_member("github", jsonrpc.result(by_member["github"], {"tools": [{"name": "search"}]})) == []
    (page,) = session.overdue(1)
    assert page.message["result"]["tools"] == [{"name": "github__search"}] and page.final
    assert session.overdue(1) == []  # answered once
    late = session.from_member("time", jsonrpc.result(by_member["time"], {"tools": [{"name": "now"}]}))
    assert late == [ToClient(jsonrpc.notification("notifications/tools/list_changed"))]


def test_an_error_the_bridge_made_for_a_member_names_it_and_a_servers_own_is_kept() -> None:
    session = ready()
    session.from_client(req(7, "tools/call", name="time__now"))
    (out,) = session.from_member("time", jsonrpc.error(7, jsonrpc.SERVER_EXITED, "server process exited with code 3"), 7, True)
    assert out.message["error"] == {"code": -32000, "message": "member 'time' of group 'team': server process exited with code 3"}
    session.from_client(req(8, "tools/call", name="time__now"))
    own = jsonrpc.error(8, jsonrpc.INVALID_PARAMS, "bad tz")
    assert session.from_member("time", own, 8, True) == [ToClient(own, 8, True)]
    session.from_client(req(9, "tools/call", name="time__slow"))
    (twice,) = session.from_client(req(9, "tools/call", name="github__a"))  # the same id while one is in flight
    assert twice.message["error"]["code"] == jsonrpc.INVALID_REQUEST


def test_a_task_goes_to_the_member_that_runs_it() -> None:
    session = ready()
    session.from_client(req(7, "tools/call", name="time__later", task={"ttl": 1000}))
    session.from_member("time", jsonrpc.result(7, {"task": {"taskId": "t-1", "status": "working"}}), 7, True)
    (out,) = session.from_client(req(8, "tasks/get", taskId="t-1"))
    assert out == ToMember("time", req(8, "tasks/get", taskId="t-1"))
    session.from_member("github", jsonrpc.notification("notifications/tasks/status", {"taskId": "g-1", "status": "working"}))
    (out,) = session.from_client(req(9, "tasks/result", taskId="g-1"))
    assert out.member == "github"
    (unknown,) = session.from_client(req(10, "tasks/cancel", taskId="nobody's"))
    assert unknown.message["error"] == {"code": -32602, "message": "Unknown task: nobody's"}


def test_members_that_join_are_initialized_as_the_client_did_and_those_that_leave_fail_their_calls() -> None:
    session = ready()
    session.from_client(req(7, "tools/call", name="time__now"))
    left = session.leave("time", "it left the group")
    assert left[0].message["id"] == 7 and "it left the group" in left[0].message["error"]["message"]
    assert [o.message["method"] for o in left[1:]] == ["notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/resources/list_changed"]
    assert session.names.members == ("github",)
    (asked,) = session.join("files", ("files", "github"))
    assert asked.member == "files" and asked.message["method"] == "initialize" and asked.message["params"]["capabilities"] == {"sampling": {}}
    assert session.names.members == ("github",)  # not before it answers
    joined = session.from_member("files", jsonrpc.result(asked.message["id"], init("2025-11-25", {})))
    assert joined[0] == ToMember("files", jsonrpc.notification("notifications/initialized")) and len(joined) == 4
    assert session.names.members == ("files", "github")


def test_a_uri_nobody_listed_goes_to_the_one_member_with_resources() -> None:
    session = GroupSession("team", Names(("github", "time"), "__"))
    outs = session.from_client(req(0, "initialize", protocolVersion="2025-11-25", capabilities={}, clientInfo={}))
    answer_all(session, outs, lambda m, p: init("2025-11-25", {"resources": {}} if m == "time" else {"tools": {}}))
    (out,) = session.from_client(req(1, "resources/read", uri="greeting://Ada"))
    assert out.member == "time"


def test_a_member_that_joins_before_the_client_initializes_is_simply_one_of_the_members() -> None:
    session = GroupSession("team", Names(("github",), "__"))
    assert session.join("time", ("github", "time")) == []  # the client's initialize will reach it
    assert session.names.members == ("github", "time")
    assert {o.member for o in session.from_client(req(0, "initialize", protocolVersion="2025-11-25", capabilities={}, clientInfo={}))} == {"github", "time"}


def test_a_uri_listed_by_a_member_the_session_does_not_have_goes_nowhere() -> None:
    routes = Routes()
    routes.listed("github", "gh://doc")
    assert routes.member_of("gh://doc", ("github", "time")) == "github"
    assert routes.member_of("gh://doc", ("time",)) is None
