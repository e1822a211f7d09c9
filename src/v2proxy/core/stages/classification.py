"""The classification stage of the pipeline (its stages 4 and 6), pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from v2proxy.codecs.backend_meta import model_meta
from v2proxy.codecs.classification import classify, requested_count
from v2proxy.core.errors import ProxyError
from v2proxy.core.model import InferRequest, InferResponse, RequestedOutput
from v2proxy.core.stages.base import Applied

CLASSIFICATION = "classification"


class OutputLabels(Protocol):
    """The settings of one output (``config_sections.OutputSettings``)."""

    @property
    def labels(self) -> tuple[str, ...]: ...


class ModelLabels(Protocol):
    """The settings of one model (``config_sections.ModelSettings``)."""

    @property
    def outputs(self) -> Mapping[str, OutputLabels]: ...


@dataclass(frozen=True, slots=True)
class Classification:
    """An output the proxy classifies: ``k`` and its labels (None: none configured)."""

    k: int
    labels: tuple[str, ...] | None


#: output name -> how the proxy classifies it
Plan = Mapping[str, Classification]


class ModelKnowledge(Protocol):
    """What the stage asks of the backend's models, cached (:class:`v2proxy.core.knowledge.
    BackendKnowledge`)."""

    async def lists_classification(self) -> bool:
        """Whether the backend lists the classification extension."""
        ...

    async def shape_info(self, model: str, version: str) -> tuple[dict[str, Any], int | None]:
        """A model's metadata and ``max_batch_size`` (raises the backend's ProxyError)."""
        ...


def requested(request: InferRequest) -> dict[str, int] | None:
    """The requested outputs that carry a ``classification`` parameter, name -> k (0: none;
    a malformed k is the request's error), or None when none does."""
    counts: dict[str, int] | None = None
    for o in request.outputs or ():
        params = o.parameters
        if not params:
            continue
        if CLASSIFICATION in params:
            if counts is None:
                counts = {}
            counts[o.name] = requested_count(params)
    return counts


def asks_backend(counts: Mapping[str, int], local: Mapping[str, OutputLabels]) -> bool:
    """Whether the decision depends on the backend's extensions (some output wants classes and
    has no labels here)."""
    return any(k and name not in local for name, k in counts.items())


def plan(
    request: InferRequest,
    counts: Mapping[str, int],
    local: Mapping[str, OutputLabels],
    backend_classifies: bool,
) -> tuple[InferRequest, Plan]:
    """The request the backend is sent, and the outputs the proxy classifies."""
    todo: dict[str, Classification] = {}
    outputs: list[RequestedOutput] = []
    changed = False
    for o in request.outputs or ():
        k = counts.get(o.name)
        configured = local.get(o.name)
        if k is None or (k and configured is None and backend_classifies):
            outputs.append(o)
            continue
        if k:
            todo[o.name] = Classification(k, configured.labels if configured else None)
        params = {key: v for key, v in o.parameters.items() if key != CLASSIFICATION}
        outputs.append(RequestedOutput(o.name, params))
        changed = True
    return (replace(request, outputs=outputs) if changed else request), todo


def batching(metadata: Mapping[str, Any], max_batch_size: int | None, output: str) -> bool:
    """Whether ``output``'s first dimension is the batch."""
    if max_batch_size is not None:
        return max_batch_size > 0
    entry = model_meta(metadata).output(output)
    shape = entry.shape if entry is not None else None
    return shape is not None and len(shape) > 1 and shape[0] == -1


def apply(
    response: InferResponse, todo: Plan, metadata: Mapping[str, Any], max_batch_size: int | None
) -> InferResponse:
    """Stage 6: the outputs in ``todo`` replaced by their classification."""
    outputs = []
    for t in response.outputs:
        c = todo.get(t.name)
        batched = c is not None and batching(metadata, max_batch_size, t.name)
        outputs.append(t if c is None else classify(t, c.k, batched, c.labels))
    response.outputs = outputs
    return response


class ClassificationStage:
    """Classification as a :class:`~v2proxy.core.stages.base.Stage`: the
    labels configured per model (``Settings.models``) and what is known of the backend."""

    __slots__ = ("info", "models")

    input_keys: frozenset[str] = frozenset()
    output_keys = frozenset({CLASSIFICATION})

    def __init__(self, models: Mapping[str, ModelLabels], info: ModelKnowledge) -> None:
        self.models = models
        self.info = info

    def applies(self, request: InferRequest, peer: str | None) -> Applied | None:
        """The request's plan when an output asks for classes (a malformed k raises)."""
        counts = requested(request)
        return None if counts is None else _Classifying(self, counts)


class _Classifying:
    """One request's classification: the outputs the proxy classifies, once planned."""

    __slots__ = ("counts", "model", "stage", "todo", "version")

    def __init__(self, stage: ClassificationStage, counts: dict[str, int]) -> None:
        self.stage = stage
        self.counts = counts
        self.todo: Plan = {}
        self.model = ""
        self.version = ""

    async def before(self, request: InferRequest) -> InferRequest:
        """Stage 4: the request the backend is sent (:func:`plan`)."""
        model = self.stage.models.get(request.model_name)
        local = model.outputs if model is not None else {}
        classifies = (
            asks_backend(self.counts, local) and await self.stage.info.lists_classification()
        )
        sent, self.todo = plan(request, self.counts, local, classifies)
        self.model, self.version = request.model_name, request.model_version
        return sent

    async def after(self, response: InferResponse) -> InferResponse:
        """Stage 6: the planned outputs classified, batching known from the model's config or
        metadata (none when they cannot be had)."""
        todo = self.todo
        if not todo or not any(t.name in todo for t in response.outputs):
            return response
        try:
            metadata, max_batch_size = await self.stage.info.shape_info(self.model, self.version)
        except ProxyError:
            metadata, max_batch_size = {}, None
        return apply(response, todo, metadata, max_batch_size)

    def release(self) -> None:
        return None
