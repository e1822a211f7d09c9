"""v2 JSON <-> the internal model (reference §1.3, §1.5, §1.7).

- ``parse_header`` parses a request or response header with simdjson, leaving each tensor's
  ``data`` array unconverted so that ``data_to_buffer`` can decode numbers straight into numpy
  (no Python float objects); anything it cannot take falls back to ``loads`` (orjson, then the
  standard library for NaN/Infinity literals, which Triton accepts), which owns the messages.
- ``data_to_buffer`` turns a JSON ``data`` array (flat, nested or ragged: only the leaf count
  matters) into the binary wire layout, with strict per-datatype checks. FP16 and BF16 are
  accepted as JSON numbers and rounded to nearest (Triton refuses them; see README).
- ``tensor_data_json`` turns a tensor back into a flat JSON-ready value (numpy arrays are
  serialized by orjson directly; FP32 is widened to double like Triton's writer).
- ``request_from_obj`` / ``response_from_obj`` build the model from a parsed JSON header; inputs
  or outputs that carry ``binary_data_size`` take their bytes from a :class:`BinaryReader`.
- ``request_to_obj`` / ``response_to_obj`` build JSON headers; tensors marked binary are left
  for the binary codec to append.
- ``request_from_obj(..., checked=...)`` takes inputs whose numbers were checked already by
  :mod:`v2proxy.codecs.json_stream` (which relays large bodies while they arrive).

Pure: no I/O. Errors are CodecError naming the field at fault.
"""

from __future__ import annotations

import json as _stdjson
import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import simdjson

from v2proxy.codecs.dtypes import (
    ITEM_SIZE,
    NUMPY_DTYPE,
    byte_view,
    deserialize_bytes,
    parse_datatype,
    parse_shape,
    serialize_bytes,
)
from v2proxy.errors import CodecError, PayloadTooLarge
from v2proxy.model import (
    Datatype,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    element_count,
)

MAX_NESTING = 100
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024

_INT_TYPES = {
    Datatype.UINT8,
    Datatype.UINT16,
    Datatype.UINT32,
    Datatype.UINT64,
    Datatype.INT8,
    Datatype.INT16,
    Datatype.INT32,
    Datatype.INT64,
}
_FLOAT_TYPES = {Datatype.FP16, Datatype.FP32, Datatype.FP64, Datatype.BF16}
_DUMPS_OPTS = orjson.OPT_SERIALIZE_NUMPY


class BinaryReader:
    """Hands out consecutive slices of a binary section (views, no copies)."""

    __slots__ = ("_mv", "_pos")

    def __init__(self, section: memoryview) -> None:
        self._mv = section
        self._pos = 0

    def take(self, size: int, name: str, model: str) -> memoryview:
        remaining = len(self._mv) - self._pos
        if size > remaining:
            raise CodecError(
                f"unexpected size for input '{name}', expecting {size - remaining} additional"
                f" bytes for model '{model}'"
            )
        view = self._mv[self._pos : self._pos + size]
        self._pos += size
        return view

    def finish(self, model: str) -> None:
        if self._pos != len(self._mv):
            raise CodecError(f"unexpected additional input data for model '{model}'")


class SizeOnlyReader(BinaryReader):
    """Checks ``binary_data_size`` values against a binary section of known length that is
    not in memory (its tensors get no data): for requests relayed while their body streams."""

    __slots__ = ("_length",)

    def __init__(self, length: int) -> None:
        super().__init__(memoryview(b""))
        self._length = length

    def take(self, size: int, name: str, model: str) -> memoryview:
        remaining = self._length - self._pos
        if size > remaining:
            raise CodecError(
                f"unexpected size for input '{name}', expecting {size - remaining} additional"
                f" bytes for model '{model}'"
            )
        self._pos += size
        return self._mv

    def finish(self, model: str) -> None:
        if self._pos != self._length:
            raise CodecError(f"unexpected additional input data for model '{model}'")


