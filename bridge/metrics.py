"""Every Prometheus metric of mcp-bridge, defined once.

Labels are bounded: `server` and `transport` come from the config and code,
`method` is a known MCP method name or `other`, `code` a known JSON-RPC error
code or `other`, `direction` and `reason` are fixed vocabularies. On the
per-message path a count is a plain integer added to a dict (no lock, no
label lookup); prometheus-client turns the integers, the state that already
lives in the gateways (sessions open, requests in flight, process up) and what
/proc says of the server processes into metric families only when `/metrics`
is scraped.
"""

from __future__ import annotations

import bisect
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Info
from prometheus_client.core import CounterMetricFamily, Exemplar, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from bridge import __version__
from bridge.access.oauth import OAuthVerifier
from bridge.process import procstat
from bridge.protocol import jsonrpc

PREFIX = "mcp_bridge"
KNOWN_METHODS = frozenset(
    {
        "initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
        "resources/templates/list", "resources/subscribe", "resources/unsubscribe", "prompts/list",
        "prompts/get", "completion/complete", "logging/setLevel", "sampling/createMessage",
        "elicitation/create", "roots/list", "tasks/get", "tasks/result", "tasks/list", "tasks/cancel",
        "notifications/initialized", "notifications/cancelled", "notifications/progress",
        "notifications/message", "notifications/resources/updated", "notifications/resources/list_changed",
        "notifications/tools/list_changed", "notifications/prompts/list_changed",
        "notifications/roots/list_changed", "notifications/tasks/status", "notifications/elicitation/complete",
    }
)  # fmt: skip
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
TRANSPORTS = ("sse", "streamable", "stateless", "group")  # group: a group session's session of a member
ERAS = ("legacy", "2026-07-28")
# JSON-RPC's codes, the bridge's own (docs/reference/errors.md) and MCP's (-32002 resource not
# found, -32042 URL elicitation required); any other code a server sends is `other`.
ERROR_CODES = frozenset(
    {
        jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST, jsonrpc.METHOD_NOT_FOUND, jsonrpc.INVALID_PARAMS,
        jsonrpc.INTERNAL_ERROR, jsonrpc.SERVER_EXITED, jsonrpc.REQUEST_TIMEOUT, jsonrpc.SERVER_UNAVAILABLE,
        jsonrpc.TOO_MANY_REQUESTS, jsonrpc.SESSION_CLOSED, jsonrpc.RESPONSE_TOO_LARGE, -32002, -32042,
        -32020, -32021, -32022,  # 2026-07-28: header mismatch, missing client capability, unsupported version
    }
)  # fmt: skip


def method_label(method: object) -> str:
    if isinstance(method, str) and (method in KNOWN_METHODS or method == "response"):
        return method
    return "other"


def code_label(error: object) -> str:
    """The label of an error object's code: a known code, or `other`."""
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code.__class__ is int and code in ERROR_CODES else "other"


class GroupView(Protocol):
    """What the scrape-time collector reads from a group (gateway/group.py)."""

    name: str
    names_left_out: Counter[str]  # by member
    requests: Counter[str]  # by member

    def session_counts(self) -> dict[str, int]: ...


class TraceCounts(Protocol):
    """What the scrape-time collector reads of tracing, when it is on (traces/spans.py)."""

    exported: int
    dropped: int


class ServerView(Protocol):
    """What the scrape-time collector reads from a gateway."""

    name: str
    metrics: ServerMetrics

    def session_counts(self) -> dict[str, int]: ...

    def inflight(self) -> int: ...

    def calls_waiting(self) -> int: ...

    def processes_up(self) -> int: ...

    def processes_by_era(self) -> dict[str, int]: ...

    def crash_looping(self) -> bool: ...

    def readiness(self) -> str | None: ...

    def pids(self) -> list[int]: ...

    def pool_sizes(self) -> dict[str, int]: ...


class Latency:
    """A histogram as plain numbers: per-bucket counts (the last is +Inf), sum, count."""

    __slots__ = ("buckets", "count", "total", "exemplars")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.count = 0
        self.total = 0.0
        # Per bucket, the last traced observation in it (OpenMetrics exemplars); None: none yet.
        self.exemplars: list[Exemplar | None] | None = None

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.count += 1
        self.total += seconds

    def exemplar(self, seconds: float, trace_id: str, span_id: str) -> None:
        """An observation's trace: its bucket's exemplar (the observation itself is `observe`'s)."""
        if self.exemplars is None:
            self.exemplars = [None] * len(self.buckets)
        self.exemplars[bisect.bisect_left(LATENCY_BUCKETS, seconds)] = Exemplar({"trace_id": trace_id, "span_id": span_id}, seconds, time.time())

    def cumulative(self) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
        running = 0
        out: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        exemplars = self.exemplars
        for i, (bound, n) in enumerate(zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.buckets, strict=True)):
            running += n
            exemplar = exemplars[i] if exemplars is not None else None
            out.append((bound, running) if exemplar is None else (bound, running, exemplar))
        return out


