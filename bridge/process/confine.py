"""What confines a server process beyond its rlimits: the user it runs as, its memory
limit's mechanism, its bubblewrap sandbox; whether this host can do each (checked once,
at start and on reload, naming the server and the reason); and which limit most likely
ended a process that exited under them.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.config.schema import Config, Rlimits, Sandbox, Server
from bridge.process import cgroups

BWRAP = "bwrap"
PROBE_TIMEOUT_S = 5.0
# The variables that describe the daemon's own user: a server run as another user gets
# its own HOME, USER and LOGNAME, and none of these (they point into the daemon's home).
OWN_USER_ENV = ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR")
# What a process writes to stderr when a limit stops it, by limit: the kernel says which
# limit ended a process only for CPU time (SIGXCPU) and the memory cgroup (memory.events).
SIGNS = {
    "memory": ("MemoryError", "out of memory", "Cannot allocate memory", "bad_alloc", "Allocation failed", "ENOMEM"),
    "processes": ("Resource temporarily unavailable", "EAGAIN", "can't start new thread", "fork failed", "Cannot fork"),
    "open_files": ("Too many open files", "EMFILE"),
}
LIMIT_NAMES = {"memory": "memory", "cpu_time": "CPU time", "processes": "process", "open_files": "open files"}


@dataclass(frozen=True, slots=True)
class Identity:
    """The user and groups a server runs as."""

    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups: the user's own, never the daemon's
    name: str | None  # from the user database; None for a number it does not list
    home: str | None

    def describe(self) -> str:
        return f"{self.name or self.uid} (uid {self.uid}, gid {self.gid})"


class NoIdentity(LookupError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key  # user or group


def identity(server: Server) -> Identity | None:
    """Who `server` runs as (None: as the daemon); NoIdentity says which key is wrong."""
    if server.user is None and server.group is None:
        return None
    entry = None
    if server.user is None:
        uid = os.geteuid()
        entry = _user_entry(uid)
    elif isinstance(server.user, int) or server.user.isdigit():
        uid = int(server.user)
        entry = _user_entry(uid)
    else:
        try:
            entry = pwd.getpwnam(server.user)
        except KeyError:
            raise NoIdentity("user", f"no user named {server.user!r} on this host") from None
        uid = entry.pw_uid
    if server.group is None:
        if entry is None:
            raise NoIdentity("group", f"required: user {uid} has no entry in the user database to take a group from")
        gid = entry.pw_gid
    elif isinstance(server.group, int) or server.group.isdigit():
        gid = int(server.group)
    else:
        try:
            gid = grp.getgrnam(server.group).gr_gid
        except KeyError:
            raise NoIdentity("group", f"no group named {server.group!r} on this host") from None
    # Only `group` given: the daemon's user with that one group, none of the daemon's others.
    groups = os.getgrouplist(entry.pw_name, gid) if entry is not None and server.user is not None else [gid]
    return Identity(uid, gid, tuple(groups), entry.pw_name if entry else None, entry.pw_dir if entry else None)


def _user_entry(uid: int) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        return None


def user_env(env: dict[str, str], who: Identity, own: Mapping[str, str]) -> None:
    """Make `env` that of a server run as `who`: its HOME (or /), USER and LOGNAME, none of
    the daemon user's OWN_USER_ENV; what the server's `own` env sets stays."""
    name = who.name or str(who.uid)
    for key, value in (("HOME", who.home or "/"), ("USER", name), ("LOGNAME", name)):
        if key not in own:
            env[key] = value
    for key in OWN_USER_ENV:
        if key not in own:
            env.pop(key, None)


def working_dir(server: Server, who: Identity | None) -> str | None:
    """`cwd`; for a server run as another user and no `cwd`, its home (or /), not the daemon's."""
    if server.cwd is not None or who is None:
        return server.cwd
    return who.home if who.home is not None and os.path.isdir(who.home) else "/"


def bwrap_argv(bwrap: str, sandbox: Sandbox, command: str, args: Sequence[str]) -> list[str]:
    """`command` under bubblewrap: the host's root read-only, fresh /dev, /proc and /tmp,
    the writable paths bound read-write (after /tmp, so one under /tmp shows through), its
    own process, IPC and host-name namespaces, no network unless allowed, no capabilities
    (a root server could otherwise remount the root read-write), and killed with its parent."""
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for path in sandbox.writable:
        argv += ["--bind", path, path]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL", "--die-with-parent", "--new-session"]
    if not sandbox.network:
        argv.append("--unshare-net")
    return [*argv, "--", command, *args]


_probed: dict[tuple[object, ...], str | None] = {}


def probe_sandbox(server: Server, who: Identity | None) -> str | None:
    """Why this server's sandbox cannot run here (None: it can): bubblewrap runs `true` in
    it, as the server's user, once per sandbox and user for the daemon's life."""
    assert server.sandbox is not None
    bwrap = shutil.which(BWRAP)
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed or not on the daemon's PATH (Debian package bubblewrap)"
    argv = bwrap_argv(bwrap, server.sandbox, "true", ())
    key = (tuple(argv), who)
    if key not in _probed:
        _probed[key] = _run_probe(argv, who)
    return _probed[key]


def _run_probe(argv: list[str], who: Identity | None) -> str | None:
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env={"PATH": os.defpath},
            timeout=PROBE_TIMEOUT_S,
            **spawn_as(who),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not run: {exc}"
    if done.returncode == 0:
        return None
    said = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return f"bubblewrap cannot run here ({said[-1] if said else f'exit code {done.returncode}'})"


