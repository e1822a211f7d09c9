"""The gRPC pass-through against a real Triton: a ModelInfer through v2proxy ``--backend
grpc://…`` is relayed, so its answer is byte for byte Triton's own answer to the same serialized
request; a malformed message is INVALID_ARGUMENT from v2proxy; a request with a
``classification`` parameter takes the full path and is answered as Triton answers it."""

from __future__ import annotations

import contextlib

import grpc
import numpy as np
import pytest
from conftest import Servers, _proxy
from procs import Proc
from simple_io import IN0, IN1

from v2proxy._proto import grpc_service_pb2 as pb

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture
def triton_grpc(
    stack: contextlib.ExitStack, servers: Servers, proxies: dict[tuple[str, str], Proc]
) -> Proc:
    """v2proxy in front of Triton over gRPC (uvloop), shared with the ``proxy`` fixture's."""
    return _proxy(("triton-grpc", "uvloop"), stack, servers, proxies)


def _raw_call(target: str, data: bytes) -> bytes:
    """One ModelInfer of ``data`` as it is; the answer's bytes as they came."""
    with grpc.insecure_channel(target) as channel:
        answer: bytes = channel.unary_unary(INFER)(data, timeout=30)
        return answer


def _simple() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="simple", id="r-7")
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    msg.raw_input_contents.extend([IN0.tobytes(), IN1.tobytes()])
    msg.outputs.add(name="OUTPUT1")
    msg.outputs.add(name="OUTPUT0")
    return msg


def test_relayed_answer_is_tritons_byte_for_byte(triton_grpc: Proc, backend_urls) -> None:  # type: ignore[no-untyped-def]
    data = _simple().SerializeToString()
    direct = _raw_call(backend_urls("triton")[1], data)
    proxied = _raw_call(triton_grpc.grpc_url, data)
    assert proxied == direct
    answer = pb.ModelInferResponse.FromString(proxied)
    outputs = {
        o.name: raw for o, raw in zip(answer.outputs, answer.raw_output_contents, strict=True)
    }
    assert sorted(outputs) == ["OUTPUT0", "OUTPUT1"]
    out1 = np.frombuffer(outputs["OUTPUT1"], np.int32)
    assert out1.tolist() == (IN0 - IN1).ravel().tolist()


def test_typed_contents_are_relayed(triton_grpc: Proc, backend_urls) -> None:  # type: ignore[no-untyped-def]
    """Typed contents, which the full path would send raw, reach Triton as sent."""
    msg = pb.ModelInferRequest(model_name="simple")
    for name, values in (("INPUT0", IN0), ("INPUT1", IN1)):
        t = msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.int_contents.extend(values.ravel().tolist())
    data = msg.SerializeToString()
    assert _raw_call(triton_grpc.grpc_url, data) == _raw_call(backend_urls("triton")[1], data)


def test_malformed_is_invalid_argument(triton_grpc: Proc) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _raw_call(triton_grpc.grpc_url, b"\xff\xff\xff")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "malformed ModelInfer request" in info.value.details()  # type: ignore[attr-defined]


def test_classification_takes_the_full_path(triton_grpc: Proc, backend_urls) -> None:  # type: ignore[no-untyped-def]
    """Triton classifies itself: the parameter passes through on the full path (re-encoded),
    and the answer's outputs are Triton's."""
    msg = pb.ModelInferRequest(model_name="classifier", id="c-1")
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 10])
    msg.raw_input_contents.append(np.linspace(0, 1, 10, dtype="<f4").tobytes())
    msg.outputs.add(name="SCORES").parameters["classification"].int64_param = 3
    data = msg.SerializeToString()
    direct = pb.ModelInferResponse.FromString(_raw_call(backend_urls("triton")[1], data))
    proxied = pb.ModelInferResponse.FromString(_raw_call(triton_grpc.grpc_url, data))
    assert [(o.name, o.datatype, list(o.shape)) for o in proxied.outputs] == [
        (o.name, o.datatype, list(o.shape)) for o in direct.outputs
    ]
    assert list(proxied.raw_output_contents) == list(direct.raw_output_contents)
    assert proxied.id == "c-1"
