"""The gRPC codec (docs/protocol.md, endpoints: gRPC) as tables, both directions, with
tritonclient's own messages, encoder (``InferInput`` + ``_get_inference_request``) and decoder
(``InferResult.as_numpy``) as the reference for the wire format, plus a Hypothesis round trip.

tritonclient's ``service_pb2`` and v2proxy's ``grpc_service_pb2`` are different Python classes
for the same wire format: messages cross between them as serialized bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import _utils as triton_utils
from tritonclient.grpc import model_config_pb2 as triton_mc
from tritonclient.grpc import service_pb2 as triton_pb

from tests.unit.strategies import tensors
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.codecs import grpc as g
from v2proxy.codecs.dtypes import from_numpy
from v2proxy.core.errors import CodecError
from v2proxy.core.model import Datatype, InferRequest, InferResponse, RequestedOutput, Tensor

MODEL = "m"


def _lp(*elements: bytes) -> bytes:
    """BYTES elements in the 4-byte-length-prefixed wire layout, built by hand."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _cross(msg: Any, cls: Any) -> Any:
    """The same message read by the other side's class (they share the wire format only)."""
    return cls.FromString(msg.SerializeToString())


# --------------------------------------------------------------------------- typed contents

# (id, datatype, contents field, values, shape, expected bytes built with numpy)
CONTENTS: list[tuple[str, Datatype, str, list[Any], list[int], bytes]] = [
    (
        "bool",
        Datatype.BOOL,
        "bool_contents",
        [True, False, True, True],
        [2, 2],
        np.array([1, 0, 1, 1], "u1").tobytes(),
    ),
    # UINT8/UINT16 travel as uint32 each: the low bytes are kept
    (
        "uint8",
        Datatype.UINT8,
        "uint_contents",
        [0, 255, 256 + 7, 2**32 - 1],
        [4],
        np.array([0, 255, 7, 255], "u1").tobytes(),
    ),
    (
        "uint16",
        Datatype.UINT16,
        "uint_contents",
        [0, 65535, 65536 + 2],
        [3],
        np.array([0, 65535, 2], "<u2").tobytes(),
    ),
    (
        "uint32",
        Datatype.UINT32,
        "uint_contents",
        [0, 2**32 - 1, 123456789],
        [3],
        np.array([0, 2**32 - 1, 123456789], "<u4").tobytes(),
    ),
    (
        "uint64",
        Datatype.UINT64,
        "uint64_contents",
        [0, 2**64 - 1, 2**63],
        [3],
        np.array([0, 2**64 - 1, 2**63], "<u8").tobytes(),
    ),
    # INT8/INT16 travel as int32 each: the low bytes are kept (two's complement)
    (
        "int8",
        Datatype.INT8,
        "int_contents",
        [-128, 127, 300, -129, -1],
        [5],
        np.array([-128, 127, 44, 127, -1], "i1").tobytes(),
    ),
    (
        "int16",
        Datatype.INT16,
        "int_contents",
        [-32768, 32767, 70000, -1],
        [4],
        np.array([-32768, 32767, 4464, -1], "<i2").tobytes(),
    ),
    (
        "int32",
        Datatype.INT32,
        "int_contents",
        [-(2**31), 2**31 - 1, 0],
        [1, 3],
        np.array([-(2**31), 2**31 - 1, 0], "<i4").tobytes(),
    ),
    (
        "int64",
        Datatype.INT64,
        "int64_contents",
        [-(2**63), 2**63 - 1, 5],
        [3],
        np.array([-(2**63), 2**63 - 1, 5], "<i8").tobytes(),
    ),
    (
        "fp32",
        Datatype.FP32,
        "fp32_contents",
        [1.5, -0.0, float("inf"), 0.1, 3.4028234663852886e38],
        [5],
        np.array([1.5, -0.0, np.inf, 0.1, 3.4028234663852886e38], "<f4").tobytes(),
    ),
    (
        "fp64",
        Datatype.FP64,
        "fp64_contents",
        [0.1, -1e308, 5e-324, float("-inf")],
        [2, 2],
        np.array([0.1, -1e308, 5e-324, -np.inf], "<f8").tobytes(),
    ),
    (
        "bytes",
        Datatype.BYTES,
        "bytes_contents",
        [b"", b"a\x00b", b"\xff\xfe\x00", "é".encode(), b"\x00"],
        [5],
        _lp(b"", b"a\x00b", b"\xff\xfe\x00", b"\xc3\xa9", b"\x00"),
    ),
    ("empty", Datatype.INT32, "int_contents", [], [0, 3], b""),
]
CONTENTS_PARAMS = [pytest.param(*row[1:], id=row[0]) for row in CONTENTS]
CONTENTS_ARGS = ("datatype", "field", "values", "shape", "expected")


@pytest.mark.parametrize(CONTENTS_ARGS, CONTENTS_PARAMS)
def test_contents_to_bytes(
    datatype: Datatype, field: str, values: list[Any], shape: list[int], expected: bytes
) -> None:
    contents = pb.InferTensorContents(**{field: values})
    assert g.contents_to_bytes(contents, datatype, tuple(shape), "X") == expected


@pytest.mark.parametrize(CONTENTS_ARGS, CONTENTS_PARAMS)
def test_request_with_contents(
    datatype: Datatype, field: str, values: list[Any], shape: list[int], expected: bytes
) -> None:
    # built with tritonclient's message class: what a client puts on the wire
    msg = triton_pb.ModelInferRequest(model_name=MODEL)
    inp = msg.inputs.add(name="X", datatype=datatype.value, shape=shape)
    getattr(inp.contents, field).extend(values)
    req = g.request_from_proto(_cross(msg, pb.ModelInferRequest))
    (t,) = req.inputs
    assert (t.name, t.datatype, t.shape) == ("X", datatype, tuple(shape))
    assert bytes(t.data) == expected


@pytest.mark.parametrize(CONTENTS_ARGS, CONTENTS_PARAMS)
def test_response_with_contents(
    datatype: Datatype, field: str, values: list[Any], shape: list[int], expected: bytes
) -> None:
    msg = triton_pb.ModelInferResponse(model_name=MODEL)
    out = msg.outputs.add(name="Y", datatype=datatype.value, shape=shape)
    getattr(out.contents, field).extend(values)
    resp = g.response_from_proto(_cross(msg, pb.ModelInferResponse))
    (t,) = resp.outputs
    assert (t.name, t.datatype, t.shape) == ("Y", datatype, tuple(shape))
    assert bytes(t.data) == expected


