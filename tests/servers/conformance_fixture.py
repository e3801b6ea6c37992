"""The MCP conformance suite's fixture tools, prompts and resources, as a legacy stdio server.

Run as ``python tests/servers/conformance_fixture.py``. It speaks 2024-11-05 ..
2025-11-25 over stdio, as almost every server on the registries does, and serves
what `@modelcontextprotocol/conformance` 0.2.0-alpha.12 calls on the server under
test (the suite's own fixture is an HTTP server,
`examples/servers/typescript/everything-server.ts` in its repository): the
2025 scenarios' tools (`test_simple_text`, `test_sampling`, ...), resources
(`test://static-text`, `test://template/{id}/data`, ...) and prompts, and the
2026-07-28 scenarios' tools written the legacy way. Where the suite's fixture
answers `resultType: "input_required"` itself, this server asks the client with
ordinary server requests (`elicitation/create`, `sampling/createMessage`,
`roots/list`), so a modern client only gets an MRTR exchange if the bridge
translates; `test_missing_capability` needs sampling and turns a refused
`sampling/createMessage` into -32021; `test_trigger_*_change` send the legacy
list-changed notifications a `subscriptions/listen` stream must carry;
`test_logging_tool` logs on every call, so only the bridge can keep the log
off a request that set no log level.

Its own requests to the client carry string ids named like the keys the suite's
fixture puts in `inputRequests` (`user_name`, `sample_request`, ...), so a
bridge that keys MRTR input requests by the server's request id gives the keys
the suite expects. JSON-RPC wants ids unique among a sender's requests in
flight, so asking a question whose name is still unanswered withdraws the
older one first (`notifications/cancelled`; its call fails): in a suite run
the only such question is one whose client never came back
(missing-input-response leaves its call parked in the bridge).

Built on the demo server's JSON-RPC plumbing (bridge/demo_server.py); it asks
for sampling, elicitation or roots only when `initialize` declared them, and
resource-not-found is -32002 with the uri in `data`, as 2025-11-25 says.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.demo_server import (  # noqa: E402  (the path above makes the worktree's bridge importable)
    INVALID_PARAMS,
    JSON,
    LOG_LEVELS,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    Call,
    Cancelled,
    DemoServer,
    RpcError,
    Tool,
    Wire,
    _sampled_text,
    _text,
    serve_stdio,
)

SERVER_INFO = {"name": "mcp-conformance-test-server", "version": "1.0.0"}
MISSING_CLIENT_CAPABILITY = -32021  # MissingRequiredClientCapabilityError (2026-07-28)

# The suite's fixture data: a 1x1 red PNG and a minimal WAV.
IMAGE_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
AUDIO_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
STEP_S = 0.05  # between the log and progress notifications of one call, as the suite's fixture does

# SEP-1613 / SEP-2106: tools/list must carry this schema unchanged.
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

SEP1034_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
    "required": [],
}

SEP1330_SCHEMA = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "description": "Select one option", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "description": "Select one option with titles",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "description": "Select one option (legacy)",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "description": "Select multiple options",
            "minItems": 1,
            "maxItems": 3,
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Select multiple options with titles",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
    "required": [],
}

_CAPABILITY_FOR = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}


def _form(message: str, field: str, kind: str = "string") -> JSON:
    schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
    return {"message": message, "requestedSchema": schema}


def _sampling(text: str, max_tokens: int) -> JSON:
    return {"messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": max_tokens}


def _accepted(result: JSON, field: str) -> Any:
    """The named field of an accepted elicitation; anything else is the client's mistake."""
    content = result.get("content")
    if result.get("action") != "accept" or not isinstance(content, dict) or field not in content:
        raise RpcError(INVALID_PARAMS, f"elicitation result without an accepted '{field}'", {"result": result})
    return content[field]


class Question:
    """One request to the client: its id (the question's name), and the reply once it comes."""

    __slots__ = ("id", "reply")

    def __init__(self, request_id: str) -> None:
        self.id = request_id
        self.reply: JSON | None = None


WITHDRAWN: JSON = {"error": {"code": INVALID_PARAMS, "message": "question withdrawn: asked again for another call"}}


