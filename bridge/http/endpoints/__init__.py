"""The endpoints of each protocol revision, and the dispatcher of POST /mcp that picks one; they never import each other."""
