"""Config loading: interpolation, every problem with its key path, frozen results."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from bridge.config.load import build, load, parse
from bridge.config.schema import Config, ConfigError, Duration, Size, group_members, is_loopback

MINIMAL = "servers: {time: {command: uvx, args: [mcp-server-time]}}\n"


def problems(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, "t.yaml", env or {})
    return info.value.problems


def test_defaults_fill_everything_not_given() -> None:
    config = parse(MINIMAL, environ={})
    assert config.listen.host == "127.0.0.1" and config.listen.port == 8080
    assert config.limits.max_message_bytes == 4 * 1024 * 1024
    assert config.limits.request_timeout == 300
    assert config.sse.keepalive == 15
    server = config.servers["time"]
    assert server.mode == "shared" and server.args == ("mcp-server-time",)
    assert server.restart.max_restarts == 5 and server.restart.window == 60


def test_the_result_is_frozen() -> None:
    config = parse(MINIMAL, environ={})
    with pytest.raises(AttributeError):
        config.listen = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.servers["time"].command = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("30s", 30), ("5m", 300), ("1h", 3600), ("2.5s", 2.5), (7, 7), (0.5, 0.5), (0, 0), ("0s", 0)],
)
def test_durations(text: object, seconds: float) -> None:
    config = parse(MINIMAL + f"limits: {{request_timeout: {text}}}\n", environ={})
    assert config.limits.request_timeout == pytest.approx(seconds)
    assert isinstance(config.limits.request_timeout, Duration)


@pytest.mark.parametrize(
    ("text", "size"),
    [("512", 512), ("7B", 7), ("2KB", 2000), ("64KiB", 65536), ("4MiB", 4 << 20), ("10MB", 10**7), ("3GB", 3 * 10**9), ("1GiB", 1 << 30), (100, 100)],
)
def test_sizes(text: object, size: int) -> None:
    config = parse(MINIMAL + f"limits: {{max_message_bytes: {text}}}\n", environ={})
    assert config.limits.max_message_bytes == size and isinstance(config.limits.max_message_bytes, Size)


def test_environment_interpolation_with_defaults_and_escapes() -> None:
    text = """
listen: {port: "${PORT:-9000}"}
servers:
  s:
    command: "${CMD}"
    env: {TOKEN: "${SECRET}", LITERAL: "$${NOT_A_VAR}", MIXED: "a-${CMD}-b", EMPTY: "${NOPE:-}", SET: "${CMD:-x}"}
"""
    config = parse(text, environ={"CMD": "run", "SECRET": "s3"})
    assert config.listen.port == 9000
    server = config.servers["s"]
    assert server.command == "run"
    assert server.env == {"TOKEN": "s3", "LITERAL": "${NOT_A_VAR}", "MIXED": "a-run-b", "EMPTY": "", "SET": "run"}


def test_max_concurrent_calls_is_unset_by_default_and_a_count() -> None:
    assert parse(MINIMAL, environ={}).servers["time"].max_concurrent_calls is None
    config = parse("servers: {time: {command: x, mode: per-session, max_concurrent_calls: 1}}", environ={})
    assert config.servers["time"].max_concurrent_calls == 1
    assert problems("servers: {time: {command: x, max_concurrent_calls: many}}") == [
        "servers.time.max_concurrent_calls: expected `int`, got `str`"
    ]


def test_without_interpolation_variables_stay_as_written_and_need_not_be_set() -> None:
    """What `config convert` validates: the output keeps them for the daemon to fill in."""
    text = "servers: {s: {command: '${CMD}', args: ['${file:/nonexistent}', '$${X}'], env: {K: '${K:-d}'}}}"
    server = parse(text, "t.yaml", {}, interpolate=False).servers["s"]
    assert (server.command, server.args, server.env) == ("${CMD}", ("${file:/nonexistent}", "$${X}"), {"K": "${K:-d}"})


def test_a_missing_variable_names_itself_and_its_key() -> None:
    assert problems("servers: {s: {command: '${NOPE}'}}") == ["servers.s.command: environment variable NOPE is not set"]
    assert problems("servers: {s: {command: x, args: [a, '${NOPE}']}}") == ["servers.s.args[1]: environment variable NOPE is not set"]


def test_keys_that_are_not_strings_are_reported_with_their_path() -> None:
    assert problems("servers: {s: {command: x, env: {1: a}}}") == ["servers.s.env.1: keys must be strings"]
    assert problems("servers: {1: {command: x}}") == ["servers.1: keys must be strings"]


def test_every_problem_is_reported_with_its_path() -> None:
    text = """
