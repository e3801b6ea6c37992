"""What a process uses, read from /proc/<pid>/stat (Linux): resident memory and CPU time.

Read when asked (a scrape of /metrics, a GET of /status), never on a timer.
One read per process: `stat` carries both the CPU times and the resident set
(the same figure as the second field of `statm`).
"""

from __future__ import annotations

import os
from typing import NamedTuple

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
# Fields of /proc/<pid>/stat after the command name, which ends at the last ")";
# numbered from 0 at the state (field 3 of proc(5)).
_UTIME, _STIME, _STARTTIME, _RSS = 11, 12, 19, 21


class Usage(NamedTuple):
    rss_bytes: int
    cpu_seconds: float  # user + system
    started: int  # clock ticks after boot: with the pid, names one process for good


def usage(pid: int) -> Usage | None:
    """None when there is no such process (any more) or /proc cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return Usage(
            int(fields[_RSS]) * _PAGE,
            (int(fields[_UTIME]) + int(fields[_STIME])) / _TICKS,
            int(fields[_STARTTIME]),
        )
    except (IndexError, ValueError):
        return None
