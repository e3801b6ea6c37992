"""The container image: the unchanged Dockerfile, built and run with podman.

The module builds the image once (base images from `tests/image/base-images.sh`,
which skips those that exist), then runs containers on the host network bound
to 127.0.0.1 on an ephemeral port (`--host 127.0.0.1 --port 0`; the port comes
from the daemon's `listening` event), attached, so each container's JSON log
is read as it arrives and tests wait on its events. Every container is named
for this run and removed at teardown (exactly those). It skips only where
podman cannot run: not root, or podman or runc missing (`.ci/run` installs
them). The image size, build time and start-up time to `/readyz` 200 are
printed at the end of the module.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from mcp import ClientSession
from mcp.client.sse import sse_client
from support.daemon import ROOT, Bridge
from support.sdk import text_of

IMAGE_DIR = ROOT / "tests" / "image"
PODMAN = str(IMAGE_DIR / "podman")
IMAGE = "localhost/mcp-bridge:test"
BASES = {
    "PYTHON_IMAGE": "localhost/mcp-bridge-base/python:bookworm",
    "NODE_IMAGE": "localhost/mcp-bridge-base/node:bookworm",
}
DOCKER_CONFIG = ROOT / "config" / "docker.yaml"
IN_IMAGE_CONFIG = "/etc/mcp-bridge/servers.yaml"
TOKENS = {"MCP_BRIDGE_TOKEN": "client-token-0123456789abcdef", "MCP_BRIDGE_METRICS_TOKEN": "metrics-token-0123456789abcdef"}
AUTH = {"Authorization": f"Bearer {TOKENS['MCP_BRIDGE_TOKEN']}"}
# The README's `docker run` flags, with podman's `U` on HOME: podman 4.3 ignores
# a tmpfs `mode=` and gives the mount the image directory's mode (0755) with
# root as owner, so uid 10001 could not write its HOME; `U` chowns it to 10001.
HARDENED = [
    "--read-only",
    "--tmpfs", "/tmp:exec,mode=1777,size=1g",
    "--tmpfs", "/home/mcp:exec,mode=1777,U",
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
]  # fmt: skip
LOOPBACK = ["--host", "127.0.0.1", "--port", "0"]
# Pinned as the README advises (the versions tests/node and the test extra use).
NPX_SERVER = {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything@2026.8.31", "stdio"]}
UVX_SERVER = {"command": "uvx", "args": ["mcp-server-time@2026.10.19", "--local-timezone", "UTC"]}
# The first start downloads the package into the container's empty /tmp.
FIRST_START_S = 180.0

# Lists every process in the container with its uid and state, as one JSON line.
PROCESSES = """
import json, os
procs = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode().strip()
    except OSError:
        continue
    procs.append({"pid": int(pid), "ppid": int(status["PPid"]), "uid": int(status["Uid"].split()[0]),
                  "state": status["State"].split()[0], "cmd": cmd or status["Name"].strip()})
