"""The era translator: a 2026-07-28 stdio server behind a mux that speaks 2025.

One `Translator` sits between a process and its mux, for the life of that
process. It does no IO: the upstream feeds it what the mux sends and what the
process writes, and carries out the `Out`s it returns, in order.

Rules
-----
1. Detection. At start it sends `server/discover` (with the modern `_meta`)
   and holds what the mux sends. A discover result makes the server modern;
   any other answer makes it legacy: the held messages go out unchanged and
   the upstream drops the translator, so a legacy server costs one request
   at start and nothing per message. With no answer within the timeout the
   held messages go out too, but a server slow to start may still answer
   discover before it answers an initialize (a modern one refuses that with
   -32022): then it is modern after all, and the initialize is answered here.
2. Handshake. To a modern server `initialize` does not exist: it is answered
   here from the discover result (capabilities, server info, instructions,
   the version the mux asked for when the bridge speaks it). `ping` is
   answered here; `notifications/initialized` and `roots/list_changed` are
   absorbed.
3. Per request. Every request gets the modern `_meta`: the version, the
   bridge's client info, the capabilities of the `initialize` the mux sent
   (the bridge's own in shared and per-principal mode, the client's per
   session), and the log
   level `logging/setLevel` last set (answered here).
4. Input. A `tools/call`, `prompts/get` or `resources/read` answered
   `input_required` becomes one server request per input request, each
   about that call (`Ask`), under an id of this module's own (a string with
   `ID_PREFIX`, which the mux's integer ids never are). When all are answered the call is sent
   again, under a new id, with `inputResponses` and the server's
   `requestState`; its final answer goes to the mux under the call's id. A
   client's error for any of them fails the call. Rounds per call, input
   requests per round and calls waiting for input are bounded; time is the
   mux's: a call that times out there is cancelled, and forgotten here.
5. Subscriptions. `resources/subscribe` and `unsubscribe` (the mux sends
   the first subscribe and the last unsubscribe of each uri) change the set
   of uris one `subscriptions/listen` request keeps open upstream, with the
   list-change notifications the server can send. A changed set opens a new
   listen; the old one is cancelled once the new one is acknowledged, and a
   subscribe is answered then (refused if the acknowledgment leaves its uri
   out). Notifications of listens no longer wanted are dropped.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeGuard

from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import Kind, Message, ProtocolError, RequestId
from bridge.protocol.mcp import (
    CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    LATEST_PROTOCOL_VERSION,
    LOG_LEVEL_KEY,
    MRTR_METHODS,
    PROTOCOL_VERSIONS,
    SERVER_INFO_KEY,
    STATELESS_VERSION,
    SUBSCRIPTION_KEY,
    UNSUPPORTED_VERSION,
    VERSION_KEY,
)

# How many times one call may come back input_required, how many input requests one
# such answer may carry, and how many calls may wait for their clients' answers at once.
MAX_ROUNDS, MAX_INPUTS, MAX_PARKED = 8, 16, 1024
MAX_HELD = 256  # messages from the mux held while the era is being found out
DISCOVER_TIMEOUT_S = 3.0  # then the held messages go out as to a legacy server (rule 1)
ID_PREFIX = "mcp-bridge-era-"  # the ids of this module's own requests (never the mux's ints)
_LIST_CHANGES = (("tools", "toolsListChanged"), ("prompts", "promptsListChanged"), ("resources", "resourcesListChanged"))


class Era(enum.Enum):
    DETECTING = "detecting"
    LEGACY = "legacy"  # 2024-11-05 .. 2025-11-25: initialize, sessions, server requests
    MODERN = "modern"  # 2026-07-28: discover, per-request _meta, input_required


class Write(NamedTuple):
    """Send this to the process."""

    message: Message


class Deliver(NamedTuple):
    """Hand this to the mux as if the process had sent it."""

    message: Message


class Ask(NamedTuple):
    """Hand this server request to the mux: it is about the mux's call `upstream_id`."""

    upstream_id: RequestId
    message: Message


