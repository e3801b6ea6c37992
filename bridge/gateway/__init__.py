"""The gateway layer: one gateway per configured server, which owns its processes, muxes and sessions and carries out the mux's actions."""