def test_contents_nan_keeps_its_bits() -> None:
    contents = pb.InferTensorContents(fp32_contents=[float("nan")], fp64_contents=[])
    got = g.contents_to_bytes(contents, Datatype.FP32, (1,), "X")
    assert got == np.array([np.nan], "<f4").tobytes()


# --------------------------------------------------------------------------- raw slots


def _triton_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def _triton_request(inputs: list[grpcclient.InferInput], **kw: Any) -> Any:
    args: dict[str, Any] = {
        "model_name": MODEL,
        "inputs": inputs,
        "model_version": "",
        "request_id": "",
        "outputs": None,
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "parameters": None,
    }
    args.update(kw)
    return triton_utils._get_inference_request(**args)


def test_shm_input_takes_no_raw_slot_and_surplus_raw_is_refused() -> None:
    a = np.arange(4, dtype=np.int32)
    b = np.array([b"x\x00", b"\xff"], dtype=object)
    shm = grpcclient.InferInput("S", [4], "FP32")
    shm.set_shared_memory("region0", 16, offset=8)
    msg = _triton_request([_triton_input("A", a, "INT32"), shm, _triton_input("B", b, "BYTES")])
    assert len(msg.raw_input_contents) == 2  # the client itself gives shm inputs no slot
    req = g.request_from_proto(_cross(msg, pb.ModelInferRequest))
    assert [t.name for t in req.inputs] == ["A", "S", "B"]
    assert bytes(req.inputs[0].data) == a.tobytes()
    assert bytes(req.inputs[1].data) == b""
    assert req.inputs[1].parameters == {
        "shared_memory_region": "region0",
        "shared_memory_byte_size": 16,
        "shared_memory_offset": 8,
    }
    assert bytes(req.inputs[2].data) == _lp(b"x\x00", b"\xff")
    assert req.inputs[2].shape == (2,)
    # a raw entry no input takes is refused, not dropped
    msg.raw_input_contents.append(b"surplus")
    with pytest.raises(CodecError, match=r"expected 2 raw_input_contents .* but got 3"):
        g.request_from_proto(_cross(msg, pb.ModelInferRequest))


def test_raw_slots_follow_input_order() -> None:
    msg = pb.ModelInferRequest(model_name=MODEL, raw_input_contents=[b"\x01", b"\x02\x02"])
    msg.inputs.add(name="P", datatype="UINT8", shape=[1])
    msg.inputs.add(name="Q", datatype="UINT8", shape=[2])
    req = g.request_from_proto(msg)
    assert [bytes(t.data) for t in req.inputs] == [b"\x01", b"\x02\x02"]


def test_request_metadata_decoded() -> None:
    msg = pb.ModelInferRequest(model_name=MODEL, model_version="3", id="req-1")
    msg.parameters["sequence_id"].uint64_param = 2**64 - 1
    msg.outputs.add(name="O").parameters["classification"].int64_param = 2
    msg.outputs.add(name="P")
    req = g.request_from_proto(msg)
    assert (req.model_name, req.model_version, req.id) == (MODEL, "3", "req-1")
    assert req.parameters == {"sequence_id": 2**64 - 1}
    assert req.outputs == [
        RequestedOutput("O", {"classification": 2}),
        RequestedOutput("P", {}),
    ]
    assert req.inputs == []


def test_request_without_id_or_outputs() -> None:
    req = g.request_from_proto(pb.ModelInferRequest(model_name=MODEL))
    assert req.id is None
    assert req.outputs is None


# --------------------------------------------------------------------------- request errors


def _req(*inputs: dict[str, Any], raw: list[bytes] | None = None) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=MODEL, raw_input_contents=raw or [])
    for item in inputs:
        spec = dict(item)
        params = spec.pop("parameters", {})
        contents = spec.pop("contents", None)
        inp = msg.inputs.add(**spec)
        g.params_to_proto(params, inp.parameters)
        if contents is not None:
            inp.contents.SetInParent()  # present even when empty
            inp.contents.MergeFrom(pb.InferTensorContents(**contents))
    return msg


SHM = {"shared_memory_region": "r", "shared_memory_byte_size": 12}

