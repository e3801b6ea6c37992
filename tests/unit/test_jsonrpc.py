"""JSON-RPC as the bridge speaks it, with no IO: what it builds, accepts and refuses."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import Kind, ProtocolError


def test_the_bridges_own_error_objects_have_exactly_code_and_message() -> None:
    # JSON-RPC 2.0 section 5.1: `data` "may be omitted"; the bridge has none to give, so none is sent.
    assert jsonrpc.error(7, jsonrpc.REQUEST_TIMEOUT, "request timed out") == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32001, "message": "request timed out"},
    }
    assert jsonrpc.encode(jsonrpc.error(None, jsonrpc.PARSE_ERROR, "bad")) == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}'
    )
    assert jsonrpc.error("x", 1, "m", data={"why": 0})["error"] == {"code": 1, "message": "m", "data": {"why": 0}}


def test_results_requests_and_notifications_have_exactly_their_members() -> None:
    assert jsonrpc.result("a", {}) == {"jsonrpc": "2.0", "id": "a", "result": {}}
    assert jsonrpc.request(1, "ping") == {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert jsonrpc.request(1, "m", {}) == {"jsonrpc": "2.0", "id": 1, "method": "m", "params": {}}
    assert jsonrpc.notification("n") == {"jsonrpc": "2.0", "method": "n"}
    assert jsonrpc.notification("n", {"k": 1}) == {"jsonrpc": "2.0", "method": "n", "params": {"k": 1}}


@pytest.mark.parametrize("request_id", [5, "five", None])
def test_a_protocol_error_answers_the_request_it_names(request_id: Any) -> None:
    exc = ProtocolError(jsonrpc.INVALID_PARAMS, "invalid params: x", request_id)
    assert exc.response() == jsonrpc.error(request_id, jsonrpc.INVALID_PARAMS, "invalid params: x")
    assert str(exc) == exc.message == "invalid params: x"


@pytest.mark.parametrize(
    ("msg", "kind"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "m"}, Kind.REQUEST),
        ({"jsonrpc": "2.0", "id": "s", "method": "m", "params": {}}, Kind.REQUEST),
        ({"jsonrpc": "2.0", "id": 0, "method": "m"}, Kind.REQUEST),
        ({"jsonrpc": "2.0", "method": "m"}, Kind.NOTIFICATION),
        ({"jsonrpc": "2.0", "method": "m", "params": None}, Kind.NOTIFICATION),
        ({"jsonrpc": "2.0", "id": 1, "result": None}, Kind.RESPONSE),
        ({"jsonrpc": "2.0", "id": "s", "error": {"code": 1, "message": "m"}}, Kind.RESPONSE),
    ],
)
def test_classify(msg: Any, kind: Kind) -> None:
    assert jsonrpc.classify(msg) is kind


@pytest.mark.parametrize(
    ("msg", "reason", "request_id"),
    [
        ([], "must be a JSON object", None),
        ({"id": 3, "method": "m"}, '"jsonrpc" must be "2.0"', 3),
        ({"jsonrpc": "1.0", "id": "r", "method": "m"}, '"jsonrpc" must be "2.0"', "r"),
        ({"jsonrpc": "1.0", "id": {"r": 1}, "method": "m"}, '"jsonrpc" must be "2.0"', None),  # not an id: not echoed
        ({"jsonrpc": "2.0", "id": [1], "method": 3}, '"method" must be a string', None),
        ({"jsonrpc": "2.0", "id": 4, "method": 3}, '"method" must be a string', 4),
        ({"jsonrpc": "2.0", "id": 4, "method": "m", "params": [1]}, '"params" must be an object', 4),
        ({"jsonrpc": "2.0", "id": True, "method": "m"}, '"id" must be a string or an integer', None),
        ({"jsonrpc": "2.0", "id": 1.0, "method": "m"}, '"id" must be a string or an integer', None),
        ({"jsonrpc": "2.0", "id": None, "result": {}}, '"id" must be a string or an integer', None),
        ({"jsonrpc": "2.0", "id": 6}, 'exactly one of "result" and "error"', 6),
        ({"jsonrpc": "2.0", "id": 6, "result": 1, "error": {}}, 'exactly one of "result" and "error"', 6),
    ],
)
def test_classify_refuses_with_a_reason_and_the_id_when_it_is_one(msg: Any, reason: str, request_id: Any) -> None:
    with pytest.raises(ProtocolError) as info:
        jsonrpc.classify(msg)
    assert info.value.code == jsonrpc.INVALID_REQUEST
    assert reason in info.value.message
    assert info.value.request_id == request_id


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=False), st.sampled_from(["2.0", "1.0", "m", ""]),
                   st.just([1]), st.just({}), st.just({"a": 1}))  # fmt: skip
_MESSAGES = st.one_of(
    st.dictionaries(st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "x"]), _VALUES, max_size=6),
    st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": _VALUES}, optional={"method": _VALUES, "params": _VALUES, "result": _VALUES, "error": _VALUES}),
    _VALUES,
)


def _verdict(classify: Any, msg: Any) -> Any:
    try:
        return classify(msg)
    except ProtocolError as exc:
        return (exc.code, exc.message, exc.request_id)


@given(_MESSAGES)
def test_the_shortcut_for_requests_and_responses_judges_every_message_as_the_full_rules_do(msg: Any) -> None:
    assert _verdict(jsonrpc.classify, msg) == _verdict(jsonrpc._classify, msg)


def test_decode_failures_are_parse_errors_on_one_line() -> None:
    assert jsonrpc.decode(b'{"a": [1, "b"]}') == {"a": [1, "b"]}
    for bad in (b"", b"{", b'{"a": 1} x', b"\xff", b"[" * 100_000):
        with pytest.raises(ProtocolError) as info:
            jsonrpc.decode(bad)
        assert info.value.code == jsonrpc.PARSE_ERROR and info.value.request_id is None
        assert info.value.message.startswith("parse error") and "\n" not in info.value.message


@pytest.mark.parametrize(
    ("head", "tail", "request_id"),
    [
        (b'{"jsonrpc":"2.0","id":12,"result":{"big', b"", 12),
        (b' { "id" : "a-b" , "result"', b"", "a-b"),
        (b'{"id":-3,', b"", -3),
        (b'{"jsonrpc":"2.0","result":{"x', b'...."}},"id":42}', 42),
        (b'{"result":', b'"}, "id" : "q" }\n', "q"),
        (b'{"result":{"id":1', b'"}}', None),  # an id inside the result is not the message's
        (b'{"result":', b'{"id":1}}', None),
        (b'{"result":', b'[{"a":1,"id":7}],"id":42}', 42),  # the last id closes the message; an earlier one is inside
        (b'{"id":"a\\\\","result"', b"", None),  # an escape: the id is not its text, so it is not sniffed
        (b'{"jsonrpc":"2.0","id":1.5,"result"', b"", None),  # not an id, nor the id 1
        (b'{"id":12e3}', b"", None),
        (b'{"id":12', b"", None),  # cut off: maybe 123
        (b"", b"", None),
    ],
)
def test_sniff_id_finds_only_a_top_level_id(head: bytes, tail: bytes, request_id: Any) -> None:
    assert jsonrpc.sniff_id(head, tail) == request_id


def test_too_deep_counts_brackets_outside_strings_only() -> None:
    """A client's message nested past MAX_DEPTH is refused before it is decoded; brackets in
    strings do not count, and a shallow long message is not scanned at all."""
    deep = jsonrpc.MAX_DEPTH + 1
    assert jsonrpc.too_deep(b"[" * deep + b"]" * deep)
    assert jsonrpc.too_deep(b'{"a":' * deep + b"1" + b"}" * deep)
    assert not jsonrpc.too_deep(b"[" * jsonrpc.MAX_DEPTH + b"]" * jsonrpc.MAX_DEPTH)
    assert not jsonrpc.too_deep(b'["' + b"[{" * 2000 + b'"]')
    assert not jsonrpc.too_deep(b'["\\"' + b"[" * 2000 + b'"]')  # an escaped quote does not end the string
    assert not jsonrpc.too_deep(b"[" + b"[]," * 2000 + b"[]]")  # many brackets, never deep
