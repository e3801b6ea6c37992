"""A misbehaving stdio MCP server for fault-injection tests.

Run as ``python tests/servers/faulty.py``. Each tool triggers one failure mode
the bridge must survive: crashes, hangs, stderr floods, junk on stdout, huge
replies and slow replies. Stdlib-only and self-contained so it runs from any cwd.

Everything the bridge sends that a test may need to observe is also noted on
stderr (which the bridge logs as `server_stderr` events), one line each:
  faulty: notification <method> <params as JSON>   every notification received
  faulty: initialize <{"client", "requested", "answered", "capabilities"} as JSON>
  faulty: hang <id> / faulty: slow <id>            the upstream id of such a call
  faulty: ping <id>                                a ping that reached the process
  faulty: response <message as JSON>               an answer to a request it sent (see `emit`)

Hostile-input tests send it arbitrary requests, so anything it cannot handle is
answered with -32603 (or ignored, for a line it cannot parse) instead of
killing the process; only `crash` exits.

Environment switches:
  FAULTY_CRASH_ON_START=1  exit with code 4 before reading anything (crash loops)
  FAULTY_NO_INIT=1         never answer initialize (init timeouts)
  FAULTY_INIT_ERROR=1      answer initialize with error -32602 (a version it refuses)
  FAULTY_SILENT_DISCOVER=1 never answer server/discover (a legacy server the era probe must wait out)
  FAULTY_PID_VERSION=1     say `1.0.<pid>` as serverInfo.version (each process a new version)
  FAULTY_PAGE_SIZE=N       list the tools N a page (the cursor is the offset)
  FAULTY_SLOW_LIST_MS=N    answer tools/list after N ms (and nothing else meanwhile)
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, TypeAlias

JSON: TypeAlias = dict[str, Any]

SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
DEFAULT_BIG_BYTES = 5 * 1024 * 1024
MIB = 1024 * 1024

_out = sys.stdout.buffer
_out_lock = threading.Lock()


def write_lines(*lines: str) -> None:
    # Hold the lock across all lines so a multi-line burst (garbage) stays contiguous
    # and concurrent replies never interleave mid-line.
    with _out_lock:
        for line in lines:
            _out.write(line.encode("utf-8") + b"\n")
        _out.flush()


def send(message: JSON) -> None:
    write_lines(json.dumps(message, separators=(",", ":")))


def write_raw(*lines: bytes) -> None:
    with _out_lock:
        for line in lines:
            _out.write(line + b"\n")
        _out.flush()


def reply(request_id: Any, result: JSON) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def reply_error(request_id: Any, code: int, message: str) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})


def note(line: str) -> None:
    """One line on stderr, for tests that watch the bridge's server_stderr events."""
    sys.stderr.write(f"faulty: {line}\n")
    sys.stderr.flush()


def text(value: str) -> JSON:
    return {"content": [{"type": "text", "text": value}]}


def _schema(**props: str) -> JSON:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}


TOOLS = [
    {"name": "echo", "description": "Return text.", "inputSchema": _schema(text="string")},
    {
        "name": "routed",
        "description": "Return region, which 2026-07-28 clients mirror in an Mcp-Param-Region header.",
        "inputSchema": {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}},
    },
    {"name": "crash", "description": "Exit with code 3 without replying.", "inputSchema": _schema()},
    {"name": "orphan", "description": "Fork a child that sleeps `s` seconds in the server's group; reply with its pid.", "inputSchema": _schema(s="number")},
    {"name": "hang", "description": "Never reply.", "inputSchema": _schema()},
    {"name": "noise", "description": "Write N junk lines to stderr.", "inputSchema": _schema(lines="integer")},
    {"name": "garbage", "description": "Write junk to stdout, then reply.", "inputSchema": _schema()},
    {"name": "big", "description": "Reply with N 'x' characters.", "inputSchema": _schema(bytes="integer")},
    {"name": "slow", "description": "Reply after N ms.", "inputSchema": _schema(ms="integer")},
    {"name": "pid", "description": "Return the process id.", "inputSchema": _schema()},
    {"name": "env", "description": "Return an environment variable.", "inputSchema": _schema(name="string")},
    {"name": "environ", "description": "Return the whole environment as a JSON object.", "inputSchema": _schema()},
    {"name": "cwd", "description": "Return the working directory.", "inputSchema": _schema()},
    {"name": "deaf", "description": "Reply, then never read stdin again.", "inputSchema": _schema()},
    {"name": "burn", "description": "Spin on the CPU, never replying (until a limit stops it).", "inputSchema": _schema()},
    {"name": "files", "description": "Open files until refused; reply with how many it could.", "inputSchema": _schema()},
    {
        "name": "hog",
        "description": "Allocate (and touch) 1 MiB at a time, up to `mib`; die as a server does when an allocation fails.",
        "inputSchema": _schema(mib="integer"),
    },
    {
        "name": "forkbomb",
        "description": "Fork up to `count` children, each sleeping `ms`; die as a server does when a fork is refused.",
        "inputSchema": _schema(count="integer", ms="integer"),
    },
    {"name": "write", "description": "Write `text` to the file `path`; reply ok or the error.", "inputSchema": _schema(path="string", text="string")},
    {
        "name": "connect",
        "description": "Open a TCP connection to `host`:`port`; reply connected or the error.",
        "inputSchema": _schema(host="string", port="integer"),
    },
    {
        "name": "grow",
        "description": "Add tools named `names` (each echoes), send tools/list_changed, then reply.",
        "inputSchema": _schema(names="array"),
    },
    {
        "name": "later",
        "description": "Reply now; after `ms`, with no call in flight, write each of `lines` to stdout.",
        "inputSchema": _schema(ms="integer", lines="array"),
    },
    {
        "name": "emit",
        "description": "Write each of `lines` (text) and `raw` (base64 bytes) to stdout as a line (in one write), then reply (after `ms`, if given).",
        "inputSchema": _schema(lines="array", raw="array", ms="integer"),
    },
]


