"""The mutation check (tests/mutation/run.py, not run by CI: it takes minutes) stays true to
the code: each of its hand-made faults still names text that occurs exactly once in its
module, so a change to the code that moves the text shows here, not months later."""

from __future__ import annotations

import importlib.util
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
