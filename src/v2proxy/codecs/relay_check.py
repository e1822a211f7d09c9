"""Whether a small JSON ``/infer`` body may be relayed untouched without decoding it: a parse
and one look at each field, where the full decoder builds every tensor's bytes.

:func:`plain_json_request` is *sound*, not complete: True only for bodies the full decoder
accepts and no stage applies to (no ``parameters``; no FP16/BF16, which binary backends refuse
in JSON; no BYTES); anything else takes the full decoder's path, which names the fault. It
accepts ``{"id", "inputs": [{"name", "datatype", "shape", "data": [flat numbers]}, ...],
"outputs": [{"name"}, ...]}``, typed by :data:`~v2proxy.codecs.json_shapes.RELAY_CHECK`. Pure: no
I/O.
"""

from __future__ import annotations

from math import prod

from v2proxy.codecs.dtypes import ITEM_SIZE
from v2proxy.codecs.json import SMALL_DOCUMENT
from v2proxy.codecs.json_data import SMALL_ARRAY
from v2proxy.codecs.json_shapes import RELAY_CHECK, DecodeErrors

_MOST = SMALL_ARRAY * max(ITEM_SIZE.values())


def plain_json_request(body: bytes | bytearray, max_input_size: int, max_tensors: int) -> bool:
    """True when ``body`` is a JSON request the full decoder accepts and no stage applies to;
    False when unsure."""
    size = len(body)
    if size > SMALL_DOCUMENT or size > max_input_size:
        return False
    try:
        request = RELAY_CHECK.decode(body)
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
