"""The side endpoints (statistics, repository, trace and log settings) between their gRPC
messages and the v2 REST JSON, which is v2proxy's one canonical form for them: a gRPC client
in front of a REST backend and a REST client in front of a gRPC backend both go through it."""

from __future__ import annotations

import base64
from collections.abc import Mapping, MutableMapping
from typing import Any

from google.protobuf.message import Message

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.codecs.grpc import dict_to_message, message_to_dict
from v2proxy.core.errors import CodecError


def statistics_to_proto(obj: Any) -> pb.ModelStatisticsResponse:
    msg = pb.ModelStatisticsResponse()
    dict_to_message(obj if isinstance(obj, dict) else {}, msg, "model statistics")
    return msg


def statistics_to_json(msg: pb.ModelStatisticsResponse) -> dict[str, Any]:
    return {"model_stats": [_all_fields(s) for s in msg.model_stats]}


def _all_fields(msg: Message) -> dict[str, Any]:
    """Every field of a statistics message, zero counters included (Triton's REST statistics
    always show them; proto3 drops them), 64-bit integers as numbers."""
    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        value = getattr(msg, fd.name)
        if fd.message_type is None:
            out[fd.name] = list(value) if fd.is_repeated else value
        elif fd.message_type.GetOptions().map_entry:
            out[fd.name] = {k: _all_fields(v) for k, v in value.items()}
        elif fd.is_repeated:
            out[fd.name] = [_all_fields(v) for v in value]
        else:
            out[fd.name] = _all_fields(value)
    return out


def index_to_proto(obj: Any) -> pb.RepositoryIndexResponse:
    msg = pb.RepositoryIndexResponse()
    dict_to_message({"models": obj if isinstance(obj, list) else []}, msg, "repository index")
    return msg


def index_to_json(msg: pb.RepositoryIndexResponse) -> list[dict[str, Any]]:
    return [message_to_dict(m) for m in msg.models]


def repository_params_to_json(
    params: Mapping[str, pb.ModelRepositoryParameter],
) -> dict[str, Any]:
    """gRPC load/unload parameters -> REST ``parameters`` (file contents as base64)."""
    out: dict[str, Any] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        if which == "bytes_param":
            out[key] = base64.b64encode(p.bytes_param).decode()
        elif which is not None:
            out[key] = getattr(p, which)
    return out


def repository_params_to_proto(
    obj: Any, target: MutableMapping[str, pb.ModelRepositoryParameter]
) -> None:
    params = obj.get("parameters", {}) if isinstance(obj, dict) else {}
    if not isinstance(params, dict):
        raise CodecError("Unable to parse 'parameters': expected a JSON object")
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise CodecError(f"parameter '{key}' is out of the range of int64")
            p.int64_param = value
        elif isinstance(value, str):
            if key.startswith("file:"):
                try:
                    p.bytes_param = base64.b64decode(value, validate=True)
                except ValueError:
                    raise CodecError(f"parameter '{key}' must hold base64 file contents") from None
            else:
                p.string_param = value
        else:
            raise CodecError(f"parameter '{key}' must be a boolean, an integer or a string")


def trace_settings_to_json(
    settings: Mapping[str, pb.TraceSettingRequest.SettingValue],
) -> dict[str, Any]:
    """Trace settings as REST shows them: a list of strings per key (null clears a setting)."""
    return {k: list(v.value) if v.value else None for k, v in settings.items()}


def trace_settings_to_proto(obj: Any) -> pb.TraceSettingResponse:
    msg = pb.TraceSettingResponse()
    if isinstance(obj, dict):
        for key, value in obj.items():
            values = value if isinstance(value, list) else [value]
            msg.settings[key].value.extend(str(v) for v in values if v is not None)
    return msg


def log_settings_to_json(
    settings: Mapping[str, pb.LogSettingsRequest.SettingValue],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in settings.items():
        which = v.WhichOneof("parameter_choice")
        out[key] = getattr(v, which) if which else None
    return out


def log_settings_to_proto(obj: Any) -> pb.LogSettingsResponse:
    msg = pb.LogSettingsResponse()
    if isinstance(obj, dict):
        for key, value in obj.items():
            if value is None:
                continue
            s = msg.settings[key]
            if isinstance(value, bool):
                s.bool_param = value
            elif isinstance(value, int) and 0 <= value < 2**32:
                s.uint32_param = value
            else:
                s.string_param = str(value)
    return msg