class ServerMetrics:
    """The counts of one server; attributes are bumped directly on the hot path."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.messages: Counter[tuple[str, str]] = Counter()
        self.durations: dict[str, Latency] = {}
        self.bytes_in = 0
        self.bytes_out = 0
        self.restarts = 0
        self.dropped_messages = 0
        self.sessions_opened: Counter[str] = Counter()
        self.eras: Counter[str] = Counter()  # messages from clients, by the protocol era they speak
        self.sessions_dropped: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()  # by code_label
        self.limit_kills: Counter[str] = Counter()  # processes ended by a limit, by rlimits key
        self.pool_waits: Counter[str] = Counter()  # sessions that waited for a process, by outcome
        self.pool_starts: Counter[str] = Counter()  # sessions' processes by where they came from
        self.pin_changes: Counter[tuple[str, str]] = Counter()  # (kind, outcome): bridge/core/pins.py
        self.slot_waits = Latency()  # how long calls waited for a slot (servers.NAME.max_concurrent_calls)
        # CPU seconds of the server's processes: each one's last reading, by (pid, start
        # time), and the sum of those of the processes that have exited since.
        self._cpu_seen: dict[tuple[int, int], float] = {}
        self._cpu_exited = 0.0

    def message(self, direction: str, method: object) -> None:
        self.messages[direction, method_label(method)] += 1

    def error_sent(self, error: object) -> None:
        self.errors[code_label(error)] += 1

    def read_processes(self, pids: Iterable[int]) -> int:
        """Read the server's running processes from /proc: their resident bytes, summed.
        A process that has exited since the last reading keeps the CPU time it had
        then in `cpu_seconds`, so that the total never goes back."""
        rss = 0
        seen: dict[tuple[int, int], float] = {}
        for pid in pids:
            usage = procstat.usage(pid)
            if usage is not None:
                rss += usage.rss_bytes
                seen[pid, usage.started] = usage.cpu_seconds
        self._cpu_exited += sum(cpu for key, cpu in self._cpu_seen.items() if key not in seen)
        self._cpu_seen = seen
        return rss

    def cpu_seconds(self) -> float:
        return self._cpu_exited + sum(self._cpu_seen.values())

    def opened(self) -> int:
        """Sessions opened that count toward the next full collection (runtime.FULL_AFTER):
        not 2026-07-28 requests, each a session for one call, which leave no cycle behind
        (measured: 0 unreachable objects after 3,000 of them; docs/design.md)."""
        return sum(self.sessions_opened.values()) - self.sessions_opened["stateless"]

    def request_done(self, method: str, seconds: float) -> None:
        # Keyed by label, not by the raw method: clients choose method names, and a
        # table keyed by them would grow with every name a client invents.
        label = method_label(method)
        latency = self.durations.get(label)
        if latency is None:
            latency = self.durations[label] = Latency()
        latency.observe(seconds)

    def traced(self, method: str, seconds: float, trace_id: str, span_id: str) -> None:
        """A traced request's trace, as an exemplar of the duration `request_done` observed."""
        latency = self.durations.get(method_label(method))
        if latency is not None:
            latency.exemplar(seconds, trace_id, span_id)


class Metrics:
    """One registry per app, so that several apps in one process never collide."""

    def __init__(self, servers: Callable[[], Iterable[ServerView]]) -> None:
        self.registry = CollectorRegistry()
        # The daemon's own process (memory, CPU, descriptors), the interpreter and its collector.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        Info(f"{PREFIX}_build", "The running mcp-bridge.", registry=self.registry).info(
            {"version": __version__, "python": platform.python_version()}
        )
        self.rejections: Counter[str] = Counter()
        self.rate_limited: Counter[tuple[str | None, str]] = Counter()  # (principal, limit) -> calls refused
        self.oauth: Callable[[], OAuthVerifier | None] = lambda: None  # the live one, set by the app
        self.traces: TraceCounts | None = None  # set by the app when tracing is on
        self.forwarding: Forwarding | None = None  # with a cluster: requests for other replicas' sessions
        # A server removed by a reload keeps its counts: counters never go back.
        self.retired: dict[str, ServerMetrics] = {}
        self.groups: Callable[[], Iterable[GroupView]] = tuple  # the live ones, set by the app
        self.registry.register(_Collector(servers, self))

    def server(self, name: str) -> ServerMetrics:
        return self.retired.pop(name, None) or ServerMetrics(name)

    def rejected(self, reason: str) -> None:
        self.rejections[reason] += 1


