"""Check the layer rule (docs/architecture.md, layers): the pure layers (model, errors,
restricted, codecs, postprocess, ports, pipeline, relay, shm_stage, generate_stage, admission)
import no I/O library and nothing from the outer layers. Exit status 1 names each offending
import."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "v2proxy"
PURE = [
    "model.py",
    "errors.py",
    "restricted.py",
    "codecs",
    "postprocess",
    "ports.py",
    "pipeline.py",
    "relay.py",
    "shm_stage.py",
    "generate_stage.py",
    "model_info.py",
    "admission.py",
]
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
    "v2proxy.shm",
    "v2proxy.app",
    "v2proxy.app_core",
    "v2proxy.cli",
    "v2proxy.metrics",
    "v2proxy.metrics_export",
    "v2proxy.recorders",
    "v2proxy.request_log",
    "v2proxy.config",
    "v2proxy.config_sections",
    "v2proxy.config_values",
    "v2proxy.config_spec",
}


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def violations() -> list[str]:
    files: list[Path] = []
    for entry in PURE:
        p = SRC / entry
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p] if p.exists() else [])
    bad = []
    for f in files:
        for line, name in imports(f):
            if any(name == m or name.startswith(m + ".") for m in FORBIDDEN):
                bad.append(f"{f.relative_to(SRC.parent.parent)}:{line}: imports {name}")
    return bad


if __name__ == "__main__":
    problems = violations()
    for p in problems:
        print(p)
    print("pure layers: " + (f"{len(problems)} forbidden imports" if problems else "clean"))
    sys.exit(1 if problems else 0)
