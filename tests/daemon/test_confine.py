"""What confines a server beyond its rlimits: the memory limit (a cgroup, or the address
space), running as another user, the bubblewrap sandbox; and a server ended by a limit
named as such in its calls' errors, the log, /status and /metrics.

Real daemon, real server processes (tests/servers/faulty.py). The cgroup v2 mechanics
are also tested on a fake cgroup tree, since a host may have no usable cgroup v2 (this
one's memory controller is in cgroup v1).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import pwd
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemon import PY, ROOT, SERVERS
from support.metrics import scrape
from support.rawclient import RawSse
from test_supervision import FAST_RESTART, get_json, text_of, tool

from bridge.config.schema import Rlimits, Sandbox, Server
from bridge.process import cgroups, confine
from bridge.process.child import Child

MiB = 1024 * 1024
IS_ROOT = os.geteuid() == 0


def faulty_as(python: str, script: Path = SERVERS / "faulty.py", **extra: Any) -> dict[str, Any]:
    return {"command": python, "args": [str(script)], "restart": FAST_RESTART, **extra}


@pytest.fixture
def unhidden() -> Iterator[tuple[str, Path]]:
    """An interpreter and a copy of faulty.py (stdlib only) that a sandbox's private /tmp does
    not hide: a fresh clone, as CI makes, may live under /tmp, and the daemon refuses a
    sandboxed server whose command or script is there."""
    python = os.path.realpath(PY)  # a venv's interpreter is a link to its base one
    if python.startswith("/tmp/"):
        pytest.skip(f"the Python interpreter ({python}) lives under /tmp, which a sandbox hides")
    folder = Path(tempfile.mkdtemp(prefix="mcp-bridge-boxed-", dir="/var/tmp"))
    try:
        folder.chmod(0o755)  # for the test that runs it as nobody
        script = folder / "faulty.py"
        shutil.copyfile(SERVERS / "faulty.py", script)
        script.chmod(0o644)
        yield python, script
    finally:
        shutil.rmtree(folder)


async def limit_kills(b: Any, server: str, limit: str) -> float:
    return (await scrape(b)).count("mcp_bridge_server_limit_kills_total", server=server, limit=limit)


# ------------------------------------------------------------------ memory


async def test_a_server_that_allocates_without_bound_is_stopped_by_its_memory_limit(bridge: Any) -> None:
    config = {"servers": {"hog": faulty_as(PY, rlimits={"memory": "256MiB"}), "other": faulty_as(PY)}}
    async with bridge(config) as b, RawSse(b.url("hog")) as c, RawSse(b.url("other")) as d:
        await c.initialize()
        await d.initialize()
        pid = (await b.wait_for("server_started", where=lambda e: e["server"] == "hog"))["pid"]
        reply = await tool(c, "hog", {"mib": 4096}, request_id="hog", timeout=30)
        assert reply["error"]["code"] == -32000, reply
        message = reply["error"]["message"]
        assert "its memory limit" in message and "memory 268435456" in message, message
        event = await b.wait_for("server_exited_under_limits")
        assert event["limit"] == "memory" and event["server"] == "hog"
        # The daemon is unharmed and the other server answers; this one is started again.
        assert text_of(await tool(d, "echo", {"text": "still here"}, request_id="other")) == "still here"
        await b.wait_for("server_started", where=lambda e: e["server"] == "hog" and e["pid"] != pid)
        assert text_of(await tool(c, "echo", {"text": "back"}, request_id="back")) == "back"
        _, status = await get_json(b, "/status")
        hog = status["servers"]["hog"]
        if hog["memory_limit"]["by"] == "address_space":  # the allocation failed, the process said so and exited
            assert hog["memory_limit"]["why"] and "MemoryError" in event["said"], (hog, event)
            assert "its memory limit likely stopped it" in message
        else:  # the kernel's OOM killer ended it, and memory.events says so
            assert hog["memory_limit"] == {"by": "cgroup", "why": None} and "its memory limit stopped it" in message
        assert status["servers"]["other"]["memory_limit"] is None
        assert hog["processes"][0]["last_exit_limit"] == "memory"
        assert await limit_kills(b, "hog", "memory") == 1


async def test_check_says_how_the_memory_limit_is_enforced(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"servers:\n  m:\n    command: {PY}\n    rlimits: {{memory: 256MiB}}\n")
    out = run_check(config)
    assert out.returncode == 0, out.stderr
    mechanism, why = confine.memory_mechanism(detected=True)
    if mechanism == "cgroup":
        assert "memory by a cgroup v2 memory.max" in out.stdout
    else:
        assert f"memory by RLIMIT_AS, the address space ({why})" in out.stdout


def run_check(config: Path, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "bridge", "--config", str(config), "--port", "0", *(["--check"] if check else [])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=30,
    )


# The cgroup v2 mechanics on a fake tree: (mountinfo line's mount point, own group).
HYBRID_MOUNTS = "30 25 0:26 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n"
V2_MOUNTS = "30 25 0:26 / /sys/fs/cgroup rw,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"


def fake_tree(tmp_path: Path, mounts: str, own: str, mount: str, controllers: str) -> tuple[str, str, str]:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "mountinfo").write_text(mounts)
    (tmp_path / "cgroup").write_text(f"4:memory:/elsewhere\n0::{own}\n")
    group = Path(str(tmp_path) + mount) / own.lstrip("/")
    group.mkdir(parents=True)
    (group / "cgroup.controllers").write_text(controllers + "\n")
    (group / "cgroup.subtree_control").write_text("\n")
    (group / "cgroup.procs").write_text("1\n")
    return str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"), str(tmp_path)


def test_a_hybrid_host_with_no_v2_memory_controller_falls_back_to_the_address_space(tmp_path: Path) -> None:
    probe = cgroups.detect(*fake_tree(tmp_path, HYBRID_MOUNTS, "/", "/sys/fs/cgroup/unified", "hugetlb"))
    assert probe.group is None
    assert "offers no memory controller" in probe.why_not and "hugetlb" in probe.why_not
    assert cgroups.prepare(probe) == probe.why_not
    assert "no cgroup v2" in cgroups.detect(*fake_tree(tmp_path / "none", "", "/", "/x", "memory")).why_not


async def test_a_server_group_is_made_limited_joined_read_and_removed_on_a_v2_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open
    # cgroupfs makes a group's files with it; on a plain directory, opening cgroup.procs makes it.
    monkeypatch.setattr(os, "open", lambda path, flags, mode=0o644: real_open(path, flags | os.O_CREAT, mode))
    paths = fake_tree(tmp_path, V2_MOUNTS, "/system.slice/bridge.service", "/sys/fs/cgroup", "cpu memory pids")
    probe = cgroups.detect(*paths)
    own = tmp_path / "sys/fs/cgroup/system.slice/bridge.service"
    assert probe.group == own and not probe.root
    groups = cgroups.prepare(probe)
    assert isinstance(groups, cgroups.Groups)
    # Not the root group: the daemon moved itself into a leaf before giving memory to children.
    assert (own / cgroups.LEAF / "cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text() == "+memory"
    group = groups.create("hog", 256 * MiB)
    assert group.path.parent == own and (group.path / "memory.max").read_text() == str(256 * MiB)
    assert group.join_fd is not None
    os.write(group.join_fd, b"0")  # what the child does before exec
    group.spawned()
    assert group.join_fd is None and (group.path / "cgroup.procs").read_text() == "0"
    # `oom`: times the limit was hit; `oom_kill`: processes the OOM killer ended for it.
    (group.path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 5\noom_kill 2\noom_group_kill 1\n")
    assert group.oom_kills() == 2
    for name in ("memory.max", "memory.events", "cgroup.procs"):
        (group.path / name).unlink()  # cgroupfs removes a group with its files; a plain directory does not
    await group.remove()
    assert not group.path.exists()


async def test_a_server_process_joins_its_memory_group_before_exec_instead_of_an_address_space_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, flags, mode=0o644: real_open(path, flags | os.O_CREAT, mode))
    parent = tmp_path / "group"
    parent.mkdir()
    child = Child(
        server="m",
        command=PY,
        args=["-c", "import sys; sys.stdin.read()"],
        max_line=MiB,
        input_limit=MiB,
        rlimits=Rlimits(memory=256 * MiB),
        memory_groups=cgroups.Groups(parent),
        on_line=lambda line: None,
        on_oversize=lambda size, head, tail: None,
    )
    await child.start()
    [group] = parent.iterdir()
    assert (group / "cgroup.procs").read_text() == "0"  # written by the child itself, before exec
    assert (group / "memory.max").read_text() == str(256 * MiB)
    assert "unlimited" in next(line for line in Path(f"/proc/{child.pid}/limits").read_text().splitlines() if "address space" in line)
    (group / "memory.events").write_text("oom 1\noom_kill 1\n")
    await child.stop(5)
    assert child.oom_kills == 1


def test_a_daemon_sharing_its_group_with_other_processes_moves_back_and_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = fake_tree(tmp_path, V2_MOUNTS, "/user.slice/session-1.scope", "/sys/fs/cgroup", "memory")
    own = tmp_path / "sys/fs/cgroup/user.slice/session-1.scope"
    write_text = Path.write_text

    def refuse_controllers(path: Path, data: str) -> int:
        if path.name == "cgroup.subtree_control":
            raise OSError(errno.EBUSY, "Device or resource busy")  # what the kernel says: processes are in it
        return write_text(path, data)

    monkeypatch.setattr(Path, "write_text", refuse_controllers)
    assert cgroups.prepare(cgroups.detect(*paths)) == (
        f"other processes share the daemon's cgroup {own}, so it cannot hold the servers' groups"
    )
    assert (own / "cgroup.procs").read_text() == str(os.getpid())  # moved back out of the leaf


# ------------------------------------------------------------------ another user


def python_for(user: str, script: Path = SERVERS / "faulty.py", first: str = PY) -> str | None:
    """An interpreter `user` may run `script` with (this one may live in root's home)."""
    readable = f"open({str(script)!r}).close()"
    for candidate in (first, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            if subprocess.run([candidate, "-c", readable], user=user, capture_output=True, timeout=10).returncode == 0:
                return candidate
        except OSError:
            continue
    return None


needs_root = pytest.mark.skipif(not IS_ROOT, reason="running a server as another user needs the daemon to run as root")


@needs_root
async def test_a_fork_bomb_run_as_nobody_is_stopped_by_the_process_limit(bridge: Any) -> None:
    python = python_for("nobody")
    if python is None:
        pytest.skip("user nobody can run no Python interpreter on tests/servers/faulty.py here")
    nobody = pwd.getpwnam("nobody")
    config = {"servers": {"bomb": faulty_as(python, user="nobody", rlimits={"processes": 20})}}
    async with bridge(config) as b, RawSse(b.url("bomb")) as c:
        await c.initialize()
        pid = (await b.wait_for("server_started"))["pid"]
        status = Path(f"/proc/{pid}/status").read_text()
        assert f"Uid:\t{nobody.pw_uid}\t" in status and f"Gid:\t{nobody.pw_gid}\t" in status
        groups = next(line for line in status.splitlines() if line.startswith("Groups:")).split()[1:]
        assert sorted(map(int, groups)) == sorted(set(os.getgrouplist("nobody", nobody.pw_gid)))  # its own, not root's
        env = json.loads(text_of(await tool(c, "environ", request_id="env")))
        assert (env["USER"], env["LOGNAME"], env["HOME"]) == ("nobody", "nobody", nobody.pw_dir)
        expected_cwd = nobody.pw_dir if os.path.isdir(nobody.pw_dir) else "/"
        assert text_of(await tool(c, "cwd", request_id="cwd")) == expected_cwd

        reply = await tool(c, "forkbomb", {"count": 2000, "ms": 3000}, request_id="bomb", timeout=30)
        assert reply["error"]["code"] == -32000, reply
        assert "its process limit likely stopped it" in reply["error"]["message"], reply
        event = await b.wait_for("server_exited_under_limits")
        assert event["limit"] == "processes" and "Resource temporarily unavailable" in event["said"]
        await b.wait_for("server_started", where=lambda e: e["pid"] != pid)
        assert text_of(await tool(c, "echo", {"text": "back"}, request_id="back")) == "back"
        _, status_json = await get_json(b, "/status")
        assert status_json["servers"]["bomb"]["user"] == f"nobody (uid {nobody.pw_uid}, gid {nobody.pw_gid})"
        assert status_json["servers"]["bomb"]["processes"][0]["last_exit_limit"] == "processes"
        assert await limit_kills(b, "bomb", "processes") == 1


@needs_root
async def test_a_limit_the_child_cannot_take_on_fails_its_start_saying_which(bridge: Any) -> None:
    """After it has become nobody, the child may not raise a hard limit: the spawn fails
    with the step and the reason, and the daemon carries on."""
    python = python_for("nobody")
    if python is None:
        pytest.skip("user nobody can run no Python interpreter on tests/servers/faulty.py here")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files to go past")
    config = {"servers": {"f": faulty_as(python, user="nobody", rlimits={"open_files": hard + 1})}}
    async with bridge(config) as b:
        failed = await b.wait_for("server_spawn_failed")
        assert "setting rlimits.open_files" in failed["error"] and "(before exec)" in failed["error"], failed


def test_users_and_groups_are_checked_against_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.config.load import build

    def problems(**server: Any) -> list[str]:
        return confine.host_problems(build({"servers": {"s": {"command": "x", **server}}}, "t"))

    assert problems(user="no-such-user-here") == ["servers.s.user: no user named 'no-such-user-here' on this host"]
    assert problems(user="nobody", group="no-such-group-here") == ["servers.s.group: no group named 'no-such-group-here' on this host"]
    unlisted = next(uid for uid in range(54321, 64000) if not _has_uid(uid))
    assert problems(user=unlisted) == [f"servers.s.group: required: user {unlisted} has no entry in the user database to take a group from"]
    if IS_ROOT:
        assert problems(user=unlisted, group=unlisted) == []
    assert problems(rlimits={"processes": 10}) == (
        ["servers.s.rlimits.processes: the kernel does not apply it to root, as which the server would run: set servers.s.user"]
        if IS_ROOT
        else []
    )
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert problems(user="nobody") == [
        "servers.s.user: running a server as another user or group needs the daemon to run as root (it runs as uid 1000)"
    ]


def test_a_server_run_as_another_user_gets_that_users_environment_not_the_daemons() -> None:
    from bridge.process.env import child_env

    who = confine.Identity(65534, 65534, (65534,), "nobody", "/nonexistent")
    daemon = {"PATH": "/usr/bin", "HOME": "/root", "USER": "root", "XDG_CACHE_HOME": "/root/.cache", "XDG_RUNTIME_DIR": "/run/user/0"}
    env = child_env(Server(command="x", env={"XDG_CACHE_HOME": "/srv/cache"}), daemon, who)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/nonexistent", "nobody", "nobody")
    assert env["XDG_CACHE_HOME"] == "/srv/cache" and "XDG_RUNTIME_DIR" not in env  # the server's own env stays
    assert child_env(Server(command="x"), daemon)["HOME"] == "/root"  # as the daemon: unchanged
    # Only a group: the daemon's user, with that one group and none of the daemon's others.
    only_group = confine.identity(Server(command="x", group=65534))
    assert only_group is not None and (only_group.uid, only_group.gid, only_group.groups) == (os.geteuid(), 65534, (65534,))


def _has_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


# ------------------------------------------------------------------ sandbox


def sandbox_problem() -> str | None:
    return confine.probe_sandbox(Server(command="true", sandbox=Sandbox()), None)


needs_bwrap = pytest.mark.skipif(sandbox_problem() is not None, reason=f"bubblewrap cannot run here: {sandbox_problem()}")


class Listener:
    """A loopback TCP listener the test owns, counting the connections it gets."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0
        self.got = asyncio.Event()

    async def __aenter__(self) -> Listener:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.got.set()
        writer.close()


@needs_bwrap
async def test_a_sandboxed_server_writes_only_its_paths_and_has_no_network(
    bridge: Any, tmp_path: Path, unhidden: tuple[str, Path]
) -> None:
    writable = tmp_path / "rw"
    writable.mkdir()
    private = Path("/tmp") / f"mcp-bridge-sandbox-{os.getpid()}"
    python, script = unhidden
    config = {
        "servers": {
            "boxed": faulty_as(python, script, sandbox={"writable": [str(writable)]}),
            "online": faulty_as(python, script, sandbox={"network": True}),
        }
    }
    async with Listener() as listener, bridge(config) as b, RawSse(b.url("boxed")) as c, RawSse(b.url("online")) as d:
        await c.initialize()
        await d.initialize()

        async def write(path: Path, rid: str) -> str:
            return text_of(await tool(c, "write", {"path": str(path), "text": "boxed"}, request_id=rid))

        assert await write(writable / "inside", "in") == "ok"
        assert (writable / "inside").read_text() == "boxed"
        # Outside /tmp (a checkout may live under /tmp, which the sandbox replaces).
        escape = script.parent / "sandbox-escape"
        assert await write(escape, "root") == "error: Read-only file system"
        assert not escape.exists()
        # /tmp is its own (tmp_path is under the host's /tmp): what it writes there is not the host's.
        for path, rid in ((private, "tmp"), (tmp_path / "outside", "out")):
            assert await write(path, rid) == "ok"
            assert not path.exists()

        said = text_of(await tool(c, "connect", {"port": listener.port}, request_id="net"))
        assert said.startswith("error: "), said
        assert text_of(await tool(d, "connect", {"port": listener.port}, request_id="net")) == "connected"
        await asyncio.wait_for(listener.got.wait(), 5)
        assert listener.connections == 1  # the online server's; none from the boxed one
        _, status = await get_json(b, "/status")
        assert status["servers"]["boxed"]["sandbox"] == {"writable": [str(writable)], "network": False}
        assert status["servers"]["online"]["sandbox"] == {"writable": [], "network": True}


async def test_a_sandbox_that_cannot_run_stops_the_start_and_the_check(tmp_path: Path) -> None:
    """No bwrap on the daemon's PATH: --check and start-up both refuse, naming the server;
    nothing is run unsandboxed."""
    config = tmp_path / "c.yaml"
    config.write_text(
        f"servers:\n  boxed:\n    command: {PY}\n    args: [{SERVERS / 'faulty.py'}]\n    sandbox: {{writable: [{tmp_path}]}}\n"
    )
    empty = tmp_path / "bin"
    empty.mkdir()
    for check in (True, False):
        out = run_check(config, {"PATH": str(empty)}, check=check)
        assert out.returncode == 2, (out.stdout, out.stderr)
        assert (
            f"{config}: servers.boxed.sandbox: bubblewrap (bwrap) is not installed or not on the daemon's PATH "
            "(Debian package bubblewrap); the server is not run unsandboxed"
        ) in out.stderr
        assert "listening" not in out.stderr


def test_a_sandboxed_server_under_tmp_is_refused_not_crash_looped(tmp_path: Path) -> None:
    """The sandbox's /tmp is empty: a command, cwd or script there could not be seen, so start-up
    and --check say so (unless it is under a writable path, which shows through)."""
    script = tmp_path / "server.py"
    script.write_text("")
    config = tmp_path / "c.yaml"
    config.write_text(f"servers:\n  boxed:\n    command: /usr/bin/env\n    args: [{script}]\n    cwd: {tmp_path}\n    sandbox: {{}}\n")
    out = run_check(config)
    assert out.returncode == 2, (out.stdout, out.stderr)
    for key, path in (("args[0]", script), ("cwd", tmp_path)):
        assert f"servers.boxed.{key}: {path} is under /tmp, which the sandbox replaces with a private one" in out.stderr
    config.write_text(f"servers:\n  boxed:\n    command: /usr/bin/env\n    args: [{script}]\n    sandbox: {{writable: [{tmp_path}]}}\n")
    assert "is under /tmp" not in run_check(config).stderr


@needs_bwrap
def test_a_sandbox_whose_writable_path_is_missing_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"servers:\n  boxed:\n    command: {PY}\n    sandbox: {{writable: [{tmp_path / 'missing'}]}}\n")
    out = run_check(config)
    assert out.returncode == 2
    assert "servers.boxed.sandbox: bubblewrap cannot run here (" in out.stderr and "missing" in out.stderr, out.stderr


def test_the_sandbox_command_line() -> None:
    argv = confine.bwrap_argv("/usr/bin/bwrap", Sandbox(writable=("/srv/a",)), "node", ["server.js"])
    assert argv[:10] == ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    assert argv[argv.index("--bind") : argv.index("--bind") + 3] == ["--bind", "/srv/a", "/srv/a"]
    for flag in ("--unshare-net", "--die-with-parent", "--new-session", "--unshare-pid"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[-3:] == ["--", "node", "server.js"]
    assert "--unshare-net" not in confine.bwrap_argv("bwrap", Sandbox(network=True), "node", [])


@needs_bwrap
@needs_root
async def test_a_sandboxed_server_run_as_nobody(bridge: Any, unhidden: tuple[str, Path]) -> None:
    """The two together, as the README advises: bubblewrap then runs as that user (in a user
    namespace), and the server writes only what is both writable in the sandbox and its own."""
    python = python_for("nobody", unhidden[1], unhidden[0])
    if python is None or python.startswith("/tmp/"):
        pytest.skip("user nobody can run no Python interpreter outside /tmp on tests/servers/faulty.py here")
    nobody = pwd.getpwnam("nobody")
    # Not under tmp_path: pytest's base directory is root's alone, and nobody could not reach it.
    writable = Path(tempfile.mkdtemp(prefix="mcp-bridge-nobody-"))
    os.chown(writable, nobody.pw_uid, nobody.pw_gid)
    config = {"servers": {"boxed": faulty_as(python, unhidden[1], user="nobody", sandbox={"writable": [str(writable)]})}}
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, writable)
        b = await stack.enter_async_context(bridge(config))
        c = await stack.enter_async_context(RawSse(b.url("boxed")))
        await c.initialize()
        pid = (await b.wait_for("server_started"))["pid"]
        assert f"Uid:\t{nobody.pw_uid}\t" in Path(f"/proc/{pid}/status").read_text()  # bubblewrap itself
        reply = await tool(c, "write", {"path": str(writable / "inside"), "text": "boxed"}, request_id="in")
        assert text_of(reply) == "ok"
        assert (writable / "inside").stat().st_uid == nobody.pw_uid
        escape = unhidden[1].parent / "sandbox-escape"  # outside /tmp, as above
        reply = await tool(c, "write", {"path": str(escape)}, request_id="out")
        assert text_of(reply).startswith("error: ")
        assert not escape.exists()


def test_sandbox_and_user_keys_are_validated() -> None:
    from bridge.config.load import build
    from bridge.config.schema import ConfigError

    with pytest.raises(ConfigError) as caught:
        build({"servers": {"s": {"command": "x", "user": -1, "sandbox": {"writable": ["rel/dir"], "net": True}}}}, "t")
    assert caught.value.problems == [
        "servers.s.user: expected `int` >= 0, got -1",
        "servers.s.sandbox.net: unknown key (did you mean 'network'?)",
    ]
    with pytest.raises(ConfigError) as caught:
        build({"servers": {"s": {"command": "x", "sandbox": {"writable": ["rel/dir"]}}}}, "t")
    assert caught.value.problems == ["servers.s.sandbox.writable[0]: must be an absolute path, got 'rel/dir'"]
