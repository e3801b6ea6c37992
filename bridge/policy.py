"""What a principal may see of a server: tool, prompt and resource filters.

Pure and cheap: a `View` is built once per (server, principal) from the config
and asked by the mux for every name it lists or is asked to call. Each filter
is one compiled regex per list; a name is visible when every filter that
applies (the server's own, then the principal's token's) lets it through.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .config import Config, Filter, Server

KINDS = ("tools", "prompts", "resources")


@dataclass(frozen=True, slots=True)
class Rule:
    """One allow/deny pair, compiled: deny wins; without an allow list, all is allowed."""

    allow: re.Pattern[str] | None
    deny: re.Pattern[str] | None

    @classmethod
    def of(cls, spec: Filter) -> Rule | None:
        if spec.allow is None and not spec.deny:
            return None
        return cls(None if spec.allow is None else _compile(spec.allow), _compile(spec.deny) if spec.deny else None)

    def admits(self, name: str) -> bool:
        if self.deny is not None and self.deny.match(name):
            return False
        return self.allow is None or self.allow.match(name) is not None


def _compile(patterns: Iterable[str]) -> re.Pattern[str]:
    # fnmatch.translate anchors each pattern at the end; `match` anchors it at the start.
    # An empty allow list matches nothing: `(?!)` never matches.
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns) or "(?!)")


@dataclass(frozen=True, slots=True)
class View:
    """The tools, prompts and resources (by uri) one principal may see of one server."""

    tools: tuple[Rule, ...] = ()
    prompts: tuple[Rule, ...] = ()
    resources: tuple[Rule, ...] = ()

    def admits(self, kind: str, name: object) -> bool:
        """Whether `name` (of `kind`: tools, prompts or resources) is visible; a name that
        is not a string is left to the server to refuse."""
        if not isinstance(name, str):
            return True
        return all(rule.admits(name) for rule in getattr(self, kind))


def views(config: Config, server_name: str) -> tuple[View | None, dict[str, View | None]]:
    """The view of a server for a principal without a token of its own (no auth), and the
    view for each token's principal. None where nothing is filtered (the common case)."""
    server = config.servers[server_name]
    default = _view(server, None)
    return default, {token.name: _view(server, (token.tools, token.prompts, token.resources), server_name) for token in config.security.tokens}


def _view(server: Server, narrowing: tuple[dict[str, Filter], ...] | None, server_name: str = "") -> View | None:
    rules: dict[str, tuple[Rule, ...]] = {}
    for i, kind in enumerate(KINDS):
        specs = [getattr(server, kind)]
        if narrowing is not None and server_name in narrowing[i]:
            specs.append(narrowing[i][server_name])
        rules[kind] = tuple(rule for spec in specs if (rule := Rule.of(spec)) is not None)
    if not any(rules.values()):
        return None
    return View(**rules)