class _Collector(Collector):
    def __init__(self, servers: Callable[[], Iterable[ServerView]], metrics: Metrics) -> None:
        self._servers = servers
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        views = list(self._servers())
        rss = {view.name: view.metrics.read_processes(view.pids()) for view in views}  # before the CPU counter
        yield from self._counters([v.metrics for v in views] + list(self._metrics.retired.values()))
        yield from self._state(views, rss)
        rejections = CounterMetricFamily(
            f"{PREFIX}_rejections", "HTTP requests refused by access checks, by reason.", labels=["reason"]
        )
        for reason, n in sorted(self._metrics.rejections.items()):
            rejections.add_metric([reason], n)
        yield rejections
        limited = CounterMetricFamily(
            f"{PREFIX}_rate_limited",
            "Calls refused (429) by a principal's rate limits, by principal and limit (rate, in_flight).",
            labels=["principal", "limit"],
        )
        by_label: Counter[tuple[str, str]] = Counter()
        for (principal, limit), n in self._metrics.rate_limited.items():
            # Token names are few and from the config; OAuth subjects are not: one label for them.
            by_label[("oauth" if principal is not None and "://" in principal else principal or ""), limit] += n
        for (label, limit), n in sorted(by_label.items()):
            limited.add_metric([label, limit], n)
        yield limited
        yield from self._oauth()
        yield from self._groups()
        if (traces := self._metrics.traces) is not None:
            spans = CounterMetricFamily(
                f"{PREFIX}_trace_spans", "Spans handed to the trace collector (exported), or lost: its queue full, or refused (dropped).", labels=["outcome"]
            )
            spans.add_metric(["exported"], traces.exported)
            spans.add_metric(["dropped"], traces.dropped)
            yield spans
        if (forwarding := self._metrics.forwarding) is not None:
            yield from forwarding.collect()

    def _oauth(self) -> Iterator[Metric]:
        oauth = self._metrics.oauth()
        if oauth is None:
            return
        tokens = CounterMetricFamily(
            f"{PREFIX}_oauth_tokens", "OAuth access tokens checked, by outcome (ok, or the reason refused).", labels=["outcome"]
        )
        for outcome, n in sorted(oauth.outcomes.items()):
            tokens.add_metric([outcome], n)
        fetches = CounterMetricFamily(
            f"{PREFIX}_oauth_key_fetches", "Fetches of an issuer's signing keys (JWKS), by result.", labels=["issuer", "result"]
        )
        for issuer, keys in sorted(oauth.issuers.items()):
            fetches.add_metric([issuer, "ok"], keys.refreshes)
            fetches.add_metric([issuer, "failed"], keys.failures)
        yield from (tokens, fetches)

    def _counters(self, all_metrics: list[ServerMetrics]) -> Iterator[Metric]:
        opened = CounterMetricFamily(f"{PREFIX}_sessions_opened", "Client sessions opened.", labels=["server", "transport"])
        dropped = CounterMetricFamily(
            f"{PREFIX}_sessions_dropped",
            "Sessions the bridge ended or refused: slow (queue full), idle, limit (max_sessions), "
            "server_gone (server removed or reconfigured), shutdown, ended (by an administrator).",
            labels=["server", "reason"],
        )
        messages = CounterMetricFamily(
            f"{PREFIX}_messages",
            "JSON-RPC messages by direction (from_client, from_server) and method (responses: 'response').",
            labels=["server", "direction", "method"],
        )
        eras = CounterMetricFamily(
            f"{PREFIX}_client_messages",
            "JSON-RPC messages from clients by protocol era: legacy (2024-11-05 to 2025-11-25, with sessions) "
            "or 2026-07-28 (stateless).",
            labels=["server", "era"],
        )
        traffic = CounterMetricFamily(f"{PREFIX}_bytes", "Bytes of messages from_client and to_client.", labels=["server", "direction"])
        duration = HistogramMetricFamily(
            f"{PREFIX}_request_duration_seconds",
            "Time from a client request to its response, by method.",
            labels=["server", "method"],
        )
        restarts = CounterMetricFamily(f"{PREFIX}_server_restarts", "Server process exits followed by a restart.", labels=["server"])
        dropped_messages = CounterMetricFamily(
            f"{PREFIX}_dropped_messages", "Messages that could not be routed and were dropped.", labels=["server"]
        )
        errors = CounterMetricFamily(
            f"{PREFIX}_errors",
            "JSON-RPC error responses sent to clients (the server's and the bridge's), by code ('other': a code "
            "that is neither JSON-RPC's, MCP's nor the bridge's).",
            labels=["server", "code"],
        )
        waits = CounterMetricFamily(
            f"{PREFIX}_pool_waits",
            "Sessions that waited for a server process (the caps were reached), by outcome: ok, timeout "
            "(refused with 503), gone (the client left).",
            labels=["server", "outcome"],
        )
        starts = CounterMetricFamily(
            f"{PREFIX}_pool_sessions",
            "Per-session and per-principal processes given to sessions, by source: warm (from the pool), cold "
            "(started for it).",
            labels=["server", "source"],
        )
        cpu = CounterMetricFamily(
            f"{PREFIX}_server_cpu_seconds",
            "User and system CPU time of the server's processes, all of them together (an exited one up to its "
            "last reading at a scrape).",
            labels=["server"],
        )
        slot_waits = HistogramMetricFamily(
            f"{PREFIX}_call_queue_wait_seconds",
            "Time a call waited for a free slot under max_concurrent_calls, until written to the server "
            "(0 for one that found a slot free; servers without the cap observe nothing).",
            labels=["server"],
        )
        pin_changes = CounterMetricFamily(
            f"{PREFIX}_pin_changes",
            "Tools, prompts and resource templates a pinned server offered new or changed (servers.NAME.pin), by kind "
            "and outcome: held (withheld until approved), served (pin: warn), approved, rejected.",
            labels=["server", "kind", "outcome"],
        )
        limit_kills = CounterMetricFamily(
            f"{PREFIX}_server_limit_kills",
            "Server processes ended by one of their rlimits, by limit (memory, cpu_time, processes, open_files): "
            "sure for an OOM kill in a memory cgroup and for CPU time, else what the process said on stderr.",
            labels=["server", "limit"],
        )
        for m in all_metrics:
            for limit, n in sorted(m.limit_kills.items()):
                limit_kills.add_metric([m.server, limit], n)
            for transport in TRANSPORTS:
                opened.add_metric([m.server, transport], m.sessions_opened[transport])
            for reason, n in sorted(m.sessions_dropped.items()):
                dropped.add_metric([m.server, reason], n)
            for (direction, method), n in sorted(m.messages.items()):
                messages.add_metric([m.server, direction, method], n)
            for era in ERAS:
                eras.add_metric([m.server, era], m.eras[era])
            traffic.add_metric([m.server, "from_client"], m.bytes_in)
            traffic.add_metric([m.server, "to_client"], m.bytes_out)
            for method, latency in sorted(m.durations.items()):
                duration.add_metric([m.server, method], latency.cumulative(), latency.total)
            restarts.add_metric([m.server], m.restarts)
            dropped_messages.add_metric([m.server], m.dropped_messages)
            for code, n in sorted(m.errors.items()):
                errors.add_metric([m.server, code], n)
            cpu.add_metric([m.server], m.cpu_seconds())
            slot_waits.add_metric([m.server], m.slot_waits.cumulative(), m.slot_waits.total)
            for outcome, n in sorted(m.pool_waits.items()):
                waits.add_metric([m.server, outcome], n)
            for source, n in sorted(m.pool_starts.items()):
                starts.add_metric([m.server, source], n)
            for (kind, outcome), n in sorted(m.pin_changes.items()):
                pin_changes.add_metric([m.server, kind, outcome], n)
        yield from (
            opened, dropped, messages, eras, traffic, duration, restarts, dropped_messages, errors, cpu, limit_kills, waits, starts,
            slot_waits, pin_changes,
        )  # fmt: skip

    def _groups(self) -> Iterator[Metric]:
        sessions = GaugeMetricFamily(
            f"{PREFIX}_group_sessions_open",
            "Client sessions open now with a group (each holds a session of each member: transport \"group\" there).",
            labels=["group", "transport"],
        )
        left_out = CounterMetricFamily(
            f"{PREFIX}_group_names_left_out",
            "Tool and prompt names a group's member offered that, prefixed, would break MCP's tool-name rules: left out of lists.",
            labels=["group", "member"],
        )
        requests = CounterMetricFamily(
            f"{PREFIX}_group_requests",
            "Requests a group handed to each of its members (a call to one, a list to each).",
            labels=["group", "member"],
        )
        for group in self._metrics.groups():
            for transport, n in sorted(group.session_counts().items()):
                sessions.add_metric([group.name, transport], n)
            for member, n in sorted(group.names_left_out.items()):
                left_out.add_metric([group.name, member], n)
            for member, n in sorted(group.requests.items()):
                requests.add_metric([group.name, member], n)
        yield sessions
        yield left_out
        yield requests

    def _state(self, views: list[ServerView], rss: dict[str, int]) -> Iterator[Metric]:
        sessions = GaugeMetricFamily(f"{PREFIX}_sessions_open", "Client sessions open now.", labels=["server", "transport"])
        inflight = GaugeMetricFamily(f"{PREFIX}_requests_in_flight", "Client requests awaiting a response.", labels=["server"])
        waiting = GaugeMetricFamily(
            f"{PREFIX}_calls_waiting", "Client calls waiting for a free slot under max_concurrent_calls.", labels=["server"]
        )
        up = GaugeMetricFamily(
            f"{PREFIX}_server_up",
            "1 when the server can serve: its process is up and initialized (per-session: it can be started).",
            labels=["server"],
        )
        looping = GaugeMetricFamily(f"{PREFIX}_server_crash_looping", "1 while a server is in a crash loop.", labels=["server"])
        processes = GaugeMetricFamily(f"{PREFIX}_server_processes", "Server processes running.", labels=["server"])
        by_era = GaugeMetricFamily(
            f"{PREFIX}_server_processes_by_era",
            "Server processes running, by the MCP era they speak (detecting, legacy, modern).",
            labels=["server", "era"],
        )
        memory = GaugeMetricFamily(
            f"{PREFIX}_server_resident_memory_bytes",
            "Resident memory of the server's running processes, all of them together.",
            labels=["server"],
        )
        pool = GaugeMetricFamily(
            f"{PREFIX}_pool_processes",
            "Per-session and per-principal server processes by state: warm (started ahead, ready), starting "
            "(started ahead, not ready yet), in_use (given to a session or principal).",
            labels=["server", "state"],
        )
        for view in views:
            for state, n in view.pool_sizes().items():
                pool.add_metric([view.name, state], n)
            counts = view.session_counts()
            for transport in TRANSPORTS:
                sessions.add_metric([view.name, transport], counts.get(transport, 0))
            inflight.add_metric([view.name], view.inflight())
            waiting.add_metric([view.name], view.calls_waiting())
            processes.add_metric([view.name], view.processes_up())
            for era, n in sorted(view.processes_by_era().items()):
                by_era.add_metric([view.name, era], n)
            up.add_metric([view.name], 1 if view.readiness() is None else 0)
            looping.add_metric([view.name], 1 if view.crash_looping() else 0)
            memory.add_metric([view.name], rss[view.name])
        yield from (sessions, inflight, waiting, up, looping, processes, by_era, memory, pool)


