"""Traces: OpenTelemetry spans of the requests the bridge serves, continuing each client's
trace and handed on to its server, exported over OTLP.

`settings` reads the config and the OTEL_* variables and imports nothing of OpenTelemetry:
with tracing off, nothing of it is ever imported. `spans` (imported only when tracing is on)
holds the rules and the SDK's side.
"""