def loads(buf: bytes | bytearray | memoryview, what: str = "request") -> Any:
    """Parse a JSON document; CodecError with the parser's message if it is not JSON."""
    try:
        return orjson.loads(buf)
    except orjson.JSONDecodeError as exc:
        first = str(exc)
    # orjson refuses NaN/Infinity literals, which Triton accepts; the stdlib parser takes them.
    try:
        text = bytes(buf).decode("utf-8")
        return _stdjson.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CodecError(f"failed to parse the {what} JSON buffer: {first}") from None


#: Parsers kept for reuse. Decoding is synchronous, so one is in use at a time per thread; a
#: parser keeps its scratch buffers between documents (fresh ones cost page faults on every big
#: request), but only for documents up to REUSE_LIMIT so that one huge request does not pin
#: its buffers for the life of the process.
_PARSERS: list[simdjson.Parser] = []
REUSE_LIMIT = 32 * 1024 * 1024
#: documents up to this size are parsed by orjson into Python objects
SMALL_DOCUMENT = 16 * 1024
#: arrays up to this many elements are checked and packed in plain Python (numpy's per-call
#: overhead dominates below that)
SMALL_ARRAY = 256


def parse_header(buf: bytes | bytearray | memoryview, what: str = "request") -> Any:
    """Parse a v2 request/response header; tensors' ``data`` stay lazy simdjson arrays. The
    result must be consumed (``request_from_obj``/``response_from_obj``) and dropped before the
    next call (the binary codec does)."""
    if len(buf) <= SMALL_DOCUMENT:
        return loads(buf, what)  # small: orjson's Python objects are cheaper than lazy arrays
    # simdjson takes any buffer (a view into the body, too) and keeps no reference to it
    parser = _PARSERS.pop() if _PARSERS else simdjson.Parser()
    try:
        doc = parser.parse(buf)
    except RuntimeError:  # still referenced by an earlier document: use a new one
        parser = simdjson.Parser()
        try:
            doc = parser.parse(buf)
        except (ValueError, RuntimeError, TypeError):
            return loads(buf, what)
    except (ValueError, TypeError):
        _PARSERS.append(parser)
        return loads(buf, what)  # not plain JSON (NaN literals) or not JSON: precise messages
    if len(buf) <= REUSE_LIMIT:
        _PARSERS.append(parser)
    if not isinstance(doc, simdjson.Object):
        return _plain(doc)
    # Objects are walked by key: simdjson's items() would convert every value eagerly.
    out: dict[str, Any] = {}
    for key in doc.keys():  # noqa: SIM118 - a simdjson Object, not a dict
        value = doc[key]
        if key in ("inputs", "outputs") and isinstance(value, simdjson.Array):
            out[key] = [_lazy_tensor(value[i]) for i in range(len(value))]
        else:
            out[key] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _lazy_tensor(item: Any) -> Any:
    if not isinstance(item, simdjson.Object):
        return _plain(item)
    out: dict[str, Any] = {}
    for key in item.keys():  # noqa: SIM118 - a simdjson Object, not a dict
        value = item[key]
        out[key] = value if key == "data" and isinstance(value, simdjson.Array) else _plain(value)
    return out


#: simdjson buffer type and the numpy dtype it yields, per datatype family
BUFFER_TYPES: dict[Datatype, tuple[str, str]] = {
    **{dt: ("d", "<f8") for dt in (Datatype.FP16, Datatype.FP32, Datatype.FP64, Datatype.BF16)},
    **{dt: ("i", "<i8") for dt in (Datatype.INT8, Datatype.INT16, Datatype.INT32, Datatype.INT64)},
    **{
        dt: ("u", "<u8")
        for dt in (Datatype.UINT8, Datatype.UINT16, Datatype.UINT32, Datatype.UINT64)
    },
}


