"""v2proxy in front of a gRPC backend, in process: failures of the backend become 503/504
(REST) and UNAVAILABLE/DEADLINE_EXCEEDED (gRPC) with a message; the proxy keeps serving."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from tests.integration.conftest import Factory, proxy_to
from tests.integration.test_rest_errors import simple_json
from tests.interop.peers.launch import _free_ports
from v2proxy._proto import grpc_service_pb2 as pb


@pytest.fixture
async def slow_grpc_backend() -> Any:
    """A gRPC server whose ModelInfer never answers in time (a stuck model server)."""

    async def model_infer(_request: Any, _context: Any) -> Any:
        await asyncio.sleep(10)
        return pb.ModelInferResponse()

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "inference.GRPCInferenceService",
                {
                    "ModelInfer": grpc.unary_unary_rpc_method_handler(
                        model_infer,
                        request_deserializer=pb.ModelInferRequest.FromString,
                        response_serializer=pb.ModelInferResponse.SerializeToString,
                    )
                },
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"grpc://127.0.0.1:{port}"
    await server.stop(0)


async def test_grpc_backend_deadline_is_504(make_client: Factory, slow_grpc_backend: str) -> None:
    proxy = await proxy_to(make_client, slow_grpc_backend, backend_timeout=0.3)
    resp = await proxy.post("/v2/models/simple/infer", data=simple_json())
    assert resp.status == 504
    assert "did not answer inference in time" in (await resp.json())["error"]


async def test_grpc_backend_unreachable_is_503(make_client: Factory) -> None:
    (port,) = _free_ports(1)
    proxy = await proxy_to(make_client, f"grpc://127.0.0.1:{port}", backend_timeout=5)
    resp = await proxy.post("/v2/models/simple/infer", data=simple_json())
    assert resp.status == 503
    assert "unavailable" in (await resp.json())["error"]
    assert (await proxy.get("/v2/health/live")).status == 200
    resp = await proxy.get("/v2/models/simple/stats")
    assert resp.status == 503


async def test_rest_only_paths_through_grpc_backend_are_501(
    make_client: Factory, slow_grpc_backend: str
) -> None:
    proxy = await proxy_to(make_client, slow_grpc_backend)
    resp = await proxy.post("/v2/models/llm/unknown_operation", data=b'{"text_input": "x"}')
    assert resp.status == 501
    assert "not available through a gRPC backend" in (await resp.json())["error"]


def test_grpc_metadata_forwarding_drops_framing_headers() -> None:
    """h2load and nghttp send `content-length` as gRPC metadata; passed on to a REST backend it
    would break the backend's framing."""
    from v2proxy.frontends.grpc_call import forwarded_headers

    class Context:
        def invocation_metadata(self) -> list[tuple[str, str]]:
            return [
                ("content-length", "123"),
                ("te", "trailers"),
                ("content-type", "application/grpc"),
                ("grpc-accept-encoding", "gzip"),
                ("x-request-id", "r1"),
                ("authorization", "Bearer t"),
                ("trace-bin", "\x00"),
            ]

    assert forwarded_headers(Context()) == [
        (b"x-request-id", b"r1"),
        (b"authorization", b"Bearer t"),
    ]