class Wake(NamedTuple):
    """Call `Translator.wake()` after `delay` seconds."""

    delay: float


class Decided(NamedTuple):
    """The era is known (`reason` says how): log it. A legacy server needs no translator once
    `final`; before, a late discover answer may still show it modern (rule 1)."""

    era: Era
    reason: str
    final: bool = True


Out = Write | Deliver | Ask | Wake | Decided


@dataclass(slots=True, eq=False)
class _Call:
    """A call that may come back input_required: the mux's request, kept to send again."""

    upstream_id: RequestId  # the mux's id: the one its answer must carry
    method: str
    params: dict[str, Any]
    current: RequestId  # the id the server knows it by now
    parked: bool = False  # answered input_required: waiting for its clients' answers
    rounds: int = 0
    waiting: dict[str, str] = field(default_factory=dict)  # our ask id -> the server's input key
    responses: dict[str, Any] = field(default_factory=dict)
    state: Any = None  # the server's requestState, echoed as is


class Translator:
    def __init__(
        self,
        *,
        client_info: tuple[str, str],
        era: Literal["auto", "modern"] = "auto",
        discover_timeout: float = DISCOVER_TIMEOUT_S,
    ) -> None:
        self.era = Era.DETECTING
        self.forced = era == "modern"
        self.discover_timeout = discover_timeout
        self.discovered: dict[str, Any] | None = None
        self._client_info = {"name": client_info[0], "version": client_info[1]}
        self._capabilities: dict[str, Any] = {}
        self._level: str | None = None
        self._ids = itertools.count(1)
        self._discover_id = self._new_id()
        self._held: list[Message] = []
        self._failure = ""
        # After a discover timeout: initializes sent since, by id, until one is answered (rule 1);
        # and those a late discover answer made ours to answer, whose refusal is dropped.
        self._watching = False
        self._initializes: dict[RequestId, Message] = {}
        self._refused: set[RequestId] = set()
        self._calls: dict[RequestId, _Call] = {}  # by the mux's id
        self._retries: dict[str, _Call] = {}  # by the id of the retry in flight
        self._asks: dict[str, _Call] = {}  # our ask id -> its call
        self._parked = 0
        self._uris: set[str] = set()
        self._listen: str | None = None  # the listen for what is wanted now
        self._live: str | None = None  # the listen acknowledged last: the one whose notices go on
        self._subscribes: list[tuple[RequestId, str]] = []  # (the mux's id, its uri): answered on an ack

    def _new_id(self) -> str:
        return f"{ID_PREFIX}{next(self._ids)}"

    def start(self) -> list[Out]:
        params = {"_meta": {VERSION_KEY: STATELESS_VERSION, CLIENT_INFO_KEY: self._client_info, CAPABILITIES_KEY: {}}}
        return [Write(jsonrpc.request(self._discover_id, "server/discover", params)), Wake(self.discover_timeout)]

    def wake(self) -> list[Out]:
        if self.era is not Era.DETECTING or self.forced:
            return []  # configured modern: the mux's initialize_timeout is the only bound
        return self._legacy(f"no answer to server/discover within {self.discover_timeout:g}s", late=True)

    def origin(self, request_id: RequestId) -> RequestId | None:
        """The mux's id for a request of ours the process had no room for (None: not the mux's)."""
        if not _ours(request_id):
            return request_id
        call = self._retries.get(request_id)
        if call is None:
            return None
        self._forget(call)  # the mux fails it without telling the server
        return call.upstream_id

    # ------------------------------------------------------------ detection

    def _decide(self, msg: Message) -> list[Out]:
        result = msg.get("result")
        if result.__class__ is dict and STATELESS_VERSION in (result.get("supportedVersions") or ()):
            self.era = Era.MODERN
            self.discovered = result
            out: list[Out] = [Decided(Era.MODERN, "server/discover answered")]
            held, self._held = self._held, []
            for message in held:
                out += self._from_mux(message)
            return out
        if result.__class__ is dict:
            return self._legacy(f"server/discover offers none of our versions: {result.get('supportedVersions')!r}")
        error = msg.get("error")
        detail = error.get("message") if error.__class__ is dict else error
        return self._legacy(f"server/discover refused: {detail!r}")

    def _legacy(self, reason: str, *, late: bool = False) -> list[Out]:
        """Legacy, unless configured modern. `late`: after a timeout, when a server slow to
        start may yet answer discover: until the initialize is answered, both are watched."""
        if self.forced:
            # Configured modern: nothing to fall back to. What waits fails, the mux's own
            # initialize with it, and the supervisor restarts the server.
            self.era = Era.MODERN
            self._failure = f"server configured era modern, but {reason}"
            held, self._held = self._held, []
            return [Decided(Era.MODERN, self._failure), *(o for m in held for o in self._refuse(m))]
        self.era = Era.LEGACY
        held, self._held = self._held, []
        if late:
            self._watching = True
            self._initializes = {m["id"]: m for m in held if m.get("method") == "initialize" and "id" in m}
            reason += "; watching for a late answer until an initialize is answered"
        return [Decided(Era.LEGACY, reason, final=not late), *(Write(m) for m in held)]

    def _late(self, msg: Message) -> list[Out]:
        """After the timeout: an answer to our discover, or to an initialize sent since."""
        request_id = msg["id"]
        if request_id == self._discover_id:
            result = msg.get("result")
            if result.__class__ is not dict or STATELESS_VERSION not in (result.get("supportedVersions") or ()):
                return self._settled("server/discover refused too, late")
            self.era, self.discovered, self._watching = Era.MODERN, result, False
            initializes, self._initializes = self._initializes, {}
            self._refused.update(initializes)  # the server refuses them: the mux has our answer
            out: list[Out] = [Decided(Era.MODERN, "server/discover answered, after the timeout")]
            for initialize in initializes.values():
                out += self._initialize(initialize)
            return out
        error = msg.get("error")
        if error.__class__ is dict and error.get("code") == UNSUPPORTED_VERSION:
            return []  # how a modern server refuses initialize: its discover answer is coming
        return [Deliver(msg), *self._settled("answered initialize")]

    def _settled(self, reason: str) -> list[Out]:
        self._watching, self._initializes = False, {}
        return [Decided(Era.LEGACY, reason)]

    # ------------------------------------------------------------ from the mux

    def from_mux(self, msg: Message) -> list[Out]:
        if self.discovered is not None:
            return self._from_mux(msg)
        if self.era is Era.LEGACY:
            if self._watching and msg.get("method") == "initialize" and "id" in msg:
                self._initializes[msg["id"]] = msg
            return [Write(msg)]
        if self.era is Era.MODERN:  # configured so, but it did not answer server/discover
            return self._refuse(msg)
        if len(self._held) >= MAX_HELD:
            return self._refuse(msg, f"{MAX_HELD} messages already wait for the server's era to be known")
        self._held.append(msg)
        return []

    def _refuse(self, msg: Message, reason: str | None = None) -> list[Out]:
        if "method" not in msg or "id" not in msg:
            return []
        return [Deliver(jsonrpc.error(msg["id"], jsonrpc.SERVER_UNAVAILABLE, reason or self._failure))]

    def _from_mux(self, msg: Message) -> list[Out]:
        method = msg.get("method")
        if method is None:
            return self._answered(msg)
        if "id" not in msg:
            if method == "notifications/cancelled":
                return self._cancelled(msg)
            if method in ("notifications/initialized", "notifications/roots/list_changed"):
                return []
            return [Write(msg)]
        handler = _REQUESTS.get(method)
        if handler is not None:
            return handler(self, msg)
        params = self._stamp(msg)
        if method in MRTR_METHODS:
            self._calls[msg["id"]] = _Call(msg["id"], method, params, msg["id"])
        return [Write(msg)]

    def _stamp(self, msg: Message) -> dict[str, Any]:
        params = msg.get("params")
        if not isinstance(params, dict):
            params = msg["params"] = {}
        meta = params.get("_meta")
        if not isinstance(meta, dict):
            meta = params["_meta"] = {}
        meta[VERSION_KEY] = STATELESS_VERSION
        meta[CLIENT_INFO_KEY] = self._client_info
        meta[CAPABILITIES_KEY] = self._capabilities
        if self._level is not None:
            meta[LOG_LEVEL_KEY] = self._level
        return params

    def _initialize(self, msg: Message) -> list[Out]:
        params = msg.get("params")
        params = params if params.__class__ is dict else {}
        caps = params.get("capabilities")
        self._capabilities = caps if caps.__class__ is dict else {}
        asked = params.get("protocolVersion")
        discovered = self.discovered or {}
        meta = discovered.get("_meta")
        info = meta.get(SERVER_INFO_KEY) if meta.__class__ is dict else None
        result: dict[str, Any] = {
            "protocolVersion": asked if asked in PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION,
            "capabilities": discovered.get("capabilities") or {},
            "serverInfo": info if info.__class__ is dict else {"name": "unknown", "version": "0"},
        }
        if isinstance(instructions := discovered.get("instructions"), str):
            result["instructions"] = instructions
        return [Deliver(jsonrpc.result(msg["id"], result)), *self._relisten()]

    def _ping(self, msg: Message) -> list[Out]:
        return [Deliver(jsonrpc.result(msg["id"], {}))]

    def _set_level(self, msg: Message) -> list[Out]:
        level = (msg.get("params") or {}).get("level")
        self._level = level if isinstance(level, str) else None
        return [Deliver(jsonrpc.result(msg["id"], {}))]

    def _subscribe(self, msg: Message) -> list[Out]:
        uri = (msg.get("params") or {}).get("uri")
        if not isinstance(uri, str):
            return [Deliver(jsonrpc.error(msg["id"], jsonrpc.INVALID_PARAMS, "resources/subscribe needs a string uri"))]
        if uri in self._uris and self._listen == self._live:
            return [Deliver(jsonrpc.result(msg["id"], {}))]
        self._subscribes.append((msg["id"], uri))
        if uri in self._uris:
            return []  # the listen that has it is not acknowledged yet
        self._uris.add(uri)
        return self._relisten()

    def _unsubscribe(self, msg: Message) -> list[Out]:
        uri = (msg.get("params") or {}).get("uri")
        if uri not in self._uris:
            return [Deliver(jsonrpc.result(msg["id"], {}))]
        self._uris.discard(uri)
        return [Deliver(jsonrpc.result(msg["id"], {})), *self._relisten()]

    def _relisten(self) -> list[Out]:
        """Open a listen for what the mux wants now. The live one is cancelled once the new one
        is acknowledged (no update is lost in between); one never acknowledged, at once."""
        caps = (self.discovered or {}).get("capabilities") or {}
        wanted: dict[str, Any] = {}
        for kind, key in _LIST_CHANGES:
            cap = caps.get(kind)
            if cap.__class__ is dict and cap.get("listChanged"):
                wanted[key] = True
        if self._uris:
            wanted["resourceSubscriptions"] = sorted(self._uris)
        out: list[Out] = []
        if self._listen is not None and self._listen != self._live:
            out.append(_cancel(self._listen, "replaced"))
        if not wanted:  # nothing to listen for: the live one goes too
            if self._live is not None:
                out.append(_cancel(self._live, "nothing wanted"))
            self._listen = self._live = None
            return out
        self._listen = listen = self._new_id()
        msg = jsonrpc.request(listen, "subscriptions/listen", {"notifications": wanted})
        self._stamp(msg)
        return [*out, Write(msg)]

    def _cancelled(self, msg: Message) -> list[Out]:
        params = msg.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        call = self._calls.get(request_id) if jsonrpc.is_id(request_id) else None
        if call is None or not isinstance(params, dict):
            return [Write(msg)]
        parked = call.parked
        self._forget(call)
        if parked:
            return []  # waiting for its clients: the server has nothing of it in hand
        params["requestId"] = call.current
        return [Write(msg)]

    def _answered(self, msg: Message) -> list[Out]:
        """A client's answer to one of our asks (the mux put our id back on it)."""
        ask_id = msg.get("id")
        if not _ours(ask_id) or (call := self._asks.pop(ask_id, None)) is None:
            return []  # its call ended meanwhile
        key = call.waiting.pop(ask_id)
        if "error" in msg:
            self._forget(call)
            error = msg["error"] if msg["error"].__class__ is dict else {}
            return [
                Deliver(
                    jsonrpc.error(
                        call.upstream_id,
                        error.get("code", jsonrpc.INTERNAL_ERROR),
                        f"the client could not give the input the server asked for ({key}): {error.get('message')}",
                    )
                )
            ]
        call.responses[key] = msg.get("result")
        if call.waiting:
            return []
        return self._retry(call)

    def _retry(self, call: _Call) -> list[Out]:
        call.parked = False
        self._parked -= 1
        call.current = retry = self._new_id()
        self._retries[retry] = call
        params = dict(call.params)
        params["inputResponses"], call.responses = call.responses, {}
        if call.state is not None:
            params["requestState"] = call.state
        msg = jsonrpc.request(call.current, call.method, params)
        self._stamp(msg)
        return [Write(msg)]

    # ------------------------------------------------------------ from the server

    def from_server(self, msg: Any) -> list[Out]:
        try:
            kind = jsonrpc.classify(msg)
        except ProtocolError:
            return [Deliver(msg)]  # the mux says what is wrong with it
        if kind is Kind.RESPONSE:
            server_id = msg["id"]
            if self._watching and (server_id == self._discover_id or server_id in self._initializes):
                return self._late(msg)
            if server_id == self._discover_id:
                return self._decide(msg) if self.era is Era.DETECTING else []
            if self.era is not Era.MODERN:
                return [Deliver(msg)]
            if server_id in self._refused:
                self._refused.discard(server_id)
                return []
            if not _ours(server_id):
                call = self._calls.get(server_id)
                if call is not None and call.current == server_id:
                    return self._call_answered(call, msg)
                return [Deliver(msg)]
            if (call := self._retries.get(server_id)) is not None:
                return self._call_answered(call, msg)
            return self._listen_answered(msg)  # or a listen since cancelled: nothing
        if kind is Kind.NOTIFICATION and self.era is Era.MODERN:
            params = msg.get("params")
            meta = params.get("_meta") if params.__class__ is dict else None
            if isinstance(meta, dict) and SUBSCRIPTION_KEY in meta:
                return self._listen_notice(msg, meta)
        return [Deliver(msg)]

    def _call_answered(self, call: _Call, msg: Message) -> list[Out]:
        result = msg.get("result")
        if result.__class__ is not dict or result.get("resultType") != "input_required":
            self._forget(call)
            msg["id"] = call.upstream_id
            return [Deliver(msg)]
        if _ours(call.current):
            del self._retries[call.current]
        call.rounds += 1
        inputs = result.get("inputRequests") or {}
        state = result.get("requestState")
        problem = None
        if call.rounds > MAX_ROUNDS:
            problem = f"the server asked for input {MAX_ROUNDS} times for one call"
        elif inputs.__class__ is not dict or len(inputs) > MAX_INPUTS:
            problem = f"inputRequests must be an object of at most {MAX_INPUTS} requests"
        elif self._parked >= MAX_PARKED:
            problem = f"{MAX_PARKED} calls already wait for their clients' input"
        elif not inputs and state is None:
            problem = "input_required with neither inputRequests nor requestState"
        elif not all(r.__class__ is dict and isinstance(r.get("method"), str) for r in inputs.values()):
            problem = "an input request without a method"
        if problem is not None:
            self._forget(call)
            return [Deliver(jsonrpc.error(call.upstream_id, jsonrpc.INTERNAL_ERROR, problem))]
        call.parked = True
        self._parked += 1
        call.state = state
        if not inputs:
            return self._retry(call)
        out: list[Out] = []
        for key, request in inputs.items():
            ask_id = self._new_id()
            call.waiting[ask_id] = key
            self._asks[ask_id] = call
            params = request.get("params")
            out.append(Ask(call.upstream_id, jsonrpc.request(ask_id, request["method"], params if params.__class__ is dict else {})))
        return out

    def _forget(self, call: _Call) -> None:
        self._calls.pop(call.upstream_id, None)
        if _ours(call.current):
            self._retries.pop(call.current, None)
        if call.parked:
            call.parked = False
            self._parked -= 1
        for ask_id in call.waiting:
            self._asks.pop(ask_id, None)
        call.waiting.clear()

    def _listen_answered(self, msg: Message) -> list[Out]:
        """The server ended a listen (it answers one only then), or refused it."""
        listen = msg["id"]
        if listen == self._live:
            self._live = None
        if listen != self._listen:
            return []
        self._listen = None
        if "error" not in msg:
            return []
        error = msg["error"] if msg["error"].__class__ is dict else {}
        reason = f"the server refused subscriptions/listen: {error.get('message')}"
        failed, self._subscribes = self._subscribes, []
        self._uris.difference_update(uri for _, uri in failed)
        return [Deliver(jsonrpc.error(mux_id, jsonrpc.INTERNAL_ERROR, reason)) for mux_id, _ in failed]

    def _listen_notice(self, msg: Message, meta: dict[str, Any]) -> list[Out]:
        listen = meta.pop(SUBSCRIPTION_KEY)  # legacy clients know no subscription ids
        if not meta:
            del msg["params"]["_meta"]
        if msg["method"] != "notifications/subscriptions/acknowledged":
            return [Deliver(msg)] if listen == self._live and listen is not None else []
        if listen != self._listen or listen is None:
            return []  # one since replaced
        out: list[Out] = []
        if self._live is not None:
            out.append(_cancel(self._live, "replaced"))
        self._live = listen
        done, self._subscribes = self._subscribes, []
        # The acknowledgment names what the server honors: a uri left out is refused.
        agreed = (msg.get("params") or {}).get("notifications")
        honored = agreed.get("resourceSubscriptions") if isinstance(agreed, dict) else None
        honored = set(honored) if isinstance(honored, list) else set()
        for mux_id, uri in done:
            if uri in honored:
                out.append(Deliver(jsonrpc.result(mux_id, {})))
            else:
                self._uris.discard(uri)
                out.append(Deliver(jsonrpc.error(mux_id, jsonrpc.INVALID_PARAMS, f"the server does not offer updates of {uri}")))
        return out

    def table_sizes(self) -> dict[str, int]:
        """How much each table holds (what a test checks is empty when nothing is under way)."""
        return {"calls": len(self._calls), "retries": len(self._retries), "asks": len(self._asks), "held": len(self._held)}


def _cancel(request_id: RequestId, reason: str) -> Write:
    return Write(jsonrpc.notification("notifications/cancelled", {"requestId": request_id, "reason": reason}))


def _ours(request_id: object) -> TypeGuard[str]:
    return isinstance(request_id, str) and request_id.startswith(ID_PREFIX)


_REQUESTS: dict[str, Callable[[Translator, Message], list[Out]]] = {
    "initialize": Translator._initialize,
    "ping": Translator._ping,
    "logging/setLevel": Translator._set_level,
    "resources/subscribe": Translator._subscribe,
    "resources/unsubscribe": Translator._unsubscribe,
}
