"""The JSON codec (docs/protocol.md, JSON bodies), as tables run in both directions.

JSON ``data`` -> wire bytes is checked byte for byte against numpy (explicit little-endian dtypes,
``ml_dtypes.bfloat16``); wire bytes -> JSON is checked against the exact text Triton writes.
Every bad input must raise a CodecError (or PayloadTooLarge) whose message names the field.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest

from v2proxy.backends.rest_requests import infer_body
from v2proxy.codecs import binary as binc
from v2proxy.codecs.dtypes import NUMPY_DTYPE, as_numpy, from_numpy
from v2proxy.codecs.json import is_object, loads
from v2proxy.codecs.json_data import data_to_buffer, tensor_data_json
from v2proxy.codecs.json_v2 import dumps_tree, request_to_obj, response_to_obj
from v2proxy.core.errors import CodecError, InvalidText, PayloadTooLarge, ProxyError
from v2proxy.core.model import Datatype, InferRequest, InferResponse, RequestedOutput, Tensor

NP_DTYPE: dict[str, Any] = {
    "BOOL": "?",
    "UINT8": "u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
    "BF16": ml_dtypes.bfloat16,
}

# Four JSON values per datatype, chosen at the edges of each type.
VALUES: dict[str, list[Any]] = {
    "BOOL": [True, False, False, True],
    "UINT8": [0, 1, 127, 255],
    "UINT16": [0, 1, 256, 65535],
    "UINT32": [0, 1, 65536, 2**32 - 1],
    "UINT64": [0, 1, 2**63, 2**64 - 1],
    "INT8": [-128, -1, 0, 127],
    "INT16": [-32768, -1, 1, 32767],
    "INT32": [-(2**31), -1, 1, 2**31 - 1],
    "INT64": [-(2**63), -1, 1, 2**63 - 1],
    # 1.0000001 rounds to 1.0; 2051 is a tie that rounds to even (2052); ints are numbers too.
    "FP16": [1.0000001, -1.5, 65504.0, 2051],
    "FP32": [3.3, -0.0, 1e-45, 3.4028234663852886e38],
    "FP64": [0.1, -2, 1.7976931348623157e308, 5e-324],
    # 1 + 2^-8 + 2^-10 and 259 differ between truncation and rounding to nearest.
    "BF16": [1.0000001, 1 + 2**-8 + 2**-10, -2.5, 259],
}
NUMERIC = list(VALUES)
ALL_DATATYPES = [*NUMERIC, "BYTES"]


def _expected(datatype: str, values: list[Any]) -> bytes:
    return np.array(values, dtype=NP_DTYPE[datatype]).tobytes()


def _layouts(values: list[Any]) -> list[tuple[str, list[int], list[Any]]]:
    a, b, c, d = values
    return [
        ("flat", [4], [a, b, c, d]),
        ("nested", [2, 2], [[a, b], [c, d]]),
        ("ragged", [4], [[a, b], c, [d]]),
        ("deep", [2, 2, 1], [[[a], [b]], [[c], [d]]]),
        ("nested-not-matching-shape", [4, 1], [[a, b, c, d]]),
    ]


JSON_TO_WIRE = [
    pytest.param(dt, shape, data, _expected(dt, VALUES[dt]), id=f"{dt}-{layout}")
    for dt in NUMERIC
    for layout, shape, data in _layouts(VALUES[dt])
]


def _bytes_wire(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


BYTES_VALUES = ["abc", "", "he\u0000llo", "é"]
BYTES_WIRE = _bytes_wire(b"abc", b"", b"he\x00llo", b"\xc3\xa9")
JSON_TO_WIRE += [
    pytest.param("BYTES", shape, data, BYTES_WIRE, id=f"BYTES-{layout}")
    for layout, shape, data in _layouts(BYTES_VALUES)
]


def _request_body(inputs: list[dict[str, Any]], **top: Any) -> bytes:
    return json.dumps({**top, "inputs": inputs}, separators=(",", ":")).encode()


def _decode(body: bytes, **kw: Any) -> InferRequest:
    return binc.decode_request(body, None, "M", **kw)


def _input(**kw: Any) -> dict[str, Any]:
    return {"name": "X", "datatype": "INT32", "shape": [1], **kw}


@pytest.mark.parametrize(("datatype", "shape", "data", "wire"), JSON_TO_WIRE)
def test_json_data_to_wire(datatype: str, shape: list[int], data: list[Any], wire: bytes) -> None:
    body = _request_body([{"name": "X", "datatype": datatype, "shape": shape, "data": data}])
    req = _decode(body)
    (t,) = req.inputs
    assert (t.name, t.datatype, t.shape) == ("X", Datatype(datatype), tuple(shape))
    assert bytes(t.data) == wire


@pytest.mark.parametrize("datatype", NUMERIC)
def test_scalar_shape_takes_one_element(datatype: str) -> None:
    value = VALUES[datatype][1]
    body = _request_body([{"name": "X", "datatype": datatype, "shape": [], "data": [value]}])
    (t,) = _decode(body).inputs
    assert t.shape == ()
    assert bytes(t.data) == _expected(datatype, [value])


@pytest.mark.parametrize(
    ("datatype", "value", "wire"),
    [
        # Round to nearest (even), not truncation of the float32 bits.
        pytest.param("BF16", 1 + 2**-8 + 2**-10, b"\x81\x3f", id="BF16-round-up"),
        pytest.param("BF16", 259, b"\x82\x43", id="BF16-int-round-up"),
        pytest.param("BF16", 257, b"\x80\x43", id="BF16-tie-to-even"),
        pytest.param("BF16", 1.0000001, b"\x80\x3f", id="BF16-1.0000001"),
        pytest.param("FP16", 1.0000001, b"\x00\x3c", id="FP16-1.0000001"),
        pytest.param("FP16", 2049, b"\x00\x68", id="FP16-tie-to-even"),
        pytest.param("FP16", 2051.0, b"\x02\x68", id="FP16-round-up"),
        pytest.param("FP16", 1e6, b"\x00\x7c", id="FP16-overflow-inf"),
        pytest.param("FP32", 1e39, b"\x00\x00\x80\x7f", id="FP32-overflow-inf"),
    ],
)
def test_half_precision_rounds_to_nearest(datatype: str, value: float, wire: bytes) -> None:
    body = _request_body([{"name": "X", "datatype": datatype, "shape": [1], "data": [value]}])
    assert bytes(_decode(body).inputs[0].data) == wire
    # ... and agrees with numpy / ml_dtypes.
    with np.errstate(over="ignore"):
        assert np.array([value], dtype=NP_DTYPE[datatype]).tobytes() == wire


def test_bf16_rounding_differs_from_truncation() -> None:
    value = 1 + 2**-8 + 2**-10
    truncated = struct.pack("<f", value)[2:]
    body = _request_body([{"name": "X", "datatype": "BF16", "shape": [1], "data": [value]}])
    got = bytes(_decode(body).inputs[0].data)
    assert got != truncated
    assert got == np.array([value], dtype=ml_dtypes.bfloat16).tobytes()


def test_nan_and_infinity_literals_accepted_in_fp32_input() -> None:
    body = (
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[2,2],'
        b'"data":[[NaN,Infinity],[-Infinity,1.5]]}]}'
    )
    (t,) = _decode(body).inputs
    got = np.frombuffer(t.data, dtype="<f4")
    assert np.isnan(got[0])
    assert got[1:].tolist() == [np.inf, -np.inf, 1.5]


@pytest.mark.parametrize(
    ("text", "wire"),
    [
        pytest.param('"he\\u0000llo"', _bytes_wire(b"he\x00llo"), id="NUL"),
        pytest.param('"\\u00ff"', _bytes_wire(b"\xc3\xbf"), id="utf8-of-u00ff"),
        pytest.param('"\\ud83d\\ude00"', _bytes_wire("😀".encode()), id="surrogate-pair"),
        pytest.param('""', _bytes_wire(b""), id="empty"),
    ],
)
def test_bytes_json_strings_become_utf8(text: str, wire: bytes) -> None:
    body = (
        b'{"inputs":[{"name":"X","datatype":"BYTES","shape":[1],"data":[' + text.encode() + b"]}]}"
    )
    assert bytes(_decode(body).inputs[0].data) == wire


def test_bytes_with_nul_round_trips_through_json() -> None:
    t = from_numpy("T", Datatype.BYTES, np.array([b"he\x00llo", b"x"], dtype=object))
    body = dumps_tree(request_to_obj(InferRequest("M", [t]), False, False))
    assert b'"data":["he\\u0000llo","x"]' in body
    (back,) = _decode(body).inputs
    assert bytes(back.data) == _bytes_wire(b"he\x00llo", b"x")


# --------------------------------------------------------------------------- wire -> JSON


def _response_json(datatype: str, array: np.ndarray, binary: bool = False) -> bytes:
    t = from_numpy("OUT", Datatype(datatype), array)
    resp = InferResponse("m", [t], "1")
    return dumps_tree(response_to_obj(resp, lambda _t: binary))


WIRE_TO_JSON = [
    pytest.param("BOOL", np.array([[True], [False]]), "[true,false]", id="BOOL"),
    pytest.param("UINT8", np.array([0, 255], "u1"), "[0,255]", id="UINT8"),
    pytest.param("UINT16", np.array([0, 65535], "<u2"), "[0,65535]", id="UINT16"),
    pytest.param("UINT32", np.array([0, 2**32 - 1], "<u4"), "[0,4294967295]", id="UINT32"),
    pytest.param(
        "UINT64", np.array([0, 2**64 - 1], "<u8"), "[0,18446744073709551615]", id="UINT64-max"
    ),
    pytest.param("INT8", np.array([-128, 127], "i1"), "[-128,127]", id="INT8"),
    pytest.param("INT16", np.array([-32768, 32767], "<i2"), "[-32768,32767]", id="INT16"),
    pytest.param(
        "INT32", np.array([-(2**31), 2**31 - 1], "<i4"), "[-2147483648,2147483647]", id="INT32"
    ),
    pytest.param(
        "INT64",
        np.array([-(2**63), 2**63 - 1], "<i8"),
        "[-9223372036854775808,9223372036854775807]",
        id="INT64-min",
    ),
    pytest.param(
        "FP32",
        np.array([[3.3, 0.1], [1.0, -0.0]], "<f4"),
        "[3.299999952316284,0.10000000149011612,1.0,-0.0]",
        id="FP32-widened",
    ),
    pytest.param(
        "FP32",
        np.array([np.nan, np.inf, -np.inf, 2.0], "<f4"),
        "[NaN,Infinity,-Infinity,2.0]",
        id="FP32-nonfinite",
    ),
    pytest.param("FP64", np.array([1.0, 0.1, 2.5, -3.0], "<f8"), "[1.0,0.1,2.5,-3.0]", id="FP64"),
    pytest.param(
        "FP64", np.array([np.nan, -np.inf, 1.0], "<f8"), "[NaN,-Infinity,1.0]", id="FP64-nonfinite"
    ),
    pytest.param("FP16", np.array([1.0, 0.5, 65504], "<f2"), "[1.0,0.5,65504.0]", id="FP16"),
    pytest.param(
        "BF16",
        np.array([1.0, 3.140625, np.inf], ml_dtypes.bfloat16),
        "[1.0,3.140625,Infinity]",
        id="BF16",
    ),
    pytest.param(
        "BF16",
        # a signalling NaN (bits 0x7F81): numpy warns when it widens one
        np.frombuffer(np.array([0x7F81, 0x3F80], "<u2").tobytes(), ml_dtypes.bfloat16),
        "[NaN,1.0]",
        id="BF16-signalling-NaN",
    ),
    pytest.param(
        "BYTES",
        np.array([b"he\x00llo", "é".encode(), b""], dtype=object),
        '["he\\u0000llo","é",""]',
        id="BYTES",
    ),
]


@pytest.mark.parametrize(("datatype", "array", "data_text"), WIRE_TO_JSON)
def test_wire_to_json_text(datatype: str, array: np.ndarray, data_text: str) -> None:
    shape = json.dumps(list(array.shape), separators=(",", ":"))
    expected = (
        '{"model_name":"m","model_version":"1","outputs":[{"name":"OUT",'
        f'"datatype":"{datatype}","shape":{shape},"data":{data_text}}}]}}'
    )
    assert _response_json(datatype, array).decode() == expected


@pytest.mark.parametrize(("datatype", "array", "data_text"), WIRE_TO_JSON)
def test_tensor_data_json_is_flat(datatype: str, array: np.ndarray, data_text: str) -> None:
    value = tensor_data_json(from_numpy("T", Datatype(datatype), array))
    if isinstance(value, np.ndarray):
        assert value.ndim == 1
    assert len(value) == array.size


_LISTED = ["INT8", "UINT8", "INT16", "UINT16", "INT32", "UINT32", "INT64", "UINT64", "FP32", "FP64"]


def _numpy_text(t: Tensor) -> bytes:
    """The data's JSON text the numpy way (FP32 widened to double, as Triton writes it)."""
    arr = as_numpy(t).reshape(-1)
    if arr.dtype.kind == "f":
        arr = arr.astype(np.float64)
    return orjson.dumps(arr, option=orjson.OPT_SERIALIZE_NUMPY)


