"""gRPC messages (``inference.GRPCInferenceService``) <-> the internal model (docs/protocol.md,
endpoints: gRPC)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.codecs.dtypes import (
    NUMPY_DTYPE,
    expected_byte_size,
    parse_datatype,
    serialize_bytes,
)
from v2proxy.codecs.json_data import DEFAULT_MAX_INPUT_SIZE
from v2proxy.codecs.limits import DEFAULT_MAX_TENSORS, DecodedTotal, check_count
from v2proxy.core.errors import CodecError
from v2proxy.core.model import (
    Buffer,
    Datatype,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)

#: datatype -> the typed-contents field that may carry it and that field's element dtype
CONTENTS: dict[Datatype, tuple[str, str]] = {
    Datatype.BOOL: ("bool_contents", "?"),
    Datatype.UINT8: ("uint_contents", "<u4"),
    Datatype.UINT16: ("uint_contents", "<u4"),
    Datatype.UINT32: ("uint_contents", "<u4"),
    Datatype.UINT64: ("uint64_contents", "<u8"),
    Datatype.INT8: ("int_contents", "<i4"),
    Datatype.INT16: ("int_contents", "<i4"),
    Datatype.INT32: ("int_contents", "<i4"),
    Datatype.INT64: ("int64_contents", "<i8"),
    Datatype.FP32: ("fp32_contents", "<f4"),
    Datatype.FP64: ("fp64_contents", "<f8"),
    Datatype.BYTES: ("bytes_contents", ""),
}
_FIELD_TYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
#: tensor parameters that describe one wire form only and never cross to another
_WIRE_PARAMS = frozenset({"binary_data_size", "binary_data"})
_INT64_MAX = 2**63 - 1


def params_from_proto(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not params:  # the usual case, without iterating the map
        return out
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[key] = getattr(p, which) if which else None
    return out


def params_to_proto(
    params: Mapping[str, Any], target: MutableMapping[str, pb.InferParameter]
) -> None:
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if -_INT64_MAX - 1 <= value <= _INT64_MAX:
                p.int64_param = value
            elif 0 <= value < 2**64:
                p.uint64_param = value
            else:
                raise CodecError(f"parameter '{key}' is out of the range of int64 and uint64")
        elif isinstance(value, float):
            p.double_param = value
        elif isinstance(value, str):
            p.string_param = value
        else:
            raise CodecError(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool',"
                " 'double', or 'string'."
            )


def _shape(dims: Iterable[int], where: str) -> tuple[int, ...]:
    shape = tuple(dims)
    if shape and min(shape) < 0:
        raise CodecError(f"invalid shape {list(shape)} for {where}: dimensions must be >= 0")
    return shape


def _contents_fields(contents: pb.InferTensorContents) -> list[str]:
    return [fd.name for fd, _ in contents.ListFields()]


def contents_to_bytes(
    contents: pb.InferTensorContents, datatype: Datatype, shape: tuple[int, ...], where: str
) -> bytes:
    """Typed contents -> the tensor's bytes in wire layout."""
    fields = _contents_fields(contents)
    expected = CONTENTS.get(datatype)
    field, field_dtype = expected if expected is not None else ("", "")
    wrong = [f for f in fields if f != field]
    if wrong:
        got = _FIELD_TYPE[wrong[0]]
        raw_only = (
            f" ({datatype.value} data can only be sent in raw_input_contents)"
            if expected is None
            else ""
        )
        raise CodecError(
            f"unexpected explicit tensor data for {where} of type '{got}', expected datatype"
            f" '{datatype.value}'{raw_only}"
        )
    values = getattr(contents, field) if fields else ()  # no field: zero elements
    count = 1
    for d in shape:
        count *= d
    if len(values) != count:
        raise CodecError(
            f"unexpected number of elements in the contents of {where}: expected {count},"
            f" got {len(values)}"
        )
    if not values:
        return b""
    if datatype is Datatype.BYTES:
        return serialize_bytes(list(values))
    arr = np.array(values, dtype=field_dtype)
    return arr.astype(NUMPY_DTYPE[datatype]).tobytes()


