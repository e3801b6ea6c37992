"""The fast path's head parser (bridge/http/fastpath.py `parse_head`), which is pure, checked
against aiohttp's own request parser: whatever head the fast path accepts, aiohttp must
accept too and read the same way (method, target, framing, the headers the checks use), so
that the fast path never serves a request aiohttp would refuse or frame differently. The
fast path on the wire, against a real daemon, is tests/daemon/test_fastpath.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge.http import aiohttp_reply
from bridge.http.fastpath import parse_head

SID = "0123456789abcdef0123456789abcdef"
GOOD_HEAD = (
    f"POST /servers/demo/messages?session_id={SID} HTTP/1.1\r\n"
    "Host: 127.0.0.1:8080\r\nContent-Type: application/json\r\nContent-Length: 42"
).encode()


# ------------------------------------------------------------------ the head parser


def test_plain_post_is_taken() -> None:
    head = parse_head(GOOD_HEAD + b"\r\nOrigin: http://localhost:3000\r\nAuthorization: Bearer t\r\nConnection: close")
    assert head is not None
    assert (head.server, head.session_id, head.content_length, head.close) == ("demo", SID, 42, True)
    assert (head.host, head.origin, head.authorization) == ("127.0.0.1:8080", "http://localhost:3000", "Bearer t")


def test_a_repeat_of_a_field_it_does_not_read_keeps_the_fast_path() -> None:
    """Each proxy on the way may add its own X-Forwarded-For line: not the fast path's concern."""
    head = parse_head(GOOD_HEAD + b"\r\nX-Forwarded-For: 10.0.0.1\r\nx-forwarded-for: 10.0.0.2")
    assert head is not None and head.session_id == SID


def test_the_trace_context_is_read_as_aiohttp_reads_it() -> None:
    """Tracing reads `traceparent` and `tracestate` by one search of the head: any case, blanks
    around the value stripped, as aiohttp's headers give them."""
    traced = GOOD_HEAD + b"\r\nTRACEPARENT: \t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 \r\ntracestate:a=1,b=2"
    cases = [(GOOD_HEAD, None), (GOOD_HEAD + b"\r\nX-Traceparent: no", None), (traced, ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=1,b=2"))]
    for raw, expected in cases:
        head = parse_head(raw)
        assert head is not None
        assert head.trace_context() == expected
        fields = head.fields()
        assert aiohttp_reply.AiohttpHead(fields).trace_context() == expected  # type: ignore[arg-type]


def test_session_id_spellings() -> None:
    def sid(query: str) -> str | None:
        head = parse_head(f"POST /servers/demo/messages{query} HTTP/1.1\r\nHost: h".encode())
        assert head is not None
        return head.session_id

    assert sid("?sessionId=ab") == "ab"
    assert sid("?session_id=ab&sessionId=cd") == "ab"
    assert sid("?session_id=&sessionId=cd") == "cd"
    assert sid("?x=1&session_id=ab&session_id=cd") == "ab"
    assert sid("") is None


@pytest.mark.parametrize(
    "head",
    [
        GOOD_HEAD.replace(b"POST", b"GET"),
        GOOD_HEAD.replace(b"HTTP/1.1", b"HTTP/1.0"),
        GOOD_HEAD.replace(b"/messages", b"/messages/"),
        GOOD_HEAD.replace(b"/servers/demo", b"/servers/de%6do"),
        GOOD_HEAD.replace(b"/servers/demo", b"/servers/a/b"),
        GOOD_HEAD.replace(b"/servers/demo", b"//servers/demo"),
        GOOD_HEAD.replace(b"session_id=", b"session_id=a+"),
        GOOD_HEAD + b"\r\nTransfer-Encoding: chunked",
        GOOD_HEAD + b"\r\nExpect: 100-continue",
        GOOD_HEAD + b"\r\nContent-Encoding: gzip",
        GOOD_HEAD + b"\r\nUpgrade: websocket\r\nConnection: Upgrade",
        GOOD_HEAD + b"\r\nContent-Length: 42",
        GOOD_HEAD + b"\r\nHost: other",
        GOOD_HEAD.replace(b"/messages?session_id=" + SID.encode(), b"/mcp") + b"\r\nMcp-Param-A: 1\r\nmcp-param-a: 2",
        GOOD_HEAD.replace(b"Content-Length: 42", b"Content-Length: +42"),
        GOOD_HEAD.replace(b"Content-Length: 42", b"Content-Length: 4 2"),
        GOOD_HEAD.replace(b"Host:", b"Host :"),
        GOOD_HEAD + b"\r\n folded",
        GOOD_HEAD.replace(b"\r\nHost", b"\nHost"),
        GOOD_HEAD + b"\r\nX-A: b\x00c",
        GOOD_HEAD + b"\r\nX-A: b\rc",
        GOOD_HEAD + b"\r\n: no name",
    ],
)
def test_anything_else_goes_to_aiohttp(head: bytes) -> None:
    assert parse_head(head) is None


def _aiohttp_reads(raw: bytes) -> Any:
    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParser(BaseProtocol(loop), loop, 2**16, max_line_size=8190, max_field_size=8190)
        messages, upgraded, _ = parser.feed_data(raw)
    finally:
        loop.close()
    assert not upgraded and len(messages) == 1
    return messages[0][0]


NAMES = st.sampled_from(
    ["Host", "host", "Origin", "Authorization", "Content-Length", "content-length", "Connection", "Transfer-Encoding",
     "Expect", "Upgrade", "X-Any", "Content-Type", "Host ", " Host", "Ho st", "Hóst", "", "X:Y", "Accept",
     "Mcp-Session-Id", "mcp-protocol-version", "Mcp-Method", "Mcp-Name", "Mcp-Param-Region", "MCP-PARAM-region", "mcp-param-",
     "X-Forwarded-For"]
)  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(["127.0.0.1", "10", "010", "-1", "1e3", "close", "keep-alive", "Close, Upgrade", "chunked",
                     "Bearer abc", "http://localhost:1", ""]),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
    st.binary(max_size=8).map(lambda b: b.decode("latin-1")),
)  # fmt: skip
SEPARATORS = st.sampled_from([": ", ":", " : ", ":\t", ": \t"])
TARGETS = st.sampled_from(
    ["/servers/demo/messages?session_id=ab", "/servers/demo/messages?sessionId=ab&x=%41", "/servers/demo/messages",
     "/servers/x-y_z.1/messages?session_id=a&session_id=b", "/servers//messages?session_id=a",
     "/servers/demo/messages?session_id=%61", "/servers/demo/messages#frag", "http://h/servers/demo/messages",
     "/servers/demo/mcp", "/servers/demo/mcp?x=1", "/servers/demo/mcp/", "/servers/a/b/mcp", "/servers/mcp"]
)  # fmt: skip


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(["POST", "GET", "post", "POST "]),
    target=TARGETS,
    version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "http/1.1"]),
    fields=st.lists(st.tuples(NAMES, SEPARATORS, VALUES), max_size=6),
    eol=st.sampled_from(["\r\n", "\r\n", "\n"]),
)
@example(method="POST", target="/servers/demo/messages?session_id=ab", version="HTTP/1.1",
         fields=[("Host", ": ", "a"), ("Content-Length", ": ", "3"), ("Connection", ": ", "close")], eol="\r\n")  # fmt: skip
