"""tritonclient.http through v2proxy in front of every backend: the builtin models, the
reference server, a KServe ModelServer and an MLServer (real servers from PyPI).

Each test runs for every backend and on both event loops (see conftest.proxy)."""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from procs import Proc
from simple_io import assert_simple, http_inputs
from tritonclient.utils import InferenceServerException

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def client(proxy: Proc) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(proxy.url, connection_timeout=30, network_timeout=60)


def _infer(proxy: Proc, *args: Any, **kwargs: Any) -> httpclient.InferResult:
    """One request on a client of its own, closed before returning: a client left to the
    garbage collector leaves its socket to it too (a ResourceWarning in whichever test is
    running when it is collected)."""
    with client(proxy) as c:
        return c.infer(*args, **kwargs)


@pytest.mark.parametrize(
    ("in0", "in1", "out0", "out1"),
    [
        (False, True, True, False),  # the mix of simple_http_infer_client.py
        (False, False, False, False),  # all JSON
        (True, True, True, True),  # all binary
    ],
    ids=["mixed", "json", "binary"],
)
def test_simple_infer(proxy: Proc, in0: bool, in1: bool, out0: bool, out1: bool) -> None:
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=out0),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=out1),
    ]
    result = _infer(proxy, "simple", http_inputs(in0, in1), outputs=outputs)
    assert_simple(result)
    response = result.get_response()
    by_name = {o["name"]: o for o in response["outputs"]}
    # the output-selection table: binary outputs carry binary_data_size, JSON ones data
    assert ("binary_data_size" in (by_name["OUTPUT0"].get("parameters") or {})) is out0
    assert ("data" in by_name["OUTPUT1"]) is (not out1)


def test_no_outputs_requested(proxy: Proc) -> None:
    # The client then asks for binary_data_output: every output comes back binary.
    result = _infer(proxy, "simple", http_inputs(True, False))
    assert_simple(result)
    for out in result.get_response()["outputs"]:
        assert "data" not in out
        assert out["parameters"]["binary_data_size"] == 64


@pytest.mark.parametrize("request_alg", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_alg", [None, "gzip", "deflate"])
def test_compression(proxy: Proc, request_alg: str | None, response_alg: str | None) -> None:
    result = _infer(
        proxy,
        "simple",
        http_inputs(False, True),
        outputs=[
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
        ],
        request_compression_algorithm=request_alg,
        response_compression_algorithm=response_alg,
    )
    assert_simple(result)


def test_unknown_model(proxy: Proc) -> None:
    with pytest.raises(InferenceServerException) as info:
        _infer(proxy, "wrong_model_name", http_inputs(True, True))
    assert info.value.message().startswith("Request for unknown model"), info.value.message()
    assert "wrong_model_name" in info.value.message()
    # and the proxy keeps serving
    assert_simple(_infer(proxy, "simple", http_inputs(True, True)))


def test_bad_element_count_is_a_client_error(proxy: Proc) -> None:
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[1,2,3]},'
        b'{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":['
        + b",".join([b"1"] * 16)
        + b"]}]}"
    )
    req = urllib.request.Request(
        f"{proxy.base_url}/v2/models/simple/infer", data=body, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        _OPENER.open(req, timeout=30)
    assert info.value.code == 400
    message = json.loads(info.value.read())["error"]
    assert "INPUT0" in message and "expected 16 elements, got 3" in message
    assert_simple(_infer(proxy, "simple", http_inputs(True, True)))


#: backends reached over REST JSON only (no binary_tensor_data in their /v2 extensions)
JSON_ONLY = {"kserve", "mlserver"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_identity(proxy: Proc, backend_name: str, binary: bool) -> None:
    """BYTES are carried exactly: NUL bytes in JSON and binary, arbitrary bytes in binary."""
    values = [b"he\x00llo", "ünïcode".encode(), b"", b"\x00\x01\x02\x03"]
    data = np.array([values], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = _infer(proxy, "simple_identity", [inp], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    assert got is not None
    assert got.shape == data.shape
    # tritonclient hands back JSON BYTES elements as str, binary ones as bytes
    assert [x.encode() if isinstance(x, str) else bytes(x) for x in got.reshape(-1)] == values


def test_non_utf8_bytes(proxy: Proc, backend_name: str) -> None:
    """Non-UTF-8 BYTES need binary data end to end. A backend that takes JSON only cannot get
    them: the proxy says so clearly (400) instead of corrupting them."""
    values = [b"\xff\xfe not utf-8", b"\x80"]
    data = np.array([values], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    if backend_name in JSON_ONLY:
        with pytest.raises(InferenceServerException) as info:
            _infer(proxy, "simple_identity", [inp], outputs=[out])
        assert info.value.status() == "400"
        assert "tensor 'INPUT0' holds BYTES that are not valid UTF-8" in info.value.message()
        assert "takes JSON only" in info.value.message()
        return
    result = _infer(proxy, "simple_identity", [inp], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    assert got is not None
    assert [bytes(x) for x in got.reshape(-1)] == values


def test_health_and_metadata(proxy: Proc) -> None:
    with client(proxy) as c:
        assert c.is_server_live()
        assert c.is_server_ready()
        assert c.is_model_ready("simple")
        assert not c.is_model_ready("wrong_model_name")
        meta = c.get_server_metadata()
        assert "binary_tensor_data" in meta["extensions"]
        model = c.get_model_metadata("simple")
        assert model["name"] == "simple"
        with pytest.raises(InferenceServerException) as info:
            c.get_model_metadata("wrong_model_name")
        assert info.value.status() == "404"


def test_raw_binary_request(proxy: Proc) -> None:
    """IHCL 0: the whole body is the one input; shape from the model metadata."""
    values = [1.5, -2.25, 3.0, 1e-3, 7.0]
    body = struct.pack(f"<{len(values)}f", *values)
    req = urllib.request.Request(
        f"{proxy.base_url}/v2/models/identity_fp32/infer",
        data=body,
        headers={"Inference-Header-Content-Length": "0"},
        method="POST",
    )
    with _OPENER.open(req, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/octet-stream"
        ihcl = int(resp.headers["Inference-Header-Content-Length"])
        payload = resp.read()
    header = json.loads(payload[:ihcl])
    (out,) = header["outputs"]
    assert out["name"] == "OUTPUT0" and out["datatype"] == "FP32"
    assert out["parameters"]["binary_data_size"] == len(body)
    assert np.prod(out["shape"]) == len(values)
    assert payload[ihcl:] == body


def test_malformed_json_keeps_serving(proxy: Proc) -> None:
    req = urllib.request.Request(
        f"{proxy.base_url}/v2/models/simple/infer", data=b'{"inputs": [', method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        _OPENER.open(req, timeout=30)
    assert info.value.code == 400
    assert b"failed to parse the request JSON buffer" in info.value.read()
    assert_simple(_infer(proxy, "simple", http_inputs(True, True)))
