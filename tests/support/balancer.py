"""nginx (Debian's nginx-light) as a plain load balancer in front of replicas: round robin, no affinity.

`nginx_in_front(tmp, ports)` runs it in the foreground on a free loopback port,
with every path of its own under `tmp`, and stops it (SIGQUIT, then SIGKILL) on
exit; `write_config` is its config, which bench/replicas.py shares. `NGINX` is None where nginx is not installed: the tests that need it skip.
Streams pass unbuffered both ways, as any balancer in front of MCP must be set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
MISSING = "nginx is not installed (Debian: apt-get install nginx-light; .ci/run installs it)"

CONFIG = """
worker_processes 1;
worker_shutdown_timeout 2s;
daemon off;
pid {home}/nginx.pid;
error_log {home}/error.log warn;
{user}
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {home}/body;
    proxy_temp_path {home}/proxy;
    fastcgi_temp_path {home}/fastcgi;
    uwsgi_temp_path {home}/uwsgi;
    scgi_temp_path {home}/scgi;
{upstreams}
{http_extra}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://{pass_to};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
            proxy_connect_timeout 1s;
            proxy_next_upstream error timeout;
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _accepting(port: int, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.02)  # not bound yet: nginx logs nothing we could wait on
                continue
            writer.close()
            return


def write_config(home: Path, port: int, upstreams: Mapping[str, Sequence[int]], pass_to: str = "bridges", http_extra: str = "") -> list[str]:
    """nginx.conf under `home`, listening on `port`: each upstream round robin over its loopback
    ports, requests passed to `pass_to` (an upstream, or a variable `http_extra` sets, as
    bench/replicas.py does); the command line that runs it in the foreground."""
    assert NGINX is not None, MISSING
    home.mkdir(parents=True, exist_ok=True)
    blocks = [
        f"    upstream {name} {{\n" + "".join(f"        server 127.0.0.1:{p} max_fails=0;\n" for p in ports) + "        keepalive 64;\n    }"
        for name, ports in upstreams.items()
    ]
    conf = home / "nginx.conf"
    conf.write_text(
        CONFIG.format(
            home=home,
            port=port,
            user="user root;" if os.geteuid() == 0 else "",  # its workers read the paths under home
            upstreams="\n".join(blocks),
            http_extra=http_extra,
            pass_to=pass_to,
        )
    )
    return [NGINX, "-p", str(home), "-c", str(conf), "-e", str(home / "error.log")]


@contextlib.asynccontextmanager
async def nginx_in_front(home: Path, ports: Sequence[int]) -> AsyncIterator[int]:
    """nginx balancing over the replicas on `ports`; yields the port it listens on."""
    port = free_port()
    command = write_config(home, port, {"bridges": ports})
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        await _accepting(port, 10)
        yield port
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGQUIT)  # graceful: ends its workers too
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
