"""Packaging and deployment files, checked without a container engine.

Dockerfile, .dockerignore, config/docker.yaml and everything under deploy/ are
parsed and held against each other and against the daemon itself: the config
model (`bridge.config.schema`), its defaults, the open probe paths, and a real
daemon's /metrics after real traffic (for every metric the alerts and the
dashboard name). Nothing here builds an image or talks to a cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.daemon import PY, ROOT
from support.rawclient import RawSse, call

from bridge import cli
from bridge.access.guard import OPEN_PATHS
from bridge.config import load, schema
from bridge.http.endpoints.streamable_2025 import SESSION_HEADER
from bridge.process.env import child_env

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
DOCKER_CONFIG = ROOT / "config" / "docker.yaml"
EXPECTED_FILES = [
    "README.md",
    "docker-compose.yml",
    "prometheus/prometheus.yml",
    "prometheus/alerts.yml",
    "grafana/mcp-bridge.json",
    "systemd/mcp-bridge.service",
    "kubernetes/kustomization.yaml",
    "kubernetes/namespace.yaml",
    "kubernetes/deployment.yaml",
    "kubernetes/service.yaml",
    "kubernetes/configmap.yaml",
    "kubernetes/secret.yaml",
    "kubernetes/pdb.yaml",
    "kubernetes/networkpolicy.yaml",
    "kubernetes/servicemonitor.yaml",
    "kubernetes/prometheusrule.yaml",
    "replicas/docker-compose.yml",
    "replicas/nginx.conf",
    "replicas/servers.yaml",
    "envoy/envoy.yaml",
]
PEER_KEY = "peer-key"  # the Secret's key the replicas share (cluster.peer_key_file)
# Stand-ins for real tokens (the config wants at least 16 characters).
CLIENT_TOKEN = "client-token-for-tests-0123456789"
METRICS_TOKEN = "metrics-token-for-tests-0123456789"
# Variables the deploy files set for the daemon itself; every other one they set is for the servers.
DAEMON_ONLY = frozenset({"VIRTUAL_ENV", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})
# Labels Prometheus adds to every scraped series (static config or the Operator's ServiceMonitor).
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint", "container"})
METRIC = re.compile(r"\bmcp_bridge_[A-Za-z0-9_]+")
SELECTOR = re.compile(r"\b(mcp_bridge_[A-Za-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
AGGREGATION = re.compile(r"\b(?:sum|avg|min|max|count|topk|bottomk|quantile|group|stddev|stdvar)\b")


# ------------------------------------------------------------------ reading the files


def yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def k8s_objects() -> list[dict[str, Any]]:
    objects = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            objects += yaml_docs(path)
    return objects


def k8s(kind: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} under deploy/kubernetes, found {len(found)}"
    return found[0]


def container() -> dict[str, Any]:
    containers = k8s("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, containers
    return containers[0]


def configmap_config_text() -> str:
    return k8s("ConfigMap")["data"]["servers.yaml"]


def kube_config_text(tmp_path: Path, tokens: dict[str, str] | None = None) -> str:
    """The ConfigMap's config as a pod reads it: the Secret's keys (from secret.yaml, or
    `tokens`: key -> value) laid out under tmp_path as the Deployment mounts them, and
    the config's paths moved there."""
    secret = k8s("Secret")
    data = dict(secret["stringData"]) if tokens is None else tokens
    volumes = {v["name"]: v for v in k8s("Deployment")["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in container()["volumeMounts"] if "secret" in volumes[m["name"]]]
    assert volumes[mount["name"]]["secret"]["secretName"] == secret["metadata"]["name"]
    assert mount.get("readOnly") is True and "subPath" not in mount, "a subPath mount never sees a changed Secret"
    root = tmp_path / mount["mountPath"].lstrip("/")
    root.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (root / key).write_text(value)
    text = configmap_config_text()
    assert mount["mountPath"] + "/" in text
    return text.replace(mount["mountPath"] + "/", f"{root}/")


def real_tokens() -> dict[str, str]:
    """Secret key -> a valid stand-in token (or peer key: 32 characters at least), each key its own."""
    keys = sorted(k8s("Secret")["stringData"])
    return {key: f"{key}-0123456789abcdef0123456789abcdef" for key in keys}


def bearer_tokens() -> set[str]:
    """The stand-ins of the Secret's keys that are bearer tokens (not the peer key)."""
    return {value for key, value in real_tokens().items() if key != PEER_KEY}


def config_vars(text: str) -> set[str]:
    """Environment variables a config's values read without a default (what must be provided)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for item in node.values():
                walk(item)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, str):
            found.update(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", node))

    walk(yaml.safe_load(text))
    return found


def compose() -> dict[str, Any]:
    (doc,) = yaml_docs(DEPLOY / "docker-compose.yml")
    return doc


def prometheus_config() -> dict[str, Any]:
    (doc,) = yaml_docs(DEPLOY / "prometheus" / "prometheus.yml")
    return doc


def alert_rules() -> list[dict[str, Any]]:
    (doc,) = yaml_docs(DEPLOY / "prometheus" / "alerts.yml")
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana" / "mcp-bridge.json").read_text(encoding="utf-8"))


def dashboard_targets() -> list[dict[str, Any]]:
    targets = []
    for panel in dashboard()["panels"]:
        targets += panel.get("targets", [])
        for inner in panel.get("panels", []):
            targets += inner.get("targets", [])
    return targets


def dashboard_queries() -> list[str]:
    """Every PromQL text in the dashboard: panel targets and template variable queries."""
    queries = [t["expr"] for t in dashboard_targets()]
    for var in dashboard()["templating"]["list"]:
        query = var.get("query")
        if var.get("type") == "query":
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def systemd_unit() -> dict[str, list[str]]:
    """[Section]Key -> every value it is given (systemd keys may repeat)."""
    values: dict[str, list[str]] = {}
    section = ""
    for raw in (DEPLOY / "systemd" / "mcp-bridge.service").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        values.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return values


def systemd_seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit or "s"]
    return total


def compose_seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value))


# Dockerfile: instructions with continuation lines joined, comments dropped, by stage.


def dockerfile() -> list[tuple[int, str, str]]:
    """(stage index, INSTRUCTION, arguments) for every instruction."""
    out: list[tuple[int, str, str]] = []
    stage = -1
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if not full:
            continue
        instruction, _, args = full.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stage += 1
        out.append((stage, instruction, args.strip()))
    return out


def runtime_stage() -> list[tuple[str, str]]:
    instructions = dockerfile()
    last = max(stage for stage, _, _ in instructions)
    return [(ins, args) for stage, ins, args in instructions if stage == last]


def one(instructions: list[tuple[str, str]], name: str) -> str:
    found = [args for ins, args in instructions if ins == name]
    assert len(found) == 1, f"expected one {name} in the runtime stage, found {found}"
    return found[0]


def dockerfile_env() -> dict[str, str]:
    env = {}
    for ins, args in runtime_stage():
        if ins == "ENV":
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|\S+)", args):
                env[key] = value.strip('"')
    return env


def healthcheck_command() -> list[str]:
    args = one(runtime_stage(), "HEALTHCHECK")
    command = args[args.index("CMD ") + 4 :].strip()
    parsed = json.loads(command)
    assert isinstance(parsed, list), "HEALTHCHECK should use the exec (JSON) form"
    return parsed


def config_path() -> str:
    cmd = json.loads(one(runtime_stage(), "CMD"))
    assert cmd[0] == "--config", cmd
    return cmd[1]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker would leave `path` (relative to the context) out of the build context:
    a path is out when it or a parent matches the last matching pattern ('!' re-includes)."""

    def regex(pattern: str) -> re.Pattern[str]:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                out, i = out + pattern[i : end + 1], end + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out + r"\Z")

    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.strip("/")
        if any(regex(body).match(c) for c in candidates):
            excluded = not negate
    return excluded


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def assert_servers_get(env: dict[str, str]) -> None:
    """What a deploy file sets for the servers must be what servers get (README "Server environment")."""
    seen = child_env(schema.Server(command="x"), env)
    assert set(env) - DAEMON_ONLY <= set(seen), set(env) - DAEMON_ONLY - set(seen)


# ------------------------------------------------------------------ every file parses


def test_every_deploy_file_is_there_and_parses() -> None:
    for name in EXPECTED_FILES:
        assert (DEPLOY / name).is_file(), f"deploy/{name} is missing"
    checked = 0
    for path in sorted(DEPLOY.rglob("*")):
        if path.suffix in (".yml", ".yaml"):
            docs = yaml_docs(path)
            assert docs, f"{path} has no YAML document"
            assert all(isinstance(doc, dict) for doc in docs), f"{path}: every document should be a mapping"
            checked += 1
        elif path.suffix == ".json":
            assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict), path
            checked += 1
    assert checked >= 13, checked
    for obj in k8s_objects():
        assert obj.get("apiVersion") and obj.get("kind") and obj.get("metadata", {}).get("name"), obj


