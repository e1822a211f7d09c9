"""v2 inference request and response JSON objects <-> the internal model (docs/protocol.md,
JSON bodies)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from v2proxy.codecs.dtypes import ITEM_SIZE, expected_byte_size, parse_datatype, parse_shape
from v2proxy.codecs.json import dumps
from v2proxy.codecs.json_data import (
    DEFAULT_MAX_INPUT_SIZE,
    FloatLiterals,
    data_to_buffer,
    tensor_data_json,
)
from v2proxy.codecs.limits import DEFAULT_MAX_TENSORS, DecodedTotal, check_count
from v2proxy.codecs.sections import BinaryReader
from v2proxy.core.errors import CodecError
from v2proxy.core.model import (
    Buffer,
    Datatype,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    element_count,
)


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


def _binary_data(
    tparams: dict[str, Any],
    binary: BinaryReader | None,
    name: str,
    where: str,
    model: str,
    no_section: str,
) -> bytes | memoryview:
    """The bytes of a tensor whose ``parameters`` (``tparams``, from which the key is removed)
    declare ``binary_data_size``."""
    size = _uint_param(tparams, "binary_data_size", where)
    del tparams["binary_data_size"]
    if binary is not None:
        return binary.take(size, name, model)
    if size == 0:
        return b""
    raise CodecError(no_section)


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
#: each datatype's name as written (a look-up, where the enum's ``value`` is a property call)
_NAMES = {dt: dt.value for dt in Datatype}
_DATA_ONLY = ["data"]


def request_from_obj(
    obj: Any,
    model_name: str,
    model_version: str,
    binary: BinaryReader | None,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    checked: dict[int, tuple[Datatype, int]] | None = None,
    max_tensors: int = DEFAULT_MAX_TENSORS,
) -> InferRequest:
    """Build an InferRequest from a parsed v2 JSON request header."""
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
    check_count(len(raw_inputs), max_tensors, "inputs")
    raw_outputs = obj.get("outputs")
    if type(raw_outputs) is list:
        check_count(len(raw_outputs), max_tensors, "outputs")
    decoded = DecodedTotal(max_input_size)
    inputs: list[Tensor] = []
    seen: set[str] = set()
    for i, item in enumerate(raw_inputs):
        name, datatype, shape = _tensor_header(item, "input", i)
        where = f"input '{name}'"
        if name in seen:
            raise CodecError(f"input '{name}' already exists in request")
        seen.add(name)
        if item.get("parameters") is None:  # the usual case: no parameters, data inline
            tparams: dict[str, Any] = {}
            present = _DATA_ONLY if item.get("data") is not None else []
        else:
            tparams = dict(_parameters(item, where))
            present = [
                k for k in _SOURCE_KEYS if (item if k == "data" else tparams).get(k) is not None
            ]
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
        if source == "data":
            size = expected_byte_size(datatype, shape)
            # counted before decoding (one input over the limit is data_to_buffer's to name)
            if size is not None and size <= max_input_size:
                decoded.add(size, where)
        if source == "data" and checked is not None and i in checked:
            data = _checked_data(checked[i], datatype, shape, where, max_input_size)
        elif source == "data":
            data = data_to_buffer(item["data"], datatype, shape, where, max_input_size)
            if size is None:
                decoded.add(len(data), where)
        elif source == "binary_data_size":
            data = _binary_data(
                tparams,
                binary,
                name,
                where,
                model_name,
                f"{where} sets 'binary_data_size' but the request has no binary section"
                " (missing Inference-Header-Content-Length header)",
            )
        else:
            data = b""  # shared memory: resolved by the pipeline
        inputs.append(Tensor(name, datatype, shape, data, tparams))
    outputs = _requested_outputs(raw_outputs)
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
        raise CodecError(f"Unable to parse 'data' for {where}: not as checked")
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
    """The JSON header for sending ``req`` to a backend."""
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
        entry: dict[str, Any] = {"name": t.name, "datatype": _NAMES[t.datatype], "shape": t.shape}
        tparams = dict(t.parameters)
        if "shared_memory_region" in tparams:  # staged in the backend's shared memory
            pass
        elif binary_inputs:
            tparams["binary_data_size"] = memoryview(t.data).nbytes
        else:
            entry["data"] = _data_json(t)
        if tparams:
            entry["parameters"] = tparams
        inputs.append(entry)
    obj["inputs"] = inputs
    if req.outputs is not None:
        obj["outputs"] = [
            {
                "name": o.name,
                "parameters": {
                    **o.parameters,
                    "binary_data": binary_outputs and "shared_memory_region" not in o.parameters,
                },
            }
            for o in req.outputs
        ]
    return obj


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
            data = _binary_data(
                tparams,
                binary,
                name,
                where,
                model,
                f"invalid response from backend: {where} is binary but the"
                " response has no binary section",
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


def response_to_obj(
    resp: InferResponse,
    is_binary: Callable[[Tensor], bool] | None,
    blobs: list[Buffer] | None = None,
) -> dict[str, Any]:
    """The JSON header of a response, in Triton's key order (``is_binary`` None: no output is
    binary)."""
    obj: dict[str, Any] = {}
    if resp.id:
        obj["id"] = resp.id
    obj["model_name"] = resp.model_name
    obj["model_version"] = resp.model_version
    if resp.parameters:
        obj["parameters"] = resp.parameters
    outputs = []
    for t in resp.outputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": _NAMES[t.datatype], "shape": t.shape}
        # written into the client's shared memory: no data, no parameters
        if t.in_shm:
            pass
        elif is_binary is not None and is_binary(t):
            size = memoryview(t.data).nbytes
            entry["parameters"] = {**t.parameters, "binary_data_size": size}
            if blobs is not None and size:
                blobs.append(t.data)
        else:
            if t.parameters:
                entry["parameters"] = t.parameters
            data = tensor_data_json(t)  # (_data_json, written out)
            if type(data) is FloatLiterals:
                data = orjson.Fragment(("[" + ",".join(data) + "]").encode())
            entry["data"] = data
        outputs.append(entry)
    obj["outputs"] = outputs
    return obj


def _data_json(t: Tensor) -> Any:
    """A tensor's ``data`` for the header: :func:`tensor_data_json`'s value, with NaN/Infinity
    literals written like Triton (orjson cannot write them: the finished text is spliced in
    verbatim)."""
    data = tensor_data_json(t)
    if type(data) is FloatLiterals:
        return orjson.Fragment(("[" + ",".join(data) + "]").encode())
    return data


#: serializes a header of :func:`request_to_obj` or :func:`response_to_obj`
dumps_tree = dumps
