"""``codecs.json_plain.plain_request``: for every body it takes, the very request the full
decoder builds; None for every other body (the full decoder then decodes or refuses it, with its
own message); and ``decode_request`` takes the lean pass for a whole JSON body."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from v2proxy.codecs import binary as binc
from v2proxy.codecs.json_plain import plain_request
from v2proxy.core.errors import ProxyError
from v2proxy.core.model import InferRequest

LIMIT = 1 << 20
TENSORS = 8


def _body(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=False).encode()  # integers beyond 64 bits too


def _full(body: bytes, limit: int = LIMIT, tensors: int = TENSORS) -> InferRequest | None:
    """The full decoder's request (a memoryview never takes the lean pass); None: refused."""
    try:
        return binc.decode_request(memoryview(body), None, "m", "2", limit, tensors)
    except ProxyError:
        return None


SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [3] * 16},
    ]
}


def _with(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(_body(SIMPLE))
    obj.update(changes)
    return obj


def _input(**changes: Any) -> dict[str, Any]:
    tensor = {"name": "X", "datatype": "FP32", "shape": [2], "data": [1.5, 2]}
    tensor.update(changes)
    return {"inputs": [tensor]}


ACCEPTED = [
    ("simple", SIMPLE),
    ("id and outputs", _with(id="r1", outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT1"}])),
    ("null id", _with(id=None)),
    ("empty id", _with(id="")),
    (
        "binary_data outputs",
        _with(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}]),
    ),
    ("output classification", _with(outputs=[{"name": "O", "parameters": {"classification": 2}}])),
    ("output null parameters", _with(outputs=[{"name": "O", "parameters": None}])),
    ("binary_data_output", _with(parameters={"binary_data_output": True})),
    ("request parameters", _with(parameters={"priority": 1, "timeout": 5})),
    ("null parameters", _with(parameters=None)),
    ("fp32", _input()),
    ("fp64", _input(datatype="FP64")),
    ("fp16", _input(datatype="FP16", data=[1.5, -65504])),
    ("bool", _input(datatype="BOOL", data=[True, False])),
    ("uint64 max", _input(datatype="UINT64", data=[0, 2**64 - 1])),
    ("int8 bounds", _input(datatype="INT8", data=[-128, 127])),
    ("scalar", _input(shape=[], data=[1.0])),
    ("no outputs listed", _with(outputs=[])),
    ("names with r and l", _with(inputs=[dict(SIMPLE["inputs"][0], name="real_label")])),
]

REFUSED = [
    ("not JSON", b"{"),
    ("an array", b"[]"),
    ("NaN literal", b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[NaN]}]}'),
    ("lone surrogate", b'{"inputs":[{"name":"\\ud800","datatype":"INT8","shape":[1],"data":[1]}]}'),
    ("input parameters", _input(parameters={})),
    ("binary input", _input(parameters={"binary_data_size": 8}, data=None)),
    ("triton_ parameter", _with(parameters={"triton_x": 1})),
    ("binary_data_output not a boolean", _with(parameters={"binary_data_output": 1})),
    ("parameters not an object", _with(parameters=[])),
    ("binary_data not a boolean", _with(outputs=[{"name": "O", "parameters": {"binary_data": 1}}])),
    ("output parameters not an object", _with(outputs=[{"name": "O", "parameters": 1}])),
    ("output with another key", _with(outputs=[{"name": "O", "x": 1}])),
    ("output without a name", _with(outputs=[{}])),
    ("outputs not a list", _with(outputs={})),
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
    ("fp16 beyond its range", _input(datatype="FP16", data=[1.0, 70000.0])),
    ("fp32 beyond its range", _input(data=[1.0, 1e300])),
    ("bf16", _input(datatype="BF16")),
    ("bytes", _input(datatype="BYTES", data=["a", "b"])),
    ("negative dimension", _input(shape=[-2], data=[1, 2])),
    ("bool dimension", _input(shape=[True, 2], data=[1, 2])),
    ("count mismatch", _input(shape=[3])),
    ("nested data", _input(shape=[1, 2], data=[[1, 2]])),
    ("zero elements", _input(shape=[0], data=[])),
    ("over the small-array size", _input(datatype="INT8", shape=[300], data=[1] * 300)),
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
    ("too many inputs", {"inputs": [dict(SIMPLE["inputs"][0], name=f"I{i}") for i in range(9)]}),
    ("too many outputs", _with(outputs=[{"name": f"O{i}"} for i in range(9)])),
]


@pytest.mark.parametrize(("case", "obj"), ACCEPTED, ids=[c for c, _ in ACCEPTED])
def test_the_common_shapes_decode_as_the_full_decoder_does(case: str, obj: Any) -> None:
    body = _body(obj)
    got = plain_request(body, "m", "2", LIMIT, TENSORS)
    assert got is not None
    assert got == _full(body)
    assert binc.decode_request(body, None, "m", "2", LIMIT, TENSORS) == got


@pytest.mark.parametrize(("case", "obj"), REFUSED, ids=[c for c, _ in REFUSED])
def test_anything_else_is_the_full_decoders(case: str, obj: Any) -> None:
    body = obj if isinstance(obj, bytes) else _body(obj)
    assert plain_request(body, "m", "2", LIMIT, TENSORS) is None


