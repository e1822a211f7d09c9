"""A tensor's JSON ``data`` value <-> its bytes in wire layout (docs/protocol.md, tensor
layout)."""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Callable
from math import prod
from typing import Any, Final

import numpy as np
import orjson
import simdjson

from v2proxy.codecs.dtypes import (
    INTEGER_TYPES,
    ITEM_SIZE,
    NUMPY_DTYPE,
    byte_view,
    deserialize_bytes,
    serialize_bytes,
)
from v2proxy.core.errors import CodecError, PayloadTooLarge
from v2proxy.core.model import Datatype, Tensor, element_count

MAX_NESTING = 100
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
#: arrays up to this many elements are packed in plain Python (numpy's overhead dominates)
SMALL_ARRAY: Final = 256

_INT_TYPES = INTEGER_TYPES
_FLOAT_TYPES = {Datatype.FP16, Datatype.FP32, Datatype.FP64, Datatype.BF16}


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
    holds anything else."""
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


STRUCT_CODES = {
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
INT_RANGES = {
    dt: (int(np.iinfo(NUMPY_DTYPE[dt]).min), int(np.iinfo(NUMPY_DTYPE[dt]).max))  # type: ignore[type-var]
    for dt in _INT_TYPES
}
_NUMBER_TYPES = frozenset({int, float})


_INTS = frozenset({int})
_BOOLS = frozenset({bool})
_PACKERS: dict[tuple[str, int], Callable[..., bytes]] = {}


def _small_numbers(leaves: list[Any], datatype: Datatype) -> bytes | None:
    """A short flat list packed with struct when every element is of the right kind and in
    range; None otherwise (the numpy path then names any problem)."""
    code = STRUCT_CODES.get(datatype)
    if code is None or not leaves:
        return None
    kinds = set(map(type, leaves))
    if datatype is Datatype.BOOL:
        if kinds != _BOOLS:
            return None
    elif datatype in _INT_TYPES:
        if kinds != _INTS:
            return None
    elif not kinds <= _NUMBER_TYPES:
        return None
    n = len(leaves)
    pack = _PACKERS.get((code, n))
    if pack is None:
        pack = struct.Struct(f"<{n}{code}").pack
        if len(_PACKERS) < 1024:
            _PACKERS[(code, n)] = pack
    try:
        return pack(*leaves)
    except (struct.error, OverflowError):
        return None  # out of range, or a float beyond FP32: numpy turns it into infinity


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
    """A JSON ``data`` value -> the tensor's bytes in wire layout."""
    count = element_count(shape)
    if count == 0:
        # Triton does not parse 'data' of a zero-element tensor.
        return b""
    if type(data) is list and len(data) == count and count <= SMALL_ARRAY:
        # the usual small flat array; anything else takes the full path, which names it
        packed = _small_numbers(data, datatype)
        if packed is not None and len(packed) <= max_size:
            return packed
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
        for i, x in enumerate(leaves):
            if type(x) is not str:
                raise _type_error(where, datatype, "strings")
            try:
                elems.append(x.encode("utf-8"))
            except UnicodeEncodeError as exc:  # a lone surrogate (loads refuses them in text)
                raise CodecError(
                    f"Unable to parse 'data[{i}]' for {where}: a lone surrogate"
                    f" (\\u{ord(x[exc.start]):04x}) is not valid UTF-8 text"
                ) from None
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
    datatype = tensor.datatype
    listed = _LISTED.get(datatype)
    if listed is not None:
        # small: a plain list; a sum that is not finite (NaN, infinity, overflow) takes the
        # numpy path, which writes the literals
        code, itemsize, floats = listed
        view = memoryview(tensor.data)
        count = prod(tensor.shape)
        if count <= SMALL_ARRAY and view.nbytes == count * itemsize:
            values = view.cast("B").cast(code).tolist()
            if not floats or math.isfinite(sum(values)):
                return values
    if datatype is Datatype.BYTES:
        where = f"tensor '{tensor.name}'"
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
    npdt = NUMPY_DTYPE[datatype]
    nbytes = memoryview(tensor.data).nbytes
    expected = element_count(tensor.shape) * npdt.itemsize
    if nbytes != expected:
        raise CodecError(
            f"input byte size mismatch for tensor '{tensor.name}'. Expected {expected}, got"
            f" {nbytes}"
        )
    arr = np.frombuffer(tensor.data, dtype=npdt)
    if datatype in _FLOAT_TYPES:
        # Triton widens to double; a signalling NaN would make numpy warn
        with np.errstate(invalid="ignore"):
            arr = arr.astype(np.float64)
        if not np.isfinite(arr).all():
            return FloatLiterals([_float_literal(float(v)) for v in arr])
    return arr


#: datatype -> (memoryview format, item size, is float) for small tensors listed directly;
#: the format is native order, so only on little-endian hosts
_LISTED: dict[Datatype, tuple[Any, int, bool]] = (
    {
        dt: (STRUCT_CODES[dt], ITEM_SIZE[dt], dt in _FLOAT_TYPES)
        for dt in (*_INT_TYPES, Datatype.FP32, Datatype.FP64)
        if struct.calcsize(STRUCT_CODES[dt]) == ITEM_SIZE[dt]
    }
    if sys.byteorder == "little"
    else {}
)


class FloatLiterals(list[str]):
    """A tensor's ``data`` as float literals, some of which (NaN, Infinity) orjson cannot
    write: :mod:`v2proxy.codecs.json_v2` splices them in."""


def _float_literal(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return orjson.dumps(v).decode()
