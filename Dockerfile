# syntax=docker/dockerfile:1
#
# mcp-bridge image: the daemon plus Node.js/npm (npx servers) and uv (uvx servers).
#
#   docker build -t mcp-bridge .
#   export MCP_BRIDGE_TOKEN=$(openssl rand -hex 32) MCP_BRIDGE_METRICS_TOKEN=$(openssl rand -hex 32)
#   docker run -d --name mcp-bridge -p 127.0.0.1:8080:8080 \
#     -e MCP_BRIDGE_TOKEN -e MCP_BRIDGE_METRICS_TOKEN \
#     --read-only --tmpfs /tmp:exec,mode=1777,size=1g --tmpfs /home/mcp:exec,mode=1777 \
#     --cap-drop ALL --security-opt no-new-privileges --stop-timeout 45 \
#     mcp-bridge
#
# The default config (config/docker.yaml, at /etc/mcp-bridge/servers.yaml) binds
# 0.0.0.0:8080 and requires both tokens; mount your own file over it to serve
# other servers. See deploy/README.md.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:22-bookworm-slim

# ---------------------------------------------------------------- builder
# Builds the mcp-bridge wheel and wheels of all its dependencies, so the
# runtime stage installs offline and carries no build tools.
FROM ${PYTHON_IMAGE} AS builder
ARG UV_VERSION=0.13.8
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bridge/ bridge/
RUN pip wheel --wheel-dir /wheels ".[otel]" "uv==${UV_VERSION}"

# ---------------------------------------------------------------- node
# Node.js and npm come from the official image of the same Debian release
# (same glibc); only the runtime and npm are copied.
FROM ${NODE_IMAGE} AS node

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime

# tini runs as PID 1 (ENTRYPOINT): it forwards SIGTERM/SIGHUP/SIGINT to
# mcp-bridge and reaps the orphans that launchers such as npx leave when a
# server's process group is killed; mcp-bridge only waits for its own
# children, so as PID 1 it would collect zombies. `-s` (subreaper) keeps that
# working under `docker run --init` too. ca-certificates: npx/uvx use HTTPS.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# npm's settings live in its global config file, not in NPM_CONFIG_* variables:
# servers get only a minimal environment (docs/how-to/configure.md, "Server environment"), and
# npx must find its cache under /tmp whatever the config passes on. The checks
# below run npm as root, which creates /tmp/.npm: removed, or uid 10001's npx
# fails with EACCES wherever /tmp is not a fresh mount (podman copies the
# image's /tmp into a tmpfs; plain `docker run` has no tmpfs at all).
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/npm
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
    && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
    && mkdir -p /usr/local/etc \
    && printf '%s\n' cache=/tmp/.npm update-notifier=false fund=false audit=false > /usr/local/etc/npmrc \
    && node --version && npm --version && npx --version \
    && test "$(npm config get cache)" = /tmp/.npm \
    && rm -rf /tmp/.npm

# The daemon and uv in one virtualenv; its bin/ is on PATH (and the daemon
# appends its own bin/ to the servers' PATH anyway).
ENV VIRTUAL_ENV=/opt/mcp-bridge PATH=/opt/mcp-bridge/bin:$PATH
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv /opt/mcp-bridge \
    && /opt/mcp-bridge/bin/pip install --no-cache-dir --no-index --find-links=/wheels "mcp-bridge[otel]" uv \
    && mcp-bridge --version && uv --version && uvx --version

# A non-root user with a numeric uid (so Kubernetes can verify runAsNonRoot).
RUN groupadd --system --gid 10001 mcp \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/mcp --create-home --shell /usr/sbin/nologin mcp

COPY config/docker.yaml /etc/mcp-bridge/servers.yaml

# Everything the servers' tools write goes under /tmp (an emptyDir or tmpfs
# when the root filesystem is read-only; it must allow exec: npx and uvx run
# what they download). HOME is writable when it is a volume too. Only
# variables that reach the servers (docs/how-to/configure.md, "Server environment") set where:
# uv keeps its cache, tools and Pythons under the XDG directories
# (/tmp/.cache/uv, /tmp/.local/share/uv/...), npm per /usr/local/etc/npmrc.
# uv (SSL_CERT_FILE) and Node (NODE_EXTRA_CA_CERTS) trust the image's CA
# store, so a CA added to it (update-ca-certificates in a derived image) also
# works for what npx and uvx download. PYTHON* are the daemon's own.
ENV HOME=/home/mcp \
    XDG_CACHE_HOME=/tmp/.cache \
    XDG_CONFIG_HOME=/tmp/.config \
    XDG_DATA_HOME=/tmp/.local/share \
    XDG_STATE_HOME=/tmp/.local/state \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

USER 10001:10001
WORKDIR /home/mcp
EXPOSE 8080

# Liveness only (/readyz is for load balancers). Stdlib Python (no curl in
# slim), and no proxy whatever HTTP(S)_PROXY says. A plain-HTTP probe: with
# listen.tls, replace it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:8080/healthz', timeout=4)"]

# SIGTERM drains (limits.drain_timeout), then stops the servers: give it
# `docker stop -t 45` / stop_grace_period: 45s. SIGHUP reloads the config.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "-s", "--", "mcp-bridge"]
CMD ["--config", "/etc/mcp-bridge/servers.yaml"]
