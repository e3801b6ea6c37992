"""Rule 5, shared state: what the sessions on one process share of it and the mux keeps
for them, the subscriptions and the log level (the handshake's cached result is the
mux's `init_result`).

`Subscriptions` counts subscribers per uri. Invariant: a uri is held iff some open session
holds it in `Peer.subscriptions`, and the server was sent (or has queued) a subscribe for
exactly the uris held; a restarted process gets them replayed.

`Levels`: the server's log level is the most verbose any session asked for; each session
sees messages at its own level (`peer.hears`).
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.core.mux.peer import Peer
from bridge.protocol.mcp import LOG_LEVELS

LEVEL_INDEX = {name: i for i, name in enumerate(LOG_LEVELS)}  # lower: more verbose


class Subscriptions:
    __slots__ = ("by_uri",)

    def __init__(self) -> None:
        self.by_uri: dict[str, set[str]] = {}

    def leave(self, uri: str, session: str) -> bool:
        """`session` no longer holds `uri`: True when it was the last to hold it (the uri is
        gone from here, and the server is to be told)."""
        subscribers = self.by_uri.get(uri)
        if subscribers is None:
            return False
        subscribers.discard(session)
        if subscribers:
            return False
        del self.by_uri[uri]
        return True

    def matching(self, uri: str) -> set[str]:
        """The sessions a `resources/updated` for `uri` concerns: those holding it, or a
        uri it is under (`file:///a/` and `file:///a` both hold `file:///a/b`)."""
        targets: set[str] = set()
        for sub, sessions in self.by_uri.items():
            if uri == sub or uri.startswith(sub if sub.endswith("/") else sub + "/"):
                targets |= sessions
        return targets

    def sizes(self) -> dict[str, int]:
        return {"subscriptions": len(self.by_uri)}


class Levels:
    __slots__ = ("upstream",)

    def __init__(self) -> None:
        self.upstream: int | None = None  # what the server was last told (None: nothing)

    @staticmethod
    def wanted(peers: Iterable[Peer]) -> int | None:
        """The most verbose level any session asked for; None when none asked."""
        levels = [p.level for p in peers if p.level is not None]
        return min(levels) if levels else None
