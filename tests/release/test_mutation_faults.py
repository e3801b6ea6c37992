"""The mutation check (tests/mutation/run.py) stays true to the code, and its sample holds.

The whole run takes longer than CI should, so CI runs a fixed sample of it (one real fault per
module whose tests are unit tests, about two minutes) and checks that every fault still
names text that occurs exactly once in its module: a change to the code that moves the
text shows here, not months later."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from support.daemon import ROOT


def test_every_fault_still_names_text_that_occurs_once() -> None:
    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "tests" / "mutation" / "run.py")
    assert spec is not None and spec.loader is not None
    run = importlib.util.module_from_spec(spec)
    sys.modules["mutation_run"] = run  # its dataclasses look their module up
    try:
        spec.loader.exec_module(run)
        stale = {f.name: (ROOT / f.module).read_text().count(f.old) for f in run.FAULTS if (ROOT / f.module).read_text().count(f.old) != 1}
    finally:
        del sys.modules["mutation_run"]
    assert len(run.FAULTS) > 150 and not stale, f"faults whose snippet no longer occurs exactly once: {stale}"


def test_the_sample_ci_runs_kills_every_fault() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "tests/mutation/run.py", "--sample"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "real faults killed" in done.stdout
