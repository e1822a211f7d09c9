"""gRPC clients through v2proxy in front of every backend (builtin, reference server over REST
and gRPC, KServe, MLServer and Triton, each over REST and gRPC), on both event loops:
tritonclient.grpc (sync and aio) and KServe's InferenceGRPCClient."""

from __future__ import annotations

import json
import os
import queue
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from peers import launch
from procs import Proc
from simple_io import IN0, IN1, assert_simple, grpc_inputs
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

JSON_ONLY = {"kserve", "mlserver"}  # REST backends without binary tensors
HAS_STATISTICS = {"builtin", "reference", "reference-grpc", "triton", "triton-grpc"}
#: backends that answer ModelReady for an unknown model with ready: false (Triton's own gRPC
#: and REST answers: OK ready=false, and 400), which v2proxy relays; the others say NOT_FOUND
READY_FALSE_FOR_UNKNOWN = {"triton", "triton-grpc"}


def client(proxy: Proc) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(proxy.grpc_url)


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_infer(proxy: Proc, compression: str | None) -> None:
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT0"),
        grpcclient.InferRequestedOutput("OUTPUT1"),
    ]
    with client(proxy) as c:
        result = c.infer(
            "simple",
            grpc_inputs(),
            outputs=outputs,
            request_id="r-1",
            headers={"test": "1"},
            compression_algorithm=compression,
        )
    assert_simple(result)
    assert result.get_response().id == "r-1"
    assert result.get_response().model_name == "simple"


def test_requested_output_only(proxy: Proc) -> None:
    """KServe returns every output over gRPC whatever was asked; v2proxy returns what was."""
    with client(proxy) as c:
        result = c.infer(
            "simple", grpc_inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
        )
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT1").tolist() == (IN0 - IN1).tolist()


async def test_aio_client(proxy: Proc) -> None:
    async with grpcaio.InferenceServerClient(proxy.grpc_url) as c:
        assert await c.is_server_live()
        assert await c.is_model_ready("simple")
        a = grpcaio.InferInput("INPUT0", [1, 16], "INT32")
        a.set_data_from_numpy(IN0)
        b = grpcaio.InferInput("INPUT1", [1, 16], "INT32")
        b.set_data_from_numpy(IN1)
        assert_simple(await c.infer("simple", [a, b]))


def test_bytes_identity(proxy: Proc, backend_name: str) -> None:
    values = [b"he\x00llo", "ünïcode".encode(), b"", b"\xff\xfe not utf-8"]
    if backend_name in JSON_ONLY:
        values = values[:3]  # JSON cannot carry non-UTF-8 bytes (see the next test)
    data = np.array([values], dtype=np.object_)
    inp = grpcclient.InferInput("INPUT0", [1, len(values)], "BYTES")
    inp.set_data_from_numpy(data)
    with client(proxy) as c:
        result = c.infer("simple_identity", [inp])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (1, len(values))
    assert [bytes(x) for x in got.reshape(-1)] == values


def test_non_utf8_to_json_only_backend_is_a_clear_error(proxy: Proc, backend_name: str) -> None:
    if backend_name not in JSON_ONLY:
        return  # carried exactly: test_bytes_identity
    inp = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"\xff"]], dtype=np.object_))
    with client(proxy) as c, pytest.raises(InferenceServerException) as info:
        c.infer("simple_identity", [inp])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "not valid UTF-8" in info.value.message()


def test_typed_int_contents(proxy: Proc) -> None:
    """grpc_explicit_int_content_client.py: inputs in int_contents instead of raw bytes."""
    req = service_pb2.ModelInferRequest(model_name="simple", id="typed")
    for name, arr in (("INPUT0", IN0), ("INPUT1", IN1)):
        t = req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.int_contents.extend(arr.reshape(-1).tolist())
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        resp = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=30)
    assert resp.id == "typed"
    by_name = {o.name: i for i, o in enumerate(resp.outputs)}
    # responses always come in raw_output_contents, never typed contents
    out0 = np.frombuffer(resp.raw_output_contents[by_name["OUTPUT0"]], dtype="<i4")
    out1 = np.frombuffer(resp.raw_output_contents[by_name["OUTPUT1"]], dtype="<i4")
    assert out0.tolist() == (IN0 + IN1).reshape(-1).tolist()
    assert out1.tolist() == (IN0 - IN1).reshape(-1).tolist()


