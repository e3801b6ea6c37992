"""What tracing runs with: the config's `telemetry.traces` over the standard OTEL_* variables.
Imports nothing of OpenTelemetry (`start` imports `spans` when tracing is on)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from bridge.config.schema import Config, Traces

if TYPE_CHECKING:
    from bridge.traces.spans import Spans

_SAMPLERS: Final = {"always_on": 1.0, "always_off": 0.0, "parentbased_always_on": 1.0, "parentbased_always_off": 0.0}


@dataclass(frozen=True, slots=True)
class Settings:
    """What tracing runs with, from the config's `telemetry.traces` over the OTEL_* variables."""

    endpoint: str | None  # None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    protocol: str
    headers: Mapping[str, str]  # empty: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)HEADERS
    ratio: float
    service_name: str
    queue_size: int


def settings(config: Config, environ: Mapping[str, str]) -> Settings | None:
    """Tracing's settings, or None when it is off: neither the config nor the environment
    names a collector (or OTEL_TRACES_EXPORTER is `none`)."""
    traces = config.telemetry.traces
    env_endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if traces is None and (not env_endpoint or environ.get("OTEL_TRACES_EXPORTER", "otlp") == "none"):
        return None
    traces = traces or Traces()
    protocol = traces.protocol or environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    ratio = traces.sampler.ratio
    if ratio is None:
        ratio = _env_ratio(environ)
    name = traces.service_name or environ.get("OTEL_SERVICE_NAME") or "mcp-bridge"
    return Settings(traces.endpoint, protocol, dict(traces.headers), ratio, name, traces.queue_size)


def _env_ratio(environ: Mapping[str, str]) -> float:
    """OTEL_TRACES_SAMPLER (and its _ARG) as a ratio of root traces: 1 when unset or unknown."""
    sampler = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler in _SAMPLERS:
        return _SAMPLERS[sampler]
    if sampler in ("traceidratio", "parentbased_traceidratio"):
        try:
            return min(1.0, max(0.0, float(environ.get("OTEL_TRACES_SAMPLER_ARG", "1"))))
        except ValueError:
            return 1.0
    return 1.0




def start(config: Config, environ: Mapping[str, str] = os.environ) -> Spans | None:
    """The daemon's tracing, or None when it is off (OpenTelemetry is then never imported)."""
    found = settings(config, environ)
    if found is None:
        return None
    from bridge.traces.spans import Spans

    return Spans(found)
