"""The commands the docs pages show, as tests run them.

A fenced code block of a checked page (:data:`CHECKED`) is preceded by ``<!-- docs-test: NAME
-->``; the block of its expected output, when the page shows one, by ``<!-- docs-test: NAME
output -->``. NAME is what a test asks :func:`block` for, or ``needs-gpu`` / ``needs-cluster``
for a command no test here can run. tests/unit/test_doc_commands.py checks that every block of
those pages is marked and that each NAME is asked for by some test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the pages whose every command a test runs
CHECKED = (
    "docs/guides/local-backend.md",
    "docs/troubleshooting.md",
    "docs/compatibility.md",
    "docs/glossary.md",
)
#: names for commands no test here can run
UNTESTED = ("needs-gpu", "needs-cluster")
MARK = re.compile(r"^<!-- docs-test: ([\w.-]+)( output)? -->$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # where the fence opens (1-based)
    name: str  # "" when unmarked
    output: bool  # an expected output block
    language: str
    code: str


def blocks(page: str) -> list[Block]:
    """Every fenced block of ``page`` (a path from the repository's root), with its mark."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        mark = MARK.match(lines[j].strip()) if j >= 0 else None
        end = lines.index("```", i + 1)
        found.append(
            Block(
                page,
                i + 1,
                mark.group(1) if mark else "",
                bool(mark and mark.group(2)),
                lines[i][3:].strip(),
                "\n".join(lines[i + 1 : end]),
            )
        )
        i = end + 1
    return found


def block(page: str, name: str, output: bool = False) -> str:
    """The code of ``page``'s block marked ``name`` (its expected output with ``output``)."""
    for b in blocks(page):
        if b.name == name and b.output == output:
            return b.code
    raise LookupError(f"{page}: no block marked docs-test: {name}{' output' * output}")
