"""bridge/stateless.py without IO: envelope and header checks, decoration, requestState."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core import request_state
from bridge.core.cluster import Cluster
from bridge.core.request_state import State, StateKeys
from bridge.protocol import jsonrpc, mcp, stateless
from bridge.protocol.stateless import Headers, StatelessError

META = {mcp.VERSION_KEY: "2026-07-28", mcp.CAPABILITIES_KEY: {}}


def call(name: str = "sql", **arguments: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments, "_meta": META}}


def headers(name: str | None = "sql", **params: str) -> Headers:
    return Headers("2026-07-28", "tools/call", name, {k.lower(): v for k, v in params.items()})


SQL_TOOL = {
    "name": "sql",
    "inputSchema": {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "limit": {"type": "integer", "x-mcp-header": "Limit"},
            "where": {"type": "object", "properties": {"tenant": {"type": "string", "x-mcp-header": "Tenant"}}},
            "query": {"type": "string"},
        },
    },
}


def check(msg: dict[str, Any], sent: Headers) -> None:
    found = stateless.tool_headers(SQL_TOOL)
    assert found is not None
    stateless.check_headers(msg, stateless.envelope(msg), sent, found[1])


def test_tool_headers_follow_properties_only() -> None:
    assert stateless.tool_headers(SQL_TOOL) == ("sql", {"region": ("region",), "limit": ("limit",), "tenant": ("where", "tenant")})
    assert stateless.tool_headers({"name": "plain", "inputSchema": {"type": "object"}}) is None


def test_mcp_param_headers_must_mirror_the_arguments() -> None:
    check(call(region="us-west1", limit=42, where={"tenant": "acme"}), headers(Region="us-west1", Limit="42.0", Tenant="acme"))
    check(call(region="Hello, 世界"), headers(Region="=?base64?SGVsbG8sIOS4lueVjA==?="))
    check(call(query="no mirrored argument"), headers())
    for msg, sent in (
        (call(region="us-west1"), headers()),  # missing
        (call(region="us-west1"), headers(Region="eu-west1")),  # different
        (call(), headers(Region="us-west1")),  # sent for an absent argument
        (call(limit=42), headers(Limit="43")),
        (call(region="x"), headers(Region="=?base64?not base64?=")),
        (call(name="=?base64?Z3JlZXQ=?="), headers(name="=?base64?Z3JlZXQ=?=")),  # the header means "greet": not the body's name
    ):
        with pytest.raises(StatelessError) as refused:
            check(msg, sent)
        assert refused.value.code == mcp.HEADER_MISMATCH and refused.value.status == 400


def test_an_encoded_header_is_taken_only_in_its_canonical_base64() -> None:
    """`=?base64?...?=` has one spelling per value: one whose last character carries bits the
    value does not have (Z3JlZXR= also decodes to "greet"), or that is cut short of its
    padding, is refused as not mirroring the body, on Mcp-Name and Mcp-Param-* alike: a
    proxy or policy that reads the header must see what the server gets."""
    assert stateless.decode_header("=?base64?Z3JlZXQ=?=") == "greet"
    for odd in ("=?base64?Z3JlZXR=?=", "=?base64?Z3JlZXQ?=", "=?base64?Z3Jl ZXQ=?="):
        assert stateless.decode_header(odd) is None, odd
    check(call(name="greet"), headers(name="=?base64?Z3JlZXQ=?="))
    check(call(region="greet"), headers(Region="=?base64?Z3JlZXQ=?="))
    for msg, sent in (
        (call(name="greet"), headers(name="=?base64?Z3JlZXR=?=")),
        (call(region="greet"), headers(Region="=?base64?Z3JlZXR=?=")),
    ):
        with pytest.raises(StatelessError) as refused:
            check(msg, sent)
        assert (refused.value.code, refused.value.status) == (mcp.HEADER_MISMATCH, 400)
        assert refused.value.message.startswith("header mismatch: Mcp-"), refused.value.message


def answered(message: dict[str, Any], method: str, server: stateless.Server) -> tuple[dict[str, Any], int]:
    status = stateless.complete(message, method, server)
    retried = jsonrpc.decode(stateless.with_id(jsonrpc.encode(message), "retry-7"))
    assert retried == {**message, "id": "retry-7"}
    return retried, status


def test_results_are_decorated_and_old_codes_mapped() -> None:
    server = stateless.Server({"name": "s", "version": "1"}, "private")
    listed, status = answered({"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "t"}]}}, "tools/list", server)
    assert status == 200 and listed["id"] == "retry-7"
    assert listed["result"] == {
        "tools": [{"name": "t"}], "resultType": "complete", "_meta": {mcp.SERVER_INFO_KEY: server.info}, "ttlMs": 0, "cacheScope": "private",
    }  # fmt: skip
    kept = {"_meta": {"progress": 1}, "content": [], "resultType": "complete"}
    called, _ = answered({"jsonrpc": "2.0", "id": 1, "result": kept}, "tools/call", server)
    assert "ttlMs" not in called["result"] and called["result"]["_meta"] == {"progress": 1, mcp.SERVER_INFO_KEY: server.info}
    missing, status = answered({"jsonrpc": "2.0", "id": 1, "error": {"code": -32002, "message": "no"}}, "resources/read", server)
    assert missing["error"]["code"] == -32602 and status == 400
    unknown, status = answered({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no"}}, "x/y", server)
    assert unknown["error"]["code"] == -32601 and status == 404
    odd, status = answered({"jsonrpc": "2.0", "id": 1, "result": None}, "tools/call", server)
    assert odd["result"] is None and status == 200


def test_request_state_is_sealed_bound_and_expires() -> None:
    keys = StateKeys()
    state = State("park", "alice", "tools/call", request_state.digest({"name": "t", "_meta": {"x": 1}}), "demo")
    token = keys.seal(state, 60)
    assert keys.open(token, 1) == state
    assert request_state.digest({"name": "t", "requestState": token, "inputResponses": {}}) == state.digest
    assert StateKeys.peek(token) == "park"
    with pytest.raises(StatelessError, match="not valid"):
        keys.open(token[:-2] + ("AA" if not token.endswith("AA") else "BB"), 1)
    with pytest.raises(StatelessError, match="not valid"):
        StateKeys().open(token, 1)  # another daemon's key
    with pytest.raises(StatelessError, match="expired"):
        keys.open(keys.seal(state, -5), 1)
    with pytest.raises(StatelessError, match="must be a string"):
        keys.open(None, 1)


def test_in_a_cluster_a_state_names_its_owner_and_any_replica_opens_it() -> None:
    """Keys derived from the peer key: a peer opens the state and reads its owner; during a
    key rotation the previous key still opens it; another cluster's key does not."""
    old, new = "old-peer-key-0123456789abcdef0123", "new-peer-key-0123456789abcdef0123"
    a = Cluster("10.0.0.7:8080", old)
    sealer = StateKeys(a.derived("requestState"), a.me)
    state = State("park", None, "tools/call", "d", "demo", a.me)
    token = sealer.seal(state, 60)
    assert StateKeys(Cluster("10.0.0.8:8080", old).derived("requestState")).open(token, 1) == state
    assert StateKeys(Cluster("10.0.0.8:8080", new, old).derived("requestState")).open(token, 1) == state
    assert a.derived("requestState") != a.derived("session ids")
    with pytest.raises(StatelessError, match="not valid"):
        StateKeys(Cluster("10.0.0.8:8080", new).derived("requestState")).open(token, 1)
    alone = StateKeys()
    assert alone.open(alone.seal(state, 60), 1).owner is None  # without a cluster no owner is named