listen: {port: 70000}
limits: {max_sesions: 3, request_timeout: soon, max_message_bytes: lots}
logging: {level: loud}
servers:
  time:
    command: uvx
    args: [mcp-server-time, 3]
    mode: shard
    restart: {window: soon}
    shutdown_timeout: -1
  other: {}
"""
    found = problems(text)
    expected = [
        "listen.port:",
        "limits.max_sesions: unknown key (did you mean 'max_sessions'?)",
        "limits.request_timeout: expected a duration",
        "limits.max_message_bytes: expected a size",
        "logging.level: expected one of",
        "servers.time.args[1]: expected `str`, got `int`",
        "servers.time.mode: expected one of 'shared', 'per-principal', 'per-session', got 'shard'",
        "servers.time.restart.window: expected a duration (like 30s, 5m), got 'soon'",
        "servers.time.shutdown_timeout: expected a duration",
        "servers.other.command: required key is missing",
    ]
    for prefix in expected:
        assert any(p.startswith(prefix) for p in found), (prefix, found)
    assert len(found) == len(expected), found


def test_semantic_problems_are_reported_together() -> None:
    text = """
servers:
  "bad name": {command: x, roots: ["/not/a/uri"]}
  ok: {command: y, restart: {backoff_initial: 1m, backoff_max: 1s}}
security:
  tokens:
    - {name: a, servers: [nope]}
    - {name: a, token: short}
    - {name: b, sha256: xyz}
metrics: {path: /servers/metrics}
"""
    found = problems(text)
    for fragment in [
        "servers.bad name: name must be",
        "servers.bad name.roots[0]: roots must be file:// URIs",
        "servers.ok.restart.backoff_initial: larger than backoff_max",
        "security.tokens[0]: give exactly one of 'token', 'sha256' and 'token_file'",
        "security.tokens[0].servers[0]: no server named 'nope'",
        "security.tokens[1].name: duplicate token name 'a'",
        "security.tokens[1].token: too short",
        "security.tokens[2].sha256: expected 64 hex digits",
        "metrics.path:",
    ]:
        assert any(fragment in p for p in found), (fragment, found)


def test_pool_settings_are_checked_against_the_mode_and_the_caps() -> None:
    text = """
servers:
  s: {command: x, pool: {warm: 1}}
  p: {command: x, mode: per-session, pool: {warm: 3, max: 2, wait: soon}}
  q: {command: x, mode: per-principal, pool: {warm: 2}}
