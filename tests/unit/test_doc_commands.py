"""Every command the checked docs pages show (tests/doc_blocks.py: CHECKED) is run by a test, or
marked as needing a GPU or a cluster: each ``sh``/``python`` block carries a ``docs-test`` mark
whose name a test asks for. ``make backend-NAME`` is checked here: it builds the peers, then
runs the launcher tests/interop/test_local_backends.py runs, on 8000 and 8001."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.doc_blocks import CHECKED, ROOT, UNTESTED, block, blocks

COMMANDS = ("sh", "bash", "console", "python")


def _asked_for() -> str:
    """The text of every test module but the helper itself."""
    return "\n".join(
        p.read_text(encoding="utf-8")
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if p.name != "doc_blocks.py"
    )


def test_every_command_block_is_marked_and_run() -> None:
    tests = _asked_for()
    unmarked, unrun = [], []
    for page in CHECKED:
        for b in blocks(page):
            if b.language in COMMANDS and not b.name:
                unmarked.append(f"{page}:{b.line}")
            if b.name and b.name not in UNTESTED and f'"{b.name}"' not in tests:
                unrun.append(f"{page}:{b.line}: {b.name}")
    assert unmarked == [], "mark each with <!-- docs-test: NAME -->"
    assert unrun == [], "no test asks for these blocks"


def test_the_checked_pages_are_in_the_site() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in CHECKED:
        assert Path(page).is_relative_to("docs")
        assert f": {page.removeprefix('docs/')}\n" in nav


@pytest.mark.parametrize("name", ["triton", "kserve", "mlserver"])
def test_make_backend_targets_build_the_peers_then_start_one(name: str) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shown = block("docs/guides/local-backend.md", "backend-targets")
    assert f"make backend-{name}" in shown
    # as a user runs it, not as a sub-make of `make test` (whose flags and variables it would take)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", f"backend-{name}", "PEERS_DIR=/peers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    lines = done.stdout.splitlines()
    assert lines.index("bash tests/interop/peers/setup_peers.sh /peers") == 0, lines
    launcher = re.compile(
        rf"V2PROXY_PEERS_DIR=/peers \S*python[\d.]* tests/interop/peers/launch.py {name}"
        r" --http-port 8000 --grpc-port 8001"
    )
    assert [line for line in lines if launcher.fullmatch(line)] == [lines[-1]], lines
