"""One hand-made fault: a textual patch of one module, and why it changes nothing when judged so."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    module: str  # the file it patches, from the repository's root
    old: str  # a snippet that occurs exactly once in it
    new: str
    equivalent: str = ""  # why no observable behaviour changes, when judged so
