"""The generated reference (docs/reference/, by docs/generate.py) cannot drift from the code:
it is current (tests/release/test_layers.py runs `docs/generate.py --check`), and a key
the config types gain with no description anywhere stops the generator."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from support.daemon import ROOT


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_generate"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["docs_generate"]
    return module


def test_every_key_of_the_types_is_in_the_reference_with_its_default() -> None:
    text = (ROOT / "docs" / "reference" / "config.md").read_text()
    for row in ("| `limits.max_message_bytes` | size | `4194304` |", "| `servers.NAME.mode` |", "| `cluster.peer_key_file` |"):
        assert row in text


def test_a_key_with_no_description_stops_the_generator(tmp_path: Path) -> None:
    docs = generator()
    keys = yaml.safe_load(docs.KEYS.read_text())
    del keys["servers.NAME.command"]  # as if the types had just gained it
    docs.KEYS = tmp_path / "keys.yaml"
    docs.KEYS.write_text(yaml.safe_dump(keys))
    with pytest.raises(SystemExit, match=r"describe servers\.NAME\.command"):
        docs.config_reference()


def test_a_description_of_a_key_the_types_lack_stops_it_too(tmp_path: Path) -> None:
    docs = generator()
    keys = yaml.safe_load(docs.KEYS.read_text())
    keys["limits.max_sesions"] = "a typo"
    docs.KEYS = tmp_path / "keys.yaml"
    docs.KEYS.write_text(yaml.safe_dump(keys))
    with pytest.raises(SystemExit, match=r"no such key: limits\.max_sesions"):
        docs.config_reference()


def test_an_event_the_code_logs_with_no_description_stops_the_generator(tmp_path: Path) -> None:
    docs = generator()
    events = yaml.safe_load(docs.EVENTS.read_text())
    del events["session_too_slow"]  # as if the code had just begun to log it
    docs.EVENTS = tmp_path / "events.yaml"
    docs.EVENTS.write_text(yaml.safe_dump(events))
    with pytest.raises(SystemExit, match="describe session_too_slow"):
        docs.logs_reference()


def test_the_log_reference_reads_levels_and_fields_off_the_code() -> None:
    text = (ROOT / "docs" / "reference" / "logs.md").read_text()
    assert "| `session_too_slow` | warning | `queue_bytes`, `queue_limit`, `session` | gateway/gateway.py, gateway/group.py |" in text


def test_the_metrics_reference_is_what_a_registry_exposes() -> None:
    text = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    assert "| `mcp_bridge_sessions_opened_total` | counter | `server`, `transport` | always |" in text
    assert "| `mcp_bridge_oauth_tokens_total` | counter | `outcome` | with `security.oauth` |" in text
    assert "| `mcp_bridge_forwarded_requests_total` | counter | `outcome` | with `cluster` |" in text


def test_a_code_the_protocol_layer_gains_with_no_description_stops_the_generator(tmp_path: Path) -> None:
    docs = generator()
    codes = yaml.safe_load(docs.CODES.read_text())
    del codes["SERVER_BUSY"]
    docs.CODES = tmp_path / "codes.yaml"
    docs.CODES.write_text(yaml.safe_dump(codes))
    with pytest.raises(SystemExit, match="describe SERVER_BUSY"):
        docs.errors_reference()


# An HTTP status the bridge answers with: an `HttpError`, a `Refusal` or an aiohttp
# response given one. 1xx-3xx are not errors.
_STATUS = re.compile(r"(?:HttpError|Refusal)\(\s*([45]\d\d)\b|\bstatus=([45]\d\d)\b")


def statuses_in(source: str) -> set[int]:
    return {int(a or b) for a, b in _STATUS.findall(source)}


def test_every_http_error_status_the_bridge_answers_with_is_in_the_reference() -> None:
    """docs/reference/http-errors.md is written by hand; a status the code gains that it
    lacks fails here (and a planted one is seen)."""
    table = (ROOT / "docs" / "reference" / "http-errors.md").read_text()
    documented = {int(line[2:5]) for line in table.splitlines() if line[:2] == "| " and line[2:5].isdigit()}
    sent: set[int] = set()
    for path in (ROOT / "bridge").rglob("*.py"):
        sent |= statuses_in(path.read_text())
    assert {400, 401, 403, 404, 413, 503} <= sent  # the scan sees the code's statuses
    assert sent - documented == set(), f"statuses the bridge sends that docs/reference/http-errors.md lacks: {sorted(sent - documented)}"
    assert statuses_in('raise HttpError(418, -32600, "teapot")') == {418}  # a planted one would be caught