def _fast_numbers(
    data: Any, datatype: Datatype, count: int, where: str
) -> bytes | memoryview | None:
    """Numbers of a lazy simdjson array straight into the wire layout; None when the array
    holds anything else (the slow path then names the problem)."""
    kind = BUFFER_TYPES.get(datatype)
    if kind is None:
        return None
    node, depth = data, 1
    while isinstance(node, simdjson.Array) and len(node):
        node, depth = node[0], depth + 1
        if depth > MAX_NESTING:
            return None
    try:
        buf = data.as_buffer(of_type=kind[0])
    except (TypeError, ValueError):
        return None
    arr = np.frombuffer(buf, dtype=kind[1])
    if arr.size != count:
        raise _count_error(where, count, int(arr.size))
    npdt = NUMPY_DTYPE[datatype]
    if kind[0] != "d":
        info = np.iinfo(npdt)  # type: ignore[type-var]
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise _range_error(where, datatype)
    with np.errstate(over="ignore"):  # out-of-range floats become infinities, as in Triton
        return byte_view(arr.astype(npdt))


def dumps(obj: Any) -> bytes:
    """Compact JSON; numpy arrays are serialized natively."""
    try:
        return orjson.dumps(obj, option=_DUMPS_OPTS)
    except orjson.JSONEncodeError as exc:  # pragma: no cover - guarded by callers
        raise CodecError(f"unable to encode JSON: {exc}") from None


# --------------------------------------------------------------------------- data arrays


def _flatten(data: list[Any], where: str) -> list[Any]:
    out: list[Any] = []

    def walk(node: list[Any], depth: int) -> None:
        if depth >= MAX_NESTING:
            raise CodecError(
                f"Unable to parse 'data' for {where}: JSON nesting depth exceeds maximum allowed"
                f" limit ({MAX_NESTING})"
            )
        for x in node:
            if type(x) is list:
                walk(x, depth + 1)
            else:
                out.append(x)

    walk(data, 1)
    return out


def _leaves(data: Any, where: str) -> list[Any]:
    if type(data) is not list:
        raise CodecError(f"Unable to parse 'data' for {where}: expected a JSON array")
    if data and (type(data[0]) is list or type(data[-1]) is list):
        return _flatten(data, where)
    return data


#: struct codes of the datatypes the small-array path packs, and integer ranges
_STRUCT_CODES = {
    Datatype.BOOL: "?",
    Datatype.UINT8: "B",
    Datatype.UINT16: "H",
    Datatype.UINT32: "I",
    Datatype.UINT64: "Q",
    Datatype.INT8: "b",
    Datatype.INT16: "h",
    Datatype.INT32: "i",
    Datatype.INT64: "q",
    Datatype.FP16: "e",
    Datatype.FP32: "f",
    Datatype.FP64: "d",
}
#: the values each integer datatype holds (JSON numbers outside them are refused)
INT_RANGES = {
    dt: (int(np.iinfo(NUMPY_DTYPE[dt]).min), int(np.iinfo(NUMPY_DTYPE[dt]).max))  # type: ignore[type-var]
    for dt in _INT_TYPES
}
_NUMBER_TYPES = frozenset({int, float})


def _small_numbers(leaves: list[Any], datatype: Datatype) -> bytes | None:
    """A short flat list packed with struct when every element is of the right kind and in
    range; None otherwise (the numpy path then decides, and names any problem)."""
    code = _STRUCT_CODES.get(datatype)
    if code is None or not leaves:
        return None
    kinds = set(map(type, leaves))
    if datatype is Datatype.BOOL:
        if kinds != {bool}:
            return None
    elif datatype in _INT_TYPES:
        lo, hi = INT_RANGES[datatype]
        if kinds != {int} or min(leaves) < lo or max(leaves) > hi:
            return None
    elif not kinds <= _NUMBER_TYPES:
        return None
    try:
        return struct.pack(f"<{len(leaves)}{code}", *leaves)
    except (struct.error, OverflowError):
        return None  # e.g. a float beyond FP32: numpy turns it into infinity


def _type_error(where: str, datatype: Datatype, expected: str) -> CodecError:
    return CodecError(
        f"Unable to parse 'data' for {where}: {datatype.value} elements must be {expected}"
    )


