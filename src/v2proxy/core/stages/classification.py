"""The classification stage of the pipeline, pure (stages 4 and 6 of :mod:`v2proxy.core.pipeline`).

Stage 4, per requested output with a ``classification`` parameter (``k``, checked by
:func:`~v2proxy.codecs.classification.requested_count`):

- ``k`` is 0 (REST: no classification): the parameter is dropped, the output returned as is;
- labels are configured for (model, output) (``models.<m>.outputs.<o>.labels``): the proxy
  classifies: the backend is asked for the raw output, without the parameter;
- no labels here and the backend lists the ``classification`` extension: the parameter passes
  through and the backend classifies (with its own labels, e.g. Triton's ``label_filename``);
- otherwise the proxy classifies, without labels.

Stage 6 replaces each output the proxy classifies by its classification. Whether the model
batches comes from its configuration (``max_batch_size > 0``) or, without one, from its
metadata (the output's shape has a leading -1 and at least two dimensions: a lone ``[-1]`` is
taken as a variable-length vector).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from v2proxy.codecs.classification import classify
from v2proxy.core.model import InferRequest, InferResponse, RequestedOutput


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
        params = {key: v for key, v in o.parameters.items() if key != "classification"}
        outputs.append(RequestedOutput(o.name, params))
        changed = True
    return (replace(request, outputs=outputs) if changed else request), todo


def batching(metadata: Mapping[str, Any], max_batch_size: int | None, output: str) -> bool:
    """Whether ``output``'s first dimension is the batch (see the module docstring)."""
    if max_batch_size is not None:
        return max_batch_size > 0
    entries = metadata.get("outputs")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and entry.get("name") == output:
            shape = entry.get("shape")
            return isinstance(shape, list) and len(shape) > 1 and shape[0] == -1
    return False


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
