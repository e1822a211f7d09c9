"""The gRPC frontend (grpc.aio): every RPC of ``inference.GRPCInferenceService`` plus
``grpc.health.v1.Health`` (docs/protocol.md, endpoints: gRPC)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from time import perf_counter
from typing import Any

import grpc

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy._proto import health_pb2
from v2proxy._proto.service import SERVICE, UNARY_RPCS
from v2proxy.codecs import grpc as grpcc
from v2proxy.codecs import grpc_side
from v2proxy.core.admission import AdmissionGate
from v2proxy.core.errors import CodecError, Overloaded, ProxyError, Unsupported
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import Headers
from v2proxy.core.restricted import OPEN, AccessPolicy
from v2proxy.frontends.grpc_call import (
    CallEnvelope,
    Context,
    answerable,
    check_call,
    forwarded_headers,
    guard,
    parse,
    refusal_trailers,
    status_code,
)
from v2proxy.frontends.grpc_health import Health
from v2proxy.frontends.grpc_routes import HEALTH_SERVICE, RPCS
from v2proxy.frontends.grpc_shm import SharedMemoryRpcs, peer_of
from v2proxy.ops.config_spec import DEFAULTS
from v2proxy.ops.metrics_export import AnyMetrics, NullMetrics
from v2proxy.ops.recorders import FrontendRecorder

log = logging.getLogger(__name__)
#: answers of one ModelStreamInfer call queued ahead of the client at most
_STREAM_QUEUE = 16

_STREAM_RPC = RPCS["ModelStreamInfer"]
_STREAM = _STREAM_RPC.operation
_FINAL = "triton_final_response"
_EMPTY_FINAL = "triton_enable_empty_final_response"


def _no_reserved_keys(parameters: dict[str, Any]) -> None:
    for key in parameters:
        if key.startswith("triton_"):
            raise CodecError(
                f"parameter keys starting with 'triton_' are reserved for Triton usage and"
                f" should not be specified (got '{key}')"
            )


class GrpcFrontend:
    """Serves the v2 gRPC API on top of a :class:`Pipeline`."""

    def __init__(
        self,
        pipeline: Pipeline,
        metrics: AnyMetrics | None = None,
        access_log: bool = False,
        gate: AdmissionGate | None = None,
        stream_in_flight: int = DEFAULTS["max_stream_in_flight"],
        health_watches: int = DEFAULTS["max_health_watches"],
        access: AccessPolicy = OPEN,
    ) -> None:
        self.pipeline = pipeline
        self.recorder = FrontendRecorder(metrics or NullMetrics(), "grpc", access_log)
        #: --max-concurrency, shared with the REST frontend
        self.gate = gate or AdmissionGate()
        self.access = access
        self._stream_envelope = CallEnvelope(self.recorder, self.gate, _STREAM_RPC.path)
        self._limits = (pipeline.max_tensors, pipeline.max_input_size)
        self.shm = SharedMemoryRpcs(pipeline)
        self._stream_in_flight = stream_in_flight
        self.health = Health(self._ready, health_watches, access)

    def handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        # answers leave the handlers serialized (bytes), so that their size is known
        rec, gate, access = self.recorder, self.gate, self.access
        unary = {
            name: grpc.unary_unary_rpc_method_handler(
                guard(
                    self._rpc(name),
                    req,
                    name,
                    rec,
                    gate,
                    with_bytes=name == "ModelInfer",
                    access=access,
                )
            )
            for name, (req, _resp) in UNARY_RPCS.items()
        }
        unary[_STREAM_RPC.name] = grpc.stream_stream_rpc_method_handler(self.ModelStreamInfer)
        health = {
            # the health service checks access itself: a refused call is told NOT_SERVING
            "Check": grpc.unary_unary_rpc_method_handler(
                guard(
                    self.health.Check,
                    health_pb2.HealthCheckRequest,
                    "Check",
                    rec,
                    gate,
                    access=None,
                )
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self.health.Watch,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            ),
        }
        return [
            grpc.method_handlers_generic_handler(SERVICE, unary),
            grpc.method_handlers_generic_handler(HEALTH_SERVICE, health),
        ]

    def _rpc(self, name: str) -> Callable[[Any, Context], Awaitable[Any]]:
        owner: Any = self.shm if name in SharedMemoryRpcs.NAMES else self
        method: Callable[[Any, Context], Awaitable[Any]] = getattr(owner, name)
        return method

    async def _ready(self) -> bool:
        return await self.pipeline.server_ready()

    async def ServerLive(self, _r: pb.ServerLiveRequest, _c: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=await self.pipeline.server_live())

    async def ServerReady(self, _r: pb.ServerReadyRequest, _c: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.pipeline.server_ready())

    async def ModelReady(self, r: pb.ModelReadyRequest, _c: Context) -> pb.ModelReadyResponse:
        ready = await self.pipeline.model_ready(r.name, r.version)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, _r: pb.ServerMetadataRequest, _c: Context
    ) -> pb.ServerMetadataResponse:
        meta = await self.pipeline.server_metadata()
        return grpcc.server_metadata_to_proto(meta)

    async def ModelMetadata(
        self, r: pb.ModelMetadataRequest, _c: Context
    ) -> pb.ModelMetadataResponse:
        meta = await self.pipeline.model_metadata(r.name, r.version)
        return grpcc.model_metadata_to_proto(meta)

    async def ModelConfig(self, r: pb.ModelConfigRequest, _c: Context) -> pb.ModelConfigResponse:
        config = await self.pipeline.model_config(r.name, r.version)
        resp = pb.ModelConfigResponse()
        grpcc.dict_to_message(config, resp.config, "model config")
        return resp

    async def ModelInfer(
        self, received: tuple[pb.ModelInferRequest, bytes], c: Context
    ) -> pb.ModelInferResponse | bytes:
        """Decoded and checked in full, then handed to the pipeline with its bytes; a relayed
        answer goes back as the backend wrote it."""
        r, data = received
        t0 = perf_counter()
        request = grpcc.request_from_proto(r, *self._limits)
        self.recorder.decode["grpc"].observe(perf_counter() - t0)
        _no_reserved_keys(request.parameters)
        response = await self.pipeline.infer_message(
            data, request, forwarded_headers(c), peer_of(c)
        )
        if isinstance(response, bytes):
            return response
        t0 = perf_counter()
        out = grpcc.response_bytes(response)
        self.recorder.encode["grpc"].observe(perf_counter() - t0)
        return out

    async def ModelStreamInfer(
        self, requests: AsyncIterator[bytes], context: Context
    ) -> AsyncIterator[bytes]:
        """Each message is served and recorded on its own; errors are answered in band unless
        the client asked for them as the stream's status. The stream holds one admission slot."""
        env = self._stream_envelope
        try:
            held = env.hold(_STREAM)
        except Overloaded as exc:
            refusal = env.open(_STREAM, context)
            refusal.fail(exc)
            refusal.end()
            await context.abort(status_code(exc), exc.message, refusal_trailers(exc))
        refused: ProxyError | None = None
        try:
            check_call(self.access, _STREAM_RPC.group, context)
        except ProxyError as exc:
            refused = exc.with_traceback(None)
        try:
            async with contextlib.aclosing(self._stream(requests, context, refused)) as stream:
                async for item in stream:
                    yield item
        finally:
            env.release(held)

    async def _stream(
        self, requests: AsyncIterator[bytes], context: Context, refused: ProxyError | None
    ) -> AsyncGenerator[bytes, None]:
        raise_errors = any(
            k == "triton_grpc_error" and v == "true" for k, v in context.invocation_metadata() or ()
        )
        headers = forwarded_headers(context)
        peer = peer_of(context)
        # bounded: a slow reader holds the models back, never the proxy's memory
        queue: asyncio.Queue[bytes | ProxyError | None] = asyncio.Queue(_STREAM_QUEUE)
        tasks: set[asyncio.Task[None]] = set()
        env = self._stream_envelope

        async def serve_one(msg: bytes) -> None:
            # an exchange of its own, not admitted (the stream holds the slot)
            with env.open(_STREAM, context) as x:
                x.n_in = len(msg)
                try:
                    r = parse(pb.ModelInferRequest, msg, _STREAM_RPC.name)
                    x.model = r.model_name
                    if refused is not None:
                        raise refused
                    async for data in self._stream_one(r, msg, headers, peer):
                        x.n_out += len(data)
                        await queue.put(data)
                except Exception as exc:
                    failure = answerable(exc, _STREAM)
                else:
                    x.status = 200
                    return
                x.fail(failure)
                if raise_errors:
                    await queue.put(failure)
                else:
                    data = pb.ModelStreamInferResponse(
                        error_message=failure.message
                    ).SerializeToString()
                    x.n_out += len(data)
                    await queue.put(data)

        # at most N messages served at once: the next is not read, so HTTP/2 flow control
        # holds the client back
        slots = asyncio.Semaphore(self._stream_in_flight)

        def served(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            slots.release()

        async def read_all() -> None:
            try:
                await slots.acquire()
                async for msg in requests:
                    task = asyncio.create_task(serve_one(msg))
                    tasks.add(task)
                    task.add_done_callback(served)
                    await slots.acquire()
                if tasks:
                    await asyncio.gather(*list(tasks))
            except asyncio.CancelledError:
                raise  # by the writer below, which is gone
            except BaseException:
                await queue.put(None)
                raise
            await queue.put(None)

        reader = asyncio.create_task(read_all())
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, ProxyError):
                    await context.abort(status_code(item), item.message)
                yield item
        finally:
            pending = [reader, *tasks]
            for task in pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pending, return_exceptions=True)

    async def _stream_one(
        self, r: pb.ModelInferRequest, msg: bytes, headers: Headers, peer: str | None
    ) -> AsyncIterator[bytes]:
        """The serialized ModelStreamInferResponses answering ``msg`` (parsed as ``r``); a
        relayed answer is wrapped without being parsed."""
        t0 = perf_counter()
        request = grpcc.request_from_proto(r, *self._limits)
        self.recorder.decode["grpc"].observe(perf_counter() - t0)
        # the flag (even false) is this frontend's: such a message is never relayed
        relayable = _EMPTY_FINAL not in request.parameters
        flag = request.parameters.pop(_EMPTY_FINAL, False) is True
        _no_reserved_keys(request.parameters)
        previous: pb.ModelInferResponse | bytes | None = None
        encode = self.recorder.encode["grpc"]
        answers = self.pipeline.stream_message(msg, request, relayable, headers, peer)
        try:
            async for response in answers:
                if previous is not None:
                    yield self._stream_response(previous, flag, final=False)
                if isinstance(response, bytes):
                    previous = response
                    continue
                t0 = perf_counter()
                previous = grpcc.response_to_proto(response)
                encode.observe(perf_counter() - t0)
        except ProxyError:
            # one held back for the final flag is still sent before the error
            if previous is not None:
                yield self._stream_response(previous, flag, final=False)
            raise
        if previous is None:
            previous = pb.ModelInferResponse(
                model_name=request.model_name,
                model_version=request.model_version,
                id=request.id or "",
            )
        yield self._stream_response(previous, flag, final=True)

    @staticmethod
    def _stream_response(msg: pb.ModelInferResponse | bytes, flag: bool, final: bool) -> bytes:
        """One answer as a serialized ModelStreamInferResponse."""
        if isinstance(msg, bytes):
            return grpcc.stream_response_bytes(msg)
        if flag:
            msg.parameters[_FINAL].bool_param = final
        return pb.ModelStreamInferResponse(infer_response=msg).SerializeToString()

    async def ModelStatistics(
        self, r: pb.ModelStatisticsRequest, c: Context
    ) -> pb.ModelStatisticsResponse:
        stats = await self.pipeline.statistics(r.name, r.version, forwarded_headers(c))
        return grpc_side.statistics_to_proto(stats)

    async def RepositoryIndex(
        self, r: pb.RepositoryIndexRequest, c: Context
    ) -> pb.RepositoryIndexResponse:
        self._no_repository_name(r.repository_name)
        index = await self.pipeline.repository_index(r.ready, forwarded_headers(c))
        return grpc_side.index_to_proto(index)

    async def RepositoryModelLoad(
        self, r: pb.RepositoryModelLoadRequest, c: Context
    ) -> pb.RepositoryModelLoadResponse:
        await self._load(True, r, c)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, r: pb.RepositoryModelUnloadRequest, c: Context
    ) -> pb.RepositoryModelUnloadResponse:
        await self._load(False, r, c)
        return pb.RepositoryModelUnloadResponse()

    async def _load(self, load: bool, r: Any, c: Context) -> None:
        self._no_repository_name(r.repository_name)
        params = grpc_side.repository_params_to_json(r.parameters)
        await self.pipeline.repository_load(r.model_name, load, params, forwarded_headers(c))

    @staticmethod
    def _no_repository_name(name: str) -> None:
        if name:
            raise Unsupported("'repository_name' specification is not supported")

    async def TraceSetting(self, r: pb.TraceSettingRequest, c: Context) -> pb.TraceSettingResponse:
        update = grpc_side.trace_settings_to_json(r.settings) if r.settings else None
        obj = await self.pipeline.trace_settings(r.model_name, update, forwarded_headers(c))
        return grpc_side.trace_settings_to_proto(obj)

    async def LogSettings(self, r: pb.LogSettingsRequest, c: Context) -> pb.LogSettingsResponse:
        update = grpc_side.log_settings_to_json(r.settings) if r.settings else None
        obj = await self.pipeline.log_settings(update, forwarded_headers(c))
        return grpc_side.log_settings_to_proto(obj)
