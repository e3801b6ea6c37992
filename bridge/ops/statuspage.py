"""The status page at /ui: a static page whose script reads /status and the admin API.

The page and its assets hold nothing of the daemon, so they are served to
anyone (like the probes); what they show comes from `/status` and
`/admin/...` with the viewer's own token, under the same access rules as
any client's. The Content-Security-Policy allows only the bridge's own
script, style and API: no inline script, no other origin, no framing.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

UI_PATH = "/ui"
ASSETS = {  # path -> (file in bridge/ops/static, content type)
    UI_PATH: ("index.html", "text/html; charset=utf-8"),
    UI_PATH + "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    UI_PATH + "/app.css": ("app.css", "text/css; charset=utf-8"),
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def add_routes(app: web.Application) -> None:
    static = resources.files("bridge.ops") / "static"
    # Read once: a few KiB, and a page that changed under a running daemon would not match its script.
    bodies = {path: (static.joinpath(name).read_bytes(), kind) for path, (name, kind) in ASSETS.items()}

    async def asset(request: web.Request) -> web.Response:
        body, kind = bodies[request.path]
        return web.Response(body=body, headers={**HEADERS, "Content-Type": kind})

    for path in bodies:
        app.router.add_get(path, asset)
