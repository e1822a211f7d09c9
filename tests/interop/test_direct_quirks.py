"""Why v2proxy is needed: tritonclient.http cannot talk to KServe 0.21 or MLServer 1.7.1
directly (KServe refuses bodies without a Content-Type, MLServer has no binary tensors). The
same calls through v2proxy succeed (test_tritonclient_http.py runs them for every backend). The
control: the same calls straight to Triton, whose protocol tritonclient speaks, succeed."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def _inputs(binary: bool) -> list[httpclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = httpclient.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32), binary_data=binary)
        inputs.append(i)
    return inputs


@pytest.mark.parametrize(
    ("backend", "binary", "status", "message"),
    [
        ("kserve", False, "400", "'inference-header-content-length' header is missing"),
        ("mlserver", True, "422", ""),
    ],
)
def test_tritonclient_direct_fails(
    backend_urls, backend: str, binary: bool, status: str, message: str
) -> None:  # type: ignore[no-untyped-def]
    url = backend_urls(backend)[0].removeprefix("http://")
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    with (
        httpclient.InferenceServerClient(url) as client,
        pytest.raises(InferenceServerException) as info,
    ):
        client.infer("simple", _inputs(binary), outputs=outputs)
    assert info.value.status() == status
    assert message in str(info.value.message())


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_direct_to_triton_works(backend_urls, binary: bool) -> None:  # type: ignore[no-untyped-def]
    url = backend_urls("triton")[0].removeprefix("http://")
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    with httpclient.InferenceServerClient(url) as client:
        result = client.infer("simple", _inputs(binary), outputs=outputs)
    assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]
