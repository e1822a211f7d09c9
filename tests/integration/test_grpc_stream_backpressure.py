"""gRPC ``ModelStreamInfer`` holds the model back when its client reads slowly: the answers
serialized ahead of the client are bounded (the frontend's queue), so a client that takes one
answer and then stops reading costs the proxy a few answers' memory, not the whole generation.
In process: a builtin backend whose stream never ends and counts what it made."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tests.integration.conftest import grpc_frontend, settings
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.app_core import build_pipeline
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.core.model import Datatype, InferRequest, InferResponse, Tensor
from v2proxy.core.ports import Headers


class Endless(BuiltinBackend):
    """Answers every stream with 64 KiB responses without end, counting them."""

    made = 0

    async def stream_infer(
        self, request: InferRequest, headers: Headers
    ) -> AsyncIterator[InferResponse]:
        while True:
            Endless.made += 1
            data = bytes(64 * 1024)
            yield InferResponse(
                request.model_name, [Tensor("OUT", Datatype.UINT8, (len(data),), data)]
            )
            await asyncio.sleep(0)


async def test_a_slow_reader_holds_the_model_back() -> None:
    Endless.made = 0
    s = settings()
    async with grpc_frontend(s, build_pipeline(s, Endless(), cuda_adapter=None)) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        stream = call(iter([pb.ModelInferRequest(model_name="endless")]))
        first = await stream.read()
        assert first.infer_response.outputs[0].name == "OUT"
        await asyncio.sleep(1.0)  # the client reads nothing more
        made = Endless.made
        # the queue (16) plus what grpc's own buffers and windows hold: far from the
        # thousands an unbounded queue lets the model make in that second
        assert made < 1000, made
        stream.cancel()
