"""The one shared core every frontend calls (in the manner of MLServer's DataPlane).

One :class:`Pipeline` per process owns the port to the model server; frontends decode and
encode wire bytes and translate its :class:`~v2proxy.core.errors.ProxyError` subclasses. An
inference runs the stages around one backend call, or is relayed untouched when no stage applies
(:mod:`v2proxy.core.relay`). Pure: it awaits the backend but imports no asyncio or grpc.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any, NamedTuple

from v2proxy.codecs import settings, side
from v2proxy.codecs.backend_meta import server_caps
from v2proxy.codecs.limits import DEFAULT_MAX_TENSORS
from v2proxy.codecs.raw import decode_raw_request
from v2proxy.core.decide import BINARY, JSON, RAW, relays_as_sent
from v2proxy.core.errors import NotFound, Unsupported
from v2proxy.core.generate import GenerateExtension, Mapped
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.model import Buffer, InferRequest, InferResponse
from v2proxy.core.ports import Backend, ForwardResponse, Headers, StreamedBody
from v2proxy.core.regions import Regions, cuda_register
from v2proxy.core.relay import Relay, nothing_to_do
from v2proxy.core.stages import shm as shm_stage
from v2proxy.core.stages.chain import Stages, finish
from v2proxy.core.stages.classification import ClassificationStage, ModelLabels
from v2proxy.core.stages.shm import SharedMemoryStage

PROXY_EXTENSIONS = ("binary_tensor_data", "classification", "system_shared_memory", "generate")


#: the frontend's decoder of a REST /infer body (body, JSON header length, model, version)
Decode = Callable[[Buffer, int | None, str, str], Awaitable[InferRequest]]


class Answered(NamedTuple):
    """A request that went through the stages, and its answer (for the frontend to encode)."""

    request: InferRequest
    response: InferResponse


class Pipeline:
    """Runs every operation of every frontend through the stages and the backend."""

    def __init__(
        self,
        backend: Backend,
        max_input_size: int,
        models: Mapping[str, ModelLabels] | None = None,
        shm: Regions | None = None,
        client_shm: str = "local",
        max_tensors: int = DEFAULT_MAX_TENSORS,
        knowledge: BackendKnowledge | None = None,
    ) -> None:
        self.backend = backend
        #: set when the proxy stops: readiness turns false while requests in flight finish
        self.draining = False
        self.max_input_size = max_input_size
        self.max_tensors = max_tensors
        self.models: Mapping[str, ModelLabels] = models or {}
        #: the clients' system shared-memory regions (None: none can be registered)
        self.shm = shm
        self.client_shm = client_shm
        # The composition root's shared one, else the backend's own, else a new one.
        self.knowledge: BackendKnowledge = (
            knowledge or getattr(backend, "knowledge", None) or BackendKnowledge()
        )
        if self.knowledge.source is None:
            self.knowledge.bind(backend)
        self.stages = Stages(
            (
                SharedMemoryStage(shm, client_shm),
                ClassificationStage(self.models, self.knowledge),
            )
        )
        self._relay = Relay(backend, self.stages, max_input_size, max_tensors)
        self.generation = GenerateExtension(
            backend, self.knowledge, self.stream_infer, max_input_size
        )

    async def server_live(self) -> bool:
        """The proxy's own liveness: it answers, so it lives."""
        return True

    async def server_ready(self) -> bool:
        """Ready when the backend is, and never while the proxy drains before it stops."""
        if self.draining:
            return False
        return await self.backend.server_ready()

    async def server_metadata(self) -> dict[str, Any]:
        """The backend's metadata with the extensions v2proxy adds."""
        meta = dict(await self.backend.server_metadata())
        # Some servers (MindIE) send an object here; the spec says a list of strings.
        extensions = list(server_caps(meta).extensions)
        for e in PROXY_EXTENSIONS:
            if e not in extensions:
                extensions.append(e)
        meta["extensions"] = extensions
        return meta

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        return await self.backend.model_metadata(model, version)

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        return await self.backend.model_config(model, version)

    async def model_ready(self, model: str, version: str) -> bool:
        return await self.backend.model_ready(model, version)

    async def infer_body(
        self,
        model: str,
        version: str,
        body: Buffer | StreamedBody,
        ihcl: int | None,
        rewritten: bool,
        decode: Decode,
        headers: Headers,
        peer: str | None,
    ) -> ForwardResponse | Answered:
        """One REST /infer in its wire form: ``body`` decompressed, whole or still arriving;
        ``ihcl`` its JSON header's length (None: JSON, 0: raw binary); ``rewritten``: the
        frontend rewrites the answer, so it is never relayed; ``decode`` runs only if needed.

        Relayed untouched when no stage applies and the backend takes the wire form (a small
        plain JSON body without being decoded); else decoded and run through the stages."""
        relay = self._relay
        if isinstance(body, StreamedBody):
            if ihcl is None:
                outcome = await relay.relay_json(model, version, body, headers, rewritten)
                if isinstance(outcome, ForwardResponse):
                    return outcome
                return Answered(outcome, await self.staged(outcome, headers, peer))
            relayed, whole = await relay.relay_framed(
                model, version, body, ihcl, headers, rewritten
            )
            if relayed is not None:
                return relayed
            request = await decode(whole, ihcl, model, version)  # declined: not asked again
            return Answered(request, await self.staged(request, headers, peer))
        form = JSON if ihcl is None else BINARY if ihcl else RAW
        sent = body if isinstance(body, (bytes, bytearray)) else None
        decided = (
            False if sent is None else relay.decides(model, version, form, len(sent), rewritten)
        )
        if (
            sent is not None
            and decided is not False
            and ihcl is None
            and relays_as_sent(sent, self.max_input_size, self.max_tensors)
        ):
            if decided or await relay.learns(model, version, form, len(body)):
                return await self.backend.relay_infer(model, version, body, None, headers)
            decided = False  # the backend does not take it unchanged
        request = await decode(body, ihcl, model, version)
        if (
            decided is not False
            and nothing_to_do(request, ihcl is not None, self.stages)
            and (decided or await relay.learns(model, version, form, len(body)))
        ):
            return await self.backend.relay_infer(model, version, body, ihcl, headers)
        return Answered(request, await self.staged(request, headers, peer))

    async def infer_message(
        self, message: bytes, request: InferRequest, headers: Headers, peer: str | None
    ) -> bytes | InferResponse:
        """One gRPC ModelInfer: ``message`` the client's serialized request, ``request`` its
        decoded, checked form. Relayed as it came when no stage applies and the backend takes it
        (answer: serialized ModelInferResponse bytes), else run through the stages."""
        relayed = await self._relay.relay_message(request, message, headers)
        if relayed is not None:
            return relayed
        return await self.staged(request, headers, peer)

    async def staged(
        self, request: InferRequest, headers: Headers, peer: str | None = shm_stage.UNKNOWN_PEER
    ) -> InferResponse:
        """One decoded inference: the stages around :meth:`Backend.infer`, as a stream of one.
        ``peer``: the client's IP address (None: a unix socket), which ``--client-shm`` checks
        when the request names a shared-memory region."""
        if not self.stages.applies(request):
            return finish(request, await self.backend.infer(request, headers))

        async def once(sent: InferRequest) -> AsyncIterator[InferResponse]:
            yield await self.backend.infer(sent, headers)

        response: InferResponse | None = None
        async for answer in self.stages.run(request, peer, once):
            response = answer
        assert response is not None  # a stream of one
        return response

    async def stream_infer(
        self, request: InferRequest, headers: Headers, peer: str | None = shm_stage.UNKNOWN_PEER
    ) -> AsyncIterator[InferResponse]:
        """Every response of a (possibly decoupled) model to one request (``peer`` as for
        :meth:`infer`), through the stages."""
        async with aclosing(self._streamed(request, headers, peer)) as responses:
            async for response in responses:
                yield response

    async def stream_message(
        self,
        message: bytes,
        request: InferRequest,
        relayable: bool,
        headers: Headers,
        peer: str | None,
    ) -> AsyncIterator[bytes | InferResponse]:
        """One message of a gRPC ModelStreamInfer stream, as :meth:`infer_message`;
        ``relayable``: the answer may go back as the backend writes it (the frontend adds
        nothing to it, such as the final-response flag)."""
        relayed = await self._relay.relay_message(
            request, message, headers, streamed=True, rewritten=not relayable
        )
        if relayed is not None:
            yield relayed
            return
        async with aclosing(self._streamed(request, headers, peer)) as responses:
            async for response in responses:
                yield response

    async def _streamed(
        self, request: InferRequest, headers: Headers, peer: str | None
    ) -> AsyncGenerator[InferResponse, None]:
        """The stages around :meth:`Backend.stream_infer`."""
        if not self.stages.applies(request):
            async for answer in self.backend.stream_infer(request, headers):
                yield finish(request, answer)
            return

        def call(sent: InferRequest) -> AsyncIterator[InferResponse]:
            return self.backend.stream_infer(sent, headers)

        async with aclosing(self.stages.run(request, peer, call)) as responses:
            async for response in responses:
                yield response

    async def decode_raw(self, body: Buffer, model: str, version: str) -> InferRequest:
        """The request a raw binary body (IHCL 0) stands for."""
        metadata, max_batch_size = await self.knowledge.shape_info(model, version)
        return decode_raw_request(
            body, model, version, metadata, max_batch_size, self.max_input_size
        )

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        return await self.backend.statistics(model, version, headers)

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]:
        return await self.backend.repository_index(ready, headers)

    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        if load:
            side.check_load_parameters(parameters)
        try:
            await self.backend.repository_load(model, load, parameters, headers)
        finally:
            self.invalidate()

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        return await self.backend.trace_settings(model, update, headers)

    async def log_settings(self, update: dict[str, Any] | None, headers: Headers) -> dict[str, Any]:
        if update:
            settings.log_update(update, strict=False)  # bad values: 400 (Triton answers 503)
        return await self.backend.log_settings(update, headers)

    async def passthrough(
        self, method: str, target: str, headers: Headers, body: Buffer
    ) -> ForwardResponse:
        """Any other REST request (``generate``, unknown paths) passed through to a REST
        backend; ``target`` is origin-form. Other backends answer NotFound/Unsupported."""
        return await self.backend.forward(method, target, headers, body)

    async def generate(
        self,
        model: str,
        version: str,
        target: str,
        body: Buffer,
        headers: Headers,
        stream: bool,
    ) -> ForwardResponse | Mapped:
        """A REST ``generate``/``generate_stream`` request: passed through to a backend that
        has the extension, else mapped onto :meth:`stream_infer`
        (:mod:`v2proxy.core.generate`)."""
        return await self.generation.run(model, version, target, body, headers, stream)

    def generate_objects(
        self, model: str, version: str, obj: dict[str, Any], headers: Headers, stream: bool
    ) -> AsyncIterator[dict[str, Any]]:
        """A generate body sent whichever way the backend takes it; answers as JSON objects."""
        return self.generation.objects(model, version, obj, headers, stream)

    def invalidate(self) -> None:
        """Forget everything known of the backend (after a repository load or unload)."""
        self.knowledge.invalidate()

    async def shm_status(self, kind: str, name: str, peer: str | None) -> list[dict[str, Any]]:
        """Status of the ``kind`` ("system" | "cuda") regions, all or the one named."""
        shm_stage.check_client(self.client_shm, peer)
        if self.shm is not None:
            return self.shm.status(name, kind)
        if name:
            raise NotFound(f"Unable to find {kind} shared memory region: '{name}'")
        return []

    async def shm_register(
        self, name: str, key: str, offset: int, byte_size: int, peer: str | None
    ) -> None:
        """Register a system region; ``peer``: the client's IP address, None on a unix socket
        (``--client-shm``)."""
        shm_stage.check_client(self.client_shm, peer)
        if self.shm is None:
            raise Unsupported("system shared memory is not available in this v2proxy")
        self.shm.register(name, key, offset, byte_size)

    async def cuda_shm_register(
        self, name: str, handle: bytes, device: int, size: int, peer: str | None
    ) -> None:
        """Register a client's ``cudaIpcMemHandle_t`` (no CUDA adapter: Triton's CPU text)."""
        shm_stage.check_client(self.client_shm, peer)
        if self.shm is None:
            cuda_register(name)
        else:
            self.shm.register_cuda(name, handle, device, size)

    async def shm_unregister(self, kind: str, name: str, peer: str | None) -> None:
        """Unregister one region ("": all); a region in use goes when its requests end."""
        shm_stage.check_client(self.client_shm, peer)
        if self.shm is not None:
            self.shm.unregister(name, kind)
