"""The fenced code blocks of the README and the docs, for the tests that run or check them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support.daemon import ROOT

FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```[ \t]*$", re.M | re.S)
DOCUMENTS = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.lang or 'plain'})"


def snippets(documents: list[Path] = DOCUMENTS) -> list[Snippet]:
    found = []
    for path in documents:
        text = path.read_text()
        for match in FENCE.finditer(text):
            indent, lang, body = match.groups()
            lines = [line.removeprefix(indent) for line in body.split("\n")]
            found.append(Snippet(path, text.count("\n", 0, match.start()) + 1, lang, "\n".join(lines)))
    return found
