"""The idle-sessions test: many open HTTP+SSE sessions on one shared server.

Starts a fresh mcp-bridge (bench/server.py, shared, `sse.keepalive` short),
opens N SSE sessions (each initialized, then left idle), and while they all
stay open:

- samples the RSS of the bridge and its server from /proc;
- checks keepalives on every session: during the observation window each one
  must get a comment at most `keepalive + 1 s` after the window opens, after
  the previous one, and before the window closes;
- makes calls on random sessions at a steady rate (open loop) and reports
  their latency p50/p90/p99 (the target: p99 under 50 ms, RSS under
  400 MiB for 10,000 sessions).

Reports JSON on stdout. This process raises its own open-file limit; with
more sessions than one source address can hold, client sockets are spread
over 127.0.0.x source addresses.

    python -m bench.idle --sessions 10000
    python -m bench.run --idle 10000            # the same
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import resource
import sys
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit

from bench import load
from bench import run as bench_run
from bench.load import PostPool, SseStream, loads, perf, post_bytes, request_head

PORTS_PER_ADDRESS = 20000  # well inside the ephemeral range (see /proc/sys/net/ipv4/ip_local_port_range)


class IdleSession:
    __slots__ = ("idx", "stream", "endpoint", "post_head", "comments", "first", "last", "max_gap", "initialized", "prefix")

    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.stream: SseStream | None = None
        self.endpoint: asyncio.Future[str] | None = None
        self.post_head = b""
        self.comments = 0
        self.first = 0.0  # first comment in the observation window
        self.last = 0.0  # last comment seen
        self.max_gap = 0.0
        self.initialized = False
        self.prefix = f"i{idx}|"


class Idle:
    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.args = args
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path
        self.hostport = f"{self.host}:{self.port}"
        self.sessions: list[IdleSession] = []
        self.pool = PostPool(self.host, self.port, args.post_conns, self._posted)
        self.waiting: dict[tuple[int, int], tuple[float, asyncio.Future[Any]]] = {}
        self.window_start = math.inf
        self.lost = 0
        self.lost_reasons: list[str] = []
        self.misrouted = 0
        self.errors = 0
        self.error_samples: list[str] = []
        self.spread = max(1, math.ceil(args.sessions / PORTS_PER_ADDRESS)) if args.spread == 0 else args.spread

    def _error(self, reason: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(reason[:300])

    # -- per-session callbacks

    def _on_event(self, s: IdleSession) -> Any:
        def on_event(event: bytes, data: bytes) -> None:
            if event == b"endpoint":
                if s.endpoint is not None and not s.endpoint.done():
                    s.endpoint.set_result(data.decode())
            elif event == b"message":
                self._message(s, data)

        return on_event

    def _on_comment(self, s: IdleSession) -> Any:
        def on_comment() -> None:
            now = perf()
            if now >= self.window_start:
                s.comments += 1
                gap = now - (s.last if s.last >= self.window_start else self.window_start)
                if gap > s.max_gap:
                    s.max_gap = gap
                if not s.first:
                    s.first = now
            s.last = now

        return on_comment

    def _on_lost(self, s: IdleSession) -> Any:
        def on_lost(reason: str) -> None:
            self.lost += 1
            if len(self.lost_reasons) < 5:
                self.lost_reasons.append(f"session {s.idx}: {reason}")
            if s.endpoint is not None and not s.endpoint.done():
                s.endpoint.set_exception(ConnectionError(reason))

        return on_lost

    def _message(self, s: IdleSession, data: bytes) -> None:
        try:
            msg = loads(data)
        except ValueError:
            self._error(f"session {s.idx}: not JSON")
            return
        if msg.__class__ is not dict or "method" in msg:
            return
        rid = msg.get("id")
        entry = self.waiting.pop((s.idx, rid), None)
        if entry is None:
            self.misrouted += 1
            return
        t0, fut = entry
        if not fut.done():
            fut.set_result((perf() - t0, msg))

    def _posted(self, tag: Any, status: int, headers: Any, body: bytes) -> None:
        if isinstance(tag, asyncio.Future):  # a notification: done once accepted
            if not tag.done():
                tag.set_result(status)
            return
        if status not in (200, 202):
            entry = self.waiting.pop(tag, None) if tag is not None else None
            if entry is not None and not entry[1].done():
                entry[1].set_exception(ConnectionError(f"POST got HTTP {status}: {body[:200]!r}"))
            elif tag is None:
                self._error(f"POST got HTTP {status}: {body[:200]!r}")

    # -- requests

    def request(self, s: IdleSession, rid: int, body: bytes) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[(s.idx, rid)] = (perf(), fut)
        self.pool.submit(post_bytes(s.post_head, body), (s.idx, rid))
        return fut

    async def open(self, s: IdleSession) -> None:
        loop = asyncio.get_running_loop()
        s.endpoint = loop.create_future()
        local = (f"127.0.0.{2 + s.idx % self.spread}", 0) if self.spread > 1 else None
        _, s.stream = await loop.create_connection(
            lambda: SseStream(self._on_event(s), self._on_comment(s), self._on_lost(s)), self.host, self.port, local_addr=local
        )
        s.stream.transport.write(request_head("GET", self.path, self.hostport, [("Accept", "text/event-stream")]) + b"\r\n")  # type: ignore[union-attr]
        endpoint = await asyncio.wait_for(s.endpoint, self.args.timeout)
        parts = urlsplit(endpoint)
        target = parts.path + ("?" + parts.query if parts.query else "")
        s.post_head = request_head("POST", target, self.hostport, [("Content-Type", "application/json")])
        if self.args.initialize:
            init = json.dumps(
                {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": load.PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "idle-bench", "version": "1"}}},
                separators=(",", ":"),
            ).encode()
            _, msg = await asyncio.wait_for(self.request(s, 0, init), self.args.timeout)
            if "result" not in msg:
                raise ConnectionError(f"initialize failed: {msg.get('error')}")
            accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self.pool.submit(post_bytes(s.post_head, b'{"jsonrpc":"2.0","method":"notifications/initialized"}'), accepted)
            status = await asyncio.wait_for(accepted, self.args.timeout)
            if status not in (200, 202):
                raise ConnectionError(f"notifications/initialized got HTTP {status}")
            s.initialized = True

    async def call(self, s: IdleSession, rid: int, latencies: list[float], when: list[tuple[float, float]]) -> None:
        text = f"{s.prefix}{rid}|"
        body = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"%s"}}}' % (rid, text.encode())
        try:
            latency, msg = await asyncio.wait_for(self.request(s, rid, body), self.args.timeout)
        except (TimeoutError, ConnectionError) as exc:
            self.waiting.pop((s.idx, rid), None)
            self._error(f"session {s.idx} call {rid}: {exc.__class__.__name__} {exc}")
            return
        try:
            got = msg["result"]["content"][0]["text"]
        except (KeyError, IndexError, TypeError):
            got = None
        if got != text:
            self._error(f"session {s.idx} call {rid}: wrong answer {str(msg)[:200]}")
            return
        latencies.append(latency)
        when.append((perf() - latency - self.window_start, latency))


async def measure(args: argparse.Namespace, url: str, sampler: bench_run.Sampler | None) -> dict[str, Any]:
    idle = Idle(args, url)
    idle.sessions = [IdleSession(i) for i in range(args.sessions)]
    report: dict[str, Any] = {"sessions_requested": args.sessions, "source_addresses": idle.spread}
    rss_before = sampler.last if sampler else 0
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t_open = perf()
    sem = asyncio.Semaphore(args.open_concurrency)
    failures: list[str] = []

    async def open_one(s: IdleSession) -> bool:
        async with sem:
            try:
                await idle.open(s)
                return True
            except (TimeoutError, OSError, ConnectionError, load.HttpError) as exc:
                if len(failures) < 5:
                    failures.append(f"session {s.idx}: {exc.__class__.__name__}: {exc}")
                if s.stream is not None:
                    s.stream.close()
                return False

    opened_flags = await asyncio.gather(*(open_one(s) for s in idle.sessions))
    open_s = perf() - t_open
    live = [s for s, ok in zip(idle.sessions, opened_flags, strict=False) if ok]
    report.update(
        sessions_opened=len(live),
        open_failures=len(idle.sessions) - len(live),
        open_failure_samples=failures,
        open_seconds=round(open_s, 2),
        initialized=sum(1 for s in live if s.initialized),
    )
    gc.collect()
    gc.freeze()
    gc.disable()
    await asyncio.sleep(args.settle)
    if sampler:
        sampler.sample()
        report["rss_after_open_mib"] = round(sampler.last / load_mib(), 1)
        report["rss_before_mib"] = round(rss_before / load_mib(), 1)
        if live:
            report["rss_per_session_kib"] = round((sampler.last - rss_before) / 1024 / len(live), 1)

    # Observation window: keepalives on every session, and calls on random sessions.
    idle.window_start = perf()
    lost_before = idle.lost
    target_cpu0 = sampler.cpu_total() if sampler else 0.0
    latencies: list[float] = []
    when: list[tuple[float, float]] = []  # (sent at, seconds into the window; latency)
    calls: list[asyncio.Task[None]] = []
    n_calls = max(0, int(args.rate * args.observe))
    rng = random.Random(args.seed)
    loop = asyncio.get_running_loop()
    for i in range(n_calls):
        due = idle.window_start + (i + 0.5) / args.rate
        delay = due - perf()
        if delay > 0:
            await asyncio.sleep(delay)
        if live:
            calls.append(loop.create_task(idle.call(rng.choice(live), 1000 + i, latencies, when)))
    remaining = idle.window_start + args.observe - perf()
    if remaining > 0:
        await asyncio.sleep(remaining)
    window_end = perf()
    if sampler:
        # The bridge's CPU share while it only held the sessions (keepalives) and answered the calls.
        report["target_cpu_share_in_window"] = round((sampler.cpu_total() - target_cpu0) / (window_end - idle.window_start) / (os.cpu_count() or 1), 3)
    if calls:
        await asyncio.wait(calls, timeout=args.timeout)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = perf() - t_open

    ka = args.keepalive
    allowed = ka + 1.0
    still_open = [s for s in live if s.stream is not None and not s.stream.done]
    late = []
    gaps = []
    for s in still_open:
        tail_gap = window_end - (s.last if s.last >= idle.window_start else idle.window_start)
        worst = max(s.max_gap, tail_gap)
        gaps.append(worst)
        if worst > allowed or s.comments == 0:
            late.append(s.idx)
    gaps.sort()
    lat = sorted(latencies)
    report.update(
        keepalive_s=ka,
        observe_s=args.observe,
        sessions_lost_during_window=idle.lost - lost_before,
        sessions_lost_total=idle.lost,
        lost_samples=idle.lost_reasons,
        keepalive={
            "checked": len(still_open),
            "late": len(late),
            "late_samples": late[:10],
            "allowed_gap_s": allowed,
            "worst_gap_s": round(gaps[-1], 3) if gaps else None,
            "p99_gap_s": round(load.pct(gaps, 0.99), 3) if gaps else None,
            "on_time": not late and len(still_open) == len(live),
        },
        calls={
            "made": n_calls,
            "ok": len(lat),
            "errors": idle.errors,
            "misrouted": idle.misrouted,
            "error_samples": idle.error_samples,
            "rate_per_s": args.rate,
            "latency_ms": {
                "p50": load.ms(load.pct(lat, 0.5)),
                "p90": load.ms(load.pct(lat, 0.9)),
                "p99": load.ms(load.pct(lat, 0.99)),
                "max": load.ms(lat[-1] if lat else None),
            },
            # The slowest calls and when they were sent: slow calls bunched together point at a pause.
            "slowest": [[round(t, 2), load.ms(l)] for t, l in sorted(when, key=lambda x: -x[1])[:10]],
            "over_50ms": sum(1 for x in lat if x > 0.05),
            "timeline": [[round(t, 3), load.ms(l)] for t, l in sorted(when)],
        },
        loadgen_cpu_share=round(((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)) / wall / (os.cpu_count() or 1), 4),
        uvloop="uvloop" in type(loop).__module__,
    )
    if sampler:
        report["rss_peak_mib"] = round(sampler.peak / load_mib(), 1)
    for s in idle.sessions:
        if s.stream is not None:
            s.stream.close()
    idle.pool.close()
    gc.enable()
    gc.unfreeze()
    await asyncio.sleep(0.2)
    return report


def load_mib() -> int:
    return 1024 * 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--sessions", type=int, default=10000)
    p.add_argument("--keepalive", type=float, default=5.0, help="sse.keepalive given to the bridge, seconds")
    p.add_argument("--observe", type=float, default=None, help="observation window, seconds (default 3 x keepalive + 1)")
    p.add_argument("--rate", type=float, default=20.0, help="calls per second on random sessions during the window")
    p.add_argument("--timeout", type=float, default=10.0, help="per call / per session open")
    p.add_argument("--open-concurrency", type=int, default=100, help="sessions being opened at once")
    p.add_argument("--post-conns", type=int, default=16, help="keep-alive POST connections shared by all sessions")
    p.add_argument("--spread", type=int, default=0, help="source addresses 127.0.0.2.. to spread client sockets over (0: as needed)")
    p.add_argument("--no-initialize", dest="initialize", action="store_false", help="leave sessions uninitialized")
    p.add_argument("--settle", type=float, default=1.0, help="seconds to wait after opening before measuring RSS")
    p.add_argument("--url", default=None, help="use a running bridge's SSE url instead of starting one (no RSS then)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-uvloop", action="store_true")
    p.add_argument("--out", default=None, help="also write the report here")
    args = p.parse_args(argv)
    if args.observe is None:
        args.observe = 3 * args.keepalive + 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nofile = load.raise_nofile()
    need = args.sessions + args.post_conns + 64
    if nofile < need:
        print(f"open-file limit {nofile} is below the {need} this test needs", file=sys.stderr)
        return 1
    load.install_uvloop(not args.no_uvloop)
    target = None
    sampler = None
    with tempfile.TemporaryDirectory(prefix="mcp-bridge-idle-") as workdir:
        try:
            if args.url:
                url = args.url
            else:
                ka = f"{args.keepalive:g}s"
                target = bench_run.start_bridge(workdir, keepalive=ka, max_sessions=args.sessions + 100)
                url = target.sse_url
                sampler = bench_run.Sampler(target.proc.pid, interval=0.05)  # type: ignore[union-attr]
                sampler.start()
                time.sleep(0.3)
            report = asyncio.run(measure(args, url, sampler))
            report["command"] = "python -m bench.idle " + " ".join(argv if argv is not None else sys.argv[1:])
            report["loadgen_open_file_limit"] = nofile
            if target is not None:
                report["bridge_log_open_file_limit"] = _open_file_event(target.logfile)
                report["target_cpu_s"] = round(sampler.cpu_total(), 2) if sampler else None
        finally:
            if sampler is not None:
                sampler.stop()
            if target is not None:
                report_exit = target.stop()
    if target is not None:
        report["bridge_exit"] = report_exit
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    ok = (
        report["open_failures"] == 0
        and report["keepalive"]["on_time"]
        and report["calls"]["errors"] == 0
        and report["calls"]["misrouted"] == 0
    )
    return 0 if ok else 1


def _open_file_event(logfile: str) -> dict[str, Any] | None:
    try:
        with open(logfile, "rb") as f:
            for line in f:
                if b"open_file_limit" in line:
                    event = json.loads(line)
                    return {"soft": event.get("soft"), "hard": event.get("hard")}
    except (OSError, ValueError):
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
