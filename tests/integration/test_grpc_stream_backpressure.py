"""gRPC ``ModelStreamInfer`` holds the model back when its client reads slowly: the answers
serialized ahead of the client are bounded (the frontend's queue), so a client that takes one
answer and then stops reading costs the proxy a few answers' memory, not the whole generation.
A stream's requests are served --max-stream-in-flight at a time (the next is not read until one
ends), and a cancel ends those being served.
In process: builtin backends that count what they make or serve."""

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


class Held(BuiltinBackend):
    """Serves every request of a stream until cancelled, counting those being served."""

    running = 0
    most = 0
    changed = asyncio.Condition()

    async def _count(self, n: int) -> None:
        async with Held.changed:
            Held.running += n
            Held.most = max(Held.most, Held.running)
            Held.changed.notify_all()

    async def stream_infer(
        self, request: InferRequest, headers: Headers
    ) -> AsyncIterator[InferResponse]:
        await self._count(1)
        try:
            await asyncio.sleep(3600)
        finally:
            await self._count(-1)
        yield InferResponse(request.model_name, [])  # pragma: no cover


async def test_a_stream_serves_at_most_max_stream_in_flight_and_a_cancel_frees_them() -> None:
    """While --max-stream-in-flight requests of a stream are served, the next is not read
    (each message used to start a task at once: all 200 were served together); a cancel ends
    those being served within a second."""
    Held.running = Held.most = 0
    Held.changed = asyncio.Condition()
    s = settings(max_stream_in_flight=4)
    async with grpc_frontend(s, build_pipeline(s, Held(), cuda_adapter=None)) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        stream = call(iter([pb.ModelInferRequest(model_name="held")] * 200))
        async with asyncio.timeout(5), Held.changed:
            await Held.changed.wait_for(lambda: Held.running >= 4)
        await asyncio.sleep(0.5)  # were more read, they would be served by now
        assert (Held.running, Held.most) == (4, 4)
        stream.cancel()
        async with asyncio.timeout(1), Held.changed:  # within a second of the cancel
            await Held.changed.wait_for(lambda: Held.running == 0)