def _as_array(leaves: list[Any], where: str) -> tuple[np.ndarray, list[Any]]:
    """numpy's view of the leaves; ragged nesting deeper inside the array is flattened."""
    try:
        arr = np.array(leaves)
        if arr.ndim == 1 and arr.dtype != np.dtype(object):
            return arr, leaves
    except (ValueError, TypeError, OverflowError):
        pass
    flat = _flatten(leaves, where)
    try:
        arr = np.array(flat)
    except (ValueError, TypeError, OverflowError):
        arr = np.array(flat, dtype=object)
    return arr, flat


def _check_kind(arr: np.ndarray, leaves: list[Any], datatype: Datatype, where: str) -> np.ndarray:
    kind = arr.dtype.kind
    if datatype is Datatype.BOOL:
        if kind != "b":
            raise _type_error(where, datatype, "true or false")
        return arr
    if datatype in _INT_TYPES:
        if kind in "fO" and all(type(x) is int for x in leaves):
            # Very large integers (beyond int64) make numpy fall back to float or object.
            try:
                arr = np.array(leaves, dtype=np.uint64)
            except OverflowError:
                raise _range_error(where, datatype) from None
        elif kind not in "iu" or _has_bool(arr, leaves):
            raise _type_error(where, datatype, "integers")
        info = np.iinfo(NUMPY_DTYPE[datatype])  # type: ignore[type-var]
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise _range_error(where, datatype)
        return arr
    if kind not in "iuf" or _has_bool(arr, leaves):
        raise _type_error(where, datatype, "numbers")
    return arr


def _has_bool(arr: np.ndarray, leaves: list[Any]) -> bool:
    """Whether JSON true/false hide among numbers (numpy turns them into 0/1 silently)."""
    return bool(((arr == 0) | (arr == 1)).any()) and bool in set(map(type, leaves))


def _range_error(where: str, datatype: Datatype) -> CodecError:
    return CodecError(
        f"Unable to parse 'data' for {where}: value out of range for {datatype.value}"
    )


def _count_error(where: str, expected: int | None, got: int | None) -> CodecError:
    detail = "" if expected is None else f": expected {expected} elements, got {got}"
    return CodecError(
        f"Unable to parse 'data' for {where}: shape does not match true shape of 'data' field"
        f"{detail}"
    )


def data_to_buffer(
    data: Any,
    datatype: Datatype,
    shape: tuple[int, ...],
    where: str,
    max_size: int = DEFAULT_MAX_INPUT_SIZE,
) -> bytes | memoryview:
    """A JSON ``data`` value -> the tensor's bytes in wire layout. ``where`` names the tensor
    in messages (e.g. "input 'INPUT0'")."""
    count = element_count(shape)
    if count == 0:
        # Triton does not parse 'data' of a zero-element tensor.
        return b""
    if isinstance(data, simdjson.Array):
        itemsize = ITEM_SIZE.get(datatype)
        if itemsize is not None and count * itemsize > max_size:
            raise _too_large(where, count * itemsize, max_size)
        fast = _fast_numbers(data, datatype, count, where)
        if fast is not None:
            return fast
        data = data.as_list()
    leaves = _leaves(data, where)
    if datatype is Datatype.BYTES:
        if any(type(x) is list for x in leaves):
            leaves = _flatten(leaves, where)
        if len(leaves) != count:
            raise _count_error(where, count, len(leaves))
        elems: list[bytes] = []
        for x in leaves:
            if type(x) is not str:
                raise _type_error(where, datatype, "strings")
            elems.append(x.encode("utf-8", "surrogatepass"))
        buf = serialize_bytes(elems)
        if len(buf) > max_size:
            raise _too_large(where, len(buf), max_size)
        return buf
    npdt = NUMPY_DTYPE[datatype]
    if count * npdt.itemsize > max_size:
        raise _too_large(where, count * npdt.itemsize, max_size)
    if count <= SMALL_ARRAY and len(leaves) == count:
        packed = _small_numbers(leaves, datatype)
        if packed is not None:
            return packed
    arr, leaves = _as_array(leaves, where)
    if len(leaves) != count:
        raise _count_error(where, count, len(leaves))
    arr = _check_kind(arr, leaves, datatype, where)
    with np.errstate(over="ignore"):  # out-of-range floats become infinities, as in Triton
        return byte_view(np.ascontiguousarray(arr, dtype=npdt))


