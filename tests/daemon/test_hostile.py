"""The hostile-input suite: one running daemon takes everything a hostile
client or server can throw at it while a well-behaved SDK session keeps working.

One daemon (module-scoped `arena`) serves one shared fault server (`faulty`). A
well-behaved official-SDK session (`mcp.client.sse.sse_client` + `ClientSession`)
calls `echo` in a loop for the whole module and checks that every call returns
exactly its own text. Each test is one kind of hostility; when it ends, the
well-behaved session must have kept going during it and must still be going,
and the daemon must have logged no traceback. The last test checks that the
daemon still serves new sessions and that its RSS is back within 20 MiB of
where it was after warm-up.

Hypothesis drives the generated inputs from a worker thread with plain
`http.client` (full control over bytes and headers) while the event loop keeps
running the daemon's log reader and the SDK session. No sleeps: every wait is on
a log event, a message or a reply, bounded by a timeout (RSS is polled, bounded).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import ipaddress
import itertools
import json
import math
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from support.daemon import Bridge, faulty, run_bridge
from support.rawclient import RawSse, call

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

GOOD = "good-tok-6a0e3c1f5b7d9e2a4c6f8b0d"
HOSTILE = "hostile-tok-9b8a7c6d5e4f3a2b1c0d9e8f"
OPS = "ops-tok-3e5a7c9b1d2f4a6c8e0b2d4f"  # an admin: /status shows it every principal's sessions
ENV = {"GOOD_TOKEN": GOOD, "HOSTILE_TOKEN": HOSTILE, "OPS_TOKEN": OPS}
ORIGIN = "https://app.example.com"
LIMIT = 256 * 1024  # limits.max_message_bytes
CONFIG = {
    "servers": {"f": faulty()},
    "security": {
        "tokens": [
            {"name": "good", "token": "${GOOD_TOKEN}", "servers": ["*"]},
            {"name": "hostile", "token": "${HOSTILE_TOKEN}", "servers": ["f"]},
            {"name": "ops", "token": "${OPS_TOKEN}", "roles": ["admin"]},
        ],
        "allowed_origins": [ORIGIN],
    },
    "limits": {"max_message_bytes": "256KiB", "session_queue": 16},
}
RSS_SLACK_KIB = 20 * 1024
HYPOTHESIS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)
# Tools of the fault server that a generated request must never call by accident.
DANGEROUS_TOOLS = frozenset({"crash", "hang", "slow", "big", "noise", "garbage", "emit"})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def wait_until(b: Bridge, predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait, on the daemon's log, until `predicate()` holds (it is re-checked at each new event)."""
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                b._changed.clear()
                if predicate():
                    return
                await b._changed.wait()
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def open_sessions(b: Bridge) -> set[str]:
    opened = {e["session"] for e in b.named("session_opened")}
    return opened - {e["session"] for e in b.named("session_closed")}


def tracebacks(b: Bridge, start: int = 0) -> list[dict[str, Any]]:
    return [e for e in b.events[start:] if e.get("event") == "unparsed" or e.get("level") in ("error", "critical")]


# ===================================================================== the good client


