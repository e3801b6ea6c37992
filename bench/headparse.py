"""The fast path's regex head parser against one on llhttp (httptools, as uvicorn uses).

    python -m bench.headparse [--rounds N]

Both parse the head of a message POST (the bytes before CRLF CRLF, which the
fast path finds itself) into the same `fastpath.Head`: the bridge's
(`fastpath.parse_head`: three C regex passes read the request line and the
fields, then `fastpath.message_head` takes what the fast path needs), and
`parse_head_llhttp` below, where llhttp reads them, ending in the same
`message_head`. Needs httptools (`pip install httptools`; not a dependency). Each is timed on the heads bench/load.py sends (an
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
import time

import httptools  # noqa: E402

from bridge.http.fastpath import HAND_OFF_FIELDS, MAX_FIELDS, Head, message_head, parse_head

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


class _Fields:
    """llhttp's callbacks for one head: its target, and its fields by lower-case name."""

    __slots__ = ("found", "ours", "target")

    def __init__(self) -> None:
        self.target = b""
        self.found: dict[bytes, bytes] = {}
        self.ours = True  # False: a repeated field or a hand-off field

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in self.found or name in HAND_OFF_FIELDS:
            self.ours = False
        self.found[name] = value.strip(b" \t")


def read_head_llhttp(head: bytes) -> tuple[bytes, dict[bytes, bytes]] | None:
    """What fastpath.read_head returns, read by llhttp in its strict mode (which refuses the
    same shapes: names not tokens, space before the colon, folding, controls, bare LF)."""
    if head.count(b"\n") > MAX_FIELDS:
        return None
    fields = _Fields()
    parser = httptools.HttpRequestParser(fields)
    try:
        parser.feed_data(head)
        parser.feed_data(b"\r\n\r\n")
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    if not fields.ours or parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
        return None
    return fields.target, fields.found


def parse_head_llhttp(head: bytes) -> Head | None:
    read = read_head_llhttp(head)
    return None if read is None else message_head(*read, head)


def _same(a: Head | None, b: Head | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(getattr(a, slot) == getattr(b, slot) for slot in Head.__slots__)


def _time(parse: object, head: bytes, number: int) -> float:
    """CPU microseconds per parse over `number` parses (CPU time: the machine is shared)."""
    start = time.thread_time()
    for _ in range(number):
        parse(head)  # type: ignore[operator]
    return (time.thread_time() - start) / number * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15, help="timings of each parser per head, taken in turn (best kept)")
    p.add_argument("--number", type=int, default=20_000, help="parses per timing")
    args = p.parse_args()
    print(f"httptools {httptools.__version__}; best of {args.rounds} timings of {args.number:,} parses, the two parsers in turn")
    print(f"{'head':32} {'regex us':>9} {'llhttp us':>10} {'llhttp/regex':>13}   (CPU time per parse)")
    for name, head in HEADS.items():
        assert _same(parse_head(head), parse_head_llhttp(head)), name
        regex, llhttp = [], []
        for _ in range(args.rounds):  # in turn, so that a busy machine slows both alike
            regex.append(_time(parse_head, head, args.number))
            llhttp.append(_time(parse_head_llhttp, head, args.number))
        print(f"{name:32} {min(regex):9.2f} {min(llhttp):10.2f} {min(llhttp) / min(regex):12.2f}x")


if __name__ == "__main__":
    main()
