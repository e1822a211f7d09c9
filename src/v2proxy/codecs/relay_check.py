"""Whether a small JSON ``/infer`` body may be relayed untouched without decoding it: a parse
and one look at each field, where the full decoder builds every tensor's bytes.

:func:`plain_json_request` is *sound*, not complete: True only for bodies the full decoder
accepts and no stage applies to (no ``parameters``; no FP16/BF16, which binary backends refuse
in JSON; no BYTES); anything else takes the full decoder's path, which names the fault. It
accepts ``{"id", "inputs": [{"name", "datatype", "shape", "data": [flat numbers]}, ...],
"outputs": [{"name"}, ...]}``. Pure: no I/O.
"""

from __future__ import annotations

from math import prod
from typing import Annotated, Any

import msgspec

from v2proxy.codecs.dtypes import INTEGER_TYPES, ITEM_SIZE
from v2proxy.codecs.json import SMALL_DOCUMENT
from v2proxy.codecs.json_data import SMALL_ARRAY
from v2proxy.codecs.json_shapes import DecodeErrors, request_decoder, tensor_types
from v2proxy.core.model import Datatype

_FP32_MAX = 3.4028234663852886e38
_UINT64_MAX = (1 << 64) - 1
_MOST = SMALL_ARRAY * max(ITEM_SIZE.values())


def _element(dt: Datatype) -> Any:
    """The type of one element of ``dt``'s data, its range included (UINT64's top is checked
    by the caller: msgspec bounds an int within int64 only)."""
    if dt is Datatype.BOOL:
        return bool
    if dt is Datatype.FP32:
        return Annotated[float, msgspec.Meta(ge=-_FP32_MAX, le=_FP32_MAX)]
    if dt is Datatype.FP64:
        return float
    if dt is Datatype.UINT64:
        return Annotated[int, msgspec.Meta(ge=0)]
    bits = ITEM_SIZE[dt] * 8
    if dt.value.startswith("U"):
        return Annotated[int, msgspec.Meta(ge=0, le=(1 << bits) - 1)]
    return Annotated[int, msgspec.Meta(ge=-(1 << (bits - 1)), le=(1 << (bits - 1)) - 1)]


class _Output(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: str


_DATATYPES = [
    dt
    for dt in Datatype
    if dt in INTEGER_TYPES or dt in (Datatype.FP32, Datatype.FP64, Datatype.BOOL)
]


def _namespace(dt: Datatype) -> dict[str, Any]:
    """An input's item size, and the top of its elements left to check here (0: none)."""
    return {"itemsize": ITEM_SIZE[dt], "top": _UINT64_MAX if dt is Datatype.UINT64 else 0}


_DECODER = request_decoder(
    tensor_types(_DATATYPES, _element, _namespace), _Output, parameters=False
)


def plain_json_request(body: bytes | bytearray, max_input_size: int, max_tensors: int) -> bool:
    """True when ``body`` is a JSON request the full decoder accepts and no stage applies to;
    False when unsure."""
    size = len(body)
    if size > SMALL_DOCUMENT or size > max_input_size:
        return False
    try:
        request = _DECODER.decode(body)
    except DecodeErrors:
        return False  # not JSON, or not of the accepted shape, kinds and ranges
    inputs = request.inputs
    n = len(inputs)
    if not 0 < n <= max_tensors:
        return False
    names = set()
    for tensor in inputs:
        if len(tensor.data) != prod(tensor.shape):
            return False
        if tensor.top and max(tensor.data) > tensor.top:
            return False
        names.add(tensor.name)
    if len(names) != n:
        return False
    if n * _MOST > max_input_size:  # only then may the decoded bytes pass the limit
        decoded = 0
        for tensor in inputs:
            decoded += len(tensor.data) * tensor.itemsize
        if decoded > max_input_size:
            return False
    outputs = request.outputs
    return outputs is None or (
        len(outputs) <= max_tensors and len({o.name for o in outputs}) == len(outputs)
    )
