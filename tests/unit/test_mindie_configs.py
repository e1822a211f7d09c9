"""The MindIE frontend's example configurations (config/mindie/, one per profile) load as they
are shipped and say what their comments say."""

from __future__ import annotations

from pathlib import Path

import pytest

from v2proxy.ops.config import load_settings
from v2proxy.ops.config_sections import MindieSettings

FOLDER = Path(__file__).resolve().parents[2] / "config" / "mindie"

CASES = [
    (
        "trtllm.yaml",
        "grpc",
        MindieSettings("ensemble", "trtllm", 20, 4 * 1024 * 1024, 600, "random_seed"),
    ),
    ("vllm.yaml", "grpc", MindieSettings("vllm_model", "vllm", 20, 4 * 1024 * 1024)),
    ("generate.yaml", "http", MindieSettings("llm", "generate", 64)),
]


def test_every_profile_has_an_example() -> None:
    assert sorted(p.name for p in FOLDER.glob("*.yaml")) == sorted(c[0] for c in CASES)
    assert {c[2].profile for c in CASES} == {"trtllm", "vllm", "generate"}


@pytest.mark.parametrize(("name", "kind", "mindie"), CASES, ids=[c[0] for c in CASES])
def test_example_loads(name: str, kind: str, mindie: MindieSettings) -> None:
    s = load_settings({}, str(FOLDER / name), env={})
    assert (s.backend.kind, s.mindie) == (kind, mindie)
