"""2026-07-28 requests at `/groups/{group}/mcp`, each served by its members' own 2026-07-28 endpoint.

A 2026-07-28 request carries everything a session would hold, so a group holds none for it:
the request is checked as at a server's endpoint (`stateless.admit`), then handed, under the
member's own names (core/group.py, rule 1), to `stateless_2026.answer` with the gateway of
each member it needs, which serves it exactly as at `/servers/MEMBER/mcp` (limits, views,
pins, audit, kept sessions, MRTR, forwarding of a retry to the replica holding its call).

- A call (tools/call, prompts/get, resources/read, completion/complete) goes to the one
  member its name or URI names (rule 2: a URI listed here or matching a listed template,
  else the member whose `requestState` it carries, else every member is asked and the first,
  in the group's order, that has it answers). The member's answer is the client's as it
  comes: progress and log messages stream, its `_meta` names the member that gave it, and
  an `input_required`'s `requestState` names that member, so the retry (the same name or
  URI) resumes the call there.
- `server/discover` and the lists go to every member the principal may use, each answer
  kept in memory (`Kept`, a `Reply` that holds what it is given) and merged as a 2025 group
  session merges them (rules 3 and 4), by the group's `list_timeout` at the latest: a member
  still to answer then is left out of that answer (the client's next request sees it).
- `subscriptions/listen` goes to every member (`Listening`): the client's stream opens with
  one acknowledgement, what any member honours, once each has acknowledged or refused, and
  then carries every member's notifications as they come, until the client closes it (or
  every member's has ended).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec
from multidict import CIMultiDict, MultiMapping

from bridge.core.group import LISTS, Cursor, CursorError, Names, merge_initialize, merge_list
from bridge.gateway.gateway import Gateway
from bridge.gateway.group import Group
from bridge.http.endpoints import stateless_2026
from bridge.http.endpoints.base import Post, RequestHead
from bridge.http.endpoints.stateless_2026 import Parking
from bridge.http.errors import HttpError
from bridge.http.reply import EventSink, Reply, later
from bridge.http.streams import event
from bridge.protocol import jsonrpc, media, stateless
from bridge.protocol.jsonrpc import Message
from bridge.protocol.mcp import LISTEN, NAME_HEADER, STATELESS_VERSION, SUBSCRIPTION_KEY
from bridge.protocol.stateless import StatelessError

if TYPE_CHECKING:
    from bridge.traces import HttpSpan

_decode = msgspec.json.Decoder().decode
# Asked of every member the principal may use, and merged.
FANNED = frozenset({"server/discover", *LISTS})


def answer(post: Post[Group], msg: Any, reply: Reply, parking: Parking) -> None:
    """Answer a 2026-07-28 POST to a group (a decoded body that `stateless.is_stateless`, or a
    lone request with no session)."""
    group = post.gateway
    try:
        if not stateless_2026.is_request(msg, reply):
            return
        stateless.admit(msg, post.request.mirrored(), post.accept, None)  # the member's endpoint checks its tools' headers
        rid, method, params = msg["id"], msg["method"], msg["params"]
        members = group.allowed(post.principal)
        if not members:
            raise HttpError(403, f"token not allowed for any server of group {group.name!r}", request_id=rid)
        names = group.names_for(members)
        if method == LISTEN:
            _listen(post, msg, reply, parking, members)
            return
        if method in FANNED:
            asked = _cursors(params, members, rid) if method in LISTS else dict.fromkeys(members)
            later(reply, stateless_2026.refusing(post, msg, reply, _fan_out(post, msg, reply, parking, names, asked)), "group_request")
            return
        member, own = _member_of(group, names, parking, msg)
        if member is None:
            later(reply, stateless_2026.refusing(post, msg, reply, _ask_each(post, msg, reply, parking, members)), "group_request")
            return
        _to_member(post, member, msg, reply, parking, own)
    except StatelessError as exc:
        stateless_2026.refuse(post.gateway, reply, exc)
    except HttpError as exc:
        stateless_2026.name_request(exc, msg)
        raise


def _cursors(params: dict[str, Any], members: tuple[str, ...], rid: Any) -> dict[str, str | None]:
    """Rule 3: the members a list's page asks, each with its own cursor (None: its first page)."""
    cursor = params.get("cursor")
    if cursor is None:
        return dict.fromkeys(members)
    try:
        return dict(Cursor.decode(cursor, members))
    except CursorError:
        raise StatelessError(jsonrpc.INVALID_PARAMS, "invalid cursor", request_id=rid) from None


