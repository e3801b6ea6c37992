"""The `mcpServers` JSON that MCP clients keep their servers in, read as a bridge config.

`{"mcpServers": {"NAME": {"command", "args", "env", "cwd"}}}` is the shape the
common clients write (desktop assistants, IDEs). Each stdio entry becomes a
`servers.NAME` of the YAML format with the same keys, so one validation
(config.py) serves both; its problems are then put back in this file's terms
(`mcpServers.NAME.args[0]`). Entries a bridge cannot serve are skipped, each
with a note naming its key path: remote servers (a `url`, or `type` sse or
http), which clients reach directly, and entries the client has `disabled`.
Keys only clients use (approval lists, timeouts) are ignored; any other key
is refused like an unknown key of the YAML format.
"""

from __future__ import annotations

from typing import Any

import yaml

KEY = "mcpServers"
SERVED = ("command", "args", "env", "cwd")
# Keys some clients add to an entry that say nothing about how to run it.
CLIENT_ONLY = frozenset({"type", "transportType", "disabled", "autoApprove", "alwaysAllow", "timeout", "description"})
REMOTE_TYPES = frozenset({"sse", "http", "streamable-http", "streamableHttp"})


def is_mcp_servers(data: Any) -> bool:
    return isinstance(data, dict) and KEY in data


def to_config(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The YAML format's data for an `mcpServers` document, and a note for each entry or key
    skipped. Entries that do not fit are passed on for config.py to report (its `servers.`
    problems come back through `in_file_terms`)."""
    entries = data[KEY]
    # Clients keep their own settings beside it (shortcuts, preferences): not the bridge's.
    notes = [f"{key}: ignored (only mcpServers is read from this file)" for key in data if key != KEY]
    if not isinstance(entries, dict):
        return {"servers": entries}, notes  # config.py reports the wrong shape, at mcpServers
    servers: dict[str, Any] = {}
    for name, entry in entries.items():
        where = f"{KEY}.{name}"
        if not isinstance(entry, dict):
            servers[name] = entry
            continue
        if entry.get("url") is not None or entry.get("type") in REMOTE_TYPES or entry.get("transportType") in REMOTE_TYPES:
            notes.append(f"{where}: skipped: a remote server (url {entry.get('url')!r}) is reached by clients directly, not served by a bridge")
            continue
        if entry.get("disabled") is True:
            notes.append(f"{where}: skipped: disabled")
            continue
        servers[name] = {k: v for k, v in entry.items() if k not in CLIENT_ONLY}
    return {"servers": servers}, notes


def in_file_terms(problem: str) -> str:
    """A problem of the converted data, with its key path as it is in the mcpServers file."""
    if problem.startswith("servers.") or problem.startswith("servers:"):
        return KEY + problem[len("servers") :]
    return problem


def to_yaml(converted: dict[str, Any], notes: list[str]) -> str:
    """`to_config`'s data as a YAML config (uninterpolated, as written), its notes as comments."""
    head = "".join(f"# {note}\n" for note in notes)
    return head + yaml.safe_dump(converted, sort_keys=False, default_flow_style=False, allow_unicode=True)
