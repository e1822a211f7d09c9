"""`--backend-encoding auto` chooses well: FP16 sent as JSON numbers reaches a KServe ModelServer
(which takes binary tensors but neither lists the extension in GET /v2 nor accepts FP16 in JSON)
instead of being turned into the backend's refusal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from procs import Proc, v2proxy
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def kserve_proxy(backend_urls: Any) -> Iterator[Proc]:
    rest, _ = backend_urls("kserve")
    with v2proxy("serve", "--backend", rest, name="auto-kserve") as p:
        yield p


def _fp16_infer(url: str, binary_output: bool) -> np.ndarray:
    x = np.array([0.5, -1.25, 3.0, 65504.0, 2.0**-14], dtype=np.float16)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP16")
    inp.set_data_from_numpy(x, binary_data=False)  # JSON numbers
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output)
    with httpclient.InferenceServerClient(url) as client:
        result = client.infer("identity_fp16", [inp], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    assert got is not None
    assert got.dtype == np.float16 and got.tolist() == x.tolist()
    return got


def test_kserve_itself_refuses_fp16_json(backend_urls: Any) -> None:
    """The control: straight to KServe the same request is refused (400)."""
    rest, _ = backend_urls("kserve")
    with pytest.raises(InferenceServerException) as info:
        _fp16_infer(rest.removeprefix("http://"), binary_output=False)
    assert info.value.status() == "400"


@pytest.mark.parametrize("binary_output", [False, True])
def test_fp16_json_through_v2proxy_auto_to_kserve(kserve_proxy: Proc, binary_output: bool) -> None:
    for _ in range(3):  # the first request finds out, the others use what it found
        _fp16_infer(kserve_proxy.url, binary_output)
