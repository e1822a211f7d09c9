"""System shared memory through v2proxy (docs/protocol.md, shared memory), with real clients and
real peers: ``tritonclient.utils.shared_memory`` with ``tritonclient.http`` and
``tritonclient.grpc`` run the flows of Triton's ``simple_{http,grpc}_shm_client.py`` and
``..._shm_string_client.py`` through v2proxy in front of every backend (builtin, reference server,
KServe, MLServer, Triton over REST and gRPC); the ``L0_shared_memory`` cases that apply to a proxy
are run against v2proxy and straight against Triton (2.51, system shm on CPU) to compare statuses
and messages; fault tests (an object truncated or unlinked after registration, unregister during a
slow inference, offsets near 2^63) check errors, no crash, and that the proxy keeps serving.

The proxies here open the ``shared-memory`` group (``--restricted-api none``); the conftest's
shared proxies keep the default. Every shared-memory object a test creates is unlinked.
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import BACKENDS, Servers, _backend_url
from procs import Proc, v2proxy
from tritonclient.utils import (
    serialize_byte_tensor,
    serialized_byte_size,
)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
PAGE = os.sysconf("SC_PAGE_SIZE")
STRING_BACKENDS = {"builtin", "reference", "reference-grpc", "triton", "triton-grpc"}
CLIENTS = {"http": httpclient, "grpc": grpcclient}


def _key(name: str) -> str:
    return f"/v2proxy_test_{os.getpid()}_{name}"


@contextlib.contextmanager
def regions() -> Iterator[Callable[[str, int], Any]]:
    """``make(name, size)`` -> a tritonclient shm handle with key :func:`_key`; all destroyed
    (unlinked) at the end."""
    made: list[Any] = []

    def make(name: str, size: int) -> Any:
        handle = shm.create_shared_memory_region(name, _key(name), size)
        made.append(handle)
        return handle

    try:
        yield make
    finally:
        for handle in made:
            with contextlib.suppress(Exception):
                shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="session")
def shm_proxies() -> dict[str, Proc]:
    return {}


@pytest.fixture(params=BACKENDS)
def shm_proxy(
    request: pytest.FixtureRequest,
    stack: contextlib.ExitStack,
    servers: Servers,
    shm_proxies: dict[str, Proc],
) -> Proc:
    """v2proxy in front of each backend with the shared-memory group open."""
    return _shm_proxy(request.param, stack, servers, shm_proxies)


@pytest.fixture(params=[b for b in BACKENDS if b in STRING_BACKENDS])
def string_shm_proxy(
    request: pytest.FixtureRequest,
    stack: contextlib.ExitStack,
    servers: Servers,
    shm_proxies: dict[str, Proc],
) -> Proc:
    """The same, in front of the backends that serve ``simple_string``."""
    return _shm_proxy(request.param, stack, servers, shm_proxies)


def _shm_proxy(
    backend: str, stack: contextlib.ExitStack, servers: Servers, cache: dict[str, Proc]
) -> Proc:
    if backend not in cache:
        url = _backend_url(backend, stack, servers)
        cache[backend] = stack.enter_context(
            v2proxy("serve", "--backend", url, "--restricted-api", "none", name=f"shm-{backend}")
        )
    return cache[backend]


@pytest.fixture
def builtin(stack: contextlib.ExitStack, servers: Servers, shm_proxies: dict[str, Proc]) -> Proc:
    return _shm_proxy("builtin", stack, servers, shm_proxies)


def _client(kind: str, p: Proc) -> Any:
    return CLIENTS[kind].InferenceServerClient(p.url if kind == "http" else p.grpc_url)


def _shape(result: Any, name: str, kind: str) -> list[int]:
    out = result.get_output(name)
    return list(out["shape"] if kind == "http" else out.shape)


def _output(kind: str, name: str) -> Any:
    mod = CLIENTS[kind]
    return (
        mod.InferRequestedOutput(name, binary_data=True)
        if kind == "http"
        else (mod.InferRequestedOutput(name))
    )


# ---------------------------------------------------------------------- the examples' flows


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_simple_shm_client_flow(shm_proxy: Proc, kind: str) -> None:
    simple_shm_flow(shm_proxy, kind)


def simple_shm_flow(proxy: Proc, kind: str) -> None:
    """simple_{http,grpc}_shm_client.py: both inputs and both outputs in shared memory."""
    mod = CLIENTS[kind]
    with _client(kind, proxy) as c:
        c.unregister_system_shared_memory()
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        with regions() as make:
            out = make("output_data", 128)
            inp = make("input_data", 128)
            shm.set_shared_memory_region(inp, [a])
            shm.set_shared_memory_region(inp, [b], offset=64)
            c.register_system_shared_memory("output_data", _key("output_data"), 128)
            c.register_system_shared_memory("input_data", _key("input_data"), 128)
            status = c.get_system_shared_memory_status()
            assert len(status if kind == "http" else status.regions) == 2
            i0 = mod.InferInput("INPUT0", [1, 16], "INT32")
            i0.set_shared_memory("input_data", 64)
            i1 = mod.InferInput("INPUT1", [1, 16], "INT32")
            i1.set_shared_memory("input_data", 64, offset=64)
            o0, o1 = _output(kind, "OUTPUT0"), _output(kind, "OUTPUT1")
            o0.set_shared_memory("output_data", 64)
            o1.set_shared_memory("output_data", 64, offset=64)
            result = c.infer("simple", [i0, i1], outputs=[o0, o1])
            shape = _shape(result, "OUTPUT0", kind)
            assert shape == [1, 16]
            if kind == "http":
                entry = result.get_output("OUTPUT0")
                assert set(entry) == {"name", "datatype", "shape"}
            got0 = shm.get_contents_as_numpy(out, np.int32, shape)
            got1 = shm.get_contents_as_numpy(out, np.int32, shape, offset=64)
            np.testing.assert_array_equal(got0, a + b)
            np.testing.assert_array_equal(got1, a - b)
            c.unregister_system_shared_memory("output_data")
            status = c.get_system_shared_memory_status()
            assert len(status if kind == "http" else status.regions) == 1
            c.unregister_system_shared_memory()
            status = c.get_system_shared_memory_status()
            assert len(status if kind == "http" else status.regions) == 0


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_simple_shm_string_client_flow(string_shm_proxy: Proc, kind: str) -> None:
    """simple_{http,grpc}_shm_string_client.py: BYTES inputs and outputs in shared memory."""
    shm_proxy = string_shm_proxy
    mod = CLIENTS[kind]
    with _client(kind, shm_proxy) as c:
        c.unregister_system_shared_memory()
        a = np.array([str(x).encode() for x in range(16)], dtype=np.object_).reshape(1, 16)
        b = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
        sa, sb = serialize_byte_tensor(a), serialize_byte_tensor(b)
        na, nb = serialized_byte_size(sa), serialized_byte_size(sb)
        with regions() as make:
            inp0, inp1 = make("input0_data", na), make("input1_data", nb)
            out0, out1 = make("output0_data", 512), make("output1_data", 512)
            shm.set_shared_memory_region(inp0, [sa])
            shm.set_shared_memory_region(inp1, [sb])
            for name, size in (("input0_data", na), ("input1_data", nb)):
                c.register_system_shared_memory(name, _key(name), size)
            for name in ("output0_data", "output1_data"):
                c.register_system_shared_memory(name, _key(name), 512)
            i0 = mod.InferInput("INPUT0", [1, 16], "BYTES")
            i0.set_shared_memory("input0_data", na)
            i1 = mod.InferInput("INPUT1", [1, 16], "BYTES")
            i1.set_shared_memory("input1_data", nb)
            o0, o1 = _output(kind, "OUTPUT0"), _output(kind, "OUTPUT1")
            o0.set_shared_memory("output0_data", 512)
            o1.set_shared_memory("output1_data", 512)
            result = c.infer("simple_string", [i0, i1], outputs=[o0, o1])
            shape = _shape(result, "OUTPUT0", kind)
            got0 = shm.get_contents_as_numpy(out0, np.object_, shape)
            got1 = shm.get_contents_as_numpy(out1, np.object_, shape)
            assert [int(x) for x in got0.reshape(-1)] == [x + 1 for x in range(16)]
            assert [int(x) for x in got1.reshape(-1)] == [x - 1 for x in range(16)]
            c.unregister_system_shared_memory()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_mixed_raw_and_shm(shm_proxy: Proc, kind: str) -> None:
    """qa test_mixed_raw_shm: INPUT0 in shm, INPUT1 in the request; OUTPUT0 in shm, OUTPUT1
    answered normally."""
    mod = CLIENTS[kind]
    with _client(kind, shm_proxy) as c:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), 3, dtype=np.int32)
        with regions() as make:
            inp, out = make("mixed_in", 64), make("mixed_out", 64)
            shm.set_shared_memory_region(inp, [a])
            c.register_system_shared_memory("mixed_in", _key("mixed_in"), 64)
            c.register_system_shared_memory("mixed_out", _key("mixed_out"), 64)
            try:
                i0 = mod.InferInput("INPUT0", [1, 16], "INT32")
                i0.set_shared_memory("mixed_in", 64)
                i1 = mod.InferInput("INPUT1", [1, 16], "INT32")
                i1.set_data_from_numpy(b)
                o0, o1 = _output(kind, "OUTPUT0"), _output(kind, "OUTPUT1")
                o0.set_shared_memory("mixed_out", 64)
                result = c.infer("simple", [i0, i1], outputs=[o0, o1])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
                got = shm.get_contents_as_numpy(out, np.int32, [1, 16])
                np.testing.assert_array_equal(got, a + b)
            finally:
                c.unregister_system_shared_memory()
