"""``--backend-shm``: large tensors staged in v2proxy's own shared-memory regions registered with
the backend, so that they never cross the socket (REST and gRPC backends alike)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from v2proxy.codecs.backend_meta import TensorMeta
from v2proxy.codecs.dtypes import ITEM_SIZE
from v2proxy.core.errors import (
    BackendUnavailable,
    BadGateway,
    GatewayTimeout,
    ProxyError,
)
from v2proxy.core.knowledge import BackendKnowledge, MetadataSource
from v2proxy.core.model import (
    Datatype,
    InferRequest,
    InferResponse,
    OutputSink,
    RequestedOutput,
    Tensor,
)
from v2proxy.shm.staging import MIN_REGION, StagingPool, StagingRegion, aligned

log = logging.getLogger(__name__)

#: the most bytes of staging regions one process keeps
POOL_MAX = 1024 * 1024 * 1024
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
SIZE = "shared_memory_byte_size"
_NOT_A_REFUSAL = (BackendUnavailable, GatewayTimeout, BadGateway)


class StagingPort(MetadataSource, Protocol):
    """What a backend offers the stager: its metadata calls (asked through the knowledge) and
    the registration of v2proxy's regions."""

    async def register_staging(self, name: str, key: str, byte_size: int) -> None: ...
    async def unregister_staging(self, name: str) -> None: ...


class Cell(Protocol):
    def inc(self, amount: float = 1.0) -> None: ...


Send = Callable[[InferRequest], Awaitable[InferResponse]]


@dataclass(slots=True)
class _Plan:
    region: StagingRegion
    request: InferRequest
    #: staged outputs: name -> (offset, capacity, the client's destination or None)
    outputs: dict[str, tuple[int, int, OutputSink | None]]
    in_bytes: int


#: a metadata output whose size nothing bounds (BYTES, or a datatype v2proxy does not know)
UNBOUNDED = -1
#: Triton's text when an output does not fit the shared memory it was asked into
TOO_SMALL = "should be at least"


def _nbytes(t: Tensor) -> int:
    return memoryview(t.data).nbytes


def _fixed_size(entry: TensorMeta) -> int | None:
    """Bytes of a metadata output whose shape and datatype fix its size; None when only the
    shape is open; :data:`UNBOUNDED` for BYTES or what cannot be read."""
    try:
        datatype = Datatype(entry.datatype)
    except ValueError:
        return UNBOUNDED
    shape = entry.shape
    if shape is None or datatype is Datatype.BYTES:
        return UNBOUNDED
    if any(d < 0 for d in shape):
        return None
    n = ITEM_SIZE[datatype]
    for d in shape:
        n *= d
    return n


