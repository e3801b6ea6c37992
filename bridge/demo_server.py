"""Built-in demo MCP server speaking newline-delimited JSON-RPC 2.0 over stdio.

Run with ``python -m bridge.demo_server``. It exercises every feature the
bridge has to carry through: tools (with progress, logging, sampling and
cancellation), resources with subscriptions, prompts and completions.

Deliberately stdlib-only so it starts fast and works wherever the bridge does.
stdout carries protocol messages only; diagnostics go to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, NoReturn, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

JSON: TypeAlias = dict[str, Any]
RequestId: TypeAlias = str | int

SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
SERVER_INFO = {"name": "mcp-bridge-demo", "version": "1.0.0"}

# RFC 5424 severities in ascending order, as MCP logging defines them.
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")

COUNTER_URI = "demo://counter"
GREETING_TEMPLATE = "demo://greeting/{name}"  # a resource template: demo://greeting/Alice reads "Hello, Alice!"
GREETING_PREFIX = GREETING_TEMPLATE.removesuffix("{name}")
GREET_NAMES = ("Alice", "Alan", "Bob", "Carol", "Charlie", "Dave", "Eve", "Mallory", "Trent")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002  # MCP's recommended code up to and including 2025-11-25

log = logging.getLogger("mcp-bridge-demo")


class RpcError(Exception):
    """Becomes a JSON-RPC error response."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> JSON:
        err: JSON = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


class ToolArgError(Exception):
    """Bad tool arguments; how it is reported depends on the negotiated version."""


class Cancelled(Exception):
    """The client cancelled the request, so it must get no response at all."""


