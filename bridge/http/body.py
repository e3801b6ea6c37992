"""A POST's body: its length bounded, its content coding undone within the bound, decoded
once into a JSON-RPC payload. Every failure is a 4xx `HttpError` naming its reason."""

from __future__ import annotations

import zlib
from typing import Any

from aiohttp import StreamReader, web

from bridge.gateway.sessions import Served
from bridge.http.errors import HttpError
from bridge.protocol import jsonrpc
from bridge.protocol.jsonrpc import ProtocolError


def check_length(content_length: int | None, gateway: Served) -> None:
    """413 before any of the body is read, when its declared length is over the limit."""
    limit = gateway.limits.max_message_bytes
    if content_length is not None and content_length > limit:
        raise HttpError(413, f"body of {content_length} bytes is over the limit of {limit}")


def decode_body(body: bytes, gateway: Served) -> Any:
    """The decoded JSON body, or 400 with a one-line reason."""
    gateway.metrics.bytes_in += len(body)
    if len(body) > 2 * jsonrpc.MAX_DEPTH and jsonrpc.too_deep(body):
        raise HttpError(400, f"parse error: JSON nested deeper than {jsonrpc.MAX_DEPTH}", jsonrpc.PARSE_ERROR)
    try:
        return jsonrpc.decode(body)
    except ProtocolError as exc:
        raise HttpError(400, exc.message, exc.code) from None


async def read_message(request: web.Request, gateway: Served) -> Any:
    """The decoded JSON body, or 413 / 415 / 400 with a one-line reason."""
    check_length(request.content_length, gateway)
    limit = gateway.limits.max_message_bytes
    if CONTENT_ENCODING in request.headers and (coding := content_coding(request.headers.getall(CONTENT_ENCODING))) is not None:
        return decode_body(await _decompressed(request.content, coding, limit), gateway)
    # Read here rather than with the app's client_max_size, which a reload cannot change.
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"body is over the limit of {limit} bytes")
    return decode_body(chunks[0] if len(chunks) == 1 else b"".join(chunks), gateway)


# Compressed bodies (RFC 9110, 8.4) are decoded here, not by aiohttp (the app is served with
# auto_decompress off), so that every failure is the client's 4xx with its reason (aiohttp's
# was a 500 and two tracebacks), a body that grows past the limit is refused before more of
# it is decompressed, and a forwarded request carries its body as the client sent it.
CONTENT_ENCODING = "Content-Encoding"


_GZIP = 16 + zlib.MAX_WBITS


_CODINGS = {"gzip": _GZIP, "x-gzip": _GZIP, "deflate": zlib.MAX_WBITS}  # the zlib window bits that read each


ACCEPTED_CODINGS = "gzip, deflate"  # what a 415 offers (Accept-Encoding, RFC 9110, 12.5.3)


MAX_GZIP_MEMBERS = 64  # a gzip body may be several members end to end (RFC 1952, 2.2)


def content_coding(fields: list[str]) -> str | None:
    """The one coding the Content-Encoding fields name (None: identity), or 415 for any
    other, or for more than one."""
    named = (c.strip(" \t").lower() for field in fields for c in field.split(","))
    codings = [c for c in named if c not in ("", "identity")]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _CODINGS:
        listed = ", ".join(codings)[:60]
        raise HttpError(415, f"unsupported Content-Encoding {listed!r}: a body may be gzip or deflate", headers={"Accept-Encoding": ACCEPTED_CODINGS})
    return codings[0]


async def _decompressed(content: StreamReader, coding: str, limit: int) -> bytes:
    """The body decoded from `coding`: 400 (-32700) when it does not decode or ends early, 413
    as soon as the body as sent or what it decodes to is over `limit` bytes."""
    wbits = _CODINGS[coding]
    decoder: zlib._Decompress | None = None
    members = 0
    chunks: list[bytes] = []
    taken = size = 0
    while chunk := await content.readany():
        taken += len(chunk)
        if taken > limit:
            raise HttpError(413, f"body is over the limit of {limit} bytes")
        pending = chunk
        while pending:
            fresh = decoder is None or decoder.eof  # a member begins
            if decoder is None or decoder.eof:
                if decoder is not None and wbits != _GZIP:
                    raise _undecodable(coding, "data after its end")
                members += 1
                if members > MAX_GZIP_MEMBERS:
                    raise _undecodable(coding, f"more than {MAX_GZIP_MEMBERS} gzip members")
                # RFC 1950's header names method 8 (deflate); a body without one is raw deflate.
                raw = wbits == zlib.MAX_WBITS and pending[0] & 0x0F != 8
                decoder = zlib.decompressobj(-zlib.MAX_WBITS if raw else wbits)
            try:
                # At most one byte past the limit: no more of a bomb than that is ever decompressed.
                piece = decoder.decompress(pending, limit + 1 - size)
            except zlib.error as exc:
                reason = str(exc).rpartition(": ")[2]
                raise _undecodable(coding, f"data after its end ({reason})" if fresh and members > 1 else reason) from None
            size += len(piece)
            if size > limit:
                raise HttpError(413, f"body is over the limit of {limit} bytes once decompressed")
            chunks.append(piece)
            # Short of the limit, all the input was taken but what lies past a member's end.
            pending = decoder.unused_data
    if decoder is None or not decoder.eof:
        raise _undecodable(coding, "it ends before its compressed data does")
    return b"".join(chunks)


def _undecodable(coding: str, reason: str) -> HttpError:
    return HttpError(400, f"body does not decode as {coding}: {reason}", jsonrpc.PARSE_ERROR)
