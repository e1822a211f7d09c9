"""Check the layer rule (docs/architecture.md, layers): the pure layers (``core/``, the request's
one pass, and ``codecs/``) import no I/O library and nothing from the edges, the operations
(``ops/``) or the composition root; the operations import no edge; and the shared-memory adapters
(``shm/``) depend on the core's regions port (``core/regions.py``), never on the core's stages.
Exit status 1 names each offending import."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "v2proxy"
#: the pure layers: folders (or single modules) of src/v2proxy
PURE = ["core", "codecs"]
#: what a pure module may not import (a name, or any module under it)
FORBIDDEN = {
    "asyncio",
    "aiohttp",
    "uvloop",
    "grpc",
    "prometheus_client",
    "cupy",
    "posix_ipc",
    "socket",
    "selectors",
    "subprocess",
    "threading",
    "multiprocessing",
    "mmap",
    "v2proxy.frontends",
    "v2proxy.backends",
    "v2proxy.http",
    "v2proxy.shm",
    "v2proxy.inject",
    "v2proxy.reference",
    "v2proxy.ops",
    "v2proxy.app",
    "v2proxy.app_core",
    "v2proxy.cli",
    "v2proxy.__main__",
}
#: the edges and the composition root, which the operations may not import
EDGES = {
    "v2proxy.frontends",
    "v2proxy.backends",
    "v2proxy.http",
    "v2proxy.shm",
    "v2proxy.inject",
    "v2proxy.reference",
    "v2proxy.app",
    "v2proxy.app_core",
    "v2proxy.cli",
    "v2proxy.__main__",
}
#: further folders and what they may not import: the operations serve the edges, never the
#: reverse; the dependency runs from the core's stages to the port the shm adapters implement,
#: never from an adapter to a stage; the HTTP transport imports nothing of the project outside
#: itself
RULES = {
    "ops": EDGES,
    "shm": {"v2proxy.core.stages"},
    # transport: knows nothing of the core, the codecs or the other edges
    "http": (EDGES - {"v2proxy.http"}) | {"v2proxy.core", "v2proxy.codecs", "v2proxy.ops"},
}


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # ``from v2proxy import ops`` names a forbidden package as an imported name
            found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return found


def _files(entry: str) -> list[Path]:
    p = SRC / entry
    if p.is_dir():
        return sorted(p.rglob("*.py"))
    return [p] if p.exists() else []


def _offending(files: list[Path], forbidden: set[str]) -> list[str]:
    bad = []
    for f in files:
        lines: set[int] = set()  # one report per import statement
        for line, name in imports(f):
            if line not in lines and any(name == m or name.startswith(m + ".") for m in forbidden):
                lines.add(line)
                bad.append(f"{f.relative_to(SRC.parent.parent)}:{line}: imports {name}")
    return bad


def violations() -> list[str]:
    bad = _offending([f for entry in PURE for f in _files(entry)], FORBIDDEN)
    for entry, forbidden in RULES.items():
        bad += _offending(_files(entry), forbidden)
    return bad


if __name__ == "__main__":
    problems = violations()
    for p in problems:
        print(p)
    print("pure layers: " + (f"{len(problems)} forbidden imports" if problems else "clean"))
    sys.exit(1 if problems else 0)