@pytest.mark.parametrize("datatype", _LISTED)
def test_small_tensors_are_listed_to_the_same_text(datatype: str) -> None:
    """A small tensor of integers, FP32 or FP64 comes as a list of numbers, whose JSON text
    is the numpy array's; a larger one as the array."""
    dt = Datatype(datatype)
    npdt = NUMPY_DTYPE[dt]
    rng = np.random.default_rng(7)
    if npdt.kind == "f":
        info = np.finfo(npdt)
        extremes = [0.0, -0.0, 1.0, float(info.max), float(info.min), float(info.tiny)]
        scale = 10.0 ** rng.integers(-30, 30, 64)
        values = np.concatenate([extremes, rng.standard_normal(64) * scale]).astype(npdt)
    else:
        iinfo = np.iinfo(npdt)
        bounds = np.array([iinfo.min, iinfo.max, 0], dtype=npdt)
        values = np.concatenate([bounds, rng.integers(iinfo.min, iinfo.max, 64, npdt, True)])
    small = from_numpy("T", dt, values)
    listed = tensor_data_json(small)
    assert type(listed) is list
    assert orjson.dumps(listed) == _numpy_text(small)
    large = from_numpy("T", dt, np.resize(values, 257))
    assert isinstance(tensor_data_json(large), np.ndarray)


