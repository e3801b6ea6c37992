"""structlog setup: one JSON object per line for machines, aligned text for people.

Events carry `server`, `session`, `method`, `pid` where they apply; message
payloads are never logged above debug (method, id and size only).

Records of the standard library's `logging` (aiohttp, asyncio, warnings, and
the tracebacks Python prints itself for finalizers and threads) run through
the same processors as the daemon's own events, to the same stream: nothing a
client or a library provokes can put a line of another shape (a traceback,
say) into the JSON stream.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from typing import Any, Literal

import msgspec
import structlog
import token_bucket
from aiohttp.http_exceptions import HttpProcessingError

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}
# Requests aiohttp could not parse: a burst of this many `bad_request` events, then this many a second.
BAD_REQUEST_BURST, BAD_REQUEST_RATE = 10, 1.0
_QUOTED = re.compile(r"\s(?:bytearray\(|b?['\"])")  # where aiohttp starts quoting the request
_BUCKET = b"events"  # a Throttle is its own limiter: one bucket each


def setup(fmt: Literal["json", "console"] = "json", level: str = "info") -> None:
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_json)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    chain = [
        structlog.processors.add_log_level,
        stamp,
        structlog.processors.format_exc_info,
        renderer,
    ]
    # The daemon's own events go straight to stderr (a quarter of the cost of a trip
    # through `logging`); records of `logging` take the same chain to the same stream.
    structlog.configure(
        processors=chain,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name],  # which library logged it
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *chain],
        )
    )
    handler.setLevel(LEVELS[level])
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
    logging.captureWarnings(True)
    # The two places Python itself prints tracebacks to stderr, past `logging`.
    sys.unraisablehook = _unraisable
    threading.excepthook = _thread_died
    # aiohttp logs a request it cannot parse with a traceback (at debug when it is the
    # connection's first, e.g. TLS on the plain port): every level reaches the filter,
    # which turns it into a `bad_request` event; the handler's level judges the rest.
    server = logging.getLogger("aiohttp.server")
    server.setLevel(logging.DEBUG)
    for old in [f for f in server.filters if isinstance(f, BadRequests)]:
        server.removeFilter(old)
    server.addFilter(BadRequests())


class Stamper:
    """`timestamp`: when the event happened, ISO 8601 in UTC to the microsecond
    (`2026-12-02T06:15:42.123456Z`), the date and time formatted once a second.
    structlog's TimeStamper formats each line with `datetime.isoformat`, which was
    3% of the instructions of a whole call (the audit line is one per call)."""

    __slots__ = ("_second",)

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")  # one tuple: a thread that logs sees a whole pair

    def __call__(self, logger: object, name: str, event: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        whole = int(now)
        second, text = self._second
        if whole != second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            self._second = (whole, text)
        event["timestamp"] = f"{text}.{int((now - whole) * 1e6):06d}Z"
        return event


stamp = Stamper()


def _unraisable(u: sys.UnraisableHookArgs) -> None:
    """An exception in a finalizer or a callback, with nowhere to go."""
    where = u.err_msg or "Exception ignored in"
    logging.getLogger("python").error("%s: %r", where, u.object, exc_info=u.exc_value)


def _thread_died(t: threading.ExceptHookArgs) -> None:
    name = t.thread.name if t.thread is not None else None
    logging.getLogger("python").error("Exception in thread %s", name, exc_info=t.exc_value)


def _json(event: dict[str, Any], **_: Any) -> str:
    try:
        return msgspec.json.encode(event, enc_hook=_plain).decode()
    except UnicodeEncodeError:
        # A header or line that was not UTF-8 (surrogates): escape rather than lose the event.
        return json.dumps(event, default=str, ensure_ascii=True)


def _plain(value: object) -> object:
    """What msgspec cannot encode by itself: config numbers (Duration, Size: float and int
    subclasses) as numbers, anything else as its text."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    return str(value)


def get(name: str = "bridge", **bound: Any) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name, **bound)
    return logger


class Throttle:
    """Lets a burst of `burst` events through, then `rate` a second (a token bucket),
    and counts the ones it holds back so that the next one let through can say so."""

    __slots__ = ("_limiter", "suppressed")

    def __init__(self, rate: float, burst: int) -> None:
        self._limiter = token_bucket.Limiter(rate, burst, token_bucket.MemoryStorage())
        self.suppressed = 0

    def allow(self) -> int | None:
        """None if this event is held back; else how many were held back before it."""
        if not self._limiter.consume(_BUCKET):
            self.suppressed += 1
            return None
        held, self.suppressed = self.suppressed, 0
        return held


class BadRequests(logging.Filter):
    """Turns aiohttp's record of a request it could not parse (bad request line, bad
    header, oversized head, invalid chunking, TLS or garbage on the plain port...)
    into one rate-limited `bad_request` event: the reason, the client's address,
    no bytes of the request and no traceback."""

    def __init__(self) -> None:
        super().__init__()
        self._throttle = Throttle(BAD_REQUEST_RATE, BAD_REQUEST_BURST)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        suppressed = self._throttle.allow()
        if suppressed is not None:
            args = record.args
            remote = args[0] if isinstance(args, tuple) and len(args) == 1 else None
            get().warning("bad_request", status=exc.code, reason=bad_request_reason(exc), remote=remote, suppressed=suppressed)
        return False


def bad_request_reason(exc: HttpProcessingError) -> str:
    """aiohttp's reason on one line, without the request bytes its messages quote."""
    text = _QUOTED.split(" ".join(exc.message.split()), 1)[0]
    return text.rstrip(" :")[:120] or type(exc).__name__