def _member_of(group: Group, names: Names, parking: Parking, msg: Message) -> tuple[str | None, str | None]:
    """The member a call goes to (None: ask each), and its own name for what the call names
    (rewritten in `msg`; None: a URI, which it keeps). Raises StatelessError for a name no
    member claims."""
    method, params, rid = msg["method"], msg["params"], msg["id"]
    if method in ("tools/call", "prompts/get"):
        found = names.split(params.get("name"))
        if found is None:
            what = "tool" if method == "tools/call" else "prompt"
            raise StatelessError(jsonrpc.INVALID_PARAMS, f"Unknown {what}: {params.get('name')}", request_id=rid)
        params["name"] = found[1]
        return found
    if method == "completion/complete":
        ref = params.get("ref")
        ref = ref if isinstance(ref, dict) else {}
        if ref.get("type") == "ref/prompt":
            found = names.split(ref.get("name"))
            if found is None:
                raise StatelessError(jsonrpc.INVALID_PARAMS, f"Unknown reference: {ref.get('name')}", request_id=rid)
            params["ref"] = {**ref, "name": found[1]}
            return found
        return group.routes.member_of(ref.get("uri"), names.members), None
    if method == "resources/read":
        uri = params.get("uri")
        member = group.routes.member_of(uri, names.members)
        token = params.get("requestState")
        if member is None and token is not None:  # a retry: the member holding its call
            try:
                held = parking.keys.open(token, rid).server
            except StatelessError:
                held = None  # that member's endpoint says why, when it is asked
            member = held if held in names.members else None
        return member, None
    return names.members[0], None  # no member's in particular: its endpoint answers (-32601, most likely)


def _to_member(post: Post[Group], member: str, msg: Message, reply: Reply, parking: Parking, own: str | None) -> None:
    gateway = post.gateway.gateways.get(member)
    if gateway is None:
        raise StatelessError(jsonrpc.SERVER_UNAVAILABLE, f"member {member!r} of group {post.gateway.name!r} is not configured", request_id=msg["id"], status=503)
    head = post.request if own is None else _MemberHead(post.request, own)
    stateless_2026.answer(_member_post(post, gateway, post.accept, head), msg, reply, parking)


def _member_post(post: Post[Group], gateway: Gateway, accept: str, head: RequestHead) -> Post[Gateway]:
    """The request as `gateway`'s endpoint is handed it, counted as one the group handed that member."""
    group = post.gateway
    group.requests[gateway.name] += 1
    return Post(gateway, post.principal, None, post.version, accept, post.resume_buffer, head, group.name)


class _MemberHead:
    """The request's head as the member's endpoint reads it: `Mcp-Name` mirrors the member's
    own name for what the client named by the group's (a retry forwarded to another replica
    carries it so)."""

    __slots__ = ("_head", "_name")

    def __init__(self, head: RequestHead, name: str) -> None:
        self._head = head
        self._name = name

    def fields(self) -> MultiMapping[str]:
        fields = CIMultiDict(self._head.fields())
        fields[NAME_HEADER] = self._name
        return fields

    def mirrored(self) -> stateless.Headers:
        return msgspec.structs.replace(self._head.mirrored(), name=self._name)

    def http_span(self) -> HttpSpan | None:
        return self._head.http_span()


# ------------------------------------------------------------------ asked of several


class Kept:
    """A `Reply` that keeps what it is given: one member's answer to a request the group asks
    of several. Its member's endpoint answers it as a client that takes JSON (one body)."""

    __slots__ = ("_left", "answered", "body", "status")

    streaming = False
    gone = False

    def __init__(self) -> None:
        self.answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status = 0
        self.body = b""
        self._left: Any = None

    def whole(self, status: int, body: bytes, session_id: str | None = None) -> None:
        if not self.answered.done():
            self.status, self.body = status, body
            self.answered.set_result(None)

    def error(self, exc: HttpError) -> None:
        self.whole(exc.status, exc.body())

    def open_stream(self, session_id: str | None, first: bytes = b"") -> EventSink:
        raise AssertionError("asked with Accept: application/json, a member's endpoint answers with one body")

    def end_stream(self, last: bytes = b"") -> None:
        raise AssertionError("asked with Accept: application/json, a member's endpoint answers with one body")

    def abort(self) -> None:
        self.whole(502, jsonrpc.encode(jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, "the member's answer was cut off")))

    def watch(self, left: Any) -> None:
        self._left = left

    def drop(self) -> None:
        """Not waited for any more (past list_timeout, or the client went): the member's call ends."""
        if not self.answered.done():
            self.answered.cancel()
            if self._left is not None:
                self._left()

    def message(self) -> Message:
        try:
            msg = _decode(self.body)
        except msgspec.DecodeError:
            return jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, "the member's answer is not JSON")
        return msg if isinstance(msg, dict) else jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, "the member's answer is not an object")


