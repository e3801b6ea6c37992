"""The package type-checks under `mypy --strict` (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess

import pytest
from support.daemon import PY, ROOT

pytest.importorskip("mypy", reason="mypy comes with the test extra")


def test_bridge_is_clean_under_mypy_strict() -> None:
    done = subprocess.run([PY, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
