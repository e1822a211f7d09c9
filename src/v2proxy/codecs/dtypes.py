"""Datatype table and element-level helpers (docs/protocol.md, tensor layout)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from v2proxy.core.errors import CodecError
from v2proxy.core.model import Buffer, Datatype, Tensor, element_count

NUMPY_DTYPE: dict[Datatype, np.dtype[np.generic]] = {
    Datatype.BOOL: np.dtype("?"),
    Datatype.UINT8: np.dtype("u1"),
    Datatype.UINT16: np.dtype("<u2"),
    Datatype.UINT32: np.dtype("<u4"),
    Datatype.UINT64: np.dtype("<u8"),
    Datatype.INT8: np.dtype("i1"),
    Datatype.INT16: np.dtype("<i2"),
    Datatype.INT32: np.dtype("<i4"),
    Datatype.INT64: np.dtype("<i8"),
    Datatype.FP16: np.dtype("<f2"),
    Datatype.FP32: np.dtype("<f4"),
    Datatype.FP64: np.dtype("<f8"),
    Datatype.BF16: np.dtype(ml_dtypes.bfloat16),
}

ITEM_SIZE: dict[Datatype, int] = {dt: npdt.itemsize for dt, npdt in NUMPY_DTYPE.items()}

_DATATYPES = {dt.value: dt for dt in Datatype}
#: the integer datatypes, signed and unsigned
INTEGER_TYPES = frozenset(
    {
        Datatype.UINT8,
        Datatype.UINT16,
        Datatype.UINT32,
        Datatype.UINT64,
        Datatype.INT8,
        Datatype.INT16,
        Datatype.INT32,
        Datatype.INT64,
    }
)
_LEN = struct.Struct("<I")


def parse_datatype(value: object, where: str) -> Datatype:
    """The Datatype named by ``value``; CodecError naming ``where`` otherwise."""
    dt = _DATATYPES.get(value) if isinstance(value, str) else None
    if dt is None:
        raise CodecError(f"invalid datatype {value!r} for {where}")
    return dt


def parse_shape(value: object, where: str) -> tuple[int, ...]:
    """A shape: a list of non-negative integers (bools are not integers)."""
    if not isinstance(value, list):
        raise CodecError(f"Unable to parse 'shape' for {where}: expected an array of integers")
    for d in value:
        if type(d) is not int or d < 0:
            raise CodecError(
                f"Unable to parse 'shape' for {where}: dimensions must be non-negative integers,"
                f" got {d!r}"
            )
    shape = tuple(value)
    n = element_count(shape)
    if n > 2**63 - 1:
        raise CodecError(
            f"invalid shape for {where}: shape {list(shape)} causes total element count to exceed"
            " maximum size of 9223372036854775807"
        )
    return shape


def serialize_bytes(elements: Sequence[bytes]) -> bytes:
    """BYTES elements -> the length-prefixed wire layout."""
    pack = _LEN.pack
    parts: list[bytes] = []
    for e in elements:
        parts.append(pack(len(e)))
        parts.append(e)
    return b"".join(parts)


def deserialize_bytes(buf: Buffer, where: str = "tensor") -> list[bytes]:
    """The length-prefixed wire layout -> BYTES elements; CodecError if malformed."""
    mv = memoryview(buf).cast("B")
    out: list[bytes] = []
    pos, end = 0, len(mv)
    unpack = _LEN.unpack_from
    while pos < end:
        if end - pos < 4:
            raise CodecError(f"incomplete string length indicator for {where}")
        (n,) = unpack(mv, pos)
        pos += 4
        if n > end - pos:
            raise CodecError(
                f"incomplete string data for {where}: element declares {n} bytes,"
                f" {end - pos} remain"
            )
        out.append(bytes(mv[pos : pos + n]))
        pos += n
    return out


def count_bytes_elements(buf: Buffer, where: str) -> int:
    """Number of BYTES elements in ``buf``, validating every length prefix."""
    mv = memoryview(buf).cast("B")
    pos, end, count = 0, len(mv), 0
    unpack = _LEN.unpack_from
    while pos < end:
        if end - pos < 4:
            raise CodecError(f"incomplete string length indicator for {where}")
        (n,) = unpack(mv, pos)
        pos += 4 + n
        if pos > end:
            raise CodecError(
                f"incomplete string data for {where}: element declares {n} bytes,"
                f" {end - pos + n} remain"
            )
        count += 1
    return count


def expected_byte_size(datatype: Datatype, shape: tuple[int, ...]) -> int | None:
    """Exact byte size of a fixed-size tensor; None for BYTES (variable)."""
    size = ITEM_SIZE.get(datatype)
    return None if size is None else element_count(shape) * size


def check_tensor_size(tensor: Tensor, where: str) -> None:
    """Raise CodecError unless ``tensor.data`` holds exactly what its datatype and shape need."""
    nbytes = memoryview(tensor.data).nbytes
    expected = expected_byte_size(tensor.datatype, tensor.shape)
    if expected is not None:
        if nbytes != expected:
            raise CodecError(
                f"input byte size mismatch for {where}. Expected {expected}, got {nbytes}"
            )
        return
    count = count_bytes_elements(tensor.data, where)
    want = element_count(tensor.shape)
    if count != want:
        raise CodecError(f"expected {want} string elements for {where}, got {count}")


def as_numpy(tensor: Tensor) -> np.ndarray:
    """A read-only numpy view of a fixed-size tensor (no copy), shaped like the tensor (BYTES:
    an object array of ``bytes``)."""
    if tensor.datatype is Datatype.BYTES:
        arr = np.empty(element_count(tensor.shape), dtype=object)
        arr[:] = deserialize_bytes(tensor.data, f"tensor '{tensor.name}'")
        return arr.reshape(tensor.shape)
    return np.frombuffer(tensor.data, dtype=NUMPY_DTYPE[tensor.datatype]).reshape(tensor.shape)


def from_numpy(name: str, datatype: Datatype, array: np.ndarray) -> Tensor:
    """A Tensor holding ``array`` (converted to the datatype's wire dtype; no copy if it already is
    one and contiguous)."""
    shape = tuple(int(d) for d in array.shape)
    if datatype is Datatype.BYTES:
        elems = [e.encode() if isinstance(e, str) else bytes(e) for e in array.reshape(-1)]
        return Tensor(name, datatype, shape, serialize_bytes(elems))
    arr = np.ascontiguousarray(array, dtype=NUMPY_DTYPE[datatype])
    return Tensor(name, datatype, shape, byte_view(arr))


def byte_view(array: np.ndarray) -> memoryview:
    """A flat byte memoryview of a contiguous array, without copying (works for bfloat16 too,
    whose dtype the buffer protocol cannot describe)."""
    flat: Any = array.reshape(-1).view(np.uint8)
    return memoryview(flat)
