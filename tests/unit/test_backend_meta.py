"""The server and model metadata answers of the servers v2proxy fronts (Triton, KServe,
MLServer, MindIE, v2proxy itself), parsed once into typed facts (``v2proxy.codecs.backend_meta``):
capabilities, model metadata and the configuration facts the proxy uses."""

from __future__ import annotations

from typing import Any

import pytest

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.codecs.backend_meta import (
    NO_CONFIG,
    ConfigFacts,
    ServerCaps,
    TensorMeta,
    config_facts,
    model_meta,
    server_caps,
)
from v2proxy.core.pipeline import Pipeline

TRITON_EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]

# --------------------------------------------------------------------------- GET /v2


@pytest.mark.parametrize(
    ("answer", "caps"),
    [
        pytest.param(
            {"name": "triton", "version": "2.50.0", "extensions": TRITON_EXTENSIONS},
            ServerCaps(
                "triton",
                "2.50.0",
                tuple(TRITON_EXTENSIONS),
                binary_tensors=True,
                binary_unlisted=True,
                classification=True,
                generate=True,  # Triton's own, unlisted
                system_shared_memory=True,
            ),
            id="triton",
        ),
        pytest.param(
            {"name": "kserve", "version": "0.21.0", "extensions": ["model_repository_extension"]},
            ServerCaps("kserve", "0.21.0", ("model_repository_extension",)),
            id="kserve: binary tensors unlisted, to be tried",
        ),
        pytest.param(
            {"name": "mlserver", "version": "1.7.1", "extensions": []},
            ServerCaps("mlserver", "1.7.1", (), binary_unlisted=False),
            id="mlserver: never binary",
        ),
        pytest.param(
            {"name": "mindie", "version": "", "extensions": {"x": True}},
            ServerCaps("mindie", ""),
            id="mindie: extensions as an object",
        ),
        pytest.param(
            {
                "name": "v2proxy",
                "version": "1.0",
                "extensions": ["binary_tensor_data", "classification", "generate", 5, None],
            },
            ServerCaps(
                "v2proxy",
                "1.0",
                ("binary_tensor_data", "classification", "generate"),
                binary_tensors=True,
                binary_unlisted=True,
                classification=True,
                generate=True,
            ),
            id="v2proxy in front: generate listed, non-strings dropped",
        ),
        pytest.param({}, ServerCaps(), id="nothing said"),
        pytest.param(
            {"name": 7, "version": None, "extensions": "binary_tensor_data"},
            ServerCaps(),
            id="not what the protocol says",
        ),
    ],
)
def test_server_capabilities(answer: dict[str, Any], caps: ServerCaps) -> None:
    assert server_caps(answer) == caps


async def test_the_builtin_server_and_v2proxy_in_front_of_it() -> None:
    own = server_caps(await BuiltinBackend().server_metadata())
    assert (own.name, own.binary_tensors, own.classification, own.generate) == (
        "v2proxy",
        True,
        False,
        False,
    )
    front = server_caps(await Pipeline(BuiltinBackend(), 1 << 20).server_metadata())
    assert front.binary_tensors and front.classification and front.generate
    assert front.system_shared_memory and front.binary_unlisted is True


# --------------------------------------------------------------------------- model metadata

SIMPLE = {
    "name": "simple",
    "versions": ["1"],
    "platform": "tensorflow_graphdef",
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ],
    "outputs": [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ],
}
MLSERVER = {
    "name": "sum-model",
    "versions": [],
    "platform": "",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "parameters": {}}],
    "outputs": [],
    "parameters": {"content_type": "np"},
}
KSERVE = {
    "name": "sklearn",
    "versions": None,
    "platform": "",
    "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [1, 4]}],
    "outputs": [{"name": "output-0", "datatype": "INT64", "shape": [1]}],
}
MINDIE = {
    "name": "llm",
    "versions": ["1"],
    "platform": "mindie",
    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
    "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}],
}
ODD = {
    "name": "odd",
    "versions": [1, "2"],
    "inputs": [
        "not an object",
        {"datatype": "FP32", "shape": [1]},  # no name
        {"name": "S", "datatype": 5, "shape": ["1", 2]},
        {"name": "SCALAR", "datatype": "FP32"},
    ],
    "outputs": {"O": 1},
}


