#!/usr/bin/env bash
# Makes the two base images the Dockerfile builds on, without a registry:
#   PYTHON_IMAGE  a Debian bookworm root from debootstrap with python3, pip, venv
#   NODE_IMAGE    only /usr/local/bin/node and /usr/local/lib/node_modules/npm,
#                 copied from this machine's Node.js
# Each is skipped when it exists (remove it with `podman rmi` to remake it).
# Needs root, podman, runc, debootstrap and node/npm on PATH. The machine's CA
# bundle goes into the Python root, so builds trust the HTTPS proxy that
# reaches PyPI here (a proxy CA the machine trusts, the image trusts too).
#
#   tests/image/base-images.sh
#   tests/image/podman build --format docker --network host \
#     --build-arg PYTHON_IMAGE=localhost/mcp-bridge-base/python:bookworm \
#     --build-arg NODE_IMAGE=localhost/mcp-bridge-base/node:bookworm -t mcp-bridge .
# (`--format docker`: the OCI format has no HEALTHCHECK; podman drops it.)
set -euo pipefail
podman="$(dirname "$0")/podman"

PYTHON_IMAGE="${PYTHON_IMAGE:-localhost/mcp-bridge-base/python:bookworm}"
NODE_IMAGE="${NODE_IMAGE:-localhost/mcp-bridge-base/node:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if "$podman" image exists "$PYTHON_IMAGE"; then
    echo "base-images: $PYTHON_IMAGE exists"
else
    echo "base-images: making $PYTHON_IMAGE (debootstrap bookworm from $MIRROR)"
    debootstrap --variant=minbase \
        --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
        bookworm "$work/python" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
        || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
    cp /etc/ssl/certs/ca-certificates.crt "$work/python/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$work/python/var/cache/apt/archives/"*.deb "$work/python/var/lib/apt/lists/"*
    tar -C "$work/python" --numeric-owner -cf - . \
        | "$podman" import --quiet --change 'CMD ["python3"]' - "$PYTHON_IMAGE" >/dev/null
fi

if "$podman" image exists "$NODE_IMAGE"; then
    echo "base-images: $NODE_IMAGE exists"
else
    node="$(readlink -f "$(command -v node)")"
    npm="$(npm root -g)/npm"
    echo "base-images: making $NODE_IMAGE from $node ($("$node" --version)) and $npm"
    mkdir -p "$work/node/usr/local/bin" "$work/node/usr/local/lib/node_modules"
    cp "$node" "$work/node/usr/local/bin/node"
    cp -a "$npm" "$work/node/usr/local/lib/node_modules/npm"
    tar -C "$work/node" --numeric-owner -cf - . | "$podman" import --quiet - "$NODE_IMAGE" >/dev/null
fi