# (id, message, substring of the error)
REQUEST_ERRORS: list[tuple[str, pb.ModelInferRequest, str]] = [
    (
        "contents-and-raw",
        _req(
            {"name": "X", "datatype": "INT32", "shape": [1], "contents": {"int_contents": [1]}},
            {"name": "Z", "datatype": "INT32", "shape": [1]},
            raw=[b"\x00" * 4],
        ),
        "contents field must not be specified when using raw_input_contents for 'X' for model 'm'",
    ),
    (
        "missing-data",
        _req(
            {"name": "A", "datatype": "INT32", "shape": [1]},
            {"name": "B", "datatype": "INT32", "shape": [1]},
            raw=[b"\x00" * 4],
        ),
        "unable to find data for input tensor 'B' for model 'm' in request.",
    ),
    (
        "missing-data-no-raw",
        _req({"name": "A", "datatype": "INT32", "shape": [1]}),
        "unable to find data for input tensor 'A' for model 'm' in request.",
    ),
    (
        "fp32-contents-for-int32",
        _req({"name": "X", "datatype": "INT32", "shape": [1], "contents": {"fp32_contents": [1]}}),
        "unexpected explicit tensor data for input tensor 'X' for model 'm' of type 'FP32',"
        " expected datatype 'INT32'",
    ),
    (
        "int-contents-for-fp32",
        _req({"name": "X", "datatype": "FP32", "shape": [1], "contents": {"int_contents": [1]}}),
        "unexpected explicit tensor data for input tensor 'X' for model 'm' of type 'INT32',"
        " expected datatype 'FP32'",
    ),
    (
        "int-contents-for-uint8",
        _req({"name": "X", "datatype": "UINT8", "shape": [1], "contents": {"int_contents": [1]}}),
        "of type 'INT32', expected datatype 'UINT8'",
    ),
    (
        "uint-contents-for-int8",
        _req({"name": "X", "datatype": "INT8", "shape": [1], "contents": {"uint_contents": [1]}}),
        "of type 'UINT32', expected datatype 'INT8'",
    ),
    (
        "int64-contents-for-uint64",
        _req(
            {"name": "X", "datatype": "UINT64", "shape": [1], "contents": {"int64_contents": [1]}}
        ),
        "of type 'INT64', expected datatype 'UINT64'",
    ),
    (
        "bytes-contents-for-bool",
        _req(
            {"name": "X", "datatype": "BOOL", "shape": [1], "contents": {"bytes_contents": [b"1"]}}
        ),
        "of type 'BYTES', expected datatype 'BOOL'",
    ),
    (
        # the right field plus a wrong one: the wrong one is named
        "right-and-wrong-field",
        _req(
            {
                "name": "X",
                "datatype": "INT32",
                "shape": [1],
                "contents": {"int_contents": [1], "fp32_contents": [1.0]},
            }
        ),
        "of type 'FP32', expected datatype 'INT32'",
    ),
    (
        "fp16-contents",
        _req({"name": "X", "datatype": "FP16", "shape": [1], "contents": {"fp32_contents": [1]}}),
        "unexpected explicit tensor data for input tensor 'X' for model 'm' of type 'FP32',"
        " expected datatype 'FP16' (FP16 data can only be sent in raw_input_contents)",
    ),
    (
        "bf16-contents",
        _req({"name": "X", "datatype": "BF16", "shape": [2], "contents": {"fp32_contents": [1]}}),
        "(BF16 data can only be sent in raw_input_contents)",
    ),
    (
        "too-few-elements",
        _req(
            {"name": "X", "datatype": "INT32", "shape": [3], "contents": {"int_contents": [1, 2]}}
        ),
        "unexpected number of elements in the contents of input tensor 'X' for model 'm':"
        " expected 3, got 2",
    ),
    (
        "too-many-bytes-elements",
        _req(
            {
                "name": "X",
                "datatype": "BYTES",
                "shape": [1],
                "contents": {"bytes_contents": [b"a", b"b"]},
            }
        ),
        "expected 1, got 2",
    ),
    (
        "shm-and-contents",
        _req(
            {
                "name": "X",
                "datatype": "INT32",
                "shape": [3],
                "parameters": SHM,
                "contents": {"int_contents": [1, 2, 3]},
            }
        ),
        "unexpected 'content' provided when using shared memory for input tensor 'X' for model 'm'",
    ),
    (
        "unknown-datatype",
        _req({"name": "X", "datatype": "FP8", "shape": [1]}, raw=[b"\x00"]),
        "invalid datatype 'FP8' for input tensor 'X' for model 'm'",
    ),
    (
        "lowercase-datatype",
        _req({"name": "X", "datatype": "int32", "shape": [1]}, raw=[b"\x00" * 4]),
        "invalid datatype 'int32'",
    ),
    (
        "negative-dim",
        _req({"name": "X", "datatype": "INT32", "shape": [-1, 2]}, raw=[b"\x00" * 8]),
        "invalid shape [-1, 2] for input tensor 'X' for model 'm': dimensions must be >= 0",
    ),
]


@pytest.mark.parametrize(
    ("msg", "message"), [pytest.param(m, s, id=i) for i, m, s in REQUEST_ERRORS]
)
def test_request_errors(msg: pb.ModelInferRequest, message: str) -> None:
    wire = pb.ModelInferRequest.FromString(msg.SerializeToString())
    with pytest.raises(CodecError) as info:
        g.request_from_proto(wire)
    assert message in str(info.value)
    assert info.value.grpc_code == "INVALID_ARGUMENT"


def test_shm_input_with_raw_entries_is_not_a_contents_error() -> None:
    # shm params come first: raw entries meant for other inputs do not matter to it
    msg = _req(
        {"name": "S", "datatype": "INT32", "shape": [3], "parameters": SHM},
        {"name": "R", "datatype": "INT32", "shape": [1]},
        raw=[b"\x07\x00\x00\x00"],
    )
    req = g.request_from_proto(msg)
    assert [bytes(t.data) for t in req.inputs] == [b"", b"\x07\x00\x00\x00"]


@pytest.mark.parametrize("datatype", [Datatype.INT32, Datatype.FP16, Datatype.BYTES])
def test_contents_without_any_field_hold_zero_elements(datatype: Datatype) -> None:
    empty = pb.InferTensorContents()
    assert g.contents_to_bytes(empty, datatype, (2, 0), "X") == b""
    with pytest.raises(CodecError, match="contents of X: expected 1, got 0"):
        g.contents_to_bytes(empty, datatype, (1,), "X")


def test_empty_contents_without_raw_is_an_empty_tensor() -> None:
    # Triton: present contents are the data, even with no element in them
    msg = _req({"name": "E", "datatype": "FP16", "shape": [0], "contents": {}})
    assert bytes(g.request_from_proto(msg).inputs[0].data) == b""
    msg = _req({"name": "E", "datatype": "INT32", "shape": [2], "contents": {}})
    with pytest.raises(CodecError, match="input tensor 'E' for model 'm': expected 2, got 0"):
        g.request_from_proto(msg)


def test_empty_contents_beside_raw_is_raw() -> None:
    # MLServer's client sends an empty ``contents`` with every raw input
    msg = _req(
        {"name": "A", "datatype": "INT32", "shape": [1], "contents": {}},
        {"name": "B", "datatype": "UINT8", "shape": [2], "contents": {}},
        raw=[b"\x01\x00\x00\x00", b"\x02\x03"],
    )
    req = g.request_from_proto(msg)
    assert [bytes(t.data) for t in req.inputs] == [b"\x01\x00\x00\x00", b"\x02\x03"]


# --------------------------------------------------------------------------- parameters

# (id, value, the oneof field it travels in)
PARAMS: list[tuple[str, Any, str]] = [
    ("int", 5, "int64_param"),
    ("int-zero", 0, "int64_param"),
    ("int64-min", -(2**63), "int64_param"),
    ("int64-max", 2**63 - 1, "int64_param"),
    ("uint64-low", 2**63, "uint64_param"),
    ("uint64-max", 2**64 - 1, "uint64_param"),
    ("true", True, "bool_param"),
    ("false", False, "bool_param"),
    ("string", "héllo\x00", "string_param"),
    ("empty-string", "", "string_param"),
    ("double", 1.5, "double_param"),
    ("double-negative-zero", -0.0, "double_param"),
    ("double-big", 1e308, "double_param"),
]


