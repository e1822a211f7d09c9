"""Triton as the oracle: the same bad requests straight to a real Triton (serving the builtin
models' twins, peers/triton_models) and to v2proxy with its builtin models get the same status
and the same error text.

Only the cases where the two agree today are here; the others are recorded differences (v2proxy
answers 400 where Triton answers 500 for unparsable JSON, names the culprit more precisely, ...).
Triton prefixes the errors its core raises with ``[request id: <id_unknown>] ``; v2proxy does
not, so that prefix is taken off Triton's text before comparing."""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from typing import Any

import grpc
import numpy as np
import pytest
from procs import Proc
from tritonclient.grpc import service_pb2, service_pb2_grpc

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
REQUEST_ID_PREFIX = "[request id: <id_unknown>] "
ONES = [1] * 16


def _tensor(name: str, datatype: str = "INT32", shape: list[int] | None = None, **kw: Any) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape or [1, 16], **kw}


def _json(inputs: list[dict], **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


SIMPLE = [_tensor("INPUT0", data=ONES), _tensor("INPUT1", data=ONES)]
BLOB = struct.pack("<16i", *range(16))


def _framed(blob: bytes) -> tuple[bytes, dict[str, str]]:
    binary = {"binary_data_size": 64}
    head = json.dumps(
        {"inputs": [_tensor("INPUT0", parameters=binary), _tensor("INPUT1", parameters=binary)]}
    ).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


# (id, model path, body, headers)
REST_CASES: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("unknown-model", "nope", _json(SIMPLE), {}),
    ("unknown-version", "simple/versions/7", _json(SIMPLE), {}),
    (
        "wrong-datatype",
        "simple",
        _json([_tensor("INPUT0", "FP32", data=[1.5] * 16), _tensor("INPUT1", data=ONES)]),
        {},
    ),
    ("unknown-output", "simple", _json(SIMPLE, outputs=[{"name": "DUMMY"}]), {}),
    (
        "batch-too-big",
        "simple",
        _json([_tensor(n, shape=[9, 16], data=[1] * 144) for n in ("INPUT0", "INPUT1")]),
        {},
    ),
    (
        "wrong-shape",
        "simple",
        _json([_tensor("INPUT0", shape=[1, 15], data=[1] * 15), _tensor("INPUT1", data=ONES)]),
        {},
    ),
    ("missing-input", "simple", _json(SIMPLE[:1]), {}),
    ("extra-input", "simple", _json([*SIMPLE[:1], _tensor("X", data=ONES), SIMPLE[1]]), {}),
    ("unknown-input", "simple", _json([SIMPLE[0], _tensor("X", data=ONES)]), {}),
    ("duplicate-input", "simple", _json([SIMPLE[0], SIMPLE[0]]), {}),
    ("missing-binary-bytes", "simple", *_framed(BLOB + BLOB[:10])),
    ("extra-binary-bytes", "simple", *_framed(BLOB * 2 + b"x")),
    ("ihcl-beyond-body", "simple", b"{}", {"Inference-Header-Content-Length": "3"}),
    ("raw-to-two-input-model", "simple", BLOB, {"Inference-Header-Content-Length": "0"}),
    (
        "model-error",
        "simple_string",
        _json([_tensor(n, "BYTES", data=["x"] * 16) for n in ("INPUT0", "INPUT1")]),
        {},
    ),
]


def _post(base: str, model: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(
        f"{base}/v2/models/{model}/infer", data=body, headers=headers, method="POST"
    )
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["error"]


def _same_text(ours: str, triton: str) -> str:
    """Triton's text as v2proxy writes it: without the request-id prefix, and with the input
    names of a count error in request order (Triton lists them in hash order)."""
    triton = triton.removeprefix(REQUEST_ID_PREFIX)
    if "Got input(s) [" in triton and "Got input(s) [" in ours:
        got = triton.split("Got input(s) [", 1)[1].split("]", 1)[0]
        mine = ours.split("Got input(s) [", 1)[1].split("]", 1)[0]
        if sorted(got.split(",")) == sorted(mine.split(",")):
            triton = triton.replace(got, mine, 1)
        # Triton drops the '[' of an empty list here: "missing required input(s) ]."
        triton = triton.replace("missing required input(s) ].", "missing required input(s) [].")
    return triton


@pytest.mark.parametrize(
    ("model", "body", "headers"), [c[1:] for c in REST_CASES], ids=[c[0] for c in REST_CASES]
)
def test_rest_error_as_triton(
    builtin_proxy: Proc, backend_urls: Any, model: str, body: bytes, headers: dict[str, str]
) -> None:
    triton = _post(backend_urls("triton")[0], model, body, headers)
    ours = _post(builtin_proxy.base_url, model, body, headers)
    assert 400 <= triton[0] < 500, triton  # the case is a client error at the oracle
    assert ours == (triton[0], _same_text(ours[1], triton[1]))


def _grpc_cases() -> list[tuple[str, service_pb2.ModelInferRequest]]:
    raw = np.arange(16, dtype="<i4").tobytes()
    cases = []

    def simple(model: str = "simple", **kw: Any) -> service_pb2.ModelInferRequest:
        r = service_pb2.ModelInferRequest(model_name=model, **kw)
        r.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
        r.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
        return r

    r = simple("nope")
    r.raw_input_contents.extend([raw, raw])
    cases.append(("unknown-model", r))
    r = simple(model_version="7")
    r.raw_input_contents.extend([raw, raw])
    cases.append(("unknown-version", r))
    r = simple()
    r.raw_input_contents.append(raw)
    cases.append(("missing-data", r))
    r = simple()
    r.inputs[0].contents.int_contents.extend(ONES)
    r.raw_input_contents.append(raw)
    cases.append(("contents-and-raw", r))
    r = simple()
    for t in r.inputs:
        t.contents.fp32_contents.extend([1.0] * 16)
    cases.append(("wrong-contents-type", r))
    r = simple()
    r.inputs[0].datatype = "FP32"
    r.raw_input_contents.extend([raw, raw])
    cases.append(("wrong-datatype", r))
    r = simple()
    r.raw_input_contents.extend([raw, raw[:60]])
    cases.append(("raw-size-mismatch", r))
    r = simple()
    r.raw_input_contents.extend([raw, raw])
    r.outputs.add(name="DUMMY")
    cases.append(("unknown-output", r))
    return cases


def _infer(url: str, request: service_pb2.ModelInferRequest) -> tuple[str, str]:
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""
    return "OK", ""


@pytest.mark.parametrize(
    ("request_msg",), [(c[1],) for c in _grpc_cases()], ids=[c[0] for c in _grpc_cases()]
)
def test_grpc_error_as_triton(builtin_proxy: Proc, backend_urls: Any, request_msg: Any) -> None:
    triton = _infer(backend_urls("triton")[1], request_msg)
    ours = _infer(builtin_proxy.grpc_url, request_msg)
    assert triton[0] in ("INVALID_ARGUMENT", "NOT_FOUND"), triton
    assert ours == (triton[0], triton[1].removeprefix(REQUEST_ID_PREFIX))
