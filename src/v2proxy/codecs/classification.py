"""The classification extension's top-k (docs/protocol.md, classification), pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from v2proxy.codecs.dtypes import INTEGER_TYPES, NUMPY_DTYPE, serialize_bytes
from v2proxy.core.errors import InvalidRequest
from v2proxy.core.model import Datatype, Tensor, element_count

#: the most elements one row may have (Triton's cap; docs/protocol.md, classification)
MAX_ROW_ELEMENTS = 1_000_000
#: rows this long or shorter are sorted as libstdc++'s insertion sort does when they hold NaN
_INSERTION_SORT_MAX = 16

_FLOATS = frozenset({Datatype.FP32, Datatype.FP64})
_SUPPORTED = _FLOATS | INTEGER_TYPES

BAD_COUNT = (
    "Unable to set 'classification': attempt to access JSON non-unsigned-integer as"
    " unsigned-integer"
)
WITH_SHM = "Output can't set both 'shared_memory_region' and 'classification'"


def requested_count(params: Mapping[str, Any]) -> int:
    """``k`` of a requested output whose parameters hold ``classification`` (0: none)."""
    value = params["classification"]
    if type(value) is not int or not 0 <= value < 2**64:
        raise InvalidRequest(BAD_COUNT)
    if "shared_memory_region" in params:  # even with k = 0, as Triton
        raise InvalidRequest(WITH_SHM)
    return value


def classify(tensor: Tensor, k: int, batching: bool, labels: tuple[str, ...] | None) -> Tensor:
    """The top-``k`` classes of each row of ``tensor`` as Triton's BYTES tensor."""
    datatype = tensor.datatype
    if datatype not in _SUPPORTED:
        raise InvalidRequest(
            f"class result not available for output due to unsupported type '{datatype.value}'"
        )
    shape = tensor.shape
    batch = shape[0] if batching and shape else 0
    row = element_count(shape[1:] if batch else shape)
    if row > MAX_ROW_ELEMENTS:
        raise InvalidRequest("classification output tensor too large")
    count = min(k, row)
    dtype = NUMPY_DTYPE[datatype]
    raw = memoryview(tensor.data).cast("B")
    flat = np.frombuffer(raw, dtype=dtype, count=len(raw) // dtype.itemsize)
    # a row running past the data (a short buffer) gives no classes, as in Triton
    rows = max(1, batch) if row == 0 else min(max(1, batch), flat.size // row)
    strings: list[bytes] = []
    if count and rows:
        table = flat[: rows * row].reshape(rows, row)
        order = _top(table, count, datatype in _FLOATS)
        fmt = _float_text if datatype in _FLOATS else str
        for values, indices in zip(table.tolist(), order.tolist(), strict=True):
            for i in indices:
                label = labels[i] if labels is not None and i < len(labels) else ""
                text = f"{fmt(values[i])}:{i}:{label}" if label else f"{fmt(values[i])}:{i}"
                strings.append(text.encode())
    out_shape = (batch, count) if batch else (count,)
    return Tensor(tensor.name, Datatype.BYTES, out_shape, serialize_bytes(strings))


def _float_text(value: float) -> str:
    """C's ``%f`` (glibc): NaN keeps its sign (``-nan``), Python's does not."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return f"{value:f}"


def _top(table: np.ndarray, count: int, floats: bool) -> np.ndarray:
    """Per row, the indices of its ``count`` largest values, largest first, ties lower index
    first."""
    n = table.shape[1]
    if floats and n <= _INSERTION_SORT_MAX and bool(np.isnan(table).any()):
        return np.array([_insertion_order(r)[:count] for r in table.tolist()], dtype=np.intp)
    # a stable ascending sort of each row reversed, read backwards: descending, ties in
    # increasing index order
    ascending = np.argsort(table[:, ::-1], axis=1, kind="stable")
    descending: np.ndarray = (n - 1) - ascending[:, ::-1][:, :count]
    return descending


def _insertion_order(values: list[float]) -> list[int]:
    """libstdc++'s ``__insertion_sort`` (what ``std::sort`` does for 16 elements or fewer) with
    Triton's comparator ``v[i] > v[j]``: where NaN, never greater nor smaller, ends up."""
    idx = list(range(len(values)))
    for i in range(1, len(idx)):
        val = idx[i]
        if values[val] > values[idx[0]]:
            idx[1 : i + 1] = idx[0:i]
            idx[0] = val
            continue
        j = i
        while values[val] > values[idx[j - 1]]:
            idx[j] = idx[j - 1]
            j -= 1
        idx[j] = val
    return idx
