"""The config's JSON Schema (bridge/config/jsonschema.py): current, valid, and in agreement
with the loader on what a config may look like."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from bridge.config.jsonschema import config_schema, render
from bridge.config.load import parse
from bridge.config.schema import ConfigError

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "config" / "servers.schema.json"
SHIPPED = [ROOT / "config" / "servers.yaml", ROOT / "config" / "docker.yaml", ROOT / "deploy" / "replicas" / "servers.yaml"]
VALIDATOR = jsonschema.Draft202012Validator(config_schema())
SERVER = {"command": "uvx", "args": ["mcp-server-time"]}


def test_the_committed_schema_is_the_generated_one() -> None:
    assert COMMITTED.read_text() == render(), "the config's types changed: run `mcp-bridge config schema > config/servers.schema.json`"


def test_it_is_a_valid_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(COMMITTED.read_text()))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_names_the_schema_and_passes_it(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema="), "editors find the schema by this line"
    assert (path.parent / first.split("=", 1)[1]).resolve() == COMMITTED
    assert list(VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))) == []


def config(**top: Any) -> dict[str, Any]:
    return {"servers": {"time": SERVER}, **top}


def server(**keys: Any) -> dict[str, Any]:
    return {"servers": {"time": {**SERVER, **keys}}}


ACCEPTED = [
    config(),
    config(listen={"port": "${PORT}"}),  # filled in by the loader
    server(shutdown_timeout="250ms", attribution_window=0.1, rlimits={"memory": "512MiB", "cpu_time": "1h", "nice": 19}),
    server(mode="per-session", pool={"warm": 2, "max": 8, "wait": "10s"}, user=1000, group="nogroup"),
    config(limits={"max_message_bytes": "4MiB", "request_timeout": "5m"}, security={"tokens": [{"name": "ops", "token": "${OPS_TOKEN}"}]}),
]

REFUSED = [
    ({"listen": {"port": 8080}}, "servers is required"),
    (config(extra=1), "an unknown top-level key"),
    (server(commands="x"), "an unknown server key"),
    (config(listen={"port": 70000}), "a port over 65535"),
    (config(listen={"port": "eighty"}), "a port that is not a number"),
    (server(mode="pooled"), "a mode that does not exist"),
    (server(shutdown_timeout="5 minutes"), "a duration in no unit it knows"),
    (server(rlimits={"memory": "4 MeB"}), "a size in no unit it knows"),
    (server(rlimits={"nice": 20}), "a nice value over 19"),
    (server(max_sessions=0), "a count under one"),
    ({"servers": {"my server": SERVER}}, "a server name with a space"),
    ({"servers": {"time": {"args": ["x"]}}}, "a server with no command"),
    (server(args="mcp-server-time"), "args that is not a list"),
]


@pytest.mark.parametrize("data", ACCEPTED, ids=range(len(ACCEPTED)))
def test_what_the_loader_takes_the_schema_takes(data: dict[str, Any]) -> None:
    parse(json.dumps(data), "t.json", {"PORT": "9000", "OPS_TOKEN": "o" * 32})
    assert [e.message for e in VALIDATOR.iter_errors(data)] == []


@pytest.mark.parametrize(("data", "what"), REFUSED, ids=[what for _, what in REFUSED])
def test_what_the_loader_refuses_for_its_shape_the_schema_refuses(data: dict[str, Any], what: str) -> None:
    with pytest.raises(ConfigError):
        parse(json.dumps(data), "t.json", {})
    assert list(VALIDATOR.iter_errors(data)), f"the schema takes {what}"


def test_a_keys_description_is_the_comment_beside_it_in_the_types() -> None:
    props = config_schema()["properties"]["servers"]["additionalProperties"]["properties"]
    assert props["inherit_env"]["description"] == "daemon variables passed on, beyond the minimal ones"
    assert props["shutdown_timeout"]["default"] == 5.0 and props["mode"]["default"] == "shared"


def test_the_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    from bridge.cli import main

    assert main(["config", "schema"]) == 0
    assert capsys.readouterr().out == render()