@pytest.mark.parametrize(
    ("datatype", "values", "text"),
    [
        ("FP32", [1.0, float("nan")], b"[1.0,NaN]"),
        ("FP64", [float("-inf"), 2.5], b"[-Infinity,2.5]"),
        ("FP64", [1e308, 1e308], b"[1e+308,1e+308]"),  # a sum past the largest double
    ],
)
def test_small_float_tensors_that_are_not_finite_take_the_numpy_path(
    datatype: str, values: list[float], text: bytes
) -> None:
    t = from_numpy("T", Datatype(datatype), np.array(values))
    resp = InferResponse("m", [t], "1")
    assert dumps_tree(response_to_obj(resp, lambda _t: False)).endswith(b'"data":' + text + b"}]}")


def test_triton_key_order_and_output_parameters() -> None:
    outputs = [
        Tensor("B", Datatype.INT32, (1,), np.array([7], "<i4").tobytes(), {"p": 1}),
        Tensor("J", Datatype.INT32, (2, 1), np.array([1, 2], "<i4").tobytes(), {"q": "x"}),
        Tensor("K", Datatype.BOOL, (1,), b"\x01"),
    ]
    resp = InferResponse("m", outputs, "3", id="req-1", parameters={"seq": 2})
    text = dumps_tree(response_to_obj(resp, lambda t: t.name == "B"))
    assert text == (
        b'{"id":"req-1","model_name":"m","model_version":"3","parameters":{"seq":2},"outputs":['
        b'{"name":"B","datatype":"INT32","shape":[1],"parameters":{"p":1,"binary_data_size":4}},'
        b'{"name":"J","datatype":"INT32","shape":[2,1],"parameters":{"q":"x"},"data":[1,2]},'
        b'{"name":"K","datatype":"BOOL","shape":[1],"data":[true]}]}'
    )


