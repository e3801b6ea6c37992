"""Confinement's rules without a process (bridge/process/confine.py): which limit ended a
process, and what a sandbox's private /tmp hides."""

from __future__ import annotations

from bridge.config.schema import Rlimits, Sandbox, Server
from bridge.process import confine

MiB = 1024 * 1024


def test_which_limit_ended_a_process() -> None:
    limits = Rlimits(memory=256 * MiB, cpu_time=1, processes=20, open_files=64)
    assert confine.exit_cause(-9, limits, 1, []) == confine.Cause("memory", True)
    assert confine.exit_cause(-24, limits, 0, []) == confine.Cause("cpu_time", True)
    said = "BlockingIOError: [Errno 11] Resource temporarily unavailable"
    assert confine.exit_cause(1, limits, 0, ["Traceback", said]) == confine.Cause("processes", False, said)
    assert confine.exit_cause(1, Rlimits(cpu_time=1), 0, ["Traceback", said]) is None  # no process limit: not it
    files = "OSError: [Errno 24] Too many open files"
    assert confine.exit_cause(1, limits, 0, [files]) == confine.Cause("open_files", False, files)
    assert confine.exit_cause(3, limits, 0, ["crashed"]) is None
    assert confine.Cause("processes", False).likely() == "its process limit likely stopped it"


def test_an_oom_kill_is_blamed_on_the_memory_limit_only_when_there_is_one() -> None:
    """The kernel's OOM killer also ends processes with no memory limit of their own (the
    host, or a container, ran out): that is not `rlimits.memory` stopping it."""
    assert confine.exit_cause(-9, Rlimits(memory=256 * MiB), 1, []) == confine.Cause("memory", True)
    assert confine.exit_cause(-9, Rlimits(cpu_time=1, processes=20, open_files=64), 1, []) is None
    assert confine.exit_cause(-9, Rlimits(), 2, []) is None
    # With no memory limit, what else points at a limit still counts.
    assert confine.exit_cause(-24, Rlimits(cpu_time=1), 1, []) == confine.Cause("cpu_time", True)


def test_under_a_path_means_inside_it_not_sharing_a_prefix() -> None:
    """What the sandbox's private /tmp hides: a path under /tmp, and not under a writable path;
    "under" by path components, so /tmpfoo is not under /tmp, nor /tmp/ab under /tmp/a."""
    within = confine._within
    for path, folder in [("/tmp", "/tmp"), ("/tmp/x", "/tmp"), ("/tmp/a/b", "/tmp/a/"), ("/srv/a/b", "/srv/a"), ("/x", "/"), ("/tmp/./x", "/tmp")]:
        assert within(path, folder), (path, folder)
    for path, folder in [("/tmpfoo", "/tmp"), ("/tmpfoo/x", "/tmp"), ("/srv/ab", "/srv/a"), ("/srv/ab/c", "/srv/a/"), ("/tmp/../etc", "/tmp"), ("/", "/tmp")]:
        assert not within(path, folder), (path, folder)

    def hidden(command: str, cwd: str | None = None, writable: tuple[str, ...] = ()) -> list[tuple[str, str]]:
        sandbox = Sandbox(writable=writable)
        return confine._under_private_tmp(Server(command=command, cwd=cwd, sandbox=sandbox), sandbox)

    assert hidden("/tmpfoo/server", "/tmp-data") == []
    assert hidden("/tmp/x/server", "/tmp") == [("command", "/tmp/x/server"), ("cwd", "/tmp")]
    assert hidden("/tmp/ab/server", writable=("/tmp/a",)) == [("command", "/tmp/ab/server")]  # not under /tmp/a
    assert hidden("/tmp/a/server", "/tmp/a", writable=("/tmp/a/",)) == []
