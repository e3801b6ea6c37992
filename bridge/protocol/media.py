"""Media types of MCP's HTTP transports, and the reading of `Accept` (RFC 9110, 12.5.1)."""

from __future__ import annotations

import functools

JSON = "application/json"


SSE = "text/event-stream"


# Clients send the same few Accept values on every request: each is read once. Bounded, as a
# client may send any value.
@functools.lru_cache(maxsize=128)
def quality(accept: str, media_type: str) -> float:
    """How much `accept` (an Accept header's value) wants `media_type`: the q of the most
    specific media range that matches it (RFC 9110, 12.5.1), 0 when none does."""
    kind = media_type.partition("/")[0]
    best, best_q = -1, 0.0
    for item in accept.split(","):
        media_range, *params = item.split(";")
        media_range = media_range.strip().lower()
        if media_range == media_type:
            specificity = 2
        elif media_range == f"{kind}/*":
            specificity = 1
        elif media_range == "*/*":
            specificity = 0
        else:
            continue
        if specificity > best:
            best, best_q = specificity, _q(params)
    return best_q


def _q(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0  # not a weight: refuse the range rather than guess
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0
