"""The gRPC pass-through against a real Triton: a ModelInfer through v2proxy ``--backend
grpc://…`` is relayed, so its answer is byte for byte Triton's own answer to the same serialized
request; a malformed message is INVALID_ARGUMENT from v2proxy; a request with a
``classification`` parameter takes the full path and is answered as Triton answers it.

ModelStreamInfer likewise, in front of Triton and of ``v2proxy reference-server``: each message
of a model that is not decoupled is relayed, and its answer on the stream is the backend's own
answer byte for byte, inside the ModelStreamInferResponse (Triton's ModelInfer answer; Triton's
own stream answers carry ``triton_final_response`` besides, which v2proxy never added, before
this pass-through or since); tritonclient's stream API gets the same messages as from the
backend directly; a decoupled model still streams its responses (re-encoded, as before); a
malformed message is refused in band and the stream goes on; the backend's refusal comes back
in band with Triton's text."""

from __future__ import annotations

import contextlib
import queue
import urllib.request
from functools import partial
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import Servers, _proxy
from procs import Proc
from simple_io import IN0, IN1

from v2proxy._proto import grpc_service_pb2 as pb

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
_FINAL = "triton_final_response"


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


# --------------------------------------------------------------------------- ModelStreamInfer


@pytest.fixture(params=["triton", "reference"])
def stream_backend(
    request: pytest.FixtureRequest,
    stack: contextlib.ExitStack,
    servers: Servers,
    proxies: dict[tuple[str, str], Proc],
    backend_urls: Any,
) -> tuple[Proc, str]:
    """(v2proxy in front of the backend over gRPC (uvloop), the backend's gRPC address)."""
    name: str = request.param
    return _proxy((f"{name}-grpc", "uvloop"), stack, servers, proxies), backend_urls(name)[1]


def _raw_stream(target: str, messages: list[bytes]) -> list[bytes]:
    """``messages`` as they are on one ModelStreamInfer; every answer's bytes as they came."""
    with grpc.insecure_channel(target) as channel:
        return list(channel.stream_stream(STREAM)(iter(messages), timeout=30))


def _inner(answer: bytes) -> bytes:
    """The ModelInferResponse's bytes inside a serialized ModelStreamInferResponse, cut out
    of it unparsed (its field 2, tag 0x12, and a varint length)."""
    assert answer[0] == 0x12, answer[:8]
    size, shift, i = 0, 0, 1
    while True:
        byte = answer[i]
        size |= (byte & 0x7F) << shift
        shift, i = shift + 7, i + 1
        if byte < 0x80:
            break
    assert len(answer) == i + size  # nothing else in it: no error_message
    return answer[i:]


def _without_final(answer: pb.ModelInferResponse) -> bytes:
    answer.parameters.pop(_FINAL, None)
    return answer.SerializeToString()


_BACKEND_CALLS = "v2proxy_backend_request_duration_seconds_count"


