"""The spans of HTTP requests (traces/spans.py, rule 2), on aiohttp's path: a POST to an MCP
endpoint, past the access check, is a SERVER span until its answer is complete; the fast
path makes the same spans itself (fastpath.py). Installed only when tracing is on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from bridge.http import state
from bridge.http.aiohttp_reply import AiohttpHead
from bridge.http.errors import HttpError
from bridge.traces import UNSAMPLED

if TYPE_CHECKING:
    from bridge.traces import HttpSpan
    from bridge.traces.spans import Spans

# The routes whose POSTs carry MCP messages.
ROUTES: Final = frozenset({state.MESSAGES_ROUTE, state.MCP_ROUTE, state.GROUP_MESSAGES_ROUTE, state.GROUP_MCP_ROUTE})
HTTP_SPAN: Final[web.RequestKey[HttpSpan]] = web.RequestKey("http_span")


def middleware(traces: Spans, scheme: str) -> Middleware:
    def describe(request: web.Request) -> tuple[str, str, str]:
        resource = request.match_info.route.resource
        return resource.canonical if resource is not None else "", request.path, scheme

    @web.middleware
    async def trace_http(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if request.method != "POST" or resource is None or resource.canonical not in ROUTES:
            return await handler(request)
        carried = AiohttpHead(request.headers).trace_context()
        span = UNSAMPLED if carried is None and traces.draw() >= traces.ratio else traces.http_started(carried, describe, request)
        request[HTTP_SPAN] = span
        if span is UNSAMPLED:
            return await handler(request)
        status = None
        try:
            response = await handler(request)
            status = response.status
            return response
        except (HttpError, web.HTTPException) as exc:  # answered by access.middleware, outside
            status = exc.status
            raise
        except Exception:
            status = 500  # access.middleware answers it so
            raise
        finally:  # (a cancelled handler, its client gone: cut off)
            traces.http_ended(span, status)

    return trace_http


def span_of(request: web.Request) -> HttpSpan | None:
    """The span of `request` (None: tracing off, or not a request that has one)."""
    return request.get(HTTP_SPAN)
