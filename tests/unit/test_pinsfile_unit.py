"""The pins file (bridge/gateway/pinsfile.py) with no daemon: read, written whole, reloaded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bridge.core.pins import Listed, PinsError
from bridge.gateway import pinsfile
from bridge.gateway.pinsfile import PinsFile, ReadOnly
from bridge.metrics import ServerMetrics


def tool(description: str) -> dict[str, Any]:
    return {"name": "add", "description": description, "inputSchema": {"type": "object"}}


def test_a_reload_keeps_what_is_pending_unless_the_file_now_pins_it(tmp_path: Path) -> None:
    path = str(tmp_path / "pins.json")
    store = PinsFile.open(path)
    gate = store.gate("s", "hold")
    assert gate is not None and store.gate("s", "off") is None
    metrics = ServerMetrics("s")
    store.seen("s", gate.see("tools/list", {"tools": [tool("v1")]}) or pytest.fail("no list"), metrics)
    assert json.loads(Path(path).read_text())["servers"]["s"]["tools"]["add"]["fields"]["description"] == "v1"
    gate.see("tools/list", {"tools": [tool("v2")]})
    assert gate.withheld == {"tools": frozenset({"add"})}
    store.reload()  # the file as it was: v2 stays pending
    assert store.gate("s", "hold") is gate and gate.withheld == {"tools": frozenset({"add"})}
    other = PinsFile(path, {})  # another replica approves v2 in the file
    other_gate = other.gate("s", "hold")
    assert other_gate is not None
    other_gate.see("tools/list", {"tools": [tool("v2")]})
    other.save()
    store.reload()
    assert gate.withheld == {"tools": frozenset()} and gate.pins.pinned[Listed.TOOL]["add"].fields["description"] == "v2"


def test_a_file_that_is_wrong_names_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"version": 2, "servers": {}}))
    with pytest.raises(PinsError, match=r'pins\.path: .*expected \{"version": 1'):
        PinsFile.open(str(path))


def test_a_read_only_file_is_not_written_and_nothing_else_is_left_behind(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    pinsfile.write(str(path), "{}\n")
    os.chmod(path, 0o444)
    with pytest.raises(ReadOnly, match="read-only"):
        pinsfile.write(str(path), "changed\n")
    assert path.read_text() == "{}\n" and sorted(p.name for p in tmp_path.iterdir()) == ["pins.json"]
    os.chmod(path, 0o640)
    pinsfile.write(str(path), "changed\n")
    assert path.read_text() == "changed\n" and os.stat(path).st_mode & 0o777 == 0o640  # its mode kept
