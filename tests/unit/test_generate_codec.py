"""The generate extension's codec (v2proxy.codecs.generate) as tables, both ways: generate
bodies -> InferRequest (inputs by name, shapes fitted to the model's dims, parameters, id) and
their errors named by field with Triton's texts where Triton's are known; InferResponse ->
the generate answer (Triton's bytes); SSE framing and parsing."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from v2proxy.codecs import generate as gc
from v2proxy.codecs.dtypes import as_numpy, deserialize_bytes, serialize_bytes
from v2proxy.core.errors import CodecError
from v2proxy.core.model import Datatype, InferResponse, Tensor
from v2proxy.reference.models import MODELS

LLM = MODELS["llm"].metadata()
SIMPLE = MODELS["simple"].metadata()
IDENTITY = MODELS["simple_identity"].metadata()
FP32_ID = MODELS["identity_fp32"].metadata()
BOOL, INT32, FP32, UINT64, BYTES = (
    Datatype.BOOL,
    Datatype.INT32,
    Datatype.FP32,
    Datatype.UINT64,
    Datatype.BYTES,
)


def _nested(depth: int) -> Any:
    value: Any = "a"
    for _ in range(depth):
        value = [value]
    return value


def _values(t: Tensor) -> list[Any]:
    if t.datatype is BYTES:
        return [e.decode() for e in deserialize_bytes(t.data)]
    return [v.item() for v in as_numpy(t).reshape(-1)]


# (id, metadata, body, {input: (datatype, shape, values)}, parameters, request id)
DECODE: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], Any]] = [
    (
        "llm-scalars",
        LLM,
        {"text_input": "hello world", "max_tokens": 3, "stream": True},
        {
            "text_input": (BYTES, (1,), ["hello world"]),
            "max_tokens": (INT32, (1,), [3]),
            "stream": (BOOL, (1,), [True]),
        },
        {},
        None,
    ),
    (
        "llm-arrays-of-one",
        LLM,
        {"text_input": ["a b"], "max_tokens": [[2]]},
        {"text_input": (BYTES, (1,), ["a b"]), "max_tokens": (INT32, (1,), [2])},
        {},
        None,
    ),
    (
        "knobs-take-their-types",
        LLM,
        {"text_input": "x", "temperature": 1, "top_p": 0.5, "seed": 18446744073709551615},
        {
            "text_input": (BYTES, (1,), ["x"]),
            "temperature": (FP32, (1,), [1.0]),
            "top_p": (FP32, (1,), [0.5]),
            "seed": (UINT64, (1,), [18446744073709551615]),
        },
        {},
        None,
    ),
    (
        "inputs-inside-parameters",
        LLM,
        {"text_input": "x", "parameters": {"max_tokens": 2, "foo": "bar"}},
        {"text_input": (BYTES, (1,), ["x"]), "max_tokens": (INT32, (1,), [2])},
        {"foo": "bar"},
        None,
    ),
    (
        "other-keys-are-parameters",
        LLM,
        {"text_input": "x", "bogus": 1, "f": 1.5, "b": True, "s": "v"},
        {"text_input": (BYTES, (1,), ["x"])},
        {"bogus": 1, "f": 1.5, "b": True, "s": "v"},
        None,
    ),
    (
        "reserved-parameters-dropped",
        LLM,
        {"text_input": "x", "priority": 1, "timeout": 5, "triton_x": 1, "sequence_id": 3},
        {"text_input": (BYTES, (1,), ["x"])},
        {},
        None,
    ),
    ("id", LLM, {"id": "abc", "text_input": "x"}, {"text_input": (BYTES, (1,), ["x"])}, {}, "abc"),
    ("empty-id", LLM, {"id": "", "text_input": "x"}, {"text_input": (BYTES, (1,), ["x"])}, {}, 0),
    (
        "batch-dim-fitted",
        SIMPLE,
        {"INPUT0": list(range(16)), "INPUT1": [[1] * 16]},
        {"INPUT0": (INT32, (1, 16), list(range(16))), "INPUT1": (INT32, (1, 16), [1] * 16)},
        {},
        None,
    ),
    (
        "wildcards-take-the-count",
        IDENTITY,
        {"INPUT0": ["a", "b", "c"]},
        {"INPUT0": (BYTES, (1, 3), ["a", "b", "c"])},
        {},
        None,
    ),
    ("scalar-in-wildcard", IDENTITY, {"INPUT0": "a"}, {"INPUT0": (BYTES, (1, 1), ["a"])}, {}, 0),
    ("empty-array", FP32_ID, {"INPUT0": []}, {"INPUT0": (FP32, (0,), [])}, {}, None),
    ("floats", FP32_ID, {"INPUT0": [1.5, 2]}, {"INPUT0": (FP32, (2,), [1.5, 2.0])}, {}, None),
    ("no-keys", LLM, {}, {}, {}, None),
]


@pytest.mark.parametrize(
    ("metadata", "body", "inputs", "params", "rid"),
    [c[1:] for c in DECODE],
    ids=[c[0] for c in DECODE],
)
def test_decode(
    metadata: dict[str, Any],
    body: dict[str, Any],
    inputs: dict[str, Any],
    params: dict[str, Any],
    rid: Any,
) -> None:
    req = gc.request_from_generate(body, metadata["name"], "", metadata)
    assert req.model_name == metadata["name"]
    assert req.model_version == ""
    assert [t.name for t in req.inputs] == list(inputs)
    for t in req.inputs:
        datatype, shape, values = inputs[t.name]
        assert (t.datatype, t.shape) == (datatype, shape)
        assert _values(t) == values
    assert req.parameters == params
    assert req.id == (rid or None)
    assert req.outputs is None


def test_decode_keeps_version() -> None:
    req = gc.request_from_generate({"text_input": "x"}, "llm", "1", LLM)
    assert req.model_version == "1"


_PARAM_TYPE = "It should be either 'int', 'bool', or 'string'."
# (id, metadata, body, message)
ERRORS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "shape-too-many",
        LLM,
        {"text_input": "a", "max_tokens": [2, 3]},
        "The schema can not convert input 'max_tokens' to tensor with proper shape",
    ),
    (
        "shape-fixed-dims",
        SIMPLE,
        {"INPUT0": [1, 2, 3], "INPUT1": [1, 2, 3]},
        "The schema can not convert input 'INPUT0' to tensor with proper shape",
    ),
    (
        "shape-scalar-for-16",
        SIMPLE,
        {"INPUT0": 1},
        "The schema can not convert input 'INPUT0' to tensor with proper shape",
    ),
    (
        "bytes-not-string",
        LLM,
        {"text_input": 5},
        "Unable to parse 'data' for input 'text_input': BYTES elements must be strings",
    ),
    (
        "int-as-string",
        LLM,
        {"text_input": "a", "max_tokens": "3"},
        "Unable to parse 'data' for input 'max_tokens': INT32 elements must be integers",
    ),
    (
        "int-as-float",
        LLM,
        {"text_input": "a", "max_tokens": 2.5},
        "Unable to parse 'data' for input 'max_tokens': INT32 elements must be integers",
    ),
    (
        "int-as-bool",
        LLM,
        {"text_input": "a", "max_tokens": True},
        "Unable to parse 'data' for input 'max_tokens': INT32 elements must be integers",
    ),
    (
        "int-null",
        LLM,
        {"text_input": "a", "max_tokens": None},
        "Unable to parse 'data' for input 'max_tokens': INT32 elements must be integers",
    ),
    (
        "int-object",
        LLM,
        {"text_input": "a", "max_tokens": {"x": 1}},
        "Unable to parse 'data' for input 'max_tokens': INT32 elements must be integers",
    ),
    (
        "bool-as-int",
        LLM,
        {"text_input": "a", "stream": 1},
        "Unable to parse 'data' for input 'stream': BOOL elements must be true or false",
    ),
    (
        "float-as-string",
        LLM,
        {"text_input": "a", "temperature": "x"},
        "Unable to parse 'data' for input 'temperature': FP32 elements must be numbers",
    ),
    (
        "uint-negative",
        LLM,
        {"text_input": "a", "seed": -1},
        "Unable to parse 'data' for input 'seed': value out of range for UINT64",
    ),
    (
        "int-out-of-range",
        LLM,
        {"text_input": "a", "max_tokens": 3000000000},
        "Unable to parse 'data' for input 'max_tokens': value out of range for INT32",
    ),
    (
        "id-not-string",
        LLM,
        {"text_input": "a", "id": 5},
        "Unable to parse 'id': attempt to access JSON non-string as string",
    ),
    (
        "parameters-not-object",
        LLM,
        {"text_input": "a", "parameters": 5},
        "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as"
        " object",
    ),
    (
        "parameter-array",
        LLM,
        {"text_input": "a", "bogus": [1, 2]},
        f"parameter 'bogus' has invalid type. {_PARAM_TYPE}",
    ),
    (
        "parameter-null",
        LLM,
        {"text_input": "a", "bogus": None},
        f"parameter 'bogus' has invalid type. {_PARAM_TYPE}",
    ),
    (
        "nested-parameter-object",
        LLM,
        {"text_input": "a", "parameters": {"x": {"y": 1}}},
        f"Converting keyword: 'parameters': parameter 'x' has invalid type. {_PARAM_TYPE}",
    ),
    (
        "input-twice",
        LLM,
        {"text_input": "a", "parameters": {"text_input": "b c"}},
        "Converting keyword: 'parameters': input 'text_input' already exists in request",
    ),
    (
        "too-deep",
        IDENTITY,
        {"INPUT0": _nested(34)},
        "input 'INPUT0' is nested deeper than 32 arrays",
    ),
]


@pytest.mark.parametrize(
    ("metadata", "body", "message"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS]
)
def test_decode_errors(metadata: dict[str, Any], body: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError) as err:
        gc.request_from_generate(body, metadata["name"], "", metadata)
    assert err.value.message == message
    assert err.value.http_status == 400


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "failed to parse the request JSON buffer: "),
        (b"", "failed to parse the request JSON buffer: "),
        (b"[1, 2]", "the generate request must be a JSON object"),
        (b'"text"', "the generate request must be a JSON object"),
        (b"null", "the generate request must be a JSON object"),
    ],
    ids=["not-json", "empty", "array", "string", "null"],
)
def test_parse_body_errors(body: bytes, message: str) -> None:
    with pytest.raises(CodecError) as err:
        gc.parse_body(body)
    assert err.value.message.startswith(message)


def test_parse_body() -> None:
    assert gc.parse_body(b'{"text_input": "x", "n": 1}') == {"text_input": "x", "n": 1}


# (id, dims, count, shape or None)
FIT: list[tuple[str, tuple[int, ...], int, tuple[int, ...] | None]] = [
    ("fixed", (1,), 1, (1,)),
    ("fixed-mismatch", (1,), 2, None),
    ("fixed-2d", (2, 3), 6, (2, 3)),
    ("wild", (-1,), 5, (5,)),
    ("wild-zero", (-1,), 0, (0,)),
    ("batch", (-1, 16), 16, (1, 16)),
    ("batch-two", (-1, 16), 32, (2, 16)),
    ("batch-bad", (-1, 16), 17, None),
    ("two-wild", (-1, -1), 3, (1, 3)),
    ("wild-one", (-1, 1), 1, (1, 1)),
    ("scalar-dims", (), 1, ()),
    ("scalar-dims-bad", (), 2, None),
    ("zero-dim", (-1, 0), 0, (1, 0)),
    ("zero-dim-bad", (-1, 0), 1, None),
]


@pytest.mark.parametrize(("dims", "count", "shape"), [c[1:] for c in FIT], ids=[c[0] for c in FIT])
def test_fit_shape(dims: tuple[int, ...], count: int, shape: tuple[int, ...] | None) -> None:
    assert gc.fit_shape(dims, count) == shape


def _bytes(name: str, shape: tuple[int, ...], *values: bytes) -> Tensor:
    return Tensor(name, BYTES, shape, serialize_bytes(list(values)))


def _num(name: str, datatype: Datatype, values: list[Any], npdt: str) -> Tensor:
    arr = np.array(values, dtype=npdt)
    return Tensor(name, datatype, arr.shape, arr.tobytes())


# (id, response, the answer's exact bytes, as Triton writes them)
ENCODE: list[tuple[str, InferResponse, bytes]] = [
    (
        "llm-text",
        InferResponse("llm", [_bytes("text_output", (1,), b"hello")], "1"),
        b'{"model_name":"llm","model_version":"1","text_output":"hello"}',
    ),
    (
        "id-first",
        InferResponse("llm", [_bytes("text_output", (1,), b"a")], "1", id="abc"),
        b'{"id":"abc","model_name":"llm","model_version":"1","text_output":"a"}',
    ),
    (
        "arrays-sorted-keys",
        InferResponse(
            "simple",
            [_num("OUTPUT0", INT32, [[1, 2]], "<i4"), _num("OUTPUT1", INT32, [[0, 0]], "<i4")],
            "1",
        ),
        b'{"OUTPUT0":[1,2],"OUTPUT1":[0,0],"model_name":"simple","model_version":"1"}',
    ),
    (
        "fp32-widened",
        InferResponse("m", [_num("O", FP32, [1.5, 2.0, 3.3], "<f4")], "1"),
        b'{"O":[1.5,2.0,3.299999952316284],"model_name":"m","model_version":"1"}',
    ),
    (
        "one-element-2d-is-scalar",
        InferResponse("m", [_num("O", FP32, [[0.1]], "<f4")], "1"),
        b'{"O":0.10000000149011612,"model_name":"m","model_version":"1"}',
    ),
    (
        "empty-array",
        InferResponse("m", [_num("O", FP32, [], "<f4")], "1"),
        b'{"O":[],"model_name":"m","model_version":"1"}',
    ),
    (
        "bytes-array",
        InferResponse("m", [_bytes("O", (1, 2), b"a", b"\xe4\xb8\xad")], "1"),
        '{"O":["a","中"],"model_name":"m","model_version":"1"}'.encode(),
    ),
    (
        "bytes-not-utf8-replaced",
        InferResponse("m", [_bytes("O", (1,), b"\xff")], "1"),
        '{"O":"\ufffd","model_name":"m","model_version":"1"}'.encode(),
    ),
    (
        "bool-scalar",
        InferResponse("m", [_num("O", BOOL, [True], "?")], "1"),
        b'{"O":true,"model_name":"m","model_version":"1"}',
    ),
    (
        "uint64-exact",
        InferResponse("m", [_num("O", UINT64, [18446744073709551615], "<u8")], "1"),
        b'{"O":18446744073709551615,"model_name":"m","model_version":"1"}',
    ),
    (
        "non-finite",
        InferResponse("m", [_num("O", FP32, [float("nan"), float("inf")], "<f4")], "1"),
        b'{"O":[NaN,Infinity],"model_name":"m","model_version":"1"}',
    ),
    (
        "response-parameters",
        InferResponse("m", [_bytes("O", (1,), b"x")], "1", parameters={"finish": "length"}),
        b'{"O":"x","finish":"length","model_name":"m","model_version":"1"}',
    ),
]


@pytest.mark.parametrize(("resp", "expected"), [c[1:] for c in ENCODE], ids=[c[0] for c in ENCODE])
def test_encode(resp: InferResponse, expected: bytes) -> None:
    assert gc.encode(gc.response_to_generate(resp)) == expected


@pytest.mark.parametrize(
    "body",
    [
        {"text_input": "héllo 中文", "max_tokens": 7, "stream": False, "temperature": 0.5},
        {"text_input": ["a"], "seed": 18446744073709551615, "top_k": -3},
    ],
    ids=["scalars", "array-of-one"],
)
def test_round_trip(body: dict[str, Any]) -> None:
    """A generate body's inputs, answered back as outputs, give the body's values back."""
    req = gc.request_from_generate(body, "llm", "", LLM)
    answer = orjson.loads(gc.encode(gc.response_to_generate(InferResponse("llm", req.inputs))))
    for key, value in body.items():
        expected = value[0] if isinstance(value, list) else value
        assert answer[key] == expected, key


def test_sse_event() -> None:
    event = gc.sse_event({"text_output": "a", "model_name": "llm"})
    assert event == b'data: {"model_name":"llm","text_output":"a"}\n\n'
    assert gc.error_event("bad") == b'data: {"error":"bad"}\n\n'


# (id, chunks, events)
PARSE: list[tuple[str, list[bytes], list[Any]]] = [
    ("two", [b'data: {"a":1}\n\ndata: {"a":2}\n\n'], [{"a": 1}, {"a": 2}]),
    ("split", [b"da", b'ta: {"a"', b":1}\n", b'\ndata: {"b":2}\n\n'], [{"a": 1}, {"b": 2}]),
    ("crlf", [b'data: {"a":1}\r\n\r\ndata: {"a":2}\r', b"\n\r\n"], [{"a": 1}, {"a": 2}]),
    ("no-space", [b'data:{"a":1}\n\n'], [{"a": 1}]),
    ("comments-and-fields", [b': hi\nevent: x\ndata: {"a":1}\n\n: ping\n\n'], [{"a": 1}]),
    ("multi-line-data", [b'data: {"a":\ndata: 1}\n\n'], [{"a": 1}]),
    ("unterminated-last", [b'data: {"a":1}\n\ndata: {"a":2}'], [{"a": 1}, {"a": 2}]),
]


@pytest.mark.parametrize(("chunks", "events"), [c[1:] for c in PARSE], ids=[c[0] for c in PARSE])
def test_sse_parser(chunks: list[bytes], events: list[Any]) -> None:
    parser = gc.SseParser()
    got: list[Any] = []
    for chunk in chunks:
        got += parser.feed(chunk)
    got += parser.close()
    assert got == events


def test_sse_parser_byte_by_byte() -> None:
    stream = b"".join(gc.sse_event({"i": i, "t": "x" * i}) for i in range(5))
    parser = gc.SseParser()
    got = [e for i in range(len(stream)) for e in parser.feed(stream[i : i + 1])]
    assert got == [{"i": i, "t": "x" * i} for i in range(5)]
    assert parser.close() == []


def test_sse_parser_not_json() -> None:
    with pytest.raises(CodecError):
        gc.SseParser().feed(b"data: {nope\n\n")


def test_model_inputs_skips_malformed_entries() -> None:
    metadata = {
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [1]},
            {"name": "b", "datatype": "NOPE", "shape": [1]},
            {"name": "c", "datatype": "FP32", "shape": "x"},
            {"name": 5, "datatype": "FP32", "shape": [1]},
            "junk",
        ]
    }
    assert gc.model_inputs(metadata) == {"a": (FP32, (1,))}


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_KNOBS = st.fixed_dictionaries(
    {"text_input": _TEXT},
    optional={
        "max_tokens": st.integers(-(2**31), 2**31 - 1),
        "stream": st.booleans(),
        "exclude_input_in_output": st.booleans(),
        "temperature": st.floats(allow_nan=False, allow_infinity=False, width=32),
        "top_k": st.integers(-(2**31), 2**31 - 1),
        "seed": st.integers(0, 2**64 - 1),
        "id": _TEXT,
    },
)


@given(_KNOBS, st.booleans())
def test_round_trip_property(body: dict[str, Any], nest: bool) -> None:
    """Any llm body decodes, and its inputs answered as outputs give its values back (as
    scalars, whether sent bare or in an array of one)."""
    sent = {k: ([v] if nest and k != "id" else v) for k, v in body.items()}
    req = gc.request_from_generate(sent, "llm", "", LLM)
    resp = InferResponse("llm", req.inputs, "1", id=req.id)
    answer = orjson.loads(gc.encode(gc.response_to_generate(resp)))
    for key, value in body.items():
        if key == "id":
            assert answer.get("id") == (value or None)
        else:
            assert answer[key] == value, key