def test_a_request_without_its_envelope_is_refused_with_its_id() -> None:
    """What the dispatcher takes for a 2026-07-28 request may have no params or _meta at all."""
    for rid, params in ((101, None), (102, {}), (103, {"_meta": "not an object"}), (104, {"_meta": {mcp.CAPABILITIES_KEY: {}}})):
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": "server/discover"}
        if params is not None:
            msg["params"] = params
        with pytest.raises(StatelessError) as refused:
            stateless.envelope(msg)
        assert (refused.value.code, refused.value.status, refused.value.request_id) == (-32602, 400, rid)
        assert mcp.VERSION_KEY in refused.value.message and "initialize" in refused.value.message


# ------------------------------------------------------------------ admit: every check, exact


def request(method: str = "tools/list", version: str = "2026-07-28", **params: Any) -> dict[str, Any]:
    meta = {mcp.VERSION_KEY: version, mcp.CAPABILITIES_KEY: {}}
    if "level" in params:
        meta[mcp.LOG_LEVEL_KEY] = params.pop("level")
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": meta}}


def mirrored(msg: dict[str, Any], **over: Any) -> Headers:
    fields = {"version": msg["params"]["_meta"][mcp.VERSION_KEY], "method": msg["method"], "name": msg["params"].get("name"), "params": {}}
    return Headers(**{**fields, **over})


