"""v2proxy in front of a gRPC backend, in process: failures of the backend become 503/504
(REST) and UNAVAILABLE/DEADLINE_EXCEEDED (gRPC) with a message; the proxy keeps serving."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tests.integration.conftest import Factory, proxy_to, stuck_grpc_backend
from tests.integration.test_rest_errors import simple_json
from tests.interop.peers.launch import _free_ports
from v2proxy._proto import grpc_service_pb2 as pb

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops


@pytest.fixture
async def slow_grpc_backend() -> AsyncIterator[str]:
    """A gRPC server whose ModelInfer never answers in time (a stuck model server)."""
    async with stuck_grpc_backend("ModelInfer", pb.ModelInferRequest, pb.ModelInferResponse) as url:
        yield url


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


def _streaming_backend(gaps: list[float]) -> grpc.aio.Server:
    """A gRPC server with one decoupled model ``llm`` whose ModelStreamInfer sends one token
    after each of ``gaps`` (seconds), then the final flag."""

    async def metadata(_request: Any, _context: Any) -> Any:
        return pb.ModelMetadataResponse(
            name="llm",
            versions=["1"],
            platform="python",
            inputs=[pb.ModelMetadataResponse.TensorMetadata(
                name="text_input", datatype="BYTES", shape=[1])],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(
                name="text_output", datatype="BYTES", shape=[1])],
        )  # fmt: skip

    async def config(_request: Any, _context: Any) -> Any:
        resp = pb.ModelConfigResponse()
        resp.config.name = "llm"
        resp.config.model_transaction_policy.decoupled = True
        return resp

    async def stream(requests: Any, _context: Any) -> Any:
        async for _ in requests:
            for i, gap in enumerate(gaps):
                await asyncio.sleep(gap)
                token = f"t{i}".encode()
                out = pb.ModelInferResponse(model_name="llm", model_version="1")
                t = out.outputs.add(name="text_output", datatype="BYTES", shape=[1])
                out.raw_output_contents.append(len(token).to_bytes(4, "little") + token)
                out.parameters["triton_final_response"].bool_param = False
                yield pb.ModelStreamInferResponse(infer_response=out)
                del t
            last = pb.ModelInferResponse(model_name="llm", model_version="1")
            last.parameters["triton_final_response"].bool_param = True
            yield pb.ModelStreamInferResponse(infer_response=last)

    def unary(fn: Any, req: Any, resp: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "inference.GRPCInferenceService",
                {
                    "ModelMetadata": unary(
                        metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse
                    ),
                    "ModelConfig": unary(config, pb.ModelConfigRequest, pb.ModelConfigResponse),
                    "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
                        stream,
                        request_deserializer=pb.ModelInferRequest.FromString,
                        response_serializer=pb.ModelStreamInferResponse.SerializeToString,
                    ),
                },
            )
        ]
    )
    return server


@pytest.mark.parametrize(
    ("gaps", "tokens", "error"),
    [
        # five tokens 0.25 s apart: 1.25 s in all, longer than --backend-timeout 0.6 s
        ([0.25] * 5, ["t0", "t1", "t2", "t3", "t4"], None),
        # the backend goes silent for longer than --backend-timeout after two tokens
        ([0.05, 0.05, 1.5], ["t0", "t1"], "sent no response of the stream for 0.6 s"),
    ],
)
async def test_grpc_stream_deadline_is_per_response(
    make_client: Factory, gaps: list[float], tokens: list[str], error: str | None
) -> None:
    """--backend-timeout bounds each response of a decoupled stream, not the whole stream
    (an LLM stream may last far longer than it)."""
    server = _streaming_backend(gaps)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        proxy = await proxy_to(make_client, f"grpc://127.0.0.1:{port}", backend_timeout=0.6)
        resp = await proxy.post("/v2/models/llm/generate_stream", data=b'{"text_input": "a b"}')
        assert resp.status == 200
        events = [
            json.loads(line[len(b"data: ") :])
            for line in (await resp.read()).split(b"\n")
            if line.startswith(b"data: ")
        ]
        got = [e["text_output"] for e in events if "text_output" in e]
        assert got == tokens
        errors = [e["error"] for e in events if "error" in e]
        if error is None:
            assert errors == []
        else:
            assert len(errors) == 1 and error in errors[0]
    finally:
        await server.stop(0)


async def test_decoupled_is_the_stores_config_asked_once_per_lifetime() -> None:
    """Whether a model is decoupled is the knowledge's configuration fact: a ModelConfig
    that fails with an answer (INTERNAL, UNIMPLEMENTED) counts as no config, kept for the
    store's lifetime like any answer (not asked again on every request); a backend that could
    not be asked (UNAVAILABLE) is asked again next time; the lifetime's end asks again."""
    from v2proxy.backends.grpc import GrpcBackend
    from v2proxy.core.errors import BackendError, BackendUnavailable, Unsupported
    from v2proxy.core.knowledge import KNOWLEDGE_TTL_S, BackendKnowledge

    now = [1000.0]
    answers: list[Any] = [
        BackendError("busy", 500, "INTERNAL"),
        {"model_transaction_policy": {"decoupled": True}},
    ]
    backend = GrpcBackend("127.0.0.1:1")
    backend.knowledge = BackendKnowledge(backend, clock=lambda: now[0])

    async def model_config(_model: str, _version: str) -> dict[str, Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    backend.model_config = model_config  # type: ignore[method-assign]
    for _ in range(3):  # asked once, whatever the number of requests
        assert await backend.is_decoupled("llm", "") is False
    assert len(answers) == 1
    now[0] += KNOWLEDGE_TTL_S  # the store's lifetime is over: asked again
    assert await backend.is_decoupled("llm", "") is True
    assert await backend.is_decoupled("llm", "") is True and answers == []  # kept
    assert (await backend.knowledge.config("llm", "")).decoupled is True  # the one store

    answers[:] = [Unsupported("no ModelConfig")]
    assert await backend.is_decoupled("other", "") is False
    assert await backend.is_decoupled("other", "") is False and answers == []  # asked once

    answers[:] = [BackendUnavailable("down"), {}]
    with pytest.raises(BackendUnavailable):
        await backend.is_decoupled("third", "")
    assert await backend.is_decoupled("third", "") is False and answers == []  # asked again


async def test_a_side_answer_over_the_bound_is_a_502_an_inference_is_not_bound_by_it() -> None:
    """Metadata and the other side calls go on a channel whose receive limit is
    ``max_answer_size``: a larger answer is a 502 naming the backend and the option (and counts
    against the endpoint), while an inference answer of the same size comes through."""
    from v2proxy.backends.grpc import GrpcBackend
    from v2proxy.core.errors import BadGateway

    big = "x" * 8192

    async def metadata(req: Any, _context: Any) -> Any:
        return pb.ServerMetadataResponse(name=big, version="1")

    async def ready(req: Any, _context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    async def infer(req: Any, _context: Any) -> Any:
        out = pb.ModelInferResponse(model_name="m", model_version="1")
        out.outputs.add(name="O", datatype="BYTES", shape=[1])
        out.raw_output_contents.append(len(big).to_bytes(4, "little") + big.encode())
        return out

    def unary(fn: Any, req: Any, resp: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )

    server = grpc.aio.server()
    handlers = {
        "ServerMetadata": unary(metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
        "ServerReady": unary(ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ModelInfer": unary(infer, pb.ModelInferRequest, pb.ModelInferResponse),
    }
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers)]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    backend: GrpcBackend | None = None
    try:
        backend = GrpcBackend(f"127.0.0.1:{port}", timeout=5, max_answer_size=4096)
        await backend.start()
        with pytest.raises(BadGateway) as info:
            await backend.server_metadata()
        message = str(info.value)
        assert f"127.0.0.1:{port}" in message and "--backend-max-answer-size" in message
        assert backend.endpoints.all[0].failures == 1
        assert await backend.server_ready() is True
        answer = await backend._call(
            "ModelInfer", pb.ModelInferRequest(model_name="m"), "inference"
        )
        assert len(answer.raw_output_contents[0]) == 4 + len(big)
    finally:
        if backend is not None:
            await backend.close()
        await server.stop(0)
