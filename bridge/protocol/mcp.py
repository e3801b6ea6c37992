"""MCP's constants, one home for each: the protocol revisions, log levels, `_meta` keys, the
error codes MCP adds to JSON-RPC's, and the method sets that rules elsewhere are written in."""

from __future__ import annotations

import re
from typing import Final

# The revisions served over the 2025 transports, oldest first; 2026-07-28 is STATELESS_VERSION.
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = PROTOCOL_VERSIONS[-1]
# MCP 2025-11-25, "Tool names": 1 to 128 characters, ASCII letters, digits, `_`, `-` and `.`.
TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}\Z")
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
RELATED_TASK = "io.modelcontextprotocol/related-task"
MISSING_CAPABILITY = -32021  # 2026-07-28: a request needs a client capability it did not declare

STATELESS_VERSION: Final = "2026-07-28"


STATELESS_VERSIONS: Final = (STATELESS_VERSION,)


# What `server/discover` and every -32022 name: 2026-07-28 first, then the
# handshake-era ones this endpoint serves with sessions.
SUPPORTED_VERSIONS: Final = (*STATELESS_VERSIONS, *reversed(PROTOCOL_VERSIONS))


VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"


CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"


CLIENT_INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"


LOG_LEVEL_KEY: Final = "io.modelcontextprotocol/logLevel"


SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"


SUBSCRIPTION_KEY: Final = "io.modelcontextprotocol/subscriptionId"


HEADER_MISMATCH: Final = -32020


UNSUPPORTED_VERSION: Final = -32022


RESOURCE_NOT_FOUND_2025: Final = -32002  # a legacy server's; 2026-07-28 says -32602


# Methods of the handshake era that 2026-07-28 removed: 404 / -32601 on the 2026-07-28 path.
REMOVED: Final = frozenset(
    {"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "tasks/list", "tasks/result"}
)


# Results the spec says carry caching hints.
CACHEABLE: Final = frozenset(
    {"server/discover", "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"}
)


# Requests a server may answer `input_required` (MRTR): the only ones a server request may come from.
MRTR_METHODS: Final = frozenset({"tools/call", "prompts/get", "resources/read"})

# HTTP header names of the Streamable HTTP transport (2025) and of 2026-07-28.
SESSION_HEADER: Final = "Mcp-Session-Id"
VERSION_HEADER: Final = "MCP-Protocol-Version"
METHOD_HEADER: Final = "Mcp-Method"
NAME_HEADER: Final = "Mcp-Name"
LISTEN: Final = "subscriptions/listen"  # 2026-07-28: the one request that opens a stream of notifications
