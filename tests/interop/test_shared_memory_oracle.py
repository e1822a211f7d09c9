"""``L0_shared_memory`` cases (Triton's qa; docs/compatibility.md, shared memory against Triton)
against v2proxy (builtin models) and straight against Triton 2.51 (system shm on CPU): the same
status and message, but for the differences listed in :data:`DIFFERENT` (Triton 2.51 predates its
key and overflow checks; Triton prefixes core errors with the request id); plus fault tests: an
object truncated or unlinked after registration, unregister during a slow inference, offsets near
2^63 over gRPC. Every object a test creates is unlinked; the proxies stay up and keep serving.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import posix_ipc
import pytest
import tritonclient.grpc as grpcclient
from procs import Proc, v2proxy
from standin import StandIn, serving
from tritonclient.utils import InferenceServerException

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
PAGE = os.sysconf("SC_PAGE_SIZE")
REQUEST_ID_PREFIX = "[request id: <id_unknown>] "


def call(base, method, path, body=None):
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    req = urllib.request.Request(base + path, data=data, method=method)
    try:
        with _OPENER.open(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        with contextlib.suppress(ValueError, KeyError, TypeError):
            text = json.loads(text)["error"]
        return e.code, text


def t(name, region, size, offset=0, dt="INT32", **kw):
    return {
        "name": name,
        "datatype": dt,
        "shape": [1, 16],
        "parameters": {
            "shared_memory_region": region,
            "shared_memory_byte_size": size,
            "shared_memory_offset": offset,
        },
        **kw,
    }


def infer(inputs, outputs=None):
    body = {"inputs": inputs}
    if outputs is not None:
        body["outputs"] = outputs
    return ("POST", "/v2/models/simple/infer", body)


def reg(name, key, offset, size):
    return (
        "POST",
        f"/v2/systemsharedmemory/region/{name}/register",
        {"key": key, "offset": offset, "byte_size": size},
    )


def cases(key_in, key_big):
    ones = {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
    big = 4 * PAGE
    return [
        ("oob-size+1", reg("c", key_big, 0, big + 1)),
        ("oob-offset1", reg("c", key_big, PAGE, big)),
        ("oob-offset=size", reg("c", key_big, big, 1)),
        ("oob-offset>size", reg("c", key_big, big + 1, 0)),
        ("re-register", reg("in", key_in, 0, 128)),
        ("key-slash", reg("c", "/", 0, 8)),
        ("key-slashes", reg("c", "///", 0, 8)),
        ("no-name", ("POST", "/v2/systemsharedmemory/register", {"key": key_in, "byte_size": 8})),
        ("no-key", reg("c", None, 0, 8)),
        ("status-unknown", ("GET", "/v2/systemsharedmemory/region/nope/status", None)),
        ("cuda-status-unknown", ("GET", "/v2/cudasharedmemory/region/nope/status", None)),
        ("cuda-status-system", ("GET", "/v2/cudasharedmemory/region/in/status", None)),
        ("unregister-unknown", ("POST", "/v2/systemsharedmemory/region/nope/unregister", b"")),
        ("infer-unknown-region", infer([t("INPUT0", "nope", 64), ones])),
        ("infer-offset-2^64-32", infer([t("INPUT0", "in", 64, 2**64 - 32), ones])),
        ("infer-offset-2^63", infer([t("INPUT0", "in", 64, 2**63), ones])),
        ("infer-size-oob", infer([t("INPUT0", "in", 128, 64), ones])),
        ("infer-overflow", infer([t("INPUT0", "in", 2**64 - 1, 64), ones])),
        ("too-big-shm", infer([t("INPUT0", "in", 128), ones])),
        (
            "output-too-small",
            infer(
                [t("INPUT0", "in", 64), ones],
                [
                    {
                        "name": "OUTPUT0",
                        "parameters": {
                            "shared_memory_region": "out",
                            "shared_memory_byte_size": 32,
                        },
                    }
                ],
            ),
        ),
        (
            "output-binary",
            infer(
                [t("INPUT0", "in", 64), ones],
                [
                    {
                        "name": "OUTPUT0",
                        "parameters": {
                            "shared_memory_region": "out",
                            "shared_memory_byte_size": 64,
                            "binary_data": True,
                        },
                    }
                ],
            ),
        ),
        (
            "mixed-ok",
            infer(
                [t("INPUT0", "in", 64), ones],
                [
                    {
                        "name": "OUTPUT0",
                        "parameters": {
                            "shared_memory_region": "out",
                            "shared_memory_byte_size": 64,
                        },
                    },
                    {"name": "OUTPUT1"},
                ],
            ),
        ),
    ]


#: case -> (v2proxy's status, message) where Triton 2.51 answers otherwise
DIFFERENT = {
    # Triton 2.51 tries to open "/" (later releases refuse the key; v2proxy never echoes it)
    "key-slash": (400, "cannot register shared memory region 'c' - invalid shm key"),
    "key-slashes": (400, "cannot register shared memory region 'c' - invalid shm key"),
    # Triton: a TritonJson type error (500); v2proxy: a client error
    "no-key": (400, "Invalid value for 'key' of the shared memory register request"),
    # Triton 2.51 predates the overflow check (PR 2025) and reports the size mismatch
    "infer-overflow": (
        400,
        "Integer overflow detected: byte_size (18446744073709551615) + offset (64) exceeds"
        " maximum value (18446744073709551615) for region 'in'",
    ),
}


@contextlib.contextmanager
def objects(*sizes: int) -> Iterator[list[str]]:
    """POSIX shm objects of these sizes (keys returned), unlinked at the end."""
    keys = [f"/v2proxy_oracle_{os.getpid()}_{i}" for i in range(len(sizes))]
    made = []
    try:
        for key, size in zip(keys, sizes, strict=True):
            mem = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=size)
            mem.close_fd()
            made.append(key)
        yield keys
    finally:
        for key in made:
            posix_ipc.unlink_shared_memory(key)


def _run_cases(base: str, kin: str, kout: str, kbig: str) -> dict[str, tuple[int, str]]:
    for name, key in (("in", kin), ("out", kout)):
        assert call(base, *reg(name, key, 0, 128)) == (200, "")
    try:
        return {n: call(base, m, path, body) for n, (m, path, body) in cases(kin, kbig)}
    finally:
        assert call(base, "POST", "/v2/systemsharedmemory/unregister", b"") == (200, "")
        assert call(base, "GET", "/v2/systemsharedmemory/status") == (200, "[]")


@pytest.fixture(scope="module")
def shm_builtin() -> Iterator[Proc]:
    with v2proxy("serve", "--restricted-api", "none", name="shm-oracle") as p:
        yield p


def test_l0_cases_as_triton(shm_builtin: Proc, backend_urls: Any) -> None:
    triton = backend_urls("triton")[0]
    with objects(128, 128, 4 * PAGE) as (kin, kout, kbig):
        ours = _run_cases(shm_builtin.base_url, kin, kout, kbig)
        theirs = _run_cases(triton, kin, kout, kbig)
    for name, (status, message) in theirs.items():
        expected = DIFFERENT.get(name, (status, message.removeprefix(REQUEST_ID_PREFIX)))
        assert ours[name] == expected, name


# ---------------------------------------------------------------------- faults


def _still_serves(p: Proc) -> None:
    body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
                       for n in ("INPUT0", "INPUT1")]}  # fmt: skip
    status, _ = call(p.base_url, "POST", "/v2/models/simple/infer", body)
    assert status == 200


def test_truncated_object_is_an_error_not_a_crash(shm_builtin: Proc) -> None:
    base = shm_builtin.base_url
    ones = {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
    with objects(2 * PAGE) as (key,):
        assert call(base, *reg("trunc", key, PAGE, 64)) == (200, "")
        os.truncate("/dev/shm/" + key.lstrip("/"), 0)
        status, message = call(base, *infer([t("INPUT0", "trunc", 64), ones]))
        assert status == 400 and "no longer usable" in message, message
        assert key not in message
        out = [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "trunc",
                                                  "shared_memory_byte_size": 64}}]  # fmt: skip
        ones0 = {**ones, "name": "INPUT0"}
        status, message = call(base, *infer([ones0, ones], out))
        assert status == 400 and "no longer usable" in message, message
        assert call(base, "POST", "/v2/systemsharedmemory/region/trunc/unregister", b"")[0] == 200
    _still_serves(shm_builtin)


def test_unlinked_object_keeps_working(shm_builtin: Proc) -> None:
    base = shm_builtin.base_url
    ones = {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
    with objects(128) as (key,):
        assert call(base, *reg("gone", key, 0, 128)) == (200, "")
    # unlinked now: the proxy's mapping stays valid
    assert call(base, *infer([t("INPUT0", "gone", 64), ones]))[0] == 200
    assert call(base, "POST", "/v2/systemsharedmemory/region/gone/unregister", b"")[0] == 200
    _still_serves(shm_builtin)


def test_offsets_near_2_63_over_grpc(shm_builtin: Proc) -> None:
    with (
        grpcclient.InferenceServerClient(shm_builtin.grpc_url) as c,
        objects(128) as (key,),
    ):
        with pytest.raises(InferenceServerException) as err:
            c.register_system_shared_memory("far", key, 128, offset=2**63 - 1)
        assert "invalid args" in err.value.message()
        c.register_system_shared_memory("near", key, 128)
        try:
            for offset, size, text in (
                (2**63 - 1, 64, "Invalid offset for shared memory region: 'near'"),
                (64, 2**63 - 1, "Invalid offset + byte size for shared memory region: 'near'"),
            ):
                i0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
                i0.set_shared_memory("near", size, offset=offset)
                i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
                i1.set_data_from_numpy(np.ones((1, 16), np.int32))
                with pytest.raises(InferenceServerException) as err:
                    c.infer("simple", [i0, i1])
                assert err.value.message() == text
                assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        finally:
            c.unregister_system_shared_memory()
    _still_serves(shm_builtin)


class _SlowSum(StandIn):
    """A v2 REST backend whose /infer takes 1.5 s: OUTPUT0 = INPUT0 + INPUT1 (JSON)."""

    def do_GET(self) -> None:
        self._send(200, b'{"name":"slow","extensions":[]}' if self.path == "/v2" else b"{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = {i["name"]: i["data"] for i in body["inputs"]}
        time.sleep(1.5)
        out = [a + b for a, b in zip(data["INPUT0"], data["INPUT1"], strict=True)]
        answer = {"model_name": "simple", "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": out}]}  # fmt: skip
        self._send_json(200, answer)


def test_unregister_during_a_slow_inference_is_deferred() -> None:
    with (
        serving(_SlowSum) as url,
        v2proxy(
            "serve",
            "--backend",
            url,
            "--backend-encoding",
            "json",
            "--restricted-api",
            "none",
            name="shm-slow",
        ) as p,  # fmt: skip
        objects(128, 128) as (kin, kout),
    ):
        base = p.base_url
        a = np.arange(16, dtype="<i4")
        with open("/dev/shm/" + kin.lstrip("/"), "r+b") as f:
            f.write(a.tobytes() + a.tobytes())
        assert call(base, *reg("in", kin, 0, 128)) == (200, "")
        assert call(base, *reg("out", kout, 0, 128)) == (200, "")
        out = [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out",
                                                  "shared_memory_byte_size": 64}}]  # fmt: skip
        request = infer([t("INPUT0", "in", 64), t("INPUT1", "in", 64, 64)], out)
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.update(r=call(base, *request)))
        worker.start()
        time.sleep(0.5)  # at the backend now
        assert call(base, "POST", "/v2/systemsharedmemory/unregister", b"") == (200, "")
        _, listed = call(base, "GET", "/v2/systemsharedmemory/status")
        assert sorted(r["name"] for r in json.loads(listed)) == ["in", "out"]
        worker.join(30)
        assert result["r"][0] == 200, result
        with open("/dev/shm/" + kout.lstrip("/"), "rb") as f:
            got = np.frombuffer(f.read(64), "<i4")
        np.testing.assert_array_equal(got, a + a)
        assert call(base, "GET", "/v2/systemsharedmemory/status") == (200, "[]")
        assert call(base, "GET", "/v2/systemsharedmemory/region/in/status") == (
            404,
            "Unable to find system shared memory region: 'in'",
        )
