"""Memory cgroups (v2) for server processes: one group per process, under the daemon's own.

Where the cgroup v2 hierarchy offers the memory controller to the daemon's own group and
the daemon may write that group, each server process with `rlimits.memory` runs in a
group of its own: `memory.max` is the limit, `memory.swap.max` 0 (else it would swap
instead of stopping), `memory.oom.group` 1 (an OOM kill ends the whole server, not one
of its children at random). The child joins between fork and exec, so everything it
runs is counted; after it exits, `memory.events` says whether the OOM killer ended it,
and the group is emptied (`cgroup.kill`) and removed.

cgroup v2 lets a group that holds processes give no controller to groups below it (the
"no internal processes" rule; the root group is exempt). So when the daemon is not in
the root group it first moves itself into a leaf, `LEAF`, beside the servers' groups:
what systemd asks of a service with `Delegate=yes`. Where any of this is not possible
(no cgroup v2, a v1/v2 hybrid whose memory controller is in v1, a group the daemon may
not write, other processes sharing its group), `memory()` says why, and the limit is
the address space (RLIMIT_AS) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"
OWN_CGROUP = "/proc/self/cgroup"
LEAF = "mcp-bridge"  # where the daemon moves itself when its group is not the root
REMOVE_TRIES, REMOVE_PAUSE_S = 40, 0.05  # a killed group empties within milliseconds
_names = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Probe:
    """Whether per-process memory groups can go under the daemon's cgroup v2 group."""

    group: Path | None  # the daemon's own group, when the memory controller is offered to it
    root: bool = False  # it is the hierarchy's root (exempt from "no internal processes")
    why_not: str = ""


def detect(mountinfo: str = MOUNTINFO, own_cgroup: str = OWN_CGROUP, prefix: str = "") -> Probe:
    """Read-only: where the groups would go, or why they cannot (`prefix`: a fake root, for tests)."""
    try:
        mounts = Path(mountinfo).read_text()
        membership = Path(own_cgroup).read_text()
    except OSError as exc:
        return Probe(None, why_not=f"cannot read {exc.filename}: {exc.strerror}")
    mount = next((line.split()[4] for line in mounts.splitlines() if line.partition(" - ")[2].startswith("cgroup2 ")), None)
    if mount is None:
        return Probe(None, why_not="no cgroup v2 hierarchy is mounted")
    own = next((line[3:] for line in membership.splitlines() if line.startswith("0::")), None)
    if own is None:
        return Probe(None, why_not="the daemon is in no cgroup v2 group")
    group = Path(prefix + mount) / own.lstrip("/")
    try:
        offered = (group / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return Probe(None, why_not=f"cannot read {group}/cgroup.controllers: {exc.strerror}")
    if "memory" not in offered:
        return Probe(
            None,
            why_not=f"the cgroup v2 hierarchy at {mount} offers no memory controller to {own} "
            f"(cgroup.controllers: {' '.join(offered) or 'none'}; on a v1/v2 hybrid host it is in v1)",
        )
    if not os.access(group, os.W_OK):
        return Probe(None, why_not=f"the daemon may not write its cgroup {group}")
    return Probe(group, root=own in ("", "/"))


class Groups:
    """Where the servers' memory groups are made: the daemon's own cgroup v2 group."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent

    def create(self, server: str, limit: int) -> MemoryGroup:
        """A new group for one process of `server`, limited to `limit` bytes; OSError if not."""
        path = self.parent / f"{server}.{os.getpid()}.{next(_names)}"
        path.mkdir()
        try:
            (path / "memory.max").write_text(str(limit))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (path / name).exists():  # without swap accounting there is no memory.swap.max
                    (path / name).write_text(value)
            fd = os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise
        return MemoryGroup(path, fd)


class MemoryGroup:
    """One server process's memory group.

    `join_fd` is open for writing on its `cgroup.procs`: the child writes `0` (itself)
    there between fork and exec. It was opened by the daemon, and the kernel (5.16 and
    later) checks the opener's rights, so this works after the child has taken on a
    `user` the group does not belong to."""

    def __init__(self, path: Path, join_fd: int) -> None:
        self.path = path
        self.join_fd: int | None = join_fd

    def spawned(self) -> None:
        """The child has been started (or failed to be): the daemon's copy of the fd goes."""
        if self.join_fd is not None:
            os.close(self.join_fd)
            self.join_fd = None

    def oom_kills(self) -> int:
        """How many processes the OOM killer ended in this group for its limit."""
        with contextlib.suppress(OSError):
            for line in (self.path / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    async def remove(self) -> None:
        """Kill whatever is left in the group, then remove it (once it is empty)."""
        self.spawned()
        kill = self.path / "cgroup.kill"  # Linux 5.14 and later
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
        for _ in range(REMOVE_TRIES):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
            await asyncio.sleep(REMOVE_PAUSE_S)
        raise OSError(errno.EBUSY, f"memory cgroup {self.path} still holds processes")


def prepare(probe: Probe) -> Groups | str:
    """Make the daemon's group ready to hold the servers' groups: the Groups, or why not."""
    group = probe.group
    if group is None:
        return probe.why_not
    moved = False
    try:
        if "memory" not in (group / "cgroup.subtree_control").read_text().split():
            if not probe.root:
                (group / LEAF).mkdir(exist_ok=True)
                (group / LEAF / "cgroup.procs").write_text(str(os.getpid()))
                moved = True
            (group / "cgroup.subtree_control").write_text("+memory")
    except OSError as exc:
        if moved:  # back where it was: it moved only to make room for the servers' groups
            with contextlib.suppress(OSError):
                (group / "cgroup.procs").write_text(str(os.getpid()))
        if exc.errno == errno.EBUSY:
            return f"other processes share the daemon's cgroup {group}, so it cannot hold the servers' groups"
        return f"cannot set up memory cgroups under {group}: {exc.strerror}"
    return Groups(group)


@functools.cache
def memory() -> Groups | str:
    """The daemon's memory groups, set up on first use (once), or why there are none."""
    return prepare(detect())
