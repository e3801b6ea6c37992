"""Groups: several servers behind one endpoint, what is the group's own, as data (sans-IO).

A group session holds one session per member, each a session of that member's own gateway
and mux, so that ids, progress, cancellation, subscriptions, log levels and server requests
are rewritten and routed exactly as for a direct session. What the group adds is here.

Rules
-----
1. Names. A member's tool or prompt NAME is shown as MEMBER + separator + NAME (`Names`).
   A shown name keeps to MCP's tool-name rules (`TOOL_NAME`: 1 to 128 of A-Z a-z 0-9 _ - .):
   member names and the separator are checked when the config loads (config/load.py), so that
   only a name a server offers can break them; such a name is left out of the list and
   reported (`Page.left_out`). No member's name followed by the separator begins another
   member's (checked at load too), so a shown name splits one way only; a name no member
   claims is unknown.
2. Resources keep their URIs (they are global already). A URI goes to the member that
   last listed it in this session, else to the first whose template listed in it matches
   it (`Routes`), else to the one member that serves resources, if only one does, else it
   is not found.
3. Lists merge in the members' order. A page of the group's list holds a page of each
   member that has more; its cursor names each such member and that member's own cursor
   (`Cursor`), opaque to the client.
4. initialize: the group declares a capability when at least one member does, and a
   sub-capability (`listChanged`, `subscribe`) when one of those does; `instructions` are
   the members' under headings; `serverInfo` names the group; the protocol version is
   the one every member answered, else the oldest of theirs (what all of them speak).
5. Server requests: each member's request ids are mapped to ids unique in the group
   session (`Asked`); a client's answer goes back to the member and the id it came from.
   At most `limit` are outstanding: past it the oldest is forgotten (its member's mux
   times it out, as for a client that never answers).
6. Routing (`GroupSession`): a call goes to the member its name or URI names, under the
   client's own id (each member session has its own ids); what the group asks of every
   member (`initialize`, `logging/setLevel`, the lists: `FANNED`) goes under ids of its
   own and is answered once every member asked has answered or gone, with what those
   that answered said (the first error, when none did); a list, by the group's
   `list_timeout` at the latest (`overdue`), the late member's entries announced when
   they come, by the list's `list_changed`. A member that goes fails the calls it held
   (-32003, naming it); the rest of the group goes on.
7. Tasks: a task's id goes to the member that answered a call with it, sent its status or
   listed it (`Routes.task`); `tasks/list` merges as the lists do; an id no member ran is
   invalid params.
8. Members change (a reload): a member that leaves fails what waited on it and its names
   go; one that joins is initialized with the client's own initialize, and is the group's
   once it answers. Either way the client hears each list's `list_changed`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import Message, RequestId
from bridge.protocol.mcp import PROTOCOL_VERSIONS, RESOURCE_NOT_FOUND_2025, TOOL_NAME

# The lists a group merges, by method: the list's field, and the field that names an item
# (tools and prompts are named, rule 1; resources and templates keep theirs, rule 2).
LISTS: Mapping[str, tuple[str, str, bool]] = {
    "tools/list": ("tools", "name", True),
    "prompts/list": ("prompts", "name", True),
    "resources/list": ("resources", "uri", False),
    "resources/templates/list": ("resourceTemplates", "uriTemplate", False),
    "tasks/list": ("tasks", "taskId", False),
}


@dataclass(frozen=True, slots=True)
class Names:
    """Rule 1: the names a group shows for its members' tools and prompts."""

    members: tuple[str, ...]
    separator: str
    _prefixes: tuple[tuple[str, str, int], ...] = field(init=False, repr=False, compare=False)  # (member, its prefix, its length)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_prefixes", tuple((m, m + self.separator, len(m) + len(self.separator)) for m in self.members))

    def show(self, member: str, name: object) -> str | None:
        """The name shown for `member`'s `name`; None when it breaks the tool-name rules."""
        if not isinstance(name, str):
            return None
        shown = member + self.separator + name
        return shown if TOOL_NAME.match(shown) else None

    def split(self, shown: object) -> tuple[str, str] | None:
        """The member and its own name for a shown one; None when no member claims it."""
        if shown.__class__ is not str:
            return None
        for member, prefix, length in self._prefixes:
            if shown.startswith(prefix) and len(shown) > length:
                return member, shown[length:]
        return None


