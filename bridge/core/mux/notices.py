"""Rule 6, owners: who owns what the server may notify about after the call that made it
has ended, so that its notices reach that session and no other.

`Owners` holds the tasks a session created (by the result of its task-augmented call),
a client's own tasks the server polls (by that client's answer), and elicitations (by the
request that opened one); and the task notices that came before the result naming their
owner. Invariant: every owner named is an open session whose own set (`Peer.tasks`,
`Peer.client_tasks`, `Peer.elicitations`) holds the entry, and `forget(peer)` removes
exactly those; at most `EARLY_NOTES` notices wait for an owner.
"""

from __future__ import annotations

from collections import OrderedDict

from bridge.core.mux.peer import Peer
from bridge.protocol.jsonrpc import Message

# Task notices kept for a result still to come (see `Owners.keep_early`).
EARLY_NOTES = 256


class Owners:
    __slots__ = ("tasks", "client_tasks", "elicitations", "_early_notes", "_early_count")

    def __init__(self) -> None:
        self.tasks: dict[str, str] = {}  # server-side task -> the session that created it
        self.client_tasks: dict[str, str] = {}  # a client's own task -> that client's session
        self.elicitations: dict[str, str] = {}  # elicitation id -> the session asked
        self._early_notes: OrderedDict[str, list[Message]] = OrderedDict()
        self._early_count = 0

    def claim_task(self, peer: Peer, task_id: str) -> list[Message]:
        """`peer`'s call created `task_id`: the notices that came before it are its own."""
        peer.tasks.add(task_id)
        self.tasks[task_id] = peer.id
        early = self._early_notes.pop(task_id, [])
        self._early_count -= len(early)
        return early

    def claim_client_task(self, peer: Peer, task_id: str) -> None:
        peer.client_tasks.add(task_id)
        self.client_tasks[task_id] = peer.id

    def claim_elicitation(self, peer: Peer, elicitation_id: str) -> None:
        peer.elicitations.add(elicitation_id)
        self.elicitations[elicitation_id] = peer.id

    def keep_early(self, task_id: str, msg: Message) -> int:
        """Keep a notice for a task no result has named yet: servers may report a task
        before the result that creates it (and tells whose it is) reaches the bridge.
        Returns how many notices the bound dropped to make room (the oldest task's)."""
        self._early_notes.setdefault(task_id, []).append(msg)
        self._early_count += 1
        if self._early_count > EARLY_NOTES:
            _, dropped = self._early_notes.popitem(last=False)
            self._early_count -= len(dropped)
            return len(dropped)
        return 0

    def has_early(self) -> bool:
        return self._early_count > 0

    def drop_early(self) -> None:
        """No call that may create a task is in flight: no result will claim them."""
        self._early_notes.clear()
        self._early_count = 0

    def forget(self, peer: Peer) -> None:
        """`peer` closed: what it owned is nobody's."""
        for name in peer.tasks:
            self.tasks.pop(name, None)
        for name in peer.client_tasks:
            self.client_tasks.pop(name, None)
        for name in peer.elicitations:
            self.elicitations.pop(name, None)

    def sizes(self) -> dict[str, int]:
        return {
            "tasks": len(self.tasks) + len(self.client_tasks),
            "elicitations": len(self.elicitations),
            "early_task_notes": self._early_count,
        }