class Wire:
    """Serialises whole messages onto stdout so concurrent workers never interleave."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: JSON) -> None:
        self.send_all([message])

    def send_all(self, messages: list[JSON]) -> None:
        """Several messages in one write, so a reader gets them as one burst."""
        # json.dumps escapes control characters, so one message is always one line.
        data = "".join(json.dumps(m, ensure_ascii=False, separators=(",", ":")) + "\n" for m in messages).encode("utf-8")
        with self._lock:
            try:
                self._stream.write(data)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                # Nobody is listening any more; there is nothing useful left to do.
                log.info("stdout closed, exiting")
                _exit(0)


def _exit(code: int) -> NoReturn:
    # os._exit rather than sys.exit: worker threads may be mid-write or blocked, and
    # interpreter shutdown with daemon threads touching stdio can abort noisily.
    sys.stderr.flush()
    os._exit(code)


_REQUIRED = object()


def _arg(args: JSON, name: str, kinds: tuple[type, ...], default: Any = _REQUIRED) -> Any:
    """Fetch and type-check one tool argument; JSON null counts as absent."""
    value = args.get(name)
    if value is None:
        if default is _REQUIRED:
            raise ToolArgError(f"missing required argument '{name}'")
        return default
    # bool is an int subclass in Python but not a number in JSON Schema.
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        wanted = "number" if float in kinds else {str: "string", int: "integer"}[kinds[0]]
        raise ToolArgError(f"argument '{name}' must be {wanted}")
    return value


def _text(text: str, *, is_error: bool = False) -> JSON:
    result: JSON = {"content": [{"type": "text", "text": text}]}
    if is_error:
        result["isError"] = True
    return result


def _sampled_text(result: Any) -> str:
    """Flatten a CreateMessageResult; 2025-11-25 allows content to be a list of blocks."""
    content = result.get("content") if isinstance(result, dict) else None
    blocks = content if isinstance(content, list) else [content]
    parts = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict):
            parts.append(f"[{block.get('type', 'unknown')} content]")
    return "".join(parts)


@dataclass
class Call:
    """One inbound request being served."""

    id: RequestId
    params: JSON
    cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def progress_token(self) -> str | int | None:
        meta = self.params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        return token if isinstance(token, str | int) and not isinstance(token, bool) else None


@dataclass
class Tool:
    name: str
    description: str
    properties: JSON
    run: Callable[[Call, JSON], JSON]
    required: tuple[str, ...] = ()
    output_schema: JSON | None = None
    needs_sampling: bool = False

    def describe(self) -> JSON:
        spec: JSON = {
            "name": self.name,
            "description": self.description,
            "inputSchema": {"type": "object", "properties": self.properties, "required": list(self.required)},
        }
        if self.output_schema is not None:
            spec["outputSchema"] = self.output_schema
        return spec


class DemoServer:
    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        # One condition guards all mutable state below; sampling waiters sleep on it
        # so that either the client's reply or a cancellation can wake them.
        self.cond = threading.Condition()
        self.protocol_version = LATEST_VERSION
        self.client_capabilities: JSON = {}
        self.min_log_level = 0  # index into LOG_LEVELS; default lets everything through
        self.counter = 0
        self.subscriptions: set[str] = set()
        self.in_flight: dict[RequestId, Call] = {}
        self.outgoing: dict[int, JSON | None] = {}  # our requests to the client -> reply
        self.next_outgoing_id = 0

        self.methods: dict[str, Callable[[Call], JSON]] = {
            "initialize": self.initialize,
            "ping": lambda call: {},
            "tools/list": self.tools_list,
            "tools/call": self.tools_call,
            "resources/list": self.resources_list,
            "resources/read": self.resources_read,
            "resources/subscribe": self.resources_subscribe,
            "resources/unsubscribe": self.resources_unsubscribe,
            "resources/templates/list": self.resource_templates_list,
            "prompts/list": self.prompts_list,
            "prompts/get": self.prompts_get,
            "completion/complete": self.complete,
            "logging/setLevel": self.set_level,
        }
        number = {"type": "number"}
        self.tools = {
            t.name: t
            for t in (
                Tool("echo", "Return the given text unchanged.", {"text": {"type": "string"}}, self.tool_echo, ("text",)),
                Tool(
                    "add",
                    "Add two numbers.",
                    {"a": number, "b": number},
                    self.tool_add,
                    ("a", "b"),
                    output_schema={"type": "object", "properties": {"sum": number}, "required": ["sum"]},
                ),
                Tool(
                    "current_time",
                    "Current time as ISO-8601, in UTC or the given IANA timezone.",
                    {"timezone": {"type": "string", "description": "IANA name, e.g. Europe/Berlin"}},
                    self.tool_current_time,
                ),
                Tool(
                    "countdown",
                    "Count down, reporting progress each step, then return 'done'.",
                    {
                        "steps": {"type": "integer", "minimum": 0, "default": 5},
                        "interval_ms": {"type": "integer", "minimum": 0, "default": 200},
                    },
                    self.tool_countdown,
                ),
                Tool(
                    "log",
                    "Emit a log message notification at the given level.",
                    {"level": {"type": "string", "enum": list(LOG_LEVELS)}, "message": {"type": "string"}},
                    self.tool_log,
                    ("level", "message"),
                ),
                Tool(
                    "sample",
                    "Ask the client's LLM to complete a prompt (sampling).",
                    {"prompt": {"type": "string"}},
                    self.tool_sample,
                    ("prompt",),
                    needs_sampling=True,
                ),
                Tool(
                    "bump",
                    f"Increment the counter resource {COUNTER_URI}.",
                    {},
                    self.tool_bump,
                ),
            )
        }

    # --- transport -----------------------------------------------------------

    def serve(self, stream: IO[bytes]) -> None:
        while line := stream.readline():
            if not line.strip():
                continue
            try:
                self.handle_line(line)
            except Exception:
                # One malformed message (e.g. an unhashable id) must not take the server down.
                log.exception("failed to handle message")
        log.info("stdin closed, exiting")

    def notify(self, method: str, params: JSON) -> None:
        self.wire.send({"jsonrpc": "2.0", "method": method, "params": params})

    def handle_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError as exc:
            self.reply_error(None, RpcError(PARSE_ERROR, f"Parse error: {exc}"))
            return
        if not isinstance(message, dict):
            # JSON-RPC batches were dropped from MCP in 2025-06-18; we never accept them.
            self.reply_error(None, RpcError(INVALID_REQUEST, "Expected a single JSON-RPC object"))
            return
        if message.get("jsonrpc") != "2.0":
            self.reply_error(message.get("id"), RpcError(INVALID_REQUEST, "jsonrpc must be '2.0'"))
        elif "method" in message and "id" in message:
            self.handle_request(message)
        elif "method" in message:
            self.handle_notification(message)
        elif "id" in message and ("result" in message or "error" in message):
            self.handle_response(message)
        else:
            self.reply_error(message.get("id"), RpcError(INVALID_REQUEST, "Not a request, notification or response"))

    def handle_request(self, message: JSON) -> None:
        request_id = message["id"]
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            self.reply_error(None, RpcError(INVALID_REQUEST, "id must be a string or integer"))
            return
        method, params = message["method"], message.get("params", {})
        handler = self.methods.get(method) if isinstance(method, str) else None
        if handler is None:
            self.reply_error(request_id, RpcError(METHOD_NOT_FOUND, f"Method not found: {method}"))
            return
        if params is None:
            params = {}
        if not isinstance(params, dict):
            self.reply_error(request_id, RpcError(INVALID_PARAMS, "params must be an object"))
            return
        call = Call(request_id, params)
        if method == "tools/call":
            # Tools may block (countdown, sampling), so each gets its own thread
            # and the reader stays free to serve everything else meanwhile.
            with self.cond:
                self.in_flight[request_id] = call
            threading.Thread(target=self.run, args=(handler, call), daemon=True).start()
        else:
            self.run(handler, call)

    def run(self, handler: Callable[[Call], JSON], call: Call) -> None:
        try:
            result = handler(call)
        except Cancelled:
            return
        except RpcError as exc:
            self.reply_error(call.id, exc)
            return
        except Exception as exc:
            log.exception("handler failed")
            self.reply_error(call.id, RpcError(INTERNAL_ERROR, f"Internal error: {exc}"))
            return
        finally:
            with self.cond:
                self.in_flight.pop(call.id, None)
        if not call.cancelled.is_set():  # a cancelled request must never be answered
            self.wire.send({"jsonrpc": "2.0", "id": call.id, "result": result})

    def reply_error(self, request_id: Any, error: RpcError) -> None:
        self.wire.send({"jsonrpc": "2.0", "id": request_id, "error": error.to_json()})

    def handle_notification(self, message: JSON) -> None:
        params = message.get("params")
        if message["method"] == "notifications/cancelled" and isinstance(params, dict):
            with self.cond:
                request_id = params.get("requestId")
                call = self.in_flight.get(request_id) if isinstance(request_id, str | int) else None
                if call is not None:
                    call.cancelled.set()
                    self.cond.notify_all()
        # initialized, roots/list_changed, progress etc. need no action here.

    def handle_response(self, message: JSON) -> None:
        response_id = message["id"]
        with self.cond:
            if isinstance(response_id, int) and response_id in self.outgoing:
                self.outgoing[response_id] = message
                self.cond.notify_all()
                return
        log.warning("ignoring response to unknown request id %r", response_id)

    def request_client(self, call: Call, method: str, params: JSON) -> JSON:
        """Send a server->client request and block until it is answered or `call` is cancelled."""
        with self.cond:
            self.next_outgoing_id += 1
            out_id = self.next_outgoing_id
            self.outgoing[out_id] = None
        self.wire.send({"jsonrpc": "2.0", "id": out_id, "method": method, "params": params})
        with self.cond:
            self.cond.wait_for(lambda: self.outgoing[out_id] is not None or call.cancelled.is_set())
            reply = self.outgoing.pop(out_id)
        if reply is None:
            # Propagate the cancellation so the client can stop its own work too.
            self.notify("notifications/cancelled", {"requestId": out_id, "reason": "originating request cancelled"})
            raise Cancelled
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            raise RpcError(int(error.get("code", INTERNAL_ERROR)), str(error.get("message", "unknown error")))
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    # --- lifecycle -----------------------------------------------------------

    def initialize(self, call: Call) -> JSON:
        requested = call.params.get("protocolVersion")
        capabilities = call.params.get("capabilities")
        with self.cond:
            self.protocol_version = requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION
            self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": {
                "tools": {"listChanged": True},
                "resources": {"subscribe": True, "listChanged": True},
                "prompts": {"listChanged": True},
                "logging": {},
                "completions": {},
            },
            "serverInfo": SERVER_INFO,
            "instructions": "Demo server for mcp-bridge: try the echo, add and countdown tools.",
        }

    def set_level(self, call: Call) -> JSON:
        level = call.params.get("level")
        if level not in LOG_LEVELS:
            raise RpcError(INVALID_PARAMS, f"Invalid log level: {level!r}", {"levels": list(LOG_LEVELS)})
        with self.cond:
            self.min_log_level = LOG_LEVELS.index(level)
        return {}

    # --- tools -----------------------------------------------------------------

    def available(self, tool: Tool) -> bool:
        # Sampling only exists if the client offered it, so don't advertise a tool that can't work.
        return not tool.needs_sampling or "sampling" in self.client_capabilities

    def tools_list(self, call: Call) -> JSON:
        return {"tools": [t.describe() for t in self.tools.values() if self.available(t)]}

    def tools_call(self, call: Call) -> JSON:
        name, args = call.params.get("name"), call.params.get("arguments", {})
        tool = self.tools.get(name) if isinstance(name, str) else None
        if tool is None or not self.available(tool):
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise RpcError(INVALID_PARAMS, "arguments must be an object")
        try:
            return tool.run(call, args)
        except ToolArgError as exc:
            # SEP-1303 (2025-11-25) moved input validation errors into tool results so
            # the model can self-correct; earlier revisions list them as protocol errors.
            if SUPPORTED_VERSIONS.index(self.protocol_version) >= SUPPORTED_VERSIONS.index("2025-11-25"):
                return _text(f"Invalid arguments for {name}: {exc}", is_error=True)
            raise RpcError(INVALID_PARAMS, f"Invalid arguments for {name}: {exc}") from None

    def tool_echo(self, call: Call, args: JSON) -> JSON:
        return _text(_arg(args, "text", (str,)))

    def tool_add(self, call: Call, args: JSON) -> JSON:
        total = _arg(args, "a", (int, float)) + _arg(args, "b", (int, float))
        return {**_text(str(total)), "structuredContent": {"sum": total}}

    def tool_current_time(self, call: Call, args: JSON) -> JSON:
        name = _arg(args, "timezone", (str,), None)
        try:
            tz = ZoneInfo(name) if name else UTC
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolArgError(f"unknown timezone '{name}'") from None
        return _text(datetime.now(tz).isoformat())

    def tool_countdown(self, call: Call, args: JSON) -> JSON:
        steps = _arg(args, "steps", (int,), 5)
        interval_ms = _arg(args, "interval_ms", (int,), 200)
        if steps < 0 or interval_ms < 0:
            raise ToolArgError("steps and interval_ms must be >= 0")
        token = call.progress_token
        for step in range(1, steps + 1):
            if call.cancelled.wait(interval_ms / 1000):
                raise Cancelled
            if token is not None:
                self.notify(
                    "notifications/progress",
                    {"progressToken": token, "progress": step, "total": steps, "message": f"step {step}/{steps}"},
                )
        return _text("done")

    def tool_log(self, call: Call, args: JSON) -> JSON:
        level = _arg(args, "level", (str,))
        message = _arg(args, "message", (str,))
        if level not in LOG_LEVELS:
            raise ToolArgError(f"level must be one of {', '.join(LOG_LEVELS)}")
        if LOG_LEVELS.index(level) >= self.min_log_level:
            self.notify("notifications/message", {"level": level, "logger": "demo", "data": message})
        return _text("logged")

    def tool_sample(self, call: Call, args: JSON) -> JSON:
        prompt = _arg(args, "prompt", (str,))
        params = {
            "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
            "maxTokens": 256,
        }
        try:
            result = self.request_client(call, "sampling/createMessage", params)
        except RpcError as exc:
            return _text(f"Sampling failed ({exc.code}): {exc.message}", is_error=True)
        if call.progress_token is not None:  # after the client's answer: what follows it streams too
            self.notify("notifications/progress", {"progressToken": call.progress_token, "progress": 1, "total": 1, "message": "sampled"})
        return _text(_sampled_text(result))

    def tool_bump(self, call: Call, args: JSON) -> JSON:
        with self.cond:
            self.counter += 1
            value, subscribed = self.counter, COUNTER_URI in self.subscriptions
        if subscribed:
            self.notify("notifications/resources/updated", {"uri": COUNTER_URI})
        return _text(str(value))

    # --- resources -------------------------------------------------------------

    def _known_uri(self, call: Call) -> str:
        uri = call.params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, "uri must be a string")
        if uri != COUNTER_URI:
            raise RpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        return uri

    def resources_list(self, call: Call) -> JSON:
        resource = {
            "uri": COUNTER_URI,
            "name": "counter",
            "description": "A counter incremented by the bump tool.",
            "mimeType": "text/plain",
        }
        return {"resources": [resource]}

    def resource_templates_list(self, call: Call) -> JSON:
        template = {"uriTemplate": GREETING_TEMPLATE, "name": "greeting", "description": "A greeting for {name}.", "mimeType": "text/plain"}
        return {"resourceTemplates": [template]}

    def resources_read(self, call: Call) -> JSON:
        uri = call.params.get("uri")
        if isinstance(uri, str) and uri.startswith(GREETING_PREFIX) and len(uri) > len(GREETING_PREFIX):
            return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": f"Hello, {uri.removeprefix(GREETING_PREFIX)}!"}]}
        uri = self._known_uri(call)
        with self.cond:
            value = self.counter
        return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": str(value)}]}

    def resources_subscribe(self, call: Call) -> JSON:
        uri = self._known_uri(call)
        with self.cond:
            self.subscriptions.add(uri)
        return {}

    def resources_unsubscribe(self, call: Call) -> JSON:
        uri = self._known_uri(call)
        with self.cond:
            self.subscriptions.discard(uri)
        return {}

    # --- prompts & completion ----------------------------------------------------

    def prompts_list(self, call: Call) -> JSON:
        prompt = {
            "name": "greet",
            "description": "Ask the model to greet someone.",
            "arguments": [{"name": "name", "description": "Who to greet", "required": True}],
        }
        return {"prompts": [prompt]}

    def prompts_get(self, call: Call) -> JSON:
        if call.params.get("name") != "greet":
            raise RpcError(INVALID_PARAMS, f"Unknown prompt: {call.params.get('name')}")
        arguments = call.params.get("arguments") or {}
        name = arguments.get("name") if isinstance(arguments, dict) else None
        if not isinstance(name, str) or not name:
            raise RpcError(INVALID_PARAMS, "Missing required argument: name")
        text = f"Please write a short, warm greeting for {name}."
        return {
            "description": f"Greeting for {name}",
            "messages": [{"role": "user", "content": {"type": "text", "text": text}}],
        }

    def complete(self, call: Call) -> JSON:
        ref, argument = call.params.get("ref"), call.params.get("argument")
        if not isinstance(ref, dict) or not isinstance(argument, dict):
            raise RpcError(INVALID_PARAMS, "ref and argument are required")
        if ref.get("type") == "ref/prompt" and ref.get("name") != "greet":
            raise RpcError(INVALID_PARAMS, f"Unknown prompt: {ref.get('name')}")
        if ref.get("type") == "ref/resource" and ref.get("uri") != GREETING_TEMPLATE:
            raise RpcError(INVALID_PARAMS, f"Unknown resource template: {ref.get('uri')}")
        if ref.get("type") not in ("ref/prompt", "ref/resource"):
            raise RpcError(INVALID_PARAMS, f"Nothing to complete for {ref}")
        values: list[str] = []
        if argument.get("name") == "name":
            typed = str(argument.get("value", "")).lower()
            values = [n for n in GREET_NAMES if n.lower().startswith(typed)]
        return {"completion": {"values": values, "total": len(values), "hasMore": False}}


def serve_stdio(server: Callable[[Wire], DemoServer]) -> None:
    """Runs `server` (DemoServer or a subclass) on stdin/stdout until stdin closes."""
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("MCP_DEMO_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    wire = Wire(sys.stdout.buffer)
    # Anything that print()s by accident must not corrupt the protocol stream.
    sys.stdout = sys.stderr
    try:
        server(wire).serve(sys.stdin.buffer)
    except KeyboardInterrupt:
        pass
    _exit(0)


def main() -> None:
    serve_stdio(DemoServer)


if __name__ == "__main__":
    main()
