"""The dispatcher of `POST /servers/{name}/mcp`, which belongs to no revision.

Both HTTP paths decode the body once and hand it here; it looks at the payload once and
picks the revision: a message with 2026-07-28's `_meta` envelope, or a lone request with no
session that is not `initialize` (only 2026-07-28 sends those), goes to `stateless_2026`;
everything else to `streamable_2025`. The two endpoints never import each other. What
outlives a request and belongs to one revision (the 2025 answers' holds, the 2026-07-28
parked calls) lives here, one of each per app.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

from aiohttp import web

from bridge.gateway.gateway import Gateway
from bridge.gateway.group import Group
from bridge.gateway.sessions import Served, Session
from bridge.http import state, traced
from bridge.http.aiohttp_reply import AiohttpHead, AiohttpReply
from bridge.http.body import read_message
from bridge.http.endpoints import group_2026, sse_2024, stateless_2026, streamable_2025
from bridge.http.endpoints.base import Post
from bridge.http.forward import Forwarder
from bridge.http.reply import Reply
from bridge.protocol import jsonrpc, stateless
from bridge.protocol.mcp import SESSION_HEADER, VERSION_HEADER


class Posts:
    """The `Dispatcher` of an app: given to the fast path, and used by aiohttp's handler below."""

    __slots__ = ("holds", "message", "message_session", "parking")

    def __init__(self, forwarder: Forwarder | None) -> None:
        self.holds = streamable_2025.Holds()
        self.parking = stateless_2026.Parking.of(forwarder)  # in a cluster, requestStates name their replica
        # HTTP+SSE's two steps, as the functions themselves: a message POST pays no call in between.
        self.message_session: Callable[[Served, str | None, str | None], Session] = sse_2024.posted_session
        self.message: Callable[[Served, Session, Any], None] = sse_2024.take

    def mcp(self, post: Post[Served], payload: Any, reply: Reply) -> None:
        if stateless.is_stateless(payload) or (post.session_id is None and _lone_request(payload)):
            if _of_server(post):
                stateless_2026.answer(post, payload, reply, self.parking)
            elif _of_group(post):
                group_2026.answer(post, payload, reply, self.parking)
            else:
                raise TypeError(f"{post.gateway!r} is neither a server's gateway nor a group")
        else:
            streamable_2025.answer(post, payload, reply, self.holds)


def _of_server(post: Post[Served]) -> TypeGuard[Post[Gateway]]:
    return isinstance(post.gateway, Gateway)


def _of_group(post: Post[Served]) -> TypeGuard[Post[Group]]:
    return isinstance(post.gateway, Group)


def _lone_request(payload: Any) -> bool:
    """One request that is not initialize: with no session, only a 2026-07-28 client sends it
    (whose envelope is missing: -32602 from that endpoint, as its clients expect)."""
    return (
        payload.__class__ is dict
        and payload.get("method", "initialize") != "initialize"
        and jsonrpc.is_id(payload.get("id"))
    )


POSTS = web.AppKey("posts", Posts)


async def post_mcp(request: web.Request) -> web.StreamResponse:
    """aiohttp's handler of `POST /servers/{name}/mcp` (the fast path has its own reading)."""
    gateway = state.gateway_for(request)
    payload = await read_message(request, gateway)
    headers = request.headers
    post = Post(
        gateway,
        state.principal(request),
        headers.get(SESSION_HEADER),
        headers.get(VERSION_HEADER),
        headers.get("Accept", ""),
        request.app[state.LIVE].config.streamable.resume_buffer,
        AiohttpHead(headers, traced.span_of(request)),
    )
    reply = AiohttpReply(request)
    request.app[POSTS].mcp(post, payload, reply)
    return await reply.send()