@pytest.mark.parametrize(("value", "field"), [pytest.param(v, f, id=i) for i, v, f in PARAMS])
def test_params_both_ways(value: Any, field: str) -> None:
    msg = pb.ModelInferRequest()
    g.params_to_proto({"k": value}, msg.parameters)
    wire = _cross(msg, triton_pb.ModelInferRequest)
    assert wire.parameters["k"].WhichOneof("parameter_choice") == field
    assert getattr(wire.parameters["k"], field) == value
    back = g.params_from_proto(_cross(wire, pb.ModelInferRequest).parameters)
    assert back == {"k": value}
    assert type(back["k"]) is type(value)
    if isinstance(value, float):
        assert struct.pack("<d", back["k"]) == struct.pack("<d", value)


@pytest.mark.parametrize(
    "value",
    [None, [1], {"a": 1}, b"x", np.int64(1), np.float32(1.0), (1,)],
    ids=["none", "list", "dict", "bytes", "np-int64", "np-float32", "tuple"],
)
def test_params_unsupported_type(value: Any) -> None:
    msg = pb.ModelInferRequest()
    with pytest.raises(CodecError) as info:
        g.params_to_proto({"bad": value}, msg.parameters)
    assert (
        "parameter 'bad' has invalid type. It should be either 'int', 'bool', 'double', or"
        " 'string'." in str(info.value)
    )


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**30], ids=["2^64", "-2^63-1", "1e30"])
def test_params_out_of_range(value: int) -> None:
    msg = pb.ModelInferRequest()
    with pytest.raises(CodecError, match="parameter 'big' is out of the range of int64 and uint64"):
        g.params_to_proto({"big": value}, msg.parameters)


def test_params_from_proto_unset_is_none() -> None:
    msg = pb.ModelInferRequest()
    msg.parameters["empty"].SetInParent()
    assert g.params_from_proto(msg.parameters) == {"empty": None}


# --------------------------------------------------------------------------- request_to_proto


def _request_for_backend() -> InferRequest:
    a = np.arange(6, dtype="<i4").reshape(2, 3)
    return InferRequest(
        model_name=MODEL,
        model_version="2",
        id="abc",
        parameters={
            "binary_data_output": True,
            "sequence_id": 7,
            "sequence_start": True,
            "custom": "x",
            "big": 2**63 + 1,
            "ratio": 0.25,
        },
        inputs=[
            Tensor("A", Datatype.INT32, (2, 3), memoryview(a.tobytes()), {"binary_data_size": 24}),
            Tensor(
                "S",
                Datatype.FP32,
                (4,),
                b"",
                {"shared_memory_region": "r", "shared_memory_byte_size": 16},
            ),
            Tensor(
                "B",
                Datatype.BYTES,
                (2,),
                _lp(b"\x00", b"\xff\xfe"),
                {"binary_data": True, "keep": 1},
            ),
        ],
        outputs=[
            RequestedOutput("O", {"binary_data": True, "classification": 3}),
            RequestedOutput("P", {"binary_data": False, "binary_data_size": 4}),
        ],
    )


def test_request_to_proto_parsed_by_tritonclient() -> None:
    msg = g.request_to_proto(_request_for_backend())
    wire = triton_pb.ModelInferRequest.FromString(msg.SerializeToString())
    assert (wire.model_name, wire.model_version, wire.id) == (MODEL, "2", "abc")
    assert list(wire.raw_input_contents) == [
        np.arange(6, dtype="<i4").tobytes(),
        _lp(b"\x00", b"\xff\xfe"),
    ]
    assert {k: v.WhichOneof("parameter_choice") for k, v in wire.parameters.items()} == {
        "sequence_id": "int64_param",
        "sequence_start": "bool_param",
        "custom": "string_param",
        "big": "uint64_param",
        "ratio": "double_param",
    }
    assert wire.parameters["big"].uint64_param == 2**63 + 1
    assert [(i.name, i.datatype, list(i.shape)) for i in wire.inputs] == [
        ("A", "INT32", [2, 3]),
        ("S", "FP32", [4]),
        ("B", "BYTES", [2]),
    ]
    assert all(not i.HasField("contents") for i in wire.inputs)
    assert dict(wire.inputs[0].parameters) == {}
    assert wire.inputs[1].parameters["shared_memory_region"].string_param == "r"
    assert wire.inputs[1].parameters["shared_memory_byte_size"].int64_param == 16
    assert list(wire.inputs[2].parameters) == ["keep"]
    assert [o.name for o in wire.outputs] == ["O", "P"]
    assert list(wire.outputs[0].parameters) == ["classification"]
    assert wire.outputs[0].parameters["classification"].int64_param == 3
    assert dict(wire.outputs[1].parameters) == {}


def test_request_to_proto_matches_tritonclient_encoder() -> None:
    # The same request built by tritonclient's own encoder is the same message.
    a = np.array([[1.5, -2.0]], dtype=np.float32)
    h = np.array([1, -1, 2], dtype=np.float16)
    bf = np.array([1.0, -3.5], dtype=ml_dtypes.bfloat16)
    s = np.array([b"ab\x00", b"", b"\xff"], dtype=object)
    ti = [
        _triton_input("A", a, "FP32"),
        _triton_input("H", h, "FP16"),
        _triton_input("BF", bf, "BF16"),
        _triton_input("S", s, "BYTES"),
    ]
    outputs = [grpcclient.InferRequestedOutput("O", class_count=2)]
    want = _triton_request(
        ti,
        model_version="1",
        request_id="r1",
        outputs=outputs,
        sequence_id=5,
        sequence_start=True,
        parameters={"custom": "v", "n": 3},
    )
    ours = InferRequest(
        model_name=MODEL,
        model_version="1",
        id="r1",
        parameters={
            "sequence_id": 5,
            "sequence_start": True,
            "sequence_end": False,
            "custom": "v",
            "n": 3,
        },
        inputs=[
            from_numpy("A", Datatype.FP32, a),
            from_numpy("H", Datatype.FP16, h),
            from_numpy("BF", Datatype.BF16, bf),
            from_numpy("S", Datatype.BYTES, s),
        ],
        outputs=[RequestedOutput("O", {"classification": 2})],
    )
    got = triton_pb.ModelInferRequest.FromString(g.request_to_proto(ours).SerializeToString())
    assert got == want
    # and tritonclient's request decodes to ours
    back = g.request_from_proto(_cross(want, pb.ModelInferRequest))
    assert [(t.name, t.datatype, t.shape, bytes(t.data)) for t in back.inputs] == [
        (t.name, t.datatype, t.shape, bytes(t.data)) for t in ours.inputs
    ]
    assert back.parameters == ours.parameters