class GoodClient:
    """The well-behaved SDK session: calls echo until told to stop, checking every answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.calls = 0
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self.finished = False
        self.ready = asyncio.Event()
        self.changed = asyncio.Event()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        from mcp import ClientSession
        from mcp.client.sse import sse_client

        loop = asyncio.get_running_loop()

        async def on_message(message: Any) -> None:
            if isinstance(message, Exception):
                self.failures.append(f"the SDK saw an error on its stream: {message!r}")

        try:
            async with sse_client(self.url, headers=bearer(GOOD), timeout=10, sse_read_timeout=300) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=15, message_handler=on_message) as session:
                    await session.initialize()
                    self.ready.set()
                    for i in itertools.count():
                        if self.stop.is_set() or len(self.failures) >= 50:
                            break
                        text = f"good {i} " + "é✓\"\\" * (i % 5) + "x" * (i % 3000)
                        started = loop.time()
                        try:
                            result = await session.call_tool("echo", {"text": text})
                        except Exception as exc:  # noqa: BLE001 - every failure is recorded and reported
                            self.failures.append(f"call {i} failed: {exc!r}")
                            continue
                        finally:
                            self.changed.set()
                        got = "".join(getattr(block, "text", "") for block in result.content)
                        if result.is_error or got != text:
                            self.failures.append(f"call {i}: sent {text[:60]!r}, got {got[:60]!r} (is_error={result.is_error})")
                        self.latencies.append(loop.time() - started)
                        self.calls += 1
        except Exception as exc:  # noqa: BLE001
            self.failures.append(f"the session ended: {exc!r}")
        finally:
            self.finished = True
            self.ready.set()
            self.changed.set()

    async def progress(self, n: int, timeout: float = 30.0) -> None:
        """Wait until it has completed `n` more calls."""
        target = self.calls + n
        try:
            async with asyncio.timeout(timeout):
                while self.calls < target:
                    if self.finished:
                        raise AssertionError(f"the well-behaved session ended: {self.failures[-3:]}")
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"the well-behaved session made no progress: {self.calls}/{target}; {self.failures[-3:]}") from None


# ========================================================================= the arena


class Arena:
    def __init__(self, b: Bridge, good: GoodClient, hostile: RawSse) -> None:
        self.b = b
        self.good = good
        self.hostile = hostile
        self.loop = asyncio.get_running_loop()
        self.baseline_rss = 0
        self.phases: set[str] = set()
        self.ids = itertools.count(1)

    @property
    def endpoint_path(self) -> str:
        return self.hostile.endpoint.split(f":{self.b.port}", 1)[1]

    @contextlib.asynccontextmanager
    async def phase(self, name: str) -> AsyncIterator[None]:
        """Run one kind of hostility; afterwards the good session must have kept up and the log be clean."""
        calls, failures, mark = self.good.calls, len(self.good.failures), len(self.b.events)
        yield
        await self.good.progress(3)
        assert self.b.proc.returncode is None, f"the daemon exited with {self.b.proc.returncode}"
        assert not self.good.failures[failures:], "\n".join(self.good.failures[failures:][:10])
        assert self.good.calls - calls >= 3, (name, self.good.calls - calls)
        bad = tracebacks(self.b, mark)
        assert not bad, "\n".join(json.dumps(e)[:300] for e in bad[:60])
        self.phases.add(name)

    async def tool(self, name: str, args: dict[str, Any] | None = None, timeout: float = 10.0) -> dict[str, Any]:
        rid = f"h{next(self.ids)}"
        status, text = await self.hostile.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call(name, args)})
        assert status == 202, (status, text)
        return await self.hostile.response(rid, timeout=timeout)

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        """From the hypothesis thread: run a coroutine on the arena's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def settle(self, live: int, timeout: float = 30.0) -> None:
        """Wait until exactly `live` sessions are open (per the log)."""
        await wait_until(self.b, lambda: len(open_sessions(self.b)) == live, timeout, f"{live} open sessions")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def arena(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Arena]:
    async with run_bridge(tmp_path_factory.mktemp("hostile"), CONFIG, env=ENV) as b:
        good = GoodClient(b.url("f"))
        task = asyncio.create_task(good.run())
        async with asyncio.timeout(30):
            await good.ready.wait()
        assert not good.failures, good.failures
        hostile = RawSse(b.url("f"), headers=bearer(HOSTILE))
        await hostile.__aenter__()
        try:
            assert hostile.status == 200
            await hostile.initialize()
            arena = Arena(b, good, hostile)
            await warm_up(arena)
            await arena.settle(2)
            arena.baseline_rss = rss_kib(b.proc.pid)
            yield arena
        finally:
            good.stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(task, 30)
            await hostile.close()


async def warm_up(arena: Arena) -> None:
    """Every code path once, so that the RSS baseline is taken with caches and pools warm."""
    await asyncio.to_thread(lambda: [post_body(arena, body) for body in WARM_UP_BODIES])
    await storm(arena, 100)
    await arena.tool("garbage")
    await arena.tool("big", {"bytes": LIMIT + 100})
    await arena.tool("emit", {"lines": ["not json"], "raw": [base64.b64encode(b"\xff").decode()]})
    await never_reader(arena)
    await arena.good.progress(10)


# ========================================================================= bodies


def post_raw(port: int, method: str, target: str, headers: list[tuple[str, bytes | str]], body: bytes | None = None) -> tuple[int, Any, bytes]:
    """One request over a fresh connection, bytes as given; an event stream is not read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        if resp.getheader("Content-Type", "").startswith("text/event-stream"):
            return resp.status, resp.headers, b""
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def post_body(arena: Arena, body: bytes) -> tuple[int, bytes]:
    status, _, text = post_raw(
        arena.b.port,
        "POST",
        arena.endpoint_path,
        [("Host", f"127.0.0.1:{arena.b.port}"), ("Authorization", f"Bearer {HOSTILE}"), ("Content-Type", "application/json")],
        body,
    )
    return status, text


def error_code(text: bytes) -> int:
    reply = json.loads(text)
    assert reply["jsonrpc"] == "2.0" and isinstance(reply["error"]["message"], str), reply
    return reply["error"]["code"]


class Extreme(Exception):
    """Beyond what a JSON codec must take: the bridge may refuse it as a parse error."""


def nesting_depth(body: bytes) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 18:
        raise Extreme(text[:20])
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or (value == 0.0 and any(c in "123456789" for c in text.split("e")[0].split("E")[0])):
        raise Extreme(text)
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"not JSON: {text}")


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    return False


def _is_id(value: Any) -> bool:
    return type(value) in (int, str)


def _valid_message(m: Any) -> bool | None:
    """JSON-RPC 2.0 as the README's error table has it; None where it leaves the choice open."""
    if type(m) is not dict or m.get("jsonrpc") != "2.0":
        return False
    if "method" in m:
        if type(m["method"]) is not str:
            return False
        if "id" in m and not _is_id(m["id"]):
            return False
        if m.get("params", {}) is None:
            return None
        return type(m.get("params", {})) is dict
    return _is_id(m.get("id")) and (("result" in m) != ("error" in m))