limits: {max_processes: 4}
"""
    found = problems(text)
    assert found == ["servers.p.pool.wait: expected a duration (like 30s, 5m), got 'soon'"], found
    found = problems(text.replace("wait: soon", "wait: 2s"))
    assert found == [
        "servers.s.pool: only for mode per-session or per-principal (a shared server has one process)",
        "servers.p.pool.warm: larger than pool.max (2)",
        "limits.max_processes: smaller than the shared servers and the pools' warm processes together (6)",
    ], found
    config = parse("servers: {p: {command: x, mode: per-session, pool: {warm: 2, max: 3, wait: 500ms}}}")
    assert (config.servers["p"].pool.warm, config.servers["p"].pool.max, config.servers["p"].pool.wait) == (2, 3, 0.5)
    assert config.limits.max_processes == 256
    assert parse("servers: {p: {command: x}}\nlimits: {max_processes: null}").limits.max_processes is None


def test_no_servers_is_an_error() -> None:
    assert problems("servers: {}") == ["servers: at least one server is required"]
    assert problems("") == ["servers: required key is missing"]


def test_off_loopback_without_tokens_is_refused_unless_allowed() -> None:
    (problem,) = problems(MINIMAL + "listen: {host: 0.0.0.0}\n")
    assert problem.startswith("listen.host: '0.0.0.0' is not loopback")
    parse(MINIMAL + "listen: {host: 0.0.0.0}\nsecurity: {allow_unauthenticated: true}\n", environ={})
    token = "t" * 32
    parse(MINIMAL + f"listen: {{host: 0.0.0.0}}\nsecurity: {{tokens: [{{name: ops, token: {token}}}]}}\n", environ={})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("app.localhost", True),  # RFC 6761
        ("127.1.2.3", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_yaml_syntax_errors_give_the_line() -> None:
    (problem,) = problems("servers: [\n")
    assert problem.startswith("not valid YAML at line 2")


def test_top_level_must_be_a_mapping() -> None:
    (problem,) = problems("- a\n- b\n")
    assert problem == "<top level>: expected a mapping, got ['a', 'b']"


def test_load_reads_files_and_reports_unreadable_ones(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL)
    assert isinstance(load(path, {}), Config)
    with pytest.raises(ConfigError) as info:
        load(tmp_path / "missing.yaml", {})
    assert info.value.problems[0].startswith("cannot read")


def test_shipped_example_config_is_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    config = load(root / "config" / "servers.yaml", {})
    assert "demo" in config.servers


def test_configs_compare_by_value() -> None:
    assert parse(MINIMAL, environ={}) == parse(MINIMAL, environ={})
    assert msgspec.structs.replace(parse(MINIMAL, environ={}).listen, port=1) != parse(MINIMAL, environ={}).listen


# ------------------------------------------------------------------ secrets from files


def test_file_interpolation_reads_the_file_and_strips_trailing_newlines(tmp_path: Path) -> None:
    secret = tmp_path / "api key"
    secret.write_text("s3cret value\n\n")
    pem = tmp_path / "cert.pem"
    pem.write_text("line one\nline two\r\n")
    text = f"""
servers:
  s:
    command: x
    env: {{KEY: "${{file:{secret}}}", PEM: "${{file:{pem}}}", MIXED: "k=${{file:{secret}}};", LITERAL: "$${{file:{secret}}}"}}
"""
    env = parse(text, environ={}).servers["s"].env
    assert env == {"KEY": "s3cret value", "PEM": "line one\nline two", "MIXED": "k=s3cret value;", "LITERAL": f"${{file:{secret}}}"}
    # ${file:-x} is still a variable named `file` with a default, not a file named "-x".
    assert parse("servers: {s: {command: '${file:-dflt}'}}", environ={}).servers["s"].command == "dflt"


def test_an_unreadable_file_is_a_problem_naming_its_key_and_file_never_its_content(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    binary = tmp_path / "binary"
    binary.write_bytes(b"secret\xff\xfe")
    nul = tmp_path / "nul"
    nul.write_text("secret\0value")
    huge = tmp_path / "huge"
    huge.write_text("secret" * 20_000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes: reading it would block forever
    found = problems(
        f"""
servers:
  s:
    command: "${{file:{missing}}}"
    env: {{A: "${{file:{tmp_path}}}", B: "${{file:{binary}}}", C: "${{file:{nul}}}", D: "${{file:{huge}}}", E: "${{file:{fifo}}}"}}
"""
    )
    assert found == [
        f"servers.s.command: cannot read {missing}: No such file or directory",
        f"servers.s.env.A: cannot read {tmp_path}: not a regular file",
        f"servers.s.env.B: cannot read {binary}: not UTF-8 text",
        f"servers.s.env.C: cannot read {nul}: contains a NUL byte",
        f"servers.s.env.D: cannot read {huge}: larger than 65536 bytes",
        f"servers.s.env.E: cannot read {fifo}: not a regular file",
    ], found
    assert not any("secret" in p.replace(str(tmp_path), "") for p in found)


def test_token_file_holds_the_token_stripped(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  file-token-0123456789abcdef \n")
    config = parse(MINIMAL + f"security: {{tokens: [{{name: ops, token_file: {path}}}]}}\n", environ={})
    (token,) = config.security.tokens
    assert token.token == "file-token-0123456789abcdef" and token.token_file == str(path)
    # Read again on every load: a rotated file gives the new token.
    path.write_text("rotated-token-0123456789abcdef")
    again = parse(MINIMAL + f"security: {{tokens: [{{name: ops, token_file: {path}}}]}}\n", environ={})
    assert again.security.tokens[0].token == "rotated-token-0123456789abcdef"


def test_token_file_problems(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("CHANGE-ME\n")
    good = tmp_path / "good"
    good.write_text("good-token-0123456789abcdef")
    text = f"""{MINIMAL}
