"""The binary-tensor framing (docs/protocol.md, binary tensors), against bodies built by hand and by
the real ``tritonclient.http`` client, in both directions."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from v2proxy.backends.rest_requests import infer_body
from v2proxy.codecs import binary as binc
from v2proxy.codecs.dtypes import as_numpy, from_numpy
from v2proxy.codecs.raw import decode_raw_request
from v2proxy.core.errors import CodecError
from v2proxy.core.model import (
    Buffer,
    Datatype,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)


def _join(chunks: list[Buffer]) -> bytes:
    return b"".join(bytes(c) for c in chunks)


def _bytes_wire(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _framed(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, int]:
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b"".join(blobs), len(head)


def _binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


# --------------------------------------------------------------------------- parse_ihcl


@pytest.mark.parametrize(
    ("value", "body_length", "expected"),
    [
        (None, 100, None),
        ("0", 100, 0),
        ("0", 0, 0),
        ("42", 100, 42),
        ("100", 100, 100),
        (" 42", 100, 42),
        ("42 ", 100, 42),
        ("\t7\r\n", 10, 7),
        ("007", 10, 7),
    ],
)
def test_parse_ihcl(value: str | None, body_length: int, expected: int | None) -> None:
    assert binc.parse_ihcl(value, body_length) == expected


@pytest.mark.parametrize("value", ["12abc", "-1", "abc", "", "  ", "1.5", "+3", "0x10", "١٢"])
def test_parse_ihcl_not_a_number(value: str) -> None:
    with pytest.raises(CodecError) as info:
        binc.parse_ihcl(value, 1000)
    assert info.value.message == f"Unable to parse Inference-Header-Content-Length, got: {value}"


@pytest.mark.parametrize(
    ("value", "body_length"), [("101", 100), ("1", 0), ("99999999999", 10), ("2147483648", 50)]
)
def test_parse_ihcl_beyond_the_body(value: str, body_length: int) -> None:
    with pytest.raises(CodecError) as info:
        binc.parse_ihcl(value, body_length)
    assert info.value.message == (
        f"inference header size should be in range (0, {body_length}), got: {value}"
    )


# --------------------------------------------------------------------------- decode_request


def test_decode_hand_built_binary_request_is_a_view_into_the_body() -> None:
    a = np.arange(6, dtype="<i4").reshape(2, 3)
    b = _bytes_wire(b"he\x00llo", b"\x00\x01\xff", b"")
    header = {
        "id": "r",
        "inputs": [
            _binary_input("A", "INT32", [2, 3], a.nbytes),
            {"name": "J", "datatype": "FP32", "shape": [2], "data": [1.5, -2]},
            _binary_input("B", "BYTES", [3], len(b)),
            _binary_input("E", "FP32", [2, 0], 0),
        ],
    }
    body, ihcl = _framed(header, a.tobytes(), b)
    req = binc.decode_request(body, ihcl, "M", "1")
    assert [t.name for t in req.inputs] == ["A", "J", "B", "E"]
    ta, tj, tb, te = req.inputs
    assert bytes(ta.data) == a.tobytes()
    assert bytes(tj.data) == np.array([1.5, -2], "<f4").tobytes()
    assert bytes(tb.data) == b
    assert bytes(te.data) == b""
    assert as_numpy(tb).tolist() == [b"he\x00llo", b"\x00\x01\xff", b""]
    # No copies: binary tensors are memoryviews into the very body.
    for t in (ta, tb, te):
        assert isinstance(t.data, memoryview)
        assert t.data.obj is body
    assert np.shares_memory(as_numpy(ta), np.frombuffer(body, dtype=np.uint8))
    assert np.array_equal(as_numpy(ta), a)
    # binary_data_size is consumed by the framing, not passed on.
    assert ta.parameters == {}


def _tc_input(name: str, array: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    inp = httpclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary)
    return inp


TC_INPUTS: list[tuple[str, np.ndarray, str]] = [
    ("I32", np.arange(16, dtype=np.int32).reshape(2, 8), "INT32"),
    ("U64", np.array([0, 2**64 - 1], dtype=np.uint64), "UINT64"),
    ("I8", np.array([[-128, 127]], dtype=np.int8), "INT8"),
    ("F32", np.array([3.3, -0.0, np.inf], dtype=np.float32), "FP32"),
    ("F64", np.array([0.1, 1e300], dtype=np.float64), "FP64"),
    ("BOOL", np.array([True, False, True]), "BOOL"),
    ("STR", np.array([b"he\x00llo", b"\x00\x01\xff", b""], dtype=object), "BYTES"),
    ("EMPTY", np.zeros((2, 0), dtype=np.float32), "FP32"),
]
# tritonclient refuses FP16/BF16 as JSON; send them binary only.
TC_BINARY_ONLY: list[tuple[str, np.ndarray, str]] = [
    ("F16", np.array([1.5, -65504], dtype=np.float16), "FP16"),
    ("BF16", np.array([1.5, -2.0, 3.140625], dtype=ml_dtypes.bfloat16), "BF16"),
]


def _wire(array: np.ndarray, datatype: str) -> bytes:
    return bytes(from_numpy("t", Datatype(datatype), array).data)


@pytest.mark.parametrize("mix", ["all-binary", "all-json", "alternate"])
def test_decode_tritonclient_request(mix: str) -> None:
    inputs = []
    binary_flags = []
    for i, (name, array, datatype) in enumerate(TC_INPUTS):
        binary = {"all-binary": True, "all-json": False, "alternate": i % 2 == 0}[mix]
        if datatype == "BYTES" and not binary:  # JSON BYTES must be UTF-8
            array = np.array([b"he\x00llo", "é".encode(), b""], dtype=object)  # noqa: PLW2901
        inputs.append(_tc_input(name, array, datatype, binary))
        binary_flags.append(binary)
    for name, array, datatype in TC_BINARY_ONLY:
        inputs.append(_tc_input(name, array, datatype, True))
        binary_flags.append(True)
    outputs = [
        httpclient.InferRequestedOutput("O1", binary_data=True),
        httpclient.InferRequestedOutput("O2", binary_data=False),
    ]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="req-7", parameters={"custom": "v"}
    )
    ihcl = binc.parse_ihcl(None if json_size is None else str(json_size), len(body))
    req = binc.decode_request(body, ihcl, "M")
    assert req.id == "req-7"
    assert req.parameters == {"custom": "v"}
    assert req.outputs == [
        RequestedOutput("O1", {"binary_data": True}),
        RequestedOutput("O2", {"binary_data": False}),
    ]
    assert len(req.inputs) == len(inputs)
    for t, inp, binary in zip(req.inputs, inputs, binary_flags, strict=True):
        assert t.name == inp.name()
        assert t.datatype == Datatype(inp.datatype())
        assert list(t.shape) == inp.shape()
        source = {i[0]: i for i in TC_INPUTS + TC_BINARY_ONLY}[t.name]
        array, datatype = source[1], source[2]
        if datatype == "BYTES" and not binary:
            expected = _bytes_wire(b"he\x00llo", "é".encode(), b"")
        else:
            expected = _wire(array, datatype)
        assert bytes(t.data) == expected, t.name
        if binary:
            assert isinstance(t.data, memoryview)
            assert t.data.obj is body


def test_decode_tritonclient_request_without_outputs_asks_binary_output() -> None:
    inp = _tc_input("X", np.array([1, 2], dtype=np.int32), "INT32", False)
    body, json_size = httpclient.InferenceServerClient.generate_request_body([inp])
    assert json_size is None
    req = binc.decode_request(body, None, "M")
    assert req.outputs is None
    assert req.parameters == {"binary_data_output": True}
    rule = binc.binary_output_rule(req)
    assert rule is not None and rule(Tensor("ANY", Datatype.INT32, (1,), b"\0" * 4))


def test_zero_size_binary_input_at_the_end_without_bytes() -> None:
    body, ihcl = _framed({"inputs": [_binary_input("Z", "BYTES", [0], 0)]})
    (t,) = binc.decode_request(body, ihcl, "M").inputs
    assert (t.shape, bytes(t.data)) == ((0,), b"")


@pytest.mark.parametrize(
    ("declared", "present", "missing"),
    [([8], b"", 8), ([8], b"\0" * 5, 3), ([4, 4], b"\0" * 6, 2), ([0, 4], b"\0" * 3, 1)],
)
def test_missing_binary_bytes(declared: list[int], present: bytes, missing: int) -> None:
    inputs = [_binary_input(f"IN{i}", "UINT8", [n], n) for i, n in enumerate(declared)]
    body, ihcl = _framed({"inputs": inputs}, present)
    short = f"IN{len(declared) - 1}" if len(present) >= sum(declared[:-1]) else "IN0"
    with pytest.raises(CodecError) as info:
        binc.decode_request(body, ihcl, "M")
    assert info.value.message == (
        f"unexpected size for input '{short}', expecting {missing} additional bytes for model 'M'"
    )


@pytest.mark.parametrize("extra", [b"\0", b"abc" * 10])
def test_extra_binary_bytes(extra: bytes) -> None:
    body, ihcl = _framed({"inputs": [_binary_input("A", "UINT8", [2], 2)]}, b"xy", extra)
    with pytest.raises(CodecError) as info:
        binc.decode_request(body, ihcl, "Mod")
    assert info.value.message == "unexpected additional input data for model 'Mod'"


def test_extra_bytes_after_a_json_only_framed_request() -> None:
    body, ihcl = _framed({"inputs": [{"name": "A", "datatype": "INT8", "shape": [1], "data": [1]}]})
    with pytest.raises(CodecError, match="unexpected additional input data for model 'M'"):
        binc.decode_request(body + b"zz", ihcl, "M")


def test_binary_data_size_without_ihcl() -> None:
    body, _ = _framed({"inputs": [_binary_input("A", "UINT8", [2], 2)]}, b"xy")
    with pytest.raises(CodecError) as info:
        binc.decode_request(body[:-2], None, "M")
    assert "input 'A'" in info.value.message
    assert "'binary_data_size'" in info.value.message
    assert "Inference-Header-Content-Length" in info.value.message
    # With the bytes present the JSON parser sees trailing data.
    with pytest.raises(CodecError) as info:
        binc.decode_request(body, None, "M")
    assert info.value.message.startswith("failed to parse the request JSON buffer")


def test_zero_size_binary_input_without_ihcl() -> None:
    # Nothing to read, so no binary section is needed (Triton accepts this too).
    body, _ = _framed({"inputs": [_binary_input("Z", "INT32", [2, 0], 0)]})
    (t,) = binc.decode_request(body, None, "M").inputs
    assert (t.shape, bytes(t.data), t.parameters) == ((2, 0), b"", {})


def test_zero_byte_binary_output_from_a_json_response() -> None:
    # Triton answers zero-byte binary outputs as plain JSON with no IHCL (docs/protocol.md).
    body = (
        b'{"model_name":"M","model_version":"1","outputs":[{"name":"C","datatype":"INT32",'
        b'"shape":[0],"parameters":{"binary_data_size":0}}]}'
    )
    (t,) = binc.decode_response(body, None).outputs
    assert (t.name, t.shape, bytes(t.data), t.parameters) == ("C", (0,), b"", {})


def test_ihcl_zero_is_not_for_decode_request() -> None:
    with pytest.raises(ValueError, match="raw"):
        binc.decode_request(b"{}", 0, "M")


# --------------------------------------------------------------------------- output selection

OUT_A = Tensor("A", Datatype.INT32, (2,), np.array([1, 2], "<i4").tobytes())
OUT_B = Tensor("B", Datatype.FP32, (1,), np.array([0.5], "<f4").tobytes())
OUT_C = Tensor("C", Datatype.INT32, (0,), b"")


def _request(outputs: list[RequestedOutput] | None, **params: Any) -> InferRequest:
    return InferRequest("M", [], outputs=outputs, parameters=params)


def _ro(name: str, **params: Any) -> RequestedOutput:
    return RequestedOutput(name, params)


# (id, request, expected binary flags for A and B)
SELECTION: list[tuple[str, InferRequest, tuple[bool, bool]]] = [
    (
        "listed-binary-true",
        _request([_ro("A", binary_data=True), _ro("B", binary_data=True)]),
        (True, True),
    ),
    (
        "listed-binary-false",
        _request([_ro("A", binary_data=False), _ro("B", binary_data=False)]),
        (False, False),
    ),
    ("listed-no-param", _request([_ro("A"), _ro("B")]), (False, False)),
    ("listed-mixed", _request([_ro("A", binary_data=True), _ro("B")]), (True, False)),
    (
        "listed-false-beats-binary_data_output",
        _request(
            [_ro("A", binary_data=False), _ro("B", binary_data=True)], binary_data_output=True
        ),
        (False, True),
    ),
    (
        "listed-no-param-beats-binary_data_output",
        _request([_ro("A"), _ro("B")], binary_data_output=True),
        (False, False),
    ),
    ("absent-binary_data_output-true", _request(None, binary_data_output=True), (True, True)),
    ("absent-binary_data_output-false", _request(None, binary_data_output=False), (False, False)),
    ("absent-no-params", _request(None), (False, False)),
    (
        "listed-classification-binary",
        _request([_ro("A", classification=2, binary_data=True), _ro("B", classification=1)]),
        (True, False),
    ),
    (
        "listed-shared-memory-is-not-binary",
        _request(
            [
                _ro("A", shared_memory_region="r", shared_memory_byte_size=8),
                _ro("B", binary_data=True),
            ]
        ),
        (False, True),
    ),
]


@pytest.mark.parametrize(("req", "flags"), [pytest.param(r, f, id=i) for i, r, f in SELECTION])
def test_binary_output_rule(req: InferRequest, flags: tuple[bool, bool]) -> None:
    rule = binc.binary_output_rule(req)  # None: no output binary
    assert (rule is not None and rule(OUT_A), rule is not None and rule(OUT_B)) == flags
    assert rule is not None or flags == (False, False)


def test_raw_requests_get_all_outputs_binary() -> None:
    meta = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [-1]}]}
    req = decode_raw_request(b"\0" * 8, "M", "", meta, None, 1024)
    rule = binc.binary_output_rule(req)
    assert rule is not None and rule(OUT_A) and rule(OUT_B) and rule(OUT_C)


def _encode(req: InferRequest, outputs: list[Tensor]) -> tuple[bytes, int | None, dict[str, Any]]:
    chunks, ihcl = binc.encode_response(
        InferResponse("M", outputs, "1"), binc.binary_output_rule(req)
    )
    body = _join(chunks)
    header = json.loads(body if ihcl is None else body[:ihcl])
    return body, ihcl, header


@pytest.mark.parametrize(("req", "flags"), [pytest.param(r, f, id=i) for i, r, f in SELECTION])
def test_encode_response_follows_the_rule(req: InferRequest, flags: tuple[bool, bool]) -> None:
    body, ihcl, header = _encode(req, [OUT_A, OUT_B])
    a, b = header["outputs"]
    for out, flag, tensor in ((a, flags[0], OUT_A), (b, flags[1], OUT_B)):
        if flag:
            assert out["parameters"] == {"binary_data_size": len(tensor.data)}
            assert "data" not in out
        else:
            assert "parameters" not in out
            assert out["data"] == as_numpy(tensor).tolist()
    blobs = b"".join(t.data for t, f in zip((OUT_A, OUT_B), flags, strict=True) if f)
    if any(flags):
        assert ihcl is not None
        assert body[ihcl:] == blobs
    else:
        assert ihcl is None
        assert body == json.dumps(header, separators=(",", ":")).encode()


def test_zero_byte_binary_outputs_carry_size_but_no_ihcl() -> None:
    empty_bytes = Tensor("S", Datatype.BYTES, (0,), b"")
    body, ihcl, header = _encode(_request(None, binary_data_output=True), [OUT_C, empty_bytes])
    assert ihcl is None
    assert [o["parameters"] for o in header["outputs"]] == [{"binary_data_size": 0}] * 2
    assert body == (
        b'{"model_name":"M","model_version":"1","outputs":['
        b'{"name":"C","datatype":"INT32","shape":[0],"parameters":{"binary_data_size":0}},'
        b'{"name":"S","datatype":"BYTES","shape":[0],"parameters":{"binary_data_size":0}}]}'
    )


def test_zero_byte_binary_output_next_to_a_real_one() -> None:
    body, ihcl, header = _encode(_request(None, binary_data_output=True), [OUT_C, OUT_A])
    assert ihcl is not None
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [0, 8]
    assert body[ihcl:] == OUT_A.data


# --------------------------------------------------------------------------- tritonclient


RESPONSE_ARRAYS: list[tuple[str, np.ndarray]] = [
    ("BOOL", np.array([[True, False], [False, True]])),
    ("UINT8", np.array([0, 255], np.uint8)),
    ("UINT16", np.array([0, 65535], np.uint16)),
    ("UINT32", np.array([0, 2**32 - 1], np.uint32)),
    ("UINT64", np.array([0, 2**64 - 1], np.uint64)),
    ("INT8", np.array([-128, 127], np.int8)),
    ("INT16", np.array([-32768, 32767], np.int16)),
    ("INT32", np.arange(-4, 4, dtype=np.int32).reshape(2, 2, 2)),
    ("INT64", np.array([-(2**63), 2**63 - 1], np.int64)),
    ("FP16", np.array([1.5, -65504, np.inf], np.float16)),
    ("FP32", np.array([[3.3, np.nan, -np.inf]], np.float32)),
    ("FP64", np.array([0.1, 1e300, np.nan], np.float64)),
    ("BF16", np.array([1.5, -2.0, 3.140625], ml_dtypes.bfloat16)),
    ("BYTES", np.array([[b"he\x00llo"], [b"x"]], dtype=object)),
    ("EMPTY", np.zeros((3, 0), np.int32)),
]


def _response_tensors() -> list[Tensor]:
    out = []
    for name, array in RESPONSE_ARRAYS:
        datatype = "INT32" if name == "EMPTY" else name
        out.append(from_numpy(name, Datatype(datatype), array))
    return out


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert [bytes(x) if isinstance(x, bytes) else x.encode() for x in got.reshape(-1)] == list(
            want.reshape(-1)
        )
        return
    assert got.dtype == want.dtype
    assert got.tobytes() == want.tobytes() or np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize(
    "rule",
    [lambda _t: True, lambda _t: False, lambda t: t.datatype in (Datatype.FP16, Datatype.BF16)],
    ids=["all-binary", "all-json", "half-binary"],
)
def test_tritonclient_parses_our_responses(rule: Callable[[Tensor], bool]) -> None:
    resp = InferResponse("M", _response_tensors(), "1", id="rid")
    chunks, ihcl = binc.encode_response(resp, rule)
    body = _join(chunks)
    result = httpclient.InferenceServerClient.parse_response_body(body, header_length=ihcl)
    assert result.get_response()["model_name"] == "M"
    assert result.get_response()["id"] == "rid"
    for name, array in RESPONSE_ARRAYS:
        _assert_same(result.as_numpy(name), array)


def test_tritonclient_from_response_body_with_binary() -> None:
    resp = InferResponse("M", _response_tensors(), "1")
    chunks, ihcl = binc.encode_response(resp, lambda _t: True)
    body = _join(chunks)
    result = httpclient.InferResult.from_response_body(body, header_length=ihcl)
    for name, array in RESPONSE_ARRAYS:
        _assert_same(result.as_numpy(name), array)


def test_decode_response_reads_our_binary_and_json_outputs() -> None:
    resp = InferResponse("M", _response_tensors(), "1", id="rid", parameters={"p": 1})
    rule = binc.binary_output_rule(
        _request([_ro(n, binary_data=i % 2 == 0) for i, (n, _a) in enumerate(RESPONSE_ARRAYS)])
    )
    for r in (rule, lambda _t: True):
        chunks, ihcl = binc.encode_response(resp, r)
        back = binc.decode_response(_join(chunks), ihcl)
        assert (back.model_name, back.model_version, back.id) == ("M", "1", "rid")
        assert back.parameters == {"p": 1}
        for t, want in zip(back.outputs, resp.outputs, strict=True):
            assert (t.name, t.datatype, t.shape) == (want.name, want.datatype, want.shape)
            if want.datatype in (Datatype.FP32, Datatype.FP64, Datatype.FP16, Datatype.BF16):
                _assert_same(as_numpy(t), as_numpy(want))
            else:
                assert bytes(t.data) == bytes(want.data)


@pytest.mark.parametrize(
    ("body", "ihcl", "message"),
    [
        (b'{"outputs":[]}', 0, "Inference-Header-Content-Length 0"),
        (b'{"outputs":[]}', 99, "Inference-Header-Content-Length 99"),
        (b"{", None, "failed to parse the response JSON buffer"),
        (b"[]", None, "expected a JSON object"),
        (b'{"outputs":{}}', None, "'outputs' is not an array"),
        (
            b'{"outputs":[{"name":"O","datatype":"INT8","shape":[1],'
            b'"parameters":{"binary_data_size":1}}]}',
            None,
            "output 'O' is binary but the response has no binary section",
        ),
    ],
)
def test_decode_response_errors(body: bytes, ihcl: int | None, message: str) -> None:
    with pytest.raises(CodecError) as info:
        binc.decode_response(body, ihcl)
    assert message in info.value.message


def test_decode_response_binary_is_a_view() -> None:
    head = (
        b'{"outputs":[{"name":"O","datatype":"INT8","shape":[2],'
        b'"parameters":{"binary_data_size":2}}]}'
    )
    body = head + b"\x01\xff"
    (t,) = binc.decode_response(body, len(head)).outputs
    assert isinstance(t.data, memoryview)
    assert t.data.obj is body
    assert as_numpy(t).tolist() == [1, -1]


# --------------------------------------------------------------- the REST backend's /infer body


def _sample_request() -> InferRequest:
    return InferRequest(
        "M",
        [
            from_numpy("I", Datatype.INT64, np.array([[1, -2], [3, 2**62]], np.int64)),
            from_numpy("S", Datatype.BYTES, np.array([b"he\x00llo", b"ok"], dtype=object)),
            from_numpy("F", Datatype.FP32, np.array([np.nan, 1.5], np.float32)),
            from_numpy("Z", Datatype.UINT8, np.zeros((0, 2), np.uint8)),
            from_numpy("B", Datatype.BOOL, np.array([True, False])),
        ],
        outputs=[RequestedOutput("O", {"binary_data": False})],
        id="x",
        parameters={"k": 2},
    )


@pytest.mark.parametrize("binary", [True, False])
def test_infer_body_round_trips(binary: bool) -> None:
    req = _sample_request()
    chunks, ihcl = infer_body(req, binary)
    assert (ihcl is not None) == binary
    back = binc.decode_request(_join(chunks), ihcl, "M")
    assert back.id == "x"
    # a binary body asks every output binary both ways, the request's flag too
    assert back.parameters == ({"k": 2, "binary_data_output": True} if binary else {"k": 2})
    assert back.outputs == [RequestedOutput("O", {"binary_data": binary})]
    for t, want in zip(back.inputs, req.inputs, strict=True):
        assert (t.name, t.datatype, t.shape) == (want.name, want.datatype, want.shape)
        if want.name == "F":
            _assert_same(as_numpy(t), as_numpy(want))
        else:
            assert bytes(t.data) == bytes(want.data)


def test_infer_body_binary_layout() -> None:
    req = _sample_request()
    chunks, ihcl = infer_body(req, True)
    body = _join(chunks)
    assert ihcl is not None
    header = json.loads(body[:ihcl])
    sizes = [i["parameters"]["binary_data_size"] for i in header["inputs"]]
    assert sizes == [32, 4 + 6 + 4 + 2, 8, 0, 2]
    assert all("data" not in i for i in header["inputs"])
    assert body[ihcl:] == b"".join(bytes(t.data) for t in req.inputs)
    # Requests without listed outputs ask for binary outputs.
    req.outputs = None
    chunks, ihcl = infer_body(req, True)
    assert json.loads(_join(chunks)[:ihcl])["parameters"] == {"k": 2, "binary_data_output": True}


def test_tritonclient_decodes_our_binary_request_the_same() -> None:
    # A body built by tritonclient and one built by infer_body decode to the same tensors.
    arrays = [
        ("I", np.array([[1, -2], [3, 4]], np.int64), "INT64"),
        ("B", np.array([True]), "BOOL"),
    ]
    tc_body, tc_size = httpclient.InferenceServerClient.generate_request_body(
        [_tc_input(n, a, d, True) for n, a, d in arrays]
    )
    ours = InferRequest(
        "M",
        [from_numpy(n, Datatype(d), a) for n, a, d in arrays],
        parameters={"binary_data_output": True},
    )
    chunks, ihcl = infer_body(ours, True)
    a = binc.decode_request(tc_body, tc_size, "M")
    b = binc.decode_request(_join(chunks), ihcl, "M")
    assert [(t.name, t.datatype, t.shape, bytes(t.data)) for t in a.inputs] == [
        (t.name, t.datatype, t.shape, bytes(t.data)) for t in b.inputs
    ]
    assert a.parameters == b.parameters == {"binary_data_output": True}
