"""The faults of the mutation run, one module per layer of `bridge/`. Each holds `FAULTS`
(what to plant) and `TESTS` (source module -> the test files, or tests (`FILE::NAME`), a
fault in it runs: the narrowest that should notice)."""

from __future__ import annotations

from faults import access, config, core, daemon, gateway, http, observability, ops, process, protocol
from faults.fault import Fault

LAYERS = (protocol, config, access, core, process, observability, gateway, http, ops, daemon)
FAULTS: list[Fault] = [fault for layer in LAYERS for fault in layer.FAULTS]
TESTS: dict[str, tuple[str, ...]] = {module: files for layer in LAYERS for module, files in layer.TESTS.items()}