# --------------------------------------------------------------------------- response_to_proto

# (datatype, array) for every datatype; BF16 via ml_dtypes
ARRAYS: list[tuple[Datatype, np.ndarray]] = [
    (Datatype.BOOL, np.array([[True, False], [False, True]])),
    (Datatype.UINT8, np.array([0, 1, 255], dtype=np.uint8)),
    (Datatype.UINT16, np.array([0, 65535], dtype=np.uint16)),
    (Datatype.UINT32, np.array([2**32 - 1, 7], dtype=np.uint32)),
    (Datatype.UINT64, np.array([2**64 - 1, 2**63], dtype=np.uint64)),
    (Datatype.INT8, np.array([-128, 127], dtype=np.int8)),
    (Datatype.INT16, np.array([-32768, 32767], dtype=np.int16)),
    (Datatype.INT32, np.arange(-3, 3, dtype=np.int32).reshape(2, 3)),
    (Datatype.INT64, np.array([-(2**63), 2**63 - 1], dtype=np.int64)),
    (Datatype.FP16, np.array([1.5, -np.inf, np.nan, 65504], dtype=np.float16)),
    (Datatype.FP32, np.array([[0.1, -0.0], [np.nan, 3e38]], dtype=np.float32)),
    (Datatype.FP64, np.array([5e-324, -1e308, np.inf], dtype=np.float64)),
    (Datatype.BF16, np.array([1.0, -2.5, 3.0e38, np.nan], dtype=ml_dtypes.bfloat16)),
    (Datatype.BYTES, np.array([[b"", b"a\x00"], [b"\xff\xfe", "é".encode()]], dtype=object)),
    (Datatype.FP32, np.zeros((0, 4), dtype=np.float32)),
]


def _assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.dtype == object
        assert got.tolist() == want.tolist()
    else:
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


def test_response_to_proto_read_by_tritonclient() -> None:
    outputs = [from_numpy(f"OUT{i}", dt, arr) for i, (dt, arr) in enumerate(ARRAYS)]
    outputs.append(Tensor("SHM", Datatype.FP32, (4,), b"", {"shared_memory_region": "r"}))
    resp = InferResponse(
        model_name=MODEL,
        model_version="1",
        id=None,
        parameters={"triton_final_response": True, "n": 2**64 - 1},
        outputs=outputs,
    )
    msg = g.response_to_proto(resp)
    wire = triton_pb.ModelInferResponse.FromString(msg.SerializeToString())
    assert wire.id == ""
    assert wire.model_version == "1"
    assert wire.parameters["triton_final_response"].bool_param is True
    assert wire.parameters["n"].uint64_param == 2**64 - 1
    assert len(wire.raw_output_contents) == len(wire.outputs) == len(outputs)
    assert all(not o.HasField("contents") for o in wire.outputs)
    assert all(not o.parameters for o in wire.outputs)  # output parameters are not echoed
    assert wire.raw_output_contents[-1] == b""
    result = grpcclient.InferResult(wire)
    for i, (dt, arr) in enumerate(ARRAYS):
        assert wire.outputs[i].datatype == dt.value
        _assert_same_array(result.as_numpy(f"OUT{i}"), arr)


def test_response_to_proto_keeps_id() -> None:
    msg = g.response_to_proto(InferResponse(model_name=MODEL, outputs=[], id="x"))
    assert msg.id == "x"
    assert msg.model_version == ""


# --------------------------------------------------------------------------- response_from_proto


def _triton_response(raw: list[bytes]) -> Any:
    msg = triton_pb.ModelInferResponse(model_name=MODEL, model_version="1", id="i")
    msg.raw_output_contents.extend(raw)
    return msg


def test_response_from_proto_index_aligned_raw() -> None:
    msg = _triton_response([b"\x01\x00", b"", _lp(b"z")])
    msg.outputs.add(name="A", datatype="INT16", shape=[1])
    msg.outputs.add(name="S", datatype="FP32", shape=[2])  # shm output: empty entry
    msg.outputs.add(name="B", datatype="BYTES", shape=[1])
    resp = g.response_from_proto(_cross(msg, pb.ModelInferResponse))
    assert (resp.model_name, resp.model_version, resp.id) == (MODEL, "1", "i")
    assert [(t.name, t.datatype, t.shape, bytes(t.data)) for t in resp.outputs] == [
        ("A", Datatype.INT16, (1,), b"\x01\x00"),
        ("S", Datatype.FP32, (2,), b""),
        ("B", Datatype.BYTES, (1,), _lp(b"z")),
    ]


def test_response_from_proto_mixed_contents_and_raw() -> None:
    # KServe 0.21: outputs it holds as lists go in typed contents, numpy outputs go raw
    f = np.array([1.5, -2.0], dtype="<f4")
    h = np.array([0.5], dtype="<f2")
    msg = _triton_response([f.tobytes(), h.tobytes()])
    a = msg.outputs.add(name="A", datatype="INT32", shape=[3])
    a.contents.int_contents.extend([1, -2, 3])
    a.parameters["custom"].string_param = "kept"
    b = msg.outputs.add(name="B", datatype="FP32", shape=[2])
    b.parameters["binary_data_size"].int64_param = 8
    c = msg.outputs.add(name="C", datatype="BYTES", shape=[2])
    c.contents.bytes_contents.extend([b"x\x00", b"\xff"])
    d = msg.outputs.add(name="D", datatype="FP16", shape=[1])
    d.parameters["binary_data_size"].int64_param = 2
    resp = g.response_from_proto(_cross(msg, pb.ModelInferResponse))
    assert [(t.name, t.shape, bytes(t.data)) for t in resp.outputs] == [
        ("A", (3,), np.array([1, -2, 3], "<i4").tobytes()),
        ("B", (2,), f.tobytes()),
        ("C", (2,), _lp(b"x\x00", b"\xff")),
        ("D", (1,), h.tobytes()),
    ]
    assert [t.parameters for t in resp.outputs] == [{"custom": "kept"}, {}, {}, {}]


