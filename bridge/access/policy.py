"""What a principal may see and do: tool, prompt and resource filters; rate limits.

Pure and cheap: a `View` is built once per (server, principal) from the config
and asked by the mux for every name it lists or is asked to call. Each filter
is one compiled regex per list; a name is visible when every filter that
applies (the server's own, then the principal's token's) lets it through.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import token_bucket

from bridge.config.schema import Config, Filter, RateLimit, Server

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


ANONYMOUS = "\0"  # the bucket key of the one principal there is when no tokens are configured


class Throttled(Exception):
    """A principal's calls refused by its rate limits, and when to try again."""

    def __init__(self, limit: str, retry_after: int, reason: str) -> None:
        super().__init__(reason)
        self.limit = limit  # "rate" or "in_flight": the metric's label
        self.retry_after = retry_after  # whole seconds, as Retry-After says it
        self.reason = reason


class RateLimiter:
    """Per-principal limits on calls across all servers: a token bucket (`per_second`,
    `burst`; the maths is token-bucket's) and a cap on calls in flight, counted by the
    muxes in the shared `in_flight` counter."""

    def __init__(
        self,
        default: RateLimit,
        rules: dict[str, RateLimit],
        in_flight: Counter[str | None],
        refused: Counter[tuple[str | None, str]],
    ) -> None:
        self._in_flight = in_flight
        self._refused = refused  # (principal, limit) -> calls refused: a metric, kept across reloads
        self._default = default
        self._rules = rules
        self.active = any(_limits(rule) for rule in (self._default, *self._rules.values()))
        self._storage = token_bucket.MemoryStorage()
        self._buckets: dict[str | None, token_bucket.Limiter] = {}

    @classmethod
    def of(cls, config: Config, in_flight: Counter[str | None], refused: Counter[tuple[str | None, str]]) -> RateLimiter:
        rules = {t.name: t.rate_limit for t in config.security.tokens if t.rate_limit is not None}
        return cls(config.limits.per_principal, rules, in_flight, refused)

    def admit(self, principal: str | None, calls: int) -> None:
        """Take `calls` new calls of `principal`, or raise Throttled (then nothing is taken)."""
        rule = self._rules.get(principal, self._default) if principal is not None else self._default
        if rule.in_flight is not None and self._in_flight[principal] + calls > rule.in_flight:
            self._refused[principal, "in_flight"] += calls
            raise Throttled("in_flight", 1, f"too many calls in flight for this principal (limit {rule.in_flight})")
        if rule.per_second is None:
            return
        bucket = self._buckets.get(principal)
        if bucket is None:
            burst = rule.burst or max(1, int(rule.per_second))
            bucket = self._buckets[principal] = token_bucket.Limiter(rule.per_second, burst, self._storage)
        key = principal or ANONYMOUS
        if bucket.consume(key, calls):
            return
        self._refused[principal, "rate"] += calls
        missing = calls - self._storage.get_token_count(key)
        wait = max(1, math.ceil(missing / rule.per_second))
        raise Throttled("rate", wait, f"over this principal's rate limit ({rule.per_second:g} calls a second)")


def _limits(rule: RateLimit) -> bool:
    return rule.per_second is not None or rule.in_flight is not None
