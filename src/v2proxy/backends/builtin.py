"""The in-process backend serving the builtin reference models (``--backend builtin``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from v2proxy import __version__
from v2proxy.backends.base import NonRestBackend, single_response
from v2proxy.codecs import settings
from v2proxy.codecs.dtypes import check_tensor_size
from v2proxy.core.errors import CodecError, InvalidRequest, NotFound, ProxyError
from v2proxy.core.model import InferRequest, InferResponse, Tensor
from v2proxy.core.ports import Headers
from v2proxy.reference.models import MODELS, ModelSpec, Produced

_END: Any = object()

EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "model_repository"]


@dataclass(slots=True)
class _Stats:
    success: int = 0
    failure: int = 0
    success_ns: int = 0
    failure_ns: int = 0
    last_inference_ms: int = 0

    def as_json(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "version": "1",
            "last_inference": self.last_inference_ms,
            "inference_count": self.success,
            "execution_count": self.success,
            "inference_stats": {
                "success": {"count": self.success, "ns": self.success_ns},
                "fail": {"count": self.failure, "ns": self.failure_ns},
            },
        }


def unknown_model(model: str, version: str = "") -> NotFound:
    suffix = f" version {version}" if version else ""
    return NotFound(f"Request for unknown model: '{model}'{suffix} is not found")


def _shape_matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d in (-1, s) for s, d in zip(shape, dims, strict=True))


#: what Triton adds to a shape error for models that batch
_BATCH_NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to"
    " be prepended to each input shape. If you want to specify the full shape including the"
    " batch dim in your input dims config, try setting max_batch_size to zero. See the model"
    " configuration docs for more info on max_batch_size."
)


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def validate_inputs(spec: ModelSpec, request: InferRequest) -> dict[str, Tensor]:
    """The request's inputs by name, checked against the model's configuration."""
    model = spec.name
    specs = {t.name: t for t in spec.inputs}
    required = [t.name for t in spec.inputs if not t.optional]
    names = [t.name for t in request.inputs]
    given = set(names)
    if len(given) != len(names):
        dup = next(n for i, n in enumerate(names) if n in names[:i])
        raise InvalidRequest(f"input '{dup}' already exists in request")
    missing = [name for name in required if name not in given]
    count_error = InvalidRequest(
        f"expected {len(required)} inputs but got {len(names)} inputs for model '{model}'."
        f" Got input(s) {_names(names)}, but missing required input(s) {_names(missing)}."
        " Please provide all required input(s)."
    )
    # Triton's order: the count first, then each name, then what is still missing
    if not len(required) <= len(names) <= len(specs):
        raise count_error
    unknown = next((n for n in names if n not in specs), None)
    if unknown is not None:
        raise InvalidRequest(f"unexpected inference input '{unknown}' for model '{model}'")
    if missing:
        raise count_error
    by_name: dict[str, Tensor] = {}
    for t in request.inputs:
        ts = specs[t.name]
        if t.datatype is not ts.datatype:
            raise InvalidRequest(
                f"inference input '{t.name}' data-type is '{t.datatype.value}', but model"
                f" '{model}' expects '{ts.datatype.value}'"
            )
        dims = ts.dims
        shape = t.shape
        if spec.max_batch_size > 0:
            if not shape:
                raise InvalidRequest(
                    f"input '{t.name}' has no shape but model requires batch dimension for"
                    f" '{model}'"
                )
            if shape[0] > spec.max_batch_size:
                raise InvalidRequest(
                    f"inference request batch-size must be <= {spec.max_batch_size} for '{model}'"
                )
            shape = shape[1:]
        if not _shape_matches(shape, dims):
            batch = (-1,) if spec.max_batch_size > 0 else ()
            raise InvalidRequest(
                f"unexpected shape for input '{t.name}' for model '{model}'. Expected"
                f" {_dims((*batch, *dims))}, got {_dims(t.shape)}.{_BATCH_NOTE if batch else ''}"
            )
        try:
            check_tensor_size(t, f"input '{t.name}' for model '{model}'")
        except CodecError as exc:
            raise InvalidRequest(str(exc)) from None
        by_name[t.name] = t
    return by_name


def select_outputs(spec: ModelSpec, request: InferRequest, outputs: list[Tensor]) -> list[Tensor]:
    """Only the outputs the request lists (all when it lists none), in model order."""
    if request.outputs is None:
        return outputs
    known = {t.name for t in spec.outputs}
    for o in request.outputs:
        if o.name not in known:
            raise InvalidRequest(f"unexpected inference output '{o.name}' for model '{spec.name}'")
    wanted = {o.name for o in request.outputs}
    return [t for t in outputs if t.name in wanted]


async def _next(spec: ModelSpec, request: InferRequest, produced: Produced) -> list[Tensor] | None:
    """The outputs of the model's next response (None: no more), yielding to the event loop at
    each of the model's pauses."""
    while True:
        item = next(produced, _END)
        if item is _END:
            return None
        if item is not None:
            return select_outputs(spec, request, item)
        await asyncio.sleep(0)


