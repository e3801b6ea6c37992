"""A wrapper that stands for a new version of a stdio MCP server: `python tests/servers/upgraded.py
FILE -- COMMAND ARGS...` runs COMMAND and relays its stdio, and when FILE exists, rewrites the
tools its `tools/list` answers name (FILE: `{"tool name": {"field": new value}}`; a name the
server does not have is added as a new tool). With no FILE it is the server unchanged: the
test writes FILE to "upgrade" it, then restarts it. Stdlib only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any


def main() -> None:
    changes_file, command = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
    changes: dict[str, dict[str, Any]] = {}
    if os.path.exists(changes_file):
        with open(changes_file, encoding="utf-8") as f:
            changes = json.load(f)
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    listing: set[Any] = set()  # ids of the tools/list requests in flight
    lock = threading.Lock()

    def upstream() -> None:
        for line in sys.stdin.buffer:
            try:
                msg = json.loads(line)
                if isinstance(msg, dict) and msg.get("method") == "tools/list":
                    with lock:
                        listing.add(msg.get("id"))
            except ValueError:
                pass
            child.stdin.write(line)
            child.stdin.flush()
        child.stdin.close()

    threading.Thread(target=upstream, daemon=True).start()
    for line in child.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if isinstance(msg, dict) and "method" not in msg and isinstance(msg.get("result"), dict):
            with lock:
                ours = msg.get("id") in listing
                listing.discard(msg.get("id"))
            if ours and changes:
                tools = msg["result"].get("tools", [])
                names = {tool.get("name") for tool in tools}
                for tool in tools:
                    tool.update(changes.get(tool.get("name"), {}))
                tools += [{"name": name, "inputSchema": {"type": "object"}, **fields} for name, fields in changes.items() if name not in names]
                line = (json.dumps(msg) + "\n").encode()
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