def request_from_proto(
    msg: pb.ModelInferRequest,
    max_tensors: int = DEFAULT_MAX_TENSORS,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
) -> InferRequest:
    """Decode a ModelInferRequest (raw slots in order, typed contents, shm references) within
    ``max_tensors`` tensors and ``max_input_size`` bytes decoded from typed contents."""
    model = msg.model_name
    check_count(len(msg.inputs), max_tensors, "inputs")
    check_count(len(msg.outputs), max_tensors, "outputs")
    decoded = DecodedTotal(max_input_size)
    raw = msg.raw_input_contents
    next_raw = 0
    inputs: list[Tensor] = []
    for inp in msg.inputs:
        where = f"input tensor '{inp.name}' for model '{model}'"
        datatype = parse_datatype(inp.datatype, where)
        shape = _shape(inp.shape, where)
        params = params_from_proto(inp.parameters)
        # MLServer sends an empty ``contents`` beside raw data: data only when no raw is sent
        has_contents = inp.HasField("contents") and (
            bool(_contents_fields(inp.contents)) or not raw
        )
        data: bytes
        if "shared_memory_region" in params:
            if has_contents:
                raise CodecError(
                    f"unexpected 'content' provided when using shared memory for {where}"
                )
            data = b""
        elif has_contents:
            if len(raw):
                raise CodecError(
                    f"contents field must not be specified when using raw_input_contents for"
                    f" '{inp.name}' for model '{model}'"
                )
            size = expected_byte_size(datatype, shape)
            if size is not None:  # counted before converting
                decoded.add(size, where)
            data = contents_to_bytes(inp.contents, datatype, shape, where)
            if size is None:
                decoded.add(len(data), where)
        else:
            if next_raw >= len(raw):
                raise CodecError(f"unable to find data for {where} in request.")
            data = raw[next_raw]
            next_raw += 1
        inputs.append(Tensor(inp.name, datatype, shape, data, params))
    if next_raw != len(raw):
        raise CodecError(
            f"expected {next_raw} raw_input_contents (one per input of model '{model}' sent"
            f" without contents or shared memory) but got {len(raw)}"
        )
    outputs = [RequestedOutput(o.name, _output_params(o)) for o in msg.outputs]
    return InferRequest(
        model_name=model,
        model_version=msg.model_version,
        id=msg.id or None,
        parameters=params_from_proto(msg.parameters),
        inputs=inputs,
        outputs=outputs or None,
    )


def _output_params(output: Any) -> dict[str, Any]:
    """A requested output's parameters; ``classification`` checked here, where its proto type is
    still known, as Triton's gRPC frontend does."""
    params = params_from_proto(output.parameters)
    if "classification" in params:
        p = output.parameters["classification"]
        if p.WhichOneof("parameter_choice") != "int64_param":
            raise CodecError(
                "invalid value type for 'classification' parameter, expected int64_param"
            )
        if p.int64_param <= 0:
            raise CodecError("invalid value for 'classification' parameter, expected >= 0")
        if "shared_memory_region" in params:
            raise CodecError("output can't set both 'shared_memory_region' and 'classification'")
    return params


def encodes_unchanged(req: InferRequest) -> bool:
    """Whether :func:`request_to_proto` keeps every parameter of ``req`` (it leaves out those
    of one wire form only)."""
    if "binary_data_output" in req.parameters:
        return False
    for t in req.inputs:
        if t.parameters and not _WIRE_PARAMS.isdisjoint(t.parameters):
            return False
    for o in req.outputs or ():
        if o.parameters and not _WIRE_PARAMS.isdisjoint(o.parameters):
            return False
    return True


def request_to_proto(req: InferRequest, raw: bool = True) -> pb.ModelInferRequest:
    """Encode a request for a gRPC backend: every input's bytes in raw_input_contents (without
    them with ``raw`` False: :func:`request_bytes` appends them)."""
    msg = pb.ModelInferRequest(
        model_name=req.model_name, model_version=req.model_version, id=req.id or ""
    )
    params = {k: v for k, v in req.parameters.items() if k != "binary_data_output"}
    params_to_proto(params, msg.parameters)
    for t in req.inputs:
        inp = msg.inputs.add(name=t.name, datatype=t.datatype.value, shape=t.shape)
        params_to_proto(
            {k: v for k, v in t.parameters.items() if k not in _WIRE_PARAMS}, inp.parameters
        )
        if raw and "shared_memory_region" not in t.parameters:
            msg.raw_input_contents.append(bytes(t.data))
    for o in req.outputs or ():
        out = msg.outputs.add(name=o.name)
        params_to_proto(
            {k: v for k, v in o.parameters.items() if k not in _WIRE_PARAMS}, out.parameters
        )
    return msg


