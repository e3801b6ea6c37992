"""One log stream: whatever clients send, every line on stderr is one JSON object.

Malformed HTTP goes to the real daemon over raw sockets on loopback (the
`bridge` fixture parses its stderr line by line and records any line that is
not JSON as an `unparsed` event). A request aiohttp cannot parse becomes one
`bad_request` event, rate-limited, each saying how many were held back before it.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from typing import Any

import aiohttp
from support.daemon import PY, ROOT, Bridge, faulty

from bridge import logs

KEEPALIVE = 2  # limits.keepalive_timeout (s): how long a head the fast path still waits on is held


def tls_client_hello() -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


HOST = b"Host: 127.0.0.1\r\n"
POST_MCP = b"POST /servers/f/mcp HTTP/1.1\r\n" + HOST
# Each kind of malformed request, with bytes in it that must never reach the log.
GARBAGE = {
    "request line": b"GARBAGE-MARKER\r\n\r\n",
    "HTTP version": b"GET /healthz HTTP/9.Z\r\n" + HOST + b"\r\n",
    "header without colon": b"GET /healthz HTTP/1.1\r\n" + HOST + b"no-colon-marker here\r\n\r\n",
    "control byte in header": b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-Marker: a\x01b\r\n\r\n",
    "space before colon": b"GET /healthz HTTP/1.1\r\nHost : space-marker\r\n\r\n",
    "oversized request line": b"GET /" + b"long-marker" * 2000 + b" HTTP/1.1\r\n" + HOST + b"\r\n",
    "oversized header": b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-Big: " + b"big-marker" * 2000 + b"\r\n\r\n",
    "too many headers": b"GET /healthz HTTP/1.1\r\n" + HOST + b"".join(b"X-Many-%d: y\r\n" % i for i in range(200)) + b"\r\n",
    "Content-Length not a number": POST_MCP + b"Content-Length: length-marker\r\n\r\n",
    "Content-Length twice": POST_MCP + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
    "chunk size": POST_MCP + b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nCHUNK-MARKER\r\n{}\r\n0\r\n\r\n",
    "chunk end": b"POST /servers/f/messages?session_id=x HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX\r\n0\r\n\r\n",
    "chunked and Content-Length": POST_MCP + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    "binary": bytes(range(256)) + b"\r\n\r\n",
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "after a good request": b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\nSECOND-MARKER\r\n\r\n",
    # A head without CRLF CRLF: a fast path that waits for one would hold it until
    # keepalive_timeout and aiohttp would never see it; handed over, it is a bad_request too.
    "bare LF": b"GET /healthz HTTP/1.1\nHost: 127.0.0.1\n\n",
    "TLS on the plain port": tls_client_hello(),
}
HELD = {"bare LF", "TLS on the plain port"}
MARKERS = ("MARKER", "marker")


async def exchange(port: int, data: bytes, timeout: float = KEEPALIVE + 5) -> bytes:
    """Send `data` on a new connection; what comes back until the daemon closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    try:
        writer.write(data)
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                received += chunk
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    return received


def bad_requests(b: Bridge) -> list[dict[str, Any]]:
    return b.named("bad_request")


def accounted(b: Bridge) -> int:
    """Bad requests the log has told of: each event, and the ones it says it held back."""
    return sum(1 + e["suppressed"] for e in bad_requests(b))


async def settle(b: Bridge, probes: int = 8) -> int:
    """Send one more bad request at a time until one is logged: that event accounts for
    every one before it. Returns how many probes were sent."""
    for sent in range(1, probes + 1):
        mark = len(b.events)
        assert (await exchange(b.port, b"PROBE\r\n\r\n")).startswith(b"HTTP/1.")
        try:
            await b.wait_for("bad_request", start=mark, timeout=1.5)  # the bucket refills at 1/s
        except TimeoutError:
            continue
        return sent
    raise AssertionError(f"no bad_request logged after {probes} probes")


async def healthz(b: Bridge) -> int:
    async with aiohttp.ClientSession() as http, http.get(b.base + "/healthz") as resp:
        return resp.status


async def test_malformed_requests_are_one_json_event_each(bridge: Any) -> None:
    config = {"servers": {"f": faulty()}, "limits": {"keepalive_timeout": f"{KEEPALIVE}s"}}
    # At info, as an operator runs it: aiohttp logs a connection's first bad request at debug.
    async with bridge(config, "--log-level", "info") as b:
        for kind, data in GARBAGE.items():
            answer = await exchange(b.port, data)
            if kind not in HELD:
                assert b" 400 " in answer.split(b"\r\n", 1)[0] or b"400 Bad Request" in answer, (kind, answer[:200])
        probes = await settle(b)
        assert await healthz(b) == 200
    reaching = len(GARBAGE) - len(HELD) + probes
    assert reaching <= accounted(b) <= reaching + len(HELD), [(e["reason"], e["suppressed"]) for e in bad_requests(b)]

    assert not b.named("unparsed"), b.named("unparsed")[:5]
    assert not [e for e in b.events if e.get("level") in ("error", "critical") or "exception" in e], b.events
    for e in bad_requests(b):
        assert e["level"] == "warning" and e["status"] == 400 and e["remote"] == "127.0.0.1", e
        assert isinstance(e["reason"], str) and e["reason"] and "\n" not in e["reason"] and len(e["reason"]) <= 120, e
        assert isinstance(e["suppressed"], int) and e["suppressed"] >= 0, e
    leaks = [e for e in b.events if any(m in str(e) for m in MARKERS)]
    assert not leaks, leaks


async def test_bad_request_flood_is_rate_limited(bridge: Any) -> None:
    flood, concurrency = 300, 20
    async with bridge({"servers": {"f": faulty()}}) as b:
        queue = list(range(flood))

        async def worker() -> None:
            while queue:
                queue.pop()
                assert (await exchange(b.port, b"GARBAGE\r\n\r\n")).startswith(b"HTTP/1.0 400")

        started = asyncio.get_running_loop().time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = asyncio.get_running_loop().time() - started
        logged_during = len(bad_requests(b))
        probes = await settle(b)
        assert await healthz(b) == 200
    # A burst, then one a second: far fewer events than requests.
    assert logged_during <= logs.BAD_REQUEST_BURST + logs.BAD_REQUEST_RATE * elapsed + 1, (logged_during, elapsed)
    assert logged_during < flood / 5, logged_during
    # And none is lost from the count: the events and what they say they held back add up.
    assert accounted(b) == flood + probes, [(e["reason"], e["suppressed"]) for e in bad_requests(b)]
    assert sum(e["suppressed"] for e in bad_requests(b)) > 0
    assert not b.named("unparsed")


def test_python_own_tracebacks_are_json_too() -> None:
    """A finalizer that raises and a thread that dies: Python prints these past `logging`."""
    script = """if True:
        import threading
        from bridge import logs
        logs.setup("json", "info")
        class Bad:
            def __del__(self):
                raise ValueError("100% in a finalizer")
        Bad()
        worker = threading.Thread(target=lambda: 1 / 0, name="worker")
        worker.start()
        worker.join()
    """
    done = subprocess.run([PY, "-c", script], cwd=ROOT, capture_output=True, timeout=30, check=True)
    events = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(e["logger"], e["level"]) for e in events] == [("python", "error")] * 2, events
    assert events[0]["event"].startswith("Exception ignored in") and "100% in a finalizer" in events[0]["exception"]
    assert events[1]["event"] == "Exception in thread worker" and "ZeroDivisionError" in events[1]["exception"]
