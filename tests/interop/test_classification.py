"""The classification extension through v2proxy (docs/protocol.md, classification; Triton's
qa ``L0_parameters/class_count_test.py`` and ``L0_infer`` classification cases), driven by
tritonclient HTTP (binary and JSON results) and gRPC.

v2proxy runs with ``--config`` holding label files (the classifier's, and a CRLF file for
``simple``'s OUTPUT0) in front of the builtin models, KServe ModelServer, MLServer and Triton
(REST and gRPC): it classifies itself. In front of Triton without labels, ``classification``
passes through to Triton, which classifies with its own ``label_filename``. Triton straight is
the oracle: the same request gives the same strings. Every element, status and message is
checked.

Triton 2.51 (the peer) crashes on classification of a BYTES output and has no 1,000,000-element cap
(both added to Triton later; docs/compatibility.md, classification): those two cases are not sent to
it, straight or passed through.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from procs import Proc, v2proxy
from tritonclient.utils import InferenceServerException

REPO = Path(__file__).resolve().parents[2]
LABELS = (REPO / "config/labels/classifier.txt").read_text().splitlines()
SIMPLE_LABELS = [f"sum {i}" if i % 3 else "" for i in range(16)]  # blank lines: no suffix

#: backends v2proxy classifies in front of (labels configured)
LOCAL = [
    "builtin",
    "kserve",
    "kserve-grpc",
    "mlserver",
    "mlserver-grpc",
    "triton",
    "triton-grpc",
]
#: v2proxy in front of Triton without labels: the parameter passes through
PASSTHROUGH = ["triton-passthrough", "triton-grpc-passthrough"]
#: those with the classifier model
WITH_CLASSIFIER = ["builtin", "triton", "triton-grpc", *PASSTHROUGH]
#: those not Triton (see the module docstring)
NOT_TRITON = [b for b in LOCAL if not b.startswith("triton")]
CLIENTS = ["http-binary", "http-json", "grpc"]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="session")
def label_config() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="v2proxy-classification-"))
    shutil.copy(REPO / "config/labels/classifier.txt", folder / "classifier.txt")
    (folder / "simple.txt").write_bytes("".join(f"{s}\r\n" for s in SIMPLE_LABELS).encode())
    (folder / "v2proxy.yaml").write_text(
        "models:\n"
        "  classifier:\n    outputs:\n      SCORES: {labels: classifier.txt}\n"
        "  simple:\n    outputs:\n      OUTPUT0: {labels: simple.txt}\n"
    )
    yield folder / "v2proxy.yaml"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def class_proxies() -> dict[str, Proc]:
    return {}


def _start(
    name: str, stack: contextlib.ExitStack, backend_urls: Any, config: Path, cache: dict[str, Proc]
) -> Proc:
    if name not in cache:
        server, _, rest = name.partition("-")
        args = [] if rest.endswith("passthrough") else ["--config", str(config)]
        if server == "builtin":
            url = "builtin"
        else:
            http, grpc = backend_urls(server)
            url = f"grpc://{grpc}" if rest.startswith("grpc") else http
        cache[name] = stack.enter_context(
            v2proxy("serve", "--backend", url, *args, name=f"class-{name}")
        )
    return cache[name]


@pytest.fixture(params=LOCAL + PASSTHROUGH)
def cproxy(
    request: pytest.FixtureRequest,
    stack: contextlib.ExitStack,
    backend_urls: Any,
    label_config: Path,
    class_proxies: dict[str, Proc],
) -> tuple[str, Proc]:
    return request.param, _start(request.param, stack, backend_urls, label_config, class_proxies)


@pytest.fixture
def builtin_labels(
    stack: contextlib.ExitStack,
    backend_urls: Any,
    label_config: Path,
    class_proxies: dict[str, Proc],
) -> Proc:
    return _start("builtin", stack, backend_urls, label_config, class_proxies)


# --------------------------------------------------------------------------- clients


def classify(
    client: str,
    http_url: str,
    grpc_url: str,
    model: str,
    inputs: list[tuple[str, np.ndarray]],
    output: str,
    k: int,
) -> tuple[str, list[int], list[str]]:
    """One request through tritonclient: (datatype, shape, strings) of the classified
    output."""
    if client == "grpc":
        gc = grpcclient.InferenceServerClient(grpc_url)
        try:
            ins = []
            for name, arr in inputs:
                i = grpcclient.InferInput(name, list(arr.shape), _dt(arr))
                i.set_data_from_numpy(arr)
                ins.append(i)
            result = gc.infer(model, ins, outputs=[grpcclient.InferRequestedOutput(output, k)])
            out = result.get_output(output)
            datatype, shape = out.datatype, list(out.shape)
        finally:
            gc.close()
    else:
        binary = client == "http-binary"
        hc = httpclient.InferenceServerClient(http_url)
        try:
            ins = []
            for name, arr in inputs:
                i = httpclient.InferInput(name, list(arr.shape), _dt(arr))
                i.set_data_from_numpy(arr, binary_data=binary)
                ins.append(i)
            requested = httpclient.InferRequestedOutput(output, binary_data=binary, class_count=k)
            result = hc.infer(model, ins, outputs=[requested])
            out = result.get_output(output)
            datatype, shape = out["datatype"], list(out["shape"])
            assert ("binary_data_size" in out.get("parameters", {})) is binary
            assert ("data" in out) is not binary
        finally:
            hc.close()
    values = result.as_numpy(output)
    assert values is not None and list(values.shape) == shape
    return datatype, shape, [v if isinstance(v, str) else v.decode() for v in values.flat]


def _dt(arr: np.ndarray) -> str:
    return {np.float32: "FP32", np.int32: "INT32", np.object_: "BYTES"}[arr.dtype.type]


def _urls(proxy: Proc) -> tuple[str, str]:
    return proxy.url, proxy.grpc_url


def _fmt(value: float | int, floats: bool) -> str:
    return f"{float(value):f}" if floats else str(int(value))


def expected(rows: np.ndarray, k: int, labels: list[str] | None, floats: bool = True) -> list[str]:
    """An independent oracle: per row, a stable sort by value descending."""
    out = []
    for row in rows:
        order = sorted(range(len(row)), key=lambda i: -row[i])[: min(k, len(row))]
        for i in order:
            label = labels[i] if labels and i < len(labels) and labels[i] else ""
            text = f"{_fmt(row[i], floats)}:{i}"
            out.append(f"{text}:{label}" if label else text)
    return out


def _classifier_scores(x: np.ndarray) -> np.ndarray:
    return (x * np.float32(2) + np.arange(10, dtype=np.float32) * np.float32(0.125)).astype(
        np.float32
    )


CLASSIFIER_X = np.array(
    [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 3, 0.5, 9, -1, 3, 2.25, 7, 0, 1]], dtype=np.float32
)


# --------------------------------------------------------------------------- results


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("k", [1, 3, 10, 25])
@pytest.mark.parametrize("cproxy", WITH_CLASSIFIER, indirect=True)
def test_classifier_with_labels(cproxy: tuple[str, Proc], client: str, k: int) -> None:
    """The builtin/Triton classifier, batching: [batch, min(k, 10)] with the label file's
    labels (v2proxy's, or Triton's own label_filename when passed through)."""
    _, proxy = cproxy
    got = classify(client, *_urls(proxy), "classifier", [("INPUT0", CLASSIFIER_X)], "SCORES", k)
    scores = _classifier_scores(CLASSIFIER_X)
    assert got == ("BYTES", [2, min(k, 10)], expected(scores, k, LABELS))


@pytest.mark.parametrize("client", CLIENTS)
def test_simple_int32_batch_ties_and_crlf_labels(cproxy: tuple[str, Proc], client: str) -> None:
    """``simple`` OUTPUT0 (INT32, batching by config or by metadata [-1,16]), ties (stable,
    lower index first), a CRLF label file with blank lines (v2proxy); Triton passed through has
    no labels for it."""
    name, proxy = cproxy
    a = np.array([[5, 5, 1, 9, 5, 0, 9, 2, 3, 3, 7, 1, 1, 4, 8, 6], list(range(16))], np.int32)
    b = np.array([[0] * 16, [16 - i for i in range(16)]], dtype=np.int32)  # row 2: all 16
    got = classify(client, *_urls(proxy), "simple", [("INPUT0", a), ("INPUT1", b)], "OUTPUT0", 5)
    labels = None if name in PASSTHROUGH else SIMPLE_LABELS
    want = expected(a + b, 5, labels, floats=False)
    assert got == ("BYTES", [2, 5], want)
    assert "\r" not in "".join(want) and want[0] == "9:3" and want[5] == "16:0"


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("k", [2, 7])
def test_identity_fp32_non_batching(cproxy: tuple[str, Proc], client: str, k: int) -> None:
    """A non-batching model (config max_batch_size 0, or metadata [-1]): shape [min(k, n)],
    %f formatting, no labels."""
    _, proxy = cproxy
    x = np.array([1.1, 3.3, 0.5, 2.4, -0.0, 1e10], dtype=np.float32)
    got = classify(client, *_urls(proxy), "identity_fp32", [("INPUT0", x)], "OUTPUT0", k)
    assert got == ("BYTES", [min(k, 6)], expected(x.reshape(1, -1), k, None))
    if k == 2:
        assert got[2] == ["10000000000.000000:5", "3.300000:1"]


# --------------------------------------------------------------------------- errors


def _http_error(base_url: str, model: str, body: dict[str, Any]) -> tuple[int, str]:
    req = urllib.request.Request(
        f"{base_url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["error"]


IDENTITY_INPUT = {"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"classification": -1}, "Unable to set 'classification': attempt to access JSON"
         " non-unsigned-integer as unsigned-integer"),
        ({"classification": "2"}, "Unable to set 'classification': attempt to access JSON"
         " non-unsigned-integer as unsigned-integer"),
        ({"classification": 2.0}, "Unable to set 'classification': attempt to access JSON"
         " non-unsigned-integer as unsigned-integer"),
        ({"classification": 2, "shared_memory_region": "r", "shared_memory_byte_size": 12},
         "Output can't set both 'shared_memory_region' and 'classification'"),
        ({"classification": 0, "shared_memory_region": "r", "shared_memory_byte_size": 12},
         "Output can't set both 'shared_memory_region' and 'classification'"),
    ],
)  # fmt: skip
def test_http_parameter_errors(
    cproxy: tuple[str, Proc], backend_urls: Any, params: dict[str, Any], message: str
) -> None:
    """Triton's messages; v2proxy answers JSON type errors with 400 (Triton: 500;
    docs/compatibility.md)."""
    _, proxy = cproxy
    body = {"inputs": [IDENTITY_INPUT], "outputs": [{"name": "OUTPUT0", "parameters": params}]}
    status, text = _http_error(proxy.base_url, "identity_fp32", body)
    assert (status, text) == (400, message)
    t_status, t_text = _http_error(backend_urls("triton")[0], "identity_fp32", body)
    assert t_text == message
    assert t_status == (400 if "shared_memory" in message else 500)


def test_http_zero_means_no_classification(cproxy: tuple[str, Proc]) -> None:
    _, proxy = cproxy
    body = {
        "inputs": [IDENTITY_INPUT],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 0}}],
    }
    status, text = _http_error(proxy.base_url, "identity_fp32", body)
    assert status == 200
    (out,) = json.loads(text)["outputs"]
    assert out == {"name": "OUTPUT0", "datatype": "FP32", "shape": [3], "data": [1.0, 2.0, 3.0]}


def _grpc_infer_error(url: str, k: int, shm: bool = False) -> InferenceServerException:
    gc = grpcclient.InferenceServerClient(url)
    try:
        i = grpcclient.InferInput("INPUT0", [3], "FP32")
        i.set_data_from_numpy(np.array([1, 2, 3], np.float32))
        out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=k)
        if shm:  # the client refuses it itself: set the parameter underneath
            out._output.parameters["shared_memory_region"].string_param = "r"
            out._output.parameters["shared_memory_byte_size"].int64_param = 12
        with pytest.raises(InferenceServerException) as err:
            gc.infer("identity_fp32", [i], outputs=[out])
        return err.value
    finally:
        gc.close()


@pytest.mark.parametrize(
    ("k", "shm", "message"),
    [
        (-2, False, "invalid value for 'classification' parameter, expected >= 0"),
        (2, True, "output can't set both 'shared_memory_region' and 'classification'"),
    ],
)
def test_grpc_parameter_errors(
    cproxy: tuple[str, Proc], backend_urls: Any, k: int, shm: bool, message: str
) -> None:
    _, proxy = cproxy
    for url in (proxy.grpc_url, backend_urls("triton")[1]):
        err = _grpc_infer_error(url, k, shm)
        assert err.status() == "StatusCode.INVALID_ARGUMENT"
        assert err.message() == message


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("cproxy", NOT_TRITON, indirect=True)
def test_unsupported_type_bytes(cproxy: tuple[str, Proc], client: str) -> None:
    _, proxy = cproxy
    x = np.array([[b"a", b"b"]], dtype=np.object_)
    with pytest.raises(InferenceServerException) as err:
        classify(client, *_urls(proxy), "simple_identity", [("INPUT0", x)], "OUTPUT0", 1)
    assert "class result not available for output due to unsupported type 'BYTES'" in (
        err.value.message() or ""
    )
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("client", ["http-binary", "grpc"])
@pytest.mark.parametrize("cproxy", NOT_TRITON, indirect=True)
def test_row_too_large(cproxy: tuple[str, Proc], client: str) -> None:
    """qa class_count_test: identity_fp32 with 1,000,001 elements."""
    _, proxy = cproxy
    x = np.ones(1_000_001, dtype=np.float32)
    with pytest.raises(InferenceServerException) as err:
        classify(client, *_urls(proxy), "identity_fp32", [("INPUT0", x)], "OUTPUT0", 1)
    assert (err.value.message() or "").endswith("classification output tensor too large")
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


# --------------------------------------------------------------------------- Triton as oracle


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    ("model", "inputs", "output", "k"),
    [
        ("classifier", [("INPUT0", CLASSIFIER_X)], "SCORES", 4),
        ("classifier", [("INPUT0", CLASSIFIER_X[:1])], "SCORES", 30),
        (
            "identity_fp32",
            [("INPUT0", np.array([3, 3, 3, 1, 3, np.inf, -np.inf, 0.0078125], np.float32))],
            "OUTPUT0",
            8,
        ),
        (
            "identity_fp32",
            [("INPUT0", np.array([np.nan, 1, 2, -0.0, np.inf, -np.nan], np.float32))],
            "OUTPUT0",
            6,
        ),
    ],
    ids=["classifier-batch", "classifier-k-above-row", "fp32-ties-inf", "fp32-nan"],
)
def test_same_strings_as_triton(
    builtin_labels: Proc,
    backend_urls: Any,
    client: str,
    model: str,
    inputs: list[tuple[str, np.ndarray]],
    output: str,
    k: int,
) -> None:
    """The same request straight to Triton (its label_filename) and to v2proxy in front of the
    builtin models (the same labels from --config): identical answers."""
    http, grpc = backend_urls("triton")
    straight = classify(client, http.removeprefix("http://"), grpc, model, inputs, output, k)
    proxied = classify(client, *_urls(builtin_labels), model, inputs, output, k)
    assert proxied == straight