class Asked:
    """Server requests the fixture sent and is waiting on, by their (string) ids."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.open: dict[str, Question] = {}

    def new(self, name: str) -> tuple[Question, Question | None]:
        """A question named `name`, and the unanswered one of that name it withdraws, if any
        (its asker wakes with an error). Called with `cond` held."""
        older = self.open.pop(name, None)
        if older is not None:
            older.reply = WITHDRAWN
            self.cond.notify_all()
        question = self.open[name] = Question(name)
        return question, older

    def close(self, question: Question) -> None:
        if self.open.get(question.id) is question:
            del self.open[question.id]


class FixtureServer(DemoServer):
    def __init__(self, wire: Wire) -> None:
        super().__init__(wire)
        self.asked = Asked(self.cond)
        self.methods["resources/templates/list"] = self.templates_list
        empty: JSON = {}
        simple: list[tuple[str, str, Callable[[Call, JSON], JSON], JSON]] = [
            ("test_simple_text", "Tests simple text content response", self.tool_simple_text, empty),
            ("test_image_content", "Tests image content response", self.tool_image, empty),
            ("test_audio_content", "Tests audio content response", self.tool_audio, empty),
            ("test_embedded_resource", "Tests embedded resource content response", self.tool_embedded, empty),
            ("test_multiple_content_types", "Tests response with multiple content types (text, image, resource)", self.tool_mixed, empty),
            ("test_tool_with_logging", "Tests tool that emits log messages during execution", self.tool_with_logging, empty),
            ("test_tool_with_progress", "Tests tool that reports progress notifications", self.tool_with_progress, empty),
            ("test_error_handling", "Tests error response handling", self.tool_error, empty),
            ("test_reconnection", "Tests SSE stream disconnection and client reconnection (SEP-1699)", self.tool_reconnection, empty),
            ("test_elicitation_sep1034_defaults", "Tests elicitation with default values per SEP-1034", self.tool_sep1034, empty),
            ("test_elicitation_sep1330_enums", "Tests elicitation with enum schema improvements per SEP-1330", self.tool_sep1330, empty),
            ("test_missing_capability", "Needs sampling: -32021 when the client has none", self.tool_missing_capability, empty),
            ("test_input_required_result_elicitation", "Asks the client's name (elicitation)", self.mrtr_elicitation, empty),
            ("test_input_required_result_sampling", "Asks the client's LLM (sampling)", self.mrtr_sampling, empty),
            ("test_input_required_result_list_roots", "Asks the client's roots", self.mrtr_list_roots, empty),
            ("test_input_required_result_request_state", "Asks for a confirmation", self.mrtr_confirm("state-ok: requestState validated"), empty),
            ("test_input_required_result_multiple_inputs", "Asks elicitation, sampling and roots at once", self.mrtr_multiple, empty),
            ("test_input_required_result_multi_round", "Asks twice, one question after the other", self.mrtr_multi_round, empty),
            ("test_input_required_result_tampered_state", "Asks for a confirmation", self.mrtr_confirm("integrity-ok: state verified"), empty),
            ("test_input_required_result_capabilities", "Asks elicitation and sampling; uses what it gets", self.mrtr_capabilities, empty),
            ("test_streaming_elicitation", "Asks the client (elicitation) while the call is open", self.mrtr_streaming, empty),
            ("test_logging_tool", "Logs on every call, whatever the level", self.tool_logging_always, empty),
            ("test_trigger_tool_change", "Sends notifications/tools/list_changed", self.trigger("tools"), empty),
            ("test_trigger_prompt_change", "Sends notifications/prompts/list_changed", self.trigger("prompts"), empty),
        ]
        tools = [Tool(name, description, properties, run) for name, description, run, properties in simple]
        tools += [
            Tool("test_sampling", "Tests server-initiated sampling (LLM completion request)", {"prompt": {"type": "string", "description": "The prompt to send to the LLM"}}, self.tool_sampling, ("prompt",)),
            Tool("test_elicitation", "Tests server-initiated elicitation (user input request)", {"message": {"type": "string", "description": "The message to show the user"}}, self.tool_elicitation, ("message",)),
            Tool("json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)", {}, self.tool_json_schema),
            # SEP-2243: a string parameter mirrored into the Mcp-Param-Region header.
            Tool("test_custom_header", "Echoes its region, which clients also send as Mcp-Param-Region", {"region": {"type": "string", "x-mcp-header": "Region"}}, self.tool_custom_header, ("region",)),
        ]
        self.tools = {t.name: t for t in tools}
        self.resources: dict[str, JSON] = {
            "test://static-text": {"name": "static-text", "title": "Static Text Resource", "description": "A static text resource for testing", "mimeType": "text/plain", "text": "This is the content of the static text resource."},
            "test://static-binary": {"name": "static-binary", "title": "Static Binary Resource", "description": "A static binary resource (image) for testing", "mimeType": "image/png", "blob": IMAGE_BASE64},
            "test://watched-resource": {"name": "watched-resource", "title": "Watched Resource", "description": "A resource clients subscribe to", "mimeType": "text/plain", "text": "Watched resource content"},
        }

    # --- lifecycle -----------------------------------------------------------

    def initialize(self, call: Call) -> JSON:
        result = super().initialize(call)
        return {**result, "serverInfo": SERVER_INFO, "instructions": "The MCP conformance suite's fixture tools, served over stdio."}

    def set_level(self, call: Call) -> JSON:
        result = super().set_level(call)
        self.log("info", f"Log level set to: {call.params['level']}")
        return result

    def log(self, level: str, data: str) -> None:
        if LOG_LEVELS.index(level) >= self.min_log_level:
            self.notify("notifications/message", {"level": level, "logger": "conformance-test-server", "data": data})

    # --- asking the client ---------------------------------------------------

    def ask(self, call: Call, *questions: tuple[str, str, JSON]) -> list[JSON | RpcError]:
        """Send (name, method, params) requests to the client at once; their results or errors, in order.

        All go out in one write, so whoever reads them sees them together: a bridge
        that gathers one call's questions into one `input_required` result gets all of them.
        """
        with self.cond:
            undeclared = [m for _, m, _ in questions if _CAPABILITY_FOR[m] not in self.client_capabilities]
        if undeclared:
            raise RpcError(MISSING_CLIENT_CAPABILITY, f"the client did not declare {undeclared}", {"requiredCapabilities": {_CAPABILITY_FOR[m]: {} for m in undeclared}})
        lines = []
        with self.cond:
            asked: list[Question] = []
            for name, method, params in questions:
                question, older = self.asked.new(name)
                asked.append(question)
                if older is not None:  # before the new request of the same id
                    lines.append({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": older.id, "reason": "asked again"}})
                lines.append({"jsonrpc": "2.0", "id": question.id, "method": method, "params": params})
        self.wire.send_all(lines)
        with self.cond:
            self.cond.wait_for(lambda: all(q.reply is not None for q in asked) or call.cancelled.is_set())
            replies = [q.reply for q in asked]
            for question in asked:
                self.asked.close(question)
        if call.cancelled.is_set():
            for question, reply in zip(asked, replies, strict=True):
                if reply is None:
                    self.notify("notifications/cancelled", {"requestId": question.id, "reason": "originating request cancelled"})
            raise Cancelled
        return [self._outcome(reply) for reply in replies if reply is not None]

    @staticmethod
    def _outcome(reply: JSON) -> JSON | RpcError:
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            return RpcError(int(error.get("code", INVALID_PARAMS)), str(error.get("message", "unknown error")), error.get("data"))
        result = reply.get("result")
        if not isinstance(result, dict):
            return RpcError(INVALID_PARAMS, "the client's answer is not an object", {"result": result})
        return result

    def ask_one(self, call: Call, name: str, method: str, params: JSON) -> JSON:
        (outcome,) = self.ask(call, (name, method, params))
        if isinstance(outcome, RpcError):
            raise outcome
        return outcome

    def handle_response(self, message: JSON) -> None:
        with self.cond:
            question = self.asked.open.get(message["id"])
            if question is not None:
                question.reply = message
                self.cond.notify_all()
                return
        logging.getLogger("conformance-fixture").warning("ignoring response to unknown request id %r", message["id"])

    # --- the 2025 scenarios' tools -------------------------------------------

    def tool_simple_text(self, call: Call, args: JSON) -> JSON:
        return _text("This is a simple text response for testing.")

    def tool_image(self, call: Call, args: JSON) -> JSON:
        return {"content": [{"type": "image", "data": IMAGE_BASE64, "mimeType": "image/png"}]}

    def tool_audio(self, call: Call, args: JSON) -> JSON:
        return {"content": [{"type": "audio", "data": AUDIO_BASE64, "mimeType": "audio/wav"}]}

    def tool_embedded(self, call: Call, args: JSON) -> JSON:
        resource = {"uri": "test://embedded-resource", "mimeType": "text/plain", "text": "This is an embedded resource content."}
        return {"content": [{"type": "resource", "resource": resource}]}

    def tool_mixed(self, call: Call, args: JSON) -> JSON:
        resource = {"uri": "test://mixed-content-resource", "mimeType": "application/json", "text": json.dumps({"test": "data", "value": 123})}
        return {
            "content": [
                {"type": "text", "text": "Multiple content types test:"},
                {"type": "image", "data": IMAGE_BASE64, "mimeType": "image/png"},
                {"type": "resource", "resource": resource},
            ]
        }

    def tool_with_logging(self, call: Call, args: JSON) -> JSON:
        for i, message in enumerate(("Tool execution started", "Tool processing data", "Tool execution completed")):
            if i and call.cancelled.wait(STEP_S):
                raise Cancelled
            self.log("info", message)
        return _text("Tool with logging executed successfully")

    def tool_with_progress(self, call: Call, args: JSON) -> JSON:
        token = call.progress_token
        for i, progress in enumerate((0, 50, 100)):
            if i and call.cancelled.wait(STEP_S):
                raise Cancelled
            if token is not None:
                self.notify("notifications/progress", {"progressToken": token, "progress": progress, "total": 100, "message": f"Completed step {progress} of 100"})
        return _text(str(token if token is not None else 0))

    def tool_error(self, call: Call, args: JSON) -> JSON:
        return _text("This tool intentionally returns an error for testing", is_error=True)

    def tool_reconnection(self, call: Call, args: JSON) -> JSON:
        # stdio cannot close the client's stream; the suite only needs the result to arrive.
        if call.cancelled.wait(2 * STEP_S):
            raise Cancelled
        return _text("Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure.")

    def tool_sampling(self, call: Call, args: JSON) -> JSON:
        try:
            result = self.ask_one(call, "sampling", "sampling/createMessage", _sampling(str(args.get("prompt", "")), 100))
        except RpcError as exc:
            return _text(f"Sampling not supported or error: {exc.message}")
        return _text(f"LLM response: {_sampled_text(result) or 'No response'}")

    def _elicited(self, call: Call, label: str, params: JSON) -> JSON:
        try:
            result = self.ask_one(call, "elicitation", "elicitation/create", params)
        except RpcError as exc:
            return _text(f"Elicitation not supported or error: {exc.message}")
        return _text(f"{label}: action={result.get('action')}, content={json.dumps(result.get('content') or {}, separators=(',', ':'))}")

    def tool_elicitation(self, call: Call, args: JSON) -> JSON:
        return self._elicited(call, "User response", _form(str(args.get("message", "")), "response"))

    def tool_sep1034(self, call: Call, args: JSON) -> JSON:
        params = {"message": "Please review and update the form fields with defaults", "requestedSchema": SEP1034_SCHEMA}
        return self._elicited(call, "Elicitation completed", params)

    def tool_sep1330(self, call: Call, args: JSON) -> JSON:
        params = {"message": "Please select options from the enum fields", "requestedSchema": SEP1330_SCHEMA}
        return self._elicited(call, "Elicitation completed", params)

    def tool_json_schema(self, call: Call, args: JSON) -> JSON:
        return _text(f"JSON Schema 2020-12 tool called with: {json.dumps(args, separators=(',', ':'))}")

    def tool_custom_header(self, call: Call, args: JSON) -> JSON:
        return _text(f"region={args.get('region')}")

    def tools_list(self, call: Call) -> JSON:
        listed = super().tools_list(call)
        for tool in listed["tools"]:
            if tool["name"] == "json_schema_2020_12_tool":
                tool["inputSchema"] = JSON_SCHEMA_2020_12
        return listed

    # --- the 2026-07-28 scenarios' tools, asked the legacy way ----------------

    def tool_missing_capability(self, call: Call, args: JSON) -> JSON:
        try:
            self.ask_one(call, "sampling", "sampling/createMessage", _sampling("Say anything", 10))
        except RpcError as exc:
            if exc.code in (MISSING_CLIENT_CAPABILITY, METHOD_NOT_FOUND):
                raise RpcError(MISSING_CLIENT_CAPABILITY, "Missing required client capability: sampling", {"requiredCapabilities": {"sampling": {}}}) from None
            raise
        return _text("Success")

    def mrtr_elicitation(self, call: Call, args: JSON) -> JSON:
        result = self.ask_one(call, "user_name", "elicitation/create", _form("What is your name?", "name"))
        return _text(f"Hello, {_accepted(result, 'name')}!")

    def mrtr_sampling(self, call: Call, args: JSON) -> JSON:
        result = self.ask_one(call, "sample_request", "sampling/createMessage", _sampling("What is the capital of France?", 100))
        return _text(f"Sampling result: {_sampled_text(result) or 'no response'}")

    def mrtr_list_roots(self, call: Call, args: JSON) -> JSON:
        roots = self.ask_one(call, "roots_request", "roots/list", {}).get("roots")
        return _text(f"Found {len(roots) if isinstance(roots, list) else 0} root(s)")

    def mrtr_confirm(self, done: str) -> Callable[[Call, JSON], JSON]:
        def run(call: Call, args: JSON) -> JSON:
            result = self.ask_one(call, "confirm", "elicitation/create", _form("Please confirm", "ok", "boolean"))
            return _text(done) if _accepted(result, "ok") is True else _text("not confirmed", is_error=True)

        return run

    def mrtr_multiple(self, call: Call, args: JSON) -> JSON:
        outcomes = self.ask(
            call,
            ("user_name", "elicitation/create", _form("What is your name?", "name")),
            ("greeting", "sampling/createMessage", _sampling("Generate a greeting", 50)),
            ("client_roots", "roots/list", {}),
        )
        for outcome in outcomes:
            if isinstance(outcome, RpcError):
                raise outcome
        name, greeting, roots = outcomes
        assert isinstance(name, dict) and isinstance(greeting, dict) and isinstance(roots, dict)
        listed = roots.get("roots")
        return _text(f"Name: {_accepted(name, 'name')}; Greeting: {_sampled_text(greeting)}; Roots: {len(listed) if isinstance(listed, list) else 0}")

    def mrtr_multi_round(self, call: Call, args: JSON) -> JSON:
        name = _accepted(self.ask_one(call, "step1", "elicitation/create", _form("Step 1: What is your name?", "name")), "name")
        color = _accepted(self.ask_one(call, "step2", "elicitation/create", _form("Step 2: What is your favorite color?", "color")), "color")
        return _text(f"Multi-round complete for {name} who likes {color}")

    def mrtr_capabilities(self, call: Call, args: JSON) -> JSON:
        # Both at once; a client that declared only one of them gets only that one,
        # and the refusal of the other is no reason to fail.
        questions = [("elicit_input", "elicitation/create", _form("Elicitation input", "value")), ("sample_input", "sampling/createMessage", _sampling("Sample request", 50))]
        with self.cond:
            questions = [q for q in questions if _CAPABILITY_FOR[q[1]] in self.client_capabilities]
        outcomes = self.ask(call, *questions)
        received = [name for (name, _, _), outcome in zip(questions, outcomes, strict=True) if not isinstance(outcome, RpcError)]
        return _text(f"capabilities-ok: received {','.join(received)}" if received else "No supported capabilities declared")

    def mrtr_streaming(self, call: Call, args: JSON) -> JSON:
        result = self.ask_one(call, "stream_input", "elicitation/create", _form("Anything to add?", "note"))
        return _text(f"Streaming complete ({result.get('action')})")

    def tool_logging_always(self, call: Call, args: JSON) -> JSON:
        self.notify("notifications/message", {"level": "info", "logger": "conformance-test-server", "data": "Diagnostic trace logging activated"})
        return _text("Logging evaluated")

    def trigger(self, kind: str) -> Callable[[Call, JSON], JSON]:
        def run(call: Call, args: JSON) -> JSON:
            self.notify(f"notifications/{kind}/list_changed", {})
            return _text("Mutation triggered")

        return run

    # --- resources -------------------------------------------------------------

    def _known_uri(self, call: Call) -> str:
        uri = call.params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, "uri must be a string")
        if uri not in self.resources and not self._template_id(uri):
            raise RpcError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}", {"uri": uri})
        return uri

    @staticmethod
    def _template_id(uri: str) -> str | None:
        prefix, suffix = "test://template/", "/data"
        if uri.startswith(prefix) and uri.endswith(suffix) and len(uri) > len(prefix) + len(suffix):
            ident = uri[len(prefix) : -len(suffix)]
            return ident if "/" not in ident else None
        return None

    def resources_list(self, call: Call) -> JSON:
        listed = [{"uri": uri, **{k: v for k, v in r.items() if k not in ("text", "blob")}} for uri, r in self.resources.items()]
        return {"resources": listed}

    def templates_list(self, call: Call) -> JSON:
        template = {
            "uriTemplate": "test://template/{id}/data",
            "name": "template",
            "title": "Resource Template",
            "description": "A resource template with parameter substitution",
            "mimeType": "application/json",
        }
        return {"resourceTemplates": [template]}

    def resources_read(self, call: Call) -> JSON:
        uri = self._known_uri(call)
        ident = self._template_id(uri)
        if ident is not None:
            text = json.dumps({"id": ident, "templateTest": True, "data": f"Data for ID: {ident}"})
            return {"contents": [{"uri": uri, "mimeType": "application/json", "text": text}]}
        resource = self.resources[uri]
        body = {k: resource[k] for k in ("text", "blob") if k in resource}
        return {"contents": [{"uri": uri, "mimeType": resource["mimeType"], **body}]}

    def resources_subscribe(self, call: Call) -> JSON:
        result = super().resources_subscribe(call)
        self.log("info", f"Subscribed to resource: {call.params['uri']}")
        return result

    def resources_unsubscribe(self, call: Call) -> JSON:
        result = super().resources_unsubscribe(call)
        self.log("info", f"Unsubscribed from resource: {call.params['uri']}")
        return result

    # --- prompts & completion ----------------------------------------------------

    PROMPTS: dict[str, JSON] = {
        "test_simple_prompt": {"title": "Simple Test Prompt", "description": "A simple prompt without arguments"},
        "test_prompt_with_arguments": {
            "title": "Prompt With Arguments",
            "description": "A prompt with required arguments",
            "arguments": [
                {"name": "arg1", "description": "First test argument", "required": True},
                {"name": "arg2", "description": "Second test argument", "required": True},
            ],
        },
        "test_prompt_with_embedded_resource": {
            "title": "Prompt With Embedded Resource",
            "description": "A prompt that includes an embedded resource",
            "arguments": [{"name": "resourceUri", "description": "URI of the resource to embed", "required": True}],
        },
        "test_prompt_with_image": {"title": "Prompt With Image", "description": "A prompt that includes image content"},
        "test_input_required_result_prompt": {"description": "Asks the client for context (elicitation) before answering"},
    }

    def prompts_list(self, call: Call) -> JSON:
        return {"prompts": [{"name": name, **prompt} for name, prompt in self.PROMPTS.items()]}

    def prompts_get(self, call: Call) -> JSON:
        name = call.params.get("name")
        arguments = call.params.get("arguments") or {}
        if not isinstance(name, str) or name not in self.PROMPTS:
            raise RpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, "arguments must be an object")
        for argument in self.PROMPTS[name].get("arguments", ()):
            if not isinstance(arguments.get(argument["name"]), str):
                raise RpcError(INVALID_PARAMS, f"Missing required argument: {argument['name']}")

        def user(content: JSON) -> JSON:
            return {"role": "user", "content": content}

        def text(value: str) -> JSON:
            return user({"type": "text", "text": value})

        match name:
            case "test_simple_prompt":
                messages = [text("This is a simple prompt for testing.")]
            case "test_prompt_with_arguments":
                messages = [text(f"Prompt with arguments: arg1='{arguments['arg1']}', arg2='{arguments['arg2']}'")]
            case "test_prompt_with_embedded_resource":
                resource = {"uri": arguments["resourceUri"], "mimeType": "text/plain", "text": "Embedded resource content for testing."}
                messages = [user({"type": "resource", "resource": resource}), text("Please process the embedded resource above.")]
            case "test_prompt_with_image":
                messages = [user({"type": "image", "data": IMAGE_BASE64, "mimeType": "image/png"}), text("Please analyze the image above.")]
            case _:  # test_input_required_result_prompt
                answer = self.ask_one(call, "user_context", "elicitation/create", _form("What context should the prompt use?", "context"))
                messages = [text(f"Prompt with context: {_accepted(answer, 'context')}")]
        return {"messages": messages}

    def complete(self, call: Call) -> JSON:
        ref, argument = call.params.get("ref"), call.params.get("argument")
        if not isinstance(ref, dict) or not isinstance(argument, dict):
            raise RpcError(INVALID_PARAMS, "ref and argument are required")
        # The suite only needs a well-formed answer; it suggests nothing.
        return {"completion": {"values": [], "total": 0, "hasMore": False}}

    def handle_request(self, message: JSON) -> None:
        # prompts/get may ask the client, so it must not block the reader either.
        request_id, params = message["id"], message.get("params")
        if message.get("method") == "prompts/get" and isinstance(params, dict) and isinstance(request_id, str | int) and not isinstance(request_id, bool):
            call = Call(request_id, params)
            with self.cond:
                self.in_flight[call.id] = call
            threading.Thread(target=self.run, args=(self.prompts_get, call), daemon=True).start()
            return
        super().handle_request(message)





if __name__ == "__main__":
    serve_stdio(FixtureServer)
