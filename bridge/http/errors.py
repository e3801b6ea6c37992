"""`HttpError`, the one way a handler or helper refuses a request: status, JSON-RPC code, a
one-line message and any extra headers. Each HTTP path renders it in one place (the aiohttp
middleware in `access`; the fast path's error writer) into the same response: a JSON-RPC error
object as the body."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from bridge.protocol import jsonrpc
from bridge.protocol.media import JSON

RETRY_AFTER_S = "5"  # what a 503 for a full or stopping server tells the client to wait


class HttpError(Exception):
    """A request refused: rendered by each path as `status` with a JSON-RPC error body."""

    __slots__ = ("code", "headers", "message", "request_id", "status")

    def __init__(
        self,
        status: int,
        message: str,
        code: int = jsonrpc.INVALID_REQUEST,
        headers: Mapping[str, str] | None = None,
        request_id: jsonrpc.RequestId | None = None,  # the request's, when it could be read
    ) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers
        self.request_id = request_id

    def body(self) -> bytes:
        return jsonrpc.encode(jsonrpc.error(self.request_id, self.code, self.message))


INTERNAL_ERROR = HttpError(500, "internal error", jsonrpc.INTERNAL_ERROR)  # a bug: the details are in the log


def render(error: HttpError) -> web.Response:
    return web.Response(status=error.status, body=error.body(), content_type=JSON, headers=error.headers)
