"""The config layer: the YAML config's schema (frozen structs) and its reading and checking."""
