"""A stdio MCP server built for benchmarks: as little work and memory per message as possible.

Newline-delimited JSON-RPC on stdin/stdout. It answers `initialize`, `ping`,
`tools/list` and `tools/call` with two tools:

- `echo {text}`: returns `text` as its one text content.
- `blob {size, tag?}`: returns a text of exactly `size` bytes: `tag` (ASCII,
  so the load generator can tell whose answer it is) padded with `x`.

Notifications are read and ignored; any other method gets -32601. Stdlib only
(`json`), one line read with `sys.stdin.buffer.readline`, one write and flush
per response. Run it with `python -S bench/server.py` to skip `site`.
"""

import json
import sys

PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
TOOLS = b'{"tools":[{"name":"echo","description":"Returns its text","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}},{"name":"blob","description":"Returns a text of size bytes (tag first, padded with x)","inputSchema":{"type":"object","properties":{"size":{"type":"integer"},"tag":{"type":"string"}},"required":["size"]}}]}'
MAX_BLOB = 64 * 1024 * 1024


def main():
    readline = sys.stdin.buffer.readline
    out = sys.stdout.buffer
    write = out.write
    flush = out.flush
    loads = json.loads
    dumps = json.dumps
    pads = {}

    def respond(rid, result):
        write(b'{"jsonrpc":"2.0","id":%s,"result":%s}\n' % (dumps(rid).encode(), result))

    def fail(rid, code, message):
        write(b'{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}\n' % (dumps(rid).encode(), code, dumps(message).encode()))

    def text_result(text_json):
        return b'{"content":[{"type":"text","text":%s}]}' % text_json

    def handle(msg, plain):
        if msg.__class__ is not dict:
            return
        method = msg.get("method")
        if "id" not in msg or method is None:
            return  # a notification, or a response to nothing we asked
        rid = msg["id"]
        params = msg.get("params") or {}
        if method == "tools/call":
            name = params.get("name")
            args = params.get("arguments") or {}
            if name == "echo":
                text = args.get("text")
                if text.__class__ is not str:
                    return fail(rid, -32602, "echo needs a string text")
                # With no backslash anywhere in the request line, every string in it was
                # written raw, so the text's UTF-8 is already its JSON: skip re-encoding.
                return respond(rid, text_result(b'"%s"' % text.encode() if plain else dumps(text).encode()))
            if name == "blob":
                size = args.get("size")
                tag = args.get("tag") or ""
                if size.__class__ is not int or not 0 <= size <= MAX_BLOB or not tag.isascii() or len(tag) > size:
                    return fail(rid, -32602, "blob needs an integer size and an ASCII tag no longer than it")
                pad = pads.get(size)
                if pad is None:
                    pads.clear()
                    pad = pads[size] = b"x" * size
                tag_json = dumps(tag).encode()[1:-1]
                if len(tag_json) != len(tag):
                    return fail(rid, -32602, "blob tag must not need escaping")
                return respond(rid, text_result(b'"%s%s"' % (tag_json, pad[len(tag):])))
            return fail(rid, -32602, f"unknown tool {name!r}")
        if method == "ping":
            return respond(rid, b"{}")
        if method == "tools/list":
            return respond(rid, TOOLS)
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1]
            return respond(
                rid,
                b'{"protocolVersion":"%s","capabilities":{"tools":{}},"serverInfo":{"name":"bench-server","version":"1.0"}}'
                % version.encode(),
            )
        return fail(rid, -32601, f"method not found: {method}")

    while True:
        line = readline()
        if not line:
            return
        try:
            msg = loads(line)
        except ValueError:
            write(b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}\n')
            flush()
            continue
        plain = b"\\" not in line
        for m in msg if msg.__class__ is list else (msg,):
            try:
                handle(m, plain)
            except Exception as exc:  # a malformed request must not kill the server
                if m.__class__ is dict and "id" in m:
                    fail(m["id"], -32603, f"internal error: {exc.__class__.__name__}")
        flush()


if __name__ == "__main__":
    try:
        main()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