def test_no_id_no_parameters_keys_when_empty() -> None:
    resp = InferResponse("m", [], "", id="", parameters={})
    assert dumps_tree(response_to_obj(resp, lambda _t: False)) == (
        b'{"model_name":"m","model_version":"","outputs":[]}'
    )


def test_nonfinite_literals_do_not_collide_with_string_data() -> None:
    # The literal writer must not be fooled by a client string that looks like its own marker.
    tricky = "\x00V2PROXY0\x00"
    outputs = [
        from_numpy("S", Datatype.BYTES, np.array([tricky.encode()], dtype=object)),
        from_numpy("F", Datatype.FP32, np.array([np.nan], "<f4")),
    ]
    resp = InferResponse("m", outputs, "1", id=tricky)
    text = dumps_tree(response_to_obj(resp, lambda _t: False))
    assert text == (
        b'{"id":"\\u0000V2PROXY0\\u0000","model_name":"m","model_version":"1","outputs":['
        b'{"name":"S","datatype":"BYTES","shape":[1],"data":["\\u0000V2PROXY0\\u0000"]},'
        b'{"name":"F","datatype":"FP32","shape":[1],"data":[NaN]}]}'
    )


def test_non_utf8_bytes_output_as_json_asks_for_binary_data() -> None:
    t = from_numpy("OUT", Datatype.BYTES, np.array([b"\x00\x01\xff"], dtype=object))
    with pytest.raises(CodecError) as info:
        response_to_obj(InferResponse("m", [t], "1"), lambda _t: False)
    assert "tensor 'OUT'" in info.value.message
    assert "binary_data" in info.value.message
    # As binary it is fine and byte exact.
    obj = response_to_obj(InferResponse("m", [t], "1"), lambda _t: True)
    assert obj["outputs"][0]["parameters"] == {"binary_data_size": 7}


def test_fixed_size_tensor_with_wrong_byte_count_cannot_become_json() -> None:
    # A binary input of 3 bytes declared FP32 [1], forwarded to a JSON backend.
    body = _request_body([_input(datatype="FP32", parameters={"binary_data_size": 3})])
    req = binc.decode_request(body + b"abc", len(body), "M")
    with pytest.raises(CodecError) as info:
        infer_body(req, False)
    assert "'X'" in info.value.message
    assert "Expected 4, got 3" in info.value.message


# --------------------------------------------------------------------------- zero elements


@pytest.mark.parametrize("shape", [[0], [2, 0], [0, 3, 5]])
@pytest.mark.parametrize("datatype", ALL_DATATYPES)
@pytest.mark.parametrize("data", [[], [1, 2, 3], "not even an array", [[["x"]]]])
def test_zero_element_tensors_do_not_parse_data(datatype: str, shape: list[int], data: Any) -> None:
    body = _request_body([{"name": "X", "datatype": datatype, "shape": shape, "data": data}])
    (t,) = _decode(body).inputs
    assert t.shape == tuple(shape)
    assert bytes(t.data) == b""


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_zero_element_output_writes_empty_data(datatype: str) -> None:
    array = np.zeros((2, 0), dtype=object if datatype == "BYTES" else NP_DTYPE[datatype])
    assert _response_json(datatype, array).endswith(b'"shape":[2,0],"data":[]}]}')


# --------------------------------------------------------------------------- bad inputs


def _deep(depth: int, leaf: Any) -> list[Any]:
    value: list[Any] = [leaf]
    for _ in range(depth - 1):
        value = [value]
    return value


