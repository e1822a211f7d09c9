"""A backend that closes its connection after an error answer without ``Connection: close``:
uvicorn does so when an exception escapes the application after Starlette's error middleware has
answered 500 (MLServer on a binary body it cannot decode, KServe on a model's ValueError), a few
milliseconds after the answer (the traceback is logged first). The next request through
v2proxy used to go on that connection as it closed and reach the client as a 502 ("Connection
reset by peer", "the connection ended before the answer's head"); it must be answered. v2proxy
never reuses a connection whose answer was a 5xx, so the next request goes on a new one.

Against a real MLServer 1.7 with ``--backend-encoding binary`` (MLServer has no binary tensors:
each inference is its bare 500, then the close). The request after it is a POST too
(``/v2/repository/index``, restricted groups opened with ``--restricted-api none``), which is
never sent twice: only a connection that is really alive answers it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from procs import Proc, v2proxy

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_FP32 = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]}]}


def _post(proc: Proc, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        proc.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_request_after_mlserver_500_and_close_is_answered(backend_urls: Any) -> None:
    rest, _ = backend_urls("mlserver")
    args = ("serve", "--backend", rest, "--backend-encoding", "binary", "--restricted-api", "none")
    with v2proxy(*args, name="close-after-500") as proc:
        for _ in range(5):
            status, answer = _post(proc, "/v2/models/identity_fp32/infer", _FP32)
            assert (status, answer) == (500, {"error": "Internal Server Error"})
            status, answer = _post(proc, "/v2/repository/index", {})
            assert status == 200, answer
            assert {"name": "identity_fp32", "state": "READY"}.items() <= next(
                m for m in answer if m["name"] == "identity_fp32"
            ).items()
        log = proc.log.read_text(errors="replace")
        assert "status=502" not in log, log[-3000:]
