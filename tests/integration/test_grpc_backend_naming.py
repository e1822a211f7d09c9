"""What a client is told when a gRPC backend fails: the operation it asked for and its model,
never an RPC the proxy made on its own behalf (the ModelConfig asked before each model's first
inference, to tell decoupled models); and how the start-up line shows every kind of backend."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from tests.integration.conftest import Factory, proxy_to, stuck_grpc_backend
from tests.integration.test_rest_errors import simple_json
from tests.interop.peers.launch import _free_ports
from v2proxy._proto import grpc_service_pb2 as pb


async def test_backend_down_during_infer_names_the_inference(make_client: Factory) -> None:
    (port,) = _free_ports(1)
    proxy = await proxy_to(make_client, f"grpc://127.0.0.1:{port}", backend_timeout=5)
    resp = await proxy.post("/v2/models/simple/infer", data=simple_json())
    assert resp.status == 503
    error = (await resp.json())["error"]
    assert error.startswith(
        f"backend at 127.0.0.1:{port} is unavailable for inference of model 'simple': "
    ), error
    assert "ModelConfig" not in error
    resp = await proxy.get("/v2/models/simple/config")
    error = (await resp.json())["error"]
    assert resp.status == 503
    assert error.startswith(f"backend at 127.0.0.1:{port} is unavailable for configuration of")


@pytest.fixture
async def stuck_config_backend() -> AsyncIterator[str]:
    """A gRPC server whose ModelConfig never answers in time."""
    async with stuck_grpc_backend(
        "ModelConfig", pb.ModelConfigRequest, pb.ModelConfigResponse
    ) as url:
        yield url


async def test_backend_stuck_before_infer_names_the_inference(
    make_client: Factory, stuck_config_backend: str
) -> None:
    proxy = await proxy_to(make_client, stuck_config_backend, backend_timeout=0.3)
    resp = await proxy.post("/v2/models/simple/infer", data=simple_json())
    assert resp.status == 504
    error = (await resp.json())["error"]
    target = stuck_config_backend.removeprefix("grpc://")
    assert error == f"backend at {target} did not answer inference in time (model 'simple')"


@pytest.mark.parametrize(
    ("backend", "shown"),
    [
        ("builtin", "builtin"),
        ("http://127.0.0.1:1", "http://127.0.0.1:1"),
        ("grpc://127.0.0.1:1", "grpc://127.0.0.1:1"),
        ("grpcs://127.0.0.1:1", "grpcs://127.0.0.1:1"),
        ("mindie://127.0.0.1:1", "mindie://127.0.0.1:1"),
    ],
)
def test_start_up_line_shows_the_backend_with_its_scheme(backend: str, shown: str) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "v2proxy",
            "serve",
            "--backend",
            backend,
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--event-loop",
            "asyncio",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "listening on" in line:
                break
        assert lines and lines[-1].rstrip().endswith(f"(backend: {shown})"), lines
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