def _too_large(where: str, size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"JSON {where} has a byte_size ({size} bytes) that exceeds the maximum allowed value of"
        f" {limit} bytes"
    )


def tensor_data_json(tensor: Tensor) -> Any:
    """The flat JSON ``data`` value of a tensor (a numpy array or a list for orjson)."""
    where = f"tensor '{tensor.name}'"
    if tensor.datatype is Datatype.BYTES:
        out: list[str] = []
        for e in deserialize_bytes(tensor.data, where):
            try:
                out.append(e.decode("utf-8"))
            except UnicodeDecodeError:
                raise CodecError(
                    f"{where} holds BYTES that are not valid UTF-8, which JSON cannot carry;"
                    " use binary data ('binary_data': true)"
                ) from None
        return out
    npdt = NUMPY_DTYPE[tensor.datatype]
    nbytes, expected = memoryview(tensor.data).nbytes, element_count(tensor.shape) * npdt.itemsize
    if nbytes != expected:
        raise CodecError(f"input byte size mismatch for {where}. Expected {expected}, got {nbytes}")
    arr = np.frombuffer(tensor.data, dtype=npdt)
    if tensor.datatype in _FLOAT_TYPES:
        # Triton widens to double; BF16/FP16 become numbers. A signalling NaN stays a NaN
        # (numpy would warn about it) and is written as the NaN literal below.
        with np.errstate(invalid="ignore"):
            arr = arr.astype(np.float64)
        if not np.isfinite(arr).all():
            return _RawJSON([_float_literal(float(v)) for v in arr])
    return arr


class _RawJSON(list[str]):
    """A list of float literals (NaN, Infinity) that orjson cannot write; see ``dumps_tree``."""


