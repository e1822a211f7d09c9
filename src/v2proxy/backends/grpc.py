"""The gRPC backend (``--backend grpc://host:port``): one grpc.aio channel per backend endpoint
(:mod:`v2proxy.backends.endpoints`), each call (each stream) on the one picked for it.

- A call that never left (UNAVAILABLE before connecting) goes to the next endpoint; one that may
  have reached the model is sent again only when idempotent (health, metadata).
- Deadlines come from ``--backend-timeout``; a unary call is also cancelled from the event loop
  :data:`DEADLINE_GRACE_S` after its deadline, since grpcio can leave a call whose request is
  blocked on a backend that stopped reading waiting past it.
- gRPC status codes map onto the error tree; messages name the client's operation and model,
  also for an RPC the proxy makes on its own behalf.
- ``stream_infer`` uses ModelStreamInfer, so decoupled models produce all their responses;
  ``relay_message`` sends a client's serialized ModelInferRequest as it came.
- Every RPC but the inferences goes on a second channel per endpoint whose receive limit is
  ``max_answer_size`` (grpcio sets the limit per channel, not per call).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import grpc

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy._proto.service import SERVICE, UNARY_RPCS
from v2proxy.backends.base import NonRestBackend, single_response
from v2proxy.backends.endpoints import Endpoint, EndpointCells, Endpoints, HostPort, split_hosts
from v2proxy.backends.grpc_deadlines import Watch, Watchdog
from v2proxy.backends.grpc_unary import RawUnary, raw_unary
from v2proxy.backends.staging import Stager
from v2proxy.codecs import grpc as grpcc
from v2proxy.codecs import grpc_side
from v2proxy.core.errors import (
    BackendError,
    BackendUnavailable,
    BadGateway,
    CodecError,
    GatewayTimeout,
    NotFound,
    ProxyError,
    Unsupported,
)
from v2proxy.core.headers import metadata
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.model import InferRequest, InferResponse
from v2proxy.core.ports import Headers, RelayFacts

_NOT_FOUND_TEXT = re.compile(r"not found|does not exist|ModelNotFound", re.IGNORECASE)

#: how long after its gRPC deadline a unary call is cancelled from the event loop (s)
DEADLINE_GRACE_S = 0.5

#: the channel's reconnect backoff, first and longest (ms); gRPC's own grows to 2 minutes
RECONNECT_BACKOFF_MS = (100, 1000)

#: the client's operation while the proxy makes an RPC of its own for it: errors name it
_ASKED_FOR: ContextVar[str | None] = ContextVar("v2proxy_grpc_asked_for", default=None)

_RAW_INFER = "ModelInfer bytes"

#: the failures that count against an endpoint; any other status is an answer. INTERNAL is what
#: grpcio reports for an answer that is not gRPC (and for a server's own 500).
_OUTCOME = {
    grpc.StatusCode.UNAVAILABLE: "unreachable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.INTERNAL: "malformed",
}
_HTTP_BY_CODE = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 429,
}


_ALL = 1 << 62


class GrpcBackend(NonRestBackend):
    """Talks to a v2 gRPC model server at ``target`` (host:port)."""

    name = "grpc"
    other_v2_error = Unsupported

    def stream_call(self, decoupled: bool) -> str:
        return "gRPC ModelStreamInfer" if decoupled else "gRPC ModelInfer"

    def __init__(
        self,
        target: str,
        timeout: float = 60.0,
        max_message_size: int = 2**31 - 1,
        staging: Stager | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        *,
        resolve_every: float = 30.0,
        cells: EndpointCells | None = None,
        knowledge: BackendKnowledge | None = None,
        max_answer_size: int | None = None,
    ):
        self.target = target
        #: the side channel's receive limit (None: no side channel)
        self._max_answer = max_answer_size if (max_answer_size or 0) < max_message_size else None
        self.knowledge = knowledge or BackendKnowledge(self)
        self._credentials = credentials
        self.staging = staging
        if staging is not None and staging.knowledge is None:
            staging.knowledge = self.knowledge
        self._facts: dict[tuple[int, bool | None], RelayFacts] = {}
        self._timeout = timeout
        self._options: list[tuple[str, str | int]] = [
            ("grpc.max_send_message_length", max_message_size),
            ("grpc.max_receive_message_length", max_message_size),
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
        ]
        self.endpoints: Endpoints[_Channel] = Endpoints(
            split_hosts(target), self._open, _close, resolve_every=resolve_every, cells=cells
        )
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: Watchdog | None = None

    def _open(self, name: HostPort, address: str) -> _Channel:
        """A channel to one address of ``name`` (its authority and TLS name stay the name's)."""
        options = list(self._options)
        if address == name.host:
            target = name.authority
        else:
            target = ("ipv6:" if ":" in address else "ipv4:") + HostPort(
                address, name.port
            ).authority
            options.append(("grpc.default_authority", name.authority))
            if self._credentials is not None:
                options.append(("grpc.ssl_target_name_override", name.host))
        side = None
        if self._max_answer is not None:
            limit = ("grpc.max_receive_message_length", self._max_answer)
            side = self._channel(target, [limit if k == limit[0] else (k, v) for k, v in options])
        return _Channel(self._channel(target, options), side)

    def _channel(self, target: str, options: list[tuple[str, str | int]]) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, self._credentials, options=options)

    async def start(self) -> None:
        # kept: asyncio.get_running_loop() makes a getpid system call each time
        self._loop = asyncio.get_running_loop()
        self._watchdog = Watchdog(self._loop)
        await self.endpoints.start()
        self._started = True

    async def close(self) -> None:
        if self.staging is not None and self._started:
            await self.staging.close(self)
        if self._started:
            self._started = False
            await self.endpoints.close()

    def _staging(self) -> Stager | None:
        """--backend-shm, unless the endpoints are several servers (a region registered with
        one is unknown to the next)."""
        return self.staging if self.endpoints.one_server else None

    @contextmanager
    def _mapped(self, what: str, model: str = "") -> Iterator[None]:
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, what, model) from None
        except ProxyError:
            raise

    def _error(self, exc: grpc.aio.AioRpcError, what: str, model: str) -> ProxyError:
        code = exc.code().name
        details = exc.details() or code
        what = _ASKED_FOR.get() or what
        if code == "UNAVAILABLE":
            of_model = f" of model '{model}'" if model else ""
            return BackendUnavailable(
                f"backend at {self.target} is unavailable for {what}{of_model}: {details}"
            )
        if code == "DEADLINE_EXCEEDED":
            note = f" (model '{model}')" if model else ""
            return GatewayTimeout(f"backend at {self.target} did not answer {what} in time{note}")
        if _too_large(exc):
            option = "--grpc-max-message-size" if "infer" in what else "--backend-max-answer-size"
            return BadGateway(
                f"backend at {self.target} answered {what} too large ({option}): {details}"
            )
        # MLServer answers UNKNOWN ("ModelNotFound ... not found") where others say NOT_FOUND.
        if model and (
            code == "NOT_FOUND" or (code == "UNKNOWN" and _NOT_FOUND_TEXT.search(details))
        ):
            if details.startswith("Request for unknown model"):
                return NotFound(details)
            return NotFound(
                f"Request for unknown model: '{model}' is not found (backend: {details})"
            )
        if code == "NOT_FOUND":
            return NotFound(details)
        if code == "UNIMPLEMENTED":
            return Unsupported(details)
        return BackendError(details, _HTTP_BY_CODE.get(code, 500), code)

    def _pick(self, tried: list[Endpoint[_Channel]]) -> Endpoint[_Channel] | None:
        if not self._started:
            raise BackendUnavailable("the gRPC backend is not started")
        return self.endpoints.pick(tried)

    async def _call(
        self,
        name: str,
        request: Any,
        what: str,
        model: str = "",
        metadata: list[tuple[str, str]] | None = None,
        *,
        idempotent: bool = False,
    ) -> Any:
        """One unary call, sent to the next endpoint when it never left or, ``idempotent``,
        when it failed against its endpoint (with the whole deadline again)."""
        endpoints = self.endpoints
        tried: list[Endpoint[_Channel]] = []
        last: grpc.aio.AioRpcError | None = None
        loop = self._loop or asyncio.get_running_loop()
        watchdog = self._watchdog or Watchdog(loop)
        # grpcio's deadline does not end a call whose request cannot be sent; the watchdog does.
        deadline = loop.time() + self._timeout
        watch = watchdog.watch(deadline + DEADLINE_GRACE_S)
        try:
            with self._mapped(what, model):
                while True:
                    ep = self._pick(tried)
                    if ep is None:
                        if last is None:
                            raise BackendUnavailable(f"backend at {self.target} has no endpoint")
                        raise last
                    ep.outstanding += 1
                    try:
                        answer = await ep.client.calls[name](
                            request, timeout=max(deadline - loop.time(), 0.001), metadata=metadata
                        )
                    except asyncio.CancelledError:
                        if not watch.timed_out():
                            raise
                        endpoints.failed(ep, "timeout")
                        if idempotent:
                            tried.append(ep)
                            deadline, watch = self._again(loop, watchdog, watch)
                            continue
                        of_model = f"model '{model}', " if model else ""
                        raise GatewayTimeout(
                            f"backend at {self.target} did not take {_ASKED_FOR.get() or what}"
                            f" in time ({of_model}--backend-timeout {self._timeout:g} s)"
                        ) from None
                    except grpc.aio.AioRpcError as exc:
                        outcome = _OUTCOME.get(exc.code()) or (
                            "malformed" if _too_large(exc) else None
                        )
                        if outcome is None:
                            endpoints.ok(ep)  # it answered, with an error
                            raise
                        endpoints.failed(ep, outcome)
                        unsent = outcome == "unreachable" and _not_sent(exc)
                        if not (unsent or idempotent):
                            raise
                        tried.append(ep)
                        last = exc
                        if not unsent:
                            deadline, watch = self._again(loop, watchdog, watch)
                        continue
                    finally:
                        ep.outstanding -= 1
                    endpoints.ok(ep)
                    return answer
        finally:
            watchdog.unwatch(watch)
            last = None  # no cycle: the exception's traceback holds this frame

    def _again(
        self, loop: asyncio.AbstractEventLoop, watchdog: Watchdog, watch: Watch
    ) -> tuple[float, Watch]:
        """A new deadline (and its watch) for an idempotent call asked again."""
        watchdog.unwatch(watch)
        deadline = loop.time() + self._timeout
        return deadline, watchdog.watch(deadline + DEADLINE_GRACE_S)

    async def server_ready(self) -> bool:
        """Ready while one endpoint says so (each asked in turn until one does)."""
        for _ in range(len(self.endpoints.all) or 1):
            resp = await self._call(
                "ServerReady", pb.ServerReadyRequest(), "server readiness", idempotent=True
            )
            if resp.ready:
                return True
        return False

    async def server_metadata(self) -> dict[str, Any]:
        resp = await self._call(
            "ServerMetadata", pb.ServerMetadataRequest(), "server metadata", idempotent=True
        )
        return grpcc.message_to_dict(resp) | {"extensions": list(resp.extensions)}

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        req = pb.ModelMetadataRequest(name=model, version=version)
        resp = await self._call("ModelMetadata", req, "metadata", model, idempotent=True)
        out = grpcc.message_to_dict(resp)
        for key in ("inputs", "outputs"):
            for t in out.setdefault(key, []):
                t.setdefault("shape", [])
        return out

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        req = pb.ModelConfigRequest(name=model, version=version)
        resp = await self._call("ModelConfig", req, "configuration", model, idempotent=True)
        config = grpcc.message_to_dict(resp.config)
        # proto3 does not carry zeros: REST shows max_batch_size 0 (no batching) explicitly.
        config.setdefault("max_batch_size", 0)
        return config

    async def model_ready(self, model: str, version: str) -> bool:
        req = pb.ModelReadyRequest(name=model, version=version)
        resp = await self._call("ModelReady", req, "readiness", model, idempotent=True)
        return bool(resp.ready)

    async def infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        if await self.is_decoupled(request.model_name, request.model_version):
            # ModelInfer refuses decoupled models (Triton: UNIMPLEMENTED): ask over the stream.
            return await single_response(request.model_name, self.stream_infer(request, headers))
        staging = self._staging()
        if staging is not None and staging.wanted(request):
            return await staging.infer(self, request, lambda r: self._model_infer(r, headers))
        return await self._model_infer(request, headers)

    async def _model_infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        # serialized here: protobuf's own serializer copies the tensors' bytes twice, slowly
        data = grpcc.request_bytes(request)
        answer: bytes = await self._call(
            _RAW_INFER, data, "inference", request.model_name, metadata(headers)
        )
        return self._decode(answer)

    async def relay_message(
        self, model: str, version: str, message: bytes, headers: Headers, *, streamed: bool = False
    ) -> bytes:
        """The client's serialized ModelInferRequest sent unchanged, the serialized answer
        returned unchanged (a stream's message too, as a unary ModelInfer)."""
        answer: bytes = await self._call(_RAW_INFER, message, "inference", model, metadata(headers))
        return answer

    @staticmethod
    def _decode(resp: pb.ModelInferResponse | bytes) -> InferResponse:
        """An answer of ModelInfer (serialized) or of the stream; BadGateway when it is none."""
        try:
            if isinstance(resp, bytes):
                return grpcc.response_from_bytes(resp)
            return grpcc.response_from_proto(resp)
        except CodecError as exc:
            raise BadGateway(f"invalid inference response from backend: {exc}") from None

    def relay_facts(self, model: str, version: str) -> RelayFacts:
        known = self.knowledge.known_config(model, version)
        staging = self._staging()
        key = (
            _ALL if staging is None else staging.threshold,
            None if known is None else known.decoupled,
        )
        facts = self._facts.get(key)
        if facts is None:
            facts = self._facts[key] = RelayFacts(False, True, 0, False, False, *key)
        return facts

    async def learn_relay_facts(self, model: str, version: str, asked_for: str) -> RelayFacts:
        """The facts once the model's configuration says whether it is decoupled."""
        await self.is_decoupled(model, version, asked_for)
        return self.relay_facts(model, version)

    async def is_decoupled(self, model: str, version: str, asked_for: str = "inference") -> bool:
        """Whether the model's config says decoupled, asked once per model and lifetime (no
        config: not decoupled). Errors name ``asked_for``, the client's operation."""
        known = self.knowledge.known_config(model, version)
        if known is not None:
            return known.decoupled
        token = _ASKED_FOR.set(asked_for)
        try:
            return (await self.knowledge.config(model, version)).decoupled
        finally:
            _ASKED_FOR.reset(token)

    async def stream_infer(
        self, request: InferRequest, headers: Headers
    ) -> AsyncIterator[InferResponse]:
        """ModelStreamInfer for decoupled models (all their responses), ModelInfer otherwise."""
        decoupled = await self.is_decoupled(
            request.model_name, request.model_version, "streaming inference"
        )
        if not decoupled:
            yield await self.infer(request, headers)
            return
        msg = grpcc.request_to_proto(request)
        msg.parameters["triton_enable_empty_final_response"].bool_param = True
        # No deadline on the whole call (an LLM stream may last long): one per response instead.
        ep = self._pick([])
        assert ep is not None
        call = ep.client.calls["ModelStreamInfer"](iter([msg]), metadata=metadata(headers))
        ep.outstanding += 1
        answered = False
        try:
            with self._mapped("streaming inference", request.model_name):
                while True:
                    try:
                        async with asyncio.timeout(self._timeout):
                            item = await call.read()
                    except TimeoutError:
                        raise GatewayTimeout(
                            f"backend at {self.target} sent no response of the stream for"
                            f" {self._timeout:g} s (--backend-timeout)"
                        ) from None
                    if not answered:
                        answered = True
                        self.endpoints.ok(ep)
                    if item is grpc.aio.EOF:  # type: ignore[attr-defined]
                        break
                    if item.error_message:
                        raise BackendError(item.error_message, 400, "INVALID_ARGUMENT")
                    resp = item.infer_response
                    final = resp.parameters.get("triton_final_response")
                    is_final = final is None or final.bool_param
                    if resp.outputs or not is_final:
                        resp.parameters.pop("triton_final_response", None)
                        yield self._decode(resp)
                    if is_final:
                        break
        except BackendUnavailable:
            self.endpoints.failed(ep)
            raise
        except GatewayTimeout:
            self.endpoints.failed(ep, "timeout")
            raise
        finally:
            ep.outstanding -= 1
            call.cancel()

    async def register_staging(self, name: str, key: str, byte_size: int) -> None:
        """Register one of v2proxy's own regions (``--backend-shm``) with the backend."""
        req = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=byte_size)
        await self._call("SystemSharedMemoryRegister", req, "a staging region's registration")

    async def unregister_staging(self, name: str) -> None:
        req = pb.SystemSharedMemoryUnregisterRequest(name=name)
        await self._call("SystemSharedMemoryUnregister", req, "a staging region's removal")

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        req = pb.ModelStatisticsRequest(name=model, version=version)
        resp = await self._call("ModelStatistics", req, "statistics", model, metadata(headers))
        return grpc_side.statistics_to_json(resp)

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]:
        req = pb.RepositoryIndexRequest(ready=ready)
        resp = await self._call("RepositoryIndex", req, "repository index", "", metadata(headers))
        return grpc_side.index_to_json(resp)

    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        name = "RepositoryModelLoad" if load else "RepositoryModelUnload"
        req: Any = (pb.RepositoryModelLoadRequest if load else pb.RepositoryModelUnloadRequest)(
            model_name=model
        )
        grpc_side.repository_params_to_proto({"parameters": parameters}, req.parameters)
        await self._call(name, req, name, "", metadata(headers))

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        req = pb.TraceSettingRequest(model_name=model)
        for key, value in (update or {}).items():
            values = value if isinstance(value, list) else [value]
            req.settings[key].value.extend(str(v) for v in values if v is not None)
        resp = await self._call("TraceSetting", req, "trace settings", "", metadata(headers))
        return grpc_side.trace_settings_to_json(resp.settings)

    async def log_settings(self, update: dict[str, Any] | None, headers: Headers) -> dict[str, Any]:
        req = pb.LogSettingsRequest()
        if update:  # the response's SettingValue has the request's fields, not its class
            for key, value in grpc_side.log_settings_to_proto(update).settings.items():
                req.settings[key].ParseFromString(value.SerializeToString())
        resp = await self._call("LogSettings", req, "log settings", "", metadata(headers))
        return grpc_side.log_settings_to_json(resp.settings)


