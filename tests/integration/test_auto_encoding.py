"""``--backend-encoding auto`` in front of a backend that takes binary tensors: a small JSON
body is relayed untouched, a large one (AUTO_BINARY_MIN and more) goes as binary tensors, since
the backend parsing JSON costs more than v2proxy transcoding it; either way the client gets
the JSON answer it asked for, values exact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.integration.conftest import Factory, proxy_to
from v2proxy.backends.rest_encoding import AUTO_BINARY_MIN


def body(n: int) -> bytes:
    x = np.arange(n, dtype=np.float32) / 7
    return json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [n], "data": x.tolist()}]}
    ).encode()


@pytest.mark.parametrize(("n", "sent_binary"), [(16, False), (8192, True)])
async def test_auto_sends_large_json_as_binary(
    make_client: Factory, recorded: tuple[object, list[object]], n: int, sent_binary: bool
) -> None:
    backend, seen = recorded
    url = str(backend.make_url("")).rstrip("/")  # type: ignore[attr-defined]
    proxy = await proxy_to(make_client, url, backend_encoding="auto")
    data = body(n)
    assert (len(data) >= AUTO_BINARY_MIN) is sent_binary
    resp = await proxy.post(
        "/v2/models/identity_fp32/infer", data=data, headers={"Accept-Encoding": "identity"}
    )
    assert resp.status == 200, await resp.text()
    assert resp.content_type == "application/json"
    out = (await resp.json())["outputs"][0]
    assert out["datatype"] == "FP32" and out["shape"] == [n]
    assert np.array_equal(
        np.array(out["data"], dtype=np.float32), np.arange(n, dtype=np.float32) / 7
    )
    infer = [r for r in seen if r.path.endswith("/infer")][-1]  # type: ignore[attr-defined]
    content_type = infer.headers["Content-Type"]  # type: ignore[attr-defined]
    assert content_type == ("application/octet-stream" if sent_binary else "application/json")
