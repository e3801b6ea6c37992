"""The benchmark's 2026-07-28 client (`bench/load.py --mode stateless`) on workloads a-f, scaled down.

Against bench/modern_server.py, a real 2026-07-28 server on the official Python
SDK, the client must get every answer right: that proves the workloads before
any bridge serves the revision. Against the bridge serving bench/server.py (a
legacy stdio server) the same must hold; that test skips while the bridge
answers `server/discover` as a 2025-only endpoint does.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import pytest
from support.daemon import PY, ROOT
from support.eras import serves_stateless

BENCH = ROOT / "bench"
MIB = 1024 * 1024
TIMEOUT_S = 120
# Workloads a-f of bench/run.py with fewer calls: (name, sessions, calls, in flight, in bytes, out bytes).
SHAPES = [
    ("a", 1, 30, 1, 0, 0),
    ("b", 1, 200, 32, 0, 0),
    ("c", 10, 10, 1, 0, 0),
    ("d", 40, 2, 1, 0, 0),
    ("e", 1, 3, 1, MIB, 0),
    ("f", 1, 3, 1, 0, MIB),
]


def _sdk_serves_modern() -> bool:
    major, minor = (int(x) for x in re.findall(r"\d+", version("mcp"))[:2])
    return (major, minor) >= (2, 3)


async def run_load(url: str, sessions: int, calls: int, inflight: int, in_bytes: int, out_bytes: int) -> dict[str, Any]:
    args = ["--mode", "stateless", "--url", url, "-n", str(sessions), "-k", str(calls), "-c", str(inflight)]
    args += ["--in-bytes", str(in_bytes), "--out-bytes", str(out_bytes), "--call-timeout", "30", "--run-timeout", str(TIMEOUT_S)]
    proc = await asyncio.create_subprocess_exec(
        PY, str(BENCH / "load.py"), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(TIMEOUT_S + 30):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert out, f"load.py printed no report (exit {proc.returncode}): {err.decode()[-2000:]}"
    report: dict[str, Any] = json.loads(out)
    return report


async def assert_workloads(url: str) -> None:
    wrong = []
    for name, *shape in SHAPES:
        report = await run_load(url, *shape)
        if (report["ok"], report["errors"], report["misrouted"]) != (report["requests"], 0, 0):
            wrong.append(f"{name}: {report['ok']}/{report['requests']} right, {report['errors']} errors, "
                         f"{report['misrouted']} misrouted, e.g. {report['error_samples'][:2]}")  # fmt: skip
    assert not wrong, "\n".join(wrong)


@asynccontextmanager
async def modern_server() -> AsyncIterator[str]:
    """bench/modern_server.py on a free loopback port; yields its endpoint url."""
    proc = await asyncio.create_subprocess_exec(
        PY, str(BENCH / "modern_server.py"), "--port", "0", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            line = await proc.stdout.readline()
        match = re.match(rb"listening (\d+)", line)
        assert match, f"bench/modern_server.py did not start: {line!r}"
        yield f"http://127.0.0.1:{int(match.group(1))}/mcp"
    finally:
        if proc.returncode is None:
            proc.terminate()
            async with asyncio.timeout(10):
                await proc.wait()


@pytest.mark.skipif(not _sdk_serves_modern(), reason=f"mcp {version('mcp')} does not serve 2026-07-28 (needs 2.3)")
async def test_stateless_workloads_against_the_python_sdk() -> None:
    async with modern_server() as url:
        await assert_workloads(url)


async def test_stateless_workloads_against_the_bridge(bridge: Any) -> None:
    server = {"command": PY, "args": ["-S", str(BENCH / "server.py")], "mode": "shared"}
    async with bridge({"servers": {"bench": server}, "limits": {"max_message_bytes": "8MiB"}}) as b:
        url = b.url("bench", "mcp")
        if reason := await serves_stateless(url):
            pytest.skip(reason)
        await assert_workloads(url)
