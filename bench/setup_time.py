"""Session setup time in per-session mode: cold starts against a warm pool.

For each server (`@modelcontextprotocol/server-everything` over stdio, run with the
machine's `node`; `mcp-server-time`, `python -m mcp_server_time`), each protocol
version a session asks for, each mode (cold: `mode: per-session`; warm: the same
with `pool: {warm: W}`) and each pattern (sessions one after another; all at once;
`--gap S`: one every S seconds), a fresh daemon serves the server. A 2025 session
is one Streamable HTTP client: it POSTs `initialize` with its version (the time
measured: from sending it to having its answer), then `notifications/initialized`,
`tools/list`, and DELETEs the session. A 2026-07-28 client has no handshake: its
first request, `server/discover`, is what is timed (in per-session mode every such
request is a session with a process of its own, so that is all it sends). With a
warm pool, measuring starts once the pool holds W ready processes. Prints p50 and
p99 per case (median of the runs), how many sessions got a warm process
(`mcp_bridge_pool_sessions_total`), and the p50 and p99 of those (2025 sessions: by
their `session_opened` event; 2026-07-28 requests log none, so theirs are given only
when every one got a warm process).

    python -m bench.setup_time                      # 3 runs of each case, 50 sessions, warm: 4
    python -m bench.setup_time --runs 1 --sessions 20 --warm 4 --gap 1 --patterns paced
    python -m bench.setup_time --servers time --versions 2025-06-18
    python -m bench.setup_time --runs 1 --sessions 20 --gap 1 --patterns paced --record   # and replace the table in bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Any

import aiohttp
import yaml

from bench import figures

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EVERYTHING = os.path.join(ROOT, "tests", "node", "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
SERVERS: dict[str, dict[str, Any]] = {
    "everything": {"command": "node", "args": [EVERYTHING, "stdio"], "shutdown_timeout": "1s"},  # it ignores its stdin closing
    "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
}
VERSIONS = ("2025-06-18", "2025-11-25", "2026-07-28")
MODERN = "2026-07-28"
JSON_ONLY = {"Accept": "application/json", "Content-Type": "application/json"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


class Daemon:
    def __init__(self, name: str, warm: int, workdir: str) -> None:
        server: dict[str, Any] = {**SERVERS[name], "mode": "per-session"}
        if warm:
            server["pool"] = {"warm": warm}
        self.config = os.path.join(workdir, "setup.yaml")
        with open(self.config, "w") as f:
            yaml.safe_dump({"listen": {"host": "127.0.0.1", "port": 0}, "servers": {name: server}}, f)
        self.name = name
        self.warm = warm
        self.sources: dict[str, str] = {}  # session id -> warm or cold (its session_opened event)
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def __aenter__(self) -> Daemon:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge", "--config", self.config, "--log-level", "info",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
        )  # fmt: skip
        assert self.proc.stderr is not None
        async with asyncio.timeout(30):
            while line := await self.proc.stderr.readline():
                event = json.loads(line)
                if event.get("event") == "listening":
                    self.port = event["port"]
                    break
        asyncio.get_running_loop().create_task(self._drain())
        return self

    async def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            event = json.loads(line)
            if event.get("event") == "session_opened":
                self.sources[event["session"]] = event["process"]

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        async with asyncio.timeout(30):
            await self.proc.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/servers/{self.name}/mcp"

    async def pool_ready(self, http: aiohttp.ClientSession, timeout: float = 60.0) -> None:
        """Wait (polling /status every 50 ms, at most `timeout`) until the pool holds its warm processes."""
        async with asyncio.timeout(timeout):
            while True:
                async with http.get(f"http://127.0.0.1:{self.port}/status") as resp:
                    pool = (await resp.json())["servers"][self.name]["pool"]
                if pool["warm"] >= self.warm:
                    return
                await asyncio.sleep(0.05)

    async def warm_sessions(self, http: aiohttp.ClientSession) -> int:
        async with http.get(f"http://127.0.0.1:{self.port}/metrics") as resp:
            text = await resp.text()
        found = re.search(rf'^mcp_bridge_pool_sessions_total\{{server="{self.name}",source="warm"\}} (\S+)$', text, re.M)
        return int(float(found.group(1))) if found else 0


async def session(http: aiohttp.ClientSession, url: str, n: int, version: str) -> tuple[str | None, float]:
    """One session: its id (None for a 2026-07-28 request), and the seconds from sending
    initialize (server/discover) to having its answer."""
    if version == MODERN:
        return None, await discover(http, url, n)
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": f"setup-{n}", "version": "0"}},
    }
    started = time.perf_counter()
    async with http.post(url, json=init, headers=JSON_ONLY) as resp:
        body = await resp.json()
        took = time.perf_counter() - started
        assert resp.status == 200 and "result" in body, (resp.status, body)
        assert body["result"]["protocolVersion"] == version, body
        sid = resp.headers["Mcp-Session-Id"]
    headers = {**JSON_ONLY, "Mcp-Session-Id": sid, "MCP-Protocol-Version": body["result"]["protocolVersion"]}
    async with http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers) as resp:
        assert resp.status == 202, resp.status
    async with http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=headers) as resp:
        assert "result" in await resp.json()
    async with http.delete(url, headers=headers) as resp:
        assert resp.status == 204, resp.status
    return sid, took


async def discover(http: aiohttp.ClientSession, url: str, n: int) -> float:
    """A 2026-07-28 client's first request: the seconds to its answer."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": f"setup-{n}", "version": "0"},
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}
    headers = {**JSON_ONLY, "MCP-Protocol-Version": MODERN, "Mcp-Method": "server/discover"}
    started = time.perf_counter()
    async with http.post(url, json=body, headers=headers) as resp:
        answer = await resp.json()
        took = time.perf_counter() - started
    assert resp.status == 200 and MODERN in answer["result"]["supportedVersions"], (resp.status, answer)
    return took


