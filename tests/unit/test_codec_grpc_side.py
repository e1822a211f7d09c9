"""The side endpoints between their gRPC messages and the v2 REST JSON (statistics, repository
index, load/unload parameters, trace and log settings), both directions, with tritonclient's
``service_pb2`` messages as the reference wire format."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as triton_pb

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.codecs import grpc_side as side
from v2proxy.core.errors import CodecError


def _cross(msg: Any, cls: Any) -> Any:
    """The same message read by the other side's class (they share the wire format only)."""
    return cls.FromString(msg.SerializeToString())


# --------------------------------------------------------------------------- statistics


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


ZERO = _duration(0, 0)
INFER_STATS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
RESPONSE_STATS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")

# Triton's REST statistics, every field present, 64-bit values beyond 2**53 and 2**63
TRITON_STATS: dict[str, Any] = {
    "model_stats": [
        {
            "name": "simple",
            "version": "1",
            "last_inference": 1_700_000_000_123,
            "inference_count": 2**63 + 11,
            "execution_count": 2**53 + 1,
            "inference_stats": {
                k: _duration(i + 1, (i + 1) * 2**40) for i, k in enumerate(INFER_STATS)
            },
            "batch_stats": [
                {
                    "batch_size": 1,
                    "compute_input": _duration(5, 2**64 - 1),
                    "compute_infer": _duration(5, 6),
                    "compute_output": _duration(5, 7),
                }
            ],
            "memory_usage": [{"type": "GPU", "id": 1, "byte_size": 2**40}],
            "response_stats": {
                "0": {k: _duration(2, 3) for k in RESPONSE_STATS},
            },
        },
        {
            "name": "idle",
            "version": "2",
            "last_inference": 0,
            "inference_count": 0,
            "execution_count": 0,
            "inference_stats": dict.fromkeys(INFER_STATS, ZERO),
            "batch_stats": [],
            "memory_usage": [],
            "response_stats": {},
        },
    ]
}


def test_statistics_json_to_proto_to_json() -> None:
    msg = side.statistics_to_proto(TRITON_STATS)
    wire = _cross(msg, triton_pb.ModelStatisticsResponse)
    s = wire.model_stats[0]
    assert s.inference_count == 2**63 + 11
    assert s.execution_count == 2**53 + 1
    assert s.inference_stats.cache_miss.ns == 8 * 2**40
    assert s.batch_stats[0].compute_input.ns == 2**64 - 1
    assert s.memory_usage[0].byte_size == 2**40
    assert s.response_stats["0"].cancel.count == 2
    back = side.statistics_to_json(_cross(wire, pb.ModelStatisticsResponse))
    assert back == TRITON_STATS
    assert type(back["model_stats"][0]["inference_count"]) is int
    assert type(back["model_stats"][0]["batch_stats"][0]["compute_input"]["ns"]) is int


def test_statistics_to_json_shows_zero_counters() -> None:
    # proto3 does not carry zeros; Triton's REST statistics (and REST clients) have them
    wire = triton_pb.ModelStatisticsResponse()
    wire.model_stats.add(name="idle", version="2")
    got = side.statistics_to_json(_cross(wire, pb.ModelStatisticsResponse))
    assert got == {"model_stats": [TRITON_STATS["model_stats"][1]]}


def test_statistics_to_json_empty() -> None:
    assert side.statistics_to_json(pb.ModelStatisticsResponse()) == {"model_stats": []}


def test_statistics_to_proto_ignores_unknown_fields() -> None:
    obj = {"model_stats": [{"name": "m", "future_field": {"x": 1}, "inference_count": 3}]}
    msg = side.statistics_to_proto(obj)
    assert msg.model_stats[0].name == "m"
    assert msg.model_stats[0].inference_count == 3


@pytest.mark.parametrize("obj", [None, [], "x", 5], ids=["null", "list", "string", "int"])
def test_statistics_to_proto_not_an_object(obj: Any) -> None:
    assert side.statistics_to_proto(obj) == pb.ModelStatisticsResponse()


@pytest.mark.parametrize(
    "obj",
    [
        {"model_stats": {"name": "m"}},
        {"model_stats": [{"inference_count": "many"}]},
        {"model_stats": [{"inference_count": -1}]},
        {"model_stats": [{"inference_count": 2**64}]},
        {"model_stats": [{"inference_stats": {"success": {"count": 1.5}}}]},
        {"model_stats": [{"batch_stats": {"batch_size": 1}}]},
    ],
    ids=["stats-object", "count-string", "uint-negative", "uint-overflow", "float", "batch-obj"],
)
def test_statistics_to_proto_wrong_types(obj: Any) -> None:
    with pytest.raises(CodecError, match="cannot convert the model statistics to gRPC"):
        side.statistics_to_proto(obj)


