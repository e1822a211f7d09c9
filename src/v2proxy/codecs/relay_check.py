"""Whether a small JSON ``/infer`` body may be relayed untouched without decoding it: a check
that costs a parse and one look at each field, where the full decoder
(:func:`v2proxy.codecs.binary.decode_request`) builds every tensor's bytes.

:func:`plain_json_request` is *sound*, not complete: it says True only for bodies that the full
decoder accepts and to which no stage of the pipeline applies (no ``parameters`` anywhere, so
no shared memory, no classification, no ``binary_data`` or ``binary_data_output``; no FP16 or
BF16 numbers, which binary backends refuse in JSON; no BYTES). Everything else (a malformed
body included) says False, and the caller takes the full decoder's path, which names the field
at fault. What it accepts is the common shape of a JSON client's request::

    {"id": "...", "inputs": [{"name", "datatype", "shape", "data": [flat numbers]}, ...],
     "outputs": [{"name"}, ...]}

with every tensor's ``data`` a flat array of exactly the shape's element count (at most
:data:`~v2proxy.codecs.json_data.SMALL_ARRAY`), each element of the datatype's kind and range,
unique names, at most ``max_tensors`` inputs and outputs, and the body and the decoded bytes
within ``max_input_size``. ``tests/unit/test_relay_check.py`` checks the soundness against the
full decoder on generated bodies.

Pure: no I/O.
"""

from __future__ import annotations

import orjson

from v2proxy.codecs.dtypes import INTEGER_TYPES, ITEM_SIZE
from v2proxy.codecs.json import SMALL_DOCUMENT
from v2proxy.codecs.json_data import INT_RANGES, SMALL_ARRAY
from v2proxy.core.model import Datatype

_INPUT_KEYS = frozenset({"name", "datatype", "shape", "data"})
_OUTPUT_KEYS = frozenset({"name"})
_TOP_KEYS = frozenset({"id", "inputs", "outputs"})
_INT = frozenset({int})
_BOOL = frozenset({bool})
_NUMBER = frozenset({int, float})

#: datatype name -> (element kinds allowed, (min, max) for integers or None, item size)
_KINDS: dict[str, tuple[frozenset[type], tuple[int, int] | None, int]] = {}
for _dt in Datatype:
    if _dt in INTEGER_TYPES:
        _KINDS[_dt.value] = (_INT, INT_RANGES[_dt], ITEM_SIZE[_dt])
    elif _dt in (Datatype.FP32, Datatype.FP64):
        _KINDS[_dt.value] = (_NUMBER, None, ITEM_SIZE[_dt])
    elif _dt is Datatype.BOOL:
        _KINDS[_dt.value] = (_BOOL, None, ITEM_SIZE[_dt])
# FP16/BF16 (binary backends refuse them in JSON) and BYTES: the full path


def plain_json_request(body: bytes | bytearray, max_input_size: int, max_tensors: int) -> bool:
    """True when ``body`` is a JSON request the full decoder accepts and no stage applies to
    (see the module's docstring); False when unsure."""
    size = len(body)
    if size > SMALL_DOCUMENT or size > max_input_size:
        return False
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    if type(obj) is not dict or not obj.keys() <= _TOP_KEYS:
        return False
    rid = obj.get("id")
    if rid is not None and type(rid) is not str:
        return False
    inputs = obj.get("inputs")
    if type(inputs) is not list or not 0 < len(inputs) <= max_tensors:
        return False
    names: set[str] = set()
    total = 0
    for item in inputs:
        if type(item) is not dict or item.keys() != _INPUT_KEYS:
            return False
        name = item["name"]
        kinds = _KINDS.get(item["datatype"])
        shape = item["shape"]
        data = item["data"]
        if type(name) is not str or name in names or kinds is None or type(shape) is not list:
            return False
        names.add(name)
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                return False
            count *= d
        if type(data) is not list or len(data) != count or not 0 < count <= SMALL_ARRAY:
            return False
        allowed, bounds, itemsize = kinds
        if not set(map(type, data)) <= allowed:
            return False
        if bounds is not None and (min(data) < bounds[0] or max(data) > bounds[1]):
            return False
        total += count * itemsize
    if total > max_input_size:
        return False
    outputs = obj.get("outputs")
    if outputs is not None:
        if type(outputs) is not list or len(outputs) > max_tensors:
            return False
        seen: set[str] = set()
        for item in outputs:
            if type(item) is not dict or item.keys() != _OUTPUT_KEYS:
                return False
            name = item["name"]
            if type(name) is not str or name in seen:
                return False
            seen.add(name)
    return True