def verdict(body: bytes) -> str:
    """What the bridge must answer: 'parse' (400 -32700), 'invalid' (400 -32600), 'valid' (202) or 'either'."""
    if nesting_depth(body) > 400:
        return "either"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "parse"
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_no_constant)
    except Extreme:
        return "either"
    except (ValueError, RecursionError):
        return "parse"
    if _has_surrogate(value):
        return "either"
    if type(value) is list:
        if not value:
            return "invalid"
        verdicts = [_valid_message(m) for m in value]
    else:
        verdicts = [_valid_message(value)]
    if False in verdicts:
        return "invalid"
    return "valid" if all(verdicts) else "either"


def check_body(arena: Arena, body: bytes) -> None:
    status, text = post_body(arena, body)
    assert status < 500, (status, text[:300])
    expected = verdict(body)
    if status == 400:
        code = error_code(text)
        assert code in (-32700, -32600), (code, text[:300])
        if expected == "parse":
            assert code == -32700, text[:300]
        elif expected == "invalid":
            assert code == -32600, text[:300]
        else:
            assert expected == "either", (expected, text[:300])
    else:
        assert status == 202, (status, text[:300])
        assert expected in ("valid", "either"), (expected, status)


# Strategies. Values a peer can put anywhere; fields of the wrong type; the names the bridge looks at.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=10
)
unhashable = st.one_of(st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=4), scalars, max_size=3))
ids = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.text(max_size=10),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=2**64, max_value=10**40),
    unhashable,
)
CLIENT_METHODS = [
    "initialize", "ping", "tools/list", "tools/call", "resources/subscribe", "resources/unsubscribe",
    "resources/read", "logging/setLevel", "tasks/get", "tasks/result", "tasks/cancel", "tasks/list",
    "completion/complete", "notifications/initialized", "notifications/cancelled", "notifications/progress",
    "notifications/roots/list_changed",
]  # fmt: skip
PARAM_KEYS = [
    "requestId", "taskId", "level", "uri", "progressToken", "_meta", "name", "arguments", "task",
    "protocolVersion", "capabilities", "clientInfo", "reason", "cursor", "elicitationId",
]  # fmt: skip
params = st.dictionaries(
    st.one_of(st.sampled_from(PARAM_KEYS), st.text(max_size=6)),
    st.one_of(json_values, unhashable, st.fixed_dictionaries({"progressToken": json_values})),
    max_size=4,
)
jsonrpc_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.one_of(st.just("2.0"), st.sampled_from(["1.0", "2", "", "2.0 "]), json_values),
        "id": ids,
        "method": st.one_of(st.sampled_from(CLIENT_METHODS), st.text(max_size=12), json_values),
        "params": st.one_of(params, json_values),
        "result": json_values,
        "error": json_values,
    },
)
# Well-formed envelopes whose params carry wrong-typed fields: what reaches the mux's handlers.
handler_attack = st.fixed_dictionaries(
    {
        "jsonrpc": st.just("2.0"),
        "method": st.sampled_from(CLIENT_METHODS),
        "params": st.dictionaries(st.sampled_from(PARAM_KEYS), st.one_of(unhashable, json_values), min_size=1, max_size=3),
    },
    optional={"id": st.one_of(st.integers(min_value=-(2**31), max_value=2**31), st.text(max_size=6))},
)
valid_ping = st.integers(min_value=0, max_value=10**9).map(lambda n: {"jsonrpc": "2.0", "id": f"v{n}", "method": "ping"})


def _dump(value: Any) -> bytes:
    return json.dumps(value, allow_nan=False).encode()


def _safe(value: Any) -> bool:
    """Never call the fault server's tools that hang, crash or flood (by name, anywhere)."""
    messages = value if isinstance(value, list) else [value]
    for m in messages:
        name = m.get("params", {}).get("name") if isinstance(m, dict) and isinstance(m.get("params"), dict) else None
        if isinstance(name, str) and name in DANGEROUS_TOOLS:
            return False
    return True


def _deep(args: tuple[int, str]) -> bytes:
    depth, where = args
    if where == "list":
        return b"[" * depth + b"]" * depth
    if where == "dict":
        return b'{"a":' * depth + b"1" + b"}" * depth
    inner = b"[" * depth + b"]" * depth
    return b'{"jsonrpc":"2.0","id":"deep","method":"tools/call","params":{"name":"echo","arguments":{"text":"d","x":' + inner + b"}}}"


def _inject(args: tuple[bytes, bytes, int]) -> bytes:
    body, bad, at = args
    at = min(at, len(body))
    return body[:at] + bad + body[at:]


