"""The code's shape, checked: imports only go down the layers (import-linter's contracts in
pyproject.toml), the lint rules hold ([tool.ruff]), and a planted upward import is caught."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = BIN / name
    if not found.exists():
        pytest.skip(f"{name} comes with the test extra")
    return str(found)


def test_imports_keep_the_layer_contracts() -> None:
    done = subprocess.run([_tool("lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr


def test_ruff_finds_nothing() -> None:
    done = subprocess.run([_tool("ruff"), "check", "bridge", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("bridge/protocol/mcp.py", "from bridge.config import schema", "Layers"),
        ("bridge/core/mux/views.py", "from bridge.core.mux import shared", "tables are below the mux"),
        ("bridge/gateway/upstream.py", "from bridge.gateway import placement", "placements over its processes"),
        ("bridge/http/fastpath.py", "from bridge.http.endpoints import streamable_2025", "given their dispatcher"),
        ("bridge/http/endpoints/sse_2024.py", "from bridge.http.endpoints import stateless_2026", "know nothing of each other"),
        ("bridge/core/translator.py", "import asyncio", "do no IO"),
    ],
)
def test_a_planted_import_breaks_its_contract(tmp_path: Path, module: str, planted: str, contract: str) -> None:
    """The contracts are not vacuous: each fails on the import it forbids, in a copy of the tree."""
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "bridge", copy / "bridge")
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / module
    target.write_text(target.read_text() + f"\n{planted}  # planted\n")
    done = subprocess.run([_tool("lint-imports")], cwd=copy, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(copy)})
    assert done.returncode != 0, done.stdout[-2000:]
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and contract in broken[0], done.stdout[-2000:]


def test_the_docs_module_map_is_current() -> None:
    """docs/architecture.md lists every module, by layer, and shows the mux's state tables, as docs/generate.py reads them off the code."""
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
