"""How a Streamable HTTP request is answered: a whole body or a stream of events, written at
once (never waited on) by the exchange its session's deliveries drive. `aiohttp_reply` adapts
aiohttp's response; the fast path's `_Reply` is the other. A reply is output only: what the
request said is read before it is made."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from bridge import logs
from bridge.http.errors import INTERNAL_ERROR, HttpError


class EventSink(Protocol):
    """Where a stream's events go: written at once, never waited on. What the socket has
    not taken yet is `unsent`, which the session's byte limit counts: a client that does
    not read is dropped as too slow rather than waited for (as `SseSession` does)."""

    def write(self, data: bytes) -> None:
        """Send framed events (dropped when the client is gone)."""

    def unsent(self) -> int:
        """Bytes written and not yet taken by the socket."""

    @property
    def gone(self) -> bool:
        """The client's connection is closed or closing: nothing more will reach it."""


class Reply(Protocol):
    """How a Streamable HTTP request is answered, on either path (aiohttp's, or the fast
    path's connection). The exchange that answers it (streamable_2025.py, stateless_2026.py) is driven by
    its session's deliveries, so no task waits for the answer: it ends the reply with exactly
    one of `whole`, `error`, `end_stream` or `abort`, from whichever callback the answer came
    in. When the client goes first, the callback given to `watch` is called instead."""

    @property
    def streaming(self) -> bool:
        """The stream's head has been sent: what is left to say goes in it."""

    @property
    def gone(self) -> bool: ...

    def whole(self, status: int, body: bytes, session_id: str | None = None) -> None:
        """The whole answer: a JSON body, or none (202)."""

    def error(self, exc: HttpError) -> None:
        """The request refused; once the stream is under way nothing can be said: aborted."""

    def open_stream(self, session_id: str | None, first: bytes = b"") -> EventSink:
        """Start the answer as a stream of events; `first`, when given, goes with its head."""

    def end_stream(self, last: bytes = b"") -> None:
        """End the stream, `last` (framed events) in the same write."""

    def abort(self) -> None:
        """Close the connection mid-answer: the client reads its answer as broken."""

    def watch(self, left: Callable[[], object]) -> None:
        """Call `left` if the client goes before the answer has ended (one watcher: the latest)."""



def later(reply: Reply, step: Coroutine[Any, Any, None], where: str) -> asyncio.Task[None]:
    """Run the one part of an answer that must wait (a process to start, another replica's
    answer) as a task: what it raises becomes the reply's error, and the client going
    cancels it. The common case never needs one."""

    async def run() -> None:
        try:
            await step
        except HttpError as exc:
            reply.error(exc)
        except asyncio.CancelledError:
            pass  # the client went: returned rather than re-raised, so no frame is kept
        except Exception:
            logs.get().exception("internal_error", where=where)
            reply.error(INTERNAL_ERROR)

    task = asyncio.get_running_loop().create_task(run())
    reply.watch(task.cancel)
    return task


def chunk(data: bytes) -> bytes:
    """`data` framed as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