class CursorError(ValueError):
    """A cursor the group did not give (invalid params, -32602)."""


_cursor = msgspec.json.Encoder(order="sorted")


class Cursor:
    """Rule 3: the members that have more of a list, each with its own cursor."""

    @staticmethod
    def encode(more: Mapping[str, str]) -> str | None:
        if not more:
            return None
        return base64.urlsafe_b64encode(_cursor.encode(dict(more))).decode().rstrip("=")

    @staticmethod
    def decode(cursor: object, members: Iterable[str]) -> dict[str, str]:
        if not isinstance(cursor, str) or len(cursor) > 16384:
            raise CursorError("invalid cursor")
        try:
            more = msgspec.json.decode(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        except (binascii.Error, ValueError, msgspec.DecodeError):
            raise CursorError("invalid cursor") from None
        known = set(members)
        if not isinstance(more, dict) or not more or not all(m in known and isinstance(c, str) for m, c in more.items()):
            raise CursorError("invalid cursor")
        return more


@dataclass(slots=True)
class Page:
    """A merged page of a list (rule 3), and the names left out of it (rule 1)."""

    result: dict[str, Any]
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (member, its name)


def merge_list(method: str, names: Names, pages: Sequence[tuple[str, dict[str, Any]]], routes: Routes | None = None) -> Page:
    """One page of the group's list from one page of each member's, in the members' order."""
    key, named_by, renamed = LISTS[method]
    items: list[Any] = []
    more: dict[str, str] = {}
    page = Page({key: items})
    for member, result in pages:
        for item in result.get(key) or ():
            if not isinstance(item, dict):
                continue
            own = item.get(named_by)
            if renamed:
                shown = names.show(member, own)
                if shown is None:
                    page.left_out.append((member, str(own)))
                    continue
                item = {**item, named_by: shown}
            elif routes is not None and isinstance(own, str):
                if method == "tasks/list":
                    routes.task(member, own)
                else:
                    routes.listed(member, own, template=method == "resources/templates/list")
            items.append(item)
        if isinstance(cursor := result.get("nextCursor"), str):
            more[member] = cursor
    if (cursor := Cursor.encode(more)) is not None:
        page.result["nextCursor"] = cursor
    return page


def _template(uri_template: str) -> re.Pattern[str]:
    """An RFC 6570 template as a pattern its URIs match: `{var}` one path segment,
    `{+var}` and `{#var}` anything, other operators anything with no `/`."""
    out = []
    for part in re.split(r"(\{[^}]*\})", uri_template):
        if part.startswith("{") and part.endswith("}"):
            out.append(".*" if part[1:2] in ("+", "#") else "[^/]*")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out) + r"\Z")


class Routes:
    """Rule 2: which member a URI goes to. Bounded: the URIs last listed, `limit` of them."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._uris: OrderedDict[str, str] = OrderedDict()
        self._templates: dict[str, list[tuple[str, re.Pattern[str]]]] = {}  # member -> its templates
        self._tasks: OrderedDict[str, str] = OrderedDict()  # task id -> the member running it

    def task(self, member: str, task_id: str) -> None:
        """`member` runs the task `task_id` (it answered a call with it, or listed it)."""
        self._tasks[task_id] = member
        self._tasks.move_to_end(task_id)
        if len(self._tasks) > self.limit:
            self._tasks.popitem(last=False)

    def task_of(self, task_id: object) -> str | None:
        return self._tasks.get(task_id) if isinstance(task_id, str) else None

    def listed(self, member: str, uri: str, template: bool = False) -> None:
        if template:
            mine = self._templates.setdefault(member, [])
            if all(t != uri for t, _ in mine) and len(mine) < self.limit:
                mine.append((uri, _template(uri)))
            return
        self._uris[uri] = member
        self._uris.move_to_end(uri)
        if len(self._uris) > self.limit:
            self._uris.popitem(last=False)

    def member_of(self, uri: object, members: Sequence[str]) -> str | None:
        if not isinstance(uri, str):
            return None
        if (member := self._uris.get(uri)) is not None and member in members:
            return member
        for member in members:
            for template, pattern in self._templates.get(member, ()):
                if template == uri or pattern.match(uri):
                    return member
        return None

    def forget(self, member: str) -> None:
        """A member left the group, or its lists changed: what it listed is listed again."""
        self._templates.pop(member, None)
        for uri in [u for u, m in self._uris.items() if m == member]:
            del self._uris[uri]


_CAPABILITIES = ("tools", "prompts", "resources", "logging", "completions", "tasks")


def merge_initialize(group: str, version: str, answers: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Rule 4: the group's initialize result from its members' (in the members' order)."""
    capabilities: dict[str, Any] = {}
    instructions = []
    versions = []
    for member, result in answers:
        versions.append(result.get("protocolVersion"))
        theirs = result.get("capabilities")
        for name, value in theirs.items() if isinstance(theirs, dict) else ():
            if name not in _CAPABILITIES or not isinstance(value, dict):
                continue
            mine = capabilities.setdefault(name, {})
            for sub, flag in value.items():
                if flag is True or (isinstance(flag, dict) and sub not in mine):
                    mine[sub] = flag
        if isinstance(text := result.get("instructions"), str) and text.strip():
            instructions.append(f"## {member}\n\n{text.strip()}")
    known = [v for v in versions if v in PROTOCOL_VERSIONS]
    agreed = version if versions and all(v == version for v in versions) else min(known, key=PROTOCOL_VERSIONS.index, default=version)
    out: dict[str, Any] = {"protocolVersion": agreed, "capabilities": capabilities, "serverInfo": {"name": group, "version": "group"}}
    if instructions:
        out["instructions"] = "\n\n".join(instructions)
    return out


