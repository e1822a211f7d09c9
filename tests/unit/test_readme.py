"""The README's examples, run: each code block marked ``<!-- readme-test: run -->`` (``sh`` runs
in bash, ``python`` in this interpreter) against a ``v2proxy serve --config config/example.yaml``
this module starts (what ``make run`` serves), and its output compared with the block marked
``<!-- readme-test: output -->`` that follows it.

The documented substitution: the README's examples talk to ``localhost:9000`` (REST) and
``localhost:9001`` (gRPC), the ports ``make run`` uses; here each is rewritten to a free port of
the proxy started for the test, so that a proxy already running on 9000 (someone's ``make run``)
is never asked. A block that names neither port is refused: it would not reach the test's proxy.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RUN = "<!-- readme-test: run -->"
OUTPUT = "<!-- readme-test: output -->"
HTTP_PORT, GRPC_PORT = "localhost:9000", "localhost:9001"
#: the README is a front page; the rest lives in docs/
MAX_LINES = 180


@dataclass(frozen=True)
class Example:
    line: int  # where the code block starts in the README (1-based)
    language: str
    code: str
    expected: str


def _fence(lines: list[str], start: int) -> tuple[int, str, str, int]:
    """The fenced block opening at or after ``start``: (its index, language, body, the index
    after it)."""
    i = start
    while not lines[i].startswith("```"):
        if lines[i].strip():
            raise ValueError(f"README.md:{i + 1}: a readme-test marker must precede a code block")
        i += 1
    language = lines[i][3:].strip()
    end = lines.index("```", i + 1)
    return i, language, "\n".join(lines[i + 1 : end]), end + 1


def examples(text: str) -> list[Example]:
    """Every marked example of a README text, with the output it promises."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != RUN:
            i += 1
            continue
        start, language, code, after = _fence(lines, i + 1)
        j = after
        while j < len(lines) and lines[j].strip() not in (OUTPUT, RUN):
            j += 1
        if j == len(lines) or lines[j].strip() != OUTPUT:
            raise ValueError(f"README.md:{i + 1}: a run block without its output block")
        _, _, expected, i = _fence(lines, j + 1)
        found.append(Example(start + 1, language, code, expected))
    return found


EXAMPLES = examples(README.read_text(encoding="utf-8"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A proxy as ``make run`` starts it, on free ports; the README's ports -> its ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("V2PROXY_")}
    log = tmp_path_factory.mktemp("readme") / "v2proxy.log"
    for _ in range(3):  # a free port may be taken between the probe and the bind: try again
        http, grpc = _free_port(), _free_port()
        command = [sys.executable, "-m", "v2proxy", "serve", "--config", "config/example.yaml"]
        command += ["--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc)]
        with log.open("wb") as out:
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
        try:
            if _ready(http, proc):
                yield {HTTP_PORT: f"localhost:{http}", GRPC_PORT: f"localhost:{grpc}"}
                return
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    pytest.fail(f"v2proxy serve did not start:\n{log.read_text(errors='replace')}")


def test_the_readme_has_its_examples() -> None:
    # JSON, binary tensors, raw binary, gRPC, shared memory, MindIE's /infer
    assert len(EXAMPLES) >= 6
    assert {e.language for e in EXAMPLES} == {"sh", "python"}


def test_the_readme_stays_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move the detail into docs/"


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"line{e.line}-{e.language}" for e in EXAMPLES])
def test_example_answers_as_the_readme_says(
    example: Example, ports: dict[str, str], tmp_path: Path
) -> None:
    assert HTTP_PORT in example.code or GRPC_PORT in example.code, "names no port of make run"
    code = example.code
    for theirs, ours in ports.items():
        code = code.replace(theirs, ours)
    if example.language == "sh":
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        command = ["bash", "-o", "pipefail", "-c", code]
    else:
        assert example.language == "python", f"README.md:{example.line}: no runner for it"
        command = [sys.executable, "-c", code]
    done = subprocess.run(
        command, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == example.expected.rstrip("\n")
