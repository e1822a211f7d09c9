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

import struct
from collections.abc import Callable
from typing import Any

import orjson

from v2proxy.codecs.dtypes import INTEGER_TYPES, ITEM_SIZE
from v2proxy.codecs.json import SMALL_DOCUMENT
from v2proxy.codecs.json_data import SMALL_ARRAY, STRUCT_CODES
from v2proxy.core.model import Datatype

_INPUT_KEYS = frozenset({"name", "datatype", "shape", "data"})
_OUTPUT_KEYS = frozenset({"name"})
_TOP_KEYS = frozenset({"id", "inputs", "outputs"})
_BOOL = frozenset({bool})
_NUMBER = frozenset({int, float})

#: datatype name -> (struct code of its elements, item size): the integer types, FP32, FP64 and
#: BOOL (FP16/BF16, which binary backends refuse in JSON, and BYTES take the full path)
_CODES: dict[str, tuple[str, int]] = {
    dt.value: (STRUCT_CODES[dt], ITEM_SIZE[dt])
    for dt in Datatype
    if dt in INTEGER_TYPES or dt in (Datatype.FP32, Datatype.FP64, Datatype.BOOL)
}
#: struct packers per (code, element count), as many as :data:`_PACKERS_MAX`
_PACKERS: dict[tuple[str, int], Callable[..., bytes]] = {}
_PACKERS_MAX = 1024


def _packs(code: str, data: list[Any]) -> bool:
    """Whether struct packs ``data`` with ``code``: for an integer code, every element an
    integer in the type's range (a float, string, null or array is refused); for a float code,
    every element a number within it (a JSON boolean passes both: the caller rules those out)."""
    n = len(data)
    pack = _PACKERS.get((code, n))
    if pack is None:
        pack = struct.Struct(f"<{n}{code}").pack
        if len(_PACKERS) < _PACKERS_MAX:
            _PACKERS[(code, n)] = pack
    try:
        pack(*data)
    except (struct.error, OverflowError, TypeError):
        return False
    return True


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
    booleans: bool | None = None  # whether the literal true or false is anywhere in the body
    for item in inputs:
        if type(item) is not dict or item.keys() != _INPUT_KEYS:
            return False
        name = item["name"]
        kind = _CODES.get(item["datatype"])
        shape = item["shape"]
        data = item["data"]
        if type(name) is not str or name in names or kind is None or type(shape) is not list:
            return False
        names.add(name)
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                return False
            count *= d
        if type(data) is not list or len(data) != count or not 0 < count <= SMALL_ARRAY:
            return False
        code, itemsize = kind
        if code == "?":
            if set(map(type, data)) != _BOOL:
                return False
        else:
            if booleans is None:
                booleans = b"true" in body or b"false" in body
            # a JSON boolean is an int to struct: looked for only when the body has one
            if booleans and not set(map(type, data)) <= _NUMBER:
                return False
            if not _packs(code, data):
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