class Asked:
    """Rule 5: the server requests a group session's client has not answered yet, by the id
    the client was given: which member asked, under which id."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._next = 0
        self._by_id: OrderedDict[int, tuple[str, Any]] = OrderedDict()

    def ask(self, member: str, member_id: Any) -> int:
        """The id the client is asked with."""
        self._next += 1
        self._by_id[self._next] = (member, member_id)
        if len(self._by_id) > self.limit:
            self._by_id.popitem(last=False)
        return self._next

    def answered(self, group_id: object) -> tuple[str, Any] | None:
        """The member and id an answer goes back to; None for an id the group did not give."""
        return self._by_id.pop(group_id, None) if isinstance(group_id, int) else None

    def id_for(self, member: str, member_id: object) -> int | None:
        """The id the client was asked `member`'s request `member_id` under (a withdrawal)."""
        return next((gid for gid, asked in self._by_id.items() if asked == (member, member_id)), None)

    def forget(self, member: str) -> None:
        for gid in [g for g, (m, _) in self._by_id.items() if m == member]:
            del self._by_id[gid]

    def __len__(self) -> int:
        return len(self._by_id)


# ----------------------------------------------------------------------------- a session


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}

class ToMember(NamedTuple):
    """Send `message` to the group session's session of `member` (opened first if need be)."""

    member: str
    message: Message


class ToClient(NamedTuple):
    """Send `message` to the group session's client; `related` and `final` as the mux's
    `ToSession` says them (the request it belongs to, and whether it is its answer)."""

    message: Message
    related: RequestId | None = None
    final: bool = False


Out = ToMember | ToClient

# The codes of the errors the bridge itself answers a call with (protocol/jsonrpc.py).
BRIDGE_ERRORS = frozenset(
    {jsonrpc.SERVER_EXITED, jsonrpc.REQUEST_TIMEOUT, jsonrpc.SERVER_UNAVAILABLE, jsonrpc.TOO_MANY_REQUESTS,
     jsonrpc.SESSION_CLOSED, jsonrpc.RESPONSE_TOO_LARGE, jsonrpc.SERVER_BUSY}
)  # fmt: skip
FANOUT_ID = "mcp-bridge-group-"  # the ids of the group's own requests to its members
# Requests routed by a name (rule 1), a URI (rule 2) or a task's id (rule 7): method -> the parameter that says.
ROUTED: Mapping[str, str] = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "resources/subscribe": "uri",
    "resources/unsubscribe": "uri",
    "tasks/get": "taskId",
    "tasks/result": "taskId",
    "tasks/cancel": "taskId",
}
# A list's change notification, by the list's method.
LIST_CHANGED: Mapping[str, str] = {
    "tools/list": "notifications/tools/list_changed",
    "prompts/list": "notifications/prompts/list_changed",
    "resources/list": "notifications/resources/list_changed",
    "resources/templates/list": "notifications/resources/list_changed",
}
# Requests every member is asked, answered when all have: method -> how the answers merge.
FANNED = frozenset({"initialize", "logging/setLevel", *LISTS})
# Notifications from the client every member hears.
TO_ALL = frozenset({"notifications/initialized", "notifications/roots/list_changed"})