# --------------------------------------------------------------------------- repository index

INDEX: list[dict[str, Any]] = [
    {"name": "simple", "version": "1", "state": "READY"},
    {"name": "broken", "version": "3", "state": "UNAVAILABLE", "reason": "load failed: é"},
    {"name": "not_loaded"},
]


def test_index_both_ways() -> None:
    msg = side.index_to_proto(INDEX)
    wire = _cross(msg, triton_pb.RepositoryIndexResponse)
    assert [(m.name, m.version, m.state, m.reason) for m in wire.models] == [
        ("simple", "1", "READY", ""),
        ("broken", "3", "UNAVAILABLE", "load failed: é"),
        ("not_loaded", "", "", ""),
    ]
    assert side.index_to_json(_cross(wire, pb.RepositoryIndexResponse)) == INDEX


def test_index_ignores_unknown_fields_and_non_lists() -> None:
    msg = side.index_to_proto([{"name": "a", "extra": [1]}])
    assert side.index_to_json(msg) == [{"name": "a"}]
    assert side.index_to_json(side.index_to_proto({"models": INDEX})) == []
    assert side.index_to_json(side.index_to_proto(None)) == []


@pytest.mark.parametrize("obj", [[5], [{"name": 1}], [{"state": ["READY"]}]])
def test_index_wrong_types(obj: Any) -> None:
    with pytest.raises(CodecError, match="cannot convert the repository index to gRPC"):
        side.index_to_proto(obj)


# --------------------------------------------------------------------------- repository params

ONNX = b"\x08\x07\x00\xff\xfe binary model"
CONFIG = '{"backend": "onnxruntime", "max_batch_size": 0}'


def test_repository_params_grpc_to_rest() -> None:
    # as tritonclient.grpc's load_model builds it (config + files), plus the other kinds
    req = triton_pb.RepositoryModelLoadRequest(model_name="m")
    req.parameters["config"].string_param = CONFIG
    req.parameters["file:1/model.onnx"].bytes_param = ONNX
    req.parameters["file:empty"].bytes_param = b""
    req.parameters["unload_dependents"].bool_param = True
    req.parameters["n"].int64_param = -(2**63)
    req.parameters["unset"].SetInParent()
    ours = _cross(req, pb.RepositoryModelLoadRequest)
    assert side.repository_params_to_json(ours.parameters) == {
        "config": CONFIG,
        "file:1/model.onnx": base64.b64encode(ONNX).decode(),
        "file:empty": "",
        "unload_dependents": True,
        "n": -(2**63),
    }


def test_repository_params_rest_to_grpc() -> None:
    body = {
        "parameters": {
            "config": CONFIG,
            "file:1/model.onnx": base64.b64encode(ONNX).decode(),
            "unload_dependents": False,
            "n": 2**63 - 1,
            "not_a_file": base64.b64encode(b"x").decode(),
        }
    }
    req = pb.RepositoryModelLoadRequest(model_name="m")
    side.repository_params_to_proto(body, req.parameters)
    wire = _cross(req, triton_pb.RepositoryModelLoadRequest)
    p = wire.parameters
    assert {k: v.WhichOneof("parameter_choice") for k, v in p.items()} == {
        "config": "string_param",
        "file:1/model.onnx": "bytes_param",
        "unload_dependents": "bool_param",
        "n": "int64_param",
        "not_a_file": "string_param",
    }
    assert p["file:1/model.onnx"].bytes_param == ONNX
    assert p["config"].string_param == CONFIG
    assert p["unload_dependents"].bool_param is False
    assert p["n"].int64_param == 2**63 - 1
    assert p["not_a_file"].string_param == "eA=="
    # and back
    back = side.repository_params_to_json(_cross(wire, pb.RepositoryModelLoadRequest).parameters)
    assert back == body["parameters"]


@pytest.mark.parametrize("obj", [None, {}, {"parameters": {}}, [], "x"])
def test_repository_params_nothing_to_do(obj: Any) -> None:
    req = pb.RepositoryModelUnloadRequest()
    side.repository_params_to_proto(obj, req.parameters)
    assert len(req.parameters) == 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"file:1/m": "not base64!"}, "parameter 'file:1/m' must hold base64 file contents"),
        ({"file:1/m": "abc"}, "parameter 'file:1/m' must hold base64 file contents"),
        ({"file:1/m": "é"}, "parameter 'file:1/m' must hold base64 file contents"),
        ({"x": 1.5}, "parameter 'x' must be a boolean, an integer or a string"),
        ({"x": None}, "parameter 'x' must be a boolean, an integer or a string"),
        ({"x": [1]}, "parameter 'x' must be a boolean, an integer or a string"),
        ({"x": 2**63}, "parameter 'x' is out of the range of int64"),
        ({"x": -(2**63) - 1}, "parameter 'x' is out of the range of int64"),
    ],
    ids=["b64-chars", "b64-padding", "b64-non-ascii", "float", "null", "list", "big", "small"],
)
def test_repository_params_errors(params: dict[str, Any], message: str) -> None:
    req = pb.RepositoryModelLoadRequest()
    with pytest.raises(CodecError) as info:
        side.repository_params_to_proto({"parameters": params}, req.parameters)
    assert message in str(info.value)


