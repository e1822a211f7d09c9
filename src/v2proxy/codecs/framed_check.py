"""Whether a binary-framed ``/infer`` body (binary tensors, Inference-Header-Content-Length)
may be relayed untouched, checked in one typed parse of its JSON header instead of the full
decoder (:func:`v2proxy.codecs.binary.decode_request`).

:func:`plain_framed_request` is *sound*, not complete: True only for a body the full decoder
accepts and no stage applies to; False for anything else (the caller then takes the full
decoder's path, which names the fault). What it accepts is the shape binary-tensor clients
send (tritonclient's ``generate_request_body`` among them)::

    {"id": "...", "parameters": {...},
     "inputs": [{"name", "datatype", "shape", "parameters": {"binary_data_size": n}}, ...],
     "outputs": [{"name", "parameters": {"binary_data": bool}}, ...]}

``id``, the request's ``parameters`` and ``outputs`` optional; every input exactly those four
keys, in its parameters ``binary_data_size`` alone (no shared memory), of a datatype other than
BYTES, its size the shape's element count times the item size; the sizes adding up to the
binary section; an output's parameters ``binary_data`` alone, if any (no classification, no
shared memory); unique names; the request's parameters without ``triton_`` keys and with a
boolean ``binary_data_output`` if any; at most ``max_tensors`` inputs and outputs; the header
within ``max_input_size``. Everything in the header is decoded by msgspec (no key skipped, so
every string is checked to be UTF-8, and keys spelled with escapes are decoded before they are
matched). ``tests/unit/test_framed_check.py`` checks it against the full decoder.

Pure: no I/O.
"""

from __future__ import annotations

from math import prod
from typing import Annotated, Any, Literal, Union

import msgspec

from v2proxy.codecs.dtypes import ITEM_SIZE
from v2proxy.codecs.json_shapes import DecodeErrors
from v2proxy.core.model import Datatype

_SIZED = tuple(dt.value for dt in Datatype if dt is not Datatype.BYTES)
_ITEM = {dt.value: ITEM_SIZE[dt] for dt in Datatype if dt is not Datatype.BYTES}
_NATURAL = Annotated[int, msgspec.Meta(ge=0)]


class _Sized(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    binary_data_size: _NATURAL


class _Input(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: str
    datatype: Literal[_SIZED]  # type: ignore[valid-type]
    shape: list[_NATURAL]
    parameters: _Sized


class _Flag(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    binary_data: bool = False


class _Output(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: str
    parameters: Union[_Flag, None] = None  # noqa: UP007


class _Header(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    inputs: list[_Input]
    id: Union[str, None] = None  # noqa: UP007
    outputs: Union[list[_Output], None] = None  # noqa: UP007
    parameters: Union[dict[str, Any], None] = None  # noqa: UP007


_DECODER = msgspec.json.Decoder(_Header)


def plain_framed_request(
    body: bytes | bytearray, ihcl: int, max_input_size: int, max_tensors: int
) -> bool:
    """True when ``body``, a JSON header of ``ihcl`` bytes and its binary section, is a request
    the full decoder accepts and no stage applies to (see the module's docstring)."""
    if not 0 < ihcl <= len(body) or ihcl > max_input_size:
        return False
    try:
        header = _DECODER.decode(memoryview(body)[:ihcl])
    except DecodeErrors:
        return False
    inputs = header.inputs
    n = len(inputs)
    if not 0 < n <= max_tensors:
        return False
    names = set()
    section = 0
    for tensor in inputs:
        size = tensor.parameters.binary_data_size
        if size != prod(tensor.shape) * _ITEM[tensor.datatype]:
            return False
        section += size
        names.add(tensor.name)
    if len(names) != n or section != len(body) - ihcl:
        return False
    params = header.parameters
    if params is not None and (
        type(params.get("binary_data_output", False)) is not bool
        or any(key.startswith("triton_") for key in params)
    ):
        return False
    outputs = header.outputs
    return outputs is None or (
        len(outputs) <= max_tensors and len({o.name for o in outputs}) == len(outputs)
    )
