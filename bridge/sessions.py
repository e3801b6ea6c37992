"""Client sessions: id, owner, a bounded outbound queue, idle tracking.

A transport subclasses `Session` to say how messages reach its client. The
gateway only calls `deliver` (which must never block: a full queue returns
False and the gateway drops the session as too slow), `flush` (once what one
batch of input produced is delivered) and `end`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from typing import Generic, TypeVar

from .jsonrpc import RequestId

T = TypeVar("T")


def new_session_id() -> str:
    return secrets.token_hex(16)  # 128 bits from the OS CSPRNG


class Outbox(Generic[T]):
    """A bounded FIFO that one writer drains in batches (one socket write per batch)."""

    __slots__ = ("_items", "_limit", "_waiter", "closed")

    def __init__(self, limit: int) -> None:
        self._items: deque[T] = deque()
        self._limit = limit
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> bool:
        if self.closed:
            return True
        if len(self._items) >= self._limit:
            return False
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return True

    async def get_batch(self) -> list[T] | None:
        """Everything queued, waiting for at least one item; None once closed and empty."""
        while not self._items:
            if self.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        batch = list(self._items)
        self._items.clear()
        return batch

    def close(self) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Session:
    transport = "none"

    def __init__(self, server: str, owner: str | None, session_id: str | None = None) -> None:
        self.id = session_id or new_session_id()
        self.server = server
        self.owner = owner
        self.created = time.monotonic()
        self.last_seen = self.created  # the client's last request: idle reaping
        self.last_pinged = self.created
        self.ended = False
        self.end_reason: str | None = None

    def deliver(self, data: bytes, related: RequestId | None, final: bool) -> bool:
        raise NotImplementedError

    def flush(self) -> None:
        """Write what `deliver` queued, if this transport holds messages back for one write."""

    def attached(self) -> bool:
        """Whether a client connection is waiting on this session right now."""
        raise NotImplementedError

    def keepalive(self) -> None:
        """Write a comment on every open stream, so proxies and clients see it is alive."""
        raise NotImplementedError

    def end(self, reason: str) -> None:
        self.ended = True
        self.end_reason = reason
