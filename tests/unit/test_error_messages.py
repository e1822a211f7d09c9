"""Every error can be written, whatever text it carries: a ProxyError's message is always valid
UTF-8 (a lone surrogate from the client's or a backend's JSON text is kept as its escape), so
that each frontend's one translator -- REST's JSON body, MindIE's JSON body, the gRPC status
details and ModelStreamInfer's in-band ``error_message`` -- answers it, never a 500 or a call
that dies without a status."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.core.errors import (
    BackendError,
    CodecError,
    InvalidRequest,
    NotFound,
    ProxyError,
    safe_text,
)
from v2proxy.frontends import mindie, rest
from v2proxy.frontends.grpc_call import guard
from v2proxy.ops.metrics_export import NullMetrics
from v2proxy.ops.recorders import FrontendRecorder

LONE = "unexpected inference output '\ud800' for model 'simple'"
#: what the client reads: the surrogate as its escape, six ASCII characters
ESCAPED = "unexpected inference output '\\ud800' for model 'simple'"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("plain ASCII", "plain ASCII"),
        ("caf\u00e9 \U0001f600 \u4e2d", "caf\u00e9 \U0001f600 \u4e2d"),  # valid text kept as is
        ("a\ud800", "a\\ud800"),
        ("\udc00\ud83d", "\\udc00\\ud83d"),  # a trailing, then a leading one with no pair
        ("\u00e9\udfff\u00e9", "\u00e9\\udfff\u00e9"),
    ],
)
def test_safe_text(text: str, want: str) -> None:
    assert safe_text(text) == want
    want.encode("utf-8")  # never raises


@pytest.mark.parametrize(
    "exc",
    [
        ProxyError(LONE),
        InvalidRequest(LONE),
        CodecError(LONE),
        NotFound(LONE),
        BackendError(LONE, 422),
    ],
    ids=lambda e: type(e).__name__,
)
def test_message_is_always_utf8(exc: ProxyError) -> None:
    assert exc.message == str(exc) == exc.args[0] == ESCAPED
    exc.message = "later: \udcff"
    assert exc.message == "later: \\udcff"


def test_rest_translator_writes_any_message() -> None:
    status, headers, body = rest.error_answer(InvalidRequest(LONE))  # type: ignore[misc]
    assert status == 400
    assert (b"content-type", b"application/json") in headers
    assert isinstance(body, bytes)
    assert json.loads(body) == {"error": ESCAPED}


def test_mindie_translator_writes_any_message() -> None:
    status, _, body = mindie.error_answer(CodecError(LONE))  # type: ignore[misc]
    assert status == 422
    assert json.loads(body) == {"error": ESCAPED, "error_type": "Input Validation Error"}


def test_grpc_stream_error_message_serializes() -> None:
    """ModelStreamInfer reports errors in-band in a protobuf string, which must be UTF-8."""
    data = pb.ModelStreamInferResponse(error_message=InvalidRequest(LONE).message)
    assert pb.ModelStreamInferResponse.FromString(data.SerializeToString()).error_message == (
        ESCAPED
    )


@pytest.fixture
async def failing_grpc() -> AsyncIterator[str]:
    """A gRPC server whose ModelInfer, wrapped in the frontend's envelope (``guard``), raises
    an error naming the client's tensor with a lone surrogate appended."""

    async def model_infer(msg: Any, _context: Any) -> Any:
        raise InvalidRequest(f"unexpected inference output '{msg.inputs[0].name}\ud800'")

    handler = guard(
        model_infer, pb.ModelInferRequest, "ModelInfer", FrontendRecorder(NullMetrics(), "grpc")
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "inference.GRPCInferenceService",
                {"ModelInfer": grpc.unary_unary_rpc_method_handler(handler)},
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


async def test_grpc_status_details_carry_any_message(failing_grpc: str) -> None:
    async with grpc.aio.insecure_channel(failing_grpc) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        request = pb.ModelInferRequest(
            model_name="simple", inputs=[pb.ModelInferRequest.InferInputTensor(name="X")]
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "unexpected inference output 'X\\ud800'"
