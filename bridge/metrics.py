"""Every Prometheus metric of mcp-bridge, defined once.

Labels are bounded: `server` and `transport` come from the config and code,
`method` is a known MCP method name or `other`, `direction` and `reason` are
fixed vocabularies. Counters on the per-message path go through children
cached per (server, label) so that a message costs a dict lookup and an
increment. State that already lives elsewhere (sessions open, requests in
flight, process up) is read at scrape time by a collector instead of being
kept twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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


def method_label(method: object) -> str:
    return method if method in KNOWN_METHODS else "other"  # type: ignore[return-value]


class ServerView(Protocol):
    """What the scrape-time collector reads from a gateway."""

    name: str

    def session_counts(self) -> dict[str, int]: ...

    def inflight(self) -> int: ...

    def processes_up(self) -> int: ...

    def crash_looping(self) -> bool: ...

    def readiness(self) -> str | None: ...


class Metrics:
    """One registry per app, so that several apps in one process never collide."""

    def __init__(self, servers: Callable[[], Iterable[ServerView]]) -> None:
        disable_created_metrics()  # `_created` series double the scrape for nothing dashboards use
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_opened = Counter(f"{PREFIX}_sessions_opened", "Client sessions opened.", ["server", "transport"], registry=r)
        self.sessions_dropped = Counter(
            f"{PREFIX}_sessions_dropped",
            "Sessions the bridge ended or refused: slow (queue full), idle, limit (max_sessions), "
            "server_gone (server removed or reconfigured), shutdown.",
            ["server", "reason"],
            registry=r,
        )
        self.messages = Counter(
            f"{PREFIX}_messages",
            "JSON-RPC messages by direction (from_client, from_server) and method (responses: 'response').",
            ["server", "direction", "method"],
            registry=r,
        )
        self.bytes = Counter(
            f"{PREFIX}_bytes", "Bytes of messages from_client and to_client.", ["server", "direction"], registry=r
        )
        self.request_duration = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Time from a client request to its response, by method.",
            ["server", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.restarts = Counter(f"{PREFIX}_server_restarts", "Server process exits followed by a restart.", ["server"], registry=r)
        self.dropped_messages = Counter(
            f"{PREFIX}_dropped_messages", "Messages that could not be routed and were dropped.", ["server"], registry=r
        )
        self.rejections = Counter(
            f"{PREFIX}_rejections", "HTTP requests refused by access checks, by reason.", ["reason"], registry=r
        )
        r.register(_StateCollector(servers))

    def server(self, name: str) -> ServerMetrics:
        return ServerMetrics(self, name)


class ServerMetrics:
    """The metrics of one server with label children cached for the hot path."""

    def __init__(self, metrics: Metrics, server: str) -> None:
        self._m = metrics
        self.server = server
        self._messages: dict[tuple[str, str], Any] = {}
        self._durations: dict[str, Any] = {}
        self.bytes_in = metrics.bytes.labels(server, "from_client")
        self.bytes_out = metrics.bytes.labels(server, "to_client")
        self.restarts = metrics.restarts.labels(server)
        self.dropped_messages = metrics.dropped_messages.labels(server)

    def message(self, direction: str, method: object) -> None:
        if method.__class__ is not str or (method not in KNOWN_METHODS and method != "response"):
            method = "other"
        key = (direction, method)
        child = self._messages.get(key)  # type: ignore[arg-type]
        if child is None:
            child = self._messages[key] = self._m.messages.labels(self.server, direction, method)
        child.inc()

    def request_done(self, method: str, seconds: float) -> None:
        child = self._durations.get(method)
        if child is None:
            child = self._durations[method] = self._m.request_duration.labels(self.server, method_label(method))
        child.observe(seconds)

    def session_opened(self, transport: str) -> None:
        self._m.sessions_opened.labels(self.server, transport).inc()

    def session_dropped(self, reason: str) -> None:
        self._m.sessions_dropped.labels(self.server, reason).inc()


class _StateCollector(Collector):
    def __init__(self, servers: Callable[[], Iterable[ServerView]]) -> None:
        self._servers = servers

    def collect(self) -> Iterator[Metric]:
        sessions = GaugeMetricFamily(f"{PREFIX}_sessions_open", "Client sessions open now.", labels=["server", "transport"])
        inflight = GaugeMetricFamily(f"{PREFIX}_requests_in_flight", "Client requests awaiting a response.", labels=["server"])
        up = GaugeMetricFamily(
            f"{PREFIX}_server_up",
            "1 when the server can serve: its process is up and initialized (per-session: it can be started).",
            labels=["server"],
        )
        looping = GaugeMetricFamily(f"{PREFIX}_server_crash_looping", "1 while a server is in a crash loop.", labels=["server"])
        processes = GaugeMetricFamily(f"{PREFIX}_server_processes", "Server processes running.", labels=["server"])
        for view in self._servers():
            for transport, count in {"sse": 0, "streamable": 0, **view.session_counts()}.items():
                sessions.add_metric([view.name, transport], count)
            inflight.add_metric([view.name], view.inflight())
            processes.add_metric([view.name], view.processes_up())
            up.add_metric([view.name], 1 if view.readiness() is None else 0)
            looping.add_metric([view.name], 1 if view.crash_looping() else 0)
        yield from (sessions, inflight, up, looping, processes)