def _float_literal(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return orjson.dumps(v).decode()


# --------------------------------------------------------------------------- params


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters")
    if params is None:
        return {}
    if type(params) is not dict:
        raise CodecError(f"Unable to parse 'parameters' for {where}: expected a JSON object")
    return params


def _bool_param(params: dict[str, Any], key: str, where: str) -> bool:
    value = params.get(key, False)
    if type(value) is not bool:
        raise CodecError(f"Unable to parse '{key}' for {where}: expected a boolean")
    return value


def _uint_param(params: dict[str, Any], key: str, where: str) -> int:
    value = params[key]
    if type(value) is not int or value < 0:
        raise CodecError(f"Unable to parse '{key}' for {where}: expected a non-negative integer")
    return value


# --------------------------------------------------------------------------- request


def _tensor_header(obj: Any, kind: str, index: int) -> tuple[str, Datatype, tuple[int, ...]]:
    if type(obj) is not dict:
        raise CodecError(f"Unable to parse '{kind}s[{index}]': expected a JSON object")
    name = obj.get("name")
    if type(name) is not str:
        raise CodecError(f"Unable to parse 'name' of {kind}s[{index}]: expected a string")
    where = f"{kind} '{name}'"
    datatype = parse_datatype(obj.get("datatype"), where)
    if "shape" not in obj:
        raise CodecError(f"Unable to parse 'shape' for {where}: field is missing")
    shape = parse_shape(obj["shape"], where)
    return name, datatype, shape


_SOURCE_KEYS = ("data", "binary_data_size", "shared_memory_region")


def request_from_obj(
    obj: Any,
    model_name: str,
    model_version: str,
    binary: BinaryReader | None,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    checked: dict[int, tuple[Datatype, int]] | None = None,
) -> InferRequest:
    """Build an InferRequest from a parsed v2 JSON request header. ``checked`` names inputs
    (by index) whose ``data`` was checked already (by :class:`StreamCheck`: its datatype and
    element count); those tensors carry no bytes."""
    if type(obj) is not dict:
        raise CodecError("Unable to parse the request: expected a JSON object")
    req_id = obj.get("id")
    if req_id is not None and type(req_id) is not str:
        raise CodecError("Unable to parse 'id': expected a string")
    params = _parameters(obj, "the request")
    _bool_param(params, "binary_data_output", "the request")
    for key in params:
        if key.startswith("triton_"):
            raise CodecError(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should"
                " not be specified."
            )
    raw_inputs = obj.get("inputs")
    if type(raw_inputs) is not list:
        raise CodecError("Unable to parse 'inputs': expected a JSON array of input tensors")
    inputs: list[Tensor] = []
    seen: set[str] = set()
    for i, item in enumerate(raw_inputs):
        name, datatype, shape = _tensor_header(item, "input", i)
        where = f"input '{name}'"
        if name in seen:
            raise CodecError(f"input '{name}' already exists in request")
        seen.add(name)
        tparams = dict(_parameters(item, where))
        present = [k for k in _SOURCE_KEYS if (item if k == "data" else tparams).get(k) is not None]
        if len(present) != 1:
            detail = (
                " no field is set" if not present else " set " + " ".join(f"'{k}'" for k in present)
            )
            raise CodecError(
                f"Input must set only one of the following fields: 'data', 'binary_data_size' in"
                f" 'parameters', 'shared_memory_region' in 'parameters'. But{detail} for {where}"
            )
        source = present[0]
        data: bytes | memoryview
        if source == "data" and checked is not None and i in checked:
            data = _checked_data(checked[i], datatype, shape, where, max_input_size)
        elif source == "data":
            data = data_to_buffer(item["data"], datatype, shape, where, max_input_size)
        elif source == "binary_data_size":
            size = _uint_param(tparams, "binary_data_size", where)
            del tparams["binary_data_size"]
            if binary is not None:
                data = binary.take(size, name, model_name)
            elif size == 0:
                data = b""  # nothing to read: Triton accepts this without IHCL
            else:
                raise CodecError(
                    f"{where} sets 'binary_data_size' but the request has no binary section"
                    " (missing Inference-Header-Content-Length header)"
                )
        else:
            data = b""  # shared memory: resolved by the pipeline
        inputs.append(Tensor(name, datatype, shape, data, tparams))
    outputs = _requested_outputs(obj.get("outputs"))
    if binary is not None:
        binary.finish(model_name)
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=req_id,
        parameters=params,
        inputs=inputs,
        outputs=outputs,
    )


def _checked_data(
    verdict: tuple[Datatype, int],
    datatype: Datatype,
    shape: tuple[int, ...],
    where: str,
    limit: int,
) -> bytes:
    """The (empty) data of a tensor whose JSON numbers were checked in pieces: they must have
    been checked for this datatype, and their count must fit the shape and the size limit."""
    count = element_count(shape)
    if count == 0:
        return b""  # Triton does not parse 'data' of a zero-element tensor
    checked_as, got = verdict
    if checked_as is not datatype or got != count or count * ITEM_SIZE[datatype] > limit:
        raise CodecError(f"Unable to parse 'data' for {where}: not as checked")  # full decode
    return b""


def _requested_outputs(raw: Any) -> list[RequestedOutput] | None:
    if raw is None:
        return None
    if type(raw) is not list:
        raise CodecError("Unable to parse 'outputs': expected a JSON array")
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        if type(item) is not dict or type(item.get("name")) is not str:
            raise CodecError(f"Unable to parse 'outputs[{i}]': expected an object with a 'name'")
        name = item["name"]
        if name in seen:
            raise CodecError(f"output '{name}' already exists in request")
        seen.add(name)
        params = _parameters(item, f"output '{name}'")
        _bool_param(params, "binary_data", f"output '{name}'")
        outputs.append(RequestedOutput(name, dict(params)))
    return outputs


