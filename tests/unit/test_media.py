"""Reading Accept (bridge/protocol/media.py): the q of the most specific range that matches."""

from __future__ import annotations

import pytest

from bridge.protocol.media import quality


@pytest.mark.parametrize(
    ("accept", "sse", "json"),
    [
        ("application/json, text/event-stream", 1.0, 1.0),
        ("text/event-stream;q=0, application/json", 0.0, 1.0),
        ("Text/Event-Stream ; Q=0.5", 0.5, 0.0),
        ("*/*", 1.0, 1.0),
        ("text/*", 1.0, 0.0),
        ("*/*;q=0.1, text/event-stream;q=0", 0.0, 0.1),  # the most specific range decides
        ("text/*;q=0, text/event-stream", 1.0, 0.0),
        ("application/jsonx, text/event-streams", 0.0, 0.0),  # not a substring match
        ("text/event-stream;q=x, application/json;q=2", 0.0, 0.0),  # not a weight: refused
        ("", 0.0, 0.0),
    ],
)
def test_accept_media_ranges(accept: str, sse: float, json: float) -> None:
    assert (quality(accept, "text/event-stream"), quality(accept, "application/json")) == (sse, json)
