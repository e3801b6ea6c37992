"""The access layer: who is calling (tokens, OAuth) and what they may see and do (filters, rate limits), as pure rules."""