def _ask(post: Post[Group], member: str, body: bytes, parking: Parking, cursor: str | None = None) -> Kept:
    """Ask `member` the request encoded in `body` (a copy of its own: an endpoint changes what it is given)."""
    kept = Kept()
    gateway = post.gateway.gateways.get(member)
    if gateway is None:
        kept.whole(503, jsonrpc.encode(jsonrpc.error(None, jsonrpc.SERVER_UNAVAILABLE, "it is not configured")))
        return kept
    msg = _decode(body)
    if cursor is not None:
        msg["params"]["cursor"] = cursor
    try:
        stateless_2026.answer(_member_post(post, gateway, media.JSON, post.request), msg, kept, parking)
    except HttpError as exc:
        kept.error(exc)
    return kept


async def _gathered(kept: Iterable[Kept], timeout: float | None) -> None:
    kept = list(kept)
    try:
        if kept:
            await asyncio.wait([k.answered for k in kept], timeout=timeout)
    finally:
        for k in kept:
            k.drop()


async def _fan_out(post: Post[Group], msg: Message, reply: Reply, parking: Parking, names: Names, asked: dict[str, str | None]) -> None:
    """`server/discover` or a list: every member's answer, merged (rules 3 and 4)."""
    group, method, rid = post.gateway, msg["method"], msg["id"]
    msg["params"].pop("cursor", None)
    body = jsonrpc.encode(msg)
    kept = {member: _ask(post, member, body, parking, cursor) for member, cursor in asked.items()}
    await _gathered(kept.values(), group.config.list_timeout)
    answers: list[tuple[str, dict[str, Any]]] = []
    failed: Kept | None = None
    for member, k in kept.items():
        if k.answered.cancelled():
            continue  # past list_timeout
        result = k.message().get("result")
        if isinstance(result, dict):
            answers.append((member, result))
        elif failed is None:
            failed = k
    if not answers:
        if failed is not None:
            _send(post, reply, failed.status, failed.body)
        else:
            error = jsonrpc.error(rid, jsonrpc.REQUEST_TIMEOUT, f"no member of group {group.name!r} answered {method} within {group.config.list_timeout}s")
            _send(post, reply, 200, jsonrpc.encode(error))
        return
    if method == "server/discover":
        result = stateless.discover(merge_initialize(group.name, STATELESS_VERSION, answers))
    else:
        page = merge_list(method, names, answers, group.routes)
        group.left_out(page.left_out)
        result = page.result
    message = jsonrpc.result(rid, result)
    status = stateless.complete(message, method, group.identity())
    _send(post, reply, status, jsonrpc.encode(message))


async def _ask_each(post: Post[Group], msg: Message, reply: Reply, parking: Parking, members: tuple[str, ...]) -> None:
    """A URI no member is known to have: each member is asked, and the first (in the group's
    order) that answers with a result is the client's answer, and the URI's member from now."""
    body = jsonrpc.encode(msg)
    kept = {member: _ask(post, member, body, parking) for member in members}
    await _gathered(kept.values(), None)
    refused: Kept | None = None
    for member, k in kept.items():
        answer = k.message()
        if isinstance(answer.get("result"), dict):
            uri = msg["params"].get("uri") if msg["method"] == "resources/read" else None
            if isinstance(uri, str):
                post.gateway.routes.listed(member, uri)
            _send(post, reply, k.status, k.body)
            return
        error = answer.get("error")
        # The first member's refusal, unless it serves no such method at all (-32601) and another does.
        if refused is None or (_code(refused) == jsonrpc.METHOD_NOT_FOUND and not (isinstance(error, dict) and error.get("code") == jsonrpc.METHOD_NOT_FOUND)):
            refused = k
    assert refused is not None  # a group has a member
    _send(post, reply, refused.status, refused.body)


def _code(kept: Kept) -> object:
    error = kept.message().get("error")
    return error.get("code") if isinstance(error, dict) else None


# ------------------------------------------------------------------ listen


def _listen(post: Post[Group], msg: Message, reply: Reply, parking: Parking, members: tuple[str, ...]) -> None:
    listening = Listening(reply, msg["id"], members, post.gateway.limits.slow_bytes)
    body = jsonrpc.encode(msg)
    for member in members:
        gateway = post.gateway.gateways.get(member)
        if gateway is None:
            listening.refused(member, 503, b"")
            continue
        try:
            stateless_2026.answer(_member_post(post, gateway, post.accept, post.request), _decode(body), listening.of(member), parking)
        except HttpError as exc:
            listening.refused(member, exc.status, exc.body())


