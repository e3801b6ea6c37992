"""Supervised stdio processes and the command line, end to end.

Real daemon, real server processes (tests/servers/faulty.py), real signals.
Every wait is on a log event, a message or a process exit, bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from support.daemon import PY, ROOT, Bridge, faulty, pid_alive
from support.rawclient import RawSse, call

from bridge.process import child

# Levels an operator sees at the default logging.level (info); the tests run the daemon at debug.
LOGGED = ("info", "warning", "error", "critical")
FAST_RESTART = {"backoff_initial": "0.05s", "backoff_max": "1s", "max_restarts": 5, "window": "30s"}


def stderr_note(prefix: str) -> Any:
    return lambda e: e.get("line", "").startswith(f"faulty: {prefix}")


def text_of(reply: dict[str, Any]) -> str:
    assert "result" in reply, reply
    return reply["result"]["content"][0]["text"]


async def tool(c: RawSse, name: str, args: dict[str, Any] | None = None, request_id: Any = 1, timeout: float = 10.0) -> dict[str, Any]:
    status, body = await c.post({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call(name, args)})
    assert status == 202, (status, body)
    return await c.response(request_id, timeout=timeout)


async def server_pid(c: RawSse, request_id: Any = "pid") -> int:
    return int(text_of(await tool(c, "pid", request_id=request_id)))


async def get_json(b: Bridge, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(b.base + path) as resp:
        return resp.status, await resp.json()


# ------------------------------------------------------------------- exits and restarts


async def test_crash_mid_request_restarts(bridge: Any) -> None:
    async with bridge({"servers": {"f": {**faulty(), "restart": FAST_RESTART}}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        old = await server_pid(c)
        assert (await b.wait_for("server_started"))["pid"] == old

        started = time.monotonic()
        reply = await tool(c, "crash", request_id="boom", timeout=1.0)
        assert time.monotonic() - started < 1.0
        assert "result" not in reply
        assert reply["error"]["code"] == -32000, reply

        exited = await b.wait_for("server_exited", where=lambda e: e.get("pid") == old)
        assert exited["exit_code"] == 3
        restarted = await b.wait_for("server_started", where=lambda e: e["pid"] != old)
        new = await server_pid(c, "after")
        assert new == restarted["pid"] != old
        assert text_of(await tool(c, "echo", {"text": "alive"}, request_id="echo")) == "alive"
        _, status = await get_json(b, "/status")
        assert status["servers"]["f"]["processes"][0]["restarts"] == 1
        assert status["servers"]["f"]["processes"][0]["pid"] == new


async def test_what_a_server_leaves_in_its_group_dies_with_it(bridge: Any) -> None:
    """A server that exits takes its process group along: a child it left running would
    hold the server's pipes (its exit unseen) and its memory."""
    async with bridge({"servers": {"f": {**faulty(), "restart": FAST_RESTART}}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        orphan = int(text_of(await tool(c, "orphan", {"s": 60}, request_id="orphan")))
        try:
            assert pid_alive(orphan)
            await tool(c, "crash", request_id="boom", timeout=5.0)
            await b.wait_for("server_exited")
            deadline = time.monotonic() + 5.0
            while pid_alive(orphan) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert not pid_alive(orphan), "the server's child outlived it"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)


async def test_sigkill_during_call(bridge: Any) -> None:
    """Acceptance: SIGKILL the server during a call; the call errors within 1 s and a later call succeeds."""
    async with bridge({"servers": {"f": {**faulty(), "restart": FAST_RESTART}}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        pid = await server_pid(c)
        mark = len(b.events)
        status, _ = await c.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call("slow", {"ms": 10000})})
        assert status == 202
        await b.wait_for("server_stderr", where=stderr_note("slow "), start=mark)  # the call is in the process

        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        reply = await c.response(1, timeout=1.0)
        assert time.monotonic() - killed < 1.0
        assert "result" not in reply and reply["error"]["code"] == -32000, reply

        await b.wait_for("server_started", where=lambda e: e["pid"] != pid)
        assert not pid_alive(pid)
        new = await server_pid(c, "after")
        assert new != pid
        assert text_of(await tool(c, "echo", {"text": "back"}, request_id=2)) == "back"


async def test_crash_loop_marks_server_down(bridge: Any) -> None:
    restart = {"backoff_initial": "0.05s", "backoff_max": "2s", "max_restarts": 3, "window": "30s"}
    config = {"servers": {"f": {**faulty(FAULTY_CRASH_ON_START="1"), "restart": restart}, "ok": faulty()}}
    async with bridge(config) as b:
        loop = await b.wait_for("server_crash_loop", where=lambda e: e.get("server") == "f")
        assert "crash loop" in loop["reason"]
        starts = [e for e in b.named("server_started") if e["server"] == "f"]
        assert len(starts) == 4, starts  # the first start and max_restarts restarts

        status, body = await get_json(b, "/readyz")
        assert status == 503, body
        assert "f" in body["servers"] and "ok" not in body["servers"], body
        _, st = await get_json(b, "/status")
        assert st["servers"]["f"]["ready"] is False

        async with RawSse(b.url("f")) as c:
            init = await c.request(
                "initialize",
                {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
                request_id="init",
            )
            assert "error" in init and "result" not in init, init
            reply = await tool(c, "echo", {"text": "x"}, timeout=5.0)
            assert "error" in reply and "result" not in reply, reply
        # The crashing server does not take the other one down.
        async with RawSse(b.url("ok")) as c:
            await c.initialize()
            assert text_of(await tool(c, "echo", {"text": "fine"})) == "fine"


async def test_request_timeout(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}, "limits": {"request_timeout": "1s"}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        mark = len(b.events)
        started = time.monotonic()
        status, _ = await c.post({"jsonrpc": "2.0", "id": "h", "method": "tools/call", "params": call("hang")})
        assert status == 202
        hang = await b.wait_for("server_stderr", where=stderr_note("hang "), start=mark)
        reply = await c.response("h", timeout=4.0)
        elapsed = time.monotonic() - started
        assert reply["error"]["code"] == -32001, reply
        assert 0.9 <= elapsed < 3.0, elapsed
        # The call is cancelled upstream, too.
        cancelled = await b.wait_for(
            "server_stderr", where=stderr_note("notification notifications/cancelled "), start=mark
        )
        params = json.loads(cancelled["line"].split(" ", 3)[3])
        assert params["requestId"] == json.loads(hang["line"].split(" ", 2)[2])
        # And the server still serves.
        assert text_of(await tool(c, "echo", {"text": "ok"}, request_id=2)) == "ok"


async def test_initialize_timeout_restarts(bridge: Any) -> None:
    config = {
        "servers": {"f": {**faulty(FAULTY_NO_INIT="1"), "restart": FAST_RESTART}},
        "limits": {"initialize_timeout": "1s"},
    }
    async with bridge(config) as b:
        first = await b.wait_for("server_started")
        await b.wait_for("server_stderr", where=stderr_note("initialize "))
        forced = await b.wait_for("server_restart_forced", timeout=5)
        assert forced["pid"] == first["pid"]
        assert forced["server"] == "f"
        again = await b.wait_for("server_started", where=lambda e: e["pid"] != first["pid"])
        # The new process gets an initialize of its own before anything else.
        await b.wait_for("server_stderr", where=lambda e: e["pid"] == again["pid"] and stderr_note("initialize ")(e))
        status, body = await get_json(b, "/readyz")
        assert status == 503 and "f" in body["servers"], body


# ----------------------------------------------------------------------- output


async def test_stderr_lines_logged(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        pid = await server_pid(c)
        mark = len(b.events)
        assert text_of(await tool(c, "noise", {"lines": 20})) == "ok"
        await b.wait_for("server_stderr", where=lambda e: e["line"].startswith("noise 19:"), start=mark)
        lines = [e for e in b.events[mark:] if e.get("event") == "server_stderr" and e["line"].startswith("noise ")]
        assert [e["line"].split(":")[0] for e in lines] == [f"noise {i}" for i in range(20)]
        assert all(e["server"] == "f" and e["pid"] == pid and e["level"] in LOGGED for e in lines), lines[0]
        assert all("suppressed" not in e for e in lines), lines
        assert lines[0]["line"] == "noise 0: lorem ipsum dolor sit amet, consectetur adipiscing elit"


async def test_stderr_flood_rate_limited_and_tail_kept(bridge: Any) -> None:
    """A server writing stderr as fast as it can gets a burst of lines into the log, then a
    few a second, each saying how many were left out; its last lines are kept for its exit."""
    flood = 5000
    config = {"servers": {"f": {**faulty(), "restart": FAST_RESTART}}}
    async with bridge(config) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        pid = await server_pid(c)
        # What the server said at its start is in the log before the flood is counted (on a busy
        # machine its line may come after the answers above).
        await b.wait_for("server_stderr", where=lambda e: e["pid"] == pid and e["line"].startswith("faulty: initialize"))
        mark = len(b.events)
        assert text_of(await tool(c, "noise", {"lines": flood})) == "ok"
        # One more line at a time, until the log takes one again (it says how many it left out).
        for probe in range(1, 11):
            probe_mark = len(b.events)
            assert text_of(await tool(c, "noise", {"lines": 1}, request_id=f"p{probe}")) == "ok"
            with contextlib.suppress(TimeoutError):
                await b.wait_for("server_stderr", where=lambda e: "suppressed" in e, start=probe_mark, timeout=0.5)
                break
        else:
            raise AssertionError("no server_stderr event with `suppressed` after the flood")
        assert (await tool(c, "crash", request_id=2))["error"]["code"] == -32000
        exited = await b.wait_for("server_exited", where=lambda e: e["pid"] == pid, start=mark)
        logged = [e for e in b.events[mark:] if e.get("event") == "server_stderr" and e["pid"] == pid]
        assert len(logged) <= child.STDERR_BURST + 10 * child.STDERR_RATE, len(logged)  # the test takes < 10 s
        # A burst in order from the first line (less what the server's start took from it), then
        # lines each saying how many came before it unlogged; every line either logged or counted.
        burst = next(i for i, e in enumerate(logged) if "suppressed" in e)
        assert burst >= child.STDERR_BURST - 10, burst
        assert [e["line"].split(":")[0] for e in logged[:burst]] == [f"noise {i}" for i in range(burst)]
        assert len(logged) + sum(e.get("suppressed", 0) for e in logged) + exited["stderr_suppressed"] == flood + probe
        noise = "lorem ipsum dolor sit amet, consectetur adipiscing elit"
        assert exited["stderr_tail"] == [f"noise {i}: {noise}" for i in range(flood - 20 + probe, flood)] + [f"noise 0: {noise}"] * probe
        assert exited["exit_code"] == 3


async def test_garbage_on_stdout_skipped(bridge: Any) -> None:
    async with bridge({"servers": {"f": faulty()}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        pid = await server_pid(c)
        mark = len(b.events)
        assert text_of(await tool(c, "garbage", request_id=1)) == "ok"
        # Two non-JSON lines (the blank one is just framing) and one reply to an id never issued.
        await b.wait_for("message_dropped", start=mark)
        skipped = [e for e in b.events[mark:] if e.get("event") == "server_line_skipped"]
        assert len(skipped) == 2, skipped
        assert all(e["server"] == "f" and e["pid"] == pid for e in skipped), skipped
        # Logged where an operator sees it (the daemon defaults to level info).
        assert all(e["level"] in LOGGED for e in skipped), skipped
        dropped = [e for e in b.events[mark:] if e.get("event") == "message_dropped"]
        assert len(dropped) == 1 and dropped[0]["id"] == 999999999, dropped
        assert dropped[0]["level"] in LOGGED, dropped
        # Nothing of it reached the client: the next thing on the stream is the next reply.
        assert await c.request("ping", request_id=2) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        assert not c._held, c._held
        assert text_of(await tool(c, "echo", {"text": "still"}, request_id=3)) == "still"


async def test_big_response_intact(bridge: Any) -> None:
    size = 5 * 1024 * 1024
    async with bridge({"servers": {"f": faulty()}, "limits": {"max_message_bytes": "8MiB"}}) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        reply = await tool(c, "big", {"bytes": size}, timeout=20)
        body = text_of(reply)
        assert len(body) == size and body == "x" * size
        assert text_of(await tool(c, "echo", {"text": "after"}, request_id=2)) == "after"


async def test_response_over_line_limit(bridge: Any) -> None:
    """A reply longer than limits.max_message_bytes is dropped, logged, and the caller is told
    at once (not left to the request timeout); the daemon keeps serving."""
    config = {"servers": {"f": faulty()}, "limits": {"max_message_bytes": "64KiB", "request_timeout": "30s"}}
    async with bridge(config) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        mark = len(b.events)
        started = time.monotonic()
        reply = await tool(c, "big", {"bytes": 200_000}, request_id="big", timeout=5.0)
        assert time.monotonic() - started < 5.0
        assert "result" not in reply, str(reply)[:200]
        assert reply["error"]["code"] not in (-32001, -32000), reply  # neither a timeout nor a crash

        def over_limit(e: dict[str, Any]) -> bool:
            return e.get("event") in ("server_line_skipped", "message_dropped") and "max_message_bytes" in e.get("reason", "")

        logged = [e for e in b.events[mark:] if over_limit(e)]
        assert len(logged) == 1, logged
        assert logged[0]["size"] > 200_000 and logged[0]["server"] == "f"
        assert logged[0]["level"] in LOGGED, logged
        assert text_of(await tool(c, "echo", {"text": "after"}, request_id=2)) == "after"
        assert text_of(await tool(c, "big", {"bytes": 60_000}, request_id=3)) == "x" * 60_000
        assert not b.named("server_exited")


# -------------------------------------------------------------------- environment


async def test_env_merged_and_cwd(bridge: Any, tmp_path: Path) -> None:
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    server = {
        **faulty(),
        "env": {"FROM_CONFIG": "config-value", "OVERRIDDEN": "from-config"},
        "inherit_env": ["FROM_DAEMON", "OVERRIDDEN"],
        "cwd": str(workdir),
    }
    env = {"FROM_DAEMON": "daemon-value", "OVERRIDDEN": "from-daemon"}
    async with bridge({"servers": {"f": server}}, env=env) as b, RawSse(b.url("f")) as c:
        await c.initialize()
        got = {}
        for i, name in enumerate(("FROM_CONFIG", "FROM_DAEMON", "OVERRIDDEN", "PATH")):
            got[name] = text_of(await tool(c, "env", {"name": name}, request_id=i))
        assert got["FROM_CONFIG"] == "config-value"
        assert got["FROM_DAEMON"] == "daemon-value"
        assert got["OVERRIDDEN"] == "from-config"
        assert got["PATH"]
        assert Path(text_of(await tool(c, "cwd", request_id="cwd"))).resolve() == workdir.resolve()


# ------------------------------------------------------------------- per-session mode


async def test_per_session_processes(bridge: Any) -> None:
    async with bridge({"servers": {"f": {**faulty(), "mode": "per-session"}}}) as b:
        assert not b.named("server_started")  # nothing runs before a session asks
        a = RawSse(b.url("f"))
        await a.__aenter__()
        try:
            async with RawSse(b.url("f")) as z:
                for c, name in ((a, "client-a"), (z, "client-z")):
                    reply = await c.request(
                        "initialize",
                        {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": name, "version": "1"}},
                        request_id=1,
                    )
                    # The process answered this client's own initialize, with its requested version.
                    assert reply["result"]["protocolVersion"] == "2024-11-05"
                    assert reply["result"]["serverInfo"]["name"] == "faulty"
                    await c.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
                pid_a, pid_z = await server_pid(a), await server_pid(z)
                assert pid_a != pid_z
                assert {pid_a, pid_z} <= b.server_pids()
                for pid, name in ((pid_a, "client-a"), (pid_z, "client-z")):
                    seen = await b.wait_for("server_stderr", where=lambda e, p=pid: e["pid"] == p and stderr_note("initialize ")(e))
                    assert json.loads(seen["line"].split(" ", 2)[2])["client"] == name
                    # ... and its notifications/initialized too, rather than being absorbed.
                    await b.wait_for(
                        "server_stderr",
                        where=lambda e, p=pid: e["pid"] == p and stderr_note("notification notifications/initialized")(e),
                    )
                _, status = await get_json(b, "/status")
                assert status["servers"]["f"]["mode"] == "per-session"
                assert sorted(p["pid"] for p in status["servers"]["f"]["processes"]) == sorted([pid_a, pid_z])

                # The session ends: its process stops; the other one is untouched.
                session_a = a.session_id
                await a.close()
                await b.wait_for("session_closed", where=lambda e: e.get("session") == session_a)
                await b.wait_for("server_stopped", where=lambda e: e["pid"] == pid_a)
                assert not pid_alive(pid_a)
                assert pid_alive(pid_z)
                assert text_of(await tool(z, "echo", {"text": "z"}, request_id=2)) == "z"
                assert await server_pid(z, "again") == pid_z
            await b.wait_for("server_stopped", where=lambda e: e["pid"] == pid_z)
            assert not pid_alive(pid_z)
        finally:
            await a.close()


# ----------------------------------------------------------------------- signals


async def _shutdown_leaves_nothing(bridge: Any, sig: int) -> None:
    config = {
        "servers": {"a": faulty(), "b": faulty(), "p": {**faulty(), "mode": "per-session"}},
        "limits": {"drain_timeout": "1s"},
    }
    async with bridge(config) as b:
        async with RawSse(b.url("a")) as ca, RawSse(b.url("p")) as cp:
            await ca.initialize()
            await cp.initialize()
            pids = {await server_pid(ca), await server_pid(cp)}
            mark = len(b.events)
            status, _ = await ca.post({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": call("hang")})
            assert status == 202
            await b.wait_for("server_stderr", where=stderr_note("hang "), start=mark)
            pids |= b.server_pids()
            assert len(pids) == 3

            code = await b.stop(sig)
            assert code == 0, b.events[-5:]
            # Every stream was ended by the daemon.
            await ca.expect_end(timeout=5)
            await cp.expect_end(timeout=5)
        stopped = {e["pid"] for e in b.named("server_stopped")}
        assert stopped == pids, (stopped, pids)
        assert not [pid for pid in pids if pid_alive(pid)]
        # Closing stdin was enough (faulty exits on EOF): no signal escalation was needed.
        assert not b.named("server_stop_escalated"), b.named("server_stop_escalated")
        assert b.named("stopped")


async def test_sigterm_stops_everything(bridge: Any) -> None:
    await _shutdown_leaves_nothing(bridge, signal.SIGTERM)


async def test_sigint_stops_everything(bridge: Any) -> None:
    await _shutdown_leaves_nothing(bridge, signal.SIGINT)


# ------------------------------------------------------------------------ the CLI


async def run_cli(*args: str, timeout: float = 20.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "bridge", *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_check_good_config(tmp_path: Path) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump({"listen": {"port": 0}, "servers": {"f": faulty(), "g": {**faulty(), "mode": "per-session"}}}))
    code, out, err = await run_cli("--config", str(path), "--check")
    assert code == 0, (out, err)
    assert not err.strip() or "error" not in err.lower(), err


async def test_check_bad_config_lists_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "listen": {"port": 0},
                "limits": {"max_message_bytes": "lots", "request_timeout": "soon"},
                "sse": {"keepalive": "often"},
                "servers": {
                    "f": {**faulty(), "restart": {"window": "whenever"}, "mode": "sometimes", "colour": "blue"},
                    "g": {"args": ["x"]},
                },
            }
        )
    )
    code, out, err = await run_cli("--config", str(path), "--check")
    assert code == 2, (code, out, err)
    report = out + err
    for key in (
        "limits.max_message_bytes",
        "limits.request_timeout",
        "sse.keepalive",
        "servers.f.restart.window",
        "servers.f.mode",
        "servers.f.colour",
        "servers.g.command",
    ):
        assert key in report, f"{key} missing from:\n{report}"
    # One problem per line.
    problem_lines = [line for line in report.splitlines() if line.strip()]
    assert len(problem_lines) >= 7, report


async def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    code, out, err = await run_cli("--config", str(missing))
    assert code == 2, (code, out, err)
    assert str(missing) in out + err
    code, out, err = await run_cli("--config", str(missing), "--check")
    assert code == 2, (code, out, err)


async def test_port_in_use_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump({"listen": {"host": "127.0.0.1", "port": 0}, "servers": {"f": faulty()}}))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, err = await run_cli("--config", str(path), "--port", str(port))
    assert code == 1, (code, out, err)
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(e.get("event") == "startup_failed" for e in events), err
    # Whatever it started before failing to bind, it stopped.
    started = [e["pid"] for e in events if e.get("event") == "server_started"]
    assert not [pid for pid in started if pid_alive(pid)], started