_JOIN = "join"  # the group's initialize of a member that joins an open session (`GroupSession.join`)


def _changed() -> list[Out]:
    """What a client hears when the group's members change: each list may have."""
    return [ToClient(jsonrpc.notification(method)) for method in dict.fromkeys(LIST_CHANGED.values())]


@dataclass(slots=True)
class _Fanout:
    client_id: RequestId
    method: str
    waiting: set[str]
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: dict[str, Any] | None = None  # the first member's error, when every member failed
    answered: bool = False  # the client has its answer: a member's answer now is late (`overdue`)
    joining: tuple[str, ...] | None = None  # _JOIN: the group's members once this one has answered


class GroupSession:
    """One client's session with a group (rules 1-5): what the client sends becomes
    messages to its sessions of the members, and what they send becomes the client's.
    Sans-IO: each entry returns the `Out`s to carry out, in order."""

    def __init__(self, group: str, names: Names, routes: Routes | None = None, asked: int = 1024) -> None:
        self.group = group
        self.names = names
        self.routes = routes if routes is not None else Routes()
        self.asked = Asked(asked)
        self.version: str | None = None  # what the client asked for in its initialize
        self._fanouts: dict[str, tuple[str, _Fanout]] = {}  # the group's own requests: id -> the member asked, and for what
        self._ids = 0
        self._calls: dict[RequestId, str] = {}  # the client's requests in flight at one member -> that member
        self.left_out: list[tuple[str, str]] = []  # names rule 1 left out since last read
        self.negotiated: str | None = None  # the protocol version of the group's initialize result
        self._only_resources: str | None = None  # the one member with resources, if only one has them
        self._initialize: dict[str, Any] | None = None  # the client's initialize params: a member that joins later gets them

    # -------------------------------------------------------------- from the client

    def from_client(self, msg: Message) -> list[Out]:
        method = msg.get("method")
        if method is None:
            return self._answer(msg)
        if "id" not in msg:
            return self._notification(msg)
        rid = msg["id"]
        params = _object(msg.get("params"))
        if method == "ping":
            return [ToClient(jsonrpc.result(rid, {}), rid, True)]
        if method in FANNED:
            return self._fan_out(rid, method, params)
        if method == "completion/complete":
            return self._complete(msg, rid, params)
        key = ROUTED.get(method)
        if key is None:
            return [self._error(rid, jsonrpc.METHOD_NOT_FOUND, f"method not found: {method} (not served by a group)")]
        value = params.get(key)
        if key == "taskId":
            member = self.routes.task_of(value)
            if member is None or member not in self.names.members:
                return [self._error(rid, jsonrpc.INVALID_PARAMS, f"Unknown task: {value}")]
            return self._to(member, rid, msg)
        if key == "uri":
            member = self.routes.member_of(value, self.names.members) or self._only_resources
            if member is None:
                return [self._error(rid, RESOURCE_NOT_FOUND_2025, f"Resource not found: {value}", {"uri": value})]
            return self._to(member, rid, msg)
        found = self.names.split(value)
        if found is None:
            what = "tool" if method == "tools/call" else "prompt"
            return [self._error(rid, jsonrpc.INVALID_PARAMS, f"Unknown {what}: {value}")]
        member, own = found
        return self._to(member, rid, {**msg, "params": {**params, key: own}})

    def _complete(self, msg: Message, rid: RequestId, params: dict[str, Any]) -> list[Out]:
        ref = _object(params.get("ref"))
        if ref.get("type") == "ref/prompt" and (found := self.names.split(ref.get("name"))) is not None:
            member, own = found
            return self._to(member, rid, {**msg, "params": {**params, "ref": {**ref, "name": own}}})
        if ref.get("type") == "ref/resource" and (holder := self.routes.member_of(ref.get("uri"), self.names.members) or self._only_resources) is not None:
            return self._to(holder, rid, msg)
        return [self._error(rid, jsonrpc.INVALID_PARAMS, f"Unknown reference: {ref.get('name') or ref.get('uri')}")]

    def _to(self, member: str, rid: RequestId, msg: Message) -> list[Out]:
        if rid in self._calls:
            return [self._error(rid, jsonrpc.INVALID_REQUEST, f"request id {rid!r} is already in flight")]
        self._calls[rid] = member
        return [ToMember(member, msg)]

    def _fan_out(self, rid: RequestId, method: str, params: dict[str, Any]) -> list[Out]:
        asked: dict[str, dict[str, Any]] = {m: params for m in self.names.members}
        if method == "initialize":
            self.version = params.get("protocolVersion") if isinstance(params.get("protocolVersion"), str) else None
            self._initialize = params
        elif method in LISTS and "cursor" in params:
            try:
                more = Cursor.decode(params["cursor"], self.names.members)
            except CursorError:
                return [self._error(rid, jsonrpc.INVALID_PARAMS, "invalid cursor")]
            asked = {m: {**params, "cursor": c} for m, c in more.items()}
        out: list[Out] = []
        fanout = _Fanout(rid, method, set(asked))
        for member, member_params in asked.items():
            self._ids += 1
            fid = f"{FANOUT_ID}{self._ids}"
            self._fanouts[fid] = (member, fanout)
            out.append(ToMember(member, jsonrpc.request(fid, method, member_params)))
        return out

    def _notification(self, msg: Message) -> list[Out]:
        method = msg["method"]
        if method in TO_ALL:
            return [ToMember(m, msg) for m in self.names.members]
        if method == "notifications/cancelled":
            params = msg.get("params")
            rid = params.get("requestId") if isinstance(params, dict) else None
            member = self._calls.pop(rid, None) if isinstance(rid, str | int) else None
            return [ToMember(member, msg)] if member is not None else []
        return []  # nothing a member could take as meant for it

    def _answer(self, msg: Message) -> list[Out]:
        """The client answered a server request: to the member that asked, under its own id."""
        found = self.asked.answered(msg.get("id"))
        if found is None:
            return []
        member, member_id = found
        return [ToMember(member, {**msg, "id": member_id})]

    # -------------------------------------------------------------- from a member

    def from_member(self, member: str, msg: Message, related: RequestId | None = None, final: bool = False) -> list[Out]:
        if "method" not in msg:
            rid = msg.get("id")
            if isinstance(rid, str) and rid.startswith(FANOUT_ID):
                return self._fanned_in(member, rid, msg)
            if rid is not None and self.answered(member, rid):
                if "error" in msg:
                    msg = self._named(member, msg)
                elif isinstance(task := _object(_object(msg.get("result")).get("task")).get("taskId"), str):
                    self.routes.task(member, task)
            return [ToClient(msg, related, final)]
        if "id" in msg:  # a server request: asked of the client under an id of the group's
            return [ToClient({**msg, "id": self.asked.ask(member, msg["id"])}, related, final)]
        if msg["method"] == "notifications/tasks/status" and isinstance(task := _object(msg.get("params")).get("taskId"), str):
            self.routes.task(member, task)
        if msg["method"] == "notifications/cancelled" and isinstance(params := msg.get("params"), dict):
            gid = self.asked.id_for(member, params.get("requestId"))
            if gid is None:
                return []
            msg = {**msg, "params": {**params, "requestId": gid}}
        return [ToClient(msg, related, final)]

    def _named(self, member: str, msg: Message) -> Message:
        """An error the bridge made for a member (its process exited, is failing, busy, too
        slow: BRIDGE_ERRORS) says which member, as the group's own errors do."""
        error = msg["error"]
        if not isinstance(error, dict) or error.get("code") not in BRIDGE_ERRORS:
            return msg
        return {**msg, "error": {**error, "message": f"member {member!r} of group {self.group!r}: {error.get('message')}"}}

    def answered(self, member: str, rid: RequestId) -> bool:
        """`member` answered the client's call `rid` (which the client now has); whether it was
        that member's to answer. A shell that sees the answer is neither an error nor a task's
        passes it on as it came, with only this (`from_member` does the same and more)."""
        if self._calls.get(rid) != member:
            return False
        del self._calls[rid]
        return True

    def _fanned_in(self, member: str, fid: str, msg: Message) -> list[Out]:
        asked = self._fanouts.get(fid)
        if asked is None or asked[0] != member:
            return []
        del self._fanouts[fid]
        fanout = asked[1]
        if fanout.method == _JOIN:
            if "result" not in msg or fanout.joining is None:
                return []
            now = self.names.members
            self.names = Names(tuple(m for m in fanout.joining if m in now or m == member), self.names.separator)
            return [ToMember(member, jsonrpc.notification("notifications/initialized")), *_changed()]
        if fanout.answered:  # past `overdue`: what the client was told has changed
            return [ToClient(jsonrpc.notification(LIST_CHANGED[fanout.method]))] if fanout.method in LIST_CHANGED else []
        fanout.waiting.discard(member)
        if isinstance(result := msg.get("result"), dict):
            fanout.answers[member] = result
        elif fanout.error is None and isinstance(error := msg.get("error"), dict):
            fanout.error = error
        return self._fanned(fanout) if not fanout.waiting else []

    def join(self, member: str, members: tuple[str, ...]) -> list[Out]:
        """A member joins the group (a reload added it) and its session here is open: it is
        initialized as the client initialized the others, and once it answers, the group's
        members are `members` and the client hears that the lists changed (rule 8)."""
        if self._initialize is None:  # the client has not initialized: it will, every member then
            self.names = Names(members, self.names.separator)
            return []
        self._ids += 1
        fid = f"{FANOUT_ID}{self._ids}"
        self._fanouts[fid] = (member, _Fanout("", _JOIN, {member}, joining=members))
        return [ToMember(member, jsonrpc.request(fid, "initialize", self._initialize))]

    def leave(self, member: str, why: str) -> list[Out]:
        """A member leaves the group (a reload removed it): what waited on it fails, its
        names go, and the client hears that the lists changed (rule 8)."""
        out = self.member_gone(member, why)
        self.names = Names(tuple(m for m in self.names.members if m != member), self.names.separator)
        self.routes.forget(member)
        return out + self.lists_changed()

    def lists_changed(self) -> list[Out]:
        """What the client hears when what its lists show changed without its asking (a
        member joined, left, or its session ended): each list's `list_changed`, once it has
        initialized."""
        return _changed() if self._initialize is not None else []

    def overdue(self, client_id: RequestId) -> list[Out]:
        """A list the client asked for is due (the group's `list_timeout`): answered with what
        the members that answered said; those still to answer are told of later, by the list's
        `list_changed`, when their answers come."""
        for _, fanout in self._fanouts.values():
            if fanout.client_id == client_id and fanout.method in LISTS and not fanout.answered:
                return self._fanned(fanout)
        return []

    def member_gone(self, member: str, why: str) -> list[Out]:
        """A member's session ended (its server failed, it was removed): what waited on it ends."""
        out: list[Out] = []
        for fid, (asked, _) in list(self._fanouts.items()):
            if asked == member:
                out += self._fanned_in(member, fid, jsonrpc.error(fid, jsonrpc.SERVER_UNAVAILABLE, f"{member}: {why}"))
        for rid in [r for r, m in self._calls.items() if m == member]:
            del self._calls[rid]
            out.append(self._error(rid, jsonrpc.SERVER_UNAVAILABLE, f"member {member!r} of group {self.group!r}: {why}"))
        self.asked.forget(member)
        return out

    def _fanned(self, fanout: _Fanout) -> list[Out]:
        """Every member asked has answered: the group's answer, or, when none could, the first error."""
        rid = fanout.client_id
        fanout.answered = True
        answers = [(m, fanout.answers[m]) for m in self.names.members if m in fanout.answers]
        if not answers and fanout.error is not None:
            error = fanout.error
            return [self._error(rid, error.get("code", jsonrpc.INTERNAL_ERROR), str(error.get("message", "")), error.get("data"))]
        if fanout.method == "initialize":
            result = merge_initialize(self.group, self.version or "", answers)
            self.negotiated = result["protocolVersion"]
            serving = [m for m, answer in answers if isinstance(_object(answer.get("capabilities")).get("resources"), dict)]
            self._only_resources = serving[0] if len(serving) == 1 else None
        elif fanout.method in LISTS:
            page = merge_list(fanout.method, self.names, answers, self.routes)
            self.left_out += page.left_out
            result = page.result
        else:
            result = {}
        return [ToClient(jsonrpc.result(rid, result), rid, True)]

    def _error(self, rid: RequestId, code: int, message: str, data: Any = None) -> ToClient:
        return ToClient(jsonrpc.error(rid, code, message, data), rid, True)
