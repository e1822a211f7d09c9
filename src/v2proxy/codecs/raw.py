"""Raw binary requests: ``Inference-Header-Content-Length: 0`` (docs/protocol.md, raw binary
requests)."""

from __future__ import annotations

from typing import Any

from v2proxy.codecs.dtypes import ITEM_SIZE, parse_datatype, serialize_bytes
from v2proxy.core.errors import CodecError, PayloadTooLarge
from v2proxy.core.model import Buffer, Datatype, InferRequest, Tensor, element_count


def _metadata_input(metadata: dict[str, Any], model: str) -> tuple[str, Datatype, list[int]]:
    inputs = metadata.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise CodecError(f"Raw request needs the model metadata of '{model}' to describe its input")
    if len(inputs) != 1:
        raise CodecError(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)}"
            f" inputs in '{model}' model configuration"
        )
    spec = inputs[0] if isinstance(inputs[0], dict) else {}
    name = spec.get("name")
    shape = spec.get("shape")
    if (
        not isinstance(name, str)
        or not isinstance(shape, list)
        or not all(type(d) is int and d >= -1 for d in shape)
    ):
        raise CodecError(f"model metadata of '{model}' has no usable input name and shape")
    datatype = parse_datatype(spec.get("datatype"), f"input '{name}' of model '{model}'")
    return name, datatype, list(shape)


def deduce_shape(
    name: str,
    datatype: Datatype,
    dims: list[int],
    nbytes: int,
    max_batch_size: int | None,
) -> tuple[int, ...]:
    """The shape of a raw input of ``nbytes`` bytes given the model's declared dims."""
    shape = list(dims)
    if max_batch_size is not None and max_batch_size > 0 and shape and shape[0] == -1:
        shape[0] = 1
    if datatype is Datatype.BYTES:
        shape = [1 if d == -1 else d for d in shape]
        if element_count(tuple(shape)) != 1:
            raise CodecError(
                f"For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        return tuple(shape)
    variable = [i for i, d in enumerate(shape) if d == -1]
    if len(variable) > 1 and max_batch_size is None and shape[0] == -1:
        shape[0] = 1
        variable = variable[1:]
    if len(variable) > 1:
        raise CodecError(
            f"The shape of the raw input '{name}' can not be deduced because there are more than"
            " one variable-sized dimension"
        )
    if variable:
        known = element_count(tuple(d for d in shape if d != -1)) * ITEM_SIZE[datatype]
        shape[variable[0]] = nbytes // known if known else 0
    return tuple(shape)


def decode_raw_request(
    body: Buffer,
    model_name: str,
    model_version: str,
    metadata: dict[str, Any],
    max_batch_size: int | None,
    max_input_size: int,
) -> InferRequest:
    """The request a raw body stands for, with every output asked for as binary."""
    nbytes = memoryview(body).nbytes
    if nbytes > max_input_size:
        raise PayloadTooLarge(
            f"Raw input has a byte_size ({nbytes} bytes) that exceeds the maximum allowed value"
            f" of {max_input_size} bytes. Use --max-input-size to increase the limit."
        )
    name, datatype, dims = _metadata_input(metadata, model_name)
    shape = deduce_shape(name, datatype, dims, nbytes, max_batch_size)
    data: Buffer
    if datatype is Datatype.BYTES:
        data = serialize_bytes([bytes(body)])
    else:
        data = memoryview(body).cast("B")
        expected = element_count(shape) * ITEM_SIZE[datatype]
        if expected != nbytes:
            raise CodecError(
                f"input byte size mismatch for input '{name}' for model '{model_name}'. Expected"
                f" {expected}, got {nbytes}"
            )
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=[Tensor(name, datatype, shape, data)],
        outputs=None,
        parameters={"binary_data_output": True},
    )