huge_numbers = st.tuples(st.integers(min_value=15, max_value=6000), st.sampled_from(["id", "param", "top", "exp", "neg"])).map(
    lambda a: {
        "id": b'{"jsonrpc":"2.0","id":' + b"9" * a[0] + b',"method":"ping"}',
        "param": b'{"jsonrpc":"2.0","id":"n","method":"tools/list","params":{"cursor":' + b"1" * a[0] + b"}}",
        "top": b"7" * a[0],
        "exp": b'{"jsonrpc":"2.0","id":"e","method":"ping","params":{"x":1e' + str(a[0]).encode() + b"}}",
        "neg": b'{"jsonrpc":"2.0","id":-' + b"8" * a[0] + b',"method":"ping"}',
    }[a[1]]
)
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(_dump),
    jsonrpc_like.filter(_safe).map(_dump),
    handler_attack.filter(_safe).map(_dump),
    # Otherwise well-formed requests and notifications whose id is of any type.
    st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "method": st.sampled_from(["ping", "tools/list"]), "id": ids}).map(_dump),
    st.lists(st.one_of(jsonrpc_like, handler_attack, valid_ping), max_size=5).filter(_safe).map(_dump),
    st.tuples(st.integers(min_value=1, max_value=3000), st.sampled_from(["list", "dict", "params"])).map(_deep),
    huge_numbers,
    st.tuples(
        st.one_of(jsonrpc_like.filter(_safe).map(_dump), valid_ping.map(_dump)),
        st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xc3"]),
        st.integers(min_value=0, max_value=200),
    ).map(_inject),
)
WARM_UP_BODIES = [
    b"{",
    b"[]",
    b'{"jsonrpc":"2.0","id":"w1","method":"ping"}',
    b'{"jsonrpc":"2.0","id":null,"method":"ping"}',
    b'[{"jsonrpc":"2.0","id":"w2","method":"ping"},{"id":3}]',
    b"\xff\xfe",
    b"[" * 2000 + b"]" * 2000,
]


async def test_hostile_bodies(arena: Arena) -> None:
    """Generated POST bodies: a clear status for each, never a 5xx, and 400s say -32700 or -32600."""

    @settings(HYPOTHESIS, max_examples=400)
    @given(body=bodies)
    # Fields the bridge reads, with types it must not trip over.
    @example(body=b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[1]}}')
    @example(body=b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{"a":1}}}')
    @example(body=b'{"jsonrpc":"2.0","id":"t1","method":"tasks/get","params":{"taskId":[]}}')
    @example(body=b'{"jsonrpc":"2.0","id":"t2","method":"tasks/cancel","params":{"taskId":{}}}')
    @example(body=b'{"jsonrpc":"2.0","id":"l1","method":"logging/setLevel","params":{"level":["debug"]}}')
    @example(body=b'{"jsonrpc":"2.0","id":"s1","method":"resources/subscribe","params":{"uri":[]}}')
    @example(body=b'{"jsonrpc":"2.0","id":"i1","method":"initialize","params":{"protocolVersion":[],"capabilities":[]}}')
    @example(body=b'{"jsonrpc":"2.0","id":"p1","method":"tools/list","params":{"_meta":{"progressToken":[1]}}}')
    @example(body=b'{"jsonrpc":"2.0","id":[1],"result":{}}')
    @example(body=b'{"jsonrpc":"2.0","id":null,"method":"ping"}')
    @example(body=b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}')
    @example(body=b'{"jsonrpc":"2.0","id":1.0,"method":"tools/list"}')
    @example(body=b'{"jsonrpc":"2.0","id":false,"method":"ping"}')
    @example(body=b'{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}')
    @example(body=b'{"id":1,"method":"ping"}')
    @example(body=b'{"jsonrpc":"2.0","id":1,"method":["ping"]}')
    @example(body=b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\xff"}}')
    @example(body=b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}')
    @example(body=b'[{"jsonrpc":"2.0","id":"b1","method":"ping"},{"jsonrpc":"2.0","id":true,"method":"ping"}]')
    def hostile_body(body: bytes) -> None:
        check_body(arena, body)

    async with arena.phase("bodies"):
        await asyncio.to_thread(hostile_body)
        # The hostile session is still alive and answering.
        assert await arena.hostile.request("ping", request_id="bodies-done") == {"jsonrpc": "2.0", "id": "bodies-done", "result": {}}


async def test_nesting_depth_sweep(arena: Arena) -> None:
    """Valid requests nested around the decoder's depth limit: accepted or refused with -32700, never a 500."""
    async with arena.phase("nesting"):

        def sweep() -> list[tuple[int, int, bytes]]:
            wrong = []
            for depth in range(850, 1030, 3):
                body = _deep((depth, "params")).replace(b'"deep"', f'"deep{depth}"'.encode())
                status, text = post_body(arena, body)
                if status == 400 and error_code(text) == -32700 or status == 202:
                    continue
                wrong.append((depth, status, text[:200]))
            return wrong

        wrong = await asyncio.to_thread(sweep)
        assert not wrong, wrong


# ============================================================ headers and query strings

HEADER_CHARS = st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.characters(min_codepoint=0xA0, max_codepoint=0xFF)
header_text = st.text(HEADER_CHARS, max_size=40).map(lambda s: s.strip())


def _host_is_loopback(host: str) -> bool:
    name = host.lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name
    else:
        head, sep, port = name.rpartition(":")
        if sep and port.isdigit() and ":" not in head:
            name = head
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@st.composite
def http_requests(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["messages", "messages", "messages", "sse", "status", "unknown_server"]))
    method = draw(st.sampled_from(["POST", "POST", "GET", "OPTIONS", "DELETE", "PUT"]))
    host = draw(
        st.one_of(
            st.just("proper"),
            st.sampled_from(["localhost:1", "[::1]:80", "127.0.0.1", "evil.example.com", "localhost.evil.example.com"]),
            st.from_regex(r"[a-z0-9.-]{1,20}(:[0-9]{1,5})?", fullmatch=True),
            header_text,
        )
    )
    origin = draw(st.one_of(st.none(), st.just(ORIGIN), st.sampled_from(["null", "https://evil.example.com", ORIGIN + "/"]), header_text))
    auth = draw(
        st.one_of(
            st.none(),
            st.sampled_from([f"Bearer {HOSTILE}", f"bearer {HOSTILE}", f"Bearer {GOOD}", f"Bearer {HOSTILE}x", "Bearer", f"Basic {HOSTILE}"]),
            header_text,
            header_text.map(lambda s: f"Bearer {s}"),
        )
    )
    content_type = draw(st.one_of(st.none(), st.just("application/json"), header_text))
    session_param = draw(st.sampled_from(["session_id", "sessionId", "SESSION_ID", "session"]))
    session_value = draw(st.one_of(st.sampled_from(["real", "real", "real+x", "REAL", ""]), st.text(max_size=40)))
    extra = draw(st.lists(st.tuples(st.text(max_size=8), st.text(max_size=20)), max_size=3))
    return {
        "kind": kind,
        "method": method,
        "host": host,
        "origin": origin,
        "auth": auth,
        "content_type": content_type,
        "session": (session_param, session_value),
        "extra": [(k, v) for k, v in extra if k not in ("session_id", "sessionId")],
    }