def _backend_calls(proxy: Proc, operation: str) -> float:
    """The proxy's backend calls of ``operation`` for ``simple`` so far (its /metrics)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(proxy.base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    labels = (f'operation="{operation}"', 'model="simple"')
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(_BACKEND_CALLS + "{") and all(label in line for label in labels)
    )


def test_streamed_answers_are_the_backends_byte_for_byte(
    stream_backend: tuple[Proc, str],
) -> None:
    """Relayed (the proxy's metrics count them as relayed inferences, not streams): each
    answer inside its wrapper is the backend's ModelInfer answer to the same bytes."""
    proxy, direct = stream_backend
    relayed, streamed = _backend_calls(proxy, "relay_infer"), _backend_calls(proxy, "stream_infer")
    messages = []
    for i in range(4):
        msg = _simple()
        msg.id = f"s{i}"
        msg.raw_input_contents[0] = (IN0 + i).tobytes()
        messages.append(msg.SerializeToString())
    proxied = {
        pb.ModelStreamInferResponse.FromString(a).infer_response.id: _inner(a)
        for a in _raw_stream(proxy.grpc_url, messages)
    }
    assert sorted(proxied) == ["s0", "s1", "s2", "s3"]
    assert _backend_calls(proxy, "relay_infer") == relayed + 4
    assert _backend_calls(proxy, "stream_infer") == streamed
    for i, data in enumerate(messages):
        # the backend's ModelInfer answer to the same bytes, byte for byte
        assert proxied[f"s{i}"] == _raw_call(direct, data)
    own = [pb.ModelStreamInferResponse.FromString(a) for a in _raw_stream(direct, messages)]
    for answer in own:
        # the backend's own stream answers: the same, but for Triton's final-response flag
        assert answer.error_message == ""
        assert _without_final(answer.infer_response) == proxied[answer.infer_response.id]
    s3 = pb.ModelInferResponse.FromString(proxied["s3"])
    outputs = dict(zip((o.name for o in s3.outputs), s3.raw_output_contents, strict=True))
    out0 = np.frombuffer(outputs["OUTPUT0"], np.int32)
    assert out0.tolist() == (IN0 + 3 + IN1).ravel().tolist()


def _client_stream(
    target: str, requests: list[tuple[str, list[grpcclient.InferInput], str]], **kw: Any
) -> list[tuple[Any, Any]]:
    """tritonclient's stream API: each (model, inputs, request id) sent with
    ``async_stream_infer``; (result, error) of every callback, as many as requests."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(target) as c:
        c.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
        try:
            for model, inputs, rid in requests:
                c.async_stream_infer(model, inputs, request_id=rid, **kw)
            return [results.get(timeout=30) for _ in requests]
        finally:
            c.stop_stream()


def _simple_inputs(shift: int, size: int = 16) -> list[grpcclient.InferInput]:
    a = grpcclient.InferInput("INPUT0", [1, size], "INT32")
    a.set_data_from_numpy((IN0 + shift)[:, :size])
    b = grpcclient.InferInput("INPUT1", [1, size], "INT32")
    b.set_data_from_numpy(IN1[:, :size])
    return [a, b]


def test_tritonclient_stream_gets_the_backends_answers(
    stream_backend: tuple[Proc, str],
) -> None:
    """tritonclient's start_stream / async_stream_infer through v2proxy: the same answers as
    from the backend directly, and the backend's refusal (a wrong shape) in band with its
    text, the stream going on."""
    proxy, direct = stream_backend
    requests = [("simple", _simple_inputs(i), f"t{i}") for i in range(3)]
    requests.append(("simple", _simple_inputs(0, 8), "bad"))
    got = {}
    for target in (proxy.grpc_url, direct):
        answers: dict[str, Any] = {}
        for result, error in _client_stream(target, requests):
            if error is not None:
                answers["bad"] = str(error)
            else:
                answers[result.get_response().id] = _without_final(result.get_response())
        got[target] = answers
    assert sorted(got[proxy.grpc_url]) == ["bad", "t0", "t1", "t2"]
    assert got[proxy.grpc_url] == got[direct]
    assert "unexpected shape for input" in got[proxy.grpc_url]["bad"]


def test_decoupled_model_still_streams(triton_grpc: Proc, backend_urls) -> None:  # type: ignore[no-untyped-def]
    """The decoupled llm is never relayed: its responses come over the backend's stream, one
    per token, as from Triton directly (but for Triton's final-response flag)."""
    msg = pb.ModelInferRequest(model_name="llm", id="g")
    msg.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    msg.raw_input_contents.append(len(b"the quick fox").to_bytes(4, "little") + b"the quick fox")
    msg.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    msg.raw_input_contents.append(np.int32(3).tobytes())
    msg.inputs.add(name="stream", datatype="BOOL", shape=[1])
    msg.raw_input_contents.append(b"\x01")
    data = msg.SerializeToString()
    proxied = [
        pb.ModelStreamInferResponse.FromString(a) for a in _raw_stream(triton_grpc.grpc_url, [data])
    ]
    direct = [
        pb.ModelStreamInferResponse.FromString(a)
        for a in _raw_stream(backend_urls("triton")[1], [data])
    ]
    assert [a.infer_response.raw_output_contents[0][4:] for a in proxied] == [
        b"the",
        b" quick",
        b" fox",
    ]
    assert [a.infer_response.SerializeToString() for a in proxied] == [
        _without_final(a.infer_response) for a in direct
    ]


def test_malformed_stream_message_is_refused_in_band(triton_grpc: Proc, backend_urls) -> None:  # type: ignore[no-untyped-def]
    good = _simple().SerializeToString()
    answers = [
        pb.ModelStreamInferResponse.FromString(a)
        for a in _raw_stream(triton_grpc.grpc_url, [b"\xff\xff\xff", good])
    ]
    errors = [a.error_message for a in answers if a.error_message]
    assert len(errors) == 1 and errors[0].startswith("malformed ModelStreamInfer request")
    (answer,) = [a.infer_response for a in answers if not a.error_message]
    assert answer.SerializeToString() == _raw_call(backend_urls("triton")[1], good)
