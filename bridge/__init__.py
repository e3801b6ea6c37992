"""mcp-bridge: serve local stdio MCP servers over HTTP, many isolated clients per process."""

__version__ = "0.1.0"