def test_response_from_proto_aligned_raw_with_a_placeholder_for_contents() -> None:
    # one raw entry per output: entry i belongs to output i, even when output i has contents
    msg = _triton_response([b"", b"\x08"])
    msg.outputs.add(name="A", datatype="INT32", shape=[1]).contents.int_contents.append(3)
    msg.outputs.add(name="B", datatype="UINT8", shape=[1])
    resp = g.response_from_proto(_cross(msg, pb.ModelInferResponse))
    assert [bytes(t.data) for t in resp.outputs] == [b"\x03\x00\x00\x00", b"\x08"]


def test_response_from_proto_contents_only() -> None:
    msg = _triton_response([])
    msg.outputs.add(name="A", datatype="UINT8", shape=[2]).contents.uint_contents.extend([1, 2])
    msg.outputs.add(name="B", datatype="BOOL", shape=[1]).contents.bool_contents.append(True)
    resp = g.response_from_proto(_cross(msg, pb.ModelInferResponse))
    assert [bytes(t.data) for t in resp.outputs] == [b"\x01\x02", b"\x01"]


def test_response_from_proto_empty_contents_with_aligned_raw() -> None:
    # MLServer with raw outputs also sets an empty ``contents`` on every output
    msg = _triton_response([b"\x05\x00\x00\x00"])
    out = msg.outputs.add(name="A", datatype="INT32", shape=[1])
    out.contents.SetInParent()
    resp = g.response_from_proto(_cross(msg, pb.ModelInferResponse))
    assert bytes(resp.outputs[0].data) == b"\x05\x00\x00\x00"


def test_response_from_proto_mix_with_an_empty_contents_output() -> None:
    # KServe puts an empty list output in (empty) contents, numpy outputs raw
    msg = _triton_response([b"\x09"])
    msg.outputs.add(name="E", datatype="FP32", shape=[0]).contents.SetInParent()
    msg.outputs.add(name="R", datatype="UINT8", shape=[1])
    resp = g.response_from_proto(_cross(msg, pb.ModelInferResponse))
    assert [(t.name, bytes(t.data)) for t in resp.outputs] == [("E", b""), ("R", b"\x09")]


def test_response_from_proto_strips_binary_data_size_and_keeps_response_params() -> None:
    msg = _triton_response([b"\x00"])
    out = msg.outputs.add(name="A", datatype="UINT8", shape=[1])
    out.parameters["binary_data_size"].int64_param = 1
    out.parameters["binary_data"].bool_param = True
    out.parameters["classification"].int64_param = 1
    msg.parameters["triton_final_response"].bool_param = False
    resp = g.response_from_proto(_cross(msg, pb.ModelInferResponse))
    assert resp.outputs[0].parameters == {"classification": 1}
    assert resp.parameters == {"triton_final_response": False}


def test_response_from_proto_no_id() -> None:
    resp = g.response_from_proto(pb.ModelInferResponse(model_name=MODEL))
    assert resp.id is None
    assert resp.outputs == []


# (id, outputs as (name, datatype, shape, int_contents or None), raw entries, error substring)
RESPONSE_ERRORS: list[tuple[str, list[tuple[str, str, list[int], list[int] | None]], int, str]] = [
    (
        "too-few-raw",
        [("A", "UINT8", [1], None), ("B", "UINT8", [1], None)],
        1,
        "no data for output 'B' of the backend's response",
    ),
    (
        "too-few-raw-in-a-mix",
        [("A", "INT32", [1], [1]), ("B", "UINT8", [1], None), ("C", "UINT8", [1], None)],
        1,
        "no data for output 'C' of the backend's response",
    ),
    (
        "no-raw-at-all",
        [("A", "UINT8", [1], None)],
        0,
        "no data for output 'A'",
    ),
    (
        "unknown-datatype",
        [("A", "STRING", [1], None)],
        1,
        "invalid datatype 'STRING' for output 'A' of the backend's response",
    ),
    (
        "negative-dim",
        [("A", "UINT8", [-1], None)],
        1,
        "invalid shape [-1] for output 'A' of the backend's response",
    ),
    (
        "contents-count",
        [("A", "INT32", [2], [1])],
        0,
        "expected 2, got 1",
    ),
    (
        "contents-type",
        [("A", "FP32", [1], [1])],
        0,
        "unexpected explicit tensor data for output 'A' of the backend's response of type"
        " 'INT32', expected datatype 'FP32'",
    ),
]


@pytest.mark.parametrize(
    ("outputs", "n_raw", "message"),
    [pytest.param(o, n, s, id=i) for i, o, n, s in RESPONSE_ERRORS],
)
def test_response_from_proto_errors(
    outputs: list[tuple[str, str, list[int], list[int] | None]], n_raw: int, message: str
) -> None:
    msg = pb.ModelInferResponse(model_name=MODEL, raw_output_contents=[b"\x00"] * n_raw)
    for name, datatype, shape, ints in outputs:
        out = msg.outputs.add(name=name, datatype=datatype, shape=shape)
        if ints is not None:
            out.contents.int_contents.extend(ints)
    with pytest.raises(CodecError) as info:
        g.response_from_proto(msg)
    assert message in str(info.value)


# --------------------------------------------------------------------------- REST-side dicts


