"""The Python and curl examples of docs/getting-started.md, docs/guides/openai.md and
docs/guides/generate.md marked ``docs-test`` (tests/doc_blocks.py) print what the pages show, run
against ``v2proxy serve --config config/example.yaml`` (``make run``) on free ports: the pages'
``localhost:9000``/``127.0.0.1:9000`` and ``:9001`` are rewritten to them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, block
from tests.integration.test_cli_start import _free_port, v2proxy, wait_ready

EXAMPLES = [
    ("docs/getting-started.md", "grpc-example"),
    ("docs/guides/openai.md", "openai-example"),
    ("docs/guides/generate.md", "generate-stream"),
]


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, str]]:
    http, grpc = _free_port(), _free_port()
    args = ["serve", "--config", str(ROOT / "config" / "example.yaml"), "--host=127.0.0.1"]
    with v2proxy(*args, f"--http-port={http}", f"--grpc-port={grpc}") as proc:
        wait_ready(http, proc)
        yield {":9000": f":{http}", ":9001": f":{grpc}"}


@pytest.mark.parametrize(("page", "name"), EXAMPLES, ids=[n for _, n in EXAMPLES])
def test_example_prints_what_the_page_shows(
    page: str, name: str, ports: dict[str, str], tmp_path: Path
) -> None:
    code = block(page, name)
    for theirs, ours in ports.items():
        code = code.replace(theirs, ours)
    if code.startswith("curl"):
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        command = ["bash", "-o", "pipefail", "-c", code]
    else:
        command = [sys.executable, "-c", code]
    done = subprocess.run(
        command, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == block(page, name, output=True).rstrip("\n")
