"""Fixtures for interop tests: real clients (tritonclient) against v2proxy processes in front of
real servers: the builtin models, ``v2proxy reference-server``, KServe ModelServer, MLServer and
Triton Inference Server (each in its own venv, made by tests/interop/peers/setup_peers.sh;
`make test` runs it)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import launch
from procs import Proc, v2proxy

#: every backend v2proxy is tested in front of; "-grpc" means over the server's gRPC port
BACKENDS = [
    "builtin",
    "reference",
    "reference-grpc",
    "kserve",
    "kserve-grpc",
    "mlserver",
    "mlserver-grpc",
    "triton",
    "triton-grpc",
]
#: the backend servers, each started once per session: name -> (REST base URL, gRPC host:port)
Servers = dict[str, tuple[str, str]]
LOOP_NAMES = ["uvloop", "asyncio"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "interop" in str(item.path):
            item.add_marker(pytest.mark.interop)


@pytest.fixture(scope="session")
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as s:
        yield s


@pytest.fixture(scope="session")
def servers(stack: contextlib.ExitStack) -> Servers:
    """The backend servers, started lazily once per session."""
    return {}


def _server(name: str, stack: contextlib.ExitStack, cache: Servers) -> tuple[str, str]:
    if name not in cache:
        if name == "reference":
            p = stack.enter_context(v2proxy("reference-server", name="reference"))
            cache[name] = (p.base_url, p.grpc_url)
        else:
            peers = Path(os.environ.get("V2PROXY_PEERS_DIR") or launch.peers_dir())
            peer = stack.enter_context(launch.SERVERS[name](peers))
            cache[name] = (peer.base_url, peer.grpc_url)
    return cache[name]


def _backend_url(backend: str, stack: contextlib.ExitStack, cache: Servers) -> str:
    """The --backend value for a BACKENDS entry."""
    if backend == "builtin":
        return "builtin"
    server, _, proto = backend.partition("-")
    rest, grpc = _server(server, stack, cache)
    return f"grpc://{grpc}" if proto == "grpc" else rest


@pytest.fixture(scope="session")
def proxies(stack: contextlib.ExitStack, servers: Servers) -> dict[tuple[str, str], Proc]:
    return {}


def _proxy(
    key: tuple[str, str],
    stack: contextlib.ExitStack,
    servers: Servers,
    proxies: dict[tuple[str, str], Proc],
) -> Proc:
    if key not in proxies:
        backend, loop = key
        url = _backend_url(backend, stack, servers)
        proxies[key] = stack.enter_context(
            v2proxy("serve", "--backend", url, "--event-loop", loop, name=f"proxy-{backend}")
        )
    return proxies[key]


@pytest.fixture(
    params=[(b, loop) for b in BACKENDS for loop in LOOP_NAMES], ids=lambda p: f"{p[0]}-{p[1]}"
)
def proxy(
    request: pytest.FixtureRequest,
    stack: contextlib.ExitStack,
    servers: Servers,
    proxies: dict[tuple[str, str], Proc],
) -> Proc:
    """A v2proxy process (per backend and event loop) shared by the whole session."""
    return _proxy(request.param, stack, servers, proxies)


#: the backends hosting the decoupled builtin `llm`, reached so that it stays decoupled
#: (over gRPC: the REST /infer endpoint has no way to give several responses)
DECOUPLED_BACKENDS = ["builtin", "reference-grpc", "triton-grpc"]


@pytest.fixture(
    params=[(b, loop) for b in DECOUPLED_BACKENDS for loop in LOOP_NAMES],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def llm_proxy(
    request: pytest.FixtureRequest,
    stack: contextlib.ExitStack,
    servers: Servers,
    proxies: dict[tuple[str, str], Proc],
) -> Proc:
    """A v2proxy process in front of a backend with the decoupled `llm` model."""
    return _proxy(request.param, stack, servers, proxies)


def backend_of(proxy_fixture_request: pytest.FixtureRequest) -> str:
    return str(proxy_fixture_request.node.callspec.params["proxy"][0])


@pytest.fixture
def backend_name(request: pytest.FixtureRequest) -> str:
    return backend_of(request)


@pytest.fixture(scope="session")
def backend_urls(stack: contextlib.ExitStack, servers: Servers):  # type: ignore[no-untyped-def]
    """Direct access to a backend server: name -> (REST base URL, gRPC host:port)."""
    return lambda name: _server(name, stack, servers)


@pytest.fixture(scope="session")
def builtin_proxy(
    stack: contextlib.ExitStack, servers: Servers, proxies: dict[tuple[str, str], Proc]
) -> Proc:
    """v2proxy with the builtin models (uvloop), shared with the `proxy` fixture's own."""
    return _proxy(("builtin", "uvloop"), stack, servers, proxies)
