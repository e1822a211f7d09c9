"""Hypothesis round trips through the codecs for every datatype, random shapes (0-d and
zero-sized included) and random values (every bit pattern for the float types).

- Tensor -> JSON (``request_to_obj`` + ``dumps_tree``) -> ``decode_request`` gives the same bytes;
  floats compare NaN-aware (NaN payloads and signs are not carried by JSON), everything else
  bit exact, FP16/BF16 included (they travel as float64 and come back exactly).
- Tensor -> binary framing -> decode gives identical bytes, NaN payloads included.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.strategies import FLOATS, JSON_TEXT, tensors
from v2proxy.backends.rest_requests import infer_body
from v2proxy.codecs import binary as binc
from v2proxy.codecs.json_v2 import dumps_tree, request_to_obj
from v2proxy.core.model import (
    Buffer,
    Datatype,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _join(chunks: list[Buffer]) -> bytes:
    return b"".join(bytes(c) for c in chunks)


def _assert_json_equal(got: Tensor, want: Tensor) -> None:
    """Bit equality, except that any NaN matches any NaN."""
    assert (got.name, got.datatype, got.shape) == (want.name, want.datatype, want.shape)
    if want.datatype not in FLOATS:
        assert bytes(got.data) == bytes(want.data)
        return
    bits, dtype = FLOATS[want.datatype]
    g = np.frombuffer(got.data, dtype=dtype)
    w = np.frombuffer(want.data, dtype=dtype)
    with np.errstate(invalid="ignore"):  # signalling NaNs widen to NaN, with a warning
        nan = np.isnan(w.astype(np.float64))
        assert np.isnan(g.astype(np.float64))[nan].all()
    assert np.array_equal(g.view(bits)[~nan], w.view(bits)[~nan])


def _assert_identical(got: Tensor, want: Tensor) -> None:
    assert (got.name, got.datatype, got.shape) == (want.name, want.datatype, want.shape)
    assert bytes(got.data) == bytes(want.data)


@st.composite
def requests(draw: st.DrawFn, json_safe: bool) -> InferRequest:
    datatypes = draw(st.lists(st.sampled_from(list(Datatype)), min_size=1, max_size=4))
    inputs = [draw(tensors(dt, json_safe, f"IN{i}")) for i, dt in enumerate(datatypes)]
    outputs = draw(
        st.none()
        | st.lists(st.sampled_from(["A", "B", "C"]), unique=True).map(
            lambda names: [RequestedOutput(n) for n in names]
        )
    )
    request_id = draw(st.none() | JSON_TEXT.filter(bool))
    return InferRequest("M", inputs, outputs=outputs, id=request_id)


@SETTINGS
@given(data=st.data())
def test_every_datatype_through_json(data: st.DataObject) -> None:
    for datatype in Datatype:
        t = data.draw(tensors(datatype, json_safe=True), label=datatype.value)
        body = dumps_tree(request_to_obj(InferRequest("M", [t]), False, False))
        (back,) = binc.decode_request(body, None, "M").inputs
        _assert_json_equal(back, t)


@SETTINGS
@given(data=st.data())
def test_every_datatype_through_binary_framing(data: st.DataObject) -> None:
    for datatype in Datatype:
        t = data.draw(tensors(datatype, json_safe=False), label=datatype.value)
        chunks, ihcl = infer_body(InferRequest("M", [t]), True)
        assert ihcl is not None
        (back,) = binc.decode_request(_join(chunks), ihcl, "M").inputs
        _assert_identical(back, t)


@SETTINGS
@given(req=requests(json_safe=True), binary=st.booleans())
def test_requests_round_trip(req: InferRequest, binary: bool) -> None:
    chunks, ihcl = infer_body(req, binary)
    back = binc.decode_request(_join(chunks), ihcl, "M")
    assert back.id == (req.id or None)
    assert [o.name for o in back.outputs or []] == [o.name for o in req.outputs or []]
    assert len(back.inputs) == len(req.inputs)
    for got, want in zip(back.inputs, req.inputs, strict=True):
        (_assert_identical if binary else _assert_json_equal)(got, want)


@SETTINGS
@given(
    datatypes=st.lists(st.sampled_from(list(Datatype)), min_size=1, max_size=4),
    data=st.data(),
)
def test_responses_round_trip(datatypes: list[Datatype], data: st.DataObject) -> None:
    outputs = [
        data.draw(tensors(dt, json_safe=True, name=f"OUT{i}")) for i, dt in enumerate(datatypes)
    ]
    flags = data.draw(st.lists(st.booleans(), min_size=len(outputs), max_size=len(outputs)))
    binary = {t.name: f for t, f in zip(outputs, flags, strict=True)}
    resp = InferResponse("M", outputs, "1")
    chunks, ihcl = binc.encode_response(resp, lambda t: binary[t.name])
    has_blob = any(binary[t.name] and len(bytes(t.data)) for t in outputs)
    assert (ihcl is not None) == has_blob
    back = binc.decode_response(_join(chunks), ihcl)
    assert (back.model_name, back.model_version) == ("M", "1")
    for got, want in zip(back.outputs, outputs, strict=True):
        (_assert_identical if binary[want.name] else _assert_json_equal)(got, want)
