"""Triton's generate extension <-> the internal model (docs/protocol.md, generate extension):
``POST /v2/models/{m}[/versions/{v}]/generate`` and ``generate_stream``."""

from __future__ import annotations

from typing import Any

import orjson

from v2proxy.codecs.dtypes import deserialize_bytes
from v2proxy.codecs.json import loads
from v2proxy.codecs.json_data import (
    DEFAULT_MAX_INPUT_SIZE,
    FloatLiterals,
    data_to_buffer,
    tensor_data_json,
)
from v2proxy.core.errors import CodecError
from v2proxy.core.model import Buffer, Datatype, InferRequest, InferResponse, Tensor, element_count

#: parameter names Triton reserves for its scheduler and wire handling: never sent on
RESERVED = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "binary_data_output",
    }
)
#: Triton's answer to a generate request that its model answers other than exactly once
NOT_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that"
    " generates various number of responses"
)
#: the Content-Type of a generate_stream answer
SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
MAX_NESTING = 32
_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS
_PARAMETER_TYPES = (str, int, float)  # bool is an int


def parse_body(body: Buffer) -> dict[str, Any]:
    """The generate request's JSON object; CodecError when the body is no JSON object, its
    ``parameters`` no object or a key holds NUL (checked before a body is passed through:
    Triton answers each with 500)."""
    obj = loads(body)
    if type(obj) is not dict:
        raise CodecError(
            "the generate request must be a JSON object whose keys name the model's inputs"
        )
    params = obj.get("parameters", {})
    if type(params) is not dict:
        raise CodecError(
            "Expected JSON object for keyword: 'parameters': attempt to access JSON"
            " non-object as object"
        )
    if any("\0" in key for key in (*obj, *params)):  # Triton cuts names at NUL: 500
        raise CodecError("the generate request's keys must not contain NUL characters")
    return obj


def model_inputs(metadata: dict[str, Any]) -> dict[str, tuple[Datatype, tuple[int, ...]]]:
    """name -> (datatype, dims) of the model's inputs, from its v2 metadata (entries that are
    not well-formed are left out: such an input cannot be given by name)."""
    out: dict[str, tuple[Datatype, tuple[int, ...]]] = {}
    for entry in metadata.get("inputs") or ():
        if not isinstance(entry, dict):
            continue
        name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            continue
        if datatype not in Datatype.__members__:
            continue
        if not isinstance(shape, list) or not all(type(d) is int and d >= -1 for d in shape):
            continue
        out[name] = (Datatype(datatype), tuple(shape))
    return out


def fit_shape(dims: tuple[int, ...], count: int) -> tuple[int, ...] | None:
    """The shape of ``count`` elements under the model's ``dims`` (-1: any), or None when they
    do not fit: wildcards are 1 except the last, which takes what the fixed dims leave."""
    fixed = 1
    wild = -1
    for i, d in enumerate(dims):
        if d < 0:
            wild = i
        else:
            fixed *= d
    if wild < 0:
        return dims if fixed == count else None
    if fixed == 0:
        return None if count else tuple(max(d, 1) if d < 0 else d for d in dims)
    if count % fixed:
        return None
    shape = [1 if d < 0 else d for d in dims]
    shape[wild] = count // fixed
    return tuple(shape)


def _leaves(value: Any, name: str) -> list[Any]:
    if type(value) is not list:
        return [value]
    out: list[Any] = []

    def walk(items: list[Any], depth: int) -> None:
        if depth > MAX_NESTING:
            raise CodecError(f"input '{name}' is nested deeper than {MAX_NESTING} arrays")
        for x in items:
            if type(x) is list:
                walk(x, depth + 1)
            else:
                out.append(x)

    walk(value, 1)
    return out


def _tensor(name: str, value: Any, spec: tuple[Datatype, tuple[int, ...]], max_size: int) -> Tensor:
    datatype, dims = spec
    leaves = _leaves(value, name)
    shape = fit_shape(dims, len(leaves))
    if shape is None:
        raise CodecError(f"The schema can not convert input '{name}' to tensor with proper shape")
    data = data_to_buffer(leaves, datatype, shape, f"input '{name}'", max_size)
    return Tensor(name, datatype, shape, data)