def response_to_proto(resp: InferResponse, raw: bool = True) -> pb.ModelInferResponse:
    """Encode a response for a gRPC client: every output in raw_output_contents (without them
    with ``raw`` False: :func:`response_bytes` appends them)."""
    msg = pb.ModelInferResponse(
        model_name=resp.model_name, model_version=resp.model_version, id=resp.id or ""
    )
    params_to_proto(resp.parameters, msg.parameters)
    for t in resp.outputs:
        msg.outputs.add(name=t.name, datatype=t.datatype.value, shape=t.shape)
        if raw:
            msg.raw_output_contents.append(bytes(t.data))
    return msg


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited_tag(message: Any, field: str) -> bytes:
    number = message.DESCRIPTOR.fields_by_name[field].number
    return _varint((number << 3) | 2)


#: the wire tags of the raw contents fields (the last fields of their messages)
_RAW_INPUT_TAG = _length_delimited_tag(pb.ModelInferRequest, "raw_input_contents")
_RAW_OUTPUT_TAG = _length_delimited_tag(pb.ModelInferResponse, "raw_output_contents")


def _with_raw(head: bytes, tag: bytes, contents: list[Buffer]) -> bytes:
    """``head`` (a message serialized without its raw contents) followed by each buffer as one
    more element of the repeated bytes field ``tag``: the tensors' bytes copied once, where
    protobuf copies them twice, slowly. These are the messages' last fields, so the bytes are
    what protobuf would write."""
    parts: list[Buffer] = [head]
    for data in contents:
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        parts.append(tag + _varint(size))
        parts.append(data)
    return b"".join(parts)


def request_bytes(req: InferRequest) -> bytes:
    """:func:`request_to_proto`'s message, serialized, with the inputs' bytes copied once."""
    msg = request_to_proto(req, raw=False)
    contents = [t.data for t in req.inputs if "shared_memory_region" not in t.parameters]
    return _with_raw(msg.SerializeToString(), _RAW_INPUT_TAG, contents)


def response_bytes(resp: InferResponse) -> bytes:
    """:func:`response_to_proto`'s message, serialized, with the outputs' bytes copied once."""
    msg = response_to_proto(resp, raw=False)
    return _with_raw(msg.SerializeToString(), _RAW_OUTPUT_TAG, [t.data for t in resp.outputs])


#: the wire tag of ``ModelStreamInferResponse.infer_response``
_STREAM_ANSWER_TAG = _length_delimited_tag(pb.ModelStreamInferResponse, "infer_response")


def stream_response_bytes(answer: bytes) -> bytes:
    """A serialized ModelStreamInferResponse around the serialized ModelInferResponse
    ``answer``, written by hand so a relayed answer is not parsed and serialized again."""
    return b"".join((_STREAM_ANSWER_TAG, _varint(len(answer)), answer))


def response_from_proto(msg: pb.ModelInferResponse) -> InferResponse:
    """Decode a backend's ModelInferResponse; outputs may be raw, typed, or a mix of both."""
    raw = msg.raw_output_contents
    aligned = len(raw) == len(msg.outputs)
    next_raw = 0
    outputs: list[Tensor] = []
    for i, out in enumerate(msg.outputs):
        where = f"output '{out.name}' of the backend's response"
        datatype = parse_datatype(out.datatype, where)
        shape = _shape(out.shape, where)
        params = {
            k: v for k, v in params_from_proto(out.parameters).items() if k not in _WIRE_PARAMS
        }
        has_contents = out.HasField("contents") and (
            bool(_contents_fields(out.contents)) or not aligned
        )
        data: bytes
        if has_contents:
            data = contents_to_bytes(out.contents, datatype, shape, where)
        elif aligned:
            data = raw[i]
        else:
            if next_raw >= len(raw):
                raise CodecError(f"no data for {where}")
            data = raw[next_raw]
            next_raw += 1
        outputs.append(Tensor(out.name, datatype, shape, data, params))
    return InferResponse(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id or None,
        parameters=params_from_proto(msg.parameters),
        outputs=outputs,
    )