class BuiltinBackend(NonRestBackend):
    """Serves the reference models in-process."""

    name = "builtin"

    def __init__(self, server_name: str = "v2proxy") -> None:
        self._server_name = server_name
        self._stats = {name: _Stats() for name in MODELS}
        self._unloaded: set[str] = set()
        self._trace: dict[str, Any] = {"trace_level": ["OFF"], "trace_rate": "1000"}
        self._log: dict[str, Any] = {"log_info": True, "log_warning": True, "log_error": True}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def spec(self, model: str, version: str = "") -> ModelSpec:
        spec = MODELS.get(model)
        if spec is None or model in self._unloaded:
            raise unknown_model(model)
        if version not in ("", "1"):
            raise unknown_model(model, version)
        return spec

    async def server_ready(self) -> bool:
        return True

    async def server_metadata(self) -> dict[str, Any]:
        return {"name": self._server_name, "version": __version__, "extensions": EXTENSIONS}

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        return self.spec(model, version).metadata()

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        return self.spec(model, version).config()

    async def model_ready(self, model: str, version: str) -> bool:
        self.spec(model, version)
        return True

    async def infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        return await single_response(request.model_name, self.stream_infer(request, headers))

    async def stream_infer(
        self, request: InferRequest, headers: Headers
    ) -> AsyncIterator[InferResponse]:
        """Every response of the model to the request, each made when the caller asks for the
        next; closing this iterator stops the model."""
        spec = self.spec(request.model_name, request.model_version)
        stats = self._stats[spec.name]
        start = time.perf_counter_ns()
        produced: Produced | None = None
        try:
            try:
                inputs = validate_inputs(spec, request)
                produced = spec.compute(inputs)
                # the first response is made before any is sent, so a bad request fails whole
                outputs = await _next(spec, request, produced)
            except ProxyError:
                stats.failure += 1
                stats.failure_ns += time.perf_counter_ns() - start
                raise
            stats.success += 1
            stats.success_ns += time.perf_counter_ns() - start
            stats.last_inference_ms = int(time.time() * 1000)
            while outputs is not None:
                yield InferResponse(
                    model_name=spec.name, model_version="1", id=request.id or None, outputs=outputs
                )
                outputs = await _next(spec, request, produced)
                if outputs is not None:
                    # a consumer that never waits would otherwise take a million in one go
                    await asyncio.sleep(0)
        finally:
            close = getattr(produced, "close", None)
            if close is not None:
                close()

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        if not model:
            names = sorted(n for n in MODELS if n not in self._unloaded)
        else:
            names = [self.spec(model, version).name]
        return {"model_stats": [self._stats[n].as_json(n) for n in names]}

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]:
        entries = []
        for name in sorted(MODELS):
            loaded = name not in self._unloaded
            if ready and not loaded:
                continue
            entries.append(
                {
                    "name": name,
                    "version": "1",
                    "state": "READY" if loaded else "UNAVAILABLE",
                    "reason": "" if loaded else "unloaded",
                }
            )
        return entries

    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        if model not in MODELS:
            raise InvalidRequest(f"failed to load '{model}', failed to poll from model repository")
        if load:
            self._unloaded.discard(model)
        else:
            self._unloaded.add(model)

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        if model:
            self.spec(model)
        if update:
            self._trace.update(settings.trace_update(update))
        return dict(self._trace)

    async def log_settings(self, update: dict[str, Any] | None, headers: Headers) -> dict[str, Any]:
        if update:
            self._log.update(settings.log_update(update))
        return dict(self._log)
