"""Rule 8, views: where a request names a tool, prompt, resource or template a principal's
`View` may hide, what a list result loses, and the probes that learn how the server
answers a name it does not have.

The tables cover every request of the MCP schema up to 2026-07-28 that names one
(`subscriptions/listen` subscribes through `resources/subscribe`). A probe carries nothing
of a client's request: its name is the bridge's own, and the answer it gets, with the
hidden name put back, is the answer to every later request for a hidden name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from bridge.access.policy import View
from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import Message


class Probe(NamedTuple):
    """A request for a name no server has, with nothing of a client's request in it: the
    server's answer to it is its answer to a name it does not have (see `Mux._hidden`)."""

    method: str
    params: bytes  # encoded: each probe decodes its own copy, for the era translator to add its `_meta` to
    name: bytes  # the name it asks for, as its answer may quote it


class Named(NamedTuple):
    """Where a request names something a view may hide, and how to learn what the server
    answers for a name it does not have."""

    kind: str  # tools, prompts or resources: the filter that applies
    key: str  # the parameter holding the name (of `ref`, for a reference)
    probe: Probe | None  # None: the mux answers it itself (`Mux._hidden_unsubscribe`)


def escaped(name: str) -> bytes:
    """`name` as it appears inside a JSON string."""
    return jsonrpc.encode(name)[1:-1]


def _probe(method: str, name: str, params: dict[str, Any]) -> Probe:
    return Probe(method, jsonrpc.encode(params), escaped(name))


_HIDDEN_TOOL, _HIDDEN_PROMPT, _HIDDEN_RESOURCE = "mcp-bridge-hidden-tool", "mcp-bridge-hidden-prompt", "mcp-bridge://hidden"
_HIDDEN_ARGUMENT = {"name": "mcp-bridge-hidden-argument", "value": ""}  # not the client's: what it typed stays here
# Subscribing to a probe's uri would leave a subscription behind: a hidden subscribe is asked as a read.
_READ_PROBE = _probe("resources/read", _HIDDEN_RESOURCE, {"uri": _HIDDEN_RESOURCE})

# Requests that name something a view may hide: method -> where the name is.
FILTERED = {
    "tools/call": Named("tools", "name", _probe("tools/call", _HIDDEN_TOOL, {"name": _HIDDEN_TOOL})),
    "prompts/get": Named("prompts", "name", _probe("prompts/get", _HIDDEN_PROMPT, {"name": _HIDDEN_PROMPT})),
    "resources/read": Named("resources", "uri", _READ_PROBE),
    "resources/subscribe": Named("resources", "uri", _READ_PROBE),
    "resources/unsubscribe": Named("resources", "uri", None),
}
# Requests that name it in a typed `ref`: method -> ref type -> where. A `ref/resource`
# names a resource by its uri or a template by its uriTemplate: the resources filter
# applies to both, as in the lists.
REFERENCES = {
    "completion/complete": {
        "ref/prompt": Named("prompts", "name", _probe("completion/complete", _HIDDEN_PROMPT, {
            "ref": {"type": "ref/prompt", "name": _HIDDEN_PROMPT}, "argument": _HIDDEN_ARGUMENT})),
        "ref/resource": Named("resources", "uri", _probe("completion/complete", _HIDDEN_RESOURCE, {
            "ref": {"type": "ref/resource", "uri": _HIDDEN_RESOURCE}, "argument": _HIDDEN_ARGUMENT})),
    },
}  # fmt: skip
# List results a view filters: method -> (the list's field, kind, the field naming an item).
LISTS = {
    "tools/list": ("tools", "tools", "name"),
    "prompts/list": ("prompts", "prompts", "name"),
    "resources/list": ("resources", "resources", "uri"),
    "resources/templates/list": ("resourceTemplates", "resources", "uriTemplate"),
}
# Calls audited (see the gateway): method -> the parameter naming what was used.
AUDITED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def hidden_name(view: View | None, withheld: Mapping[str, frozenset[str]], msg: Message) -> tuple[Named, str] | None:
    """What of the request `view` hides or the pins withhold (`withheld`: kind -> names), and
    its name; None when it names nothing hidden."""
    method = msg["method"]
    params = msg.get("params")
    named = FILTERED.get(method)
    if named is None and (refs := REFERENCES.get(method)) is not None and params.__class__ is dict:
        ref = params.get("ref")
        if ref.__class__ is dict and isinstance(of := ref.get("type"), str):
            named, params = refs.get(of), ref
    if named is None or params.__class__ is not dict:
        return None
    name = params.get(named.key)
    if not isinstance(name, str) or ((view is None or view.admits(named.kind, name)) and name not in withheld.get(named.kind, ())):
        return None
    return named, name


def filter_list(view: View, method: str, result: dict[str, Any]) -> None:
    """Take out of a list result what `view` does not admit."""
    field, kind, key = LISTS[method]
    items = result.get(field)
    if isinstance(items, list):
        result[field] = [item for item in items if not isinstance(item, dict) or view.admits(kind, item.get(key))]
