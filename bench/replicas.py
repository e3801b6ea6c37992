"""Replicas behind nginx, as one process tree for bench/run.py's `nginx-*` targets.

Starts N mcp-bridge replicas (one cluster: a shared peer key, each advertising
its own loopback port, each serving bench/server.py as run.py's `bridge`
target does) and nginx in front of them (tests/support/balancer.py's config: round
robin, no buffering), prints `{"port": P}` once all answer, and stays until
SIGTERM or SIGINT, which it passes on. Every process is its child, so run.py
samples the CPU and memory of all of them together.

    python -m bench.replicas --replicas 3 --workdir DIR        # round robin over 3
    python -m bench.replicas --replicas 2 --forward --workdir DIR

`--forward` measures what forwarding costs: nginx sends every request that
opens a session (GET .../sse, and a POST .../mcp with no Mcp-Session-Id) to
replica 1 and every other request to replica 2, which forwards it to replica
1. With `--replicas 1` and no `--forward` every request is local: the same
balancer in front, no hop.
"""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from bench import run  # the bridge config and the readiness checks of its `bridge` target
from tests.support import balancer  # nginx's config, shared with the tests

# Replica 1 opens every session, replica 2 takes every other request (and forwards it).
FORWARD_ROUTING = """
    map "$uri|$http_mcp_session_id" $replica {
        "~/sse\\|$"  opener;
        "~/mcp\\|$"  opener;
        default     forwarder;
    }
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--forward", action="store_true", help="every message request through a replica that forwards it (needs 2)")
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    if args.forward and args.replicas != 2:
        p.error("--forward needs --replicas 2")
    workdir = Path(args.workdir)
    key = secrets.token_hex(32)
    ports = [run.free_port() for _ in range(args.replicas)]
    children: list[subprocess.Popen[bytes]] = []
    try:
        for i, port in enumerate(ports):
            config = workdir / f"replica{i + 1}.yaml"
            run.bridge_config(str(config))
            with open(config, "a") as f:
                f.write(f"cluster: {{peer_key: {key}}}\n")
            logfile = str(workdir / f"replica{i + 1}.log")
            command = [sys.executable, "-m", "bridge", "--config", str(config), "--port", str(port), "--advertise", f"127.0.0.1:{port}"]
            children.append(run.spawn(command, logfile, cwd=run.ROOT))
            run.wait_ready(lambda port=port: run.http_get(port, "/readyz") == 200, children[-1], f"replica {i + 1}", logfile)
        port = balancer.free_port()
        if args.forward:
            command = balancer.write_config(workdir / "nginx", port, {"opener": ports[:1], "forwarder": ports[1:]}, "$replica", FORWARD_ROUTING)
        else:
            command = balancer.write_config(workdir / "nginx", port, {"bridges": ports})
        nginx_log = str(workdir / "nginx" / "error.log")
        children.append(run.spawn(command, str(workdir / "nginx.out")))
        run.wait_ready(lambda: run.http_get(port, "/healthz") == 200, children[-1], "nginx", nginx_log)
        print(json.dumps({"port": port, "replicas": ports}), flush=True)
        stop = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # only now: children inherit the mask
        signal.sigwait(stop)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            child.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