GROWN: set[str] = set()


def call_tool(request_id: Any, name: str, args: JSON) -> None:
    if name == "echo":
        reply(request_id, text(str(args.get("text", ""))))
    elif name == "routed":
        reply(request_id, text(str(args.get("region", ""))))
    elif name == "crash":
        sys.stderr.flush()
        os._exit(3)
    elif name == "orphan":
        pid = os.fork()
        if pid == 0:
            time.sleep(float(args.get("s", 60)))
            os._exit(0)
        reply(request_id, text(str(pid)))
    elif name == "hang":
        note(f"hang {json.dumps(request_id)}")  # deliberately never answered
    elif name == "noise":
        for i in range(int(args.get("lines", 1000))):
            sys.stderr.write(f"noise {i}: lorem ipsum dolor sit amet, consectetur adipiscing elit\n")
        sys.stderr.flush()
        reply(request_id, text("ok"))
    elif name == "garbage":
        write_lines(
            "this is not json",
            '{"jsonrpc": "2.0", "id": 1, "result": {',
            "",
            json.dumps({"jsonrpc": "2.0", "id": 999999999, "result": {}}),
        )
        reply(request_id, text("ok"))
    elif name == "big":
        reply(request_id, text("x" * int(args.get("bytes", DEFAULT_BIG_BYTES))))
    elif name == "slow":
        # A timer keeps the reader loop free, so other requests are served meanwhile.
        delay = int(args.get("ms", 1000)) / 1000
        note(f"slow {json.dumps(request_id)}")
        threading.Timer(delay, reply, args=(request_id, text("slept"))).start()
    elif name == "pid":
        reply(request_id, text(str(os.getpid())))
    elif name == "env":
        reply(request_id, text(os.environ.get(str(args.get("name", "")), "")))
    elif name == "environ":
        reply(request_id, text(json.dumps(dict(os.environ))))
    elif name == "cwd":
        reply(request_id, text(os.getcwd()))
    elif name == "grow":
        for new in args.get("names") or []:
            TOOLS.append({"name": str(new), "description": "Grown by grow.", "inputSchema": _schema(text="string")})
            GROWN.add(str(new))
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        reply(request_id, text("grown"))
    elif name in GROWN:
        reply(request_id, text(f"{name}: {args.get('text', '')}"))
    elif name == "later":
        lines = [str(line) for line in args.get("lines") or []]
        reply(request_id, text("later"))
        threading.Timer(int(args.get("ms", 100)) / 1000, write_lines, args=lines).start()
    elif name == "burn":
        while True:
            pass
    elif name == "files":
        opened = []
        try:
            while len(opened) < 100_000:
                opened.append(open(os.devnull))  # noqa: SIM115 (closed below)
        except OSError:
            pass
        reply(request_id, text(str(len(opened))))
        for f in opened:
            f.close()
    elif name == "hog":
        hoard = []
        try:
            while len(hoard) < int(args.get("mib", 16384)):
                hoard.append(b"x" * MIB)  # written, so the pages are really used
        except MemoryError:
            del hoard
            traceback.print_exc()
            os._exit(1)
        reply(request_id, text(f"allocated {len(hoard)} MiB"))
    elif name == "forkbomb":
        forkbomb(request_id, int(args.get("count", 2000)), int(args.get("ms", 2000)) / 1000)
    elif name == "write":
        try:
            with open(str(args["path"]), "w") as file:
                file.write(str(args.get("text", "written")))
            reply(request_id, text("ok"))
        except OSError as exc:
            reply(request_id, text(f"error: {exc.strerror}"))
    elif name == "connect":
        try:
            socket.create_connection((str(args.get("host", "127.0.0.1")), int(args["port"])), timeout=5).close()
            reply(request_id, text("connected"))
        except OSError as exc:
            reply(request_id, text(f"error: {exc.strerror or exc}"))
    elif name == "deaf":
        reply(request_id, text("deaf"))
        note("deaf")
        time.sleep(3600)  # the reader loop stops here: stdin fills up
    elif name == "emit":
        lines = [str(line).encode("utf-8", "surrogatepass") for line in args.get("lines") or []]
        lines += [base64.b64decode(str(item)) for item in args.get("raw") or []]
        write_raw(*lines)
        if args.get("ms"):
            threading.Timer(int(args["ms"]) / 1000, reply, args=(request_id, text("ok"))).start()
        else:
            reply(request_id, text("ok"))
    else:
        reply_error(request_id, -32602, f"Unknown tool: {name}")


