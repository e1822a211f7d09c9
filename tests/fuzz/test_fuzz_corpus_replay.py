"""Replays the committed fuzz corpus (tests/fuzz/corpus/<target>/) through the fuzz targets'
entry points (tests/fuzz/targets/fuzz_<target>.py), without atheris: every input the fuzzer
kept, crash reproducers included, must still satisfy the target's invariant (success or the
project's own error, nothing else). ``make fuzz`` grows the corpus; this keeps it checked by
``make test``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
TARGETS = HERE / "targets"
CORPUS = HERE / "corpus"
NAMES = sorted(p.stem.removeprefix("fuzz_") for p in TARGETS.glob("fuzz_*.py"))


@pytest.fixture(scope="module", autouse=True)
def _close_loop() -> Iterator[None]:
    """The HTTP targets share one event loop of fuzz_http's: closed once they all ran."""
    yield
    http = sys.modules.get("fuzz_http")
    if http is not None:
        http.LOOP.close()


def _target(name: str) -> ModuleType:
    if str(TARGETS) not in sys.path:
        sys.path.insert(0, str(TARGETS))
    return importlib.import_module(f"fuzz_{name}")


def test_every_target_has_a_corpus() -> None:
    assert NAMES, "no fuzz targets found"
    for name in NAMES:
        files = [p for p in (CORPUS / name).glob("*") if p.is_file()]
        assert len(files) >= 5, f"corpus of {name} has {len(files)} inputs"


def test_corpus_is_small() -> None:
    files = [p for p in CORPUS.rglob("*") if p.is_file()]
    assert len(files) < 2000
    assert sum(p.stat().st_size for p in files) < 2 * 1024 * 1024


@pytest.mark.parametrize("name", NAMES)
def test_corpus_replays(name: str) -> None:
    """Each input of the target's corpus passes its invariant (failures name the file)."""
    target = _target(name)
    failed = []
    for path in sorted((CORPUS / name).glob("*")):
        try:
            target.test_one_input(path.read_bytes())
        except Exception as exc:
            failed.append(f"{path.name}: {type(exc).__name__}: {exc}"[:300])
    assert not failed, "\n".join(failed)