class _Channel:
    """One endpoint's channel and the callables of every RPC on it: the inferences on
    ``channel``, every other unary RPC on ``side`` when there is one."""

    __slots__ = ("calls", "channel", "raw", "side")

    def __init__(self, channel: grpc.aio.Channel, side: grpc.aio.Channel | None = None) -> None:
        self.channel = channel
        self.side = side
        self.calls: dict[str, Any] = {}
        for name, (req, resp) in UNARY_RPCS.items():
            on = channel if side is None or name == "ModelInfer" else side
            self.calls[name] = on.unary_unary(
                f"/{SERVICE}/{name}",
                request_serializer=req.SerializeToString,
                response_deserializer=resp.FromString,
            )
        # bytes in, bytes out, without grpc.aio's per-call wrapper
        call, raw = raw_unary(channel, f"/{SERVICE}/ModelInfer")
        self.calls[_RAW_INFER] = call
        self.raw: RawUnary | None = raw
        self.calls["ModelStreamInfer"] = channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )


async def _close(ch: _Channel) -> None:
    if ch.raw is not None:  # its calls are not the channel's to cancel
        ch.raw.cancel_all()
    await ch.channel.close(None)
    if ch.side is not None:
        await ch.side.close(None)


def _too_large(exc: grpc.aio.AioRpcError) -> bool:
    """Whether the call failed on an answer over the channel's receive limit."""
    return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (
        exc.details() or ""
    )


def _not_sent(exc: grpc.aio.AioRpcError) -> bool:
    """Whether an UNAVAILABLE call never left the proxy (no connection to send it on), as
    opposed to a connection lost during the call."""
    return "failed to connect to all addresses" in (exc.details() or "")
