"""``codecs.relay_check.plain_json_request``: sound against the full decoder (every body it
accepts, the decoder accepts, and no stage applies to it), byte by byte as well as field by
field, and it accepts the common shapes however they are spaced and ordered."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.fake_backend import FakeBackend
from v2proxy.codecs.binary import decode_request
from v2proxy.codecs.relay_check import plain_json_request
from v2proxy.core.errors import ProxyError
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.relay import nothing_to_do

LIMIT = 1 << 20
TENSORS = 8
#: the stages as the pipeline composes them, which ``nothing_to_do`` asks
STAGES = Pipeline(FakeBackend(), LIMIT).stages


def _body(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=False).encode()  # integers beyond 64 bits too


def _decodes(body: bytes, limit: int = LIMIT, tensors: int = TENSORS) -> bool:
    try:
        request = decode_request(bytearray(body), None, "m", "", limit, tensors)
    except ProxyError:
        return False
    return nothing_to_do(request, False, STAGES)


SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
}


def _with(**changes: Any) -> dict[str, Any]:
    obj = orjson.loads(_body(SIMPLE))
    obj.update(changes)
    return obj


def _input(**changes: Any) -> dict[str, Any]:
    tensor = {"name": "X", "datatype": "FP32", "shape": [2], "data": [1.5, 2]}
    tensor.update(changes)
    return {"inputs": [tensor]}


ACCEPTED = [
    ("simple", SIMPLE),
    ("id and outputs", _with(id="r1", outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT1"}])),
    ("fp32", _input()),
    ("fp64", _input(datatype="FP64")),
    ("bool", _input(datatype="BOOL", data=[True, False])),
    ("uint64 max", _input(datatype="UINT64", data=[0, 2**64 - 1])),
    ("int8 bounds", _input(datatype="INT8", data=[-128, 127])),
    ("scalar", _input(shape=[], data=[1.0])),
    ("no outputs list", _with(outputs=[])),
    # a body with a byte of "true" or "false" ("r", "l") takes the element kinds' full look
    ("names with r and l", _with(inputs=[dict(SIMPLE["inputs"][0], name="real_label")])),
    ("spaced and indented", json.loads(json.dumps(SIMPLE, indent=2))),
    (
        "data before datatype",
        {"inputs": [{"data": [1, 2], "shape": [2], "datatype": "INT8", "name": "X"}]},
    ),
    ("id and outputs null", _with(id=None, outputs=None)),
    ("exponents", _input(data=[1e-5, -2.5e30])),
    ("negative and zero", _input(datatype="INT64", data=[-(2**63), -0])),
    ("uint8 top", _input(datatype="UINT8", data=[0, 255])),
    ("a name in UTF-8", json.dumps(_input(name="température"), ensure_ascii=False).encode()),
    ("fp32 integer beyond 64 bits", _input(data=[2**70, -(2**70)])),
    (
        "fp32 beside bool",
        {
            "inputs": [
                _input()["inputs"][0],
                _input(name="B", datatype="BOOL", data=[True, False])["inputs"][0],
            ]
        },
    ),
]

REFUSED = [
    ("not JSON", b"{"),
    ("trailing bytes", _body(SIMPLE) + b" x"),
    ("two documents", _body(SIMPLE) * 2),
    ("trailing comma", b'{"inputs":[{"name":"X","datatype":"INT8","shape":[2],"data":[1,2,]}]}'),
    ("leading zero", b'{"inputs":[{"name":"X","datatype":"INT8","shape":[2],"data":[01,2]}]}'),
    ("plus sign", b'{"inputs":[{"name":"X","datatype":"INT8","shape":[2],"data":[+1,2]}]}'),
    ("bare minus", b'{"inputs":[{"name":"X","datatype":"INT8","shape":[2],"data":[-,2]}]}'),
    (
        "space in a number",
        b'{"inputs":[{"name":"X","datatype":"INT8","shape":[2],"data":[1 2,3]}]}',
    ),
    (
        "dot without digits",
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[2],"data":[1.,2]}]}',
    ),
    (
        "exponent without digits",
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1e]}]}',
    ),
    ("fp64 overflow", b'{"inputs":[{"name":"X","datatype":"FP64","shape":[1],"data":[1e400]}]}'),
    ("fp32 overflow", _input(data=[3.5e38, 1.0])),
    (
        "Infinity literal",
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[Infinity]}]}',
    ),
    ("negative unsigned", _input(datatype="UINT8", data=[1, -1])),
    ("uint64 beyond", _input(datatype="UINT64", data=[1, 2**64])),
    ("int64 below", _input(datatype="INT64", data=[1, -(2**63) - 1])),
    ("a bracket in a string", _input(data=["]", 1])),
    (
        "duplicate key",
        b'{"inputs":[{"name":"X","name":"Y","datatype":"INT8","shape":[1],"data":[1]}]}',
    ),
    ("duplicate inputs key", b'{"inputs":[],"inputs":[]}'),
    ("an escaped key", b'{"inputs":[{"n\\u0061me":"X","datatype":"INT8","shape":[1],"data":[1]}]}'),
    (
        "an escape in a name",
        b'{"inputs":[{"name":"X\\n","datatype":"INT8","shape":[1],"data":[1]}]}',
    ),
    (
        "a control byte in a name",
        b'{"inputs":[{"name":"X\x01","datatype":"INT8","shape":[1],"data":[1]}]}',
    ),
    ("a name not UTF-8", b'{"inputs":[{"name":"X\xff","datatype":"INT8","shape":[1],"data":[1]}]}'),
    ("an unclosed string", b'{"inputs":[{"name":"X'),
    ("an unclosed list", b'{"inputs":[{"name":"X","datatype":"INT8","shape":[1],"data":[1'),
    ("an array", b"[]"),
    ("NaN literal", b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[NaN]}]}'),
    ("request parameters", _with(parameters={})),
    ("binary_data_output", _with(parameters={"binary_data_output": True})),
    ("input parameters", _input(parameters={"shared_memory_region": "r"})),
    ("output parameters", _with(outputs=[{"name": "O", "parameters": {"classification": 2}}])),
    ("unknown key", _with(extra=1)),
    ("id not a string", _with(id=3)),
    ("no inputs", {"outputs": []}),
    ("empty inputs", {"inputs": []}),
    ("inputs not a list", {"inputs": {}}),
    ("duplicate input", {"inputs": [SIMPLE["inputs"][0], SIMPLE["inputs"][0]]}),
    ("duplicate output", _with(outputs=[{"name": "O"}, {"name": "O"}])),
    ("output not an object", _with(outputs=["O"])),
    ("name not a string", _input(name=1)),
    ("unknown datatype", _input(datatype="FP8")),
    ("fp16", _input(datatype="FP16")),
    ("bf16", _input(datatype="BF16")),
    ("bytes", _input(datatype="BYTES", data=["a", "b"])),
    ("negative dimension", _input(shape=[-2], data=[1, 2])),
    ("bool dimension", _input(shape=[True, 2], data=[1, 2])),
    ("count mismatch", _input(shape=[3])),
    ("nested data", _input(shape=[1, 2], data=[[1, 2]])),
    ("zero elements", _input(shape=[0], data=[])),
    ("int out of range", _input(datatype="INT8", data=[1, 128])),
    ("float in int", _input(datatype="INT32", data=[1, 2.5])),
    ("bool in int", _input(datatype="INT32", data=[1, True])),
    ("bool in float", _input(data=[1.0, False])),
    ("int in bool", _input(datatype="BOOL", data=[1, 0])),
    ("string in float", _input(data=["1", 2])),
    ("null data", _input(data=None)),
    ("input a list of four", {"inputs": [[1, 2, 3, 4]]}),
    ("input a string of four", {"inputs": ["abcd"]}),
    ("datatype an array", _input(datatype=["FP32"])),
    ("shape a string", _input(shape="", data=[1.5])),
    ("data a string", _input(datatype="INT8", data="12")),
    ("bool in int beside an r", _input(name="r", datatype="INT32", data=[1, True])),
    ("false in float", _input(data=[1.0, False])),
    ("too many inputs", {"inputs": [dict(SIMPLE["inputs"][0], name=f"I{i}") for i in range(9)]}),
    ("too many outputs", _with(outputs=[{"name": f"O{i}"} for i in range(9)])),
]


@pytest.mark.parametrize(("case", "obj"), ACCEPTED, ids=[c for c, _ in ACCEPTED])
def test_the_common_shapes_are_accepted(case: str, obj: Any) -> None:
    body = obj if isinstance(obj, bytes) else _body(obj)
    assert plain_json_request(body, LIMIT, TENSORS) is True
    assert _decodes(body)


@pytest.mark.parametrize(("case", "obj"), REFUSED, ids=[c for c, _ in REFUSED])
def test_anything_else_takes_the_full_path(case: str, obj: Any) -> None:
    body = obj if isinstance(obj, bytes) else _body(obj)
    assert plain_json_request(body, LIMIT, TENSORS) is False


def test_the_limits_are_the_decoders() -> None:
    body = _body(SIMPLE)
    assert plain_json_request(body, len(body), TENSORS) is True
    assert plain_json_request(body, len(body) - 1, TENSORS) is False  # the JSON's size
    assert plain_json_request(body, LIMIT, 1) is False  # two inputs
    decoded = 2 * 16 * 4
    small = {"inputs": [dict(SIMPLE["inputs"][0], datatype="INT8", data=[1] * 16)]}
    assert plain_json_request(_body(small), 16, TENSORS) is False  # the JSON is over 16 bytes
    assert decoded > 16
    wide = _body({"inputs": [{"name": "X", "datatype": "FP64", "shape": [32], "data": [1] * 32}]})
    assert len(wide) < 32 * 8  # the decoded bytes are over the limit, the JSON is not
    assert plain_json_request(wide, 32 * 8, TENSORS) is True
    assert plain_json_request(wide, 32 * 8 - 1, TENSORS) is False
    assert not _decodes(wide, 32 * 8 - 1)


_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "BOOL": st.booleans(),
    "INT8": st.integers(min_value=-128, max_value=127),
    "INT32": st.integers(min_value=-(2**31), max_value=2**31 - 1),
    "INT64": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "UINT8": st.integers(min_value=0, max_value=255),
    "UINT64": st.integers(min_value=0, max_value=2**64 - 1),
    "FP32": st.one_of(
        st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False)
    ),
    "FP64": st.floats(allow_nan=False, allow_infinity=False),
}
_ODD = st.one_of(
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
    st.just([1]),
)
_MUTATIONS = [
    "element",
    "dimension",
    "negative pair",
    "bool dimension",
    "count",
    "nest",
    "datatype",
    "name",
    "duplicate",
    "parameters",
    "key",
    "output",
    "id",
]


def _tensor(draw: st.DrawFn, i: int, values: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """Input ``I{i}`` of one of ``values``' datatypes, with as many elements as its shape holds."""
    datatype = draw(st.sampled_from(sorted(values)))
    shape = draw(st.lists(st.integers(min_value=1, max_value=4), max_size=3))
    count = math.prod(shape)
    data = draw(st.lists(values[datatype], min_size=count, max_size=count))
    return {"name": f"I{i}", "datatype": datatype, "shape": shape, "data": data}


