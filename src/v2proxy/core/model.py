"""The internal model every frontend decodes into and every backend encodes from."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from math import prod
from typing import Any, Protocol

Buffer = bytes | bytearray | memoryview


class Datatype(StrEnum):
    """The 14 v2 tensor datatypes (13 fixed-size types plus BYTES)."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BF16 = "BF16"
    BYTES = "BYTES"


def element_count(shape: tuple[int, ...]) -> int:
    """Number of elements of a tensor of ``shape`` (1 for a scalar shape ``()``)."""
    return prod(shape)


@dataclass(slots=True)
class Tensor:
    """One named tensor; ``data`` is in the binary wire layout."""

    name: str
    datatype: Datatype
    shape: tuple[int, ...]
    data: Buffer
    parameters: dict[str, Any] = field(default_factory=dict)
    #: an output the proxy wrote into the client's shared memory: answered with its name,
    #: datatype and shape only (REST), an empty raw slot (gRPC)
    in_shm: bool = False


class OutputSink(Protocol):
    """Where the client wants an output written (its shared-memory region): ``capacity`` bytes
    at most; :meth:`write` checks the size and the destination and copies ``data`` there."""

    capacity: int

    def write(self, data: Buffer) -> None: ...


@dataclass(slots=True)
class RequestedOutput:
    """An entry of the request's ``outputs`` list: a name and its parameters
    (``binary_data``, ``classification``, shared-memory parameters, anything else)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    #: the client's shared-memory destination, set by the shm stage (a backend that can fill
    #: it straight from its own staging region saves a copy; the tensor is then ``in_shm``)
    sink: OutputSink | None = None


@dataclass(slots=True)
class InferRequest:
    """An inference request. ``outputs`` None: the client listed none (all are returned)."""

    model_name: str
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None = None
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    model_version: str = ""


@dataclass(slots=True)
class InferResponse:
    """An inference response; outputs keep the order the backend produced them in."""

    model_name: str
    outputs: list[Tensor]
    model_version: str = ""
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