def request_from_generate(
    obj: dict[str, Any],
    model: str,
    version: str,
    metadata: dict[str, Any],
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
) -> InferRequest:
    """The inference request a generate body stands for."""
    inputs = model_inputs(metadata)
    tensors: dict[str, Tensor] = {}
    parameters: dict[str, Any] = {}
    request_id: str | None = None

    def take(key: str, value: Any, prefix: str) -> None:
        spec = inputs.get(key)
        if spec is not None:
            if key in tensors:
                raise CodecError(f"{prefix}input '{key}' already exists in request")
            tensors[key] = _tensor(key, value, spec, max_input_size)
        elif type(value) not in (bool, *_PARAMETER_TYPES):
            raise CodecError(
                f"{prefix}parameter '{key}' has invalid type. It should be either 'int',"
                " 'bool', or 'string'."
            )
        elif key not in RESERVED and not key.startswith("triton_"):
            parameters[key] = value

    for key, value in obj.items():
        if key == "id":
            if type(value) is not str:
                raise CodecError(
                    "Unable to parse 'id': attempt to access JSON non-string as string"
                )
            request_id = value or None
        elif key == "parameters":
            if type(value) is not dict:
                raise CodecError(
                    "Expected JSON object for keyword: 'parameters': attempt to access JSON"
                    " non-object as object"
                )
            for k, v in value.items():
                take(k, v, "Converting keyword: 'parameters': ")
        else:
            take(key, value, "")
    return InferRequest(
        model_name=model,
        inputs=list(tensors.values()),
        id=request_id,
        parameters=parameters,
        model_version=version,
    )


def _output_value(t: Tensor) -> Any:
    if t.datatype is Datatype.BYTES:
        values: Any = [
            e.decode("utf-8", "replace") for e in deserialize_bytes(t.data, f"output '{t.name}'")
        ]
    else:
        values = tensor_data_json(t)
        if isinstance(values, FloatLiterals):  # non-finite floats: written verbatim
            values = [orjson.Fragment(v.encode()) for v in values]
    if element_count(t.shape) == 1 and len(values) == 1:
        first = values[0]
        return first.item() if hasattr(first, "item") else first
    return values


def response_to_generate(resp: InferResponse) -> dict[str, Any]:
    """A generate answer (or one stream event) for one inference response."""
    obj: dict[str, Any] = {}
    if resp.id:
        obj["id"] = resp.id
    obj["model_name"] = resp.model_name
    obj["model_version"] = resp.model_version
    for k, v in resp.parameters.items():
        obj.setdefault(k, v)
    for t in resp.outputs:
        obj[t.name] = _output_value(t)
    return obj


def encode(obj: dict[str, Any]) -> bytes:
    """A generate answer as JSON text, keys sorted as Triton writes them."""
    try:
        return orjson.dumps(obj, option=_OPTS)
    except orjson.JSONEncodeError as exc:
        raise CodecError(f"unable to encode the generate answer: {exc}") from None


def sse_event(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj``."""
    return b"data: " + encode(obj) + b"\n\n"


def error_event(message: str) -> bytes:
    """The event that reports an error in a generate stream."""
    return sse_event({"error": message})


class SseParser:
    """Splits a server-sent event stream into the JSON objects of its ``data`` fields
    (``\\n``, ``\\r\\n`` or ``\\r`` line ends; comments and other fields ignored; the lines of
    one event's ``data`` joined with ``\\n``)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[Any]:
        """The events completed by ``chunk``; CodecError for a ``data`` that is not JSON."""
        buf, hold = self._buf + chunk, b""
        if buf.endswith(b"\r"):  # maybe the first half of a CRLF: wait for the next byte
            buf, hold = buf[:-1], b"\r"
        buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *events, rest = buf.split(b"\n\n")
        self._buf = rest + hold
        return [obj for raw in events if (obj := self._event(raw)) is not None]

    def close(self) -> list[Any]:
        """The last event when the stream ended without its blank line."""
        rest, self._buf = self._buf, b""
        obj = self._event(rest) if rest.strip() else None
        return [] if obj is None else [obj]

    @staticmethod
    def _event(raw: bytes) -> Any:
        data = [
            line[5:].removeprefix(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")
        ]
        if not data:
            return None
        return loads(b"\n".join(data), "event")