security:
  tokens:
    - {{name: a, token_file: {tmp_path / "missing"}}}
    - {{name: b, token_file: {short}}}
    - {{name: c, token_file: {good}, token: also-given-0123456789}}
    - {{name: d, token_file: {good}, sha256: "{"0" * 64}"}}
"""
    found = problems(text)
    assert found == [
        "security.tokens[2]: give exactly one of 'token', 'sha256' and 'token_file'",
        "security.tokens[3]: give exactly one of 'token', 'sha256' and 'token_file'",
        f"security.tokens[0].token_file: cannot read {tmp_path / 'missing'}: No such file or directory",
        f"security.tokens[1].token_file: the token in {short} is too short (at least 16 characters)",
    ], found
    assert not any("CHANGE-ME" in p or "good-token" in p for p in found), found


def test_inherit_env_takes_names_and_prefixes() -> None:
    config = parse("servers: {s: {command: x, inherit_env: [AWS_REGION, 'AWS_*', _X1]}}", environ={})
    assert config.servers["s"].inherit_env == ("AWS_REGION", "AWS_*", "_X1")
    found = problems("servers: {s: {command: x, inherit_env: ['*', 'A*B', '1X', 'A-B', 'OK']}}")
    assert [p.split(":")[0] for p in found] == [f"servers.s.inherit_env[{i}]" for i in range(4)], found
    assert "expected a variable name or a prefix ending in '*' (like AWS_*), got '*'" in found[0]


def test_slow_session_bytes_default_and_bound() -> None:
    assert parse(MINIMAL, environ={}).limits.slow_bytes == 16 << 20
    assert parse(MINIMAL + "limits: {max_message_bytes: 64MiB}\n", environ={}).limits.slow_bytes == 256 << 20
    assert parse(MINIMAL + "limits: {session_queue_bytes: 32MiB}\n", environ={}).limits.slow_bytes == 32 << 20
    assert problems(MINIMAL + "limits: {session_queue_bytes: 1MiB, max_message_bytes: 2MiB}\n") == [
        "limits.session_queue_bytes: smaller than limits.max_message_bytes (one message would drop a session)"
    ]


def token_problems(**token: str) -> list[str]:
    """The problems of a config whose one token has these keys (and a name)."""
    entry = ", ".join(f"{key}: {json.dumps(value)}" for key, value in token.items())
    return problems(MINIMAL + f"security: {{tokens: [{{name: t, {entry}}}]}}\n")


def test_a_token_with_both_a_value_and_a_digest_is_refused() -> None:
    both = token_problems(token="t" * 32, sha256="a" * 64)
    assert both == ["security.tokens[0]: give exactly one of 'token', 'sha256' and 'token_file'"]


@pytest.mark.parametrize("digest", ["a" * 63, "a" * 65, "g" * 64, "a" * 63 + "-", " " + "a" * 64, "a" * 64 + "\n"], ids=repr)
def test_a_digest_is_exactly_64_hex_digits(digest: str) -> None:
    assert token_problems(sha256=digest) == ["security.tokens[0].sha256: expected 64 hex digits"]


def test_a_digest_of_64_hex_digits_either_case_is_accepted() -> None:
    digest = "0123456789abcdef" * 3 + "0123456789ABCDEF"
    config = parse(MINIMAL + f"security: {{tokens: [{{name: t, sha256: {digest}}}]}}\n", environ={})
    assert config.security.tokens[0].sha256 == digest


@pytest.mark.parametrize("length", [1, 8, 15])
def test_a_token_shorter_than_16_characters_is_refused(length: int) -> None:
    assert token_problems(token="t" * length) == ["security.tokens[0].token: too short (at least 16 characters)"]


def test_a_token_of_16_characters_is_accepted() -> None:
    config = parse(MINIMAL + "security: {tokens: [{name: t, token: tttttttttttttttt}]}\n", environ={})
    assert config.security.tokens[0].token == "t" * 16


def test_backoff_initial_may_equal_backoff_max_but_not_exceed_it() -> None:
    text = "servers: {{time: {{command: uvx, restart: {{backoff_initial: {}, backoff_max: 2s}}}}}}\n"
    restart = parse(text.format("2s"), environ={}).servers["time"].restart
    assert restart.backoff_initial == restart.backoff_max == 2
    assert problems(text.format("2.5s")) == ["servers.time.restart.backoff_initial: larger than backoff_max"]


def test_a_server_name_is_at_most_64_characters() -> None:
    name = "n" * 64
    assert list(parse(f"servers: {{{name}: {{command: x}}}}\n", environ={}).servers) == [name]
    (problem,) = problems(f"servers: {{{name}x: {{command: x}}}}\n")
    assert problem.startswith(f"servers.{name}x: name must be 1-64 letters")


def test_a_blank_command_is_refused() -> None:
    assert problems("servers: {s: {command: '  '}}") == ["servers.s.command: must not be empty"]


@pytest.mark.parametrize("path", ["metrics", "", "/servers/x"])
def test_the_metrics_path_is_absolute_and_not_under_servers(path: str) -> None:
    assert problems(MINIMAL + f"metrics: {{path: '{path}'}}\n") == ["metrics.path: must start with '/' and not be under /servers/"]


@pytest.mark.parametrize(
    "key", ["limits.max_sessions", "limits.max_inflight", "limits.session_queue", "servers.time.max_sessions", "servers.time.max_concurrent_calls"]
)
def test_counts_are_at_least_one(key: str) -> None:
    section, _, field = key.rpartition(".")
    text = MINIMAL + f"limits: {{{field}: 0}}\n" if section == "limits" else f"servers: {{time: {{command: x, {field}: 0}}}}\n"
    (problem,) = problems(text)
    assert problem.startswith(f"{key}: expected `int` >= 1"), problem


def test_a_secret_file_of_exactly_the_largest_size_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_text("k" * 65536)
    assert parse(f"servers: {{s: {{command: x, env: {{K: '${{file:{path}}}'}}}}}}", environ={}).servers["s"].env["K"] == "k" * 65536


def test_a_token_name_may_not_look_like_an_oauth_principal() -> None:
    text = MINIMAL + "security: {tokens: [{name: 'https://id.example.com#alice', token: tttttttttttttttt}]}\n"
    assert problems(text) == [
        "security.tokens[0].name: must not contain '://' (that names OAuth principals: issuer#subject)"
    ]


# ------------------------------------------------------------------ OAuth, proxies, buffers


def test_oauth_is_authentication_enough_to_listen_off_loopback() -> None:
    text = MINIMAL + "listen: {host: 192.0.2.10}\nsecurity: {oauth: {authorization_servers: [{issuer: 'https://id.example.com'}]}}\n"
    config = parse(text, environ={})
    assert config.security.oauth is not None and config.security.oauth.authorization_servers[0].algorithms == ("RS256", "ES256")


def test_oauth_problems_are_reported_with_their_paths() -> None:
    found = problems(
        MINIMAL
        + """
