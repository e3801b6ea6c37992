"""A server's environment (bridge/process/env.py): the minimal names, what `inherit_env` lets
through, the server's own `env` over them, and nothing else of the daemon's."""

from __future__ import annotations

import os
import sys

from bridge.config.schema import Server
from bridge.process.env import child_env

DAEMON = {
    "PATH": "/usr/bin:/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
    "MCP_BRIDGE_TOKEN": "daemon-secret", "AWS_SECRET_ACCESS_KEY": "aws-secret", "AWS_REGION": "eu-west-1",
    "DATABASE_URL": "postgres://secret", "NPM_CONFIG_TOKEN": "npm-secret",
}  # fmt: skip


def test_only_the_minimal_names_and_prefixes_reach_a_server() -> None:
    env = child_env(Server(command="x"), DAEMON)
    assert {"HOME", "LC_ALL", "LANG"} <= env.keys()
    assert not {"MCP_BRIDGE_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "DATABASE_URL", "NPM_CONFIG_TOKEN"} & env.keys()


def test_inherit_env_names_and_prefixes_let_more_through() -> None:
    env = child_env(Server(command="x", inherit_env=("AWS_*", "DATABASE_URL")), DAEMON)
    assert env["AWS_REGION"] == "eu-west-1" and env["AWS_SECRET_ACCESS_KEY"] == "aws-secret" and env["DATABASE_URL"] == "postgres://secret"
    assert "MCP_BRIDGE_TOKEN" not in env and "NPM_CONFIG_TOKEN" not in env


def test_the_servers_own_env_wins() -> None:
    env = child_env(Server(command="x", env={"LANG": "de_DE.UTF-8", "API_KEY": "k"}), DAEMON)
    assert env["LANG"] == "de_DE.UTF-8" and env["API_KEY"] == "k"


def test_the_bridges_own_bin_is_appended_and_shadows_nothing() -> None:
    own = os.path.dirname(sys.executable)
    env = child_env(Server(command="x"), DAEMON)
    assert env["PATH"] == f"/usr/bin:/bin{os.pathsep}{own}"
    assert child_env(Server(command="x"), {**DAEMON, "PATH": f"{own}:/usr/bin"})["PATH"] == f"{own}:/usr/bin"