def forkbomb(request_id: Any, count: int, hold: float) -> None:
    """Bounded: at most `count` children, each gone after `hold` seconds. A refused fork
    kills and reaps those made (a container's init may reap no orphans, and zombies would
    count against the user's process limit), prints the error and exits."""
    children: list[int] = []
    try:
        while len(children) < count:
            pid = os.fork()
            if pid == 0:
                time.sleep(hold)
                os._exit(0)
            children.append(pid)
    except OSError:
        traceback.print_exc()
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        sys.stderr.flush()
        os._exit(1)
    for pid in children:
        os.waitpid(pid, 0)
    reply(request_id, text(f"forked {len(children)}"))


def handle(message: JSON) -> None:
    method, request_id = message.get("method"), message.get("id")
    if method is None:  # a response to a request of ours
        note(f"response {json.dumps(message, separators=(',', ':'))}")
        return
    params = message.get("params") or {}
    if "id" not in message:
        note(f"notification {method} {json.dumps(params, separators=(',', ':'))}")
        return
    if method == "initialize":
        requested = params.get("protocolVersion")
        answered = requested if requested in SUPPORTED_VERSIONS else SUPPORTED_VERSIONS[-1]
        client = (params.get("clientInfo") or {}).get("name")
        seen = {"client": client, "requested": requested, "capabilities": params.get("capabilities")}
        if os.environ.get("FAULTY_NO_INIT") == "1":
            note(f"initialize {json.dumps({**seen, 'answered': None})}")
            return
        if os.environ.get("FAULTY_INIT_ERROR") == "1":
            note(f"initialize {json.dumps({**seen, 'answered': None})}")
            reply_error(request_id, -32602, f"Unsupported protocol version: {requested}")
            return
        note(f"initialize {json.dumps({**seen, 'answered': answered})}")
        reply(
            request_id,
            {
                "protocolVersion": answered,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "faulty", "version": f"1.0.{os.getpid()}" if os.environ.get("FAULTY_PID_VERSION") == "1" else "1.0.0"},
            },
        )
    elif method == "server/discover" and os.environ.get("FAULTY_SILENT_DISCOVER") == "1":
        note("discover ignored")
    elif method == "ping":
        note(f"ping {json.dumps(request_id)}")
        reply(request_id, {})
    elif method == "tools/list":
        time.sleep(int(os.environ.get("FAULTY_SLOW_LIST_MS", "0")) / 1000)
        size = int(os.environ.get("FAULTY_PAGE_SIZE", "0")) or len(TOOLS)
        start = int(params.get("cursor") or 0)
        page: JSON = {"tools": TOOLS[start : start + size]}
        if start + size < len(TOOLS):
            page["nextCursor"] = str(start + size)
        reply(request_id, page)
    elif method == "tools/call":
        try:
            call_tool(request_id, str(params.get("name")), params.get("arguments") or {})
        except (TypeError, ValueError) as exc:
            reply_error(request_id, -32602, f"Invalid arguments: {exc}")
    else:
        reply_error(request_id, -32601, f"Method not found: {method}")


def main() -> None:
    if os.environ.get("FAULTY_CRASH_ON_START") == "1":
        sys.stderr.write("faulty: crashing on start as requested\n")
        sys.stderr.flush()
        os._exit(4)
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(message, dict):
            try:
                handle(message)
            except Exception as exc:  # hostile arguments: answer, never die
                request_id = message.get("id")
                if "method" in message and isinstance(request_id, (int, str)) and not isinstance(request_id, bool):
                    reply_error(request_id, -32603, f"internal error: {type(exc).__name__}")
    # os._exit so pending slow-reply timers can't delay exit on EOF.
    os._exit(0)


if __name__ == "__main__":
    main()
