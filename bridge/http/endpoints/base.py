"""What a POST's endpoint is handed, whichever HTTP path read it and whichever revision it speaks.

`Post` is read off the request before its body is decoded (one frozen struct per request,
made in C); `RequestHead` is what an endpoint may still read of the request's head later
(2026-07-28's mirrored headers, read only for one of those). The HTTP paths are given a
`Dispatcher` and know nothing of the endpoints behind it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import msgspec
from multidict import MultiMapping

from bridge.gateway.sessions import Served, Session
from bridge.http.reply import Reply
from bridge.protocol import stateless

if TYPE_CHECKING:
    from bridge.traces import HttpSpan


class RequestHead(Protocol):
    def fields(self) -> MultiMapping[str]:
        """The request's header fields (a 2026-07-28 retry forwarded to the replica holding its call)."""

    def mirrored(self) -> stateless.Headers:
        """What a 2026-07-28 request's headers mirror of its body."""

    def http_span(self) -> HttpSpan | None:
        """Its span (http/traced.py; None: tracing is off)."""


S = TypeVar("S", bound=Served)


class Post(msgspec.Struct, Generic[S], frozen=True):
    """A POST to `/servers/{name}/mcp` or `/groups/{group}/mcp`, besides its body (a Struct:
    one is made per request, and a frozen dataclass costs ten times as much to make). `S`:
    what serves it; only a server's gateway serves 2026-07-28."""

    gateway: S
    principal: str | None
    session_id: str | None  # Mcp-Session-Id
    version: str | None  # MCP-Protocol-Version
    accept: str
    resume_buffer: int  # streamable.resume_buffer of the config the request came under
    request: RequestHead
    group: str | None = None  # the group a 2026-07-28 request came through (its audit names it)


class Dispatcher(Protocol):
    """What the HTTP paths hand a decoded POST to (endpoints/post.py's `Posts`)."""

    def mcp(self, post: Post[Served], payload: Any, reply: Reply) -> None:
        """Answer a POST to `/servers/{name}/mcp` through `reply`, or raise an HttpError."""

    def message_session(self, gateway: Served, session_id: str | None, principal: str | None) -> Session:
        """The HTTP+SSE session a POST to `/servers/{name}/messages` names (or an HttpError)."""

    def message(self, gateway: Served, session: Session, payload: Any) -> None:
        """Hand a decoded message POST to its HTTP+SSE session."""
