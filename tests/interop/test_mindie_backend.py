"""v2 clients through v2proxy in front of a MindIE server (``--backend mindie://host:port``):
tritonclient HTTP and gRPC (unary and ModelStreamInfer, one response per token) and plain
``generate``/``generate_stream`` requests against the
MindIE simulator (peers/mindie_sim.py, the one stand-in of this suite: MindIE needs Ascend
hardware), including MindIE's error answers, a stream that breaks, and MindIE gone."""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from peers import launch
from peers.launch import _free_ports
from peers.mindie_sim import tokens
from procs import Proc, v2proxy
from tritonclient.utils import InferenceServerException

SIM = Path(__file__).resolve().parent / "peers" / "mindie_sim.py"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Sim:
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, path: str, body: Any) -> Any:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode())
        with _OPENER.open(req, timeout=5) as resp:
            return json.loads(resp.read())

    def get(self, path: str) -> Any:
        with _OPENER.open(self.url + path, timeout=5) as resp:
            return json.loads(resp.read())

    def knobs(self, **knobs: Any) -> None:
        self.post("/sim/knobs", knobs)

    def last(self) -> Any:
        return self.get("/sim/last")["body"]


@contextlib.contextmanager
def mindie_sim() -> Iterator[Sim]:
    with launch.mindie_sim() as (port, pid):
        yield Sim(port, pid)


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    with mindie_sim() as s:
        yield s


@pytest.fixture(autouse=True)
def _fresh_sim(sim: Sim) -> None:
    sim.post("/sim/reset", {})


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def proxy(request: pytest.FixtureRequest, sim: Sim) -> Iterator[Proc]:
    backend = f"mindie://127.0.0.1:{sim.port}"
    with v2proxy(
        "serve", "--backend", backend, "--event-loop", request.param, name="proxy-mindie"
    ) as p:
        yield p


def expected(prompt: str, n: int) -> str:
    return "".join(text for _, text in tokens(prompt.split(), n))


def http_inputs(prompt: str, **knobs: Any) -> list[httpclient.InferInput]:
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    out = [text]
    for name, (dtype, value) in knobs.items():
        t = httpclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=_NP[dtype]))
        out.append(t)
    return out


def grpc_inputs(prompt: str, **knobs: Any) -> list[grpcclient.InferInput]:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    out = [text]
    for name, (dtype, value) in knobs.items():
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=_NP[dtype]))
        out.append(t)
    return out


_NP = {"INT32": np.int32, "BOOL": np.bool_, "FP32": np.float32, "UINT64": np.uint64}


def stream(proxy: Proc, inputs: list[grpcclient.InferInput]) -> tuple[list[str], Any]:
    """The texts of a ModelStreamInfer's responses until the final flag, and its error."""
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(proxy.grpc_url) as c:
        c.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
        pieces: list[str] = []
        try:
            c.async_stream_infer("llm", inputs, request_id="s1", enable_empty_final_response=True)
            while True:
                result, error = results.get(timeout=30)
                if error is not None:
                    return pieces, error
                response = result.get_response()
                assert response.id == "s1"
                if response.outputs:
                    pieces.append(result.as_numpy("text_output")[0].decode())
                if response.parameters["triton_final_response"].bool_param:
                    return pieces, None
        finally:
            c.stop_stream()


# ------------------------------------------------------------------ inference


def test_http_infer(proxy: Proc, sim: Sim) -> None:
    prompt = "My name is Olivier and I"
    with httpclient.InferenceServerClient(proxy.url) as c:
        result = c.infer("llm", http_inputs(prompt, max_tokens=("INT32", 7)), request_id="r1")
    assert result.as_numpy("text_output").tolist() == [expected(prompt, 7).encode()]
    response = result.get_response()
    assert response["id"] == "r1"
    assert response["parameters"]["finish_reason"] == "length"
    assert response["parameters"]["generated_tokens"] == 7
    assert sim.last() == {
        "inputs": prompt,
        "stream": False,
        "parameters": {"max_new_tokens": 7, "details": True},
    }


def test_http_infer_sampling_knobs(proxy: Proc, sim: Sim) -> None:
    knobs = {
        "temperature": ("FP32", 0.5),
        "top_k": ("INT32", 10),
        "top_p": ("FP32", 0.95),
        "seed": ("UINT64", 846930886),
    }
    with httpclient.InferenceServerClient(proxy.url) as c:
        result = c.infer("llm", http_inputs("中文 text", **knobs))
    assert result.as_numpy("text_output")[0].decode() == expected("中文 text", 20)
    assert result.get_response()["parameters"]["seed"] == 846930886
    assert sim.last()["parameters"] == {
        "temperature": 0.5,
        "top_k": 10,
        "top_p": 0.95,
        "seed": 846930886,
        "details": True,
    }


