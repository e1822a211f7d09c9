"""Per-request limits of the decoders (--max-tensors, and --max-input-size as the total of the
inputs decoded from JSON ``data`` / gRPC typed contents): JSON, binary-framed, the streaming
JSON check, gRPC messages; and the settings that carry them."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.codecs import binary as binc
from v2proxy.codecs import grpc as g
from v2proxy.codecs.json_stream import StreamCheck
from v2proxy.codecs.json_v2 import request_from_obj
from v2proxy.codecs.limits import DEFAULT_MAX_TENSORS, DecodedTotal, check_count
from v2proxy.core.errors import InvalidRequest, PayloadTooLarge
from v2proxy.ops.config import load_settings
from v2proxy.ops.config_sections import ConfigError


def _inp(name: str, data: list[Any], datatype: str = "INT32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [len(data)], "data": data}


def _body(inputs: list[dict[str, Any]], outputs: list[str] | None = None) -> bytes:
    obj: dict[str, Any] = {"inputs": inputs}
    if outputs is not None:
        obj["outputs"] = [{"name": n} for n in outputs]
    return json.dumps(obj).encode()


def _too_many(n: int, what: str, limit: int) -> str:
    return (
        f"the request names {n} {what}, more than the maximum of {limit} per request."
        " Use --max-tensors to increase the limit."
    )


def _total(total: int, where: str, limit: int) -> str:
    return (
        f"the decoded data of the request's inputs reaches {total} bytes with {where}, more"
        f" than the maximum allowed total of {limit} bytes. Use --max-input-size to increase"
        " the limit."
    )


# (body, max_tensors, max_input_size, error class or None, message or number of inputs)
JSON_CASES = [
    # counts: at the limit passes, one more is refused, outputs counted apart from inputs
    (_body([_inp(f"I{i}", [i]) for i in range(4)]), 4, 1 << 20, None, 4),
    (_body([_inp(f"I{i}", [i]) for i in range(5)]), 4, 1 << 20, InvalidRequest,
     _too_many(5, "inputs", 4)),
    (_body([_inp("I0", [1])], [f"O{i}" for i in range(4)]), 4, 1 << 20, None, 1),
    (_body([_inp("I0", [1])], [f"O{i}" for i in range(5)]), 4, 1 << 20, InvalidRequest,
     _too_many(5, "outputs", 4)),
    # an empty inputs list is no count error
    (_body([]), 4, 1 << 20, None, 0),
    # totals: 3 x 16 INT32 = 192 bytes fit in 192, not in 191 (counted from the shape: the
    # third input is named)
    (_body([_inp(f"I{i}", [0] * 16) for i in range(3)]), 8, 192, None, 3),
    (_body([_inp(f"I{i}", [0] * 16) for i in range(3)]), 8, 191, PayloadTooLarge,
     _total(192, "input 'I2'", 191)),
    # INT64 zeros: 2 characters of JSON become 8 bytes each; many small arrays together
    (_body([_inp(f"I{i}", [0] * 8, "INT64") for i in range(10)]), 64, 600, PayloadTooLarge,
     _total(640, "input 'I9'", 600)),
    # BYTES are counted once decoded (4-byte length prefix + the bytes)
    (_body([_inp("S0", ["abcd"] * 4, "BYTES"), _inp("S1", ["abcd"] * 4, "BYTES")]), 8, 63,
     PayloadTooLarge, _total(64, "input 'S1'", 63)),
    (_body([_inp("S0", ["abcd"] * 4, "BYTES"), _inp("S1", ["abcd"] * 4, "BYTES")]), 8, 64,
     None, 2),
]  # fmt: skip


@pytest.mark.parametrize(("body", "max_tensors", "max_size", "error", "expected"), JSON_CASES)
def test_json_request_limits(
    body: bytes, max_tensors: int, max_size: int, error: type[Exception] | None, expected: Any
) -> None:
    obj = json.loads(body)  # the header's own size limit is the binary codec's (below)
    if error is None:
        req = request_from_obj(obj, "m", "", None, max_size, max_tensors=max_tensors)
        assert len(req.inputs) == expected
        return
    with pytest.raises(error) as err:
        request_from_obj(obj, "m", "", None, max_size, max_tensors=max_tensors)
    assert str(err.value) == expected
    assert getattr(err.value, "http_status", None) == 400


def test_a_small_json_body_cannot_decode_into_more_than_the_limit() -> None:
    # 4 x 100 INT64 zeros: about 1 kB of JSON, 3200 bytes decoded; each input alone (800) and
    # the JSON text fit in 2000 bytes, the decoded total does not
    body = _body([_inp(f"I{i}", [0] * 100, "INT64") for i in range(4)])
    assert len(body) < 2000
    with pytest.raises(PayloadTooLarge) as err:
        binc.decode_request(body, None, "m", "", 2000)
    assert str(err.value) == _total(2400, "input 'I2'", 2000)
    req = binc.decode_request(body, None, "m", "", 3200)
    assert [bytes(t.data) for t in req.inputs] == [bytes(800)] * 4


def test_one_input_over_the_limit_keeps_its_own_message() -> None:
    body = _body([_inp("BIG", [0] * 100)])
    with pytest.raises(PayloadTooLarge) as err:
        binc.decode_request(body, None, "m", "", 399)
    assert "JSON input 'BIG' has a byte_size (400 bytes)" in str(err.value)


def test_binary_inputs_are_views_of_the_body_and_not_counted() -> None:
    data = np.arange(64, dtype="<i4").tobytes()  # 256 bytes each, binary
    header = {
        "inputs": [
            {"name": f"I{i}", "datatype": "INT32", "shape": [64],
             "parameters": {"binary_data_size": 256}}
            for i in range(3)
        ]
    }  # fmt: skip
    head = json.dumps(header).encode()
    req = binc.decode_request(head + data * 3, len(head), "m", "", 1000, 8)
    assert [bytes(t.data) for t in req.inputs] == [data] * 3


def test_binary_header_counts_inputs_before_its_section_arrives() -> None:
    header = {
        "inputs": [
            {"name": f"I{i}", "datatype": "INT32", "shape": [1],
             "parameters": {"binary_data_size": 4}}
            for i in range(3)
        ]
    }  # fmt: skip
    head = json.dumps(header).encode()
    with pytest.raises(InvalidRequest) as err:
        binc.decode_request_header(head, 12, "m", "", 1 << 20, 2)
    assert str(err.value) == _too_many(3, "inputs", 2)


def test_streaming_check_gives_way_to_the_full_decoder_on_a_limit() -> None:
    body = _body([_inp(f"I{i}", [0] * 16) for i in range(3)])
    check = StreamCheck("m", "", 1 << 20, max_tensors=2)
    check.feed(body)
    assert check.finish() is None  # undecided: the full decoder names the limit
    ok = StreamCheck("m", "", 1 << 20, max_tensors=3)
    ok.feed(body)
    req = ok.finish()
    assert req is not None and [t.name for t in req.inputs] == ["I0", "I1", "I2"]


def _grpc_request(n_inputs: int, n_outputs: int, typed: bool, count: int = 16) -> Any:
    msg = pb.ModelInferRequest(model_name="m")
    for i in range(n_inputs):
        t = msg.inputs.add(name=f"I{i}", datatype="INT64", shape=[count])
        if typed:
            t.contents.int64_contents.extend([0] * count)
        else:
            msg.raw_input_contents.append(bytes(8 * count))
    for i in range(n_outputs):
        msg.outputs.add(name=f"O{i}")
    return msg


# (message, max_tensors, max_input_size, expected message or None)
GRPC_CASES = [
    (_grpc_request(4, 4, typed=False), 4, 1 << 20, None),
    (_grpc_request(5, 0, typed=False), 4, 1 << 20, _too_many(5, "inputs", 4)),
    (_grpc_request(1, 5, typed=False), 4, 1 << 20, _too_many(5, "outputs", 4)),
    # typed contents: counted (varint zeros are 1 byte on the wire, 8 decoded)
    (_grpc_request(3, 0, typed=True), 8, 384, None),
    (_grpc_request(3, 0, typed=True), 8, 383, _total(384, "input tensor 'I2' for model 'm'", 383)),
    # raw contents are not counted: they are the message's own bytes
    (_grpc_request(3, 0, typed=False), 8, 100, None),
]


@pytest.mark.parametrize(("msg", "max_tensors", "max_size", "expected"), GRPC_CASES)
def test_grpc_request_limits(
    msg: Any, max_tensors: int, max_size: int, expected: str | None
) -> None:
    if expected is None:
        req = g.request_from_proto(msg, max_tensors, max_size)
        assert len(req.inputs) == len(msg.inputs)
        assert all(bytes(t.data) == bytes(8 * 16) for t in req.inputs)
        return
    with pytest.raises(InvalidRequest) as err:
        g.request_from_proto(msg, max_tensors, max_size)
    assert str(err.value) == expected
    assert err.value.grpc_code == "INVALID_ARGUMENT"


def test_defaults_are_generous() -> None:
    assert DEFAULT_MAX_TENSORS == 1024
    req = g.request_from_proto(_grpc_request(1024, 1024, typed=False))
    assert len(req.inputs) == 1024 and req.outputs is not None and len(req.outputs) == 1024
    with pytest.raises(InvalidRequest):
        g.request_from_proto(_grpc_request(1025, 0, typed=False))


def test_limit_helpers() -> None:
    check_count(3, 3, "inputs")
    total = DecodedTotal(10)
    total.add(6, "input 'a'")
    total.add(4, "input 'b'")
    assert total.total == 10
    with pytest.raises(PayloadTooLarge):
        total.add(1, "input 'c'")
    assert total.total == 10


# settings: (source, values, expected (max_tensors, max_concurrency) or error text)
SETTINGS_CASES = [
    ("default", {}, (1024, 1024)),
    ("cli", {"max_tensors": "8", "max_concurrency": "0"}, (8, 0)),
    ("env", {"V2PROXY_MAX_TENSORS": "16", "V2PROXY_MAX_CONCURRENCY": "32"}, (16, 32)),
    ("cli", {"max_concurrency": "-1"}, "--max-concurrency=-1: invalid value for"
     " 'max_concurrency': must be an integer >= 0"),
    ("cli", {"max_tensors": "0"}, "--max-tensors=0: invalid value for 'max_tensors': must be"
     " a positive integer"),
    ("env", {"V2PROXY_MAX_CONCURRENCY": "many"}, "V2PROXY_MAX_CONCURRENCY=many: invalid value"
     " for 'max_concurrency': expected an integer"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "values", "expected"), SETTINGS_CASES)
def test_settings(source: str, values: dict[str, str], expected: Any) -> None:
    cli = values if source == "cli" else {}
    env = values if source == "env" else {}
    if isinstance(expected, str):
        with pytest.raises(ConfigError) as err:
            load_settings(cli, None, env=env)
        assert str(err.value) == expected
        return
    s = load_settings(cli, None, env=env)
    assert (s.max_tensors, s.max_concurrency) == expected
