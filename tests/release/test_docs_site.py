"""The docs as a site: `mkdocs build --strict` (MkDocs, Material theme) builds docs/ with every
link and anchor checked, and fails on a broken one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.daemon import ROOT


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_with_every_link_and_anchor_checked(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the missing page](reference/nowhere.md) and [a missing anchor](architecture.md#no-such-section).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "reference/nowhere.md" in done.stderr and "no-such-section" in done.stderr
