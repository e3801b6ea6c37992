"""The HTTP layer: the two paths (the fast path, aiohttp's) and what they share; the endpoints of each revision below it."""
