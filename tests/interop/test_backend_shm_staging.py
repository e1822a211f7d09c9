"""``--backend-shm``: v2proxy stages large inputs in its own shared-memory regions registered with
the real Triton (REST and gRPC backends), so they never cross the socket. Staging is seen in
``v2proxy_shm_staging_total`` and in Triton's own region status; small tensors, ``off`` and a
backend without the extension (MLServer) send data as before; the pool's objects are unlinked
(and unregistered from Triton) when v2proxy exits."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from procs import Proc, v2proxy
from test_metrics_workers import _scrape, _sum
from tritonclient.utils import InferenceServerException

STAGING = "v2proxy_shm_staging_total"
MiB = 1024 * 1024


def _counts(p: Proc) -> dict[str, float]:
    samples = _scrape(p.port)
    return {r: _sum(samples, STAGING, result=r) for r in ("hit", "miss", "fallback")}


def _objects(pid: int) -> list[str]:
    """The staging objects process ``pid`` has mapped: their names carry a random token, so
    /proc tells which are its own. Each is checked to be mode 0600 and named
    ``v2proxy-<32 hex>-<n>`` (unguessable, reserved prefix)."""
    names = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(None, 5)[5:]
            if path and path[0].startswith("/dev/shm/v2proxy-"):
                names.add(path[0].removeprefix("/dev/shm/").removesuffix(" (deleted)"))
    for name in names:
        assert re.fullmatch(r"v2proxy-[0-9a-f]{32}-[0-9]+", name), name
        assert stat.S_IMODE(os.stat(f"/dev/shm/{name}").st_mode) == 0o600
    return sorted(names)


def _identity(p: Proc, data: np.ndarray, kind: str = "http") -> np.ndarray:
    mod = httpclient if kind == "http" else grpcclient
    url = p.url if kind == "http" else p.grpc_url
    client = mod.InferenceServerClient(url)
    try:
        inp = mod.InferInput("INPUT0", list(data.shape), "FP32")
        if kind == "http":
            inp.set_data_from_numpy(data, binary_data=True)
            out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
        else:
            inp.set_data_from_numpy(data)
            out = [grpcclient.InferRequestedOutput("OUTPUT0")]
        result = client.infer("identity_fp32", [inp], outputs=out)
        return result.as_numpy("OUTPUT0")
    finally:
        client.close()


def _triton_regions(backend_urls, names: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    """Which of the staging regions ``names`` Triton has registered."""
    rest, _ = backend_urls("triton")
    client = httpclient.InferenceServerClient(rest.split("://", 1)[1])
    try:
        status = client.get_system_shared_memory_status()
    finally:
        client.close()
    return sorted(r["name"] for r in status if r["name"] in names)


@contextlib.contextmanager
def _proxy(backend: str, *extra: str) -> Iterator[Proc]:
    with v2proxy("serve", "--backend", backend, *extra, name="shm-staging") as p:
        yield p


@pytest.fixture(scope="module", params=["rest", "grpc"])
def triton_url(request: pytest.FixtureRequest, backend_urls) -> str:  # type: ignore[no-untyped-def]
    rest, grpc = backend_urls("triton")
    return rest if request.param == "rest" else f"grpc://{grpc}"


@pytest.fixture(scope="module")
def staged(triton_url: str) -> Iterator[Proc]:
    with _proxy(triton_url, "--backend-shm", "auto", "--restricted-api", "none") as p:
        yield p


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_large_input_is_staged(staged: Proc, kind: str, triton_url: str, backend_urls) -> None:  # type: ignore[no-untyped-def]
    data = np.random.default_rng(1).standard_normal(MiB // 4).astype(np.float32)
    before = _counts(staged)
    for _ in range(3):
        assert np.array_equal(_identity(staged, data, kind), data)
    after = _counts(staged)
    if kind == "http" and not triton_url.startswith("grpc://"):
        # a binary HTTP body to a REST backend is relayed unchanged: never staged
        assert after == before
        return
    assert after["hit"] - before["hit"] == 3
    assert after["miss"] == before["miss"] and after["fallback"] == 0
    # the pool's regions (the probe's and one for 1 MiB, reused) are registered with Triton
    mapped = _objects(staged.pid)
    names = _triton_regions(backend_urls, mapped)
    assert names and names == mapped
    assert len(names) <= 2


def test_small_tensors_are_not_staged(staged: Proc) -> None:
    data = np.arange(1000, dtype=np.float32)
    before = _counts(staged)
    assert np.array_equal(_identity(staged, data), data)
    assert _counts(staged) == before


def test_client_shm_input_is_staged(staged: Proc) -> None:
    """A client's shm input in front of Triton: copied once into a staging region."""
    data = np.random.default_rng(2).standard_normal(MiB // 4).astype(np.float32)
    key = f"/v2proxy_test_staging_{os.getpid()}"
    handle = shm.create_shared_memory_region("stage_in", key, data.nbytes)
    client = httpclient.InferenceServerClient(staged.url)
    try:
        shm.set_shared_memory_region(handle, [data])
        client.register_system_shared_memory("stage_in", key, data.nbytes)
        inp = httpclient.InferInput("INPUT0", [data.size], "FP32")
        inp.set_shared_memory("stage_in", data.nbytes)
        before = _counts(staged)
        result = client.infer("identity_fp32", [inp])
        assert np.array_equal(result.as_numpy("OUTPUT0"), data)
        assert _counts(staged)["hit"] == before["hit"] + 1
    finally:
        with contextlib.suppress(Exception):
            client.unregister_system_shared_memory("stage_in")
        client.close()
        shm.destroy_shared_memory_region(handle)


def _staged_bytes(p: Proc) -> dict[str, float]:
    samples = _scrape(p.port)
    return {
        d: _sum(samples, "v2proxy_shm_staged_bytes_total", direction=d) for d in ("input", "output")
    }


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_client_shm_output_of_open_shape_is_staged(staged: Proc, kind: str) -> None:
    """A client's shm input and output in front of Triton (OUTPUT0 has shape [-1]): the client's
    output region bounds the answer, so the output is staged too and copied once into it; a
    region too small for the answer gets the proxy's error and the proxy keeps staging."""
    mod = httpclient if kind == "http" else grpcclient
    data = np.random.default_rng(4).standard_normal(MiB // 4).astype(np.float32)
    key_in, key_out = (f"/v2proxy_test_st{d}_{kind}_{os.getpid()}" for d in ("in", "out"))
    h_in = shm.create_shared_memory_region("st_in", key_in, data.nbytes)
    h_out = shm.create_shared_memory_region("st_out", key_out, data.nbytes)
    client = mod.InferenceServerClient(staged.url if kind == "http" else staged.grpc_url)
    try:
        shm.set_shared_memory_region(h_in, [data])
        client.register_system_shared_memory("st_in", key_in, data.nbytes)
        client.register_system_shared_memory("st_out", key_out, data.nbytes)
        inp = mod.InferInput("INPUT0", [data.size], "FP32")
        inp.set_shared_memory("st_in", data.nbytes)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("st_out", data.nbytes)
        before = _staged_bytes(staged)
        result = client.infer("identity_fp32", [inp], outputs=[out])
        answered = result.get_output("OUTPUT0")
        shape = answered["shape"] if kind == "http" else list(answered.shape)
        assert shape == [data.size]
        got = shm.get_contents_as_numpy(h_out, np.float32, [data.size])
        assert np.array_equal(got, data)
        after = _staged_bytes(staged)
        assert after["input"] - before["input"] == data.nbytes
        assert after["output"] - before["output"] == data.nbytes

        small = mod.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory("st_out", data.nbytes // 2)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("identity_fp32", [inp], outputs=[small])
        assert (
            "shared memory size specified with the request for output 'OUTPUT0'"
            f" ({data.nbytes // 2} bytes) should be at least {data.nbytes} bytes to hold the"
            " results"
        ) in str(caught.value)
        assert "request id" not in str(caught.value)
        before = _staged_bytes(staged)
        client.infer("identity_fp32", [inp], outputs=[out])  # still staged
        assert _staged_bytes(staged)["output"] - before["output"] == data.nbytes
    finally:
        for name in ("st_in", "st_out"):
            with contextlib.suppress(Exception):
                client.unregister_system_shared_memory(name)
        client.close()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)


def test_off_never_stages(triton_url: str) -> None:
    data = np.random.default_rng(3).standard_normal(MiB // 4).astype(np.float32)
    with _proxy(triton_url, "--backend-shm", "off") as p:
        assert np.array_equal(_identity(p, data, "grpc"), data)
        counts = _counts(p)
        assert counts["hit"] == 0 and counts["miss"] == 1
        assert _objects(p.pid) == []


def test_threshold_setting(triton_url: str) -> None:
    data = np.random.default_rng(4).standard_normal(MiB // 4).astype(np.float32)
    with _proxy(triton_url, "--backend-shm-threshold", str(2 * MiB)) as p:
        assert np.array_equal(_identity(p, data, "grpc"), data)
        assert _counts(p) == {"hit": 0, "miss": 0, "fallback": 0}


def test_exit_unlinks_and_unregisters(triton_url: str, backend_urls) -> None:  # type: ignore[no-untyped-def]
    data = np.random.default_rng(5).standard_normal(4 * MiB // 4).astype(np.float32)
    with _proxy(triton_url, "--backend-shm", "system") as p:
        pid = p.pid
        assert np.array_equal(_identity(p, data, "grpc"), data)
        assert _counts(p)["hit"] == 1
        names = _objects(pid)
        assert len(names) == 2  # the probe's region and a 4 MiB one
        assert _triton_regions(backend_urls, names) == names
    assert [n for n in names if os.path.exists(f"/dev/shm/{n}")] == []
    assert _triton_regions(backend_urls, names) == []


@pytest.mark.parametrize("proto", ["rest", "grpc"])
def test_mlserver_auto_does_not_stage(proto: str, backend_urls) -> None:  # type: ignore[no-untyped-def]
    rest, grpc = backend_urls("mlserver")
    data = np.random.default_rng(6).standard_normal(MiB // 4).astype(np.float32)
    with _proxy(rest if proto == "rest" else f"grpc://{grpc}") as p:
        for _ in range(2):
            assert np.array_equal(_identity(p, data), data)
        counts = _counts(p)
        assert counts["hit"] == 0 and counts["miss"] == 2 and counts["fallback"] == 0
        assert _objects(p.pid) == []
