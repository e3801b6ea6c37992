"""Fixtures shared by every tier; the helpers they use live in tests/support (importable:
tests/ is on the path, as the directory of this file)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.daemon import Bridge, run_bridge


@pytest.fixture
def bridge(tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[Bridge]]:
    """`async with bridge({"servers": {...}}) as b:` runs a daemon for the test."""

    def start(config: dict[str, Any] | Path, *args: str, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Bridge]:
        return run_bridge(tmp_path, config, *args, **kwargs)

    return start
