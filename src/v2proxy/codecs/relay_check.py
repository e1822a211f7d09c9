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

It runs on every small relayed request, so the walk takes as few Python steps as it can: a
field of the wrong kind is refused by the operation that uses it failing (a missing key, a
value that cannot be subscripted, hashed or packed raises, and any such error says False);
an input holds exactly its four keys when it has four entries and each is found; the element
kinds and ranges are one struct pack; JSON booleans, which struct takes for numbers, are
looked for only in a body holding ``r`` or ``l`` (a byte of ``true``, one of ``false``, that no
key of the accepted shape holds); and the decoded bytes are counted only when the body is over
a quarter of ``max_input_size``.

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

_TOP_KEYS = frozenset({"id", "inputs", "outputs"})
_BOOL = frozenset({bool})
_NUMBER = frozenset({int, float})
#: a byte of "true" ("r") and one of "false" ("l") that no key of the accepted shape holds:
#: a body with neither holds no JSON boolean (looked for as integers: memchr)
_R, _L = ord("r"), ord("l")


class _Kind:
    """One datatype the check takes: its struct code, item size, and packers per element
    count."""

    __slots__ = ("code", "itemsize", "packers")

    def __init__(self, code: str, itemsize: int) -> None:
        self.code = code
        self.itemsize = itemsize
        #: the struct packer of each element count up to SMALL_ARRAY, made on first use
        self.packers: list[Callable[..., bytes] | None] = [None] * (SMALL_ARRAY + 1)

    def packer(self, count: int) -> Callable[..., bytes]:
        """The struct packer of ``count`` elements (made on first use)."""
        pack = self.packers[count] = struct.Struct(f"<{count}{self.code}").pack
        return pack


#: datatype name -> its kind: the integer types, FP32, FP64 and BOOL (FP16/BF16, which binary
#: backends refuse in JSON, and BYTES take the full path)
_KINDS: dict[str, _Kind] = {
    dt.value: _Kind(STRUCT_CODES[dt], ITEM_SIZE[dt])
    for dt in Datatype
    if dt in INTEGER_TYPES or dt in (Datatype.FP32, Datatype.FP64, Datatype.BOOL)
}
_BOOLEAN = _KINDS[Datatype.BOOL.value]
#: how many times its JSON text a flat number array's decoded bytes can be, at most
_MAX_GROWTH = max(ITEM_SIZE.values()) // 2


def plain_json_request(body: bytes | bytearray, max_input_size: int, max_tensors: int) -> bool:
    """True when ``body`` is a JSON request the full decoder accepts and no stage applies to
    (see the module's docstring); False when unsure."""
    size = len(body)
    if size > SMALL_DOCUMENT or size > max_input_size:
        return False
    try:
        obj = orjson.loads(body)
        inputs = obj["inputs"]  # obj is a dict from here: nothing else orjson makes takes a str
        if type(inputs) is not list or not 0 < len(inputs) <= max_tensors:
            return False
        if len(obj) > 1 and not _id_and_outputs(obj, max_tensors):
            return False
        booleans = _R in body or _L in body  # whether a JSON boolean may be in the body
        names = set()
        for item in inputs:
            if len(item) != 4:  # with the four keys below found: exactly those
                return False
            name = item["name"]
            kind = _KINDS[item["datatype"]]
            shape = item["shape"]
            data = item["data"]
            # data that is no list fails below: its len, the pack of its items, or their kinds
            if type(name) is not str or type(shape) is not list:
                return False
            names.add(name)
            count = 1
            for d in shape:
                if type(d) is not int or d < 0:
                    return False
                count *= d
            if len(data) != count or not 0 < count <= SMALL_ARRAY:
                return False
            if kind is _BOOLEAN:  # its elements: JSON booleans, nothing else
                if not booleans or set(map(type, data)) != _BOOL:
                    return False
            else:
                # struct takes a JSON boolean for a number
                if booleans and not set(map(type, data)) <= _NUMBER:
                    return False
                # the elements as the datatype: it raises for one of another kind or range
                (kind.packers[count] or kind.packer(count))(*data)
    except (orjson.JSONDecodeError, KeyError, TypeError, struct.error, OverflowError):
        return False  # not JSON, or a field missing or of a kind its use refuses
    if len(names) != len(inputs):
        return False
    # each element takes two bytes of the body at least and decodes to eight at most
    return size * _MAX_GROWTH <= max_input_size or _decoded_size(inputs) <= max_input_size


def _decoded_size(inputs: list[dict[str, Any]]) -> int:
    """The bytes the (checked) ``inputs`` decode to."""
    return sum(len(item["data"]) * _KINDS[item["datatype"]].itemsize for item in inputs)


def _id_and_outputs(obj: dict[str, Any], max_tensors: int) -> bool:
    """Whether the request's other keys are a string ``id`` and plain requested ``outputs``
    (unique names, nothing else)."""
    if not obj.keys() <= _TOP_KEYS:
        return False
    rid = obj.get("id")
    if rid is not None and type(rid) is not str:
        return False
    outputs = obj.get("outputs")
    if outputs is None:
        return True
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


_OUTPUT_KEYS = frozenset({"name"})
