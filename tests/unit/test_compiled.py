"""Which form of the compiled modules is imported (v2proxy/_compiled.py): the compiled one when
it is built and current, the source when asked (``V2PROXY_PURE_PYTHON=1``) or when a source was
edited since the build, and never a mix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from v2proxy import _compiled

SRC = Path(__file__).resolve().parents[2] / "src"
PROBE = (
    "import v2proxy._compiled as c, v2proxy.http.server_conn as a, v2proxy.frontends.rest_quick"
    " as b; print(c.COMPILED, a.__file__.endswith('.py'), b.__file__.endswith('.py'))"
)


def _probe(**env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, "PYTHONPATH": str(SRC), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_compiled_form_runs_when_built_and_the_source_when_asked() -> None:
    built = bool(_compiled._PAIRS)
    # built in place (make install): the compiled modules, both of them; else the source
    assert _probe(V2PROXY_PURE_PYTHON="0") == ("True False False" if built else "False True True")
    assert _probe(V2PROXY_PURE_PYTHON="1") == "False True True"


def test_a_source_edited_since_the_build_takes_every_module_from_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ext, src, other = tmp_path / "a.so", tmp_path / "a.py", tmp_path / "b.so"
    for f in (ext, src, other):
        f.write_text("")
    os.utime(src, (1000, 1000))
    os.utime(ext, (2000, 2000))
    os.utime(other, (2000, 2000))
    pairs = [(str(ext), str(src)), (str(other), str(src))]
    assert _compiled._use_compiled(pairs)  # (the repository's setup.py: a source tree)
    os.utime(src, (3000, 3000))
    assert not _compiled._use_compiled(pairs)
    os.utime(src, (1000, 1000))
    monkeypatch.setenv("V2PROXY_PURE_PYTHON", "1")
    assert not _compiled._use_compiled(pairs)