def _data_case(datatype: Any, shape: Any, data: Any) -> bytes:
    return _request_body([{"name": "X", "datatype": datatype, "shape": shape, "data": data}])


BAD = [
    # element counts
    ("too-few", _data_case("INT32", [3], [1, 2]), ["'data'", "input 'X'", "expected 3", "got 2"]),
    (
        "too-many",
        _data_case("INT32", [3], [1, 2, 3, 4]),
        ["'data'", "input 'X'", "shape does not match"],
    ),
    (
        "too-many-nested",
        _data_case("FP32", [2], [[1, 2], [3]]),
        ["'data'", "expected 2 elements, got 3"],
    ),
    ("bytes-too-few", _data_case("BYTES", [2], ["a"]), ["'data'", "input 'X'", "expected 2"]),
    ("bytes-too-many", _data_case("BYTES", [1], ["a", "b"]), ["'data'", "got 2"]),
    # datatype
    ("unknown-datatype", _data_case("INT33", [1], [1]), ["datatype", "'INT33'", "input 'X'"]),
    ("lowercase-datatype", _data_case("int32", [1], [1]), ["datatype", "input 'X'"]),
    ("datatype-not-string", _data_case(5, [1], [1]), ["datatype", "input 'X'"]),
    # non-numbers where numbers belong
    ("string-in-int", _data_case("INT32", [2], [1, "2"]), ["'data'", "input 'X'", "INT32"]),
    ("null-in-int", _data_case("INT64", [2], [1, None]), ["'data'", "INT64", "integers"]),
    ("object-in-int", _data_case("UINT8", [1], [{}]), ["'data'", "UINT8"]),
    ("list-leaf-obj-in-fp", _data_case("FP32", [2], [1.0, {"a": 1}]), ["'data'", "FP32"]),
    ("null-in-fp", _data_case("FP64", [1], [None]), ["'data'", "FP64", "numbers"]),
    ("string-in-fp", _data_case("FP32", [1], ["1.5"]), ["'data'", "FP32", "numbers"]),
    ("bool-in-int", _data_case("INT32", [1], [True]), ["'data'", "INT32", "integers"]),
    ("bool-mixed-in-int", _data_case("INT32", [2], [1, True]), ["'data'", "INT32", "integers"]),
    ("bool-in-fp", _data_case("FP32", [2], [1.5, False]), ["'data'", "FP32", "numbers"]),
    ("float-in-int", _data_case("INT32", [2], [1, 1.5]), ["'data'", "INT32", "integers"]),
    ("whole-float-in-int", _data_case("INT64", [1], [1.0]), ["'data'", "INT64", "integers"]),
    ("zero-one-in-bool", _data_case("BOOL", [2], [0, 1]), ["'data'", "BOOL", "true or false"]),
    ("mixed-in-bool", _data_case("BOOL", [2], [True, 1]), ["'data'", "BOOL"]),
    ("string-in-bool", _data_case("BOOL", [1], ["true"]), ["'data'", "BOOL"]),
    ("number-in-bytes", _data_case("BYTES", [2], ["a", 1]), ["'data'", "BYTES", "strings"]),
    ("null-in-bytes", _data_case("BYTES", [1], [None]), ["'data'", "BYTES", "strings"]),
    ("data-not-array", _data_case("INT32", [1], 5), ["'data'", "input 'X'", "array"]),
    ("bytes-data-not-array", _data_case("BYTES", [1], "abc"), ["'data'", "array"]),
    # integer range
    ("uint8-300", _data_case("UINT8", [1], [300]), ["'data'", "out of range", "UINT8"]),
    ("uint-negative", _data_case("UINT32", [1], [-1]), ["'data'", "out of range", "UINT32"]),
    ("uint64-negative", _data_case("UINT64", [2], [1, -1]), ["'data'", "out of range"]),
    ("int8-128", _data_case("INT8", [1], [128]), ["'data'", "out of range", "INT8"]),
    ("int16-min-1", _data_case("INT16", [1], [-32769]), ["'data'", "out of range", "INT16"]),
    ("int32-max+1", _data_case("INT32", [1], [2**31]), ["'data'", "out of range", "INT32"]),
    ("int64-max+1", _data_case("INT64", [1], [2**63]), ["'data'", "out of range", "INT64"]),
    ("int64-max+1-mixed", _data_case("INT64", [2], [2**63, -1]), ["'data'", "out of range"]),
    ("int64-min-1", _data_case("INT64", [1], [-(2**63) - 1]), ["'data'", "INT64"]),
    ("uint64-max+1", _data_case("UINT64", [1], [2**64]), ["'data'", "UINT64"]),
    # shape
    ("negative-dim", _data_case("INT32", [-1], [1]), ["'shape'", "input 'X'", "-1"]),
    ("float-dim", _data_case("INT32", [1.0], [1]), ["'shape'", "input 'X'"]),
    ("bool-dim", _data_case("INT32", [True], [1]), ["'shape'", "input 'X'"]),
    ("string-dim", _data_case("INT32", ["1"], [1]), ["'shape'", "input 'X'"]),
    ("shape-not-array", _data_case("INT32", 1, [1]), ["'shape'", "input 'X'"]),
    (
        "shape-missing",
        _request_body([{"name": "X", "datatype": "INT32", "data": [1]}]),
        ["'shape'", "input 'X'", "missing"],
    ),
    (
        "element-count-overflow",
        _data_case("INT32", [2**40, 2**40], [1]),
        ["invalid shape for input 'X'", "9223372036854775807"],
    ),
    # inputs / outputs structure
    ("inputs-missing", b'{"id":"a"}', ["'inputs'"]),
    ("inputs-not-list", b'{"inputs":{"name":"X"}}', ["'inputs'"]),
    ("inputs-null", b'{"inputs":null}', ["'inputs'"]),
    ("input-not-object", b'{"inputs":[5]}', ["'inputs[0]'"]),
    (
        "input-name-missing",
        _request_body([{"datatype": "INT32", "shape": [1], "data": [1]}]),
        ["'name'", "inputs[0]"],
    ),
    (
        "data-and-binary-size",
        _request_body([_input(data=[1], parameters={"binary_data_size": 4})]),
        ["Input must set only one of", " set 'data' 'binary_data_size'", "input 'X'"],
    ),
    (
        "no-data-source",
        _request_body([_input()]),
        ["Input must set only one of", "no field is set", "input 'X'"],
    ),
    (
        "data-and-shm",
        _request_body([_input(data=[1], parameters={"shared_memory_region": "r"})]),
        ["set 'data' 'shared_memory_region'", "input 'X'"],
    ),
    (
        "input-parameters-not-object",
        _request_body([_input(data=[1], parameters=[1])]),
        ["'parameters'", "input 'X'"],
    ),
    (
        "duplicate-inputs",
        _request_body([_input(data=[1]), _input(data=[2])]),
        ["input 'X'", "already exists"],
    ),
    (
        "duplicate-outputs",
        _request_body([_input(data=[1])], outputs=[{"name": "A"}, {"name": "A"}]),
        ["output 'A' already exists in request"],
    ),
    ("outputs-not-list", _request_body([_input(data=[1])], outputs={"name": "A"}), ["'outputs'"]),
    ("output-without-name", _request_body([_input(data=[1])], outputs=[{}]), ["'outputs[0]'"]),
    (
        "binary-data-not-bool",
        _request_body(
            [_input(data=[1])], outputs=[{"name": "A", "parameters": {"binary_data": 1}}]
        ),
        ["'binary_data'", "output 'A'", "boolean"],
    ),
    (
        "binary-data-output-not-bool",
        _request_body([_input(data=[1])], parameters={"binary_data_output": "true"}),
        ["'binary_data_output'", "boolean"],
    ),
    (
        "binary-data-size-negative",
        _request_body([_input(parameters={"binary_data_size": -4})]),
        ["'binary_data_size'", "input 'X'"],
    ),
    ("id-not-string", _request_body([_input(data=[1])], id=7), ["'id'", "string"]),
    ("parameters-not-object", _request_body([_input(data=[1])], parameters=[]), ["'parameters'"]),
    (
        "triton-prefixed-parameter",
        _request_body([_input(data=[1])], parameters={"triton_enable_x": True}),
        ["parameter keys starting with 'triton_' are reserved"],
    ),
    # nesting depth
    ("depth-100", _data_case("INT64", [1], _deep(100, 1)), ["'data'", "nesting depth", "(100)"]),
    ("depth-120", _data_case("INT64", [1], _deep(120, 1)), ["'data'", "nesting depth"]),
    ("depth-120-bytes", _data_case("BYTES", [1], _deep(120, "a")), ["'data'", "nesting depth"]),
    # not a JSON object
    ("top-level-array", b"[1,2]", ["request", "JSON object"]),
]