class Forwarding:
    """Requests naming a session another replica owns (http/forward.py)."""

    # forwarded: the owner's answer relayed whole; owner_gone: no connection to it (404);
    # owner_restarted: it has restarted since (404); broken: it went mid-answer; busy: 503, no
    # connection free; invalid, second_hop, stale: 404 with no connection (a bad MAC or
    # principal, a peer's request for a session not here, this replica's earlier life).
    OUTCOMES = ("forwarded", "owner_gone", "owner_restarted", "broken", "busy", "invalid", "second_hop", "stale")

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.latency = Latency()  # until the owner's answer starts

    def collect(self) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            f"{PREFIX}_forwarded_requests",
            "Requests for sessions other replicas own, by outcome (docs/how-to/replicas.md).",
            labels=["outcome"],
        )
        for outcome in self.OUTCOMES:
            outcomes.add_metric([outcome], self.outcomes[outcome])
        latency = HistogramMetricFamily(
            f"{PREFIX}_forward_duration_seconds", "Time from a forwarded request to the start of its owner's answer."
        )
        latency.add_metric([], self.latency.cumulative(), self.latency.total)
        gone = CounterMetricFamily(
            f"{PREFIX}_owner_gone_answers", "404s for sessions whose replica is gone or restarted (clients start anew)."
        )
        gone.add_metric([], sum(self.outcomes[o] for o in ("owner_gone", "owner_restarted", "stale")))
        yield from (outcomes, latency, gone)
