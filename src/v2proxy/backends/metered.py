"""A :class:`~v2proxy.core.ports.Backend` decorator that times every call of the backend it wraps
and counts its connection errors (:class:`~v2proxy.ops.recorders.BackendRecorder`), so that the
pipeline and the real backends stay free of metrics.

``forward`` is timed to the answer's head; ``relay_message`` is recorded as ``relay_infer``.
The calls made without a coroutine (``relay_now``, ``infer_now``) are timed by the backend
itself (:meth:`Backend.time_now <v2proxy.core.ports.Backend.time_now>`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from time import perf_counter
from typing import Any

from v2proxy.core.model import Buffer, InferRequest, InferResponse
from v2proxy.core.ports import Backend, Body, ForwardResponse, Headers, Record
from v2proxy.ops.metrics_export import AnyMetrics, Metrics
from v2proxy.ops.recorders import BackendRecorder


def metered(backend: Backend, metrics: AnyMetrics) -> Backend:
    """``backend`` wrapped in a :class:`MeteredBackend` when metrics are on, else itself."""
    if isinstance(metrics, Metrics):
        return MeteredBackend(backend, BackendRecorder(metrics))
    return backend


class MeteredBackend:
    """Times each call of ``inner``."""

    def __init__(self, inner: Backend, recorder: BackendRecorder) -> None:
        self.inner = inner
        self.name = inner.name
        self.speaks_rest = inner.speaks_rest
        self.stream_call = inner.stream_call
        self.transcodes_json = inner.transcodes_json
        self.relay_facts = inner.relay_facts  # (asks nothing: not timed)
        self.learn_relay_facts = inner.learn_relay_facts
        self._rec = recorder
        inner.time_now(recorder.done)
        self.relay_now = inner.relay_now
        self.infer_now = inner.infer_now

    def time_now(self, record: Record) -> None:
        self.inner.time_now(record)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        t0 = perf_counter()
        try:
            response = await self.inner.infer(request, headers)
        except BaseException as exc:
            self._rec.done("infer", request.model_name, perf_counter() - t0, exc)
            raise
        self._rec.done("infer", request.model_name, perf_counter() - t0, None)
        return response

    async def stream_infer(
        self, request: InferRequest, headers: Headers
    ) -> AsyncIterator[InferResponse]:
        t0 = perf_counter()
        try:
            async for response in self.inner.stream_infer(request, headers):
                yield response
        except BaseException as exc:
            self._rec.done("stream_infer", request.model_name, perf_counter() - t0, exc)
            raise
        self._rec.done("stream_infer", request.model_name, perf_counter() - t0, None)

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: Headers
    ) -> ForwardResponse:
        t0 = perf_counter()
        try:
            answer = await self.inner.relay_infer(model, version, body, ihcl, headers)
        except BaseException as exc:
            self._rec.done("relay_infer", model, perf_counter() - t0, exc)
            raise
        self._rec.done("relay_infer", model, perf_counter() - t0, None)
        return answer

    async def relay_message(
        self, model: str, version: str, message: bytes, headers: Headers, *, streamed: bool = False
    ) -> bytes:
        t0 = perf_counter()
        try:
            answer = await self.inner.relay_message(
                model, version, message, headers, streamed=streamed
            )
        except BaseException as exc:
            self._rec.done("relay_infer", model, perf_counter() - t0, exc)
            raise
        self._rec.done("relay_infer", model, perf_counter() - t0, None)
        return answer

    async def forward(
        self, method: str, target: str, headers: Headers, body: Buffer
    ) -> ForwardResponse:
        return await self._timed(  # type: ignore[no-any-return]
            "forward", "", self.inner.forward(method, target, headers, body)
        )

    async def _timed(self, op: str, model: str, call: Any) -> Any:
        t0 = perf_counter()
        try:
            result = await call
        except BaseException as exc:
            self._rec.done(op, model, perf_counter() - t0, exc)
            raise
        self._rec.done(op, model, perf_counter() - t0, None)
        return result

    async def server_ready(self) -> bool:
        return await self._timed("server_ready", "", self.inner.server_ready())  # type: ignore[no-any-return]

    async def server_metadata(self) -> dict[str, Any]:
        return await self._timed("server_metadata", "", self.inner.server_metadata())  # type: ignore[no-any-return]

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        return await self._timed(  # type: ignore[no-any-return]
            "model_metadata", model, self.inner.model_metadata(model, version)
        )

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        return await self._timed(  # type: ignore[no-any-return]
            "model_config", model, self.inner.model_config(model, version)
        )

    async def model_ready(self, model: str, version: str) -> bool:
        return await self._timed(  # type: ignore[no-any-return]
            "model_ready", model, self.inner.model_ready(model, version)
        )

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        return await self._timed(  # type: ignore[no-any-return]
            "statistics", model, self.inner.statistics(model, version, headers)
        )

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]:
        return await self._timed(  # type: ignore[no-any-return]
            "repository_index", "", self.inner.repository_index(ready, headers)
        )

    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        await self._timed(
            "repository_load", model, self.inner.repository_load(model, load, parameters, headers)
        )

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        return await self._timed(  # type: ignore[no-any-return]
            "trace_settings", model, self.inner.trace_settings(model, update, headers)
        )

    async def log_settings(self, update: dict[str, Any] | None, headers: Headers) -> dict[str, Any]:
        return await self._timed(  # type: ignore[no-any-return]
            "log_settings", "", self.inner.log_settings(update, headers)
        )