print(json.dumps({"event": "processes", "self": os.getpid(), "parent": os.getppid(), "processes": procs}), flush=True)
"""

# The image's entrypoint (tini as PID 1, subreaper) with a shell between tini and
# the daemon that passes TERM and HUP on and, once the daemon has exited, lists
# what is still alive in the container before the namespace is torn down:
# nothing but tini and this shell should be.
WATCHED = f"""
mcp-bridge "$@" & daemon=$!
trap 'kill -TERM $daemon' TERM
trap 'kill -HUP $daemon' HUP
while :; do wait $daemon; code=$?; kill -0 $daemon 2>/dev/null || break; done
python -c '{PROCESSES}' >&2
exit $code
"""


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:2])} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


async def apodman(*args: str, timeout: float = 30) -> str:
    proc = await asyncio.create_subprocess_exec(
        PODMAN, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    what = f"podman {' '.join(args[:2])} exited {proc.returncode}"
    assert proc.returncode == 0, f"{what}: {out.decode()[-500:]}{err.decode()[-2000:]}"
    return out.decode()


def cannot_run() -> str | None:
    if os.geteuid() != 0:
        return "the image tests need root: they run podman rootful, as .ci/run does on CI"
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (.ci/run installs podman, runc and debootstrap)"
    info = subprocess.run([PODMAN, "info", "--format", "{{.Host.OCIRuntime.Name}}"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return f"podman cannot run here: {info.stderr.strip()[-300:]}"
    return None


CANNOT_RUN = cannot_run()
pytestmark = pytest.mark.skipif(CANNOT_RUN is not None, reason=CANNOT_RUN or "")


@dataclass
class Figures:
    size_bytes: int = 0
    build_s: float = 0.0
    readyz_s: list[float] = field(default_factory=list)
    first_calls_s: float = 0.0
    sigterm_exit_s: float = 0.0


def image_ids(*options: str) -> set[str]:
    return {i.removeprefix("sha256:") for i in podman("images", "--quiet", "--no-trunc", *options).stdout.split()}


@pytest.fixture(scope="module")
def image(pytestconfig: pytest.Config) -> Iterator[Figures]:
    """Builds the image once for the module; prints its figures at the end."""
    bases = subprocess.run(
        [str(IMAGE_DIR / "base-images.sh")], capture_output=True, text=True, timeout=900, env={**os.environ, **BASES}
    )
    assert bases.returncode == 0, f"base-images.sh failed: {bases.stdout[-1000:]}{bases.stderr[-2000:]}"
    build_args = [arg for name, base in BASES.items() for arg in ("--build-arg", f"{name}={base}")]
    before = image_ids()
    previous = podman("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip()
    started = time.monotonic()
    # --no-cache: podman 4.3 cannot `RUN --mount=...,from=builder` when the builder
    # stage comes from its cache ("couldn't find .../wheels on host"); built
    # afresh, it can. (--layers=false is worse: it deletes the Node base image.)
    podman("build", "--quiet", "--no-cache", "--format", "docker", "--network", "host", *build_args,
           "-t", IMAGE, str(ROOT), timeout=900)  # fmt: skip
    figures = Figures(build_s=time.monotonic() - started)
    # This build's intermediate images and the image it replaced; nothing else.
    dangling = image_ids("--filter", "dangling=true")
    stale = (dangling - before) | ({previous} & dangling)
    if stale:
        podman("rmi", *sorted(stale), check=False)
    figures.size_bytes = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
    yield figures
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        startup = ", ".join(f"{s:.2f}" for s in figures.readyz_s)
        with capture.global_and_fixture_disabled():
            reporter.write_line(
                f"\ntest_image: image {figures.size_bytes / 2**20:.0f} MiB ({figures.size_bytes} bytes), "
                f"build {figures.build_s:.1f}s, start-up to /readyz 200: {startup} s, "
                f"first npx + uvx calls {figures.first_calls_s:.1f}s, SIGTERM to exit {figures.sigterm_exit_s:.1f}s"
            )


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    """Names of the containers this module started; teardown removes exactly those."""
    started: list[str] = []
    yield started
    if started:
        podman("rm", "--force", "--ignore", "--time", "0", *started, timeout=120)


_serial = itertools.count()


@dataclass
class Container:
    name: str
    bridge: Bridge
    started: float

    async def exec(self, *command: str) -> str:
        return await apodman("exec", self.name, *command)

    async def processes(self) -> dict[str, Any]:
        line: dict[str, Any] = json.loads(await self.exec("python", "-c", PROCESSES))
        return line

    async def kill(self, sig: str) -> None:
        await apodman("kill", "--signal", sig, self.name)

    async def exit_code(self, timeout: float) -> int:
        async with asyncio.timeout(timeout):
            code = await self.bridge.proc.wait()
            await self.bridge._reader
        return code


@contextlib.asynccontextmanager
async def run(
    names: list[str], *options: str, args: tuple[str, ...] = (), listening: bool = True
) -> AsyncIterator[Container]:
    """`podman run` attached (its stderr is the daemon's JSON log), with `options` before the image."""
    name = f"mcp-bridge-test-{os.getpid()}-{next(_serial)}"
    names.append(name)
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        PODMAN, "run", "--rm", "--name", name, *options, IMAGE, *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **TOKENS},
    )  # fmt: skip
    box = Container(name, Bridge(proc, Path(IN_IMAGE_CONFIG)), started)
    try:
        if listening:
            box.bridge.port = (await box.bridge.wait_for("listening", timeout=60))["port"]
        yield box
    finally:
        if proc.returncode is None:
            await apodman("rm", "--force", "--ignore", "--time", "0", name, timeout=60)
            async with asyncio.timeout(30):
                await proc.wait()
        async with asyncio.timeout(10):
            await box.bridge._reader


def config_with(servers: dict[str, Any], tmp_path: Path, **limits: Any) -> Path:
    """The image's config with these servers (and limits), as a file uid 10001 can read."""
    config = yaml.safe_load(DOCKER_CONFIG.read_text())
    config["servers"] = servers
    config["limits"].update(limits)
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)
    return path


