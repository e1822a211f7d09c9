"""FP16 JSON clients through ``--backend-encoding auto`` to backends that do not list binary
tensors: a real KServe 0.21 ModelServer (takes binary tensors unlisted, refuses FP16 in JSON both
ways) and a real MLServer 1.7 (no binary tensors at all).

- v2proxy sends the request binary and asks every output binary: each listed output's
  ``binary_data`` and the request's ``binary_data_output`` (KServe honours the one its model
  passes on to its response), then answers the JSON client in JSON, FP16 element by element.
- An error about the request or its outputs (KServe's "... for output OUTPUT0", an unknown
  output) reaches the client as the backend wrote it and is not taken for a refusal of binary
  tensors: the next FP16 request still goes binary, and succeeds (KServe refuses it in JSON).
- MLServer is never sent binary tensors (told by its name in ``GET /v2``).

Each test runs its own v2proxy: what it learns about the backend lives in the process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from typing import Any

import numpy as np
import pytest
from procs import Proc, v2proxy

#: exact in FP16, rounded to it (0.1, 1.0009765625 ± ...), subnormal, the largest, signed zero
VALUES = [0.5, -1.25, 3.0, 65504.0, 2.0**-14, 2.0**-24, -0.0, 0.1, 1.0009765625, -7.5e-5]
EXPECTED = np.array(VALUES, dtype=np.float16)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post(proc: Proc, model: str, body: dict[str, Any]) -> tuple[int, Any, Message]:
    req = urllib.request.Request(
        f"{proc.base_url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


def _fp16_body(outputs: list[str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [len(VALUES)], "data": VALUES}]
    }
    if outputs is not None:
        body["outputs"] = [{"name": name} for name in outputs]
    return body


def _check_fp16_answer(proc: Proc, model: str, outputs: list[str] | None) -> None:
    """A JSON client's FP16 request answered in JSON, every element's bits as expected."""
    status, answer, headers = _post(proc, model, _fp16_body(outputs))
    assert status == 200, answer
    assert headers.get_content_type() == "application/json"
    assert headers.get("Inference-Header-Content-Length") is None
    (out,) = answer["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("OUTPUT0", "FP16", [len(VALUES)])
    assert "binary_data_size" not in out.get("parameters", {})
    got = np.array(out["data"], dtype=np.float16)
    for i, (g, e) in enumerate(zip(got, EXPECTED, strict=True)):
        assert g.view(np.uint16) == e.view(np.uint16), (i, float(g), float(e))


def _log(proc: Proc) -> str:
    return proc.log.read_text(errors="replace")


@pytest.fixture
def kserve_proxy(backend_urls: Any) -> Iterator[Proc]:
    rest, _ = backend_urls("kserve")
    with v2proxy("serve", "--backend", rest, "--backend-encoding", "auto", name="fp16-kserve") as p:
        yield p


@pytest.mark.parametrize("outputs", [["OUTPUT0"], None], ids=["listed", "unlisted"])
def test_fp16_json_to_kserve_answered_in_json(
    kserve_proxy: Proc, outputs: list[str] | None
) -> None:
    for _ in range(3):  # the first request finds out, the others go binary straight away
        _check_fp16_answer(kserve_proxy, "identity_fp16", outputs)
    assert "takes binary tensors unlisted" in _log(kserve_proxy)
    assert "refused binary tensors" not in _log(kserve_proxy)


@pytest.mark.parametrize("outputs", [["OUTPUT0"], None], ids=["listed", "unlisted"])
def test_kserve_model_honouring_only_binary_data_output(
    kserve_proxy: Proc, outputs: list[str] | None
) -> None:
    """A model whose response takes the request's binary_data_output but not the requested
    outputs: the request-level flag is what makes its FP16 output binary."""
    for _ in range(2):
        _check_fp16_answer(kserve_proxy, "identity_fp16_flag", outputs)
    assert "refused binary tensors" not in _log(kserve_proxy)


@pytest.mark.parametrize("outputs", [["OUTPUT0"], None], ids=["listed", "unlisted"])
def test_kserve_output_error_is_not_a_binary_refusal(
    kserve_proxy: Proc, outputs: list[str] | None
) -> None:
    """KServe took the binary inputs, then could not write the model's FP16 output as JSON:
    the client gets that error, and binary tensors stay in use for the next requests."""
    status, answer, _ = _post(kserve_proxy, "identity_fp16_json_out", _fp16_body(outputs))
    assert status == 400
    assert answer["error"].endswith("for output OUTPUT0"), answer
    for _ in range(2):
        _check_fp16_answer(kserve_proxy, "identity_fp16", outputs)
    assert "refused binary tensors" not in _log(kserve_proxy)


def test_kserve_unknown_output_is_not_a_binary_refusal(kserve_proxy: Proc) -> None:
    status, answer, _ = _post(kserve_proxy, "identity_fp16", _fp16_body(["NOPE"]))
    assert status == 400
    assert answer["error"] == "Unexpected inference output 'NOPE' for model 'identity_fp16'"
    _check_fp16_answer(kserve_proxy, "identity_fp16", ["OUTPUT0"])
    _check_fp16_answer(kserve_proxy, "identity_fp16", None)
    assert "refused binary tensors" not in _log(kserve_proxy)


def test_mlserver_is_never_sent_binary_tensors(backend_urls: Any) -> None:
    """MLServer has no binary tensors (a binary body gets a 422, or a bare 500 when its bytes
    are not UTF-8, as -1.25's are): FP16 goes to it as JSON numbers, every time. Its FP32 model
    then refuses the datatype itself, in its own words."""
    rest, _ = backend_urls("mlserver")
    with v2proxy("serve", "--backend", rest, "--backend-encoding", "auto", name="fp16-ml") as p:
        for _ in range(2):
            status, answer, _ = _post(p, "identity_fp32", _fp16_body(None))
            assert status == 400, answer
            assert "must be FP32, got FP16" in answer["error"], answer
        assert "takes binary tensors unlisted" not in _log(p)