def test_message_to_dict_statistics_integers_stay_numbers() -> None:
    msg = pb.ModelStatistics(
        name="simple",
        version="1",
        last_inference=2**63 + 5,
        inference_count=2**64 - 1,
        inference_stats=pb.InferStatistics(success=pb.StatisticDuration(count=3, ns=2**40)),
        batch_stats=[pb.InferBatchStatistics(batch_size=1)],
        memory_usage=[pb.MemoryUsage(type="CPU", id=-1, byte_size=2**33)],
    )
    msg.response_stats["key"].success.count = 9
    got = g.message_to_dict(msg)
    assert got == {
        "name": "simple",
        "version": "1",
        "last_inference": 2**63 + 5,
        "inference_count": 2**64 - 1,
        "inference_stats": {"success": {"count": 3, "ns": 2**40}},
        "batch_stats": [{"batch_size": 1}],
        "memory_usage": [{"type": "CPU", "id": -1, "byte_size": 2**33}],
        "response_stats": {"key": {"success": {"count": 9}}},
    }
    assert type(got["inference_count"]) is int
    assert type(got["memory_usage"][0]["id"]) is int


def test_message_to_dict_model_config() -> None:
    config = pb.ModelConfig(
        name="simple",
        platform="onnxruntime_onnx",
        max_batch_size=8,
        input=[
            pb.ModelInput(
                name="INPUT0",
                data_type=pb.TYPE_INT32,
                format=pb.ModelInput.FORMAT_NCHW,
                dims=[-1, 16],
                optional=True,
            )
        ],
        output=[pb.ModelOutput(name="OUTPUT0", data_type=pb.TYPE_STRING, dims=[16])],
        model_transaction_policy=pb.ModelTransactionPolicy(decoupled=True),
    )
    config.parameters["k"].string_value = "v"
    # a config from Triton's own classes (with fields we do not define) reads the same way
    wire = _cross(config, triton_mc.ModelConfig)
    wire.version_policy.latest.num_versions = 1
    ours = _cross(wire, pb.ModelConfig)
    assert g.message_to_dict(ours) == {
        "name": "simple",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 8,
        "input": [
            {
                "name": "INPUT0",
                "data_type": "TYPE_INT32",
                "format": "FORMAT_NCHW",
                "dims": [-1, 16],
                "optional": True,
            }
        ],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [16]}],
        "parameters": {"k": {"string_value": "v"}},
        "model_transaction_policy": {"decoupled": True},
    }
    # unknown fields survive a pass through our classes
    again = triton_mc.ModelConfig.FromString(ours.SerializeToString())
    assert again.version_policy.latest.num_versions == 1


def test_message_to_dict_enum_numbers() -> None:
    # 14 is known; 99 (a type of a newer server) is kept as its number, as protobuf's JSON does
    wire = triton_mc.ModelConfig(
        input=[
            triton_mc.ModelInput(name="X", data_type=14),
            triton_mc.ModelInput(name="Y", data_type=99, format=7),
        ]
    )
    ours = _cross(wire, pb.ModelConfig)
    assert g.message_to_dict(ours) == {
        "input": [
            {"name": "X", "data_type": "TYPE_BF16"},
            {"name": "Y", "data_type": 99, "format": 7},
        ]
    }


def test_dict_to_message_round_trip_and_unknown_fields() -> None:
    obj = {
        "name": "simple",
        "max_batch_size": 8,
        "input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [3], "extra": 1}],
        "parameters": {"k": {"string_value": "v"}},
        "dynamic_batching": {"preferred_batch_size": [4]},
        "version_policy": {"latest": {"num_versions": 1}},
    }
    msg = pb.ModelConfig()
    g.dict_to_message(obj, msg, "model config")
    assert g.message_to_dict(msg) == {
        "name": "simple",
        "max_batch_size": 8,
        "input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [3]}],
        "parameters": {"k": {"string_value": "v"}},
    }


@pytest.mark.parametrize(
    "obj",
    [
        {"name": 5},
        {"max_batch_size": "eight"},
        {"max_batch_size": 1.5},
        {"max_batch_size": True},
        {"max_batch_size": 2**40},
        {"input": {"name": "x"}},
        {"input": [5]},
        {"input": [{"dims": ["a"]}]},
        {"parameters": []},
        {"model_transaction_policy": {"decoupled": "yes"}},
        None,
        5,
    ],
    ids=[
        "string-field-int",
        "int-field-string",
        "int-field-float",
        "int-field-bool",
        "int32-overflow",
        "repeated-as-object",
        "repeated-message-as-int",
        "repeated-int-as-string",
        "map-as-list",
        "bool-as-string",
        "none",
        "int",
    ],
)
def test_dict_to_message_wrong_types(obj: Any) -> None:
    with pytest.raises(CodecError, match="cannot convert the model config to gRPC: "):
        g.dict_to_message(obj, pb.ModelConfig(), "model config")


def test_model_metadata_to_proto_kserve_and_missing_platform() -> None:
    # KServe answers "versions": null and may leave out "platform"
    meta = {
        "name": "sklearn",
        "versions": None,
        "inputs": [{"name": "in", "datatype": "FP32", "shape": [-1, 4]}, "junk"],
        "outputs": [{"name": "out", "datatype": "INT64", "shape": [-1], "parameters": {}}],
    }
    msg = g.model_metadata_to_proto(meta)
    wire = triton_pb.ModelMetadataResponse.FromString(msg.SerializeToString())
    assert wire.name == "sklearn"
    assert list(wire.versions) == []
    assert wire.platform == ""
    assert [(t.name, t.datatype, list(t.shape)) for t in wire.inputs] == [("in", "FP32", [-1, 4])]
    assert [(t.name, t.datatype, list(t.shape)) for t in wire.outputs] == [("out", "INT64", [-1])]


def test_model_metadata_to_proto_triton() -> None:
    meta = {
        "name": "simple",
        "versions": ["1", 2],
        "platform": "ensemble",
        "inputs": [{"name": "I", "datatype": "BYTES", "shape": [1]}],
        "outputs": None,
    }
    msg = g.model_metadata_to_proto(meta)
    assert list(msg.versions) == ["1", "2"]
    assert msg.platform == "ensemble"
    assert len(msg.outputs) == 0


def test_model_metadata_to_proto_bad_shape() -> None:
    meta = {"name": "x", "inputs": [{"name": "I", "datatype": "FP32", "shape": ["a"]}]}
    with pytest.raises(CodecError, match="cannot convert the model metadata to gRPC"):
        g.model_metadata_to_proto(meta)