def response_from_bytes(data: bytes) -> InferResponse:
    """A backend's serialized ModelInferResponse decoded; CodecError when it is none."""
    try:
        msg = pb.ModelInferResponse.FromString(data)
    except DecodeError as exc:
        raise CodecError(f"malformed ModelInferResponse: {exc}") from None
    return response_from_proto(msg)


def relayed_answer(data: bytes, request: InferRequest) -> InferResponse | None:
    """A backend's serialized answer to a relayed ``request``: None when it may go back as it
    came, being what the full path would answer; else the response decoded, for the caller to
    finish as the full path does."""
    try:
        msg = pb.ModelInferResponse.FromString(data)
    except DecodeError as exc:
        raise CodecError(f"malformed ModelInferResponse: {exc}") from None
    if _as_is(msg, request):
        return None
    return response_from_proto(msg)


def _as_is(msg: pb.ModelInferResponse, request: InferRequest) -> bool:
    if (request.id and not msg.id) or not msg.model_name:
        return False
    if len(msg.raw_output_contents) != len(msg.outputs):
        return False
    wanted = None if request.outputs is None else {o.name for o in request.outputs}
    for out in msg.outputs:
        where = f"output '{out.name}' of the backend's response"
        parse_datatype(out.datatype, where)
        _shape(out.shape, where)
        if out.HasField("contents") or (wanted is not None and out.name not in wanted):
            return False
        if out.parameters and not _WIRE_PARAMS.isdisjoint(out.parameters):
            return False
    return True


def message_to_dict(msg: Message) -> dict[str, Any]:
    """A message as the v2 REST JSON shows it: proto field names, integers as numbers (not
    protobuf's 64-bit strings), enums by name."""
    out: dict[str, Any] = {}
    for fd, value in msg.ListFields():
        out[fd.name] = _value_to_json(fd, value)
    return out


def _scalar_to_json(fd: FieldDescriptor, value: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return message_to_dict(value)
    if fd.type == FieldDescriptor.TYPE_ENUM:  # an unknown number stays a number, as in JSON
        known = fd.enum_type.values_by_number.get(value) if fd.enum_type else None
        return known.name if known is not None else value
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return value.decode("utf-8", "replace")
    return value


def _value_to_json(fd: FieldDescriptor, value: Any) -> Any:
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        vfd = fd.message_type.fields_by_name["value"]
        return {k: _scalar_to_json(vfd, v) for k, v in value.items()}
    if fd.is_repeated:
        return [_scalar_to_json(fd, v) for v in value]
    return _scalar_to_json(fd, value)


def dict_to_message(obj: Any, message: Message, what: str) -> None:
    """Fill ``message`` from a REST-side JSON dict, ignoring fields it does not know."""
    try:
        json_format.ParseDict(obj, message, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise CodecError(f"cannot convert the {what} to gRPC: {exc}") from None


def _tensor_metadata(entries: Any) -> list[dict[str, Any]]:
    if not isinstance(entries, list):
        return []
    return [
        {"name": e.get("name", ""), "datatype": e.get("datatype", ""), "shape": e.get("shape", [])}
        for e in entries
        if isinstance(e, dict)
    ]


def server_metadata_to_proto(meta: Mapping[str, Any]) -> pb.ServerMetadataResponse:
    ext = meta.get("extensions")
    return pb.ServerMetadataResponse(
        name=str(meta.get("name", "")),
        version=str(meta.get("version", "")),
        extensions=[e for e in ext if isinstance(e, str)] if isinstance(ext, list) else [],
    )


def model_metadata_to_proto(meta: Mapping[str, Any]) -> pb.ModelMetadataResponse:
    msg = pb.ModelMetadataResponse()
    versions = meta.get("versions") or []
    dict_to_message(
        {
            "name": str(meta.get("name", "")),
            "versions": [str(v) for v in versions] if isinstance(versions, list) else [],
            "platform": str(meta.get("platform") or ""),
            "inputs": _tensor_metadata(meta.get("inputs")),
            "outputs": _tensor_metadata(meta.get("outputs")),
        },
        msg,
        "model metadata",
    )
    return msg
