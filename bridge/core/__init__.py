"""The sans-IO core: the multiplexer, the era translator, replicas' ids and the sealed requestState; no IO, driven by the layers above."""