def test_grpc_infer(proxy: Proc, sim: Sim) -> None:
    with grpcclient.InferenceServerClient(proxy.grpc_url) as c:
        result = c.infer("llm", grpc_inputs("a b c", max_tokens=("INT32", 4)))
    assert result.as_numpy("text_output").tolist() == [b"a b c a"]
    assert sim.last()["stream"] is False


def test_grpc_stream_infer_one_response_per_token(proxy: Proc, sim: Sim) -> None:
    prompt = "the quick 狐狸 jumps"
    pieces, error = stream(
        proxy, grpc_inputs(prompt, max_tokens=("INT32", 6), stream=("BOOL", True))
    )
    assert error is None
    assert pieces == [text for _, text in tokens(prompt.split(), 6)]
    assert "".join(pieces) == expected(prompt, 6)
    assert sim.last()["stream"] is True


def test_grpc_stream_single_token(proxy: Proc) -> None:
    pieces, error = stream(
        proxy, grpc_inputs("x y", max_tokens=("INT32", 1), stream=("BOOL", True))
    )
    assert (pieces, error) == (["x"], None)


def test_unary_infer_of_a_stream_request(proxy: Proc) -> None:
    """Several responses do not fit a unary answer (as for the builtin llm)."""
    with (
        grpcclient.InferenceServerClient(proxy.grpc_url) as c,
        pytest.raises(InferenceServerException) as info,
    ):
        c.infer("llm", grpc_inputs("a b", max_tokens=("INT32", 3), stream=("BOOL", True)))
    assert "answers this request with 3 responses" in info.value.message()


def metric(proxy: Proc, name: str) -> float:
    """The value of one sample of v2proxy's /metrics (0 when absent)."""
    with _OPENER.open(proxy.base_url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                head, value = line.rsplit(" ", 1)
                if head == name or head.startswith(name + "{"):
                    return float(value)
    return 0.0


def test_token_metrics(proxy: Proc, sim: Sim) -> None:
    """direction=backend: time to the first token, per later token, tokens generated."""
    labels = '{direction="backend",model="llm"}'
    ttft = "v2proxy_mindie_time_to_first_token_seconds_count" + labels
    tpot = "v2proxy_mindie_time_per_output_token_seconds_count" + labels
    tokens_total = "v2proxy_mindie_generated_tokens_total" + labels
    before = [metric(proxy, m) for m in (ttft, tpot, tokens_total)]
    knobs = {"max_tokens": ("INT32", 5), "stream": ("BOOL", True)}
    assert len(stream(proxy, grpc_inputs("a b", **knobs))[0]) == 5
    with grpcclient.InferenceServerClient(proxy.grpc_url) as c:
        c.infer("llm", grpc_inputs("a", max_tokens=("INT32", 3)))
    after = [metric(proxy, m) for m in (ttft, tpot, tokens_total)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 4, 8]


# ------------------------------------------------------------------ metadata and health


def test_metadata_and_config(proxy: Proc) -> None:
    with (
        httpclient.InferenceServerClient(proxy.url) as h,
        grpcclient.InferenceServerClient(proxy.grpc_url) as g,
    ):
        meta = h.get_model_metadata("llm")
        assert meta["name"] == "llm"
        assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
            ("text_input", "BYTES", [1]),
            ("max_tokens", "INT32", [1]),
            ("stream", "BOOL", [1]),
            ("temperature", "FP32", [1]),
            ("top_k", "INT32", [1]),
            ("top_p", "FP32", [1]),
            ("seed", "UINT64", [1]),
        ]
        assert meta["outputs"] == [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]
        config = h.get_model_config("llm")
        assert config["model_transaction_policy"] == {"decoupled": True}
        server = h.get_server_metadata()
        assert (server["name"], server["version"]) == ("MindIE Server", "1.0.0")
        assert all(isinstance(e, str) for e in server["extensions"])
        gconfig = g.get_model_config("llm", as_json=True)["config"]
        assert gconfig["model_transaction_policy"] == {"decoupled": True}
        gmeta = g.get_model_metadata("llm", as_json=True)
        assert [i["name"] for i in gmeta["inputs"]] == [i["name"] for i in meta["inputs"]]


