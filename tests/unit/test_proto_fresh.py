"""The committed protocol code is what ``tools/gen_proto.sh`` makes of the committed ``.proto``
files (a stale commit fails here), our messages agree with tritonclient's on every field we
define (name, number, type, cardinality, enum values), and both sets of messages load into one
process without a descriptor-pool clash.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2 as triton_mc
from tritonclient.grpc import service_pb2 as triton_pb

from v2proxy._proto import POOL, grpc_service_pb2, health_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "src" / "v2proxy" / "_proto"
GENERATED = ["grpc_service_pb2.py", "grpc_service_pb2.pyi", "health_pb2.py", "health_pb2.pyi"]


# --------------------------------------------------------------------------- freshness


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("proto")
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(ROOT / "tools" / "gen_proto.sh"), str(out)],
        check=True,
        env=env,
        capture_output=True,
        timeout=120,
    )
    return out


def test_regeneration_makes_exactly_the_committed_files(regenerated: Path) -> None:
    made = sorted(p.name for p in regenerated.iterdir())
    assert made == sorted(GENERATED)
    committed = sorted(p.name for p in PROTO_DIR.glob("*_pb2.py*"))
    assert committed == sorted(GENERATED)


@pytest.mark.parametrize("name", GENERATED)
def test_committed_file_is_fresh(regenerated: Path, name: str) -> None:
    fresh = (regenerated / name).read_bytes()
    committed = (PROTO_DIR / name).read_bytes()
    assert committed == fresh, f"{name} is stale: run tools/gen_proto.sh and commit the result"


@pytest.mark.parametrize("name", ["grpc_service_pb2.py", "health_pb2.py"])
def test_generated_code_uses_the_private_pool(name: str) -> None:
    text = (PROTO_DIR / name).read_text()
    assert "from v2proxy._proto import POOL as _POOL" in text
    assert "_POOL.AddSerializedFile(" in text
    assert "_descriptor_pool.Default()" not in text


# --------------------------------------------------------------------------- agreement


def _compare_enum(ours: EnumDescriptor, theirs: EnumDescriptor, path: str) -> None:
    assert ours.full_name == theirs.full_name, path
    for value in ours.values:
        other = theirs.values_by_name.get(value.name)
        assert other is not None, f"{path}: enum value {value.name} unknown to tritonclient"
        assert value.number == other.number, f"{path}.{value.name}"


def _compare(ours: Descriptor, theirs: Descriptor, path: str, seen: set[str]) -> int:
    """Compare every field of ``ours`` with ``theirs``, recursively; the number of fields."""
    assert ours.full_name == theirs.full_name, path
    if ours.full_name in seen:
        return 0
    seen.add(ours.full_name)
    checked = 0
    for fd in ours.fields:
        where = f"{path}.{fd.name}"
        other = theirs.fields_by_name.get(fd.name)
        assert other is not None, f"{where}: not a field of tritonclient's {theirs.full_name}"
        assert fd.number == other.number, where
        assert fd.type == other.type, where
        assert fd.is_repeated == other.is_repeated, where
        oneof = fd.containing_oneof.name if fd.containing_oneof else None
        their_oneof = other.containing_oneof.name if other.containing_oneof else None
        assert oneof == their_oneof, where
        checked += 1
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            checked += _compare(fd.message_type, other.message_type, where, seen)
        elif fd.type == FieldDescriptor.TYPE_ENUM:
            _compare_enum(fd.enum_type, other.enum_type, where)
    return checked


@pytest.mark.parametrize(
    ("name", "theirs"),
    [
        ("ModelInferRequest", triton_pb.ModelInferRequest.DESCRIPTOR),
        ("ModelInferResponse", triton_pb.ModelInferResponse.DESCRIPTOR),
        ("ModelStreamInferResponse", triton_pb.ModelStreamInferResponse.DESCRIPTOR),
        ("ModelConfig", triton_mc.ModelConfig.DESCRIPTOR),
    ],
)
def test_core_messages_agree_with_tritonclient(name: str, theirs: Descriptor) -> None:
    ours = getattr(grpc_service_pb2, name).DESCRIPTOR
    assert _compare(ours, theirs, name, set()) > 5


def _theirs(name: str) -> Descriptor:
    for module in (triton_pb, triton_mc):
        if name in module.DESCRIPTOR.message_types_by_name:
            return module.DESCRIPTOR.message_types_by_name[name]
    raise AssertionError(f"tritonclient has no message inference.{name}")


@pytest.mark.parametrize("name", sorted(grpc_service_pb2.DESCRIPTOR.message_types_by_name))
def test_every_message_agrees_with_tritonclient(name: str) -> None:
    ours = grpc_service_pb2.DESCRIPTOR.message_types_by_name[name]
    _compare(ours, _theirs(name), name, set())


@pytest.mark.parametrize("name", sorted(grpc_service_pb2.DESCRIPTOR.enum_types_by_name))
def test_top_level_enums_agree_with_tritonclient(name: str) -> None:
    ours = grpc_service_pb2.DESCRIPTOR.enum_types_by_name[name]
    _compare_enum(ours, triton_mc.DESCRIPTOR.enum_types_by_name[name], name)


def _mutated(message: str, field: str, change: str, root: str) -> Descriptor:
    """Our file with one field of one (possibly nested) message changed, in a pool of its own;
    the message ``root`` of that file is returned."""
    fdp = descriptor_pb2.FileDescriptorProto()
    grpc_service_pb2.DESCRIPTOR.CopyToProto(fdp)
    top, *nested = message.split(".")
    msg = next(m for m in fdp.message_type if m.name == top)
    for name in nested:
        msg = next(m for m in msg.nested_type if m.name == name)
    fd = next(f for f in msg.field if f.name == field)
    if change == "number":
        fd.number += 100
    elif change == "type":
        fd.type = descriptor_pb2.FieldDescriptorProto.TYPE_INT32
    elif change == "label":
        fd.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    else:
        fd.name = change
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool.FindMessageTypeByName(f"inference.{root}")


@pytest.mark.parametrize(
    ("message", "field", "change", "root", "theirs"),
    [
        ("ModelInferRequest", "raw_input_contents", "number", "ModelInferRequest", triton_pb),
        ("ModelInferRequest.InferInputTensor", "shape", "type", "ModelInferRequest", triton_pb),
        ("ModelInferResponse", "raw_output_contents", "label", "ModelInferResponse", triton_pb),
        ("InferTensorContents", "uint64_contents", "number", "ModelStreamInferResponse", triton_pb),
        ("InferParameter", "uint64_param", "number", "ModelInferResponse", triton_pb),
        ("ModelConfig", "max_batch_size", "max_batch", "ModelConfig", triton_mc),
        ("ModelInput", "dims", "type", "ModelConfig", triton_mc),
        ("ModelTransactionPolicy", "decoupled", "number", "ModelConfig", triton_mc),
    ],
)
def test_the_comparison_catches_a_difference(
    message: str, field: str, change: str, root: str, theirs: Any
) -> None:
    ours = _mutated(message, field, change, root)
    renamed = change not in ("number", "type", "label")
    with pytest.raises(AssertionError, match=change if renamed else field):
        _compare(ours, getattr(theirs, root).DESCRIPTOR, root, set())


def test_service_methods_agree_with_tritonclient() -> None:
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    assert len(ours.methods) == 20
    for m in ours.methods:
        other = theirs.methods_by_name.get(m.name)
        assert other is not None, m.name
        assert m.input_type.full_name == other.input_type.full_name, m.name
        assert m.output_type.full_name == other.output_type.full_name, m.name
        assert (m.client_streaming, m.server_streaming) == (
            other.client_streaming,
            other.server_streaming,
        ), m.name


def test_health_messages_are_grpc_health_v1() -> None:
    svc = health_pb2.DESCRIPTOR.services_by_name["Health"]
    assert svc.full_name == "grpc.health.v1.Health"
    assert [m.name for m in svc.methods] == ["Check", "Watch"]
    req = health_pb2.HealthCheckRequest.DESCRIPTOR
    assert [(f.name, f.number, f.type) for f in req.fields] == [
        ("service", 1, FieldDescriptor.TYPE_STRING)
    ]
    status = health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"]
    assert (status.number, status.type) == (1, FieldDescriptor.TYPE_ENUM)
    assert {v.name: v.number for v in status.enum_type.values} == {
        "UNKNOWN": 0,
        "SERVING": 1,
        "NOT_SERVING": 2,
        "SERVICE_UNKNOWN": 3,
    }


def test_messages_cross_the_wire_both_ways() -> None:
    theirs = triton_pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x00\x01"])
    theirs.inputs.add(name="X", datatype="UINT8", shape=[2]).parameters["p"].uint64_param = (
        2**64 - 1
    )
    ours = grpc_service_pb2.ModelInferRequest.FromString(theirs.SerializeToString())
    assert ours.inputs[0].parameters["p"].uint64_param == 2**64 - 1
    assert triton_pb.ModelInferRequest.FromString(ours.SerializeToString()) == theirs


# --------------------------------------------------------------------------- coexistence


def test_pools_are_separate() -> None:
    ours = grpc_service_pb2.ModelInferRequest.DESCRIPTOR
    theirs = triton_pb.ModelInferRequest.DESCRIPTOR
    assert ours.full_name == theirs.full_name == "inference.ModelInferRequest"
    assert ours.file.pool is POOL
    assert POOL is not descriptor_pool.Default()
    assert descriptor_pool.Default().FindMessageTypeByName("inference.ModelInferRequest") is theirs
    assert POOL.FindMessageTypeByName("inference.ModelInferRequest") is ours
    assert grpc_service_pb2.ModelInferRequest is not triton_pb.ModelInferRequest


_IMPORT_BOTH = """
import sys
order = sys.argv[1]
def ours():
    from v2proxy._proto import grpc_service_pb2, health_pb2
    return grpc_service_pb2
def theirs():
    from tritonclient.grpc import model_config_pb2, service_pb2
    import tritonclient.grpc
    return service_pb2
a, b = (ours(), theirs()) if order == "ours-first" else (theirs(), ours())
assert a.ModelConfigResponse is not b.ModelConfigResponse
print("ok", a.ModelConfigResponse.DESCRIPTOR.full_name, b.ModelConfigResponse.DESCRIPTOR.full_name)
"""


@pytest.mark.parametrize("order", ["ours-first", "theirs-first"])
def test_both_import_in_one_process(order: str) -> None:
    # a fresh interpreter each: in this one the import order is already fixed
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", _IMPORT_BOTH, order],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "ok",
        "inference.ModelConfigResponse",
        "inference.ModelConfigResponse",
    ]