def test_kustomization_resources_exist() -> None:
    (kustomization,) = yaml_docs(K8S / "kustomization.yaml")
    resources = kustomization["resources"]
    for resource in resources:
        assert (K8S / resource).is_file(), resource
    kinds = {doc["kind"] for resource in resources for doc in yaml_docs(K8S / resource)}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds, kinds
    image = container()["image"].rsplit(":", 1)[0]
    assert image in [i["name"] for i in kustomization.get("images", [])], (
        "kustomization should be able to set the image"
    )


# ------------------------------------------------------------------ Dockerfile


def test_dockerfile_agrees_with_the_daemon() -> None:
    instructions = dockerfile()
    stages = [args for _, ins, args in instructions if ins == "FROM"]
    assert len(stages) >= 2, "the Dockerfile should be multi-stage"
    runtime = runtime_stage()
    args = {m.group(1): m.group(2) for m in re.finditer(r"^ARG (\w+)=(\S+)", (ROOT / "Dockerfile").read_text(), re.M)}
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], one(runtime, "FROM").split()[0])
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base
    # A builder stage builds a wheel; the runtime stage installs it from there.
    assert any(ins == "RUN" and "pip wheel" in a for s, ins, a in instructions if s < len(stages) - 1)
    assert any(ins == "RUN" and "from=builder" in a and "pip install" in a for ins, a in runtime)

    # Port: EXPOSE, the shipped config and the daemon's default all agree.
    expose = one(runtime, "EXPOSE").split()
    assert expose == [str(schema.Listen().port)], expose
    shipped = load.parse(
        DOCKER_CONFIG.read_text(), environ={"MCP_BRIDGE_TOKEN": CLIENT_TOKEN, "MCP_BRIDGE_METRICS_TOKEN": METRICS_TOKEN}
    )
    assert shipped.listen.port == int(expose[0])

    # HEALTHCHECK: Python (no curl in slim) on /healthz, an open path, at that port.
    health = healthcheck_command()
    assert health[0] == "python", health
    assert f"http://127.0.0.1:{expose[0]}/healthz" in " ".join(health), health
    assert "/healthz" in OPEN_PATHS

    # Non-root, numeric uid (runAsNonRoot can only check a number).
    user = one(runtime, "USER")
    assert user.split(":")[0] == "10001", user
    assert re.search(r"useradd[^&]*--uid 10001", " ".join(a for i, a in runtime if i == "RUN"))

    # Entry point: mcp-bridge under an init that forwards signals and reaps orphans.
    entrypoint = json.loads(one(runtime, "ENTRYPOINT"))
    assert entrypoint[-1] == "mcp-bridge", entrypoint
    assert os.path.basename(entrypoint[0]) == "tini" and "--" in entrypoint, entrypoint
    assert config_path() == "/etc/mcp-bridge/servers.yaml"
    copies = [a.split() for i, a in runtime if i == "COPY" and "--from" not in a]
    assert ["config/docker.yaml", config_path()] in copies, copies
    assert one(runtime, "STOPSIGNAL") == "SIGTERM"

    # Node.js/npm/npx and uv/uvx are in the image; their caches live under /tmp, set
    # where the servers see it: npm's global config, and variables servers get.
    runs = " ".join(a for i, a in runtime if i in ("RUN", "COPY"))
    for tool in ("node", "npm", "npx", "uvx"):
        assert re.search(rf"\b{tool}\b", runs), f"{tool} is not installed or checked in the runtime stage"
    assert re.search(r"\bcache=/tmp/\S+ .*> /usr/local/etc/npmrc", runs), "npm's cache belongs in its global config"
    env = dockerfile_env()
    for key in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        assert env[key].startswith("/tmp/"), (key, env.get(key))
    assert env["HOME"] == "/home/mcp"
    assert_servers_get(env)


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    patterns = dockerignore_patterns()
    sources: list[str] = []
    for _, ins, args in dockerfile():
        if ins in ("COPY", "ADD") and "--from" not in args:
            sources += [a for a in args.split() if not a.startswith("--")][:-1]
    assert sources, "no COPY from the build context"
    for source in sources:
        path = ROOT / source
        assert path.exists(), source
        files = [p for p in path.rglob("*.py")] if path.is_dir() else [path]
        assert files, source
        for file in files:
            rel = file.relative_to(ROOT).as_posix()
            if "__pycache__" in rel:
                continue
            assert not dockerignored(rel, patterns), f"{rel} is copied by the Dockerfile but .dockerignore drops it"
    # ... and it does drop what the image must not carry (the matcher works).
    for rel in (".git/config", "tests/release/test_deploy.py", "deploy/.env", "bridge/__pycache__/cli.cpython-311.pyc"):
        assert dockerignored(rel, patterns), rel


