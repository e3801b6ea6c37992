"""`tools/list` through a group of N members: how long the group's merged list takes, p50 and p99.

Starts one bridge serving bench/server.py N times (members `m0` ... `m{N-1}`, shared) as one
group, opens one Streamable HTTP session, and times `tools/list` round trips one after
another (after a warm-up), against the same on one member's own endpoint. Wall-clock times
on loopback: read them as what a client waits, not as a count to compare small changes by
(bench/instructions.py --group does that for calls).

    python -m bench.groups                     # 8 members, 500 lists
    python -m bench.groups --members 8 --lists 1000 --record
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

import aiohttp

from bench import figures
from bench import run as harness

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
WARMUP = 50


def config(path: str, members: int) -> None:
    command, args = json.dumps(harness.SERVER_CMD[0]), json.dumps(harness.SERVER_CMD[1:])
    servers = "".join(f"  m{i}: {{command: {command}, args: {args}, mode: shared}}\n" for i in range(members))
    with open(path, "w") as f:
        f.write(f"listen: {{host: 127.0.0.1, port: 0}}\nlogging: {{format: json, level: info}}\nservers:\n{servers}groups:\n  g: {{servers: ['*']}}\n")


async def timed_lists(url: str, lists: int) -> list[float]:
    """Seconds per tools/list round trip, one after another, on one new session."""
    async with aiohttp.ClientSession() as http:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}  # fmt: skip
        async with http.post(url, json=init, headers=ACCEPT) as resp:
            session = {**ACCEPT, "Mcp-Session-Id": resp.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}
            await resp.read()
        async with http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session) as resp:
            await resp.read()
        times = []
        for i in range(WARMUP + lists):
            started = time.perf_counter()
            async with http.post(url, json={"jsonrpc": "2.0", "id": i + 1, "method": "tools/list"}, headers=session) as resp:
                body = await resp.read()
            if b'"tools"' not in body:
                raise RuntimeError(f"tools/list failed: {body[:200]!r}")
            if i >= WARMUP:
                times.append(time.perf_counter() - started)
        return times


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--lists", type=int, default=500)
    parser.add_argument("--record", action="store_true", help="also replace the groups-list table of bench/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mcp-bridge-groups-") as workdir:
        cfg, log = os.path.join(workdir, "bridge.yaml"), os.path.join(workdir, "bridge.log")
        config(cfg, args.members)
        proc = harness.spawn([sys.executable, "-m", "bridge", "--config", cfg, "--port", "0"], log, cwd=harness.ROOT)
        try:
            port = harness.bridge_port(proc, log)
            base = f"http://127.0.0.1:{port}"
            rows = []
            for what, path in (("one member's own endpoint", "/servers/m0/mcp"), (f"a group of {args.members}", "/groups/g/mcp")):
                times = asyncio.run(timed_lists(base + path, args.lists))
                p50, p99 = percentile(times, 50) * 1000, percentile(times, 99) * 1000
                print(f"  tools/list, {what:<28} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms")
                rows.append([what, f"{p50:.2f} ms", f"{p99:.2f} ms"])
        finally:
            harness.Target("bridge", proc).stop()
    if args.record:
        figures.record("groups-list", figures.Table(
            title="Groups: tools/list",
            command=f"python -m bench.groups --members {args.members} --lists {args.lists} --record",
            about=(f"wall clock on loopback, one Streamable HTTP session, {args.lists:,} `tools/list` round trips one after another "
                   f"after {WARMUP} to warm up; bench/server.py as every member"),
            columns=["listed by", "p50", "p99"],
            rows=rows,
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