def test_repository_params_not_an_object() -> None:
    req = pb.RepositoryModelLoadRequest()
    with pytest.raises(CodecError, match="Unable to parse 'parameters': expected a JSON object"):
        side.repository_params_to_proto({"parameters": ["config"]}, req.parameters)


# --------------------------------------------------------------------------- trace settings


def test_trace_settings_grpc_to_rest() -> None:
    # as tritonclient.grpc's update_trace_settings builds it: None clears a setting
    req = triton_pb.TraceSettingRequest(model_name="simple")
    for key, value in {
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_rate": "1000",
        "trace_file": None,
    }.items():
        if value is None:
            req.settings[key].SetInParent()
        else:
            req.settings[key].value.extend(value if isinstance(value, list) else [value])
    ours = _cross(req, pb.TraceSettingRequest)
    assert side.trace_settings_to_json(ours.settings) == {
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_rate": ["1000"],
        "trace_file": None,
    }


def test_trace_settings_rest_to_grpc() -> None:
    # Triton's REST answer: some settings lists, some plain strings
    obj = {
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_rate": "1000",
        "trace_count": -1,
        "log_frequency": "0",
        "trace_file": "",
        "trace_mode": "triton",
        "cleared": None,
        "mixed": ["a", None, 2],
    }
    msg = side.trace_settings_to_proto(obj)
    wire = _cross(msg, triton_pb.TraceSettingResponse)
    assert {k: list(v.value) for k, v in wire.settings.items()} == {
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_rate": ["1000"],
        "trace_count": ["-1"],
        "log_frequency": ["0"],
        "trace_file": [""],
        "trace_mode": ["triton"],
        "cleared": [],
        "mixed": ["a", "2"],
    }


@pytest.mark.parametrize("obj", [None, [], "x"])
def test_trace_settings_rest_not_an_object(obj: Any) -> None:
    assert side.trace_settings_to_proto(obj) == pb.TraceSettingResponse()


# --------------------------------------------------------------------------- log settings


def test_log_settings_grpc_to_rest() -> None:
    # as tritonclient.grpc's update_log_settings builds it
    req = triton_pb.LogSettingsRequest()
    req.settings["log_file"].string_param = ""
    req.settings["log_format"].string_param = "ISO8601"
    req.settings["log_verbose_level"].uint32_param = 2**32 - 1
    req.settings["log_info"].bool_param = True
    req.settings["log_error"].bool_param = False
    req.settings["log_warning"].SetInParent()
    ours = _cross(req, pb.LogSettingsRequest)
    assert side.log_settings_to_json(ours.settings) == {
        "log_file": "",
        "log_format": "ISO8601",
        "log_verbose_level": 2**32 - 1,
        "log_info": True,
        "log_error": False,
        "log_warning": None,
    }


def test_log_settings_rest_to_grpc() -> None:
    obj = {
        "log_file": "",
        "log_info": True,
        "log_warning": False,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
        "big": 2**32,
        "negative": -1,
    }
    msg = side.log_settings_to_proto(obj)
    wire = _cross(msg, triton_pb.LogSettingsResponse)
    got = {
        k: (v.WhichOneof("parameter_choice"), getattr(v, str(v.WhichOneof("parameter_choice"))))
        for k, v in wire.settings.items()
    }
    assert got == {
        "log_file": ("string_param", ""),
        "log_info": ("bool_param", True),
        "log_warning": ("bool_param", False),
        "log_error": ("bool_param", True),
        "log_verbose_level": ("uint32_param", 0),
        "log_format": ("string_param", "default"),
        "big": ("string_param", "4294967296"),
        "negative": ("string_param", "-1"),
    }
    # and back: the REST form again (uint32 out of range came as text)
    back = side.log_settings_to_json(_cross(wire, pb.LogSettingsResponse).settings)
    assert back == obj | {"big": "4294967296", "negative": "-1"}


@pytest.mark.parametrize("obj", [None, [], "x"])
def test_log_settings_rest_not_an_object(obj: Any) -> None:
    assert side.log_settings_to_proto(obj) == pb.LogSettingsResponse()
