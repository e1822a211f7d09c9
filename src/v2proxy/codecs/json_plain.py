"""A small JSON ``/infer`` request of the common shape, decoded in one lean pass.

:func:`plain_request` builds exactly the :class:`~v2proxy.core.model.InferRequest` the full
decoder (:func:`v2proxy.codecs.json_v2.request_from_obj`) builds from the same body, or says None
and leaves the body, and any fault's message, to the full decoder; it never raises. It takes
``{"id", "parameters", "inputs": [{"name", "datatype", "shape", "data": [flat numbers]}, ...],
"outputs": [{"name", "parameters"}, ...]}`` with no input ``parameters`` and only the datatypes
the full decoder packs with struct. Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from math import prod
from typing import Any

import msgspec

from v2proxy.codecs.json import SMALL_DOCUMENT
from v2proxy.codecs.json_data import SMALL_ARRAY, STRUCT_CODES
from v2proxy.codecs.json_shapes import DecodeErrors, request_decoder, tensor_types
from v2proxy.core.model import Datatype, InferRequest, RequestedOutput, Tensor


def _element(dt: Datatype) -> Any:
    """The kind of one element of ``dt``'s data (its range is the struct pack's to check)."""
    if dt is Datatype.BOOL:
        return bool
    if dt in (Datatype.FP16, Datatype.FP32, Datatype.FP64):
        return int | float
    return int


class _Output(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: str
    parameters: dict[str, Any] | None = None


class _Packers:
    """The struct packers of one datatype, per element count (made on first use)."""

    __slots__ = ("code", "packers")

    def __init__(self, datatype: Datatype) -> None:
        self.code = STRUCT_CODES[datatype]
        self.packers: list[Callable[..., bytes] | None] = [None] * (SMALL_ARRAY + 1)

    def packer(self, count: int) -> Callable[..., bytes]:
        pack = self.packers[count] = struct.Struct(f"<{count}{self.code}").pack
        return pack


_DECODER = request_decoder(
    tensor_types(STRUCT_CODES, _element, lambda dt: {"packers": _Packers(dt)}),
    _Output,
    parameters=True,
)


def plain_request(
    body: bytes | bytearray,
    model_name: str,
    model_version: str,
    max_input_size: int,
    max_tensors: int,
) -> InferRequest | None:
    """The request of a JSON ``body`` of the plain shape (module docstring), as the full
    decoder builds it; None for any other body."""
    size = len(body)
    if size > SMALL_DOCUMENT or size > max_input_size:
        return None
    try:
        request = _DECODER.decode(body)
    except DecodeErrors:
        return None  # not JSON, or not of the plain shape and kinds
    raw_inputs = request.inputs
    if not 0 < len(raw_inputs) <= max_tensors:
        return None
    params = request.parameters
    if params is not None and not _request_parameters(params):
        return None
    outputs = None
    if request.outputs is not None:
        outputs = _outputs(request.outputs, max_tensors)
        if outputs is None:
            return None
    inputs = []
    names = set()
    total = 0
    try:
        for item in raw_inputs:
            data = item.data
            count = len(data)  # (1..SMALL_ARRAY, by the decoder)
            if count != prod(item.shape):
                return None
            packers = item.packers
            # raises for an element out of the datatype's range
            packed = (packers.packers[count] or packers.packer(count))(*data)
            total += len(packed)
            names.add(item.name)
            inputs.append(Tensor(item.name, item.datatype_of, tuple(item.shape), packed, {}))
    except (struct.error, OverflowError):
        return None
    if len(names) != len(inputs) or total > max_input_size:
        return None
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=request.id,
        parameters={} if params is None else params,
        inputs=inputs,
        outputs=outputs,
    )


def _request_parameters(params: dict[str, Any]) -> bool:
    """Whether the request's ``parameters`` are what the full decoder takes as they are."""
    flag = params.get("binary_data_output", False)
    if type(flag) is not bool:
        return False
    return not any(key.startswith("triton_") for key in params)


def _outputs(raw: list[_Output], max_tensors: int) -> list[RequestedOutput] | None:
    """The requested outputs as the full decoder builds them; None unless their names are
    unique and each one's ``binary_data``, if any, is a boolean."""
    if len(raw) > max_tensors:
        return None
    outputs = []
    seen: set[str] = set()
    for item in raw:
        name = item.name
        if name in seen:
            return None
        seen.add(name)
        params = item.parameters
        if params is None:
            params = {}
        elif type(params.get("binary_data", False)) is not bool:
            return None
        outputs.append(RequestedOutput(name, dict(params)))
    return outputs
