"""The fast path's head parser against one built on llhttp (httptools, as uvicorn uses).

    python bench/headparse.py [--rounds N]

Both parse the head of a message POST (the bytes before CRLF CRLF, which the
fast path finds itself) into the same `fastpath.Head`: the regex parser the
bridge uses (`fastpath.parse_head`), and `parse_head_llhttp` below, which
lets llhttp read the request line and header fields and applies the same
rules to what it found. Each is timed on the heads bench/load.py sends (an
HTTP+SSE message POST; a Streamable POST with a session) and on a head with a
token, an Origin and more headers, as a browser-based client sends.

What llhttp cannot do for the fast path, as of httptools 0.9 (checked in its
parser.pyx): `feed_data` parses every request in the buffer it is given and
reports no offset, neither at `on_headers_complete` nor at
`on_message_complete`; an exception raised in a callback stops it, but the
`HttpParserCallbackError` it raises carries no position either (the parser
knows it, `llhttp_get_error_pos`, but httptools only reports it for an
upgrade, as the argument of `HttpParserUpgrade`), and leaves the parser in an
error state with no reset. So where one request ends inside a read, which the
hand-off to aiohttp needs, still has to be found outside it: here the head is
cut at CRLF CRLF first and only the head is fed, to a new parser each time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httptools  # noqa: E402

from bridge.transports import fastpath  # noqa: E402
from bridge.transports.fastpath import _HAND_OFF_FIELDS, _WATCHED, MAX_FIELDS, Head, _target, _text  # noqa: E402

SID = "0123456789abcdef0123456789abcdef"
HEADS = {
    "sse message POST (load.py)": (
        f"POST /servers/bench/messages?session_id={SID} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
        "Content-Type: application/json\r\nContent-Length: 120"
    ).encode(),
    "streamable POST (load.py)": (
        "POST /servers/bench/mcp HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {SID}\r\n"
        "MCP-Protocol-Version: 2025-06-18\r\nContent-Length: 120"
    ).encode(),
    "browser-like POST, 12 fields": (
        "POST /servers/bench/mcp HTTP/1.1\r\nHost: bridge.example.com\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {SID}\r\n"
        "MCP-Protocol-Version: 2025-06-18\r\nAuthorization: Bearer secret-token-1234567890abcdef\r\n"
        "Origin: https://app.example.com\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101\r\n"
        "Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\nContent-Length: 120"
    ).encode(),
}


class _Collect:
    """httptools callbacks: the target and the watched fields (a repeat or a hand-off field: None)."""

    __slots__ = ("fields", "target", "usable")

    def __init__(self) -> None:
        self.target = b""
        self.fields: dict[bytes, bytes] = {}
        self.usable = True

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _WATCHED:
            if name in self.fields or name in _HAND_OFF_FIELDS:
                self.usable = False
            self.fields[name] = value


def parse_head_llhttp(head: bytes) -> Head | None:
    """What fastpath.parse_head returns for the same head, read by llhttp."""
    collect = _Collect()
    parser = httptools.HttpRequestParser(collect)
    try:
        parser.feed_data(head + b"\r\n\r\n")
    except httptools.HttpParserError:
        return None
    if (
        not collect.usable
        or parser.get_method() != b"POST"
        or parser.get_http_version() != "1.1"
        or head.count(b"\n") > MAX_FIELDS
    ):
        return None
    out = Head()
    if not _target(collect.target, out):
        return None
    found = collect.fields
    host = found.get(b"host")
    if host is None:
        return None
    out.host = _text(host)
    if (length := found.get(b"content-length")) is not None:
        out.content_length = int(length)
    if (connection := found.get(b"connection")) is not None:
        tokens = {t.strip().lower() for t in connection.split(b",")}
        if b"upgrade" in tokens:
            return None
        out.close = b"close" in tokens
    if (origin := found.get(b"origin")) is not None:
        out.origin = _text(origin)
    if (authorization := found.get(b"authorization")) is not None:
        out.authorization = _text(authorization)
    if out.mcp:
        out.accept = _text(found.get(b"accept", b""))
        if (session_id := found.get(b"mcp-session-id")) is not None:
            out.session_id = _text(session_id)
        if (version := found.get(b"mcp-protocol-version")) is not None:
            out.mcp_version = _text(version)
    return out


def _same(a: Head | None, b: Head | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(getattr(a, slot) == getattr(b, slot) for slot in Head.__slots__)


def _time(parse: object, head: bytes, number: int) -> float:
    """Microseconds per parse over `number` parses."""
    start = time.perf_counter()
    for _ in range(number):
        parse(head)  # type: ignore[operator]
    return (time.perf_counter() - start) / number * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15, help="timings of each parser per head, taken in turn (best kept)")
    p.add_argument("--number", type=int, default=20_000, help="parses per timing")
    args = p.parse_args()
    print(f"httptools {httptools.__version__}; best of {args.rounds} timings of {args.number:,} parses, the two parsers in turn")
    print(f"{'head':32} {'regex us':>9} {'llhttp us':>10} {'llhttp/regex':>13}")
    for name, head in HEADS.items():
        assert _same(fastpath.parse_head(head), parse_head_llhttp(head)), name
        regex, llhttp = [], []
        for _ in range(args.rounds):  # in turn, so that a busy machine slows both alike
            regex.append(_time(fastpath.parse_head, head, args.number))
            llhttp.append(_time(parse_head_llhttp, head, args.number))
        print(f"{name:32} {min(regex):9.2f} {min(llhttp):10.2f} {min(llhttp) / min(regex):12.2f}x")


if __name__ == "__main__":
    main()