MALFORMED = [
    b'{"inputs": [',
    b'{"inputs": []} trailing',
    b'{"inputs": [}',
    b"{'inputs': []}",
    b"\xff\xfe{}",
    b"",
    b"   ",
]


@pytest.mark.parametrize(("body", "substrings"), [pytest.param(b, s, id=i) for i, b, s in BAD])
def test_bad_request_names_the_field(body: bytes, substrings: list[str]) -> None:
    with pytest.raises(CodecError) as info:
        _decode(body)
    for s in substrings:
        assert s in info.value.message, (s, info.value.message)
    assert info.value.http_status == 400


@pytest.mark.parametrize("body", MALFORMED)
def test_malformed_json(body: bytes) -> None:
    with pytest.raises(CodecError) as info:
        _decode(body)
    assert info.value.message.startswith("failed to parse the request JSON buffer")


@pytest.mark.parametrize("datatype", ["INT64", "BYTES"])
def test_nesting_depth_50_works(datatype: str) -> None:
    leaf: Any = "a" if datatype == "BYTES" else 5
    body = _data_case(datatype, [1], _deep(50, leaf))
    (t,) = _decode(body).inputs
    assert bytes(t.data) == (_bytes_wire(b"a") if datatype == "BYTES" else struct.pack("<q", 5))