def _bad_requests() -> list[tuple[str, service_pb2.ModelInferRequest, str, str]]:
    raw = IN0.tobytes()
    cases = []
    r = service_pb2.ModelInferRequest(model_name="simple")
    r.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    r.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    r.raw_input_contents.append(raw)
    cases.append(
        (
            "missing-data",
            r,
            "INVALID_ARGUMENT",
            "unable to find data for input tensor 'INPUT1' for model 'simple' in request.",
        )
    )
    r = service_pb2.ModelInferRequest(model_name="simple")
    t = r.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    t.contents.int_contents.extend([1] * 16)
    r.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    r.raw_input_contents.append(raw)
    cases.append(
        (
            "contents-and-raw",
            r,
            "INVALID_ARGUMENT",
            "contents field must not be specified when using raw_input_contents for"
            " 'INPUT0' for model 'simple'",
        )
    )
    r = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        t = r.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.fp32_contents.extend([1.0] * 16)
    cases.append(
        (
            "wrong-contents-type",
            r,
            "INVALID_ARGUMENT",
            "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple'"
            " of type 'FP32', expected datatype 'INT32'",
        )
    )
    r = service_pb2.ModelInferRequest(model_name="nope")
    for name in ("INPUT0", "INPUT1"):
        r.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        r.raw_input_contents.append(raw)
    cases.append(("unknown-model", r, "NOT_FOUND", "Request for unknown model: 'nope'"))
    r = service_pb2.ModelInferRequest(model_name="simple")
    r.inputs.add(name="INPUT0", datatype="INT33", shape=[1, 16])
    r.raw_input_contents.append(raw)
    cases.append(("unknown-datatype", r, "INVALID_ARGUMENT", "invalid datatype 'INT33'"))
    return cases


@pytest.mark.parametrize(
    ("case", "request_msg", "code", "message"), _bad_requests(), ids=[c[0] for c in _bad_requests()]
)
def test_bad_grpc_input(proxy: Proc, case: str, request_msg: Any, code: str, message: str) -> None:
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request_msg, timeout=30)
    assert info.value.code().name == code
    assert message in info.value.details()
    with client(proxy) as c:
        assert_simple(c.infer("simple", grpc_inputs()))  # still serving


def test_health_and_metadata(proxy: Proc, backend_name: str) -> None:
    with client(proxy) as c:
        assert c.is_server_live()
        assert c.is_server_ready()
        assert c.is_model_ready("simple")
        if backend_name in READY_FALSE_FOR_UNKNOWN:
            assert c.is_model_ready("wrong_model_name") is False
        else:
            with pytest.raises(InferenceServerException) as info:
                c.is_model_ready("wrong_model_name")
            assert info.value.status() == "StatusCode.NOT_FOUND"
        meta = c.get_server_metadata(as_json=True)
        assert "binary_tensor_data" in meta["extensions"]
        model = c.get_model_metadata("simple", as_json=True)
    assert model["name"] == "simple"
    assert [i["name"] for i in model["inputs"]] == ["INPUT0", "INPUT1"]
    assert all(i["datatype"] == "INT32" for i in model["inputs"])
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda _: b"",
            response_deserializer=lambda b: b,
        )
        assert check(None, timeout=10) == b"\x08\x01"  # status: SERVING


def test_statistics(proxy: Proc, backend_name: str) -> None:
    with client(proxy) as c:
        c.infer("simple", grpc_inputs())
        if backend_name in HAS_STATISTICS:
            stats = c.get_inference_statistics("simple", as_json=True)
            assert len(stats["model_stats"]) == 1
            assert stats["model_stats"][0]["name"] == "simple"
            assert int(stats["model_stats"][0]["inference_count"]) >= 1
        else:  # KServe and MLServer have no statistics: a clean error, not a crash
            with pytest.raises(InferenceServerException) as info:
                c.get_inference_statistics("simple")
            assert info.value.status() in ("StatusCode.UNIMPLEMENTED", "StatusCode.NOT_FOUND")


def test_stream_infer_several_responses(proxy: Proc) -> None:
    results: queue.Queue[Any] = queue.Queue()
    with client(proxy) as c:
        c.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
        try:
            for i in range(3):
                a = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
                a.set_data_from_numpy(IN0 + i)
                b = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
                b.set_data_from_numpy(IN1)
                c.async_stream_infer("simple", [a, b], request_id=f"s{i}")
            bad = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
            bad.set_data_from_numpy(IN0)
            c.async_stream_infer("nope", [bad], request_id="bad")
            got: dict[str, Any] = {}
            errors = []
            for _ in range(4):
                result, error = results.get(timeout=30)
                if error is not None:
                    errors.append(error)
                else:
                    got[result.get_response().id] = result
        finally:
            c.stop_stream()
    assert sorted(got) == ["s0", "s1", "s2"]
    for i in range(3):
        assert got[f"s{i}"].as_numpy("OUTPUT0").tolist() == (IN0 + i + IN1).tolist()
    # the error comes in-band and the stream stays usable
    assert len(errors) == 1 and "Request for unknown model" in str(errors[0])