def spawn_as(who: Identity | None) -> dict[str, Any]:
    """subprocess's arguments to run as `who`."""
    return {} if who is None else {"user": who.uid, "group": who.gid, "extra_groups": list(who.groups)}


def host_problems(config: Config) -> list[str]:
    """What this host cannot do of what the config asks (users, sandboxes, limits the kernel
    would not apply), each naming the key: at start, every reload and with --check."""
    problems: list[str] = []
    root = os.geteuid() == 0
    for name, server in config.servers.items():
        where = f"servers.{name}"
        try:
            who = identity(server)
        except NoIdentity as exc:
            problems.append(f"{where}.{exc.key}: {exc}")
            continue
        if who is not None and not root:
            key = "user" if server.user is not None else "group"
            problems.append(
                f"{where}.{key}: running a server as another user or group needs the daemon to run as root "
                f"(it runs as uid {os.geteuid()})"
            )
            continue
        if server.rlimits.processes is not None and (who.uid if who is not None else os.geteuid()) == 0:
            problems.append(
                f"{where}.rlimits.processes: the kernel does not apply it to root, as which the server would run: set {where}.user"
            )
        if server.sandbox is not None:
            if (why := probe_sandbox(server, who)) is not None:
                problems.append(f"{where}.sandbox: {why}; the server is not run unsandboxed")
            problems += [f"{where}.{key}: {path} {_HIDDEN_IN_TMP}" for key, path in _under_private_tmp(server, server.sandbox)]
    return problems


_HIDDEN_IN_TMP = "is under /tmp, which the sandbox replaces with a private one: the server could not see it (move it, or list it in sandbox.writable)"


def _under_private_tmp(server: Server, sandbox: Sandbox) -> list[tuple[str, str]]:
    """What the server needs to start (its command, cwd, and arguments that name paths) and
    the sandbox's empty /tmp would hide: a clear refusal rather than a crash loop."""
    named = [("command", shutil.which(server.command) or server.command), ("cwd", server.cwd or "")]
    named += [(f"args[{i}]", arg) for i, arg in enumerate(server.args) if os.path.exists(arg)]
    return [
        (key, path)
        for key, path in named
        if os.path.isabs(path) and _within(path, "/tmp") and not any(_within(path, w) for w in sandbox.writable)
    ]


def _within(path: str, folder: str) -> bool:
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def memory_mechanism(detected: bool = False) -> tuple[str, str | None]:
    """How `rlimits.memory` is enforced here: (`cgroup`, None) or (`address_space`, why not a
    cgroup). With `detected`, what a daemon would find, changing nothing (for --check)."""
    if detected:
        why = cgroups.detect().why_not or None
    else:
        groups = cgroups.memory()
        why = groups if isinstance(groups, str) else None
    return ("cgroup", None) if why is None else ("address_space", why)


def describe(server: Server) -> list[str]:
    """What --check says of how a server's processes are confined."""
    lines = []
    try:
        who = identity(server)
    except NoIdentity:
        who = None
    if who is not None:
        lines.append(f"runs as {who.describe()}")
    if server.rlimits.named():
        memory = ""
        if server.rlimits.memory is not None:
            _, why = memory_mechanism(detected=True)
            memory = "; memory by a cgroup v2 memory.max" if why is None else f"; memory by RLIMIT_AS, the address space ({why})"
        lines.append(f"rlimits: {server.rlimits.named()}{memory}")
    if (sandbox := server.sandbox) is not None:
        writable = ", ".join(sandbox.writable) or "nothing"
        lines.append(f"sandboxed by bubblewrap: writable {writable}; network {'allowed' if sandbox.network else 'none'}")
    return lines


@dataclass(frozen=True, slots=True)
class Cause:
    limit: str  # a key of Rlimits
    sure: bool  # the kernel said so (SIGXCPU, an OOM kill), rather than the server's stderr
    said: str | None = None  # the stderr line that points at it

    def likely(self) -> str:
        return f"its {LIMIT_NAMES[self.limit]} limit {'stopped' if self.sure else 'likely stopped'} it"


def exit_cause(code: int, rlimits: Rlimits, oom_kills: int, stderr_tail: Sequence[str]) -> Cause | None:
    """Which limit most likely ended a process that exited with `code`, if any points at one."""
    if oom_kills and rlimits.memory is not None:
        return Cause("memory", True)
    if code == -signal.SIGXCPU and rlimits.cpu_time is not None:
        return Cause("cpu_time", True)
    for line in reversed(stderr_tail):
        for limit, signs in SIGNS.items():
            if getattr(rlimits, limit) is not None and any(sign in line for sign in signs):
                return Cause(limit, False, line)
    return None


@dataclass(frozen=True, slots=True)
class Launch:
    """How each process of one server is started: its argv (under bubblewrap when
    sandboxed), working directory, user, and the memory groups its limit goes by."""

    argv: tuple[str, ...]
    cwd: str | None
    identity: Identity | None
    memory_groups: cgroups.Groups | None


def launch(server: Server) -> Launch:
    """How `server`'s processes start; NoIdentity if its user or group is unknown (which
    host_problems has reported before a daemon gets here)."""
    who = identity(server)
    argv: Sequence[str] = (server.command, *server.args)
    if server.sandbox is not None:
        argv = bwrap_argv(shutil.which(BWRAP) or BWRAP, server.sandbox, server.command, server.args)
    groups = cgroups.memory() if server.rlimits.memory is not None else None
    return Launch(tuple(argv), working_dir(server, who), who, groups if isinstance(groups, cgroups.Groups) else None)