@pytest.mark.parametrize(
    ("datatype", "count", "data"),
    [("INT64", 1000, [0] * 1000), ("BYTES", 1000, ["x"] * 1000)],
)
def test_json_input_over_max_input_size(datatype: str, count: int, data: list[Any]) -> None:
    body = _data_case(datatype, [count], data)
    assert len(body) < 4500
    with pytest.raises(PayloadTooLarge) as info:
        _decode(body, max_input_size=4500)
    assert "JSON input 'X' has a byte_size" in info.value.message
    assert "4500 bytes" in info.value.message


def test_json_header_over_max_input_size() -> None:
    body = _data_case("INT8", [3], [1, 2, 3])
    with pytest.raises(PayloadTooLarge) as info:
        _decode(body, max_input_size=10)
    assert f"request JSON size of {len(body)} bytes" in info.value.message


def test_all_errors_are_proxy_errors() -> None:
    assert issubclass(CodecError, ProxyError)
    assert issubclass(PayloadTooLarge, ProxyError)


# --------------------------------------------------------------------------- the request model


def test_request_fields_are_kept() -> None:
    body = _request_body(
        [_input(data=[5], parameters={"custom": "v"})],
        id="abc",
        parameters={"binary_data_output": True, "sequence_id": 3},
        outputs=[{"name": "A", "parameters": {"binary_data": True}}, {"name": "B"}],
    )
    req = binc.decode_request(body, None, "M", "2")
    assert (req.model_name, req.model_version, req.id) == ("M", "2", "abc")
    assert req.parameters == {"binary_data_output": True, "sequence_id": 3}
    assert req.outputs == [
        RequestedOutput("A", {"binary_data": True}),
        RequestedOutput("B", {}),
    ]
    (t,) = req.inputs
    assert t.parameters == {"custom": "v"}
    assert bytes(t.data) == struct.pack("<i", 5)


def test_outputs_absent_is_none() -> None:
    assert _decode(_request_body([_input(data=[1])])).outputs is None
    assert _decode(_request_body([_input(data=[1])], outputs=[])).outputs == []


def test_request_to_obj_json_inputs() -> None:
    req = InferRequest(
        "M",
        [from_numpy("X", Datatype.FP32, np.array([[3.3, np.inf]], "<f4"))],
        outputs=[RequestedOutput("A", {"binary_data": True})],
        id="i",
        parameters={"binary_data_output": True, "k": 1},
    )
    text = dumps_tree(request_to_obj(req, False, False))
    assert text == (
        b'{"id":"i","parameters":{"k":1},"inputs":[{"name":"X","datatype":"FP32","shape":[1,2],'
        b'"data":[3.299999952316284,Infinity]}],'
        b'"outputs":[{"name":"A","parameters":{"binary_data":false}}]}'
    )


# --------------------------------------------------------------------------- lone surrogates

#: "\ud800" as JSON text: an escape with no pair, which is no Unicode text (RFC 8259 §8.2)
NOT_TEXT = "a lone surrogate (\\ud800) is not valid UTF-8 text"
#: a second input that makes the header bigger than SMALL_DOCUMENT (the simdjson path)
_PADDING = {"name": "PAD", "datatype": "INT32", "shape": [9000], "data": [1] * 9000}


def _text_case(top: dict[str, Any]) -> bytes:
    # json.dumps writes a lone surrogate as its \u escape, as a client's encoder would
    return json.dumps(top, separators=(",", ":")).encode()


SURROGATE_CASES = [
    # (id, request, message, field)
    (
        "input-name",
        {"inputs": [_input(name="\ud800", data=[1])]},
        f"Unable to parse 'inputs[0].name': {NOT_TEXT}",
        "inputs[0].name",
    ),
    (
        "input-name-inside",
        {"inputs": [_input(data=[1]), _input(name="A\udfffB", data=[1])]},
        f"Unable to parse 'inputs[1].name': {NOT_TEXT.replace('d800', 'dfff')}",
        "inputs[1].name",
    ),
    (
        "output-name",
        {"inputs": [_input(data=[1])], "outputs": [{"name": "\ud800"}]},
        f"Unable to parse 'outputs[0].name': {NOT_TEXT}",
        "outputs[0].name",
    ),
    (
        "bytes-data",
        {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2], "data": ["ok", "x\ud800"]}]},
        f"Unable to parse 'data[1]' for input 'S': {NOT_TEXT}",
        "inputs[0].data[1]",
    ),
    (
        "bytes-data-nested",
        {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2], "data": [["a"], ["\udc00"]]}]},
        f"Unable to parse 'data[1][0]' for input 'S': {NOT_TEXT.replace('d800', 'dc00')}",
        "inputs[0].data[1][0]",
    ),
    (
        "bytes-data-of-a-bad-name",  # the tensor is named by position when its name is no text
        {"inputs": [{"name": "\ud800", "datatype": "BYTES", "shape": [1], "data": ["\ud800"]}]},
        f"Unable to parse 'inputs[0].name': {NOT_TEXT}",
        "inputs[0].name",
    ),
    (
        "datatype",
        {"inputs": [_input(datatype="INT32\ud800", data=[1])]},
        f"Unable to parse 'datatype' for input 'X': {NOT_TEXT}",
        "inputs[0].datatype",
    ),
    (
        "id",
        {"id": "\ud800", "inputs": [_input(data=[1])]},
        f"Unable to parse 'id': {NOT_TEXT}",
        "id",
    ),
    (
        "parameter-value",
        {"parameters": {"p": "\ud800"}, "inputs": [_input(data=[1])]},
        f"Unable to parse 'parameters.p': {NOT_TEXT}",
        "parameters.p",
    ),
    (
        "parameter-key",
        {"parameters": {"\ud800": 1}, "inputs": [_input(data=[1])]},
        f"Unable to parse a key of 'parameters': {NOT_TEXT}",
        "parameters",
    ),
    (
        "top-level-key",
        {"\ud800": 1, "inputs": [_input(data=[1])]},
        f"Unable to parse a key of the request: {NOT_TEXT}",
        "",
    ),
    (
        "with-nan-literals",  # the standard library's parser, which reads NaN, reads it too
        {"inputs": [_input(datatype="FP32", data=[float("nan")]), _input(name="\ud800", data=[1])]},
        f"Unable to parse 'inputs[1].name': {NOT_TEXT}",
        "inputs[1].name",
    ),
]