@example(method="POST", target="/servers/demo/mcp", version="HTTP/1.1",
         fields=[("Host", ": ", "a"), ("MCP-PARAM-region", ":", " eu "), ("mcp-param-", ": ", "x"), ("X-Forwarded-For", ": ", "1"),
                 ("X-Forwarded-For", ": ", "2")], eol="\r\n")  # fmt: skip
@example(method="POST", target="/servers/demo/messages?session_id=ab", version="HTTP/1.1",
         fields=[("Host", ": ", "a"), ("Connection", ": ", "Close, Upgrade"), ("Upgrade", ": ", "h2c")], eol="\r\n")  # fmt: skip
def test_what_the_fast_path_takes_aiohttp_reads_the_same(
    method: str, target: str, version: str, fields: list[tuple[str, str, str]], eol: str
) -> None:
    head_text = f"{method} {target} {version}" + "".join(f"{eol}{n}{s}{v}" for n, s, v in fields)
    head_bytes = head_text.encode("utf-8", "surrogateescape")
    head = parse_head(head_bytes)
    if head is None:
        return
    raw = head_bytes + b"\r\n\r\n" + b"x" * head.content_length
    try:
        msg = _aiohttp_reads(raw)
    except HttpProcessingError as exc:
        raise AssertionError(f"the fast path took a head aiohttp refuses: {raw!r}") from exc
    assert msg.method == "POST" and msg.version == (1, 1)
    assert not msg.chunked and not msg.upgrade
    assert msg.url.path == f"/servers/{head.server}/{'mcp' if head.mcp else 'messages'}"
    query = msg.url.query
    if head.mcp:
        assert head.session_id == msg.headers.get("Mcp-Session-Id")
        assert head.mcp_version == msg.headers.get("MCP-Protocol-Version")
        assert head.accept == msg.headers.get("Accept", "")
    else:
        assert head.session_id == (query.get("session_id") or query.get("sessionId") or None)
    assert int(msg.headers.get("Content-Length", 0)) == head.content_length
    assert msg.should_close == head.close
    for name, ours in (("Host", head.host), ("Origin", head.origin), ("Authorization", head.authorization)):
        assert msg.headers.get(name) == ours, name
    assert head.mirrored() == aiohttp_reply.mirrored(msg.headers)  # what a 2026-07-28 request's headers mirror