def refusal(msg: dict[str, Any], sent: Headers, accept: str = "application/json, text/event-stream") -> StatelessError:
    with pytest.raises(StatelessError) as info:
        stateless.admit(msg, sent, accept, None)
    assert info.value.request_id == 7
    return info.value


def test_a_request_whose_headers_mirror_its_body_is_admitted() -> None:
    msg = request("tools/call", name="sql", arguments={})
    assert stateless.admit(msg, mirrored(msg), "application/json, text/event-stream", None).version == "2026-07-28"


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"repeated": "Mcp-Method"}, "Mcp-Method appears more than once"),
        ({"version": "2025-11-25"}, "MCP-Protocol-Version '2025-11-25' does not match the body's '2026-07-28'"),
        ({"method": "tools/list"}, "Mcp-Method 'tools/list' does not match the body's 'tools/call'"),
        ({"name": "other"}, "Mcp-Name 'other' does not match the body's name 'sql'"),
    ],
)
def test_a_header_that_does_not_mirror_the_body_is_32020(over: dict[str, Any], says: str) -> None:
    msg = request("tools/call", name="sql", arguments={})
    error = refusal(msg, mirrored(msg, **over))
    assert (error.code, error.status, error.message) == (mcp.HEADER_MISMATCH, 400, f"header mismatch: {says}")


def test_an_argument_a_header_must_mirror_needs_that_header() -> None:
    msg = call(region="eu")
    with pytest.raises(StatelessError, match="Mcp-Param-region is missing for argument region") as info:
        check(msg, headers())
    assert info.value.code == mcp.HEADER_MISMATCH


def test_an_unsupported_version_is_32022_naming_the_supported_ones() -> None:
    msg = request(version="2099-01-01")
    error = refusal(msg, mirrored(msg))
    assert error.code == mcp.UNSUPPORTED_VERSION and error.data["requested"] == "2099-01-01"
    assert "2026-07-28" in error.data["supported"]


@pytest.mark.parametrize("method", sorted(mcp.REMOVED))
def test_a_method_the_revision_removed_is_32601(method: str) -> None:
    msg = request(method)
    error = refusal(msg, mirrored(msg))
    assert (error.code, error.message) == (jsonrpc.METHOD_NOT_FOUND, f"method {method!r} was removed in protocol version 2026-07-28")


def test_listen_needs_an_event_stream_and_other_requests_either_form() -> None:
    listen = request(mcp.LISTEN)
    error = refusal(listen, mirrored(listen), accept="application/json")
    assert (error.code, error.status, error.message) == (jsonrpc.INVALID_REQUEST, 406, "subscriptions/listen needs Accept: text/event-stream")
    listing = request()
    assert stateless.admit(listing, mirrored(listing), "text/event-stream", None)
    assert stateless.admit(listing, mirrored(listing), "application/json", None)
    assert refusal(listing, mirrored(listing), accept="image/png").status == 406


def test_a_log_level_that_does_not_exist_is_32602() -> None:
    msg = request(level="loud")
    error = refusal(msg, mirrored(msg))
    assert error.code == jsonrpc.INVALID_PARAMS and "must be one of" in error.message
    assert stateless.envelope(request(level="warning")).log_level == "warning"


def test_a_state_lives_as_long_as_its_ttl_says() -> None:
    import time

    import jwt

    before = time.time()
    token = StateKeys().seal(State("park", None, "tools/call", "d", "demo"), 60)
    expires = jwt.decode(token, options={"verify_signature": False})["exp"]
    assert before + 60 <= expires <= time.time() + 62


def test_a_retry_must_repeat_the_calls_params() -> None:
    first = request_state.digest({"name": "sql", "arguments": {"query": "select 1"}})
    assert request_state.digest({"name": "sql", "arguments": {"query": "select 2"}}) != first
    assert request_state.digest({"name": "other", "arguments": {"query": "select 1"}}) != first