def test_unknown_model(proxy: Proc) -> None:
    with httpclient.InferenceServerClient(proxy.url) as h:
        with pytest.raises(InferenceServerException) as info:
            h.infer("ensemble", http_inputs("a"))
        assert info.value.message() == "Request for unknown model: 'ensemble' is not found"
        with pytest.raises(InferenceServerException) as info:
            h.get_model_metadata("ensemble")
        assert "Request for unknown model: 'ensemble' is not found" in info.value.message()
    with (
        grpcclient.InferenceServerClient(proxy.grpc_url) as g,
        pytest.raises(InferenceServerException) as info,
    ):
        g.infer("ensemble", grpc_inputs("a"))
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_readiness_follows_mindie(proxy: Proc, sim: Sim) -> None:
    with (
        httpclient.InferenceServerClient(proxy.url) as h,
        grpcclient.InferenceServerClient(proxy.grpc_url) as g,
    ):
        assert h.is_server_live() and h.is_server_ready() and h.is_model_ready("llm")
        assert g.is_server_ready() and g.is_model_ready("llm")
        sim.knobs(healthy=False)
        assert h.is_server_live()
        assert not h.is_server_ready()
        assert not h.is_model_ready("llm")
        assert not g.is_server_ready()


# ------------------------------------------------------------------ MindIE's errors