def request_to_obj(req: InferRequest, binary_inputs: bool, binary_outputs: bool) -> dict[str, Any]:
    """The JSON header for sending ``req`` to a backend. With ``binary_inputs`` every input is
    described with ``binary_data_size`` (the caller appends the bytes in order)."""
    obj: dict[str, Any] = {}
    if req.id:
        obj["id"] = req.id
    params = dict(req.parameters)
    params.pop("binary_data_output", None)
    if req.outputs is None and binary_outputs:
        params["binary_data_output"] = True
    if params:
        obj["parameters"] = params
    inputs = []
    for t in req.inputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype.value, "shape": t.shape}
        tparams = dict(t.parameters)
        if binary_inputs:
            tparams["binary_data_size"] = memoryview(t.data).nbytes
        else:
            entry["data"] = tensor_data_json(t)
        if tparams:
            entry["parameters"] = tparams
        inputs.append(entry)
    obj["inputs"] = inputs
    if req.outputs is not None:
        obj["outputs"] = [
            {"name": o.name, "parameters": {**o.parameters, "binary_data": binary_outputs}}
            for o in req.outputs
        ]
    return obj


# --------------------------------------------------------------------------- response


def response_from_obj(obj: Any, binary: BinaryReader | None) -> InferResponse:
    """Build an InferResponse from a backend's parsed v2 JSON response header."""
    if type(obj) is not dict:
        raise CodecError("invalid response from backend: expected a JSON object")
    raw_outputs = obj.get("outputs", [])
    if type(raw_outputs) is not list:
        raise CodecError("invalid response from backend: 'outputs' is not an array")
    outputs: list[Tensor] = []
    model = str(obj.get("model_name", ""))
    for i, item in enumerate(raw_outputs):
        name, datatype, shape = _tensor_header(item, "output", i)
        where = f"output '{name}'"
        tparams = dict(_parameters(item, where))
        data: bytes | memoryview
        if tparams.get("binary_data_size") is not None:
            size = _uint_param(tparams, "binary_data_size", where)
            del tparams["binary_data_size"]
            if binary is not None:
                data = binary.take(size, name, model)
            elif size == 0:
                data = b""  # zero-byte binary outputs come without IHCL (reference §1.2)
            else:
                raise CodecError(
                    f"invalid response from backend: {where} is binary but the"
                    " response has no binary section"
                )
        elif "data" in item:
            data = data_to_buffer(item["data"], datatype, shape, where, max_size=2**62)
        else:
            data = b""  # written to shared memory by the backend
        outputs.append(Tensor(name, datatype, shape, data, tparams))
    if binary is not None:
        binary.finish(model)
    version = obj.get("model_version")
    req_id = obj.get("id")
    return InferResponse(
        model_name=model,
        model_version="" if version is None else str(version),
        id=req_id if isinstance(req_id, str) and req_id else None,
        parameters=_parameters(obj, "the response"),
        outputs=outputs,
    )


def response_to_obj(resp: InferResponse, is_binary: Callable[[Tensor], bool]) -> dict[str, Any]:
    """The JSON header of a response, in Triton's key order. Outputs for which ``is_binary`` is
    true get ``binary_data_size`` (the caller appends their bytes in the same order)."""
    obj: dict[str, Any] = {}
    if resp.id:
        obj["id"] = resp.id
    obj["model_name"] = resp.model_name
    obj["model_version"] = resp.model_version
    if resp.parameters:
        obj["parameters"] = resp.parameters
    outputs = []
    for t in resp.outputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype.value, "shape": t.shape}
        if is_binary(t):
            entry["parameters"] = {**t.parameters, "binary_data_size": memoryview(t.data).nbytes}
        else:
            if t.parameters:
                entry["parameters"] = t.parameters
            entry["data"] = tensor_data_json(t)
        outputs.append(entry)
    obj["outputs"] = outputs
    return obj


def dumps_tree(obj: dict[str, Any]) -> bytes:
    """Serialize a request/response header, writing NaN/Infinity literals like Triton."""
    for key in ("inputs", "outputs"):
        for o in obj.get(key, ()):
            data = o.get("data")
            if isinstance(data, _RawJSON):
                # orjson cannot write these literals: splice the finished text in verbatim.
                o["data"] = orjson.Fragment(("[" + ",".join(data) + "]").encode())
    return dumps(obj)
