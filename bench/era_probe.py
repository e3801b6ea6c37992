"""What the era probe costs a server: the round trip of `server/discover` on a running
server (the bridge sends it once per process start, before `initialize`).

    python -m bench.era_probe [RUNS]

Each server is started, initialized, then sent RUNS `server/discover` requests one at a
time; prints the median round trip. (Timing a whole start with and without the probe
measures start-up noise: tens to hundreds of ms on a busy machine, against this.)
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EVERYTHING = Path(__file__).resolve().parent.parent / "tests/node/node_modules/.bin/mcp-server-everything"
SERVERS = {
    "demo (legacy)": [sys.executable, "-m", "bridge.demo_server"],
    "mcp-server-time (both eras)": [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"],
    "server-everything (legacy)": [str(EVERYTHING)],
}
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "era-probe", "version": "1"}}


def round_trip(proc: subprocess.Popen[bytes], request_id: str, method: str, params: dict[str, Any]) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    started = time.perf_counter()
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode() + b"\n")
    proc.stdin.flush()
    while json.loads(proc.stdout.readline()).get("id") != request_id:
        pass
    return time.perf_counter() - started


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 51
    for name, command in SERVERS.items():
        if shutil.which(command[0]) is None:
            print(f"{name:30} skipped: {command[0]} not found")
            continue
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            round_trip(proc, "init", "initialize", INIT)
            times = [round_trip(proc, f"d{i}", "server/discover", {"_meta": META}) for i in range(runs)]
        finally:
            proc.kill()
            proc.wait()
        print(f"{name:30} server/discover round trip: median {statistics.median(times) * 1000:.2f} ms over {runs}")


if __name__ == "__main__":
    main()
