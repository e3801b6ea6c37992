"""Hand-made faults in the modules of bridge/: does any test catch each?

Each fault is a textual patch (one exact, unique snippet replaced) applied alone
to a copy of the tree; the tests of the faulty module then run against that copy
(`-x`: the first failure kills the fault). A fault that every test passes
survived: a real bug that would ship green. Some faults are judged equivalent
(no behaviour anyone can observe changes); they are run and listed apart, with why.

    PYTHONPATH=$PWD .venv/bin/python tests/mutation/run.py [--baseline REV] [--sample] [--no-baseline] [NAME ...]

The faults live in tests/mutation/faults/, one module per layer of bridge/. At the end
the run prints, per source module, how many faults it planted, how many real ones the
tests killed, how many are judged equivalent, and the seconds it took.
`--baseline REV` runs the same faults against the tests as they were at REV (the
sources stay as they are now), for a before/after count. NAMEs pick faults by name
prefix or by module path prefix (`bridge/core/mux/`). `--sample` runs the fixed sample
CI runs (tests/release/test_mutation_faults.py). Not collected by pytest (its name does not start with `test_`).
A fault whose snippet no longer occurs exactly once stops the run: mend it to
express the same fault against the code as it is (or drop it, saying why).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600.0  # per fault: a fault that hangs the tests counts as killed, and says so

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import FAULTS, TESTS  # noqa: E402  (the package beside this script)
from faults.fault import Fault  # noqa: E402


def copy_tree(dest: Path, baseline: str | None) -> None:
    """The tracked files as they are now (tests as at `baseline`, if given), plus the node packages."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    if baseline is not None:
        shutil.rmtree(dest / "tests")
        archive = subprocess.run(["git", "archive", baseline, "tests"], cwd=ROOT, check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
    modules = ROOT / "tests" / "node" / "node_modules"
    if modules.exists():
        (dest / "tests" / "node").mkdir(parents=True, exist_ok=True)
        (dest / "tests" / "node" / "node_modules").symlink_to(modules.resolve())


def run_tests(tree: Path, files: tuple[str, ...]) -> tuple[str, str]:
    """'passed', 'failed' or 'timeout', and the first failing test's line (or why nothing ran)."""
    present = [f for f in files if (tree / f.split("::")[0]).exists()]  # a file, or a test in one
    if not present:
        return "passed", "no tests"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", "--hypothesis-seed=0", *present]
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return "timeout", f"over {TIMEOUT:.0f}s"
    finally:
        shutil.rmtree(tree / ".hypothesis", ignore_errors=True)  # no example replayed from another fault
    if done.returncode == 0:
        return "passed", ""
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if done.returncode != 1 or not failed:
        return "failed", f"pytest exit {done.returncode}: {done.stdout.strip().splitlines()[-1:] or done.stderr[-200:]}"
    return "failed", failed[0][:160]


def sample(faults: list[Fault]) -> list[Fault]:
    """What CI runs: per module whose tests are all unit tests, its first real fault. A fixed
    choice, so that a run's outcome changes only with the code and the tests."""
    picked: dict[str, Fault] = {}
    for fault in faults:
        if not fault.equivalent and fault.module not in picked and all(f.startswith("tests/unit/") for f in TESTS[fault.module]):
            picked[fault.module] = fault
    return list(picked.values())


def figures(faults: list[Fault], outcomes: dict[str, tuple[str, float]]) -> list[str]:
    """Per module: faults, real ones killed, equivalent ones, survivors, seconds."""
    lines = [f"{'module':<40} {'faults':>6} {'killed':>7} {'equiv.':>6} {'survived':>8} {'seconds':>8}"]
    for module in sorted({f.module for f in faults}):
        mine = [f for f in faults if f.module == module]
        real = [f for f in mine if not f.equivalent]
        killed = sum(1 for f in real if outcomes[f.name][0] != "survived")
        survived = len(real) - killed
        seconds = sum(outcomes[f.name][1] for f in mine)
        lines.append(f"{module:<40} {len(mine):>6} {killed:>4}/{len(real):<2} {len(mine) - len(real):>6} {survived:>8} {seconds:>8.0f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", metavar="REV", help="run the tests as they were at this git revision")
    parser.add_argument("--sample", action="store_true", help="only the fixed sample CI runs (see `sample`)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of each test set on the unchanged tree (when the whole suite has just passed)")
    parser.add_argument("names", nargs="*", help="only the faults whose name starts with one of these, or that patch a module under one of these paths")
    args = parser.parse_args()
    faults = [f for f in FAULTS if not args.names or f.name.startswith(tuple(args.names)) or f.module.startswith(tuple(args.names))]
    if args.sample:
        faults = sample(faults)
    started_run = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree, args.baseline)
        for files in [] if args.no_baseline else sorted({TESTS[f.module] for f in faults}):  # once per set of test files
            outcome, detail = run_tests(tree, files)
            if outcome != "passed":
                print(f"the unchanged tree fails {', '.join(files)}: {detail}", file=sys.stderr)
                return 2
        outcomes: dict[str, tuple[str, float]] = {}
        for fault in faults:
            path = tree / fault.module
            original = path.read_text()
            if original.count(fault.old) != 1:
                print(f"{fault.name}: its snippet occurs {original.count(fault.old)} times in {fault.module}", file=sys.stderr)
                return 2
            path.write_text(original.replace(fault.old, fault.new))
            started = time.monotonic()
            try:
                outcome, detail = run_tests(tree, TESTS[fault.module])
            finally:
                path.write_text(original)
            verdict = "survived" if outcome == "passed" else "killed" if outcome == "failed" else "killed (timeout)"
            outcomes[fault.name] = verdict, time.monotonic() - started
            print(f"{verdict:<16} {fault.name:<36} {outcomes[fault.name][1]:5.1f}s  {detail}", flush=True)
    survivors = [f for f in faults if outcomes[f.name][0] == "survived"]
    equivalent = [f for f in survivors if f.equivalent]
    real = [f for f in faults if not f.equivalent]
    print(f"\n{len(faults) - len(survivors)} of {len(faults)} faults killed; {len(real) - (len(survivors) - len(equivalent))} of {len(real)} real faults killed", end="")
    print(f" in {time.monotonic() - started_run:.0f}s\n")
    print("\n".join(figures(faults, outcomes)))
    for fault in survivors:
        print(f"survivor {fault.name} ({fault.module})" + (f": judged equivalent, {fault.equivalent}" if fault.equivalent else ""))
    return 1 if len(survivors) > len(equivalent) else 0


if __name__ == "__main__":
    sys.exit(main())