class Stager:
    """One backend's staging."""

    def __init__(
        self,
        mode: str,
        threshold: int,
        max_bytes: int = POOL_MAX,
        counts: dict[str, Cell] | None = None,
        staged_bytes: dict[str, Cell] | None = None,
        knowledge: BackendKnowledge | None = None,
    ) -> None:
        self.mode = mode
        self.threshold = threshold
        self.max_bytes = max_bytes
        self.counts = counts
        self.staged_bytes = staged_bytes
        #: whether the backend takes staged tensors (None: not asked yet)
        self.usable: bool | None = False if mode == "off" else None
        self.pool: StagingPool | None = None
        self._lock = asyncio.Lock()
        #: None: one of its own, bound to the first port
        self.knowledge = knowledge

    def _count(self, result: str) -> None:
        if self.counts is not None:
            self.counts[result].inc()

    def _known(self, port: StagingPort) -> BackendKnowledge:
        knowledge = self.knowledge
        if knowledge is None:
            knowledge = self.knowledge = BackendKnowledge(port)
        return knowledge

    def wanted(self, request: InferRequest) -> bool:
        """Whether ``request`` has an input of at least the threshold."""
        threshold = self.threshold
        for t in request.inputs:  # noqa: SIM110 - a plain loop: no generator per request
            if memoryview(t.data).nbytes >= threshold:
                return True
        return False

    async def infer(self, port: StagingPort, request: InferRequest, send: Send) -> InferResponse:
        """``request`` sent through ``send``, staged when it is worth it and possible."""
        if not self.wanted(request):
            return await send(request)
        if self.usable is not True and not await self._probe(port):
            self._count("miss")
            return await send(request)
        plan = await self._plan(port, request)
        if plan is None:
            self._count("miss")
            return await send(request)
        assert self.pool is not None
        keep = True
        try:
            try:
                response = await send(plan.request)
            except ProxyError as exc:
                if isinstance(exc, _NOT_A_REFUSAL) or "shared memory" not in exc.message.lower():
                    raise
                if TOO_SMALL in exc.message and plan.outputs:
                    # the client's region is too small for the answer: the client's error
                    _, sep, text = exc.message.partition("shared memory size")
                    raise ProxyError(sep + text) from None
                keep = False
                await self._refused(port, f"refused staged tensors: {exc.message}")
                self._count("fallback")
                return await send(request)
            self._count("hit")
            out = self._read_outputs(plan, response)
            if self.staged_bytes is not None:
                self.staged_bytes["input"].inc(plan.in_bytes)
                self.staged_bytes["output"].inc(out)
            return response
        finally:
            if self.pool is not None:
                self.pool.release(plan.region, keep)

    async def _probe(self, port: StagingPort) -> bool:
        async with self._lock:
            if self.usable is None:
                try:
                    self.usable = await self._ask(port)
                except ProxyError as exc:  # asked again later
                    log.debug("backend shared memory not probed: %s", exc)
                    return False
                log.info(
                    "backend shared memory (--backend-shm %s): %s",
                    self.mode,
                    "staging tensors" if self.usable else "not used",
                )
        return self.usable is True

    async def _ask(self, port: StagingPort) -> bool:
        if self.mode == "auto" and not (await self._known(port).server()).system_shared_memory:
            log.info("backend does not list system_shared_memory")
            return False
        self.pool = StagingPool(self.max_bytes)  # names unguessable, prefix reserved
        region, _ = self.pool.acquire(MIN_REGION)
        assert region is not None
        try:
            await self._register(port, region)
        except ProxyError as exc:
            if isinstance(exc, _NOT_A_REFUSAL):
                self.pool.release(region, keep=False)
                self.pool = None
                raise
            log.info("backend cannot open v2proxy's shared memory: %s", exc)
            self.pool.release(region, keep=False)
            self.pool = None
            return False
        self.pool.release(region)
        return True

    @staticmethod
    async def _register(port: StagingPort, region: StagingRegion) -> None:
        await port.register_staging(region.name, region.key, region.size)
        region.registered = True

    async def _refused(self, port: StagingPort, why: str) -> None:
        """No staging from now on; the pool's regions unregistered and unlinked."""
        if self.usable:
            log.warning("backend shared memory: %s; tensors are sent over the socket", why)
        self.usable = False
        await self.close(port)

    async def _output_sizes(
        self, port: StagingPort, request: InferRequest
    ) -> dict[str, int | None]:
        """Output name -> fixed byte size (None: not fixed), in the metadata's order."""
        try:
            meta = await self._known(port).model(request.model_name, request.model_version)
        except ProxyError:
            return {}
        return {t.name: _fixed_size(t) for t in meta.outputs}

    async def _plan(self, port: StagingPort, request: InferRequest) -> _Plan | None:
        threshold = self.threshold
        offset = 0
        in_offsets: dict[int, int] = {}
        offset_in = 0
        for i, t in enumerate(request.inputs):
            n = _nbytes(t)
            if n >= threshold:
                in_offsets[i] = offset
                offset = aligned(offset + n)
                offset_in += n
        sizes = await self._output_sizes(port, request)
        listed = request.outputs
        wanted = [RequestedOutput(name) for name in sizes] if listed is None else list(listed)
        out_offsets: dict[str, tuple[int, int, OutputSink | None]] = {}
        for o in wanted:
            if o.name not in sizes or "classification" in o.parameters:
                continue
            size = sizes[o.name]
            if size is None and o.sink is not None:
                size = o.sink.capacity
            if size is not None and size >= threshold:
                out_offsets[o.name] = (offset, size, o.sink)
                offset = aligned(offset + size)
        pool = self.pool
        if pool is None:
            return None
        region, dropped = pool.acquire(offset)
        for old in dropped:
            if old.registered:
                with contextlib.suppress(ProxyError):
                    await port.unregister_staging(old.name)
        if region is None:
            return None
        if not region.registered:
            try:
                await self._register(port, region)
            except ProxyError as exc:
                pool.release(region, keep=False)
                if not isinstance(exc, _NOT_A_REFUSAL):
                    await self._refused(port, f"refused a staging region: {exc.message}")
                return None
        inputs = list(request.inputs)
        for i, off in in_offsets.items():
            t = inputs[i]
            n = _nbytes(t)
            region.write(off, t.data)
            params = {**t.parameters, REGION: region.name, OFFSET: off, SIZE: n}
            inputs[i] = Tensor(t.name, t.datatype, t.shape, b"", params)
        outputs: list[RequestedOutput] | None = None
        if listed is not None or out_offsets:
            outputs = []
            for o in wanted:
                if o.name in out_offsets:
                    off, n, _ = out_offsets[o.name]
                    params = {k: v for k, v in o.parameters.items() if k != "binary_data"}
                    params.update({REGION: region.name, OFFSET: off, SIZE: n})
                    outputs.append(RequestedOutput(o.name, params, o.sink))
                else:
                    outputs.append(o)
        staged = InferRequest(
            model_name=request.model_name,
            inputs=inputs,
            outputs=outputs,
            id=request.id,
            parameters=request.parameters,
            model_version=request.model_version,
        )
        return _Plan(region, staged, out_offsets, offset_in)

    @staticmethod
    def _read_outputs(plan: _Plan, response: InferResponse) -> int:
        """Copy the staged outputs into the client's region, or else the response; returns the
        bytes copied."""
        total = 0
        for t in response.outputs:
            where = plan.outputs.get(t.name)
            if where is None:
                continue
            off, capacity, sink = where
            n = ITEM_SIZE.get(t.datatype, 0)
            for d in t.shape:
                n *= d
            if _nbytes(t) or n > capacity or t.datatype is Datatype.BYTES:
                raise BadGateway(
                    f"invalid inference response from backend: output '{t.name}' was asked"
                    f" into shared memory ({capacity} bytes) but answered {n} bytes otherwise"
                )
            for k in (REGION, OFFSET, SIZE):
                t.parameters.pop(k, None)
            total += n
            if sink is None:
                t.data = plan.region.read(off, n)
                continue
            sink.write(plan.region.view(off, n))
            t.data = b""
            t.parameters = {}
            t.in_shm = True
        return total

    async def close(self, port: StagingPort) -> None:
        """Unlink every region and unregister them from the backend (at shutdown)."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        for region in pool.close():
            with contextlib.suppress(ProxyError, OSError, TimeoutError):
                async with asyncio.timeout(5):
                    await port.unregister_staging(region.name)