@st.composite
def _requests(draw: st.DrawFn) -> Any:
    """A valid request with up to two of the mutations applied."""
    inputs = [_tensor(draw, i, _VALUES) for i in range(draw(st.integers(1, 3)))]
    obj: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        obj["outputs"] = [{"name": f"O{i}"} for i in range(draw(st.integers(0, 2)))]
    for mutation in draw(st.lists(st.sampled_from(_MUTATIONS), max_size=2)):
        tensor = draw(st.sampled_from(inputs))
        if not isinstance(tensor.get("data"), list) or not isinstance(tensor.get("shape"), list):
            break  # an earlier mutation took the field away
        if mutation == "element" and tensor["data"]:
            tensor["data"][draw(st.integers(0, len(tensor["data"]) - 1))] = draw(_ODD)
        elif mutation == "dimension":
            tensor["shape"].append(draw(st.integers(min_value=-2, max_value=0)))
        elif mutation == "negative pair":
            tensor["shape"].extend([-1, -1])
        elif mutation == "bool dimension":
            tensor["shape"].append(True)
        elif mutation == "count":
            tensor["data"].append(1)
        elif mutation == "nest":
            tensor["data"] = [tensor["data"]]
        elif mutation == "datatype":
            tensor["datatype"] = draw(st.sampled_from(["FP16", "BF16", "BYTES", "INT16", "X"]))
        elif mutation == "name":
            tensor["name"] = draw(st.one_of(st.integers(), st.none(), st.just("")))
        elif mutation == "duplicate":
            inputs.append(dict(tensor))
        elif mutation == "parameters":
            tensor["parameters"] = draw(st.sampled_from([{}, None, {"binary_data": True}]))
        elif mutation == "key":
            del tensor[draw(st.sampled_from(sorted(tensor)))]
        elif mutation == "output":
            obj["outputs"] = [{"name": "O"}, draw(st.sampled_from([{"name": "O"}, {}, "O"]))]
        else:
            obj["id"] = draw(st.one_of(st.text(max_size=3), st.integers(), st.none()))
    return obj


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_whatever_it_accepts_the_decoder_accepts_and_relays(obj: Any) -> None:
    body = _body(obj)
    if plain_json_request(body, LIMIT, TENSORS):
        assert _decodes(body), body