async def wait_ready(http: aiohttp.ClientSession, base: str, timeout: float = 30) -> None:
    """/readyz answers 200; it is 503 while a configured server is starting."""
    async with asyncio.timeout(timeout):
        for _ in range(int(timeout / 0.05)):
            async with http.get(base + "/readyz") as resp:
                if resp.status == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{base}/readyz never answered 200")


@contextlib.asynccontextmanager
async def sdk(url: str, read_timeout: float = 60) -> AsyncIterator[ClientSession]:
    """The official SDK client over HTTP+SSE with the clients token, initialized."""
    async with sse_client(url, headers=AUTH, timeout=10) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=read_timeout) as session:
            await session.initialize()
            yield session


# ------------------------------------------------------------------ tests


async def test_runs_read_only_as_10001_and_serves_the_shipped_config(image: Figures, names: list[str]) -> None:
    async with run(names, "--network", "host", *HARDENED, "-e", "MCP_BRIDGE_TOKEN", "-e", "MCP_BRIDGE_METRICS_TOKEN",
                   args=("--config", IN_IMAGE_CONFIG, *LOOPBACK)) as box, aiohttp.ClientSession() as http:  # fmt: skip
        base = box.bridge.base
        await wait_ready(http, base)
        image.readyz_s.append(time.monotonic() - box.started)
        async with http.get(base + "/healthz") as resp:
            assert resp.status == 200
        async with http.get(box.bridge.url("demo")) as resp:
            assert resp.status == 401, "the shipped config requires the token"

        async with sdk(box.bridge.url("demo")) as session:
            assert text_of(await session.call_tool("echo", {"text": "from the image"})) == "from the image"

        # Every process runs as 10001: tini, the daemon, the demo server.
        procs = (await box.processes())["processes"]
        assert {p["uid"] for p in procs} == {10001}, procs
        assert any("mcp-bridge-demo" in p["cmd"] for p in procs), procs
        assert (await box.exec("id", "-u")).strip() == "10001"

        # Read-only root; the README's tmpfs mounts are writable and allow exec. The
        # image's /tmp is empty (podman copies it into the tmpfs): a root-owned
        # npm cache there made every npx server fail with EACCES.
        probe = await box.exec("sh", "-c", (
            "ls -A /tmp; touch /etc/probe 2>/dev/null && echo root-writable; "
            "for d in /tmp /home/mcp; do printf '#!/bin/sh\\necho ran\\n' > $d/probe && chmod +x $d/probe && $d/probe; done; "
            "cat /proc/mounts"
        ))  # fmt: skip
        lines = probe.splitlines()
        assert lines[:2] == ["ran", "ran"], probe
        mounts = {fields[1]: fields for fields in (line.split() for line in lines[2:])}
        assert "ro" in mounts["/"][3].split(","), mounts["/"]
        for path in ("/tmp", "/home/mcp"):
            assert mounts[path][2] == "tmpfs" and "noexec" not in mounts[path][3].split(","), mounts[path]
        inspect = json.loads(await apodman("inspect", box.name))[0]
        assert inspect["HostConfig"]["ReadonlyRootfs"] is True
        assert inspect["Config"]["User"] == "10001:10001"

        await box.kill("TERM")
        assert await box.exit_code(timeout=30) == 0


async def test_the_default_command_needs_tokens_on_every_address_and_is_healthy(image: Figures, names: list[str]) -> None:
    # The image's own CMD (0.0.0.0:8080) in a namespace with only its own loopback
    # (--network none): whatever it does, nothing is exposed.
    async with run(names, "--network", "none", *HARDENED, listening=False) as box:
        assert await box.exit_code(timeout=60) == 2
        assert "listening" not in {e.get("event") for e in box.bridge.events}
        assert "MCP_BRIDGE_TOKEN" in json.dumps(box.bridge.events), box.bridge.events

    tokens = ("-e", "MCP_BRIDGE_TOKEN", "-e", "MCP_BRIDGE_METRICS_TOKEN")
    async with run(names, "--network", "none", *HARDENED, *tokens, listening=False) as box:
        listening = await box.bridge.wait_for("listening", timeout=60)
        assert (listening["host"], listening["port"]) == ("0.0.0.0", 8080), listening
        # The image's HEALTHCHECK (kept by --format docker) probes 127.0.0.1:8080 inside.
        await apodman("healthcheck", "run", box.name)
        await box.kill("TERM")
        assert await box.exit_code(timeout=30) == 0