# ------------------------------------------------------------------ shipped configs


@pytest.mark.parametrize("which", ["docker", "kubernetes"])
def test_shipped_config_validates_and_binds_safely(which: str, tmp_path: Path) -> None:
    if which == "docker":
        text, env = (
            DOCKER_CONFIG.read_text(),
            {"MCP_BRIDGE_TOKEN": CLIENT_TOKEN, "MCP_BRIDGE_METRICS_TOKEN": METRICS_TOKEN},
        )
        tokens = set(env.values())
    else:
        # Tokens come from files, the environment holds none.
        text, env, tokens = kube_config_text(tmp_path, real_tokens()), {}, bearer_tokens()
        sources = [variable["valueFrom"] for variable in container().get("env", [])]
        assert all(list(source) == ["fieldRef"] for source in sources), "secrets belong in files, not in the environment"
    # Exactly the variables the environment provides are read.
    assert config_vars(text) == set(env), (config_vars(text), set(env))
    config = load.parse(text, which, env)
    assert config.listen.host == "0.0.0.0"
    assert config.listen.port == schema.Listen().port
    assert not config.security.allow_unauthenticated
    assert config.security.tokens and not load.listen_problems(config)
    assert not config.security.allowed_hosts, "a Host allow-list off loopback refuses the pod IP Prometheus scrapes"
    # One token may only scrape: no server at all.
    (metrics_only,) = [t for t in config.security.tokens if t.servers == ()]
    assert metrics_only.token in tokens and {t.token for t in config.security.tokens} == tokens
    assert config.metrics.enabled and config.metrics.path == "/metrics"

    # Without its tokens the daemon refuses to start, naming each variable or file ...
    if which == "docker":
        missing_text, needed = text, set(env)
        short_text, short_env = text, {var: "CHANGE-ME" for var in env}
    else:
        missing_text = kube_config_text(tmp_path / "none", {})
        needed = {f"security.tokens[{i}].token_file: cannot read" for i in range(len(tokens))} | {"cluster.peer_key_file: cannot read"}
        short_text, short_env = kube_config_text(tmp_path / "placeholders"), {}
    with pytest.raises(schema.ConfigError) as missing:
        load.parse(missing_text, which, {})
    for var in needed:
        assert any(var in problem for problem in missing.value.problems), missing.value.problems
    # ... and with tokens too short to be real ones (the Secret's placeholders) too.
    with pytest.raises(schema.ConfigError) as short:
        load.parse(short_text, which, short_env)
    assert any("too short" in problem for problem in short.value.problems), short.value.problems


