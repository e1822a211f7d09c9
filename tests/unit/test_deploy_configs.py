"""The example configuration of each deployment shape (config/deploy/) loads as it is shipped
and says what its comments say."""

from __future__ import annotations

from pathlib import Path

import pytest

from v2proxy.ops.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "config" / "deploy"

CASES = [
    ("triton.yaml", "http", "auto"),
    ("kserve.yaml", "http", "auto"),
    ("mlserver.yaml", "http", "json"),
    ("grpc-bridge.yaml", "grpc", "auto"),
    ("mindie.yaml", "grpc", "auto"),
    ("mindie-backend.yaml", "mindie", "auto"),
]


def test_every_shipped_deployment_is_tested() -> None:
    assert sorted(p.name for p in DEPLOY.glob("*.yaml")) == sorted(c[0] for c in CASES)


@pytest.mark.parametrize(("name", "kind", "encoding"), CASES)
def test_deployment_config_loads(name: str, kind: str, encoding: str) -> None:
    s = load_settings({}, str(DEPLOY / name), env={})
    assert (s.backend.kind, s.backend_encoding) == (kind, encoding)
    assert (s.http_port, s.grpc_port) == (9000, 9001)


def test_kserve_example_labels_resolve_from_the_config_folder() -> None:
    s = load_settings({}, str(DEPLOY / "kserve.yaml"), env={})
    labels = s.models["classifier"].outputs["SCORES"].labels
    assert len(labels) == 10 and labels[0] == "zero"


def test_mindie_example() -> None:
    s = load_settings({}, str(DEPLOY / "mindie.yaml"), env={})
    assert s.mindie is not None
    assert (s.mindie.model, s.mindie.profile, s.mindie.max_new_tokens) == (
        "ensemble",
        "trtllm",
        256,
    )


def test_mindie_backend_example() -> None:
    s = load_settings({}, str(DEPLOY / "mindie-backend.yaml"), env={})
    assert (s.backend.kind, s.backend.url, s.backend_timeout) == ("mindie", "127.0.0.1:1025", 600)
    assert s.mindie is not None and s.mindie.model == "llm"
