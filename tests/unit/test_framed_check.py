"""``codecs.framed_check.plain_framed_request``: sound against the full decoder (every
binary-framed body it accepts, the decoder accepts, and no stage applies to it), and it accepts
what binary-tensor clients send (tritonclient's own request bodies)."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.fake_backend import FakeBackend
from v2proxy.codecs.binary import decode_request
from v2proxy.codecs.framed_check import plain_framed_request
from v2proxy.core.errors import ProxyError
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.relay import nothing_to_do

LIMIT = 1 << 20
TENSORS = 8
STAGES = Pipeline(FakeBackend(), LIMIT).stages
_ITEM = {"BOOL": 1, "INT8": 1, "UINT16": 2, "INT32": 4, "FP16": 2, "BF16": 2, "FP32": 4, "FP64": 8}


def _framed(header: Any, section: bytes) -> tuple[bytes, int]:
    head = json.dumps(header, allow_nan=False).encode()
    return head + section, len(head)


def _decodes(body: bytes, ihcl: int, limit: int = LIMIT, tensors: int = TENSORS) -> bool:
    try:
        request = decode_request(bytearray(body), ihcl, "m", "", limit, tensors)
    except ProxyError:
        return False
    return nothing_to_do(request, True, STAGES)


def _input(name: str = "X", datatype: str = "FP32", shape: Any = (2,), size: Any = 8) -> Any:
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(shape),
        "parameters": {"binary_data_size": size},
    }


def _tritonclient(binary_output: bool | None) -> tuple[bytes, int]:
    a = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    a.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16), binary_data=True)
    b = httpclient.InferInput("INPUT1", [3], "FP16")
    b.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float16), binary_data=True)
    outputs = None
    if binary_output is not None:
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output)]
    body, ihcl = httpclient.InferenceServerClient.generate_request_body([a, b], outputs=outputs)
    assert ihcl is not None
    return body, ihcl


@pytest.mark.parametrize("binary_output", [None, True, False])
def test_tritonclients_bodies_are_accepted(binary_output: bool | None) -> None:
    body, ihcl = _tritonclient(binary_output)
    assert plain_framed_request(body, ihcl, LIMIT, TENSORS)
    assert _decodes(body, ihcl)


ACCEPTED = [
    ("one input", {"inputs": [_input()]}, 8),
    ("zero elements", {"inputs": [_input(shape=(0, 3), size=0)]}, 0),
    ("scalar", {"inputs": [_input(shape=(), size=4)]}, 4),
    ("id and parameters", {"id": "r", "parameters": {"p": [1, "x"]}, "inputs": [_input()]}, 8),
    ("outputs", {"inputs": [_input()], "outputs": [{"name": "A"}, {"name": "B"}]}, 8),
    (
        "null output parameters",
        {"inputs": [_input()], "outputs": [{"name": "A", "parameters": None}]},
        8,
    ),
]

REFUSED = [
    ("no inputs", {"inputs": []}, 0),
    ("size off the shape", {"inputs": [_input(size=4)]}, 4),
    ("section too long", {"inputs": [_input()]}, 12),
    ("section too short", {"inputs": [_input()]}, 4),
    ("BYTES", {"inputs": [_input(datatype="BYTES", shape=(1,), size=5)]}, 5),
    ("unknown datatype", {"inputs": [_input(datatype="FP8")]}, 8),
    ("negative dimension", {"inputs": [_input(shape=(-2,), size=8)]}, 8),
    ("bool dimension", {"inputs": [_input(shape=(True, 2), size=8)]}, 8),
    ("inline data too", {"inputs": [{**_input(), "data": [1.0, 2.0]}]}, 8),
    (
        "shared memory",
        {
            "inputs": [
                {**_input(), "parameters": {"binary_data_size": 8, "shared_memory_region": "r"}}
            ]
        },
        8,
    ),
    ("no parameters", {"inputs": [{k: v for k, v in _input().items() if k != "parameters"}]}, 8),
    ("duplicate input", {"inputs": [_input(), _input()]}, 16),
    ("duplicate output", {"inputs": [_input()], "outputs": [{"name": "A"}, {"name": "A"}]}, 8),
    (
        "classification",
        {"inputs": [_input()], "outputs": [{"name": "A", "parameters": {"classification": 2}}]},
        8,
    ),
    (
        "output shared memory",
        {
            "inputs": [_input()],
            "outputs": [{"name": "A", "parameters": {"shared_memory_region": "r"}}],
        },
        8,
    ),
    (
        "binary_data not a bool",
        {"inputs": [_input()], "outputs": [{"name": "A", "parameters": {"binary_data": 1}}]},
        8,
    ),
    (
        "binary_data_output not a bool",
        {"parameters": {"binary_data_output": "yes"}, "inputs": [_input()]},
        8,
    ),
    ("triton_ key", {"parameters": {"triton_x": 1}, "inputs": [_input()]}, 8),
    ("unknown key", {"inputs": [_input()], "other": 1}, 8),
    ("id not a string", {"id": 3, "inputs": [_input()]}, 8),
    ("name not a string", {"inputs": [_input(name=None)]}, 8),  # type: ignore[arg-type]
    (
        "too many inputs",
        {"inputs": [_input(name=f"I{i}") for i in range(TENSORS + 1)]},
        8 * (TENSORS + 1),
    ),
]


@pytest.mark.parametrize(("case", "header", "section"), ACCEPTED, ids=[c for c, _, _ in ACCEPTED])
def test_the_common_shapes_are_accepted(case: str, header: Any, section: int) -> None:
    body, ihcl = _framed(header, b"\0" * section)
    assert plain_framed_request(body, ihcl, LIMIT, TENSORS)
    assert _decodes(body, ihcl)


@pytest.mark.parametrize(("case", "header", "section"), REFUSED, ids=[c for c, _, _ in REFUSED])
def test_anything_else_takes_the_full_path(case: str, header: Any, section: int) -> None:
    body, ihcl = _framed(header, b"\0" * section)
    assert not plain_framed_request(body, ihcl, LIMIT, TENSORS)


def test_an_escaped_key_is_decoded_before_it_is_matched() -> None:
    # "\u0073hared_memory_region" is shared_memory_region: never relayed past the stages
    head = (
        b'{"inputs":[{"name":"X","datatype":"FP32","shape":[2],"parameters":'
        b'{"binary_data_size":8,"\\u0073hared_memory_region":"r"}}]}'
    )
    assert not plain_framed_request(head + b"\0" * 8, len(head), LIMIT, TENSORS)
    head = (
        b'{"inputs":[{"name":"X","datatype":"FP32","\\u0073hape":[2],'
        b'"parameters":{"binary_data_size":8}}]}'
    )
    assert plain_framed_request(head + b"\0" * 8, len(head), LIMIT, TENSORS)
    assert _decodes(head + b"\0" * 8, len(head))


def test_invalid_utf8_in_the_header_is_refused() -> None:
    head = (
        b'{"inputs":[{"name":"\xff","datatype":"FP32","shape":[2],'
        b'"parameters":{"binary_data_size":8}}]}'
    )
    assert not plain_framed_request(head + b"\0" * 8, len(head), LIMIT, TENSORS)


def test_the_limits_are_the_decoders() -> None:
    body, ihcl = _framed({"inputs": [_input()]}, b"\0" * 8)
    assert not plain_framed_request(body, ihcl, ihcl - 1, TENSORS)  # the header over the limit
    assert not _decodes(body, ihcl, limit=ihcl - 1)
    assert plain_framed_request(body, ihcl, ihcl, TENSORS)
    outputs = [{"name": f"O{i}"} for i in range(3)]
    body, ihcl = _framed({"inputs": [_input()], "outputs": outputs}, b"\0" * 8)
    assert not plain_framed_request(body, ihcl, LIMIT, 2)
    assert not _decodes(body, ihcl, tensors=2)
    for bad in (0, len(body) + 1):
        assert not plain_framed_request(body, bad, LIMIT, TENSORS)


_MUTATIONS = [
    "size",
    "dimension",
    "datatype",
    "name",
    "duplicate",
    "parameter",
    "key",
    "output",
    "id",
    "section",
]


@st.composite
def _requests(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid framed request with up to two of the mutations applied."""
    inputs = []
    for i in range(draw(st.integers(min_value=1, max_value=3))):
        datatype = draw(st.sampled_from(sorted(_ITEM)))
        shape = draw(st.lists(st.integers(min_value=0, max_value=4), max_size=3))
        count = 1
        for d in shape:
            count *= d
        inputs.append(_input(f"I{i}", datatype, shape, count * _ITEM[datatype]))
    header: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        header["outputs"] = [
            {"name": f"O{i}", "parameters": {"binary_data": draw(st.booleans())}}
            for i in range(draw(st.integers(0, 2)))
        ]
    extra = 0
    for mutation in draw(st.lists(st.sampled_from(_MUTATIONS), max_size=2)):
        tensor = draw(st.sampled_from(inputs))
        if mutation == "size":
            tensor.setdefault("parameters", {})["binary_data_size"] = draw(st.integers(-1, 40))
        elif mutation == "dimension":
            shape = tensor.get("shape", [])  # (a "key" mutation may have taken it)
            tensor["shape"] = [*shape, draw(st.sampled_from([-1, True, 1.0, 2]))]
        elif mutation == "datatype":
            tensor["datatype"] = draw(st.sampled_from(["BYTES", "X", "fp32", "UINT64"]))
        elif mutation == "name":
            tensor["name"] = draw(st.one_of(st.integers(), st.none(), st.just("I0")))
        elif mutation == "duplicate":
            inputs.append(json.loads(json.dumps(tensor)))
        elif mutation == "parameter":
            params = tensor.setdefault("parameters", {})  # (a "key" mutation may have taken it)
            params[draw(st.sampled_from(["shared_memory_region", "x"]))] = "r"
        elif mutation == "key":
            del tensor[draw(st.sampled_from(sorted(tensor)))]
        elif mutation == "output":
            header["outputs"] = [
                {"name": "O"},
                draw(
                    st.sampled_from(
                        [{"name": "O"}, {}, {"name": "P", "parameters": {"classification": 1}}]
                    )
                ),
            ]
        elif mutation == "id":
            header["id"] = draw(st.one_of(st.text(max_size=3), st.integers(), st.none()))
        else:
            extra = draw(st.integers(-4, 4))
    section = 0
    for t in inputs:
        size = (
            t.get("parameters", {}).get("binary_data_size")
            if isinstance(t.get("parameters"), dict)
            else None
        )
        section += size if isinstance(size, int) and size > 0 else 0
    body, ihcl = _framed(header, struct.pack("B", 7) * max(0, section + extra))
    return body, ihcl


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_whatever_it_accepts_the_decoder_accepts_and_relays(framed: tuple[bytes, int]) -> None:
    body, ihcl = framed
    if plain_framed_request(body, ihcl, LIMIT, TENSORS):
        assert _decodes(body, ihcl), body[:ihcl]
