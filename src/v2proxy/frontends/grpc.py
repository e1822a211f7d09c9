"""The gRPC frontend (grpc.aio): every RPC of ``inference.GRPCInferenceService`` plus
``grpc.health.v1.Health`` (reference §5.2).

Handlers are registered from one table (method name -> request type, response type, handler);
every ProxyError becomes a gRPC status in exactly one place (:func:`_guard`). Side RPCs
(statistics, repository, trace, log settings) go through the pipeline's canonical REST JSON
form, so they work in front of any backend. ModelStreamInfer answers each request on the
stream, several times for decoupled models, with errors reported in-band in ``error_message``
unless the client sent the ``triton_grpc_error: true`` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import grpc

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy._proto import health_pb2
from v2proxy._proto.service import SERVICE, UNARY_RPCS
from v2proxy.codecs import grpc as grpcc
from v2proxy.codecs import grpc_side
from v2proxy.errors import CodecError, ProxyError, Unsupported
from v2proxy.http_io import HOP_BY_HOP
from v2proxy.pipeline import Pipeline

log = logging.getLogger(__name__)

HEALTH_SERVICE = "grpc.health.v1.Health"
#: request metadata that is about this gRPC hop and never forwarded
_HOP_METADATA = frozenset(
    {
        "user-agent",
        "content-type",
        "te",
        "grpc-accept-encoding",
        "grpc-encoding",
        "grpc-timeout",
        "triton_grpc_error",
        "accept-encoding",
    }
)
_FINAL = "triton_final_response"
_EMPTY_FINAL = "triton_enable_empty_final_response"

Context = grpc.aio.ServicerContext[Any, Any]


def _code(exc: ProxyError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.UNKNOWN)


def _guard(fn: Callable[[Any, Context], Awaitable[Any]]) -> Callable[[Any, Context], Any]:
    """The one translator from the error tree to gRPC status."""

    async def handler(request: Any, context: Context) -> Any:
        try:
            return await fn(request, context)
        except ProxyError as exc:
            error: tuple[grpc.StatusCode, str] = (_code(exc), exc.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("unexpected error in gRPC handler")
            error = (grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
        await context.abort(*error)

    return handler


def forwarded_headers(context: Context) -> dict[str, str]:
    """End-to-end request metadata, passed on to the backend like HTTP headers."""
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if (
            key.startswith((":", "grpc-"))
            or key in _HOP_METADATA
            or key in HOP_BY_HOP
            or key.endswith("-bin")
        ):
            continue
        out[key] = value if isinstance(value, str) else value.decode("latin-1")
    return out


def _model_path(name: str, version: str) -> str:
    path = f"/v2/models/{quote(name, safe='')}"
    return f"{path}/versions/{version}" if version else path


class GrpcFrontend:
    """Serves the v2 gRPC API on top of a :class:`Pipeline`."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.backend = pipeline.backend

    def handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        unary = {
            name: grpc.unary_unary_rpc_method_handler(
                _guard(getattr(self, name)),
                request_deserializer=req.FromString,
                response_serializer=resp.SerializeToString,
            )
            for name, (req, resp) in UNARY_RPCS.items()
        }
        unary["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self.ModelStreamInfer,
            request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelStreamInferResponse.SerializeToString,
        )
        health = {
            "Check": grpc.unary_unary_rpc_method_handler(
                _guard(self.Check),
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self.Watch,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            ),
        }
        return [
            grpc.method_handlers_generic_handler(SERVICE, unary),
            grpc.method_handlers_generic_handler(HEALTH_SERVICE, health),
        ]

    # ------------------------------------------------------------------ health and metadata

    async def ServerLive(self, _r: pb.ServerLiveRequest, _c: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, _r: pb.ServerReadyRequest, _c: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.backend.server_ready())

    async def ModelReady(self, r: pb.ModelReadyRequest, _c: Context) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=await self.backend.model_ready(r.name, r.version))

    async def ServerMetadata(
        self, _r: pb.ServerMetadataRequest, _c: Context
    ) -> pb.ServerMetadataResponse:
        return grpcc.server_metadata_to_proto(await self.pipeline.server_metadata())

    async def ModelMetadata(
        self, r: pb.ModelMetadataRequest, _c: Context
    ) -> pb.ModelMetadataResponse:
        return grpcc.model_metadata_to_proto(await self.backend.model_metadata(r.name, r.version))

    async def ModelConfig(self, r: pb.ModelConfigRequest, _c: Context) -> pb.ModelConfigResponse:
        config = await self.backend.model_config(r.name, r.version)
        resp = pb.ModelConfigResponse()
        grpcc.dict_to_message(config, resp.config, "model config")
        return resp

    # ------------------------------------------------------------------ inference

    async def ModelInfer(self, r: pb.ModelInferRequest, c: Context) -> pb.ModelInferResponse:
        request = grpcc.request_from_proto(r)
        for key in request.parameters:
            if key.startswith("triton_"):
                raise CodecError(
                    f"parameter keys starting with 'triton_' are reserved for Triton usage and"
                    f" should not be specified (got '{key}')"
                )
        response = await self.pipeline.infer(request, forwarded_headers(c))
        return grpcc.response_to_proto(response)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        raise_errors = any(
            k == "triton_grpc_error" and v == "true" for k, v in context.invocation_metadata() or ()
        )
        headers = forwarded_headers(context)
        queue: asyncio.Queue[pb.ModelStreamInferResponse | ProxyError | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def serve_one(msg: pb.ModelInferRequest) -> None:
            try:
                async for out in self._stream_one(msg, headers):
                    await queue.put(out)
            except ProxyError as exc:
                await queue.put(exc)
            except Exception as exc:
                log.exception("unexpected error in ModelStreamInfer")
                await queue.put(ProxyError(f"internal error: {type(exc).__name__}"))

        async def read_all() -> None:
            try:
                async for msg in requests:
                    task = asyncio.create_task(serve_one(msg))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*list(tasks))
            finally:
                await queue.put(None)

        reader = asyncio.create_task(read_all())
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, ProxyError):
                    if raise_errors:
                        await context.abort(_code(item), item.message)
                    yield pb.ModelStreamInferResponse(error_message=item.message)
                else:
                    yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _stream_one(
        self, msg: pb.ModelInferRequest, headers: dict[str, str]
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        request = grpcc.request_from_proto(msg)
        flag = request.parameters.pop(_EMPTY_FINAL, False) is True
        for key in request.parameters:
            if key.startswith("triton_"):
                raise CodecError(
                    f"parameter keys starting with 'triton_' are reserved for Triton usage and"
                    f" should not be specified (got '{key}')"
                )
        previous: pb.ModelInferResponse | None = None
        async for response in self.pipeline.stream_infer(request, headers):
            if previous is not None:
                yield self._stream_response(previous, flag, final=False)
            previous = grpcc.response_to_proto(response)
        if previous is None:  # nothing produced: an empty final response
            previous = pb.ModelInferResponse(
                model_name=request.model_name,
                model_version=request.model_version,
                id=request.id or "",
            )
        yield self._stream_response(previous, flag, final=True)

    @staticmethod
    def _stream_response(
        msg: pb.ModelInferResponse, flag: bool, final: bool
    ) -> pb.ModelStreamInferResponse:
        if flag:
            msg.parameters[_FINAL].bool_param = final
        return pb.ModelStreamInferResponse(infer_response=msg)

    # ------------------------------------------------------------------ side RPCs

    async def ModelStatistics(
        self, r: pb.ModelStatisticsRequest, _c: Context
    ) -> pb.ModelStatisticsResponse:
        path = _model_path(r.name, r.version) + "/stats" if r.name else "/v2/models/stats"
        return grpc_side.statistics_to_proto(await self.pipeline.side_request("GET", path))

    async def RepositoryIndex(
        self, r: pb.RepositoryIndexRequest, _c: Context
    ) -> pb.RepositoryIndexResponse:
        self._no_repository_name(r.repository_name)
        obj = await self.pipeline.side_request("POST", "/v2/repository/index", {"ready": r.ready})
        return grpc_side.index_to_proto(obj)

    async def RepositoryModelLoad(
        self, r: pb.RepositoryModelLoadRequest, _c: Context
    ) -> pb.RepositoryModelLoadResponse:
        await self._load_unload("load", r.repository_name, r.model_name, r.parameters)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, r: pb.RepositoryModelUnloadRequest, _c: Context
    ) -> pb.RepositoryModelUnloadResponse:
        await self._load_unload("unload", r.repository_name, r.model_name, r.parameters)
        return pb.RepositoryModelUnloadResponse()

    async def _load_unload(self, action: str, repo: str, model: str, params: Any) -> None:
        self._no_repository_name(repo)
        body = {"parameters": grpc_side.repository_params_to_json(params)}
        path = f"/v2/repository/models/{quote(model, safe='')}/{action}"
        await self.pipeline.side_request("POST", path, body)

    @staticmethod
    def _no_repository_name(name: str) -> None:
        if name:
            raise Unsupported("'repository_name' specification is not supported")

    async def TraceSetting(self, r: pb.TraceSettingRequest, _c: Context) -> pb.TraceSettingResponse:
        path = (
            f"{_model_path(r.model_name, '')}/trace/setting"
            if r.model_name
            else ("/v2/trace/setting")
        )
        if r.settings:
            body = grpc_side.trace_settings_to_json(r.settings)
            obj = await self.pipeline.side_request("POST", path, body)
        else:
            obj = await self.pipeline.side_request("GET", path)
        return grpc_side.trace_settings_to_proto(obj)

    async def LogSettings(self, r: pb.LogSettingsRequest, _c: Context) -> pb.LogSettingsResponse:
        if r.settings:
            body = grpc_side.log_settings_to_json(r.settings)
            obj = await self.pipeline.side_request("POST", "/v2/logging", body)
        else:
            obj = await self.pipeline.side_request("GET", "/v2/logging")
        return grpc_side.log_settings_to_proto(obj)

    async def _no_shm(self, _r: Any, _c: Context) -> Any:
        raise Unsupported(
            "shared memory is not supported by this version of v2proxy: send tensor data in"
            " the request"
        )

    SystemSharedMemoryStatus = _no_shm
    SystemSharedMemoryRegister = _no_shm
    SystemSharedMemoryUnregister = _no_shm
    CudaSharedMemoryStatus = _no_shm
    CudaSharedMemoryRegister = _no_shm
    CudaSharedMemoryUnregister = _no_shm

    # ------------------------------------------------------------------ grpc.health.v1

    async def _status(self) -> int:
        try:
            ready = await self.backend.server_ready()
        except ProxyError:
            ready = False
        serving = health_pb2.HealthCheckResponse.SERVING
        return serving if ready else health_pb2.HealthCheckResponse.NOT_SERVING

    async def Check(
        self, _r: health_pb2.HealthCheckRequest, _c: Context
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=await self._status())  # type: ignore[arg-type]

    async def Watch(
        self, _r: health_pb2.HealthCheckRequest, _c: Context
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            status = await self._status()
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)  # type: ignore[arg-type]
                last = status
            await asyncio.sleep(1.0)