@pytest.mark.parametrize(
    ("answer", "name", "versions", "platform", "inputs", "outputs"),
    [
        pytest.param(
            SIMPLE,
            "simple",
            ("1",),
            "tensorflow_graphdef",
            (
                TensorMeta("INPUT0", "INT32", (-1, 16)),
                TensorMeta("INPUT1", "INT32", (-1, 16)),
            ),
            (
                TensorMeta("OUTPUT0", "INT32", (-1, 16)),
                TensorMeta("OUTPUT1", "INT32", (-1, 16)),
            ),
            id="triton",
        ),
        pytest.param(
            MLSERVER, "sum-model", (), "", (TensorMeta("x", "FP32", (-1,)),), (), id="mlserver"
        ),
        pytest.param(
            KSERVE,
            "sklearn",
            (),
            "",
            (TensorMeta("input-0", "FP32", (1, 4)),),
            (TensorMeta("output-0", "INT64", (1,)),),
            id="kserve",
        ),
        pytest.param(
            MINDIE,
            "llm",
            ("1",),
            "mindie",
            (TensorMeta("text_input", "BYTES", (1,)),),
            (TensorMeta("text_output", "BYTES", (-1,)),),
            id="mindie",
        ),
        pytest.param(
            ODD,
            "odd",
            ("1", "2"),
            "",
            (TensorMeta("S", "", None), TensorMeta("SCALAR", "FP32", ())),
            (),
            id="what cannot be read is left out",
        ),
    ],
)
def test_model_metadata(
    answer: dict[str, Any],
    name: str,
    versions: tuple[str, ...],
    platform: str,
    inputs: tuple[TensorMeta, ...],
    outputs: tuple[TensorMeta, ...],
) -> None:
    meta = model_meta(answer)
    assert (meta.name, meta.versions, meta.platform) == (name, versions, platform)
    assert (meta.inputs, meta.outputs) == (inputs, outputs)
    assert meta.raw is answer
    for t in outputs:
        assert meta.output(t.name) == t
    assert meta.output("nosuch") is None and meta.input("nosuch") is None


async def test_the_builtin_models_metadata() -> None:
    backend = BuiltinBackend()
    meta = model_meta(await backend.model_metadata("simple", ""))
    assert meta.input("INPUT0") == TensorMeta("INPUT0", "INT32", (-1, 16))
    assert config_facts(await backend.model_config("simple", "")) == ConfigFacts(8, False)
    assert config_facts(await backend.model_config("llm", "")).decoupled is True


# --------------------------------------------------------------------------- model config


@pytest.mark.parametrize(
    ("config", "facts"),
    [
        pytest.param({"name": "simple", "max_batch_size": 8}, ConfigFacts(8, False), id="triton"),
        pytest.param(
            {"max_batch_size": 0, "model_transaction_policy": {"decoupled": True}},
            ConfigFacts(0, True),
            id="decoupled",
        ),
        pytest.param(
            {"max_batch_size": 0, "model_transaction_policy": {}},
            ConfigFacts(0, False),
            id="grpc: decoupled false not carried",
        ),
        pytest.param({}, NO_CONFIG, id="empty"),
        pytest.param(None, NO_CONFIG, id="none"),
        pytest.param(
            {"max_batch_size": True, "model_transaction_policy": {"decoupled": "true"}},
            NO_CONFIG,
            id="wrong types",
        ),
        pytest.param({"model_transaction_policy": [True]}, NO_CONFIG, id="policy no object"),
    ],
)
def test_config_facts(config: Any, facts: ConfigFacts) -> None:
    assert config_facts(config) == facts
