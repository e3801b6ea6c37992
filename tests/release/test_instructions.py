"""Instructions per call on each transport against the committed baselines
(bench/baselines.json): a change that adds more than 2% on any transport fails, naming the
numbers. Counted with callgrind (`python -m bench.instructions`), which gives the same count
for the same code to within about 0.2%, however busy the machine is; timings would not.

A count depends on the interpreter and the libraries on the per-call path, so the check
runs where they are the versions the baselines were taken with (recorded beside them) and
skips elsewhere, saying which differ. Needs valgrind (.ci/run installs it). And
bench/RESULTS.md is what the recorded figures render.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import shutil
import subprocess

import pytest
from support.daemon import PY, ROOT

BASELINES = ROOT / "bench" / "baselines.json"
MARGIN = 0.02


def _environment() -> dict[str, str]:
    recorded = json.loads(BASELINES.read_text())["environment"]
    return {name: platform.python_version() if name == "python" else importlib.metadata.version(name) for name in recorded}


def test_instructions_per_call_stay_within_two_percent_of_the_baselines() -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        pytest.skip("needs valgrind (Debian package valgrind)")
    baselines = json.loads(BASELINES.read_text())
    differ = {name: (have, baselines["environment"][name]) for name, have in _environment().items() if have != baselines["environment"][name]}
    if differ:
        pytest.skip(f"the baselines were taken with other versions (here, baseline): {differ}; re-measure with {baselines['command']}")
    done = subprocess.run(
        [PY, "-m", "bench.instructions", "--calls", str(baselines["calls"]), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    counts = json.loads(done.stdout.splitlines()[-1])
    over = {
        transport: f"{counts[transport]:,} against {baseline:,} ({counts[transport] / baseline - 1:+.2%})"
        for transport, baseline in baselines["instructions_per_call"].items()
        if counts[transport] > baseline * (1 + MARGIN)
    }
    assert not over, f"instructions per call rose more than {MARGIN:.0%}: {over}; if the rise is meant, say why and update {BASELINES.name}"


def test_results_md_is_what_the_recorded_figures_render() -> None:
    """bench/RESULTS.md is generated (`python -m bench.figures`) from the tables the
    benchmarks record (`--record`): edited by hand, or left behind a new figure, it fails."""
    done = subprocess.run([PY, "-m", "bench.figures", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