@pytest.mark.parametrize("big", [False, True], ids=["small", "simdjson"])
@pytest.mark.parametrize(
    ("request_obj", "message", "field"),
    [pytest.param(*c[1:], id=c[0]) for c in SURROGATE_CASES],
)
def test_lone_surrogate_names_the_field(
    request_obj: dict[str, Any], message: str, field: str, big: bool
) -> None:
    if big:
        request_obj = {**request_obj, "inputs": [*request_obj["inputs"], _PADDING]}
    body = _text_case(request_obj)
    assert b"\\u" in body and (not big or len(body) > 16 * 1024)
    with pytest.raises(InvalidText) as info:
        _decode(body)
    assert info.value.message == message
    assert info.value.field == field
    assert info.value.http_status == 400
    info.value.message.encode("utf-8")  # the message itself is text


def test_lone_surrogate_as_the_whole_document() -> None:
    with pytest.raises(InvalidText) as info:
        loads(b'"a\\ud800"', "generate request")
    assert info.value.message == f"Unable to parse the generate request: {NOT_TEXT}"


@pytest.mark.parametrize(
    ("text", "wire"),
    [
        pytest.param('"\\ud83d\\ude00"', _bytes_wire("😀".encode()), id="pair"),
        pytest.param('"\\\\ud800"', _bytes_wire(b"\\ud800"), id="escaped-backslash"),
        pytest.param('"\\uD83D\\uDE00"', _bytes_wire("😀".encode()), id="pair-uppercase"),
    ],
)
def test_surrogate_pairs_and_look_alikes_still_decode(text: str, wire: bytes) -> None:
    body = (
        b'{"inputs":[{"name":"X","datatype":"BYTES","shape":[1],"data":[' + text.encode() + b"]},"
        b'{"name":"F","datatype":"FP32","shape":[1],"data":[NaN]}]}'  # the fallback parser
    )
    assert bytes(_decode(body).inputs[0].data) == wire


def test_bytes_element_that_is_no_text_names_the_input() -> None:
    """Strings that reach the codec without JSON text (a decoded tree) are checked too; they
    were encoded with ``surrogatepass`` into bytes that are no UTF-8."""
    with pytest.raises(CodecError) as info:
        data_to_buffer(["ok", "x\udc80"], Datatype.BYTES, (2,), "input 'S'")
    assert info.value.message == (
        f"Unable to parse 'data[1]' for input 'S': {NOT_TEXT.replace('d800', 'dc80')}"
    )


@pytest.mark.parametrize(
    ("doc", "found"),
    [
        (b'{"outputs": [{"name": "O", "data": [1, 2]}]}', True),
        (b"  {}  ", True),
        (b'{"x": NaN}', True),  # what simdjson refuses, the full parser decides
        (b"[1, 2]", False),
        (b'"text"', False),
        (b"3", False),
    ],
)
def test_is_object_says_whether_a_json_document_is_an_object(doc: bytes, found: bool) -> None:
    assert is_object(doc) is found
    assert is_object(memoryview(doc + b"tail")[: len(doc)]) is found  # a view of a body


@pytest.mark.parametrize(
    "doc",
    # text that is not UTF-8 anywhere, a value or a key, however deep
    [b"", b"{", b'{"a": 1} x', b"\xff", b'{"a": "\\ud800"}', b'{"a": "\xff"}', b'{"a\xff": 1}'],
)
def test_is_object_names_what_is_not_json(doc: bytes) -> None:
    with pytest.raises(CodecError):
        is_object(doc, what="response")
    with pytest.raises(CodecError):
        loads(doc, what="response")  # the same documents the full parser refuses
