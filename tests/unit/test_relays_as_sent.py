"""``core.decide.relays_as_sent``, the one decision for a whole JSON /infer body: it never says
"as sent" of a body a stage applies to (whatever its spelling: escapes, key order, spaces), nor
of one the decoder refuses (its limits included); it says so of the common shapes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.fake_backend import FakeBackend
from v2proxy.codecs.binary import decode_request
from v2proxy.core.decide import relays_as_sent
from v2proxy.core.errors import ProxyError
from v2proxy.core.pipeline import Pipeline

LIMIT = 1 << 20
TENSORS = 8
STAGES = Pipeline(FakeBackend(), LIMIT).stages

SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ],
    "outputs": [{"name": "OUTPUT0"}],
}


def _body(obj: Any, escaped: bool = False) -> bytes:
    text = json.dumps(obj)
    if escaped:  # every letter of every key spelled as an escape, as JSON allows
        text = re.sub(
            r'"([a-z_]+)":', lambda m: '"' + "".join(f"\\u{ord(c):04x}" for c in m[1]) + '":', text
        )
    return text.encode()


def test_the_common_shapes_go_as_sent() -> None:
    assert relays_as_sent(_body(SIMPLE), LIMIT, TENSORS)
    assert relays_as_sent(json.dumps(SIMPLE, separators=(",", ":")).encode(), LIMIT, TENSORS)
    assert relays_as_sent(_body({**SIMPLE, "id": "42"}), LIMIT, TENSORS)


SHM = {"shared_memory_region": "theirs", "shared_memory_byte_size": 64}


@pytest.mark.parametrize(
    "obj",
    [
        {"inputs": [{**SIMPLE["inputs"][0], "parameters": SHM}]},
        {**SIMPLE, "outputs": [{"name": "OUTPUT0", "parameters": SHM}]},
        {**SIMPLE, "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]},
        {**SIMPLE, "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
        {**SIMPLE, "parameters": {"binary_data_output": True}},
        {**SIMPLE, "parameters": {}},
        {"inputs": [{"name": "X", "datatype": "FP16", "shape": [1], "data": [1.5]}]},
        {"inputs": [{"name": "X", "datatype": "BF16", "shape": [1], "data": [1.5]}]},
    ],
    ids=[
        "shm-in",
        "shm-out",
        "classification",
        "binary_data",
        "binary_data_output",
        "any-parameters",
        "fp16",
        "bf16",
    ],
)
def test_a_marker_takes_the_decoded_path(obj: Any) -> None:
    assert not relays_as_sent(_body(obj), LIMIT, TENSORS)
    assert not relays_as_sent(_body(obj, escaped=True), LIMIT, TENSORS)


def test_an_escaped_key_is_never_missed() -> None:
    body = _body({"inputs": [{**SIMPLE["inputs"][0], "parameters": SHM}]}, escaped=True)
    assert b"shared_memory_region" not in body and b"\\u0073" in body
    assert not relays_as_sent(body, LIMIT, TENSORS)


def test_the_decoders_limits_hold() -> None:
    doubles = {"inputs": [{"name": "X", "datatype": "FP64", "shape": [16], "data": [1] * 16}]}
    body = json.dumps(doubles, separators=(",", ":")).encode()
    assert len(body) < 128  # and 128 bytes decoded
    assert relays_as_sent(body, 128, TENSORS)
    assert not relays_as_sent(body, 127, TENSORS)
    body = _body(SIMPLE)
    assert relays_as_sent(body, LIMIT, 2)  # two inputs, one output
    assert not relays_as_sent(body, LIMIT, 1)
    n = 10_000
    big = _body({"inputs": [{"name": "X", "datatype": "INT8", "shape": [n], "data": [1] * n}]})
    assert not relays_as_sent(big, LIMIT, TENSORS)  # over 16 KiB: the decoded path


def test_a_malformed_body_takes_the_decoded_path() -> None:
    """It is checked as the decoder checks it: the decoder then names the field at fault."""
    bad = {"inputs": [{**SIMPLE["inputs"][0], "shape": [1, 15]}]}
    assert not relays_as_sent(_body(bad), LIMIT, TENSORS)
    assert not relays_as_sent(_body(SIMPLE)[:-1], LIMIT, TENSORS)


KEYS = st.sampled_from(["name", "datatype", "shape", "data", "parameters", "id", "outputs"])
PARAMS = st.dictionaries(
    st.sampled_from(
        [
            "shared_memory_region",
            "shared_memory_byte_size",
            "classification",
            "binary_data",
            "binary_data_output",
            "binary_data_size",
            "sequence_id",
        ]
    ),
    st.one_of(st.booleans(), st.integers(0, 64), st.sampled_from(["r", "theirs"])),
    max_size=3,
)


@st.composite
def _requests(draw: st.DrawFn) -> tuple[Any, bool]:
    inputs = []
    for i in range(draw(st.integers(1, 3))):
        dt = draw(st.sampled_from(["INT32", "FP32", "FP16", "BF16", "BOOL", "BYTES"]))
        n = draw(st.integers(0, 4))
        data: list[Any] = [True] * n if dt == "BOOL" else ["s"] * n if dt == "BYTES" else [1] * n
        tensor: dict[str, Any] = {"name": f"IN{i}", "datatype": dt, "shape": [n], "data": data}
        if draw(st.booleans()):
            tensor["parameters"] = draw(PARAMS)
        inputs.append(tensor)
    obj: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        outputs = [{"name": "OUT0"}]
        if draw(st.booleans()):
            outputs[0]["parameters"] = draw(PARAMS)
        obj["outputs"] = outputs
    if draw(st.booleans()):
        obj["parameters"] = draw(PARAMS)
    return obj, draw(st.booleans())


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_as_sent_only_when_no_stage_applies(case: tuple[Any, bool]) -> None:
    """Sound against the stages: whatever it lets go as sent, the decoder either refuses (the
    backend refuses it too, naming the field) or decodes to a request no stage applies to."""
    obj, escaped = case
    body = _body(obj, escaped)
    if not relays_as_sent(body, LIMIT, TENSORS):
        return
    try:
        request = decode_request(bytearray(body), None, "m", "", LIMIT, TENSORS)
    except ProxyError:
        return
    assert not STAGES.applies(request)  # (and the decoder took it)
    assert not any(t.datatype.value in ("FP16", "BF16") for t in request.inputs)
    assert request.parameters.get("binary_data_output") is not True