def expected_statuses(req: dict[str, Any], host: str, real_sid: str) -> set[int]:
    """The statuses the access rules and routes call for."""
    if not _host_is_loopback(host):
        return {400, 403, 421}
    origin = req["origin"]
    if origin is not None and origin != ORIGIN:
        return {403}
    if req["method"] == "OPTIONS" and origin is not None:
        return {200, 204}
    auth = req["auth"]
    scheme, _, token = (auth or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or token not in (HOSTILE, GOOD):
        return {401}
    kind, method = req["kind"], req["method"]
    if kind == "status":
        return {200} if method == "GET" else {405}
    if kind == "unknown_server":
        return {403, 404, 405}  # the hostile token is limited to `f`
    if kind == "sse":
        return {200} if method == "GET" else {405}
    if method != "POST":
        return {405}
    name, value = req["session"]
    sid = {"real": real_sid, "real+x": real_sid + "x", "REAL": real_sid.upper()}.get(value, value)
    owner_ok = token == HOSTILE
    if name in ("session_id", "sessionId") and sid == real_sid and owner_ok:
        return {202}
    return {404}


async def test_hostile_headers_and_queries(arena: Arena) -> None:
    """Generated Host, Origin, Authorization, Content-Type and query strings: each gets the status
    its access rules call for, never a 5xx; 400s carry a JSON-RPC error."""
    port, real_sid = arena.b.port, arena.hostile.session_id
    counter = itertools.count()

    @settings(HYPOTHESIS, max_examples=300)
    @given(req=http_requests())
    @example(req={"kind": "messages", "method": "POST", "host": "proper", "origin": None, "auth": f"Bearer {HOSTILE}",
                  "content_type": None, "session": ("session_id", "real"), "extra": []})  # fmt: skip
    def hostile_request(req: dict[str, Any]) -> None:
        host = f"127.0.0.1:{port}" if req["host"] == "proper" else req["host"]
        path = {
            "messages": "/servers/f/messages",
            "sse": "/servers/f/sse",
            "status": "/status",
            "unknown_server": "/servers/nope/messages",
        }[req["kind"]]
        name, value = req["session"]
        sid = {"real": real_sid, "real+x": real_sid + "x", "REAL": real_sid.upper()}.get(value, value)
        query = [(name, sid), *req["extra"]]
        target = path + "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)
        headers: list[tuple[str, bytes | str]] = [("Host", host.encode("latin-1"))]
        for header, value_ in (("Origin", req["origin"]), ("Authorization", req["auth"]), ("Content-Type", req["content_type"])):
            if value_ is not None:
                headers.append((header, value_.encode("latin-1")))
        n = next(counter)
        body = _dump({"jsonrpc": "2.0", "id": f"hq{n}", "method": "ping"}) if req["method"] in ("POST", "PUT") else None
        status, resp_headers, text = post_raw(port, req["method"], target, headers, body)
        assert status < 500, (status, text[:300])
        expected = expected_statuses(req, host, real_sid)
        assert status in expected, (status, sorted(expected), text[:200])
        if status == 400:
            assert error_code(text) in (-32700, -32600), text[:300]
        if status == 401:
            assert (resp_headers.get("WWW-Authenticate") or "").startswith("Bearer"), resp_headers
        if req["origin"] not in (None, ORIGIN):
            assert resp_headers.get("Access-Control-Allow-Origin") is None, resp_headers
        for secret in (HOSTILE, GOOD):
            assert secret.encode() not in text

    async with arena.phase("headers"):
        await asyncio.to_thread(hostile_request)
        # Streams it opened closed with their connections; only the two long-lived sessions remain.
        await arena.settle(2)
        assert await arena.hostile.request("ping", request_id="headers-done") == {"jsonrpc": "2.0", "id": "headers-done", "result": {}}
        for event in arena.b.events:
            line = json.dumps(event)
            assert HOSTILE not in line and GOOD not in line, line[:300]


# ================================================================ hostile servers


def drop_events(b: Bridge, start: int) -> list[dict[str, Any]]:
    names = ("server_line_skipped", "message_dropped", "server_line_dropped")
    return [e for e in b.events[start:] if e.get("event") in names]


async def log_barrier(arena: Arena) -> None:
    """Once this returns, everything the daemon logged before it is in `b.events`: a session
    opened now is logged after it, and the log is one ordered stream."""
    async with RawSse(arena.b.url("f"), headers=bearer(HOSTILE)) as c:
        sid = c.session_id
        await arena.b.wait_for("session_opened", where=lambda e: e.get("session") == sid)
    await arena.b.wait_for("session_closed", where=lambda e: e.get("session") == sid)


async def test_garbage_and_oversized_from_server(arena: Arena) -> None:
    """Not JSON, truncated JSON, a response with an id never issued, a line over the limit:
    each logged once with the server's name and dropped; the call that caused it, and
    everyone else, carry on."""
    async with arena.phase("server_garbage"):
        for _ in range(3):
            mark = len(arena.b.events)
            reply = await arena.tool("garbage")
            assert reply["result"]["content"][0]["text"] == "ok", reply
            await log_barrier(arena)
            drops = drop_events(arena.b, mark)
            assert [e["event"] for e in drops] == ["server_line_skipped", "server_line_skipped", "message_dropped"], drops
            assert all(e.get("server") == "f" for e in drops), drops
            assert drops[2].get("id") == 999999999, drops

        for size in (LIMIT + 1, LIMIT * 3):
            mark = len(arena.b.events)
            reply = await arena.tool("big", {"bytes": size})
            assert "result" not in reply and reply["error"]["code"] == -32006, str(reply)[:300]
            await log_barrier(arena)
            drops = drop_events(arena.b, mark)
            assert len(drops) == 1 and drops[0].get("server") == "f", drops
            assert str(drops[0].get("size", "")).isdigit() and int(drops[0]["size"]) > LIMIT, drops
        # Just under the limit still goes through, whole.
        reply = await arena.tool("big", {"bytes": LIMIT - 1024})
        assert reply["result"]["content"][0]["text"] == "x" * (LIMIT - 1024)
        assert (await arena.tool("echo", {"text": "after"}))["result"]["content"][0]["text"] == "after"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# One line each, as the fault server writes them, and how many log events it may cost: not
# JSON, or an id never issued, exactly one (the rules); anything else at most one per message.
SERVER_JUNK: list[tuple[str, bytes, int, int]] = [
    ("not json", b"this is not json", 1, 1),
    ("invalid utf-8", b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"\xff\xfe"}}', 1, 1),
    ("truncated", b'{"jsonrpc":"2.0","id":1,"result":{', 1, 1),
    ("deep", b"[" * 5000 + b"]" * 5000, 1, 1),
    ("string id never issued", b'{"jsonrpc":"2.0","id":"never-issued","result":{}}', 1, 1),
    ("negative id", b'{"jsonrpc":"2.0","id":-5,"result":{}}', 1, 1),
    ("huge id", b'{"jsonrpc":"2.0","id":99999999999999999999999,"result":{}}', 1, 1),
    ("null id response", b'{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"x"}}', 0, 1),
    ("number", b"42", 0, 1),
    ("string", b'"hello"', 0, 1),
    ("null", b"null", 0, 1),
    ("empty batch", b"[]", 0, 1),
    ("batch of junk", b'[1, "x", {"jsonrpc":"2.0","id":"zz","result":{}}]', 1, 3),
    ("missing jsonrpc", b'{"id":5,"result":{}}', 0, 1),
    ("method not a string", b'{"jsonrpc":"2.0","method":7}', 0, 1),
    ("method a list", b'{"jsonrpc":"2.0","method":["notifications/message"]}', 0, 1),
    ("progress token a list", b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":[1],"progress":1}}', 0, 1),
    ("progress token a dict", b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":{"a":1},"progress":1}}', 0, 1),
    ("cancelled request id a list", b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[1]}}', 0, 1),
    ("log level a list", b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":["info"],"data":"x"}}', 0, 1),
    ("task id a dict", b'{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":{},"status":"working"}}', 0, 1),
    ("elicitation id a list", b'{"jsonrpc":"2.0","method":"notifications/elicitation/complete","params":{"elicitationId":[]}}', 0, 1),
    ("updated uri a list", b'{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":[]}}', 0, 1),
    ("related task id a list", b'{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":[]}}}}', 0, 1),
    ("server ping with a bad id", b'{"jsonrpc":"2.0","id":[1],"method":"ping"}', 0, 1),
    ("tasks request with a list task id", b'{"jsonrpc":"2.0","id":"sr1","method":"tasks/get","params":{"taskId":[]}}', 0, 1),
]


async def emit(arena: Arena, raw: list[bytes], timeout: float = 5.0) -> str | None:
    """Have the server write these lines, then answer; the answer's text, or None if it never came."""
    try:
        reply = await arena.tool("emit", {"raw": [_b64(line) for line in raw]}, timeout=timeout)
    except TimeoutError:
        return None
    return reply.get("result", {}).get("content", [{}])[0].get("text")


async def test_malformed_messages_from_server(arena: Arena) -> None:
    """Each kind of junk line a server can write: dropped (logged at most once, with the server's
    name), the server's next line read as usual, nobody else disturbed."""
    async with arena.phase("server_junk"):
        wrong = []
        for label, line, least, most in SERVER_JUNK:
            mark = len(arena.b.events)
            text = await emit(arena, [line])
            if text != "ok":
                wrong.append(f"{label}: the reply after it never came (the server's stdout is no longer read?)")
                continue
            await log_barrier(arena)
            drops = drop_events(arena.b, mark)
            bad = tracebacks(arena.b, mark)
            if bad:
                wrong.append(f"{label}: {len(bad)} traceback lines, e.g. {bad[-1]}")
            if not least <= len(drops) <= most:
                wrong.append(f"{label}: logged {len(drops)} times (expected {least}..{most}): {drops}")
            if any(e.get("server") != "f" for e in drops):
                wrong.append(f"{label}: logged without the server's name: {drops}")
        assert not wrong, "\n".join(wrong)


SERVER_NOTIFICATIONS = [
    "notifications/progress", "notifications/cancelled", "notifications/resources/updated",
    "notifications/tasks/status", "notifications/elicitation/complete",
]  # fmt: skip
server_lines = st.one_of(
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
    json_values.map(_dump),
    # Notifications the bridge routes by a field, with that field (and others) of any type.
    st.fixed_dictionaries(
        {
            "jsonrpc": st.just("2.0"),
            "method": st.sampled_from(SERVER_NOTIFICATIONS),
            "params": st.dictionaries(st.sampled_from(PARAM_KEYS + ["progress", "status", "data"]), st.one_of(unhashable, json_values), max_size=3),
        }
    ).map(_dump),
    # Responses with ids the bridge never issues (it issues positive integers only).
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "id": st.one_of(st.text(max_size=8), st.integers(max_value=-1), st.integers(min_value=2**62), unhashable, st.none())},
        optional={"result": json_values, "error": json_values},
    ).map(_dump),
    st.lists(st.one_of(scalars, unhashable), max_size=4).map(_dump),
)