def test_validation_error_is_400_with_mindie_message(proxy: Proc) -> None:
    message = "Parameter top_p must be in (0.0,1.0], got 1.5."
    with (
        httpclient.InferenceServerClient(proxy.url) as h,
        pytest.raises(InferenceServerException) as info,
    ):
        h.infer("llm", http_inputs("a", top_p=("FP32", 1.5)))
    assert (info.value.status(), info.value.message()) == ("400", message)
    with (
        grpcclient.InferenceServerClient(proxy.grpc_url) as g,
        pytest.raises(InferenceServerException) as info,
    ):
        g.infer("llm", grpc_inputs("a", top_p=("FP32", 1.5)))
    assert (info.value.status(), info.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    pieces, error = stream(proxy, grpc_inputs("a", top_p=("FP32", 1.5), stream=("BOOL", True)))
    assert pieces == []
    assert error.message() == message


def test_v2_off_values_are_accepted(proxy: Proc, sim: Sim) -> None:
    """top_p 1.0, top_k 0 and temperature 0 mean "off" to v2 LLM backends; MindIE refuses them
    as such and is sent their MindIE equivalents."""
    knobs = {"top_p": ("FP32", 1.0), "top_k": ("INT32", 0), "temperature": ("FP32", 0.0)}
    with httpclient.InferenceServerClient(proxy.url) as h:
        result = h.infer("llm", http_inputs("a b", max_tokens=("INT32", 2), **knobs))
    assert result.as_numpy("text_output").tolist() == [b"a b"]
    assert sim.last()["parameters"] == {"max_new_tokens": 2, "do_sample": False, "details": True}


@pytest.mark.parametrize(
    ("status", "http", "grpc", "message"),
    [
        (500, "500", "StatusCode.INTERNAL", "Failed to get engine response."),
        (424, "500", "StatusCode.INTERNAL", "Failed to build the engine request."),
        (503, "503", "StatusCode.UNAVAILABLE", "The service has been stopped"),
        (422, "400", "StatusCode.INVALID_ARGUMENT", "Failed to tokenize the inputs."),
    ],
)
def test_mindie_error_statuses(
    proxy: Proc, sim: Sim, status: int, http: str, grpc: str, message: str
) -> None:
    sim.knobs(error_status=status)
    with (
        httpclient.InferenceServerClient(proxy.url) as h,
        pytest.raises(InferenceServerException) as info,
    ):
        h.infer("llm", http_inputs("a"))
    assert (info.value.status(), info.value.message()) == (http, message)
    with (
        grpcclient.InferenceServerClient(proxy.grpc_url) as g,
        pytest.raises(InferenceServerException) as info,
    ):
        g.infer("llm", grpc_inputs("a"))
    assert (info.value.status(), info.value.message()) == (grpc, message)
    pieces, error = stream(proxy, grpc_inputs("a", stream=("BOOL", True)))
    assert (pieces, error.message()) == ([], message)


def test_mid_stream_failure_reaches_the_stream_client(proxy: Proc, sim: Sim) -> None:
    """MindIE's raw timeout line after two tokens: two responses, then the error."""
    sim.knobs(fail_after=2)
    pieces, error = stream(proxy, grpc_inputs("a b c", stream=("BOOL", True)))
    assert pieces == ["a", " b"]
    assert error is not None
    assert error.message() == "MindIE stream failed: Engine callback timeout: client timeout"


def test_stream_cut_off_reaches_the_stream_client(proxy: Proc, sim: Sim) -> None:
    sim.knobs(fail_after=3, fail_mode="abort")
    pieces, error = stream(proxy, grpc_inputs("a b c d", stream=("BOOL", True)))
    assert pieces == ["a", " b", " c"]
    assert error is not None
    assert "failed during inference stream" in error.message()


def test_stream_client_going_away_drops_the_mindie_request(proxy: Proc, sim: Sim) -> None:
    sim.knobs(latency_ms=100)
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(proxy.grpc_url) as c:
        c.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
        c.async_stream_infer(
            "llm", grpc_inputs("a b", max_tokens=("INT32", 100), stream=("BOOL", True))
        )
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("text_output")[0] == b"a"
        c.stop_stream(cancel_requests=True)
        deadline = time.monotonic() + 10
        while sim.get("/sim/knobs")["disconnects"] != 1:
            assert time.monotonic() < deadline, "MindIE's stream was not dropped"
            time.sleep(0.1)


# ------------------------------------------------------------------ other set-ups


def test_mindie_model_name_from_config(sim: Sim, tmp_path: Path) -> None:
    config = tmp_path / "mindie.yaml"
    config.write_text("mindie:\n  model: ensemble\n")
    backend = f"mindie://127.0.0.1:{sim.port}"
    with (
        v2proxy("serve", "--backend", backend, "--config", str(config)) as p,
        httpclient.InferenceServerClient(p.url) as h,
    ):
        assert h.get_model_metadata("ensemble")["name"] == "ensemble"
        result = h.infer("ensemble", http_inputs("x", max_tokens=("INT32", 2)))
        assert result.as_numpy("text_output").tolist() == [b"x x"]
        with pytest.raises(InferenceServerException, match="unknown model: 'llm'"):
            h.infer("llm", http_inputs("x"))


def test_backend_timeout(sim: Sim) -> None:
    """--backend-timeout bounds a whole non-stream generation, and a stream between events."""
    backend = f"mindie://127.0.0.1:{sim.port}"
    with v2proxy("serve", "--backend", backend, "--backend-timeout", "0.5") as p:
        sim.knobs(latency_ms=300)
        with (
            httpclient.InferenceServerClient(p.url) as h,
            pytest.raises(InferenceServerException) as info,
        ):
            h.infer("llm", http_inputs("a", max_tokens=("INT32", 4)))
        assert info.value.status() == "504"
        assert "did not answer inference in time (--backend-timeout 0.5 s)" in (
            info.value.message()
        )
        # 1.2 s in all, but never 0.5 s without an event
        knobs = {"max_tokens": ("INT32", 4), "stream": ("BOOL", True)}
        assert stream(p, grpc_inputs("a b", **knobs)) == (["a", " b", " a", " b"], None)
        sim.knobs(latency_ms=800)
        pieces, error = stream(p, grpc_inputs("a b", **knobs))
        assert pieces == []
        assert "did not answer inference stream in time" in error.message()


def test_mindie_down() -> None:
    (port,) = _free_ports(1)  # nothing listens there
    with v2proxy("serve", "--backend", f"mindie://127.0.0.1:{port}") as p:
        with httpclient.InferenceServerClient(p.url) as h:
            assert h.is_server_live()
            assert not h.is_server_ready()
            with pytest.raises(InferenceServerException) as info:
                h.infer("llm", http_inputs("a"))
        assert info.value.status() == "503"
        assert f"mindie://127.0.0.1:{port} is unavailable" in info.value.message()
        with (
            grpcclient.InferenceServerClient(p.grpc_url) as g,
            pytest.raises(InferenceServerException) as info,
        ):
            g.infer("llm", grpc_inputs("a"))
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        pieces, error = stream(p, grpc_inputs("a", stream=("BOOL", True)))
        assert pieces == [] and "is unavailable" in error.message()


# ------------------------------------------------------------------ the generate extension


def post(proxy: Proc, path: str, body: Any) -> tuple[int, str, bytes]:
    """(status, content type, body) of a POST to v2proxy."""
    req = urllib.request.Request(
        proxy.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def sse(body: bytes) -> list[Any]:
    assert body.endswith(b"\n\n")
    events = body[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") for e in events), body
    return [json.loads(e[6:]) for e in events]


def test_generate(proxy: Proc, sim: Sim) -> None:
    status, ctype, body = post(
        proxy, "/v2/models/llm/generate", {"text_input": "hello big world", "max_tokens": 5}
    )
    assert (status, ctype) == (200, "application/json")
    answer = json.loads(body)
    seed = answer.pop("seed")
    assert isinstance(seed, int)
    assert answer == {
        "model_name": "llm",
        "model_version": "1",
        "text_output": expected("hello big world", 5),
        "finish_reason": "length",
        "generated_tokens": 5,
    }
    assert sim.last() == {
        "inputs": "hello big world",
        "stream": False,
        "parameters": {"max_new_tokens": 5, "details": True},
    }


def test_generate_stream(proxy: Proc, sim: Sim) -> None:
    prompt = "hello 中文 world"
    status, ctype, body = post(
        proxy,
        "/v2/models/llm/generate_stream",
        {"text_input": prompt, "parameters": {"max_tokens": 4, "stream": True, "seed": 7}},
    )
    assert (status, ctype) == (200, "text/event-stream; charset=utf-8")
    events = sse(body)
    assert [e["text_output"] for e in events] == [t for _, t in tokens(prompt.split(), 4)]
    assert all((e["model_name"], e["model_version"]) == ("llm", "1") for e in events)
    assert events[-1]["finish_reason"] == "length" and events[-1]["seed"] == 7
    assert sim.last()["stream"] is True
    assert sim.last()["parameters"]["seed"] == 7


def test_generate_errors(proxy: Proc, sim: Sim) -> None:
    message = "Parameter top_p must be in (0.0,1.0], got 1.5."
    for path in ("/v2/models/llm/generate", "/v2/models/llm/generate_stream"):
        status, _, body = post(proxy, path, {"text_input": "a", "top_p": 1.5, "stream": True})
        assert (status, json.loads(body)) == (400, {"error": message})
    sim.knobs(error_status=503)
    status, _, body = post(proxy, "/v2/models/llm/generate", {"text_input": "a"})
    assert (status, json.loads(body)) == (503, {"error": "The service has been stopped"})
    status, _, body = post(proxy, "/v2/models/nope/generate", {"text_input": "a"})
    assert status == 404
    assert json.loads(body) == {"error": "Request for unknown model: 'nope' is not found"}


def test_generate_stream_mid_stream_failure(proxy: Proc, sim: Sim) -> None:
    sim.knobs(fail_after=2)
    status, _, body = post(
        proxy, "/v2/models/llm/generate_stream", {"text_input": "a b c", "stream": True}
    )
    assert status == 200
    events = sse(body)
    assert [e.get("text_output") for e in events[:2]] == ["a", " b"]
    assert events[2:] == [
        {"error": "MindIE stream failed: Engine callback timeout: client timeout"}
    ]


def test_generate_stream_client_going_away_drops_the_mindie_request(proxy: Proc, sim: Sim) -> None:
    sim.knobs(latency_ms=100)
    body = json.dumps({"text_input": "a b", "max_tokens": 100, "stream": True}).encode()
    head = (
        f"POST /v2/models/llm/generate_stream HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(head + body)
        got = b""
        while b"data: " not in got:
            got += sock.recv(4096)
        assert got.startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 10
    while sim.get("/sim/knobs")["disconnects"] != 1:
        assert time.monotonic() < deadline, "MindIE's stream was not dropped"
        time.sleep(0.1)


# ------------------------------------------------------------------ the simulator itself

_TOO_LONG = "Inputs must be necessary and data type must be string and length in (0, {}], but"
_P = {"inputs": "a"}

_T = "Parameter temperature must be in (0.0,3.40282e+38], got 0."


def _p(**params: Any) -> dict[str, Any]:
    return {"inputs": "a", "parameters": params}


SIM_VALIDATION: list[tuple[Any, str | None]] = [
    (b"not json", "Failed to parse context to json body"),
    (b"[]", "Failed to parse context to json body"),
    ({}, "Inputs must not be null"),
    ({"inputs": None, "stream": True}, "Inputs must not be null"),
    ({"inputs": "a", "input_id": [1]}, "Input conflict."),
    ({"inputs": ""}, _TOO_LONG.format(8) + " the length of inputs is 0"),
    ({"inputs": 5}, _TOO_LONG.format(8) + " the length of inputs is 0"),
    ({"inputs": "😀😀😀😀"}, None),  # 8 UTF-16 code units
    ({"inputs": "😀😀😀😀a"}, _TOO_LONG.format(8) + " the length of inputs is 9"),
    ({"inputs": "", "stream": "x"}, _TOO_LONG.format(8) + " the length of inputs is 0"),
    ({**_P, "stream": "yes"}, "stream must be boolean type."),
    ({**_P, "parameters": []}, "parameters must be object type."),
    (_p(temperature=0), _T),
    (_p(temperature="1"), "temperature must be float type."),
    (_p(top_k=0), "Parameter top_k must be in -1 || (0,2147483647], got 0"),
    (_p(top_k=1.5), "top_k must be integer type."),
    (_p(top_p=1.0), "Parameter top_p must be in (0.0,1.0], got 1.0."),
    (_p(typical_p=0), "Parameter typical_p must be in (0.0,1.0], got 0."),
    (_p(do_sample=1), "do_sample must be boolean type."),
    (_p(seed=-1), "seed must be unsigned integer type."),
    (
        _p(seed=2**63),
        "Parameter seed must be in [0, 9223372036854775807], got 9223372036854775808.",
    ),
    (
        _p(repetition_penalty=0),
        "Parameter 'repetition_penalty' must be in (0.0, 3.40282e+38], got 0.",
    ),
    (_p(watermark="no"), "watermark must be boolean type."),
    (_p(priority=9), "Parameter priority must be in [1,5], got 9."),
    (
        _p(timeout=0),
        "Parameter timeout must be strictly positive and small than 65535 seconds, got 0.",
    ),
    (_p(max_new_tokens=0), "Parameter max_new_tokens must be in (0,2147483647], got 0."),
    (_p(details=1), "details must be boolean type."),
    # MindIE's order: temperature before top_p; null is absent; unknown keys ignored
    (_p(top_p=1.0, temperature=0), _T),
    (_p(temperature=None, seed=None, best_of=3), None),
    ({"inputs": [{"type": "text", "text": 5}]}, "Request param text must be string"),
    ({"inputs": [{"type": "image_url", "image_url": None}]}, "Request param image_url null"),
    (
        {"inputs": [{"type": "image_url", "image_url": "/a.png"}] * 21},
        "The number of multimodal url should be no more than 20",
    ),
    (
        {"inputs": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": "/b"}]},
        _TOO_LONG.format(8) + " the length of inputs is 66",
    ),
    ({"input_id": [1, 2]}, None),
]


@pytest.mark.parametrize(("body", "message"), SIM_VALIDATION)
def test_simulator_validation(body: Any, message: str | None) -> None:
    """The simulator's /infer validation follows MindIE's rules, order and texts."""
    from peers.mindie_sim import Invalid, validate

    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    if message is None:
        validate(raw, max_chars=8)
    else:
        with pytest.raises(Invalid) as info:
            validate(raw, max_chars=8)
        assert str(info.value) == message


def test_simulator_answers(sim: Sim) -> None:
    req = urllib.request.Request(sim.url + "/infer", data=b'{"inputs": "a", "stream": 1}')
    with pytest.raises(urllib.error.HTTPError) as info:
        _OPENER.open(req, timeout=5)
    assert info.value.code == 422
    assert info.value.headers["Content-Type"] == "application/json"
    assert info.value.headers["Connection"] == "close"
    assert json.loads(info.value.read()) == {
        "error": "stream must be boolean type.",
        "error_type": "Input Validation Error",
    }
    body = sim.post("/infer", {"inputs": "a b", "parameters": {"max_new_tokens": 3}})
    assert body == {"generated_text": "a b a"}
    body = sim.post("/infer", {"inputs": "a", "parameters": {"details": True, "seed": 5}})
    assert body["details"]["seed"] == 5 and body["details"]["generated_tokens"] == 20
    req = urllib.request.Request(
        sim.url + "/infer",
        data=json.dumps(
            {"inputs": "x y", "stream": True, "parameters": {"max_new_tokens": 3}}
        ).encode(),
    )
    with _OPENER.open(req, timeout=5) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        events = sse(resp.read())
    assert [e.get("token") for e in events] == [
        {"id": tokens(["x"], 1)[0][0], "text": "x"},
        {"id": tokens(["y"], 1)[0][0], "text": " y"},
        {"id": tokens(["x"], 1)[0][0], "text": None},
    ]
    assert events[0]["prefill_time"] is not None and events[0]["decode_time"] is None
    assert all(e["prefill_time"] is None and e["decode_time"] is not None for e in events[1:])
    assert events[-1]["generated_text"] == "x y x" and events[-1]["details"] is None
    assert "generated_text" not in events[0]
