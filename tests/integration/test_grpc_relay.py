"""A gRPC ModelInfer relayed to a gRPC backend (the pass-through): v2proxy's gRPC frontend in
process in front of a recording gRPC model server in process.

What it shows: a message no stage applies to reaches the backend byte for byte as the client
sent it (typed ``contents``, which the full path would move into ``raw_input_contents``) and the
backend's answer comes back byte for byte (typed ``contents`` too, which the full path would
re-encode as raw); the client's metadata is forwarded; a malformed message, a reserved parameter
or one over --max-tensors is refused and never reaches the backend; --backend-timeout still
gives DEADLINE_EXCEEDED; a request with a ``classification`` parameter still goes the full path
and is answered classified.

The same for each message of a ModelStreamInfer stream (its model not decoupled): relayed byte
for byte, the backend's answer wrapped into its ModelStreamInferResponse without being parsed
(the answer's own bytes inside it), finished as the full path does when it is not what that
path would answer; a client that asks for the final-response flag goes the full path (the
flag's parameter set on its answer); a malformed message, a reserved parameter and a
--backend-timeout come back in band as before, or as the stream's status with
``triton_grpc_error``.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from tests.integration.conftest import grpc_frontend, settings
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.app_core import build_backend, build_pipeline
from v2proxy.codecs.grpc import stream_response_bytes

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops

SERVICE = "inference.GRPCInferenceService"
INFER = f"/{SERVICE}/ModelInfer"
STREAM = f"/{SERVICE}/ModelStreamInfer"


def _answer(model: str) -> bytes:
    """The backend's answer to ``model``: ``m``'s is what the full path would answer, its fields
    in an order protobuf never writes (the raw contents first), so that only a relay keeps its
    bytes; ``extra`` answers an output more than asked for (as KServe does), ``typed`` answers
    in typed contents (which the full path answers raw)."""
    head = pb.ModelInferResponse(model_name=model, model_version="1", id="rid")
    head.outputs.add(name="OUT0", datatype="FP32", shape=[1, 4])
    values = [0.5, 3.0, 1.5, 2.0]
    data = struct.pack("<4f", *values)
    if model == "typed":
        head.outputs[0].contents.fp32_contents.extend(values)
        return head.SerializeToString()
    raw = pb.ModelInferResponse(raw_output_contents=[data])
    if model == "extra":
        head.outputs.add(name="OUT1", datatype="FP32", shape=[1, 4])
        raw.raw_output_contents.append(data)
    return raw.SerializeToString() + head.SerializeToString()


ANSWER = _answer("m")


@dataclass
class Recorder:
    """What the backend got: each ModelInfer's bytes and metadata."""

    messages: list[bytes] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def backend() -> AsyncIterator[tuple[str, Recorder]]:
    """A gRPC model server with model ``m`` (``slow`` answers after 10 s), recording every
    ModelInfer; it lists no extension, so the proxy classifies."""
    seen = Recorder()

    async def infer(data: bytes, context: Any) -> bytes:
        seen.messages.append(data)
        seen.metadata.append({k: v for k, v in context.invocation_metadata() or ()})
        model = pb.ModelInferRequest.FromString(data).model_name
        if model == "slow":
            await asyncio.sleep(10)
        return _answer(model)

    async def server_metadata(_r: Any, _c: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="fake", version="1")

    async def model_metadata(r: Any, _c: Any) -> pb.ModelMetadataResponse:
        return pb.ModelMetadataResponse(name=r.name, versions=["1"], platform="fake")

    async def model_config(r: Any, _c: Any) -> pb.ModelConfigResponse:
        resp = pb.ModelConfigResponse()
        resp.config.name = r.name
        return resp

    def unary(fn: Any, req: Any, resp: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "ModelInfer": grpc.unary_unary_rpc_method_handler(infer),
                    "ServerMetadata": unary(
                        server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse
                    ),
                    "ModelMetadata": unary(
                        model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse
                    ),
                    "ModelConfig": unary(
                        model_config, pb.ModelConfigRequest, pb.ModelConfigResponse
                    ),
                },
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"grpc://127.0.0.1:{port}", seen
    finally:
        await server.stop(0)


