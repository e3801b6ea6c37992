"""Every example in the README and the docs holds: Python compiles, JSON parses, shell parses
(`bash -n`), a YAML config passes the schema and the loader, and the one `docker run` is the
same wherever it is shown. (The quick start is run against a daemon in
tests/interop/test_readme_quickstart.py.)"""

from __future__ import annotations

import json
import re
import subprocess

import jsonschema
import pytest
import yaml
from support.daemon import ROOT
from support.snippets import Snippet, snippets

from bridge.config.jsonschema import config_schema
from bridge.config.load import parse

SNIPPETS = snippets()
VALIDATOR = jsonschema.Draft202012Validator(config_schema())


def of(*langs: str) -> list[Snippet]:
    return [s for s in SNIPPETS if s.lang in langs]


def check_python(snippet: Snippet) -> None:
    compile(snippet.text, str(snippet), "exec")


def check_shell(snippet: Snippet) -> None:
    done = subprocess.run(["bash", "-n"], input=snippet.text, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{snippet}: {done.stderr}"


def check_config(snippet: Snippet) -> None:
    data = yaml.safe_load(snippet.text)
    if not (isinstance(data, dict) and "servers" in data):
        return  # a fragment, not a config
    assert [e.message for e in VALIDATOR.iter_errors(data)] == [], str(snippet)
    text = re.sub(r"\$\{file:[^}]+\}", "v" * 32, snippet.text)  # a secret file: not here
    parse(text, str(snippet), {name: "v" * 32 for name in re.findall(r"\$\{(\w+)", text)})


def test_there_are_examples_of_each_kind() -> None:
    assert len(of("python")) >= 2 and of("sh") and of("yaml") and of("json")


@pytest.mark.parametrize("snippet", of("python"), ids=str)
def test_python_examples_compile(snippet: Snippet) -> None:
    check_python(snippet)


@pytest.mark.parametrize("snippet", of("json"), ids=str)
def test_json_examples_parse(snippet: Snippet) -> None:
    json.loads(snippet.text)


@pytest.mark.parametrize("snippet", of("sh", "bash"), ids=str)
def test_shell_examples_parse(snippet: Snippet) -> None:
    check_shell(snippet)


@pytest.mark.parametrize("snippet", of("yaml", "yml"), ids=str)
def test_config_examples_pass_the_schema_and_the_loader(snippet: Snippet) -> None:
    check_config(snippet)


def test_a_broken_example_of_each_kind_fails() -> None:
    here = ROOT / "README.md"
    with pytest.raises(SyntaxError):
        check_python(Snippet(here, 1, "python", "async with client() as c:\n    pass\n"))
    with pytest.raises(AssertionError):
        check_shell(Snippet(here, 1, "sh", "echo 'unclosed\n"))
    with pytest.raises(AssertionError):
        check_config(Snippet(here, 1, "yaml", "servers: {time: {command: uvx, mode: pooled}}\n"))


DOCKER_RUN = """\
export MCP_BRIDGE_TOKEN=$(openssl rand -hex 32) MCP_BRIDGE_METRICS_TOKEN=$(openssl rand -hex 32)
docker run -d --name mcp-bridge -p 127.0.0.1:8080:8080 \\
  -e MCP_BRIDGE_TOKEN -e MCP_BRIDGE_METRICS_TOKEN \\
  --read-only --tmpfs /tmp:exec,mode=1777,size=1g --tmpfs /home/mcp:exec,mode=1777 \\
  --cap-drop ALL --security-opt no-new-privileges --stop-timeout 45 \\
  mcp-bridge"""


@pytest.mark.parametrize(("path", "prefix"), [("README.md", ""), ("deploy/README.md", ""), ("docs/how-to/deploy.md", "  "), ("Dockerfile", "#   ")])
def test_one_docker_run_everywhere_it_is_shown(path: str, prefix: str) -> None:
    shown = "\n".join(prefix + line for line in DOCKER_RUN.split("\n"))
    assert shown in (ROOT / path).read_text()
