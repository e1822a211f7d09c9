"""Request bodies of the v2 REST side endpoints (reference §5.1) -> the arguments of the
pipeline's side operations.

- ``POST /v2/repository/index``: ``{"ready": bool}`` (optional; empty body means false).
- ``POST /v2/repository/models/{m}/load|unload``: ``{"parameters": {...}}`` (optional).
- ``POST /v2[/models/{m}]/trace/setting`` and ``POST /v2/logging``: a JSON object of settings.

Errors are CodecError (400) naming the field. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from v2proxy.codecs.json import loads
from v2proxy.errors import CodecError
from v2proxy.model import Buffer


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


def settings_update(body: Buffer, what: str) -> dict[str, Any]:
    """The settings a trace/log settings POST asks to change."""
    return _object(body, what)
