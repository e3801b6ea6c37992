"""The process layer: one stdio server process, its supervision, confinement and pool."""