class Listening:
    """One `subscriptions/listen` at a group: a listen at each member, whose streams are the
    client's one stream. The members' events pass as they are (each is tagged with the
    client's subscription id already); only the acknowledgements merge, and only the last
    member's end ends the client's stream."""

    def __init__(self, reply: Reply, rid: Any, members: tuple[str, ...], held_limit: int) -> None:
        self.reply = reply
        self.rid = rid
        self.members = members
        self.waiting = set(members)
        self.open = set(members)  # members whose listen has not ended
        self.acks: dict[str, dict[str, Any]] = {}  # member -> its acknowledgement
        self.refusal: tuple[int, bytes] | None = None
        self.sink: EventSink | None = None
        self.held: list[bytes] = []  # events before every member has acknowledged
        self.held_bytes = 0
        self.held_limit = held_limit
        self.lefts: list[Any] = []
        self.over = False
        reply.watch(self.left)

    def of(self, member: str) -> MemberListen:
        return MemberListen(self, member)

    def acknowledged(self, member: str, first: bytes) -> None:
        for line in first.split(b"\n"):
            if line.startswith(b"data: "):
                ack = _decode(line[6:])
                if isinstance(ack, dict) and isinstance(ack.get("params"), dict):
                    self.acks[member] = ack
        self._settled(member)

    def refused(self, member: str, status: int, body: bytes) -> None:
        if self.refusal is None and body:
            self.refusal = (status, body)
        self.open.discard(member)
        self._settled(member)

    def _settled(self, member: str) -> None:
        self.waiting.discard(member)
        if self.waiting or self.over:
            return
        if not self.acks:
            self.over = True
            status, body = self.refusal or (503, jsonrpc.encode(jsonrpc.error(self.rid, jsonrpc.SERVER_UNAVAILABLE, "no member could listen")))
            self.reply.whole(status, body)
            return
        acks = [self.acks[m] for m in self.members if m in self.acks]  # merged in the group's order
        ack = acks[0]
        agreed: dict[str, Any] = {}
        for each in acks:
            for flag, value in (each["params"].get("notifications") or {}).items():
                if flag == "resourceSubscriptions" and isinstance(value, list):
                    agreed[flag] = list(dict.fromkeys([*agreed.get(flag, []), *value]))
                elif value is True:
                    agreed[flag] = True
        ack = {**ack, "params": {**ack["params"], "notifications": agreed}}
        self.sink = self.reply.open_stream(None, event(jsonrpc.encode(ack)) + b"".join(self.held))
        self.held.clear()
        if not self.open:
            self._end()

    def write(self, data: bytes) -> None:
        if self.over:
            return
        if self.sink is not None:
            self.sink.write(data)
            return
        self.held.append(data)
        self.held_bytes += len(data)
        if self.held_bytes > self.held_limit:
            self.left()
            self.reply.abort()

    def unsent(self) -> int:
        return self.sink.unsent() if self.sink is not None else self.held_bytes

    def ended(self, member: str, last: bytes) -> None:
        """A member's listen ended (its server went, shutdown): its last events but its final answer."""
        self.write(last[: last.rfind(b"event: message\n")])
        self.open.discard(member)
        if not self.open and not self.waiting:
            self._end()

    def _end(self) -> None:
        if self.over:
            return
        self.over = True
        done = jsonrpc.result(self.rid, {"resultType": "complete", "_meta": {SUBSCRIPTION_KEY: self.rid}})
        self.reply.end_stream(event(jsonrpc.encode(done)))

    def left(self) -> None:
        """The client went: every member's listen ends."""
        self.over = True
        lefts, self.lefts = self.lefts, []
        for left in lefts:
            left()


class MemberListen:
    """The `Reply` one member's listen is answered through, and its stream's sink."""

    __slots__ = ("listening", "member")

    streaming = False

    def __init__(self, listening: Listening, member: str) -> None:
        self.listening = listening
        self.member = member

    @property
    def gone(self) -> bool:
        return self.listening.over

    def whole(self, status: int, body: bytes, session_id: str | None = None) -> None:
        self.listening.refused(self.member, status, body)

    def error(self, exc: HttpError) -> None:
        self.listening.refused(self.member, exc.status, exc.body())

    def open_stream(self, session_id: str | None, first: bytes = b"") -> EventSink:
        self.listening.acknowledged(self.member, first)
        return self

    def write(self, data: bytes) -> None:
        self.listening.write(data)

    def unsent(self) -> int:
        return self.listening.unsent()

    def end_stream(self, last: bytes = b"") -> None:
        self.listening.ended(self.member, last)

    def abort(self) -> None:
        listening = self.listening
        listening.left()
        listening.reply.abort()

    def watch(self, left: Any) -> None:
        self.listening.lefts.append(left)


def _send(post: Post[Group], reply: Reply, status: int, body: bytes) -> None:
    """One answer, as the client takes it: a JSON body, else one event."""
    if stateless.accepts(post.accept)[1]:
        reply.whole(status, body)
    else:
        reply.end_stream(event(body))
