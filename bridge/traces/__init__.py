"""Traces: OpenTelemetry spans of the requests the bridge serves, continuing each client's
trace and handed on to its server, exported over OTLP.

`settings` reads the config and the OTEL_* variables and imports nothing of OpenTelemetry:
with tracing off, nothing of it is ever imported. `spans` (imported only when tracing is on)
holds the rules and the SDK's side. Here: what the HTTP paths and the gateway hand each other
of an HTTP request's decision, importable with tracing off.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    from opentelemetry.trace import Span


class Unsampled(enum.Enum):
    """An HTTP request decided not traced (spans.py, rule 3)."""

    UNSAMPLED = "unsampled"


# What the requests an untraced HTTP request carries follow: no span is made for it, and one
# identity test tells it apart on the per-request path.
UNSAMPLED: Final = Unsampled.UNSAMPLED

if TYPE_CHECKING:
    HttpSpan: TypeAlias = Span | Unsampled  # an HTTP request's span, or its decision not to trace
