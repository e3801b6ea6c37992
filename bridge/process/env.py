"""What a server process gets of the daemon's environment: a short list of names every
program needs (`CHILD_ENV`), what the server's config lets through (`inherit_env`), and
its own `env`. Nothing else: the bridge's tokens and keys, and other servers' secrets,
live in the rest."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from bridge.config.schema import Server
from bridge.process import confine

# What every server gets of the daemon's environment: a name, or a prefix ending in `*`.
# Listed in the docs/how-to/configure.md, "Server environment".
CHILD_ENV = (
    # to run at all: programs, user, shell, terminal, temporary files, time zone, locale
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", "LANG", "LANGUAGE", "LC_*",
    # where tools keep caches and settings (uv and others; read-only containers point them at a volume)
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
    "XDG_CONFIG_DIRS", "XDG_DATA_DIRS",
    # the network as the host reaches it: npx/uvx downloads and servers' own calls
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
)


def child_env(server: Server, environ: Mapping[str, str], who: confine.Identity | None = None) -> dict[str, str]:
    """A server's environment: the CHILD_ENV and `inherit_env` variables of `environ`,
    then the server's own `env` over them; for a server run as another user (`who`),
    that user's HOME, USER and LOGNAME."""
    patterns = CHILD_ENV + server.inherit_env
    names = {p for p in patterns if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    env = {k: v for k, v in environ.items() if k in names or k.startswith(prefixes)}
    env.update(server.env)
    if who is not None:
        confine.user_env(env, who, server.env)
    # Commands installed beside the bridge (its own venv's bin/) should resolve
    # even when that directory is not on PATH; appended, so it shadows nothing.
    own_bin = os.path.dirname(sys.executable)
    path = env.get("PATH", "")
    if own_bin not in path.split(os.pathsep):
        env["PATH"] = f"{path}{os.pathsep}{own_bin}" if path else own_bin
    return env
