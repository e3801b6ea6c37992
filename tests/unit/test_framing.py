"""Line framing of server stdout and the JSON-RPC helpers: pure, no IO."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.process.child import LineFramer
from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import Kind, ProtocolError


class Sink:
    def __init__(self, limit: int) -> None:
        self.lines: list[bytes] = []
        self.oversize: list[tuple[int, bytes, bytes]] = []
        self.framer = LineFramer(limit, self.lines.append, lambda size, head, tail: self.oversize.append((size, head, tail)))


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(
    lines=st.lists(st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\n", b"x").strip() or b"y"), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
)
def test_any_chunking_yields_the_same_lines(lines: list[bytes], cuts: list[int]) -> None:
    sink = Sink(limit=64)
    data = b"".join(line + b"\n" for line in lines)
    for chunk in chunked(data, cuts):
        sink.framer.feed(chunk)
    assert sink.lines == lines
    assert sink.framer.pending() == 0


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=30),
)
def test_oversized_lines_are_dropped_whole_and_reported_once(sizes: list[int], cuts: list[int]) -> None:
    limit = 100
    lines = [bytes([97 + i % 26]) * n for i, n in enumerate(sizes)]
    sink = Sink(limit)
    for chunk in chunked(b"".join(line + b"\n" for line in lines), cuts):
        sink.framer.feed(chunk)
    assert sink.lines == [line for line in lines if len(line) <= limit]
    assert [size for size, _, _ in sink.oversize] == [len(line) for line in lines if len(line) > limit]


def test_the_ends_of_a_dropped_line_are_kept_to_find_its_id() -> None:
    sink = Sink(limit=1000)
    line = b'{"jsonrpc":"2.0","id":42,"result":{"text":"' + b"x" * 5000 + b'"}}'
    for i in range(0, len(line), 333):
        sink.framer.feed(line[i : i + 333])
    sink.framer.feed(b"\n")
    ((size, head, tail),) = sink.oversize
    assert size == len(line)
    assert jsonrpc.sniff_id(head, tail) == 42


def test_blank_lines_and_carriage_returns() -> None:
    sink = Sink(limit=100)
    sink.framer.feed(b"\n  \n{}\r\n")
    assert sink.lines == [b"{}\r"]  # the JSON decoder takes the \r as whitespace
    assert jsonrpc.decode(sink.lines[0]) == {}


@pytest.mark.parametrize(
    ("head", "tail", "found"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":', b"...}}", 7),
        (b'{"jsonrpc": "2.0", "id": "abc", "result":', b"}", "abc"),
        (b'{"id":-3,"result":', b"}", -3),
        (b'{"result":{"content":[{"id":3', b'"}]},"jsonrpc":"2.0","id":"q-1"}', "q-1"),
        (b'{"result":{"content":[{"id":3', b'"x","id":5}}', None),  # a nested id is not the message's
        (b'{"result":{"id":3', b"}}", None),
    ],
)
def test_sniff_id(head: bytes, tail: bytes, found: Any) -> None:
    assert jsonrpc.sniff_id(head, tail) == found


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"{", "parse error"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a":"\xff"}', "UTF-8"),
        (b"1e99999", "out of range"),
        (b'{"a":1} trailing', "trailing"),
        (b"", "parse error"),
    ],
)
def test_decode_failures_are_parse_errors_with_a_reason(data: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        jsonrpc.decode(data)
    assert info.value.code == jsonrpc.PARSE_ERROR
    assert fragment.lower() in info.value.message.lower()
    assert "\n" not in info.value.message


def test_huge_integers_decode_exactly() -> None:
    assert jsonrpc.decode(b'{"id": 123456789012345678901234567890}')["id"] == 123456789012345678901234567890


@pytest.mark.parametrize(
    ("msg", "kind"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "m"}, Kind.REQUEST),
        ({"jsonrpc": "2.0", "id": "x", "method": "m", "params": {}}, Kind.REQUEST),
        ({"jsonrpc": "2.0", "method": "m"}, Kind.NOTIFICATION),
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, Kind.RESPONSE),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "m"}}, Kind.RESPONSE),
    ],
)
def test_classify(msg: dict[str, Any], kind: Kind) -> None:
    assert jsonrpc.classify(msg) is kind


@pytest.mark.parametrize(
    ("msg", "rid"),
    [
        ([], None),
        ({"id": 1, "method": "m"}, 1),
        ({"jsonrpc": "2.0", "id": 1, "method": None}, 1),
        ({"jsonrpc": "2.0", "id": False, "method": "m"}, None),
        ({"jsonrpc": "2.0", "id": 2.0, "method": "m"}, None),
        ({"jsonrpc": "2.0", "id": [1], "method": "m"}, None),
        ({"jsonrpc": "2.0", "id": 1, "method": "m", "params": "p"}, 1),
        ({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}, 1),
        ({"jsonrpc": "2.0", "result": {}}, None),
    ],
)
def test_classify_rejects_with_the_id_when_it_is_usable(msg: Any, rid: Any) -> None:
    with pytest.raises(ProtocolError) as info:
        jsonrpc.classify(msg)
    assert info.value.code == jsonrpc.INVALID_REQUEST
    assert info.value.request_id == rid
    assert json.loads(jsonrpc.encode(info.value.response()))["error"]["code"] == jsonrpc.INVALID_REQUEST