def test_placeholder_secret_fails_closed(tmp_path: Path) -> None:
    """Applied as shipped, the Secret's placeholders must not become working tokens: each
    one alone is enough to make the daemon refuse the config."""
    placeholders = k8s("Secret")["stringData"]
    for key in placeholders:
        tokens = {**real_tokens(), key: placeholders[key]}
        with pytest.raises(schema.ConfigError) as refused:
            load.parse(kube_config_text(tmp_path, tokens), "configmap", {})
        assert any("too short" in problem for problem in refused.value.problems), (key, refused.value.problems)


def test_docker_config_passes_the_cli_check() -> None:
    env = {**os.environ, "MCP_BRIDGE_TOKEN": CLIENT_TOKEN, "MCP_BRIDGE_METRICS_TOKEN": METRICS_TOKEN}
    ok = subprocess.run(
        [PY, "-m", "bridge", "--check", "--config", str(DOCKER_CONFIG)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    env.pop("MCP_BRIDGE_TOKEN")
    bad = subprocess.run(
        [PY, "-m", "bridge", "--check", "--config", str(DOCKER_CONFIG)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "MCP_BRIDGE_TOKEN" in bad.stderr, (bad.returncode, bad.stderr)


# ------------------------------------------------------------------ Kubernetes


def test_kubernetes_manifests_agree_with_the_daemon_and_the_image() -> None:
    deployment = k8s("Deployment")
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    c = container()
    port = schema.Listen().port

    # Port and probes: the config's port, the open (token-free) health paths.
    (http,) = c["ports"]
    assert http["containerPort"] == port == int(one(runtime_stage(), "EXPOSE")) and http["name"] == "http"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert {"/healthz", "/readyz"} <= OPEN_PATHS

    # Config path: the image's CMD, the args, and the ConfigMap mount all agree.
    assert c["args"][:2] == ["--config", config_path()]
    mount_dir, file_name = os.path.split(config_path())
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts[mount_dir].get("readOnly") is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_volume = volumes[mounts[mount_dir]["name"]]["configMap"]
    assert "subPath" not in mounts[mount_dir], "a subPath mount never sees ConfigMap updates (no SIGHUP reload)"
    assert config_volume["name"] == k8s("ConfigMap")["metadata"]["name"]
    assert {"key": file_name, "path": file_name} in config_volume["items"]
    assert file_name in k8s("ConfigMap")["data"]

    # Writable scratch where the image points the npm/uv caches and HOME.
    env = dockerfile_env()
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert "emptyDir" in volumes[mounts[env["HOME"]]["name"]]

    # Security: non-root as the image's uid, read-only root, nothing to escalate to.
    uid = int(one(runtime_stage(), "USER").split(":")[0])
    pod_sc, sc = spec["securityContext"], c["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] == uid
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
    assert spec.get("automountServiceAccountToken") is False
    resources = c["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), resources

    # Service links would put MCP_BRIDGE_PORT=tcp://... (and more) into the environment.
    service = k8s("Service")
    assert spec.get("enableServiceLinks") is False
    prefix = service["metadata"]["name"].upper().replace("-", "_") + "_"
    used = config_vars(configmap_config_text()) | config_vars(DOCKER_CONFIG.read_text())
    assert not {v for v in used if v.startswith(prefix) and ("_PORT" in v or "_SERVICE_" in v)}, used

    # Service: targets the named port of these pods, with affinity when there are several.
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] in ("http", port)
    if deployment["spec"]["replicas"] > 1:
        # Several replicas are a cluster: any of them takes any request, no affinity required.
        assert "cluster" in yaml.safe_load(configmap_config_text())
        assert service["spec"].get("sessionAffinity", "None") == "None"
    readme = (DEPLOY / "README.md").read_text()
    assert "sessionAffinity" in readme and "Mcp-Session-Id" in readme

    # PodDisruptionBudget: selects these pods and never blocks every eviction.
    pdb = k8s("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    if "minAvailable" in pdb["spec"]:
        assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    else:
        assert pdb["spec"]["maxUnavailable"] >= 1


def test_kubernetes_replicas_form_a_cluster(tmp_path: Path) -> None:
    """Each pod advertises its pod IP, all share the Secret's peer key, and may reach each other."""
    c = container()
    port = schema.Listen().port
    (pod_ip,) = c["env"]
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert c["args"][2:] == ["--advertise", f"$({pod_ip['name']}):{port}"]
    # The config as a pod reads it, with the advertised address as the kubelet expands it.
    config_file = tmp_path / "servers.yaml"
    config_file.write_text(kube_config_text(tmp_path, real_tokens()))
    cluster = cli._load(cli.parse_args(["--config", str(config_file), "--advertise", f"10.1.2.3:{port}"])).cluster
    assert cluster is not None and cluster.advertise == f"10.1.2.3:{port}"
    assert cluster.peer_key == real_tokens()[PEER_KEY]
    assert PEER_KEY in k8s("Secret")["stringData"]
    # Pod to pod on the port: the NetworkPolicy selects these pods and lets them in from each other.
    labels = k8s("Deployment")["spec"]["template"]["metadata"]["labels"]
    policy = k8s("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    peers = [rule for rule in policy["ingress"] if any("podSelector" in f for f in rule["from"])]
    assert any(
        f["podSelector"]["matchLabels"].items() <= labels.items() and {"port": "http", "protocol": "TCP"} in rule["ports"]
        for rule in peers
        for f in rule["from"]
    ), policy
    assert "networkpolicy.yaml" in yaml_docs(K8S / "kustomization.yaml")[0]["resources"]
    assert k8s("Deployment")["spec"]["replicas"] == 3
    assert k8s("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_compose_replicas_behind_nginx_and_envoy() -> None:
    """deploy/replicas: each replica advertises its own service name; nginx and the Envoy
    example balance over exactly those; the shared config is a cluster with the peer key."""
    (doc,) = yaml_docs(DEPLOY / "replicas" / "docker-compose.yml")
    port = schema.Listen().port
    bridges = {name: svc for name, svc in doc["services"].items() if name.startswith("bridge-")}
    assert len(bridges) == 3
    for name, svc in bridges.items():
        assert svc["command"][-2:] == ["--advertise", f"{name}:{port}"], name
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
        mounts = {m.split(":")[1]: m.split(":")[0] for m in svc["volumes"]}
        assert mounts[config_path()] == "./servers.yaml" and svc["command"][:2] == ["--config", config_path()]
    text = (DEPLOY / "replicas" / "servers.yaml").read_text()
    env = {var: f"{var.lower()}-0123456789abcdef0123456789abcdef" for var in config_vars(text)}
    assert set(env) == set(next(iter(bridges.values()))["environment"])
    config = load.parse(text, "replicas", env)
    assert config.cluster is not None and config.cluster.peer_key == env["MCP_BRIDGE_PEER_KEY"]
    for svc in bridges.values():
        assert compose_seconds(svc["stop_grace_period"]) > worst_stop_seconds(text, env)
    nginx = (DEPLOY / "replicas" / "nginx.conf").read_text()
    assert sorted(re.findall(r"^\s*server (\S+);", nginx, re.M)) == sorted(f"{name}:{port}" for name in bridges)
    for directive in ("proxy_buffering off;", "proxy_request_buffering off;", "proxy_http_version 1.1;"):
        assert directive in nginx, directive
    assert "hash" not in nginx and "sticky" not in nginx and "ip_hash" not in nginx  # no affinity
    assert doc["services"]["nginx"]["ports"] == [f"127.0.0.1:{port}:{port}"]

    (envoy,) = yaml_docs(DEPLOY / "envoy" / "envoy.yaml")
    (cluster,) = envoy["static_resources"]["clusters"]
    endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert sorted(f"{e['endpoint']['address']['socket_address']['address']}:{e['endpoint']['address']['socket_address']['port_value']}" for e in endpoints) == sorted(f"{name}:{port}" for name in bridges)
    (listener,) = envoy["static_resources"]["listeners"]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    stateful = next(f for f in manager["http_filters"] if f["name"] == "envoy.filters.http.stateful_session")
    assert stateful["typed_config"]["session_state"]["typed_config"]["header"]["name"] == SESSION_HEADER


def test_servicemonitor_scrapes_with_the_metrics_token(tmp_path: Path) -> None:
    monitor = k8s("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = k8s("Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    config = load.parse(kube_config_text(tmp_path, real_tokens()), "configmap", {})
    assert endpoint["path"] == config.metrics.path
    # The credentials are the Secret key whose file the metrics-only token reads.
    credentials = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"].get("type", "Bearer") == "Bearer"
    assert credentials["name"] == k8s("Secret")["metadata"]["name"]
    (token,) = [t for t in config.security.tokens if t.token == real_tokens()[credentials["key"]]]
    assert token.servers == (), "the scrape token should reach /metrics and no server"


def test_prometheusrule_is_the_alerts_file() -> None:
    rule = k8s("PrometheusRule")
    (alerts,) = yaml_docs(DEPLOY / "prometheus" / "alerts.yml")
    assert rule["spec"]["groups"] == alerts["groups"]


def test_job_label_is_the_same_everywhere() -> None:
    jobs = {m for rule in alert_rules() for m in re.findall(r'\bjob="([^"]+)"', rule["expr"])}
    (scrape,) = prometheus_config()["scrape_configs"]
    assert jobs == {scrape["job_name"]} == {k8s("Service")["metadata"]["name"]}, jobs


# ------------------------------------------------------------------ compose and Prometheus


def test_compose_runs_the_image_with_its_config_and_prometheus_scrapes_it() -> None:
    doc = compose()
    bridge, prometheus = doc["services"]["bridge"], doc["services"]["prometheus"]
    assert (DEPLOY / bridge["build"]["context"]).resolve() == ROOT
    assert (ROOT / bridge["build"].get("dockerfile", "Dockerfile")).is_file()
    # The image's config reads exactly the variables compose provides.
    assert set(bridge["environment"]) == config_vars(DOCKER_CONFIG.read_text())
    port = schema.Listen().port
    assert any(str(p).endswith(f":{port}") for p in bridge["ports"]), bridge["ports"]
    assert bridge.get("read_only") is True
    tmpfs = {entry.split(":")[0]: entry for entry in bridge["tmpfs"]}
    assert "exec" in tmpfs["/tmp"].split(":", 1)[1].split(","), "npx/uvx execute what they download under /tmp"
    assert dockerfile_env()["HOME"] in tmpfs
    assert bridge["cap_drop"] == ["ALL"]

    # Prometheus: the config and the rules at the paths the config names.
    mounts = {m.split(":")[1]: m.split(":")[0] for m in prometheus["volumes"] if m.startswith("./")}
    assert (DEPLOY / mounts["/etc/prometheus/prometheus.yml"]).resolve() == (
        DEPLOY / "prometheus" / "prometheus.yml"
    ).resolve()
    prom = prometheus_config()
    for rule_file in prom["rule_files"]:
        assert rule_file in mounts, rule_file
        assert (DEPLOY / mounts[rule_file]).resolve() == (DEPLOY / "prometheus" / "alerts.yml").resolve()
    (scrape,) = prom["scrape_configs"]
    assert scrape["static_configs"][0]["targets"] == [f"bridge:{port}"]
    text = DOCKER_CONFIG.read_text()
    distinct = {var: f"{var.lower()}-0123456789abcdef" for var in config_vars(text)}
    docker = load.parse(text, environ=distinct)
    assert scrape["metrics_path"] == docker.metrics.path
    # The scrape token file is the compose secret made from the metrics-only token's variable.
    credentials_file = scrape["authorization"]["credentials_file"]
    assert scrape["authorization"].get("type", "Bearer") == "Bearer"
    (secret,) = [s for s in prometheus["secrets"] if s.get("target") == credentials_file]
    source = doc["secrets"][secret["source"]]["environment"]
    assert source in bridge["environment"]
    (metrics_only,) = [t for t in docker.security.tokens if t.servers == ()]
    assert metrics_only.token == distinct[source], "Prometheus should scrape with the metrics-only token"
    assert secret.get("mode", 0o400) & 0o004, "Prometheus runs as nobody: the secret file must be readable"


# ------------------------------------------------------------------ stop timeouts


def worst_stop_seconds(text: str, env: dict[str, str]) -> float:
    """drain_timeout + the largest shutdown_timeout: how long a clean SIGTERM may take."""
    config = load.parse(text, environ=env)
    return config.limits.drain_timeout + max(s.shutdown_timeout for s in config.servers.values())


def test_stop_timeouts_outlast_drain_and_shutdown(tmp_path: Path) -> None:
    docker_env = {"MCP_BRIDGE_TOKEN": CLIENT_TOKEN, "MCP_BRIDGE_METRICS_TOKEN": METRICS_TOKEN}
    docker = worst_stop_seconds(DOCKER_CONFIG.read_text(), docker_env)
    kube = worst_stop_seconds(kube_config_text(tmp_path, real_tokens()), {})
    local = worst_stop_seconds((ROOT / "config" / "servers.yaml").read_text(), {})
    assert min(docker, kube, local) >= 15  # the defaults: 10s drain + 5s

    spec = k8s("Deployment")["spec"]["template"]["spec"]
    pre_stop = container().get("lifecycle", {}).get("preStop", {})
    pre_stop_s = 0.0
    if "exec" in pre_stop:
        assert pre_stop["exec"]["command"][0] == "sleep"
        pre_stop_s = float(pre_stop["exec"]["command"][1])
    elif "sleep" in pre_stop:
        pre_stop_s = float(pre_stop["sleep"]["seconds"])
    assert spec["terminationGracePeriodSeconds"] > pre_stop_s + kube

    unit = systemd_unit()
    assert systemd_seconds(unit["Service.TimeoutStopSec"][-1]) > max(docker, local)
    assert unit["Service.KillSignal"] == ["SIGTERM"]

    bridge = compose()["services"]["bridge"]
    assert compose_seconds(bridge["stop_grace_period"]) > docker
    assert bridge.get("stop_signal", "SIGTERM") == "SIGTERM"


# ------------------------------------------------------------------ systemd


def test_systemd_unit_is_hardened_and_wired_to_the_daemon() -> None:
    unit = systemd_unit()

    def value(key: str) -> str:
        assert f"Service.{key}" in unit, f"{key}= is missing"
        return unit[f"Service.{key}"][-1]

    exec_start = value("ExecStart").split()
    assert os.path.basename(exec_start[0]) == "mcp-bridge"
    assert exec_start[exec_start.index("--config") + 1] == config_path()
    reloads = unit["Service.ExecReload"]
    assert "/bin/kill -HUP $MAINPID" in reloads
    assert value("KillMode") == "mixed", "SIGTERM must reach only the daemon: it stops the servers itself"
    assert value("DynamicUser") == "yes" or value("User") not in ("", "root")
    for key, expected in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "SystemCallFilter": None,
        "RestrictAddressFamilies": None,
        "CapabilityBoundingSet": "",
    }.items():
        if expected is not None:
            assert value(key) == expected, (key, value(key))
    assert "@system-service" in unit["Service.SystemCallFilter"]
    families = set(value("RestrictAddressFamilies").split())
    assert {"AF_INET", "AF_INET6", "AF_UNIX"} <= families and "AF_PACKET" not in families
    assert "Service.MemoryDenyWriteExecute" not in unit, "Node's JIT needs writable+executable memory"
    assert int(value("LimitNOFILE")) >= 65536
    assert value("RestartPreventExitStatus") == "2"
    # uvx gets its cache in the CacheDirectory, tools and Pythons and npm's cache in the StateDirectory.
    env = dict(item.split("=", 1) for item in unit["Service.Environment"])
    assert env["XDG_CACHE_HOME"] == "/var/cache/" + value("CacheDirectory")
    assert env["XDG_DATA_HOME"] == env["HOME"] == "/var/lib/" + value("StateDirectory")
    assert_servers_get(env)


# ------------------------------------------------------------------ metric names against a live /metrics


def alert_queries() -> list[tuple[str, str]]:
    """(expr, annotation text) per rule."""
    return [(rule["expr"], " ".join(rule.get("annotations", {}).values())) for rule in alert_rules()]


def labels_for(expr: str, samples: dict[str, set[str]]) -> set[str]:
    """Labels that can appear on the result of `expr`."""
    groups = GROUPING.findall(expr)
    if AGGREGATION.search(expr) and groups:
        return {label.strip() for group in groups for label in group.split(",") if label.strip()}
    names = METRIC.findall(expr)
    return set(TARGET_LABELS).union(*(samples.get(n, set()) for n in names))


def check_queries(queries: list[tuple[str, str]], samples: dict[str, set[str]]) -> set[str]:
    """Every metric a query names exists with the labels it uses; returns the names."""
    used: set[str] = set()
    for expr, text in queries:
        names = set(METRIC.findall(expr))
        for name in names:
            assert name in samples, f"{name} (in {expr!r}) is not in /metrics; it has {sorted(samples)}"
        for name, matchers in SELECTOR.findall(expr):
            for label in MATCHER.findall(matchers):
                assert label in samples[name] | TARGET_LABELS, f"{name} has no label {label!r} ({expr!r})"
        known = TARGET_LABELS.union(*(samples[n] for n in names)) | {"le"}
        for group in GROUPING.findall(expr):
            for label in filter(None, (g.strip() for g in group.split(","))):
                assert label in known, f"no metric in {expr!r} has the label {label!r}"
        allowed = labels_for(expr, samples)
        for label in re.findall(r"\$labels\.(\w+)", text) + re.findall(r"\{\{\s*(\w+)\s*\}\}", text):
            assert label in allowed, f"{label!r} is not a label of the result of {expr!r}"
        used |= names
    return used


async def test_alert_and_dashboard_metrics_exist_in_live_metrics(bridge: Any) -> None:
    # The image's own config (with the fixture's loopback listen), demo limited to one session
    # so that a second one is refused and counted as a drop.
    config = yaml.safe_load(DOCKER_CONFIG.read_text())
    config.pop("listen")
    config["servers"]["demo"]["max_sessions"] = 1
    env = {"MCP_BRIDGE_TOKEN": CLIENT_TOKEN, "MCP_BRIDGE_METRICS_TOKEN": METRICS_TOKEN}
    client = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    scraper = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    async with bridge(config, env=env) as b, aiohttp.ClientSession() as http:
        # A rejection: /metrics without a token.
        async with http.get(b.base + "/metrics") as resp:
            assert resp.status == 401
        # The scrape token reaches /metrics, never a server.
        async with http.get(b.url("demo"), headers=scraper) as resp:
            assert resp.status == 403
        async with RawSse(b.url("demo"), headers=client) as c:
            await c.initialize()
            reply = await c.request("tools/call", call("echo", {"text": "deploy"}), request_id=2)
            assert "result" in reply, reply
            # A drop: the second session is over max_sessions.
            async with http.get(b.url("demo"), headers=client) as resp:
                assert resp.status == 503
            async with http.get(b.base + "/metrics", headers=scraper) as resp:
                assert resp.status == 200
                text = await resp.text()
            # The image's HEALTHCHECK command, pointed at this daemon, passes.
            health = [part.replace("127.0.0.1:8080", f"127.0.0.1:{b.port}") for part in healthcheck_command()]
            assert health[0] == "python"
            proc = await asyncio.create_subprocess_exec(
                PY, *health[1:], stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            async with asyncio.timeout(30):
                _, err = await proc.communicate()
            assert proc.returncode == 0, err

    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    # PromQL names samples, not families: a histogram is only there as _bucket/_sum/_count
    # and a counter only with _total, so a query on the bare family name must fail.
    assert "mcp_bridge_request_duration_seconds_bucket" in samples
    assert "mcp_bridge_request_duration_seconds" not in samples
    assert "mcp_bridge_sessions_dropped_total" in samples and "mcp_bridge_sessions_dropped" not in samples

    alert_names = check_queries(alert_queries(), samples)
    legend = {t["expr"]: t.get("legendFormat", "") for t in dashboard_targets()}
    dashboard_names = check_queries([(q, legend.get(q, "")) for q in dashboard_queries()], samples)

    # What the alerts and the dashboard are for.
    assert {
        "mcp_bridge_server_up",
        "mcp_bridge_server_crash_looping",
        "mcp_bridge_sessions_dropped_total",
        "mcp_bridge_rejections_total",
    } <= alert_names, alert_names
    assert {
        "mcp_bridge_sessions_open",
        "mcp_bridge_messages_total",
        "mcp_bridge_request_duration_seconds_bucket",
        "mcp_bridge_requests_in_flight",
        "mcp_bridge_server_up",
        "mcp_bridge_server_restarts_total",
        "mcp_bridge_server_crash_looping",
        "mcp_bridge_sessions_dropped_total",
        "mcp_bridge_rejections_total",
        "mcp_bridge_bytes_total",
    } <= dashboard_names, dashboard_names
    assert any("histogram_quantile(0.99" in q and "_bucket" in q for q in dashboard_queries())


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    variables = {v["name"] for v in board["templating"]["list"]}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        for target in panel.get("targets", []):
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var.startswith("__") or var in variables, (var, target["expr"])
            assert target["datasource"]["uid"] == "${datasource}"
    assert "datasource" in variables


def test_alert_rules_are_well_formed() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule
        assert rule["annotations"]["summary"], rule
        assert re.fullmatch(r"(\d+[smhd])+", rule.get("for", "0s")), rule
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["expr"]
