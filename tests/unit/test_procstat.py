"""What a process uses, read from /proc/<pid>/stat (bridge/process/procstat.py), checked
against what the kernel says of this very process in other ways."""

from __future__ import annotations

import ctypes
import os
import resource
import sys
import time

import pytest

from bridge.process import procstat

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

_PR_SET_NAME, _PR_GET_NAME = 15, 16


def _statm_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_resident_memory_is_in_bytes() -> None:
    usage = procstat.usage(os.getpid())
    assert usage is not None
    assert abs(usage.rss_bytes - _statm_rss()) < 16 << 20  # the same figure, read a moment apart
    assert usage.rss_bytes > 1 << 20  # bytes, not pages


def test_cpu_time_is_user_plus_system() -> None:
    deadline = time.monotonic() + 10
    while resource.getrusage(resource.RUSAGE_SELF).ru_stime < 0.2 and time.monotonic() < deadline:
        for _ in range(2000):
            os.stat("/")  # system time: one syscall each
    usage = procstat.usage(os.getpid())
    own = resource.getrusage(resource.RUSAGE_SELF)
    assert usage is not None
    assert own.ru_stime >= 0.2
    assert abs(usage.cpu_seconds - (own.ru_utime + own.ru_stime)) < 0.05  # clock ticks, read a moment apart


def test_a_command_name_with_a_parenthesis_and_spaces_is_read_past() -> None:
    """The command name is free text: the fields begin after the last `)`."""
    libc = ctypes.CDLL(None, use_errno=True)
    old = ctypes.create_string_buffer(16)
    assert libc.prctl(_PR_GET_NAME, old, 0, 0, 0) == 0
    try:
        assert libc.prctl(_PR_SET_NAME, b"x) 1 2 3 4 5", 0, 0, 0) == 0
        usage = procstat.usage(os.getpid())
    finally:
        libc.prctl(_PR_SET_NAME, old.value, 0, 0, 0)
    assert usage is not None
    assert abs(usage.rss_bytes - _statm_rss()) < 16 << 20
    with open("/proc/self/stat", "rb") as f:
        started = int(f.read().rsplit(b")", 1)[1].split()[19])
    assert usage.started == started


def test_no_such_process_is_none() -> None:
    assert procstat.usage(2**22 + 12345) is None
