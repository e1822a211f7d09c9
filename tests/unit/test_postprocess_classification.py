"""The classification extension (docs/protocol.md, classification): the pure top-k
(``codecs/classification.py``), the stage's planning (``core/stages/classification.py``), the gRPC
parameter checks (``codecs/grpc.py``) and the pipeline running it in front of the builtin
models. Expected strings are Triton's (checked against Triton 2.51 where it answers)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.codecs import grpc as grpcc
from v2proxy.codecs.classification import (
    BAD_COUNT,
    MAX_ROW_ELEMENTS,
    WITH_SHM,
    classify,
    requested_count,
)
from v2proxy.codecs.dtypes import NUMPY_DTYPE, deserialize_bytes
from v2proxy.core.errors import CodecError, InvalidRequest, NotFound, ProxyError
from v2proxy.core.model import Datatype, InferRequest, InferResponse, RequestedOutput, Tensor
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.stages import classification as stage
from v2proxy.ops.config import load_settings

NEG_NAN = float(np.frombuffer(struct.pack("<I", 0xFFC00000), "<f4")[0])
NAN = float("nan")
INF = float("inf")


def _tensor(datatype: Datatype, shape: tuple[int, ...], values: list[Any]) -> Tensor:
    data = np.array(values, dtype=NUMPY_DTYPE[datatype]).tobytes()
    return Tensor("OUT", datatype, shape, data)


def _strings(t: Tensor) -> list[str]:
    assert t.datatype is Datatype.BYTES
    return [b.decode() for b in deserialize_bytes(t.data)]


# (id, datatype, shape, values, k, batching, labels, expected shape, expected strings)
CASES = [
    # the extension's document example, as Triton really answers it
    ("doc-example", Datatype.FP32, (4,), [1.1, 3.3, 0.5, 2.4], 2, False, None, (2,),
     ["3.300000:1", "2.400000:3"]),
    ("doc-example-labels", Datatype.FP32, (4,), [1.1, 3.3, 0.5, 2.4], 2, False,
     ("a", "index_1_label", "c", "index_3_label"), (2,),
     ["3.300000:1:index_1_label", "2.400000:3:index_3_label"]),
    # %f: inf, nan with its sign (glibc), -0.0, large, a half-way case rounded to even;
    # NaN ordered as libstdc++'s insertion sort leaves it (Triton 2.51 gives exactly this)
    ("floats-special", Datatype.FP32, (9,),
     [NAN, 1, 2, NEG_NAN, INF, -0.0, 0.0078125, 1e10, -INF], 9, False, None, (9,),
     ["nan:0", "2.000000:2", "1.000000:1", "-nan:3", "inf:4", "10000000000.000000:7",
      "0.007812:6", "-0.000000:5", "-inf:8"]),
    ("fp64", Datatype.FP64, (3,), [-1.25, 0.1, 1e-7], 3, False, None, (3,),
     ["0.100000:1", "0.000000:2", "-1.250000:0"]),
    # integers in plain decimal, every integer type, extremes included
    ("uint8", Datatype.UINT8, (3,), [200, 3, 255], 2, False, None, (2,), ["255:2", "200:0"]),
    ("int8", Datatype.INT8, (3,), [-128, 127, 0], 3, False, None, (3,),
     ["127:1", "0:2", "-128:0"]),
    ("uint16", Datatype.UINT16, (2,), [65535, 1], 1, False, None, (1,), ["65535:0"]),
    ("int16", Datatype.INT16, (2,), [-5, -32768], 2, False, None, (2,), ["-5:0", "-32768:1"]),
    ("uint32", Datatype.UINT32, (2,), [1, 2**32 - 1], 2, False, None, (2,),
     ["4294967295:1", "1:0"]),
    ("int32", Datatype.INT32, (2,), [-(2**31), 7], 2, False, None, (2,),
     ["7:1", "-2147483648:0"]),
    ("uint64", Datatype.UINT64, (3,), [2**64 - 1, 0, 2**63], 3, False, None, (3,),
     ["18446744073709551615:0", "9223372036854775808:2", "0:1"]),
    ("int64", Datatype.INT64, (2,), [-(2**63), 2**63 - 1], 2, False, None, (2,),
     ["9223372036854775807:1", "-9223372036854775808:0"]),
    # ties: stable, lower index first (Triton: [3,3,3,1,3] -> 0,1,2,4,3)
    ("ties", Datatype.FP32, (5,), [3, 3, 3, 1, 3], 5, False, None, (5,),
     ["3.000000:0", "3.000000:1", "3.000000:2", "3.000000:4", "1.000000:3"]),
    ("ties-long", Datatype.INT32, (20,), [1] * 20, 3, False, None, (3,), ["1:0", "1:1", "1:2"]),
    ("ties-zero-signs", Datatype.FP32, (3,), [-0.0, 0.0, -0.0], 3, False, None, (3,),
     ["-0.000000:0", "0.000000:1", "-0.000000:2"]),
    # batch: per row, indices within the row, shape [batch, k]
    ("batch", Datatype.FP32, (2, 4), [1.1, 3.3, 0.5, 2.4, 4, 3, 2, 1], 2, True, None, (2, 2),
     ["3.300000:1", "2.400000:3", "4.000000:0", "3.000000:1"]),
    ("batch-3d-row", Datatype.INT32, (2, 2, 2), [1, 4, 2, 3, 8, 5, 7, 6], 2, True, None,
     (2, 2), ["4:1", "3:3", "8:0", "7:2"]),
    # non-batching: the whole tensor is one row, shape [k]
    ("non-batch-2d", Datatype.INT32, (2, 2), [1, 4, 2, 3], 3, False, None, (3,),
     ["4:1", "3:3", "2:2"]),
    ("batching-scalar-shape", Datatype.INT32, (), [5], 2, True, None, (1,), ["5:0"]),
    # k larger than the row: k = min(requested, row elements)
    ("k-above-row", Datatype.FP32, (1, 3), [1, 3, 2], 10, True, None, (1, 3),
     ["3.000000:1", "2.000000:2", "1.000000:0"]),
    ("k-huge", Datatype.FP32, (2,), [1, 2], 2**63, False, None, (2,),
     ["2.000000:1", "1.000000:0"]),
    # empty: a batching model's empty batch gives [0] (the batch dim is dropped); empty rows
    ("empty-batch", Datatype.FP32, (0, 10), [], 3, True, None, (0,), []),
    ("empty-rows", Datatype.FP32, (2, 0), [], 3, True, None, (2, 0), []),
    ("empty-non-batch", Datatype.FP32, (0,), [], 3, False, None, (0,), []),
    # labels: empty line, labels shorter than the row -> no suffix
    ("labels-short", Datatype.INT32, (4,), [4, 3, 2, 1], 4, False, ("zero", "", "two"), (4,),
     ["4:0:zero", "3:1", "2:2:two", "1:3"]),
    ("labels-batch", Datatype.INT32, (2, 2), [1, 2, 2, 1], 1, True, ("a", "b"), (2, 1),
     ["2:1:b", "2:0:a"]),
    ("labels-unicode-colon", Datatype.INT32, (1,), [9], 1, False, ("chat: noir",), (1,),
     ["9:0:chat: noir"]),
    # the longest row allowed
    ("max-row", Datatype.FP32, (MAX_ROW_ELEMENTS,), [0.0] * (MAX_ROW_ELEMENTS - 1) + [1.0], 2,
     False, None, (2,), ["1.000000:999999", "0.000000:0"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("datatype", "shape", "values", "k", "batching", "labels", "out_shape", "expected"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_classify(
    datatype: Datatype,
    shape: tuple[int, ...],
    values: list[Any],
    k: int,
    batching: bool,
    labels: tuple[str, ...] | None,
    out_shape: tuple[int, ...],
    expected: list[str],
) -> None:
    result = classify(_tensor(datatype, shape, values), k, batching, labels)
    assert result.name == "OUT"
    assert result.shape == out_shape
    assert result.parameters == {}
    assert _strings(result) == expected


def test_classify_nan_in_long_row_still_sorts_the_rest() -> None:
    """Above 16 elements Triton's order of NaN is its introsort's (unspecified); the others
    keep their descending order."""
    values = [NAN] * 3 + list(range(17))
    got = _strings(classify(_tensor(Datatype.FP32, (20,), values), 20, False, None))
    numbers = [s for s in got if not s.startswith("nan")]
    assert numbers == [f"{v:f}:{v + 3}" for v in range(16, -1, -1)]
    assert sorted(s for s in got if s.startswith("nan")) == ["nan:0", "nan:1", "nan:2"]


def test_classify_short_buffer_rows_give_no_classes() -> None:
    """A row running past the data gives no classes, the shape still says k (Triton)."""
    t = Tensor("OUT", Datatype.INT32, (2, 3), np.array([1, 2, 3], "<i4").tobytes())
    result = classify(t, 2, True, None)
    assert result.shape == (2, 2)
    assert _strings(result) == ["3:2", "2:1"]


@pytest.mark.parametrize(
    "datatype", [Datatype.FP16, Datatype.BF16, Datatype.BOOL, Datatype.BYTES], ids=str
)
def test_classify_unsupported_types(datatype: Datatype) -> None:
    t = Tensor("OUT", datatype, (2,), b"\x00" * 8)
    with pytest.raises(InvalidRequest) as err:
        classify(t, 1, False, None)
    assert err.value.message == (
        f"class result not available for output due to unsupported type '{datatype.value}'"
    )
    assert err.value.http_status == 400
    assert err.value.grpc_code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("shape", "batching"),
    [((MAX_ROW_ELEMENTS + 1,), False), ((1, MAX_ROW_ELEMENTS + 1), True),
     ((2, 500_001), False)],
)  # fmt: skip
def test_classify_row_too_large(shape: tuple[int, ...], batching: bool) -> None:
    n = int(np.prod(shape))
    with pytest.raises(InvalidRequest) as err:
        classify(_tensor(Datatype.FP32, shape, [0.0] * n), 1, batching, None)
    assert err.value.message == "classification output tensor too large"
    assert err.value.http_status == 400


def test_classify_batched_rows_may_total_more_than_the_cap() -> None:
    result = classify(_tensor(Datatype.UINT8, (2, 600_000), [0] * 1_200_000), 1, True, None)
    assert result.shape == (2, 1)
    assert _strings(result) == ["0:0", "0:0"]


def test_crlf_label_file_through_the_config(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_bytes(b"zero\r\none\r\n\r\nthree\r\n")
    (tmp_path / "v2proxy.yaml").write_text(
        "models:\n  m:\n    outputs:\n      O: {labels: labels.txt}\n"
    )
    settings = load_settings({}, str(tmp_path / "v2proxy.yaml"), env={})
    labels = settings.models["m"].outputs["O"].labels
    assert labels == ("zero", "one", "", "three")
    got = _strings(classify(_tensor(Datatype.INT32, (5,), [0, 1, 2, 3, 4]), 5, False, labels))
    assert got == ["4:4", "3:3:three", "2:2", "1:1:one", "0:0:zero"]


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(("value", "expected"), [(0, 0), (1, 1), (5, 5), (2**64 - 1, 2**64 - 1)])
def test_requested_count(value: int, expected: int) -> None:
    assert requested_count({"classification": value, "binary_data": True}) == expected


@pytest.mark.parametrize("value", [-1, 2.0, "2", True, False, None, [2], {"k": 2}, 2**64])
def test_requested_count_not_an_unsigned_integer(value: Any) -> None:
    with pytest.raises(InvalidRequest) as err:
        requested_count({"classification": value})
    assert err.value.message == BAD_COUNT
    assert err.value.http_status == 400


@pytest.mark.parametrize("k", [0, 2])
def test_requested_count_with_shared_memory(k: int) -> None:
    with pytest.raises(InvalidRequest) as err:
        requested_count({"classification": k, "shared_memory_region": "r"})
    assert (
        err.value.message
        == WITH_SHM
        == ("Output can't set both 'shared_memory_region' and 'classification'")
    )


def _grpc_request(**params: Any) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    out = msg.outputs.add(name="O")
    for key, (kind, value) in params.items():
        setattr(out.parameters[key], kind, value)
    return msg


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"classification": ("uint64_param", 2)},
         "invalid value type for 'classification' parameter, expected int64_param"),
        ({"classification": ("string_param", "2")},
         "invalid value type for 'classification' parameter, expected int64_param"),
        ({"classification": ("double_param", 2.0)},
         "invalid value type for 'classification' parameter, expected int64_param"),
        ({"classification": ("bool_param", True)},
         "invalid value type for 'classification' parameter, expected int64_param"),
        ({"classification": ("int64_param", 0)},
         "invalid value for 'classification' parameter, expected >= 0"),
        ({"classification": ("int64_param", -3)},
         "invalid value for 'classification' parameter, expected >= 0"),
        ({"classification": ("int64_param", 2), "shared_memory_region": ("string_param", "r")},
         "output can't set both 'shared_memory_region' and 'classification'"),
    ],
)  # fmt: skip
def test_grpc_classification_parameter(params: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError) as err:
        grpcc.request_from_proto(_grpc_request(**params))
    assert err.value.message == message
    assert err.value.grpc_code == "INVALID_ARGUMENT"


def test_grpc_classification_parameter_accepted() -> None:
    req = grpcc.request_from_proto(_grpc_request(classification=("int64_param", 3)))
    assert req.outputs == [RequestedOutput("O", {"classification": 3})]


# --------------------------------------------------------------------------- stage planning


class _Out:
    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels


def _request(*outputs: RequestedOutput) -> InferRequest:
    return InferRequest("m", [], list(outputs))


@pytest.mark.parametrize(
    ("local", "backend", "sent", "todo"),
    [
        # labels here: the proxy classifies, the backend gets the output without the parameter
        ({"A": ("x",)}, True, [{"binary_data": True}, {"classification": 1}],
         {"A": stage.Classification(2, ("x",))}),
        # no labels, the backend classifies: passed through unchanged
        ({}, True, [{"classification": 2, "binary_data": True}, {"classification": 1}], {}),
        # no labels, the backend cannot: the proxy classifies without labels
        ({}, False, [{"binary_data": True}, {}],
         {"A": stage.Classification(2, None), "B": stage.Classification(1, None)}),
    ],
)  # fmt: skip
def test_plan(
    local: dict[str, tuple[str, ...]],
    backend: bool,
    sent: list[dict[str, Any]],
    todo: dict[str, stage.Classification],
) -> None:
    request = _request(
        RequestedOutput("A", {"classification": 2, "binary_data": True}),
        RequestedOutput("B", {"classification": 1}),
        RequestedOutput("C", {"binary_data": False}),
    )
    labels = {name: _Out(v) for name, v in local.items()}
    got, plan = stage.plan(request, {"A": 2, "B": 1}, labels, backend)
    assert [o.parameters for o in got.outputs or ()] == [*sent, {"binary_data": False}]
    assert dict(plan) == todo
    # the client's request is left as it was (its binary_data still decides the encoding)
    assert request.outputs is not None
    assert request.outputs[0].parameters == {"classification": 2, "binary_data": True}
    assert (got is request) == (sent[0].get("classification") == 2)


def test_plan_zero_drops_the_parameter() -> None:
    request = _request(RequestedOutput("A", {"classification": 0}))
    got, plan = stage.plan(request, {"A": 0}, {}, True)
    assert got.outputs == [RequestedOutput("A", {})]
    assert plan == {}
    assert not stage.asks_backend({"A": 0}, {})


@pytest.mark.parametrize(
    ("metadata", "max_batch_size", "expected"),
    [
        ({}, 8, True),
        ({"outputs": [{"name": "O", "shape": [-1, 10]}]}, 0, False),
        ({"outputs": [{"name": "O", "shape": [-1, 10]}]}, None, True),
        ({"outputs": [{"name": "O", "shape": [-1]}]}, None, False),
        ({"outputs": [{"name": "O", "shape": [4, 10]}]}, None, False),
        ({"outputs": [{"name": "X", "shape": [-1, 10]}]}, None, False),
        ({"outputs": "junk"}, None, False),
    ],
)
def test_batching(metadata: dict[str, Any], max_batch_size: int | None, expected: bool) -> None:
    assert stage.batching(metadata, max_batch_size, "O") is expected


# --------------------------------------------------------------------------- the pipeline


class _Settings:
    def __init__(self, outputs: dict[str, _Out]) -> None:
        self.outputs = outputs


LABELS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


class _Recording(BuiltinBackend):
    """The builtin models, remembering what they were sent; optionally listing the
    classification extension (as Triton does)."""

    def __init__(self, lists: bool = False) -> None:
        super().__init__(server_name="test")
        self.lists = lists
        self.sent: list[InferRequest] = []
        self.metadata_calls = 0

    async def server_metadata(self) -> dict[str, Any]:
        self.metadata_calls += 1
        meta = await super().server_metadata()
        if self.lists:
            meta = {**meta, "extensions": [*meta["extensions"], "classification"]}
        return meta

    async def infer(self, request: InferRequest, headers: Any) -> InferResponse:
        self.sent.append(request)
        return await super().infer(request, headers)


def _classifier_request(k: Any, batch: int = 2, **extra: Any) -> InferRequest:
    x = np.arange(batch * 10, dtype="<f4").reshape(batch, 10)
    return InferRequest(
        "classifier",
        [Tensor("INPUT0", Datatype.FP32, x.shape, x.tobytes())],
        [RequestedOutput("SCORES", {"classification": k, **extra})],
    )


async def test_pipeline_classifies_with_local_labels() -> None:
    backend = _Recording(lists=True)
    models = {"classifier": _Settings({"SCORES": _Out(LABELS)})}
    pipeline = Pipeline(backend, 1 << 20, models=models)
    response = await pipeline.staged(_classifier_request(3, binary_data=True), [])
    (out,) = response.outputs
    assert (out.name, out.datatype, out.shape) == ("SCORES", Datatype.BYTES, (2, 3))
    assert _strings(out) == [
        "19.125000:9:nine", "17.000000:8:eight", "14.875000:7:seven",
        "39.125000:9:nine", "37.000000:8:eight", "34.875000:7:seven",
    ]  # fmt: skip
    assert backend.sent[0].outputs == [RequestedOutput("SCORES", {"binary_data": True})]
    assert backend.metadata_calls == 0  # labels here: the backend's extensions do not matter


async def test_pipeline_passes_through_to_a_backend_that_classifies() -> None:
    backend = _Recording(lists=True)
    pipeline = Pipeline(backend, 1 << 20)
    request = _classifier_request(2)
    response = await pipeline.staged(request, [])
    # the builtin models ignore the parameter: the raw scores show it reached them unchanged
    assert backend.sent[0] is request
    assert response.outputs[0].datatype is Datatype.FP32
    await pipeline.staged(_classifier_request(2), [])
    assert backend.metadata_calls == 1  # cached


async def test_pipeline_classifies_without_labels_when_the_backend_cannot() -> None:
    backend = _Recording(lists=False)
    pipeline = Pipeline(backend, 1 << 20)
    response = await pipeline.staged(_classifier_request(2, batch=1), [])
    assert response.outputs[0].shape == (1, 2)
    assert _strings(response.outputs[0]) == ["19.125000:9", "17.000000:8"]
    assert backend.sent[0].outputs == [RequestedOutput("SCORES", {})]


async def test_pipeline_zero_returns_the_raw_output() -> None:
    backend = _Recording(lists=True)
    response = await Pipeline(backend, 1 << 20).staged(_classifier_request(0, batch=1), [])
    assert response.outputs[0].datatype is Datatype.FP32
    assert backend.sent[0].outputs == [RequestedOutput("SCORES", {})]


async def test_pipeline_non_batching_model() -> None:
    pipeline = Pipeline(_Recording(), 1 << 20)
    x = np.array([1.5, -2.0, 7.25], "<f4")
    request = InferRequest(
        "identity_fp32",
        [Tensor("INPUT0", Datatype.FP32, (3,), x.tobytes())],
        [RequestedOutput("OUTPUT0", {"classification": 5})],
    )
    (out,) = (await pipeline.staged(request, [])).outputs
    assert out.shape == (3,)
    assert _strings(out) == ["7.250000:2", "1.500000:0", "-2.000000:1"]


@pytest.mark.parametrize(
    ("k", "extra", "error", "message"),
    [
        (-1, {}, InvalidRequest, BAD_COUNT),
        (2, {"shared_memory_region": "r"}, InvalidRequest, WITH_SHM),
        # without classification a region is simply unknown
        (None, {"shared_memory_region": "r"}, NotFound,
         "Unable to find shared memory region: 'r'"),
    ],
)  # fmt: skip
async def test_pipeline_parameter_errors(
    k: Any, extra: dict[str, Any], error: type[ProxyError], message: str
) -> None:
    backend = _Recording()
    request = _classifier_request(k, **extra)
    if k is None:
        assert request.outputs is not None
        del request.outputs[0].parameters["classification"]
    with pytest.raises(error) as err:
        await Pipeline(backend, 1 << 20).staged(request, [], None)  # a local (unix) client
    assert err.value.message == message
    assert backend.sent == []


async def test_pipeline_unsupported_type() -> None:
    request = InferRequest(
        "simple_identity",
        [Tensor("INPUT0", Datatype.BYTES, (1, 1), b"\x01\x00\x00\x00a")],
        [RequestedOutput("OUTPUT0", {"classification": 1})],
    )
    with pytest.raises(InvalidRequest) as err:
        await Pipeline(_Recording(), 1 << 20).staged(request, [])
    assert (
        err.value.message == "class result not available for output due to unsupported type 'BYTES'"
    )


async def test_pipeline_stream_infer_classifies_each_response() -> None:
    pipeline = Pipeline(
        _Recording(), 1 << 20, models={"classifier": _Settings({"SCORES": _Out(LABELS)})}
    )
    got = [r async for r in pipeline.stream_infer(_classifier_request(1, batch=1), [])]
    assert [_strings(r.outputs[0]) for r in got] == [["19.125000:9:nine"]]


async def test_server_metadata_lists_classification() -> None:
    meta = await Pipeline(_Recording(), 1 << 20).server_metadata()
    assert "classification" in meta["extensions"]
