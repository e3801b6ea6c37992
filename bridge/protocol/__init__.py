"""The protocol layer: JSON-RPC and MCP as data (constants, message checks, the 2026-07-28 revision's rules), no IO and nothing of the bridge's state."""
