"""The mcpServers file (bridge/config/mcpservers.py) as a config: each stdio entry served with
its keys, remote and disabled entries skipped with a note, client-only keys dropped, problems
named in the file's own terms."""

from __future__ import annotations

import json

import pytest

from bridge.config.load import parse
from bridge.config.mcpservers import in_file_terms, to_config, to_yaml
from bridge.config.schema import ConfigError

FILE = {
    "mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}, "autoApprove": ["x"], "timeout": 30, "type": "stdio"},
        "remote": {"url": "https://example.com/mcp"},
        "typed": {"type": "streamable-http", "command": "x"},
        "off": {"command": "y", "disabled": True},
    },
    "globalShortcut": "Ctrl+Space",
}


def test_stdio_entries_are_served_with_their_keys_and_the_rest_is_noted() -> None:
    converted, notes = to_config(FILE)
    assert converted == {"servers": {"time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}}}}
    assert notes == [
        "globalShortcut: ignored (only mcpServers is read from this file)",
        "mcpServers.remote: skipped: a remote server (url 'https://example.com/mcp') is reached by clients directly, not served by a bridge",
        "mcpServers.typed: skipped: a remote server (url None) is reached by clients directly, not served by a bridge",
        "mcpServers.off: skipped: disabled",
    ]


def test_a_key_no_client_uses_is_refused_in_the_files_terms() -> None:
    converted, _ = to_config({"mcpServers": {"time": {"command": "uvx", "restart_policy": "always"}}})
    with pytest.raises(ConfigError) as info:
        parse(json.dumps(converted), "c.json", {})
    assert [in_file_terms(p) for p in info.value.problems] == ["mcpServers.time.restart_policy: unknown key (did you mean 'restart'?)"]


def test_the_yaml_it_prints_carries_the_notes_as_comments() -> None:
    converted, notes = to_config(FILE)
    text = to_yaml(converted, notes)
    assert text.startswith("# globalShortcut: ignored") and "servers:\n  time:\n    command: uvx\n" in text
