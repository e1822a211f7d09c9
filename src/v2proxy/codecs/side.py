"""Request bodies of the v2 REST side endpoints (docs/protocol.md, endpoints) -> the arguments of
the pipeline's side operations."""

from __future__ import annotations

import base64
from typing import Any

from v2proxy.codecs.json import loads
from v2proxy.core.errors import CodecError
from v2proxy.core.model import Buffer


def _object(body: Buffer, what: str) -> dict[str, Any]:
    if not bytes(body).strip():
        return {}
    obj = loads(body, what=what)
    if not isinstance(obj, dict):
        raise CodecError(f"{what} must be a JSON object")
    return obj


def index_ready(body: Buffer) -> bool:
    """The ``ready`` flag of a repository index request."""
    ready = _object(body, "repository index request").get("ready", False)
    if not isinstance(ready, bool):
        raise CodecError("Invalid value for 'ready': expected a boolean")
    return ready


def load_parameters(body: Buffer) -> dict[str, Any]:
    """The ``parameters`` of a repository load/unload request."""
    params = _object(body, "repository request").get("parameters", {})
    if not isinstance(params, dict):
        raise CodecError("Unable to parse 'parameters': expected a JSON object")
    return params


def check_load_parameters(params: dict[str, Any]) -> None:
    """A load's parameters are strings: ``config`` (a model configuration as JSON text) and
    ``file:<path>`` (base64 contents)."""
    for key, value in params.items():
        if not isinstance(value, str):
            raise CodecError(f"Unable to parse 'parameters': the value of '{key}' must be a string")


def settings_update(body: Buffer, what: str) -> dict[str, Any]:
    """The settings a trace/log settings POST asks to change."""
    return _object(body, what)


def shm_register_body(body: Buffer) -> tuple[str, int, int]:
    """``POST /v2/systemsharedmemory/region/{name}/register``: (key, offset, byte_size), checked in
    Triton's order (docs/protocol.md, registering system regions; Triton answers 500 for an empty or
    malformed body and a non-string key, v2proxy 400)."""
    if not bytes(body).strip():
        raise CodecError("failed to parse the request JSON buffer: The document is empty.")
    obj = _object(body, "shared memory register request")
    if "key" not in obj:
        raise CodecError("Shared memory register request has no 'key' field")
    key = obj["key"]
    if not isinstance(key, str):
        raise CodecError("Invalid value for 'key' of the shared memory register request")
    offset = _count(obj, "offset") if "offset" in obj else 0
    return key, offset, _count(obj, "byte_size")


def cuda_register_body(body: Buffer) -> tuple[bytes, int, int]:
    """``POST /v2/cudasharedmemory/region/{name}/register``: (raw handle, device_id, byte_size) from
    ``{"raw_handle": {"b64": ...}, "device_id", "byte_size"}`` (docs/protocol.md, CUDA regions;
    Triton answers 500 for a missing ``b64``, ``device_id`` or ``byte_size``, v2proxy 400)."""
    if not bytes(body).strip():
        raise CodecError("failed to parse the request JSON buffer: The document is empty.")
    obj = _object(body, "shared memory register request")
    if "raw_handle" not in obj:
        raise CodecError("Shared memory register request has no 'raw_handle' field")
    raw = obj["raw_handle"]
    b64 = raw.get("b64") if isinstance(raw, dict) else None
    if not isinstance(b64, str):
        raise CodecError("Shared memory register request has no 'raw_handle.b64' string")
    try:
        handle = base64.b64decode(b64 + "=" * (-len(b64) % 4))
    except ValueError:
        handle = b""
    if len(handle) != 64:
        raise CodecError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return handle, _count(obj, "device_id"), _count(obj, "byte_size")


def _count(obj: dict[str, Any], field: str) -> int:
    """A required non-negative integer field of a shared-memory register request."""
    if field not in obj:
        raise CodecError(f"Shared memory register request has no '{field}' field")
    v = obj[field]
    if type(v) is not int or v < 0:
        raise CodecError(
            f"Invalid value for '{field}' of the shared memory register request: expected a"
            " non-negative integer"
        )
    return v
