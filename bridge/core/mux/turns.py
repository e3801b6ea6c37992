"""Calls waiting their turn (rules 4 and 9): `Turns`, one queue per principal, the
principal served least recently first; `Tally`, how many wait in all of a mux's queues."""

from __future__ import annotations

import itertools
from collections import deque

from bridge.protocol.jsonrpc import Message


class Tally:
    """How many calls wait in a mux's queues, all of them together: what the mux asks
    after every event. An attribute, not `__len__`: a `__len__` is a Python call made
    through C each time."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting = 0


class Turns:
    """Calls waiting their turn: held back for attribution (rule 4) or for a slot (rule 9).
    One queue per principal, first in, first out within it, and the principal served least
    recently goes next. So one principal's waiting calls delay another's by at most one
    turn (the attribution window, the slot) under way, however many they are."""

    __slots__ = ("_queues", "_served", "_turn", "_tally", "waiting")

    def __init__(self, tally: Tally) -> None:
        self._queues: dict[str | None, deque[Message]] = {}
        self._served: dict[str | None, int] = {}  # principal -> turn it was last let through at
        self._turn = itertools.count()
        self._tally = tally  # shared by the mux's queues
        self.waiting = 0  # how many calls are in this one

    def push(self, principal: str | None, msg: Message) -> None:
        queue = self._queues.get(principal)
        if queue is None:
            queue = self._queues[principal] = deque()
        queue.append(msg)
        self.waiting += 1
        self._tally.waiting += 1

    def peek(self) -> Message:
        """The call `pop` returns next."""
        return self._queues[self._next()][0]

    def pop(self) -> Message:
        principal = self._next()
        queue = self._queues[principal]
        msg = queue.popleft()
        if not queue:
            del self._queues[principal]
        self.waiting -= 1
        self._tally.waiting -= 1
        return msg

    def _next(self) -> str | None:
        return min(self._queues, key=lambda p: self._served.get(p, -1))

    def served(self, principal: str | None) -> None:
        self._served[principal] = next(self._turn)

    def forget(self, principal: str | None) -> None:
        """The principal has no session left here."""
        self._served.pop(principal, None)

    def holds(self, principal: str | None, upstream_id: int) -> bool:
        """Whether the call with `upstream_id` waits here (among its principal's)."""
        queue = self._queues.get(principal)
        return queue is not None and any(msg["id"] == upstream_id for msg in queue)

    def remove(self, upstream_id: int) -> bool:
        for principal, queue in self._queues.items():
            for i, msg in enumerate(queue):
                if msg["id"] == upstream_id:
                    del queue[i]
                    self.waiting -= 1
                    self._tally.waiting -= 1
                    if not queue:
                        del self._queues[principal]
                    return True
        return False

    def clear(self) -> None:
        self._queues.clear()
        self._tally.waiting -= self.waiting
        self.waiting = 0