async def paced(http: aiohttp.ClientSession, url: str, n: int, version: str, gap: float) -> tuple[str | None, float]:
    await asyncio.sleep(n * gap)  # the arrival schedule being measured, not a wait for something to settle
    return await session(http, url, n, version)


async def one_case(name: str, version: str, warm: int, pattern: str, sessions: int, gap: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        async with Daemon(name, warm, workdir) as daemon, aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            if warm:
                await daemon.pool_ready(http)
            if pattern == "sequential":
                timed = [await session(http, daemon.url, n, version) for n in range(sessions)]
            elif pattern == "paced":
                timed = list(await asyncio.gather(*(paced(http, daemon.url, n, version, gap) for n in range(sessions))))
            else:
                timed = list(await asyncio.gather(*(session(http, daemon.url, n, version) for n in range(sessions))))
            hits = await daemon.warm_sessions(http)
            sources = dict(daemon.sources)
    times = [t for _, t in timed]
    # A 2026-07-28 request logs no session_opened: all came from the pool, or some did not.
    from_pool = (times if hits == sessions else []) if version == MODERN else [t for sid, t in timed if sid is not None and sources.get(sid) == "warm"]
    result = {"p50_ms": percentile(times, 0.5) * 1000, "p99_ms": percentile(times, 0.99) * 1000, "warm_hits": hits}
    if from_pool:
        result |= {"warm_p50_ms": percentile(from_pool, 0.5) * 1000, "warm_p99_ms": percentile(from_pool, 0.99) * 1000}
    return result


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--warm", type=int, default=4)
    parser.add_argument("--gap", type=float, default=0.0, help="also run sessions started every GAP seconds (paced)")
    parser.add_argument("--patterns", default=None, help="comma-separated: sequential, concurrent, paced (default: the first two, and paced with --gap)")
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"comma-separated, of: {', '.join(SERVERS)}")
    parser.add_argument("--versions", default=",".join(VERSIONS), help="comma-separated protocol versions the sessions ask for")
    parser.add_argument("--record", action="store_true", help="also replace the session setup table of bench/RESULTS.md")
    args = parser.parse_args(argv)
    patterns = tuple(args.patterns.split(",")) if args.patterns else ("sequential", "concurrent") + (("paced",) if args.gap else ())
    if "paced" in patterns and not args.gap:
        parser.error("paced needs --gap")
    servers, versions = args.servers.split(","), args.versions.split(",")
    if "everything" in servers and not os.path.exists(EVERYTHING):
        print(f"server-everything not found at {EVERYTHING} (see tests/node)", file=sys.stderr)
        return 2
    results: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for run in range(args.runs):
        for name in servers:
            for version in versions:
                for pattern in patterns:
                    for warm in (0, args.warm):
                        result = await one_case(name, version, warm, pattern, args.sessions, args.gap)
                        mode = f"warm: {warm}" if warm else "cold"
                        results.setdefault((name, version, pattern, mode), []).append(result)
                        rounded = {k: round(v, 1) for k, v in result.items()}
                        print(f"run {run + 1} {name:10} {version} {pattern:10} {mode:8} {json.dumps(rounded)}", flush=True)
    print(f"\n{args.sessions} sessions, medians of {args.runs} runs (time from initialize, or 2026-07-28's server/discover, sent to its answer)\n")
    table = setup_table(results, args, argv)
    print("\n".join(figures.markdown(table)))
    if args.record:
        figures.record("setup", table)
    return 0


LABELS = {"everything": "server-everything", "time": "mcp-server-time"}


def setup_table(results: dict[tuple[str, str, str, str], list[dict[str, Any]]], args: argparse.Namespace, argv: list[str] | None) -> figures.Table:
    rows = []
    for (name, version, pattern, mode), runs in results.items():
        p50, p99, hits = (statistics.median(r[key] for r in runs) for key in ("p50_ms", "p99_ms", "warm_hits"))
        warm = [r for r in runs if "warm_p99_ms" in r]
        their = [f"{statistics.median(r[key] for r in warm):,.1f} ms" if warm else "-" for key in ("warm_p50_ms", "warm_p99_ms")]
        what = {"sequential": "one after another", "concurrent": "all at once", "paced": f"one every {args.gap:g} s"}[pattern]
        processes = "cold" if mode == "cold" else f"`pool.{mode}`"
        rows.append([LABELS[name], version, f"{args.sessions} {what}", processes, f"{p50:,.1f} ms", f"{p99:,.1f} ms", f"{hits:g} of {args.sessions}", *their])
    return figures.Table(
        title="Session setup, cold and warm",
        command=" ".join(["python", "-m", "bench.setup_time", *(sys.argv[1:] if argv is None else argv)]),
        about=(f"per-session mode over Streamable HTTP, medians of {args.runs} run(s); the time from a session's `initialize` sent "
               "to its answer, a 2026-07-28 client's first request, `server/discover`, standing for it; 2 cores shared with other work"),  # fmt: skip
        columns=["server", "version", "sessions", "processes", "p50", "p99", "given a warm process", "their p50", "their p99"],
        rows=rows,
    )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