def _request(model: str = "m", n_inputs: int = 1) -> pb.ModelInferRequest:
    """A request whose input is in typed contents (the full path would send it raw)."""
    msg = pb.ModelInferRequest(model_name=model, id="rid")
    for i in range(n_inputs):
        t = msg.inputs.add(name=f"IN{i}", datatype="INT32", shape=[1, 4])
        t.contents.int_contents.extend([1, 2, 3, 4])
    msg.outputs.add(name="OUT0")
    return msg


async def _call(
    url: str, data: bytes, metadata: tuple[tuple[str, str], ...] = (), **overrides: Any
) -> bytes:
    """One ModelInfer of ``data`` (bytes, as sent) through v2proxy; the answer's bytes."""
    s = settings(backend=url, **overrides)
    proxied = build_backend(s)
    await proxied.start()
    try:
        async with grpc_frontend(s, build_pipeline(s, proxied)) as channel:
            call = channel.unary_unary(INFER)  # bytes in, bytes out
            answer: bytes = await call(data, metadata=metadata, timeout=30)
            return answer
    finally:
        await proxied.close()


async def test_relayed_byte_for_byte_with_metadata(backend: tuple[str, Recorder]) -> None:
    url, seen = backend
    data = _request().SerializeToString()
    meta = (("x-request-id", "r-42"), ("authorization", "Bearer t"))
    answer = await _call(url, data, meta)
    assert answer == ANSWER  # its fields' order: the full path would have re-encoded it
    assert pb.ModelInferResponse.FromString(answer).SerializeToString() != ANSWER
    assert seen.messages == [data]  # likewise the request's typed contents
    assert seen.metadata[0]["x-request-id"] == "r-42"
    assert seen.metadata[0]["authorization"] == "Bearer t"


@pytest.mark.parametrize("model", ["extra", "typed"])
async def test_answer_not_as_the_full_path_is_finished(
    backend: tuple[str, Recorder], model: str
) -> None:
    """A relayed request whose answer is not what the full path would answer (an output not
    asked for, typed contents) gets the full path's answer: the request was relayed, the
    answer decoded, finished and encoded."""
    url, seen = backend
    data = _request(model).SerializeToString()
    answer = pb.ModelInferResponse.FromString(await _call(url, data))
    assert seen.messages == [data]  # relayed
    assert [o.name for o in answer.outputs] == ["OUT0"]
    assert not answer.outputs[0].HasField("contents")
    assert list(answer.raw_output_contents) == [struct.pack("<4f", 0.5, 3.0, 1.5, 2.0)]
    assert (answer.model_name, answer.id) == (model, "rid")


@pytest.mark.parametrize(
    ("data", "overrides", "text"),
    [
        (b"\xff\xff\xff", {}, "malformed ModelInfer request"),
        (
            pb.ModelInferRequest(
                model_name="m", parameters={"triton_x": pb.InferParameter(bool_param=True)}
            ).SerializeToString(),
            {},
            "reserved for Triton usage",
        ),
        (_request(n_inputs=3).SerializeToString(), {"max_tensors": 2}, "inputs"),
        (
            pb.ModelInferRequest(
                model_name="m",
                inputs=[pb.ModelInferRequest.InferInputTensor(name="IN0", datatype="INT32")],
            ).SerializeToString(),
            {},
            "unable to find data",
        ),
    ],
    ids=["malformed", "reserved", "max-tensors", "no-data"],
)
async def test_refused_never_reaches_the_backend(
    backend: tuple[str, Recorder], data: bytes, overrides: dict[str, Any], text: str
) -> None:
    url, seen = backend
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(url, data, **overrides)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in (info.value.details() or "")
    assert seen.messages == []


