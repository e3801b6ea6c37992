"""Tracing's settings (bridge/traces/settings.py): the config's `telemetry.traces` over the OTEL_*
variables; and, with tracing off, OpenTelemetry never imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from bridge.config.load import build
from bridge.traces.settings import Settings, settings

SERVERS: dict[str, Any] = {"servers": {"s": {"command": "true"}}}


def of(telemetry: dict[str, Any] | None, **environ: str) -> Settings | None:
    data = {**SERVERS, **({"telemetry": telemetry} if telemetry is not None else {})}
    return settings(build(data, "test", environ={}), environ)


def test_off_unless_the_config_or_the_environment_names_a_collector() -> None:
    assert of(None) is None
    assert of({}) is None  # telemetry without traces
    assert of(None, OTEL_SERVICE_NAME="x", OTEL_TRACES_SAMPLER="always_on") is None
    assert of(None, OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318", OTEL_TRACES_EXPORTER="none") is None
    on = of(None, OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318")
    assert on == Settings(None, "http/protobuf", {}, 1.0, "mcp-bridge", 2048)  # the exporter reads the endpoint itself


def test_the_config_wins_over_the_environment_and_the_environment_fills_what_it_leaves_unset() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:4318/v1/traces",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "from-env",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    assert of({"traces": {}}, **environ) == Settings(None, "grpc", {}, 0.25, "from-env", 2048)
    mine = {"endpoint": "http://mine:4318/v1/traces", "protocol": "http/protobuf", "headers": {"x-key": "k"}, "sampler": {"ratio": 0.01}, "service_name": "edge", "queue_size": 10}
    assert of({"traces": mine}, **environ) == Settings("http://mine:4318/v1/traces", "http/protobuf", {"x-key": "k"}, 0.01, "edge", 10)


@pytest.mark.parametrize(
    ("sampler", "arg", "ratio"),
    [("always_off", None, 0.0), ("parentbased_always_off", None, 0.0), ("traceidratio", "0.5", 0.5), ("traceidratio", "7", 1.0), ("traceidratio", "x", 1.0), ("jaeger_remote", None, 1.0)],
)
def test_the_standard_sampler_variables_as_a_ratio(sampler: str, arg: str | None, ratio: float) -> None:
    environ = {"OTEL_TRACES_SAMPLER": sampler, **({"OTEL_TRACES_SAMPLER_ARG": arg} if arg is not None else {})}
    found = of({"traces": {}}, **environ)
    assert found is not None and found.ratio == ratio


def test_a_ratio_outside_0_to_1_and_an_unknown_protocol_are_refused_at_load() -> None:
    from bridge.config.schema import ConfigError

    with pytest.raises(ConfigError, match="telemetry.traces.sampler.ratio"):
        of({"traces": {"sampler": {"ratio": 1.5}}})
    with pytest.raises(ConfigError, match="telemetry.traces.protocol"):
        of({"traces": {"protocol": "http/json"}})


def test_with_tracing_off_opentelemetry_is_never_imported() -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        from bridge.app import create_app
        from bridge.config.load import build

        async def main():
            app = create_app(build({"servers": {"s": {"command": "true"}}}, "test", environ={}))
            assert app is not None

        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