async def test_hostile_server_lines(arena: Arena) -> None:
    """Generated junk on the server's stdout: after each, the server's next line is read and
    answered as usual, with no traceback in the daemon."""

    @settings(HYPOTHESIS, max_examples=80, phases=[Phase.explicit, Phase.generate])  # no shrinking: a failure costs a timeout
    @given(lines=st.lists(server_lines, min_size=1, max_size=3))
    def junk(lines: list[bytes]) -> None:
        mark = len(arena.b.events)
        text = arena.run(emit(arena, lines))
        assert text == "ok", f"no reply after {lines!r}: the server's stdout is no longer read"
        bad = tracebacks(arena.b, mark)
        assert not bad, (lines, bad[-3:])

    async with arena.phase("server_lines"):
        await asyncio.to_thread(junk)


# ===================================================================== connections


async def storm(arena: Arena, n: int, concurrency: int = 50) -> dict[str, int]:
    """`n` rapid SSE connects and disconnects of several kinds, plus `n // 5` broken or refused
    connections, `concurrency` at a time."""
    b, port = arena.b, arena.b.port
    gate = asyncio.Semaphore(concurrency)
    seen: dict[str, int] = {}
    get = f"GET /servers/f/sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {HOSTILE}\r\nAccept: text/event-stream\r\n\r\n".encode()

    def count(kind: str) -> None:
        seen[kind] = seen.get(kind, 0) + 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as http:

        async def stream(i: int) -> None:
            async with gate:
                if i % 4 in (0, 1):  # read the endpoint event (or nothing at all), hang up
                    async with http.get(b.url("f"), headers=bearer(HOSTILE)) as resp:
                        assert resp.status == 200, resp.status
                        if i % 4 == 0:
                            async with asyncio.timeout(10):
                                while not (await resp.content.readline()).startswith(b"data:"):
                                    pass
                    count("read" if i % 4 == 0 else "headers")
                else:  # a raw GET, then a reset before reading a byte, or a close after the first bytes
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(get)
                    await writer.drain()
                    if i % 4 == 2:
                        writer.transport.abort()
                        count("reset")
                    else:
                        async with asyncio.timeout(10):
                            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
                        writer.close()
                        count("closed")

        async def broken(i: int) -> None:
            async with gate:
                if i % 3 == 0:  # half a request
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(get[: len(get) // 2])
                    await writer.drain()
                    writer.close()
                    count("half")
                else:  # refused: no token, or a foreign Origin
                    headers = {} if i % 3 == 1 else {"Origin": "https://evil.example.com", **bearer(HOSTILE)}
                    async with http.get(b.url("f"), headers=headers) as resp:
                        assert resp.status in (401, 403), resp.status
                    count("refused")

        async with asyncio.timeout(120):
            await asyncio.gather(*(stream(i) for i in range(n)), *(broken(i) for i in range(n // 5)))
    return seen


async def test_rapid_connects_and_disconnects(arena: Arena) -> None:
    async with arena.phase("storm"):
        opened_before = len(arena.b.named("session_opened"))
        seen = await storm(arena, 1000)
        assert sum(seen.values()) == 1200 and seen["read"] == 250 and seen["closed"] == 250, seen
        # Every session it opened is closed again (a dropped connection ends its session).
        await arena.settle(2)
        opened = len(arena.b.named("session_opened")) - opened_before
        assert opened >= seen["read"] + seen["headers"] + seen["closed"], (opened, seen)
        async with aiohttp.ClientSession() as http, http.get(f"{arena.b.base}/status", headers=bearer(OPS)) as resp:
            assert (await resp.json())["servers"]["f"]["sessions"] == 2


async def never_reader(arena: Arena, payload_size: int = 128 * 1024) -> None:
    """A client that sends the GET and never reads, while POSTing large echo requests: its
    session is closed as too slow once its queue fills."""
    b, loop = arena.b, arena.loop
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    mark = len(b.events)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", b.port))
        await loop.sock_sendall(
            sock, f"GET /servers/f/sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {HOSTILE}\r\n\r\n".encode()
        )
        stalled = (await b.wait_for("session_opened", where=lambda e: e.get("owner") == "hostile", start=mark))["session"]
        url = f"{b.base}/servers/f/messages?session_id={stalled}"
        text = "n" * payload_size
        async with aiohttp.ClientSession() as http:
            for i in range(1000):
                msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call("echo", {"text": text})}
                async with http.post(url, json=msg, headers=bearer(HOSTILE)) as resp:
                    status = resp.status
                if status != 202 or any(e.get("session") == stalled for e in b.named("session_closed")):
                    break
        await b.wait_for("session_too_slow", where=lambda e: e.get("session") == stalled, start=mark)
        closed = await b.wait_for("session_closed", where=lambda e: e.get("session") == stalled, start=mark)
        assert closed["reason"] == "slow", closed
    finally:
        sock.close()


async def test_reader_that_never_reads(arena: Arena) -> None:
    async with arena.phase("never_reader"):
        await never_reader(arena)
        await arena.settle(2)


# ====================================================================== afterwards


async def test_after_everything_serves_and_memory_is_back(arena: Arena) -> None:
    """New sessions are served, only the two long-lived sessions remain, and RSS is back
    within 20 MiB of where it was after warm-up."""
    from mcp import ClientSession
    from mcp.client.sse import sse_client

    async with arena.phase("after"):
        async with RawSse(arena.b.url("f"), headers=bearer(HOSTILE)) as c:
            await c.initialize()
            reply = await c.request("tools/call", call("echo", {"text": "new raw session"}), request_id=1)
            assert reply["result"]["content"][0]["text"] == "new raw session"
        async with asyncio.timeout(30):
            async with sse_client(arena.b.url("f"), headers=bearer(GOOD), timeout=10) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=10) as session:
                    await session.initialize()
                    result = await session.call_tool("echo", {"text": "new sdk session"})
                    assert result.content[0].text == "new sdk session"  # type: ignore[union-attr]
        await arena.settle(2)

        pid, limit = arena.b.proc.pid, arena.baseline_rss + RSS_SLACK_KIB
        rss = rss_kib(pid)
        for _ in range(40):  # bounded poll: freed memory may take a moment to be returned
            if rss <= limit:
                break
            await asyncio.sleep(0.25)
            rss = rss_kib(pid)
        ran = sorted(arena.phases)
        assert rss <= limit, f"RSS {rss} KiB, baseline after warm-up {arena.baseline_rss} KiB (phases run: {ran})"

    assert arena.good.latencies and max(arena.good.latencies) < 15, max(arena.good.latencies, default=None)