async def test_deadline_still_applies(backend: tuple[str, Recorder]) -> None:
    url, seen = backend
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(url, _request("slow").SerializeToString(), backend_timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "did not answer inference in time" in (info.value.details() or "")
    assert len(seen.messages) == 1  # it was relayed, and timed out


async def test_classification_goes_the_full_path(backend: tuple[str, Recorder]) -> None:
    url, seen = backend
    msg = _request()
    msg.outputs[0].parameters["classification"].int64_param = 2
    data = msg.SerializeToString()
    answer = pb.ModelInferResponse.FromString(await _call(url, data))
    assert seen.messages != [data]  # re-encoded: the proxy asked for the raw output
    sent = pb.ModelInferRequest.FromString(seen.messages[0])
    assert "classification" not in sent.outputs[0].parameters
    assert list(sent.raw_input_contents) == [
        bytes([1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0])
    ]
    (out,) = answer.outputs
    assert out.datatype == "BYTES"
    raw = answer.raw_output_contents[0]
    assert b"3.000000:1" in raw and b"2.000000:3" in raw


async def test_wire_only_parameter_goes_the_full_path(backend: tuple[str, Recorder]) -> None:
    """``binary_data`` on an output is left out by the full path's encoder: such a message is
    re-encoded rather than relayed with it."""
    url, seen = backend
    msg = _request()
    msg.outputs[0].parameters["binary_data"].bool_param = True
    await _call(url, msg.SerializeToString())
    sent = pb.ModelInferRequest.FromString(seen.messages[0])
    assert "binary_data" not in sent.outputs[0].parameters


async def test_decoupled_model_is_not_relayed() -> None:
    """A decoupled model's ModelInfer goes over the stream: the backend's relay facts say it is
    decoupled once its configuration is learnt, and the one decision declines the message
    (nothing is sent)."""
    from v2proxy.backends.grpc import GrpcBackend
    from v2proxy.core.decide import MESSAGE, relays

    proxied = GrpcBackend("127.0.0.1:1")

    async def model_config(_model: str, _version: str) -> dict[str, Any]:
        return {"model_transaction_policy": {"decoupled": True}}

    proxied.model_config = model_config  # type: ignore[method-assign]
    assert relays(MESSAGE, 5, proxied.relay_facts("llm", "")) is None  # not known yet
    facts = await proxied.learn_relay_facts("llm", "", "inference")
    assert facts.decoupled is True
    assert relays(MESSAGE, 5, facts, learnt=True) is False


# --------------------------------------------------------------------------- ModelStreamInfer


async def _stream(
    url: str,
    messages: list[bytes],
    metadata: tuple[tuple[str, str], ...] = (),
    **overrides: Any,
) -> list[bytes]:
    """``messages`` (bytes, as sent) on one ModelStreamInfer through v2proxy; every answer's
    bytes, in the order they came. A status that ends the stream is raised."""
    s = settings(backend=url, **overrides)
    proxied = build_backend(s)
    await proxied.start()
    try:
        async with grpc_frontend(s, build_pipeline(s, proxied)) as channel:
            call = channel.stream_stream(STREAM)(iter(messages), metadata=metadata, timeout=30)
            return [answer async for answer in call]
    finally:
        await proxied.close()


async def test_stream_relayed_byte_for_byte_with_metadata(backend: tuple[str, Recorder]) -> None:
    url, seen = backend
    data = _request().SerializeToString()
    answers = await _stream(url, [data] * 3, (("x-request-id", "r-42"),))
    # the backend's answer as it wrote it (its fields in an order protobuf never writes),
    # inside the wrapper: never parsed and serialized again
    assert answers == [stream_response_bytes(ANSWER)] * 3
    wrapped = pb.ModelStreamInferResponse.FromString(answers[0])
    assert wrapped.infer_response.SerializeToString() != ANSWER
    assert seen.messages == [data] * 3  # the request's typed contents too
    assert [m["x-request-id"] for m in seen.metadata] == ["r-42"] * 3


@pytest.mark.parametrize("model", ["extra", "typed"])
async def test_stream_answer_not_as_the_full_path_is_finished(
    backend: tuple[str, Recorder], model: str
) -> None:
    url, seen = backend
    data = _request(model).SerializeToString()
    (answer,) = await _stream(url, [data])
    resp = pb.ModelStreamInferResponse.FromString(answer)
    assert resp.error_message == ""
    out = resp.infer_response
    assert seen.messages == [data]  # relayed
    assert [o.name for o in out.outputs] == ["OUT0"]
    assert not out.outputs[0].HasField("contents")
    assert list(out.raw_output_contents) == [struct.pack("<4f", 0.5, 3.0, 1.5, 2.0)]
    assert (out.model_name, out.id) == (model, "rid")


async def test_stream_final_flag_goes_the_full_path(backend: tuple[str, Recorder]) -> None:
    """The final-response flag is the frontend's: the message is re-encoded without it and its
    one answer carries ``triton_final_response``."""
    url, seen = backend
    msg = _request()
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    (answer,) = await _stream(url, [msg.SerializeToString()])
    out = pb.ModelStreamInferResponse.FromString(answer).infer_response
    assert out.parameters["triton_final_response"].bool_param is True
    assert [o.name for o in out.outputs] == ["OUT0"]
    (sent,) = seen.messages
    assert (
        "triton_enable_empty_final_response" not in pb.ModelInferRequest.FromString(sent).parameters
    )


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"\xff\xff\xff", "malformed ModelStreamInfer request"),
        (
            pb.ModelInferRequest(
                model_name="m", parameters={"triton_x": pb.InferParameter(bool_param=True)}
            ).SerializeToString(),
            "reserved for Triton usage",
        ),
    ],
    ids=["malformed", "reserved"],
)
async def test_stream_refused_in_band_or_as_status(
    backend: tuple[str, Recorder], data: bytes, text: str
) -> None:
    """Refused in band, the next message still answered (relayed); as the stream's status
    with ``triton_grpc_error``. Neither reaches the backend."""
    url, seen = backend
    good = _request().SerializeToString()
    answers = await _stream(url, [data])
    (refusal,) = [pb.ModelStreamInferResponse.FromString(a) for a in answers]
    assert text in refusal.error_message
    assert not refusal.HasField("infer_response")
    assert seen.messages == []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _stream(url, [data], (("triton_grpc_error", "true"),))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in (info.value.details() or "")
    assert seen.messages == []
    assert await _stream(url, [good]) == [stream_response_bytes(ANSWER)]