def test_every_message_stays_the_full_decoders() -> None:
    body = _body(_input(datatype="INT32", data=[1, True]))
    with pytest.raises(ProxyError) as exc:
        binc.decode_request(body, None, "m", "", LIMIT, TENSORS)
    assert str(exc.value) == "Unable to parse 'data' for input 'X': INT32 elements must be integers"


def test_the_limits_are_the_decoders() -> None:
    body = _body(SIMPLE)
    assert plain_request(body, "m", "", len(body), TENSORS) is not None
    assert plain_request(body, "m", "", len(body) - 1, TENSORS) is None  # the JSON's size
    assert plain_request(body, "m", "", LIMIT, 1) is None  # two inputs
    wide = _body({"inputs": [{"name": "X", "datatype": "FP64", "shape": [32], "data": [1] * 32}]})
    assert len(wide) < 32 * 8  # the decoded bytes are over the limit, the JSON is not
    assert plain_request(wide, "m", "", 32 * 8, TENSORS) is not None
    assert plain_request(wide, "m", "", 32 * 8 - 1, TENSORS) is None
    assert _full(wide, 32 * 8 - 1) is None


def test_the_request_owns_what_it_holds() -> None:
    """Each decode makes its own tensors' parameters and its own outputs' (stages change
    them in place)."""
    body = _body(_with(outputs=[{"name": "O", "parameters": {"binary_data": True}}]))
    one = plain_request(body, "m", "", LIMIT, TENSORS)
    two = plain_request(body, "m", "", LIMIT, TENSORS)
    assert one is not None and two is not None and one.outputs and two.outputs
    assert one.inputs[0].parameters is not two.inputs[0].parameters
    one.outputs[0].parameters["x"] = 1
    assert two.outputs[0].parameters == {"binary_data": True}


_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "BOOL": st.booleans(),
    "INT8": st.integers(min_value=-128, max_value=127),
    "INT32": st.integers(min_value=-(2**31), max_value=2**31 - 1),
    "INT64": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "UINT8": st.integers(min_value=0, max_value=255),
    "UINT64": st.integers(min_value=0, max_value=2**64 - 1),
    "FP16": st.floats(width=16, allow_nan=False, allow_infinity=False),
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
_REQUEST_PARAMETERS: list[Any] = [
    {},
    None,
    [],
    {"binary_data_output": True},
    {"binary_data_output": 0},
    {"triton_enable": True},
    {"p": "x"},
]
_MUTATIONS = [
    "element",
    "dimension",
    "bool dimension",
    "count",
    "nest",
    "datatype",
    "name",
    "duplicate",
    "tensor parameters",
    "request parameters",
    "key",
    "output",
    "id",
]


@st.composite
def _requests(draw: st.DrawFn) -> Any:
    """A valid request with up to two of the mutations applied."""
    inputs = []
    for i in range(draw(st.integers(min_value=1, max_value=3))):
        datatype = draw(st.sampled_from(sorted(_VALUES)))
        shape = draw(st.lists(st.integers(min_value=1, max_value=4), max_size=3))
        count = 1
        for d in shape:
            count *= d
        data = draw(st.lists(_VALUES[datatype], min_size=count, max_size=count))
        inputs.append({"name": f"I{i}", "datatype": datatype, "shape": shape, "data": data})
    obj: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        obj["outputs"] = [
            {"name": f"O{i}", "parameters": {"binary_data": draw(st.booleans())}}
            for i in range(draw(st.integers(0, 2)))
        ]
    for mutation in draw(st.lists(st.sampled_from(_MUTATIONS), max_size=2)):
        tensor = draw(st.sampled_from(inputs))
        if not isinstance(tensor.get("data"), list) or not isinstance(tensor.get("shape"), list):
            break  # an earlier mutation took the field away
        if mutation == "element" and tensor["data"]:
            tensor["data"][draw(st.integers(0, len(tensor["data"]) - 1))] = draw(_ODD)
        elif mutation == "dimension":
            tensor["shape"].append(draw(st.integers(min_value=-2, max_value=0)))
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
        elif mutation == "tensor parameters":
            tensor["parameters"] = draw(st.sampled_from([{}, None, {"binary_data": True}]))
        elif mutation == "request parameters":
            obj["parameters"] = draw(st.sampled_from(_REQUEST_PARAMETERS))
        elif mutation == "key":
            del tensor[draw(st.sampled_from(sorted(tensor)))]
        elif mutation == "output":
            obj["outputs"] = [
                {"name": "O"},
                draw(
                    st.sampled_from(
                        [{"name": "O"}, {}, "O", {"name": "P", "parameters": {"binary_data": 1}}]
                    )
                ),
            ]
        else:
            obj["id"] = draw(st.one_of(st.text(max_size=3), st.integers(), st.none()))
    return obj


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_whatever_it_decodes_the_full_decoder_decodes_the_same(obj: Any) -> None:
    body = _body(obj)
    got = plain_request(body, "m", "2", LIMIT, TENSORS)
    if got is not None:
        assert got == _full(body), body