async def test_npx_and_uvx_servers_answer_and_sigterm_drains_a_call(
    image: Figures, names: list[str], tmp_path: Path
) -> None:
    servers = {
        "demo": {"command": "mcp-bridge-demo", "shutdown_timeout": "5s"},
        "everything": {**NPX_SERVER, "shutdown_timeout": "5s"},
        "time": {**UVX_SERVER, "shutdown_timeout": "5s"},
    }
    config = config_with(servers, tmp_path, initialize_timeout=f"{FIRST_START_S:.0f}s")
    drain_s = 10.0
    assert yaml.safe_load(config.read_text())["limits"]["drain_timeout"] == f"{drain_s:.0f}s"
    options = ("--network", "host", *HARDENED, "-e", "MCP_BRIDGE_TOKEN", "-e", "MCP_BRIDGE_METRICS_TOKEN",
               "-v", f"{config}:{IN_IMAGE_CONFIG}:ro", "--entrypoint", "/usr/bin/tini")  # fmt: skip
    args = ("-s", "--", "sh", "-c", WATCHED, "mcp-bridge", "--config", IN_IMAGE_CONFIG, *LOOPBACK)
    async with run(names, *options, args=args) as box:
        first = time.monotonic()
        async with sdk(box.bridge.url("everything"), read_timeout=FIRST_START_S) as session:
            assert text_of(await session.call_tool("echo", {"message": "via npx"})) == "Echo: via npx"
        async with sdk(box.bridge.url("time"), read_timeout=FIRST_START_S) as session:
            reply = json.loads(text_of(await session.call_tool("get_current_time", {"timezone": "UTC"})))
            assert reply["timezone"] == "UTC", reply
        image.first_calls_s = time.monotonic() - first

        # Launchers are running (npx and uvx each start the server as a child);
        # nothing inside is a zombie.
        procs = (await box.processes())["processes"]
        assert not [p for p in procs if p["state"] == "Z"], procs

        async with sdk(box.bridge.url("demo")) as session:
            # The SDK lists the tools to check a result against its schema, once per session:
            # list them now, so that the call's result needs nothing more from a stopping bridge.
            await session.list_tools()
            progressed = asyncio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                progressed.set()

            steps, interval_ms = 10, 300
            in_flight = asyncio.ensure_future(
                session.call_tool("countdown", {"steps": steps, "interval_ms": interval_ms}, progress_callback=on_progress)
            )
            async with asyncio.timeout(30):
                await progressed.wait()
            signalled = time.monotonic()
            await box.kill("TERM")
            await box.bridge.wait_for("draining", timeout=10)
            async with asyncio.timeout(drain_s):
                assert text_of(await in_flight) == "done"

        code = await box.exit_code(timeout=drain_s + 20)
        stopped_in = image.sigterm_exit_s = time.monotonic() - signalled
        assert code == 0, box.bridge.events[-10:]
        assert stopped_in < drain_s, f"stopped {stopped_in:.1f}s after SIGTERM"
        left = box.bridge.named("processes")
        assert left, "the watcher did not report"
        stray = [p for p in left[-1]["processes"] if p["pid"] not in (1, left[-1]["self"], left[-1]["parent"])]
        assert not stray, f"still in the container after the daemon exited: {stray}"


async def test_sighup_after_editing_the_mounted_config_adds_a_server(
    image: Figures, names: list[str], tmp_path: Path
) -> None:
    demo = {"command": "mcp-bridge-demo", "shutdown_timeout": "5s"}
    config = config_with({"demo": demo}, tmp_path)
    async with run(names, "--network", "host", *HARDENED, "-e", "MCP_BRIDGE_TOKEN", "-e", "MCP_BRIDGE_METRICS_TOKEN",
                   "-v", f"{config}:{IN_IMAGE_CONFIG}:ro",
                   args=("--config", IN_IMAGE_CONFIG, *LOOPBACK)) as box, aiohttp.ClientSession() as http:  # fmt: skip
        added = box.bridge.url("added")
        async with http.get(added, headers=AUTH) as resp:
            assert resp.status == 404
        # In place: a bind-mounted file keeps its inode, so a rename would not show inside.
        edited = config_with({"demo": demo, "added": demo}, tmp_path)
        assert edited == config
        mark = len(box.bridge.events)
        await box.kill("HUP")
        await box.bridge.wait_for("config_reloaded", timeout=30, start=mark)
        async with sdk(added) as session:
            assert text_of(await session.call_tool("echo", {"text": "added"})) == "added"
        await box.kill("TERM")
        assert await box.exit_code(timeout=30) == 0
