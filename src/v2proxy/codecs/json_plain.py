"""A small JSON ``/infer`` request of the common shape, decoded in one lean pass.

For when such a request must be decoded (the backend takes binary tensors, or a stage
applies): :func:`plain_request` builds
exactly the :class:`~v2proxy.core.model.InferRequest` that the full decoder
(:func:`v2proxy.codecs.json_v2.request_from_obj`) builds from the same body, or says None when
the body is anything else, and the full decoder then takes it (and names any fault: this pass
never raises, so every message stays the full decoder's).

What it takes is this shape, within the limits the full decoder applies (at most
``max_tensors`` inputs and requested outputs, the body and the decoded bytes within
``max_input_size``)::

    {"id": "...", "parameters": {...},
     "inputs": [{"name", "datatype", "shape", "data": [flat numbers]}, ...],
     "outputs": [{"name", "parameters": {...}}, ...]}

``id``, ``parameters`` and ``outputs`` optional; every input exactly those four keys (no
``parameters``: no binary data, no shared memory), its ``data`` a flat array of exactly the
shape's element count (at most :data:`~v2proxy.codecs.json_data.SMALL_ARRAY`), each element of
the datatype's kind and range (BOOL, the integer types, FP16, FP32, FP64: the datatypes the
full decoder packs with struct for such arrays, to the same bytes); unique input and output
names; the request's ``parameters`` without ``triton_`` keys and with a boolean
``binary_data_output`` if any, each output's with a boolean ``binary_data`` if any.

The walk takes as few Python steps as it can: a field of the wrong kind is refused by the
operation that uses it failing (a missing key, a value that cannot be subscripted, hashed or
packed raises, and any such error says None); the element kinds and ranges are one struct pack;
JSON booleans, which struct takes for numbers, are looked for only in a body holding ``r`` or
``l`` (a byte of ``true``, one of ``false``). ``tests/unit/test_json_plain.py`` checks it
against the full decoder on generated bodies.

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
from v2proxy.core.model import Datatype, InferRequest, RequestedOutput, Tensor

_BOOL = frozenset({bool})
_INT = frozenset({int})
_NUMBER = frozenset({int, float})
#: a byte of "true" ("r") and one of "false" ("l"): a body with neither holds no JSON boolean
_R, _L = ord("r"), ord("l")
_INPUT_KEYS = frozenset({"name", "datatype", "shape", "data"})
_TOP_KEYS = frozenset({"id", "parameters", "inputs", "outputs"})
_OUTPUT_KEYS = frozenset({"name", "parameters"})


class _Kind:
    """One datatype the pass takes: the Datatype, its item size, the element kinds it takes
    (its struct code takes JSON booleans for numbers) and its struct packers per count."""

    __slots__ = ("code", "datatype", "itemsize", "kinds", "packers")

    def __init__(self, datatype: Datatype) -> None:
        self.datatype = datatype
        self.code = STRUCT_CODES[datatype]
        self.itemsize = ITEM_SIZE[datatype]
        self.kinds = (
            _BOOL if datatype is Datatype.BOOL else _INT if datatype in INTEGER_TYPES else _NUMBER
        )
        #: the struct packer of each element count up to SMALL_ARRAY, made on first use
        self.packers: list[Callable[..., bytes] | None] = [None] * (SMALL_ARRAY + 1)

    def packer(self, count: int) -> Callable[..., bytes]:
        pack = self.packers[count] = struct.Struct(f"<{count}{self.code}").pack
        return pack


#: datatype name -> its kind (BF16 and BYTES take the full decoder)
_KINDS: dict[str, _Kind] = {dt.value: _Kind(dt) for dt in STRUCT_CODES}
_BOOLEAN = _KINDS[Datatype.BOOL.value]


def plain_request(
    body: bytes | bytearray,
    model_name: str,
    model_version: str,
    max_input_size: int,
    max_tensors: int,
) -> InferRequest | None:
    """The request of a JSON ``body`` of the plain shape (module docstring), as the full
    decoder builds it; None for any other body (the full decoder's to decode or refuse)."""
    size = len(body)
    if size > SMALL_DOCUMENT or size > max_input_size:
        return None
    try:
        obj = orjson.loads(body)
        raw_inputs = obj["inputs"]  # obj is a dict from here: nothing else orjson makes takes a str
        if type(raw_inputs) is not list or not 0 < len(raw_inputs) <= max_tensors:
            return None
        req_id = params = outputs = None
        if len(obj) > 1:
            if not obj.keys() <= _TOP_KEYS:
                return None
            req_id = obj.get("id")
            if req_id is not None and type(req_id) is not str:
                return None
            params = obj.get("parameters")
            if params is not None and not _request_parameters(params):
                return None
            raw_outputs = obj.get("outputs")
            if raw_outputs is not None:
                outputs = _outputs(raw_outputs, max_tensors)
                if outputs is None:
                    return None
        booleans = _R in body or _L in body  # whether a JSON boolean may be in the body
        inputs = []
        names = set()
        total = 0
        for item in raw_inputs:
            # with its four keys found below (item[...] raises otherwise): exactly those
            if len(item) != 4:
                return None
            name = item["name"]
            kind = _KINDS[item["datatype"]]
            shape = item["shape"]
            data = item["data"]
            if type(name) is not str or type(shape) is not list:
                return None
            names.add(name)
            count = 1
            for d in shape:
                if type(d) is not int or d < 0:
                    return None
                count *= d
            # data that is no list fails below: its len, the pack of its items, or their kinds
            if len(data) != count or not 0 < count <= SMALL_ARRAY:
                return None
            if kind is _BOOLEAN:  # struct takes anything for a BOOL: its kinds, always
                if not booleans or set(map(type, data)) != _BOOL:
                    return None
            elif booleans and not set(map(type, data)) <= kind.kinds:
                return None  # a JSON boolean, which struct takes for a number
            # the elements as the datatype: it raises for one of another kind or range
            packed = (kind.packers[count] or kind.packer(count))(*data)
            total += len(packed)
            inputs.append(Tensor(name, kind.datatype, tuple(shape), packed, {}))
    except (orjson.JSONDecodeError, KeyError, TypeError, struct.error, OverflowError):
        return None  # not JSON, or a field missing or of a kind its use refuses
    if len(names) != len(inputs) or total > max_input_size:
        return None
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=req_id,
        parameters={} if params is None else params,
        inputs=inputs,
        outputs=outputs,
    )


def _request_parameters(params: Any) -> bool:
    """Whether the request's ``parameters`` are an object the full decoder takes as they are."""
    if type(params) is not dict:
        return False
    flag = params.get("binary_data_output", False)
    if type(flag) is not bool:
        return False
    return not any(key.startswith("triton_") for key in params)


def _outputs(raw: Any, max_tensors: int) -> list[RequestedOutput] | None:
    """The requested outputs as the full decoder builds them; None unless each is an object
    of a unique ``name`` and plain ``parameters``."""
    if type(raw) is not list or len(raw) > max_tensors:
        return None
    outputs = []
    seen: set[str] = set()
    for item in raw:
        if type(item) is not dict or not item.keys() <= _OUTPUT_KEYS:
            return None
        name = item.get("name")
        if type(name) is not str or name in seen:
            return None
        seen.add(name)
        params = item.get("parameters")
        if params is None:
            params = {}
        elif type(params) is not dict or type(params.get("binary_data", False)) is not bool:
            return None
        outputs.append(RequestedOutput(name, dict(params)))
    return outputs