security:
  oauth:
    resource: "https://bridge.example.com/mcp?x=1"
    authorization_servers:
      - {issuer: "ftp://id.example.com", jwks_uri: "https://id.example.com/jwks#k", algorithms: []}
      - {issuer: "https://two.example.com", introspection: {url: "https://two.example.com/i", client_id: c, client_secret: s, client_secret_file: /nowhere}}
      - {issuer: "https://three.example.com", introspection: {url: "https://three.example.com/i", client_id: c}}
      - {issuer: "https://four.example.com/tenant", jwks_uri: "http://four.example.com/jwks"}
    scopes: {"mcp:all": ["*"], "mcp:time": [time, nope]}
"""
    )
    servers = "security.oauth.authorization_servers"
    assert found == [
        "security.oauth.resource: expected an http(s) URL with no query or fragment, got 'https://bridge.example.com/mcp?x=1'",
        f"{servers}[0].issuer: expected an http(s) URL, got 'ftp://id.example.com'",
        f"{servers}[0].jwks_uri: expected an http(s) URL, got 'https://id.example.com/jwks#k'",
        f"{servers}[0].algorithms: at least one is required",
        f"{servers}[1].introspection: give exactly one of 'client_secret' and 'client_secret_file'",
        f"{servers}[2].introspection: give exactly one of 'client_secret' and 'client_secret_file'",
        "security.oauth.scopes.mcp:time[1]: no server named 'nope'",
    ], found
    assert problems(MINIMAL + "security: {oauth: {authorization_servers: []}}\n") == [
        "security.oauth.authorization_servers: at least one is required"
    ]


def test_trusted_proxies_are_addresses_or_networks() -> None:
    text = MINIMAL + "listen: {trusted_proxies: ['10.0.0.1/8', '127.0.0.1', '::1', 'fd00::/8']}\n"
    assert parse(text, environ={}).listen.trusted_proxies == ("10.0.0.1/8", "127.0.0.1", "::1", "fd00::/8")
    assert problems(MINIMAL + "listen: {trusted_proxies: [10.0.0.0/8, proxy.local]}\n") == [
        "listen.trusted_proxies[1]: expected an address or a network like 10.0.0.0/8, got 'proxy.local'"
    ]


def test_the_server_input_buffer_default_and_bound() -> None:
    assert parse(MINIMAL, environ={}).limits.input_buffer() == 64 << 20  # 16 messages of 4 MiB
    assert parse(MINIMAL + "limits: {max_message_bytes: 1MiB}\n", environ={}).limits.input_buffer() == 16 << 20
    assert problems(MINIMAL + "limits: {server_input_buffer: 1MiB, max_message_bytes: 2MiB}\n") == [
        "limits.server_input_buffer: smaller than limits.max_message_bytes (no message would fit)"
    ]


@pytest.mark.parametrize(
    ("groups", "problem"),
    [
        ({"g": {"servers": ["a"], "separator": "/"}}, "groups.g.separator: 1 to 8 of A-Z a-z 0-9 _ - ."),
        ({"g": {"servers": ["a"], "separator": ""}}, "groups.g.separator: 1 to 8 of"),
        ({"g": {"servers": []}}, "groups.g.servers: at least one server is required"),
        ({"g": {"servers": ["a", "nobody"]}}, "groups.g.servers[1]: unknown server 'nobody'"),
        ({"g": {"servers": ["a", "a"]}}, "groups.g.servers[1]: 'a' is listed twice"),
        ({"g": {"servers": ["*"]}}, "groups.g.servers: 'a' followed by '__' begins 'a__b': a tool name would name either"),
        ({"g h": {"servers": ["a"]}}, "groups.g h: name must be 1-64 letters"),
        ({"g": {"servers": ["a"], "list_timeout": 0}}, "groups.g.list_timeout: must be more than 0"),
    ],
)
def test_a_group_that_would_show_a_name_two_ways_or_none_is_refused_at_load(groups: dict[str, object], problem: str) -> None:
    config = {"servers": {"a": {"command": "x"}, "a__b": {"command": "y"}}, "groups": groups}
    with pytest.raises(ConfigError) as caught:
        build(config, "t")
    assert [p for p in caught.value.problems if p.startswith(problem)], caught.value.problems


def test_a_group_lists_its_members_in_its_order_and_star_for_the_rest() -> None:
    config = build({"servers": {"a": {"command": "x"}, "b": {"command": "y"}, "c": {"command": "z"}}, "groups": {"g": {"servers": ["c", "*"]}}}, "t")
    assert group_members(config, "g") == ("c", "a", "b")
    assert config.groups["g"].separator == "__" and config.groups["g"].list_timeout == 5
