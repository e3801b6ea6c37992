"""2026-07-28's `requestState`: what the bridge hands a client between the rounds of a
multi-round call, sealed (HMAC) so that only a replica holding the keys can read it, and
naming the replica that holds the parked call."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from bridge.core.cluster import Owner
from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import RequestId
from bridge.protocol.stateless import StatelessError


class State(msgspec.Struct, frozen=True):
    """What a `requestState` holds: the parked call it resumes and what it is bound to."""

    park: str  # the parked call's key
    principal: str | None
    method: str
    digest: str  # of the request's params, apart from _meta, inputResponses and requestState
    server: str
    owner: Owner | None = None  # in a cluster: the replica, and its life, holding the parked call


def digest(params: Mapping[str, Any]) -> str:
    """What a retry must repeat of the original request: its params, apart from `_meta`,
    `inputResponses` and `requestState` (msgspec encodes dict keys in order: canonical enough,
    since an SDK's retry rebuilds params the same way)."""
    salient = {k: v for k, v in params.items() if k not in ("_meta", "inputResponses", "requestState")}
    return hashlib.sha256(jsonrpc.encode(salient)).hexdigest()


class StateKeys:
    """Seals and opens `requestState`: an HS256 JWT with an expiry. Alone, under a key made
    at daemon start (so a state does not outlive the daemon that parked its call); in a
    cluster, under keys derived from the peer keys (the first signs, either opens), so that
    any replica can verify a state and read which replica holds its call."""

    def __init__(self, keys: tuple[bytes, ...] = (), owner: Owner | None = None) -> None:
        self._keys = keys or (secrets.token_bytes(32),)
        self._owner = owner

    def seal(self, state: State, ttl: float) -> str:
        import jwt  # PyJWT (with cryptography) costs resident memory: only once a call is parked

        claims = {
            "k": state.park, "p": state.principal, "m": state.method, "d": state.digest, "s": state.server,
            "exp": int(time.time() + ttl) + 1,
        }  # fmt: skip
        if self._owner is not None:
            claims["o"], claims["e"] = self._owner.address, self._owner.epoch
        return jwt.encode(claims, self._keys[0], algorithm="HS256")

    def open(self, token: object, rid: RequestId | None) -> State:
        """The state a token holds; -32602 saying why when it is not one this daemon (or, in a
        cluster, a peer) sealed, or has expired."""
        import jwt

        if not isinstance(token, str):
            raise StatelessError(jsonrpc.INVALID_PARAMS, "requestState must be a string", request_id=rid)
        claims: dict[str, Any] | None = None
        for key in self._keys:
            try:
                claims = jwt.decode(token, key, algorithms=["HS256"], options={"require": ["exp"]})
                break
            except jwt.InvalidSignatureError:
                continue  # perhaps sealed under the previous peer key
            except jwt.ExpiredSignatureError:
                raise StatelessError(jsonrpc.INVALID_PARAMS, "requestState has expired (limits.request_state_ttl)", request_id=rid) from None
            except jwt.InvalidTokenError:
                break
        if claims is None:
            raise StatelessError(jsonrpc.INVALID_PARAMS, "requestState is not valid: not issued by this bridge, or altered", request_id=rid)
        address, epoch = claims.get("o"), claims.get("e")
        owner = Owner(address, epoch) if isinstance(address, str) and isinstance(epoch, str) else None
        return State(str(claims.get("k")), claims.get("p"), str(claims.get("m")), str(claims.get("d")), str(claims.get("s")), owner)

    @staticmethod
    def peek(token: object) -> str | None:
        """The park key a token names, unverified: to end a parked call its owner's retry spoiled."""
        import jwt

        if not isinstance(token, str):
            return None
        try:
            key = jwt.decode(token, options={"verify_signature": False}).get("k")
        except jwt.InvalidTokenError:
            return None
        return key if isinstance(key, str) else None