@pytest.mark.parametrize(
    ("meta", "extensions"),
    [
        ({"name": "triton", "version": "2.50", "extensions": ["a", "b"]}, ["a", "b"]),
        ({"name": "kserve", "version": "0.21", "extensions": ["a", 5, None, {"x": 1}]}, ["a"]),
        ({"name": "mindie", "version": "1", "extensions": {"x": True}}, []),
        ({"name": "mlserver", "version": "1.6", "extensions": None}, []),
        ({"name": "bare"}, []),
    ],
    ids=["triton", "non-strings-dropped", "object", "null", "missing"],
)
def test_server_metadata_to_proto(meta: dict[str, Any], extensions: list[str]) -> None:
    msg = g.server_metadata_to_proto(meta)
    wire = triton_pb.ServerMetadataResponse.FromString(msg.SerializeToString())
    assert wire.name == meta["name"]
    assert wire.version == meta.get("version", "")
    assert list(wire.extensions) == extensions


def test_server_metadata_to_proto_non_string_version() -> None:
    msg = g.server_metadata_to_proto({"name": "x", "version": 2})
    assert msg.version == "2"


# --------------------------------------------------------------------------- Hypothesis


@st.composite
def any_tensor(draw: st.DrawFn, name: str) -> Tensor:
    datatype = draw(st.sampled_from(list(Datatype)))
    return draw(tensors(datatype, json_safe=False, name=name))


@st.composite
def requests(draw: st.DrawFn) -> InferRequest:
    n = draw(st.integers(0, 4))
    return InferRequest(
        model_name=draw(st.text(max_size=5)),
        model_version=draw(st.sampled_from(["", "1"])),
        id=draw(st.sampled_from([None, "id"])),
        inputs=[draw(any_tensor(f"IN{i}")) for i in range(n)],
    )


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_request_round_trip(req: InferRequest) -> None:
    wire = g.request_to_proto(req).SerializeToString()
    back = g.request_from_proto(pb.ModelInferRequest.FromString(wire))
    assert (back.model_name, back.model_version, back.id) == (
        req.model_name,
        req.model_version,
        req.id,
    )
    assert [(t.name, t.datatype, t.shape, bytes(t.data)) for t in back.inputs] == [
        (t.name, t.datatype, t.shape, bytes(t.data)) for t in req.inputs
    ]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_tensor("OUT"), max_size=4))
def test_response_round_trip(outputs: list[Tensor]) -> None:
    resp = InferResponse(model_name="m", outputs=outputs, id="x")
    wire = g.response_to_proto(resp).SerializeToString()
    back = g.response_from_proto(pb.ModelInferResponse.FromString(wire))
    assert back.id == "x"
    assert [(t.datatype, t.shape, bytes(t.data)) for t in back.outputs] == [
        (t.datatype, t.shape, bytes(t.data)) for t in outputs
    ]


def _views(tensors: list[Tensor]) -> list[Tensor]:
    """The same tensors, their data as typed memoryviews (as binary bodies give them)."""
    out = []
    for t in tensors:
        data = memoryview(bytes(t.data))
        if len(data) % 4 == 0 and data:
            data = data.cast("f")
        out.append(Tensor(t.name, t.datatype, t.shape, data, t.parameters))
    return out


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.booleans())
def test_request_bytes_are_what_protobuf_writes(req: InferRequest, views: bool) -> None:
    """The request serialized with its inputs' bytes appended by hand is byte for byte what
    protobuf writes for the whole message (shared-memory inputs carry no contents)."""
    if views:
        req.inputs = _views(req.inputs)
    if req.inputs and len(req.inputs) > 1:
        shm = req.inputs[0]
        shm.parameters = {"shared_memory_region": "r", "shared_memory_byte_size": 4}
    req.outputs = [RequestedOutput("OUT0", {"binary_data": True}), RequestedOutput("OUT1")]
    req.parameters = {"priority": 2, "binary_data_output": True}
    assert g.request_bytes(req) == g.request_to_proto(req).SerializeToString()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_tensor("OUT"), max_size=4), st.booleans())
def test_response_bytes_are_what_protobuf_writes(outputs: list[Tensor], views: bool) -> None:
    resp = InferResponse(
        model_name="m", model_version="2", outputs=_views(outputs) if views else outputs, id="x"
    )
    resp.parameters = {"sequence_end": True}
    wire = g.response_bytes(resp)
    assert wire == g.response_to_proto(resp).SerializeToString()
    back = g.response_from_bytes(wire)
    assert [bytes(t.data) for t in back.outputs] == [bytes(t.data) for t in outputs]


def test_a_large_tensor_is_appended_with_a_multi_byte_length() -> None:
    data = bytes(range(256)) * 1024  # 256 KiB: a three-byte length varint
    resp = InferResponse(model_name="m", outputs=[Tensor("O", Datatype.UINT8, (len(data),), data)])
    wire = g.response_bytes(resp)
    assert wire == g.response_to_proto(resp).SerializeToString()
    assert g.response_from_bytes(wire).outputs[0].data == data


def test_response_from_bytes_refuses_what_is_no_answer() -> None:
    with pytest.raises(CodecError, match="malformed ModelInferResponse"):
        g.response_from_bytes(b"\x0a\xff")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_tensor("OUT"), max_size=4), st.booleans())
def test_stream_response_bytes_are_what_protobuf_writes(
    outputs: list[Tensor], with_id: bool
) -> None:
    """A relayed answer wrapped by hand into a ModelStreamInferResponse is byte for byte what
    protobuf writes for the same message, and parses back to the answer."""
    resp = InferResponse(model_name="m", outputs=outputs, id="x" if with_id else None)
    answer = g.response_bytes(resp)
    wrapped = g.stream_response_bytes(answer)
    message = pb.ModelStreamInferResponse(infer_response=g.response_to_proto(resp))
    assert wrapped == message.SerializeToString()
    assert pb.ModelStreamInferResponse.FromString(wrapped).infer_response.SerializeToString() == (
        answer
    )


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16383, 16384, 1 << 21])
def test_stream_response_bytes_at_every_length_varint(size: int) -> None:
    """Lengths of one to four varint bytes (an empty answer too): protobuf's own bytes."""
    answer = pb.ModelInferResponse(model_name="m" * size).SerializeToString() if size else b""
    message = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse.FromString(answer))
    assert g.stream_response_bytes(answer) == message.SerializeToString()
