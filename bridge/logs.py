"""structlog setup: one JSON object per line for machines, aligned text for people.

Events carry `server`, `session`, `method`, `pid` where they apply; message
payloads are never logged above debug (method, id and size only).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Literal

import msgspec
import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}


def setup(fmt: Literal["json", "console"] = "json", level: str = "info") -> None:
    shared: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if fmt == "json":
        processors = [*shared, structlog.processors.JSONRenderer(serializer=_json)]
        factory: Any = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        processors = [*shared, structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
        factory = structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )


def _json(event: dict[str, Any], **_: Any) -> bytes:
    try:
        return msgspec.json.encode(event, enc_hook=str)
    except UnicodeEncodeError:
        # A header or line that was not UTF-8 (surrogates): escape rather than lose the event.
        return json.dumps(event, default=str, ensure_ascii=True).encode()


def get(name: str = "bridge", **bound: Any) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name, **bound)