def test_http_and_grpc_give_identical_tensors(
    proxy: Proc, backend_urls: Any, backend_name: str
) -> None:
    """tritonclient.http and tritonclient.grpc through v2proxy equal the direct gRPC path."""
    if backend_name == "builtin":
        direct_url = None
    else:
        direct_url = backend_urls(backend_name.partition("-")[0])[1]
    with client(proxy) as c:
        via_grpc = c.infer("simple", grpc_inputs())
    hin = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    hin[0].set_data_from_numpy(IN0)
    hin[1].set_data_from_numpy(IN1)
    with httpclient.InferenceServerClient(proxy.url) as h:
        via_http = h.infer("simple", hin)
    for name in ("OUTPUT0", "OUTPUT1"):
        assert np.array_equal(via_grpc.as_numpy(name), via_http.as_numpy(name))
        assert via_grpc.as_numpy(name).dtype == via_http.as_numpy(name).dtype
    if direct_url is not None:
        with grpcclient.InferenceServerClient(direct_url) as d:
            direct = d.infer("simple", grpc_inputs())
        for name in ("OUTPUT0", "OUTPUT1"):
            assert np.array_equal(direct.as_numpy(name), via_grpc.as_numpy(name))


def test_kserve_grpc_client(proxy: Proc) -> None:
    """KServe's own InferenceGRPCClient (run in the KServe venv) through v2proxy."""
    peers = Path(os.environ.get("V2PROXY_PEERS_DIR") or launch.peers_dir())
    python = peers / "kserve" / "bin" / "python"
    script = Path(launch.__file__).with_name("kserve_grpc_client.py")
    proc = subprocess.run(
        [str(python), str(script), proxy.grpc_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["live"] and got["ready"] and got["model_ready"]
    assert got["id"] == "kserve-1"
    assert got["outputs"]["OUTPUT0"] == (IN0 + 2).tolist()
    assert got["outputs"]["OUTPUT1"] == (IN0 - 2).tolist()


def _llm_inputs(prompt: str, max_tokens: int, stream: bool) -> list[grpcclient.InferInput]:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    tokens = grpcclient.InferInput("max_tokens", [1], "INT32")
    tokens.set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    flag = grpcclient.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    return [text, tokens, flag]


def test_decoupled_model_streams_several_responses(llm_proxy: Proc) -> None:
    """One request to a decoupled model, one response per token, then the final flag."""
    results: queue.Queue[Any] = queue.Queue()
    with client(llm_proxy) as c:
        c.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
        try:
            c.async_stream_infer(
                "llm",
                _llm_inputs("the quick fox", 5, True),
                request_id="gen",
                enable_empty_final_response=True,
            )
            pieces: list[str] = []
            while True:
                result, error = results.get(timeout=30)
                assert error is None, error
                response = result.get_response()
                assert response.id == "gen"
                final = response.parameters["triton_final_response"].bool_param
                if response.outputs:
                    pieces.append(result.as_numpy("text_output")[0].decode())
                if final:
                    break
        finally:
            c.stop_stream()
    assert pieces == ["the", " quick", " fox", " the", " quick"]


def test_decoupled_model_unary_without_streaming(llm_proxy: Proc) -> None:
    """Unary infer on a decoupled model answers when the model makes one response: Triton
    itself refuses ModelInfer there (UNIMPLEMENTED), so v2proxy asks it over ModelStreamInfer."""
    with client(llm_proxy) as c:
        result = c.infer("llm", _llm_inputs("a b", 3, False))
    assert result.as_numpy("text_output").tolist() == [b"a b a b a"]
    with client(llm_proxy) as c, pytest.raises(InferenceServerException) as info:
        c.infer("llm", _llm_inputs("a b", 3, True))
    assert "ModelStreamInfer" in info.value.message()


def test_stream_error_closes_stream_with_triton_grpc_error(proxy: Proc) -> None:
    """With the `triton_grpc_error: true` header an error ends the stream with a status."""
    bad = service_pb2.ModelInferRequest(model_name="nope")
    bad.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    bad.raw_input_contents.append(IN0.tobytes())
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stream = stub.ModelStreamInfer(
            iter([bad]), metadata=[("triton_grpc_error", "true")], timeout=30
        )
        with pytest.raises(grpc.RpcError) as info:
            list(stream)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Request for unknown model: 'nope'" in info.value.details()


def test_large_messages(llm_proxy: Proc) -> None:
    """A 24 MiB tensor each way over gRPC, far past gRPC's 4 MiB default message limit, through
    v2proxy (and, for reference-grpc, through the backend's gRPC server too)."""
    data = np.arange(6 * 1024 * 1024, dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(
        llm_proxy.grpc_url,
        channel_args=[
            ("grpc.max_send_message_length", 2**31 - 1),
            ("grpc.max_receive_message_length", 2**31 - 1),
        ],
    ) as c:
        out = c.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
    assert out is not None and out.shape == data.shape
    assert np.array_equal(out, data)
