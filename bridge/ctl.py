"""`mcp-bridge ctl`: the admin API from a shell, as tables for people or `--json` for scripts.

Exit codes: 0 done; 1 the daemon refused or failed (its reason is printed);
2 bad arguments, or the daemon could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
TIMEOUT_S = 60.0  # a graceful restart waits for calls in flight (limits.drain_timeout) first
TOKEN_VARIABLE = "MCP_BRIDGE_ADMIN_TOKEN"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mcp-bridge ctl", description="Operate a running mcp-bridge through its admin API.")
    parser.add_argument("--url", required=True, help="the daemon's base URL, like http://127.0.0.1:8080")
    parser.add_argument("--token-file", metavar="F", help=f"a file holding a token with the admin role (else ${TOKEN_VARIABLE}, if set)")
    sub = parser.add_subparsers(dest="action", required=True)
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    sub.add_parser("servers", parents=[json_flag], help="servers, their processes and state")
    sub.add_parser("groups", parents=[json_flag], help="groups, their members and sessions")
    sessions = sub.add_parser("sessions", parents=[json_flag], help="open sessions")
    sessions.add_argument("--server")
    sessions.add_argument("--principal")
    sub.add_parser("end", parents=[json_flag], help="end a session").add_argument("session", help="its id, or a prefix only it starts with")
    sub.add_parser("restart", parents=[json_flag], help="restart a server's processes gracefully").add_argument("server")
    sub.add_parser("reload", parents=[json_flag], help="reload the config, as SIGHUP does")
    pins = sub.add_parser("pins", parents=[json_flag], help="what pinned servers offer that waits for approval (servers.NAME.pin)")
    pins.add_argument("verb", nargs="?", choices=("list", "diff", "approve", "reject"), default="list",
                      help="list: pending items; diff: each with the diff of its fields; approve, reject: SERVER's, all or NAME...")
    pins.add_argument("server", nargs="?", help="a pinned server (diff: only its items)")
    pins.add_argument("names", nargs="*", help="approve or reject only these items (tools, prompts or templates)")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        token = _token(args.token_file)
    except OSError as exc:
        print(f"--token-file: cannot read {args.token_file}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    if args.action == "pins" and args.verb in ("approve", "reject") and args.server is None:
        print(f"ctl pins {args.verb}: name the server", file=sys.stderr)
        return EXIT_USAGE
    method, path = _request(args)
    payload = {"names": args.names} if args.action == "pins" and args.names else None
    try:
        status, body = call(args.url, method, path, token, payload)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"cannot reach {args.url}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(body, indent=2))
    elif status < 400:
        print(render("pins " + args.verb if args.action == "pins" else args.action, body, getattr(args, "server", None)))
    if status >= 400:
        print(f"{method} {path}: {status} {_reason(body)}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


def _token(path: str | None) -> str | None:
    if path is not None:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    return os.environ.get(TOKEN_VARIABLE)


def _request(args: argparse.Namespace) -> tuple[str, str]:
    quote = urllib.parse.quote
    match args.action:
        case "servers":
            return "GET", "/admin/servers"
        case "groups":
            return "GET", "/admin/groups"
        case "sessions":
            query = {k: v for k, v in (("server", args.server), ("principal", args.principal)) if v is not None}
            return "GET", "/admin/sessions" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        case "end":
            return "DELETE", f"/admin/sessions/{quote(args.session, safe='')}"
        case "restart":
            return "POST", f"/admin/servers/{quote(args.server, safe='')}/restart"
        case "pins" if args.verb in ("approve", "reject"):
            return "POST", f"/admin/pins/{quote(args.server, safe='')}/{args.verb}"
        case "pins":
            return "GET", "/admin/pins"
        case _:
            return "POST", "/admin/reload"


def call(url: str, method: str, path: str, token: str | None, payload: Any = None) -> tuple[int, Any]:
    """The status and JSON body of one admin API request (with `payload` as its JSON body)."""
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"error": {"message": raw.decode("utf-8", "replace")[:200]}}


def _reason(body: Any) -> str:
    if isinstance(body, dict):
        if isinstance(error := body.get("error"), dict):
            return str(error.get("message"))
        if "problems" in body:
            return "; ".join(body["problems"])
    return ""


def render(action: str, body: dict[str, Any], server: str | None = None) -> str:
    match action:
        case "servers":
            rows = [
                [s["name"], s["mode"], "yes" if s["ready"] else "no", s["sessions"], s["in_flight"],
                 " ".join(str(p["pid"]) for p in s["processes"]) or "-", sum(p["restarts"] for p in s["processes"])]
                for s in body["servers"]
            ]  # fmt: skip
            return table(["SERVER", "MODE", "READY", "SESSIONS", "IN FLIGHT", "PIDS", "RESTARTS"], rows)
        case "groups":
            rows = [
                [g["name"], ",".join(g["members"]), "yes" if g["ready"] else f"no: {g['not_ready']}", sum(g["sessions"].values())]
                for g in body["groups"]
            ]
            return table(["GROUP", "MEMBERS", "READY", "SESSIONS"], rows)
        case "sessions":
            rows = [
                [s["id"], s["server"], s["principal"] or "-", s["transport"], s["protocol_version"] or "-",
                 f"{s['age_s']:.0f}s", s["in_flight"], f"{s['idle_s']:.0f}s"]
                for s in body["sessions"]
            ]  # fmt: skip
            return table(["SESSION", "SERVER", "PRINCIPAL", "TRANSPORT", "PROTOCOL", "AGE", "IN FLIGHT", "IDLE"], rows)
        case "end":
            return f"ended session {body['ended']} of {body['server']} ({body['calls_failed']} calls in flight failed)"
        case "restart":
            return f"restarted {body['restarted']} ({body['processes']} processes)"
        case "pins list":
            rows = [
                [name, s["mode"], p["kind"], p["name"], p["status"], ",".join(p["changed"]) if p["old"] else "new"]
                for name, s in body["servers"].items()
                for p in s["pending"]
            ]
            return table(["SERVER", "MODE", "KIND", "NAME", "STATUS", "CHANGED"], rows) if rows else "nothing waits for approval"
        case "pins diff":
            found = [
                f"{name} {p['kind']} {p['name']} ({p['status']}):\n{p['diff'] or '(rejected when the daemon started: no fields kept)'}"
                for name, s in body["servers"].items() if server is None or name == server
                for p in s["pending"]
            ]  # fmt: skip
            return "\n".join(found) if found else "nothing waits for approval"
        case "pins approve" | "pins reject":
            verb = "approved" if action == "pins approve" else "rejected"
            items = body[verb]
            return f"{verb} {len(items)} of {body['server']}" + "".join(f"\n  {i['kind']} {i['name']}" for i in items)
        case _:
            return f"reloaded: serving {', '.join(body['servers'])}"


def table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header, *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
