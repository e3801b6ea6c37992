"""The README's quick start, run as pasted (but for the port): the shipped config serves the
demo server, and the Python snippet calls its `echo` tool through the official SDK."""

from __future__ import annotations

import asyncio

from support.daemon import PY, ROOT
from support.snippets import snippets


def quick_start() -> str:
    (first, *_) = [s for s in snippets([ROOT / "README.md"]) if s.lang == "python"]
    assert "asyncio.run(main())" in first.text and "http://127.0.0.1:8080/servers/demo/mcp" in first.text
    return first.text


async def test_the_quick_start_runs_as_pasted(bridge) -> None:
    async with bridge(ROOT / "config" / "servers.yaml") as b:
        code = quick_start().replace("http://127.0.0.1:8080", b.base)
        proc = await asyncio.create_subprocess_exec(
            PY, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert "text='hello'" in out.decode() and "is_error=False" in out.decode()