#: the bytes that move a JSON text between shapes, kinds and ranges
_EDITS = b' \t\n,:[]{}"-+.eE0123456789truefalsnl\\\x00\x1f\x7f\xc3\xa9\xff'


@st.composite
def _edited(draw: st.DrawFn) -> bytes:
    """A valid body, spaced one way or another, with up to three bytes inserted, replaced or
    deleted."""
    obj = draw(_plain_requests())
    body = bytearray(_text(obj, draw(st.sampled_from(_SPACINGS))))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(body) - 1))
        byte = draw(st.sampled_from(_EDITS))
        edit = draw(st.sampled_from(["insert", "replace", "delete"]))
        if edit == "insert":
            body.insert(at, byte)
        elif edit == "replace":
            body[at] = byte
        else:
            del body[at]
    return bytes(body)


_SPACINGS = [None, (",", ":"), (", ", ": "), 2]


def _text(obj: Any, spacing: Any) -> bytes:
    if isinstance(spacing, int):
        return json.dumps(obj, indent=spacing, ensure_ascii=False).encode()
    return json.dumps(obj, separators=spacing, ensure_ascii=False).encode()


#: FP32 within its range, which the check holds it to
_PLAIN_VALUES = {**_VALUES, "FP32": st.floats(-3.0e38, 3.0e38) | st.integers(-(2**70), 2**70)}


@st.composite
def _plain_requests(draw: st.DrawFn) -> Any:
    """A request of the plain shape with its keys in any order."""
    inputs = []
    for i in range(draw(st.integers(1, 3))):
        fields = list(_tensor(draw, i, _PLAIN_VALUES).items())
        inputs.append(dict(draw(st.permutations(fields))))
    obj: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        obj["outputs"] = [{"name": f"O{i}"} for i in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()):
        # (what JSON spells with an escape is refused: see test_anything_else_takes_the_full_path)
        obj["id"] = draw(
            st.text(max_size=4).filter(lambda t: t.isprintable() and '"' not in t and "\\" not in t)
        )
    return obj


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_plain_requests(), st.sampled_from(_SPACINGS))
def test_every_plain_request_is_accepted(obj: Any, spacing: Any) -> None:
    body = _text(obj, spacing)
    assert plain_json_request(body, LIMIT, TENSORS) is True, body
    assert _decodes(body), body


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_edited())
def test_a_body_edited_byte_by_byte_is_accepted_only_if_the_decoder_accepts_it(
    body: bytes,
) -> None:
    if plain_json_request(body, LIMIT, TENSORS):
        assert _decodes(body), body
