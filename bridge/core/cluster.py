"""Replicas: session ids that name the replica owning them, and where a request for one goes.

With `cluster` configured, every session id (HTTP+SSE `session_id`,
`Mcp-Session-Id`) is `base64url(HOST:PORT).epoch.random.mac`: the address
the owning replica advertises to its peers, the epoch it drew when it
started, 128 random bits, and an HMAC-SHA256 (truncated to 128 bits) of the
first three fields and of the principal that opened the session, under the
key the replicas share. Signed, not encrypted: the address is no secret to
the client that holds the id. A second key is accepted while keys rotate.

Any replica can so tell, with no shared store and before any connection,
where a session lives: its own (served here), another replica's (the
request is forwarded, http/forward.py), or nobody's (a bad MAC, a
principal that did not open it, a replica's earlier life: 404). The epoch
makes a restarted replica's old ids fail at once: the replica answers 404
itself, and a forwarder that hears so remembers the dead epoch and answers
404 without asking again.

An MRTR `requestState` (http/endpoints/stateless_2026.py) names its owner the same way:
it is sealed under a key derived from the peer key (`derived`), so every
replica can verify it, and carries the owner's address and epoch; `place`
says where a retry carrying it goes, by the same rules as an id's request.
Pure logic: no IO.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass

SEPARATOR = "."
EPOCH_BYTES = 4
RANDOM_BYTES = 16
MAC_BYTES = 16  # HMAC-SHA256 truncated to 128 bits (RFC 2104, section 5)
MAX_ID = 256  # characters: a longer id is nobody's
DEAD_EPOCHS = 4096  # (address, epoch) pairs remembered as gone; the oldest is forgotten first
FORWARDED_HEADER = "X-MCP-Bridge-Forwarded"  # on a forwarded request: the forwarder's address
RESTARTED = "the replica that owned it has restarted since"
EPOCH_HEADER = "X-MCP-Bridge-Epoch"  # on an owner's 404 for an earlier life's id: its epoch now


@dataclass(frozen=True, slots=True)
class Owner:
    """The replica an id names: where it is reached, and which life of it minted the id."""

    address: str
    epoch: str


@dataclass(frozen=True, slots=True)
class Local:
    """Served here (a forged id with this replica's prefix is simply an unknown session)."""


@dataclass(frozen=True, slots=True)
class Forward:
    owner: Owner


@dataclass(frozen=True, slots=True)
class Gone:
    """404 at once, with no connection made; `outcome` counts it (metrics). `epoch`: this
    replica's, when the id is its own from an earlier life (a forwarder learns from it that
    the id's epoch is dead)."""

    reason: str
    outcome: str
    epoch: str | None = None


Route = Local | Forward | Gone


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Cluster:
    """This replica's address, epoch and keys: mints ids, and says where a named session lives."""

    def __init__(self, advertise: str, key: str, previous_key: str | None = None, epoch: str | None = None) -> None:
        self.advertise = advertise
        self.epoch = epoch or secrets.token_hex(EPOCH_BYTES)
        self._keys = tuple(k.encode() for k in (key, previous_key) if k is not None)  # the first signs
        self._prefix = f"{_b64(advertise.encode())}.{self.epoch}."
        self._dead: OrderedDict[Owner, None] = OrderedDict()
        self.me = Owner(advertise, self.epoch)

    def new_id(self, principal: str | None) -> str:
        body = self._prefix + _b64(secrets.token_bytes(RANDOM_BYTES))
        return f"{body}.{self._mac(self._keys[0], body, principal)}"

    def is_local(self, session_id: str) -> bool:
        """Minted by this life of this replica, as far as its prefix says (the fast path's test:
        the session lookup that follows is what rejects a forged one)."""
        return session_id.startswith(self._prefix)

    def owner(self, session_id: str, principal: str | None) -> Owner | None:
        """The replica a valid id names; None for anything else: malformed, a MAC under neither
        key, or an id opened by another principal."""
        if len(session_id) > MAX_ID or not session_id.isascii() or session_id.count(SEPARATOR) != 3:
            return None
        body, _, mac = session_id.rpartition(SEPARATOR)
        if not any(hmac.compare_digest(mac, self._mac(key, body, principal)) for key in self._keys):
            return None
        address, epoch, _ = body.split(SEPARATOR)
        try:
            return Owner(base64.urlsafe_b64decode(address + "=" * (-len(address) % 4)).decode("ascii"), epoch)
        except (binascii.Error, ValueError):
            return None  # signed by a peer, but not by this program: nobody's

    def route(self, session_id: str, principal: str | None, forwarded: bool) -> Route:
        """Where a request naming `session_id` goes. `forwarded`: it came from a peer, which must
        have sent it here only because this replica owns the session (no second hop)."""
        if self.is_local(session_id):
            return Local()
        owner = self.owner(session_id, principal)
        if owner is None:
            return Gone("unknown session", "invalid")
        route = self.place(owner, forwarded)
        if isinstance(route, Gone):
            advice = "; start a new session" if route.reason == RESTARTED else ""
            return Gone(f"unknown session: {route.reason}{advice}", route.outcome, route.epoch)
        return route

    def place(self, owner: Owner, forwarded: bool) -> Route:
        """Where a request for what a verified `owner` holds goes (a session, a parked call)."""
        if owner == self.me:
            return Local()
        if owner.address == self.advertise:
            return Gone(RESTARTED, "stale", self.epoch)
        if forwarded:
            return Gone("forwarded to a replica that does not own it", "second_hop")
        if owner in self._dead:
            return Gone(RESTARTED, "owner_restarted")
        return Forward(owner)

    def derived(self, purpose: str) -> tuple[bytes, ...]:
        """Keys for `purpose`, one per peer key (the first signs): every replica derives the same
        ones, and none is the key that signs ids."""
        return tuple(hmac.new(key, f"mcp-bridge {purpose}".encode(), hashlib.sha256).digest() for key in self._keys)

    def owner_restarted(self, owner: Owner) -> None:
        """The owner answered that `owner.epoch` is not its life now: its ids are dead for good."""
        self._dead[owner] = None
        self._dead.move_to_end(owner)
        while len(self._dead) > DEAD_EPOCHS:
            self._dead.popitem(last=False)

    @staticmethod
    def _mac(key: bytes, body: str, principal: str | None) -> str:
        # The principal after a NUL, which no field of the id contains: no two inputs coincide.
        message = f"{body}\0{principal or ''}".encode()
        return _b64(hmac.new(key, message, hashlib.sha256).digest()[:MAC_BYTES])