async def test_stream_deadline_still_applies(backend: tuple[str, Recorder]) -> None:
    url, seen = backend
    (answer,) = await _stream(url, [_request("slow").SerializeToString()], backend_timeout=0.3)
    resp = pb.ModelStreamInferResponse.FromString(answer)
    assert "did not answer inference in time" in resp.error_message
    assert len(seen.messages) == 1  # it was relayed, and timed out


@pytest.mark.parametrize(
    ("streamed", "what"), [(False, "inference"), (True, "streaming inference")]
)
async def test_relay_message_names_the_clients_operation(streamed: bool, what: str) -> None:
    """Whether the model is decoupled is learnt before a message is relayed; a backend that
    cannot be reached then names the client's operation (``Relay.takes`` asks with it), as
    ``stream_infer`` did for a stream's message before its messages were relayed."""
    from v2proxy.backends.grpc import GrpcBackend
    from v2proxy.core.errors import BackendUnavailable

    proxied = GrpcBackend("127.0.0.1:1")
    await proxied.start()
    try:
        with pytest.raises(BackendUnavailable) as info:
            await proxied.learn_relay_facts("m", "", what)
    finally:
        await proxied.close()
    assert f"backend at 127.0.0.1:1 is unavailable for {what} of model 'm'" in str(info.value)
