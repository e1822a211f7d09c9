"""MindIE's native ``POST /infer`` through v2proxy in front of real v2 LLM backends
(docs/protocol.md, MindIE; docs/guides/mindie.md): the builtin ``llm`` (in process), and a real
Triton (2.51, python backend) serving the decoupled toy ``ensemble`` with TensorRT-LLM's tensors,
reached over HTTP generate/generate_stream and over gRPC ModelStreamInfer; the ``generate`` profile
in front of Triton's ``llm`` twin. Also AISBench's ``MindieStreamApi``, a real third-party MindIE
client, run from its own venv.

The toy models "generate" the words of the prompt in a cycle; the ensemble's test knobs
(``[delay=MS]``, ``[fail_after=N]``, ``[cancelled?]``) are described in its model.py."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ensemble_probe
import pytest
from peers import launch
from procs import Proc, v2proxy

TIMEOUT_TEXT = "Engine callback timeout: client timeout"
HERE = Path(__file__).resolve().parent


def cycle(prompt: str, n: int) -> str:
    words = [w for w in prompt.split() if not w.startswith("[")]
    return " ".join(words[i % len(words)] for i in range(n))


@contextlib.contextmanager
def _proxy_with(tmp: Path, name: str, backend: str, **mindie: Any) -> Iterator[Proc]:
    """v2proxy with a config file of this ``mindie:`` section (``event_loop`` at the top)."""
    loop = mindie.pop("event_loop", "uvloop")
    cfg = tmp / f"{name}.yaml"
    lines = [f"event_loop: {loop}\n", "mindie:\n", *(f"  {k}: {v}\n" for k, v in mindie.items())]
    cfg.write_text("".join(lines))
    with v2proxy("serve", "--backend", backend, "--config", str(cfg), name=name) as p:
        yield p


@pytest.fixture(scope="session")
def triton_urls(backend_urls: Callable[[str], tuple[str, str]]) -> tuple[str, str]:
    return backend_urls("triton")


@pytest.fixture(scope="session")
def mindie_proxies() -> dict[str, Proc]:
    """The v2proxy processes of this module, started lazily, by target name."""
    return {}


TARGETS: dict[str, tuple[str, dict[str, Any]]] = {
    # name -> (backend: builtin | triton-rest | triton-grpc, mindie settings)
    "builtin": ("builtin", {"model": "llm"}),
    "triton-http": ("triton-rest", {"model": "ensemble", "profile": "trtllm"}),
    "triton-grpc": ("triton-grpc", {"model": "ensemble", "profile": "trtllm"}),
    # the same on plain asyncio (the others run on uvloop)
    "triton-http-asyncio": (
        "triton-rest",
        {"model": "ensemble", "profile": "trtllm", "event_loop": "asyncio"},
    ),
    "triton-grpc-asyncio": (
        "triton-grpc",
        {"model": "ensemble", "profile": "trtllm", "event_loop": "asyncio"},
    ),
    "triton-generate": ("triton-rest", {"model": "llm", "profile": "generate"}),
    "triton-vllm-http": ("triton-rest", {"model": "vllm_model", "profile": "vllm"}),
    "triton-vllm-grpc": ("triton-grpc", {"model": "vllm_model", "profile": "vllm"}),
    "builtin-generate": ("builtin", {"model": "llm", "profile": "generate"}),
    "builtin-small": ("builtin", {"model": "llm", "max_input_chars": 8, "max_new_tokens": 3}),
    "triton-missing": ("triton-rest", {"model": "nope"}),
}


@pytest.fixture(scope="session")
def get_proxy(
    stack: contextlib.ExitStack,
    tmp_path_factory: pytest.TempPathFactory,
    triton_urls: tuple[str, str],
    mindie_proxies: dict[str, Proc],
) -> Callable[[str], Proc]:
    tmp = tmp_path_factory.mktemp("mindie")

    def get(name: str) -> Proc:
        proxies = mindie_proxies
        if name not in proxies:
            backend, settings = TARGETS[name]
            url = {
                "builtin": "builtin",
                "triton-rest": triton_urls[0],
                "triton-grpc": f"grpc://{triton_urls[1]}",
            }[backend]
            proxies[name] = stack.enter_context(_proxy_with(tmp, name, url, **dict(settings)))
        return proxies[name]

    return get


def post(proxy: Proc, body: Any, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", "/infer", data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def events(raw: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The ``data: `` events of a MindIE stream (exact framing checked) and what follows them."""
    out = []
    rest = raw
    while rest.startswith(b"data: "):
        event, sep, rest = rest.partition(b"\n\n")
        assert sep, f"event without its blank line: {event!r}"
        out.append(json.loads(event[len(b"data: ") :]))
    return out, rest


def cancelled(triton_urls: tuple[str, str]) -> int:
    return ensemble_probe.cancelled(triton_urls[0])


STREAMING = [
    "builtin",
    "triton-http",
    "triton-grpc",
    "triton-generate",
    "builtin-generate",
    "triton-vllm-http",
    "triton-vllm-grpc",
]
VLLM = ["triton-vllm-http", "triton-vllm-grpc"]
TRITON = ["triton-http", "triton-grpc", "triton-http-asyncio", "triton-grpc-asyncio"]

# ---------------------------------------------------------------------- non-stream


@pytest.mark.parametrize("target", STREAMING)
def test_text_answer_with_details(get_proxy: Callable[[str], Proc], target: str) -> None:
    prompt = "My name is Olivier and I"
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 8, "details": True, "seed": 42}}
    status, headers, raw = post(get_proxy(target), body)
    assert status == 200, raw
    assert headers["content-type"] == "application/json"
    assert json.loads(raw) == {
        "generated_text": cycle(prompt, 8),  # no prompt echo
        "details": {"finish_reason": "length", "generated_tokens": 8, "seed": 42},
    }


@pytest.mark.parametrize("target", ["builtin", "triton-http", "triton-grpc"])
def test_text_answer_plain_default_length_and_drawn_seed(
    get_proxy: Callable[[str], Proc], target: str
) -> None:
    proxy = get_proxy(target)
    status, _, raw = post(proxy, {"inputs": "一 二 三"})
    assert status == 200
    assert json.loads(raw) == {"generated_text": cycle("一 二 三", 20)}  # max_new_tokens 20
    seeds = []
    for _ in range(2):
        status, _, raw = post(proxy, {"inputs": "a", "parameters": {"details": True}})
        seed = json.loads(raw)["details"]["seed"]
        assert isinstance(seed, int) and 0 <= seed < 2**63
        seeds.append(seed)
    assert seeds[0] != seeds[1]


@pytest.mark.parametrize("target", VLLM)
def test_vllm_finish_reason_and_knobs_vllm_does_not_know(
    get_proxy: Callable[[str], Proc], target: str
) -> None:
    proxy = get_proxy(target)
    # typical_p, watermark, priority would make vLLM's SamplingParams fail: never forwarded
    params = {
        "details": True,
        "seed": 5,
        "typical_p": 0.5,
        "watermark": True,
        "priority": 1,
        "do_sample": False,
        "max_new_tokens": 10,
    }
    status, _, raw = post(proxy, {"inputs": "a b <eos> c", "parameters": params})
    assert status == 200, raw
    assert json.loads(raw) == {
        "generated_text": "a b",
        "details": {"finish_reason": "eos_token", "generated_tokens": 2, "seed": 5},
    }
    status, _, raw = post(proxy, {"inputs": "a b <eos> c", "stream": True, "parameters": params})
    evs, rest = events(raw)
    assert rest == b"" and [e["token"]["text"] for e in evs] == ["a", None]
    assert evs[-1]["generated_text"] == "a b"
    assert evs[-1]["details"] == {"finish_reason": "eos_token", "generated_tokens": 2, "seed": 5}


# ---------------------------------------------------------------------- stream


@pytest.mark.parametrize("target", STREAMING)
@pytest.mark.parametrize("prompt", ["My name is Olivier", "你好 世界 😀"], ids=["en", "zh"])
def test_stream_order_and_final_event(
    get_proxy: Callable[[str], Proc], target: str, prompt: str
) -> None:
    body = {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 6, "details": True}}
    status, headers, raw = post(get_proxy(target), body)
    assert status == 200, raw
    assert headers["content-type"] == "text/event-stream"
    evs, rest = events(raw)
    assert rest == b"" and b"[DONE]" not in raw
    assert len(evs) == 6  # one per token: the last token is the final event
    expected = cycle(prompt, 6)
    pieces = expected.split(" ")
    for i, ev in enumerate(evs[:-1]):
        assert list(ev) == ["prefill_time", "decode_time", "token"]
        assert ev["token"] == {"id": 0, "text": pieces[i] if i == 0 else " " + pieces[i]}
        if i == 0:
            assert isinstance(ev["prefill_time"], float) and ev["decode_time"] is None
        else:
            assert ev["prefill_time"] is None and isinstance(ev["decode_time"], float)
    final = evs[-1]
    assert list(final) == ["prefill_time", "decode_time", "generated_text", "details", "token"]
    assert final["generated_text"] == expected
    assert final["token"] == {"id": 0, "text": None}
    assert final["prefill_time"] is None and final["decode_time"] >= 0
    details = final["details"]
    assert details["finish_reason"] == "length" and details["generated_tokens"] == 6
    assert isinstance(details["seed"], int)
    # without details: null, and a one-token answer is the final event alone
    status, _, raw = post(
        get_proxy(target), {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": 1}}
    )
    (only,), _ = events(raw)
    assert only["generated_text"] == prompt.split(maxsplit=1)[0] and only["details"] is None
    assert only["prefill_time"] >= 0 and only["decode_time"] is None
    assert only["token"]["text"] is None


@pytest.mark.parametrize("target", TRITON)
def test_stream_timings_are_measured_by_the_proxy(
    get_proxy: Callable[[str], Proc], target: str
) -> None:
    body = {"inputs": "a b [delay=80]", "stream": True, "parameters": {"max_new_tokens": 4}}
    t0 = time.perf_counter()
    status, _, raw = post(get_proxy(target), body)
    elapsed_ms = (time.perf_counter() - t0) * 1000
    assert status == 200
    evs, _ = events(raw)
    prefill = evs[0]["prefill_time"]
    decodes = [e["decode_time"] for e in evs[1:]]
    # each token takes 80 ms at the backend; a busy machine may deliver two together, so the
    # times are checked in sum: they add up to the generation's time, within what the client saw
    assert 70 <= prefill < 2000
    assert all(0 <= d < 2000 for d in decodes), decodes
    assert 4 * 80 * 0.9 <= prefill + sum(decodes) <= elapsed_ms + 1


def test_metrics_time_to_first_token_and_tokens(get_proxy: Callable[[str], Proc]) -> None:
    proxy = get_proxy("triton-grpc")
    body = {"inputs": "x y [delay=20]", "stream": True, "parameters": {"max_new_tokens": 5}}
    assert post(proxy, body)[0] == 200
    with contextlib.closing(
        http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    ) as conn:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    labels = '{direction="frontend",model="ensemble"}'

    def sample(name: str) -> float:
        for line in text.splitlines():
            if line.startswith(name + labels):
                return float(line.split()[-1])
        raise AssertionError(f"{name}{labels} not in /metrics")

    assert sample("v2proxy_mindie_time_to_first_token_seconds_count") >= 1
    assert sample("v2proxy_mindie_time_to_first_token_seconds_sum") >= 0.015
    assert sample("v2proxy_mindie_time_per_output_token_seconds_count") >= 4
    assert sample("v2proxy_mindie_generated_tokens_total") >= 5
    # the request itself is recorded under the model /infer serves (its path names none)
    requests = [
        line
        for line in text.splitlines()
        if line.startswith("v2proxy_requests_total{")
        and 'operation="mindie"' in line
        and 'model="ensemble"' in line
    ]
    assert requests and float(requests[0].split()[-1]) >= 1


# ---------------------------------------------------------------------- validation and errors


def test_validation_and_utf16_length(get_proxy: Callable[[str], Proc]) -> None:
    proxy = get_proxy("builtin-small")  # max_input_chars 8, max_new_tokens 3
    for ok in ("😀😀😀😀", "中文中文中文中文", "abcdefgh"):
        status, _, raw = post(proxy, {"inputs": ok})
        assert status == 200, raw
        assert json.loads(raw)["generated_text"] == cycle(ok, 3)
    for bad, length in (("😀😀😀😀a", 9), ("中文中文中文中文中", 9), ("", 0)):
        status, headers, raw = post(proxy, {"inputs": bad})
        assert status == 422 and headers["content-type"] == "application/json"
        assert json.loads(raw) == {
            "error": "Inputs must be necessary and data type must be string and length in"
            f" (0, 8], but the length of inputs is {length}",
            "error_type": "Input Validation Error",
        }
    cases = [
        (b"{oops", "Request body is not a valid json."),
        (
            {"inputs": "a", "parameters": {"top_p": 1.0}},
            "Parameter top_p must be in (0.0,1.0), got 1.0.",
        ),
        ({"inputs": "a", "stream": "yes"}, "stream must be bool type."),
        ({"inputs": "a", "input_id": [1]}, "Input conflict."),
    ]
    for body, message in cases:
        status, _, raw = post(proxy, body)
        assert (status, json.loads(raw)) == (
            422,
            {"error": message, "error_type": "Input Validation Error"},
        )


def test_profile_checked_at_start_up(tmp_path: Path, triton_urls: tuple[str, str]) -> None:
    url = f"grpc://{triton_urls[1]}"
    cases = [
        (
            {"model": "ensemble"},
            "INFO",
            "MindIE /infer served by model 'ensemble' (profile"
            " trtllm, decoupled, gRPC ModelStreamInfer)",
        ),
        (
            {"model": "ensemble", "profile": "vllm"},
            "WARNING",
            "model 'ensemble' has no input"
            " 'sampling_parameters' (vLLM backend); its inputs suggest profile trtllm",
        ),
    ]
    for i, (settings, level, line) in enumerate(cases):
        with _proxy_with(tmp_path, f"startup{i}", url, **settings) as p:  # no request sent
            deadline = time.monotonic() + 15
            while line not in p.log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            logged = [ln for ln in p.log.read_text().splitlines() if line in ln]
            assert len(logged) == 1 and f" {level} " in logged[0], p.log.read_text()


def test_unknown_model_is_a_generation_error(get_proxy: Callable[[str], Proc]) -> None:
    status, _, raw = post(get_proxy("triton-missing"), {"inputs": "a"})
    answer = json.loads(raw)
    assert (status, answer["error_type"]) == (424, "Generation Error")
    assert "nope" in answer["error"]


@pytest.mark.parametrize("target", TRITON)
def test_backend_failure_mid_stream(get_proxy: Callable[[str], Proc], target: str) -> None:
    proxy = get_proxy(target)
    body = {"inputs": "a b [fail_after=2]", "stream": True, "parameters": {"max_new_tokens": 6}}
    status, _, raw = post(proxy, body)
    assert status == 200
    evs, rest = events(raw)
    # the tokens generated, then the failure written raw into the stream as MindIE does
    assert [e["token"]["text"] for e in evs] == ["a", " b"]
    assert all("generated_text" not in e for e in evs)
    assert rest == b"Incomplete Generation: ensemble failed after 2 tokens"
    # failing before the first token: an ordinary error answer (Triton says 400: validation)
    body["inputs"] = "a [fail_after=0]"
    status, _, raw = post(proxy, body)
    assert (status, json.loads(raw)) == (
        422,
        {"error": "ensemble failed after 0 tokens", "error_type": "Input Validation Error"},
    )


@pytest.mark.parametrize("target", TRITON)
def test_timeout_is_the_proxy_deadline(
    get_proxy: Callable[[str], Proc], target: str, triton_urls: tuple[str, str]
) -> None:
    proxy = get_proxy(target)
    before = ensemble_probe.settled(triton_urls[0])
    slow = {"inputs": "a [delay=300]", "parameters": {"max_new_tokens": 10, "timeout": 1}}
    t0 = time.monotonic()
    status, _, raw = post(proxy, slow)
    assert time.monotonic() - t0 < 3
    assert (status, json.loads(raw)) == (
        500,
        {"error": TIMEOUT_TEXT, "error_type": "Incomplete Generation"},
    )
    status, _, raw = post(proxy, {**slow, "stream": True})
    evs, rest = events(raw)
    assert status == 200 and 1 <= len(evs) <= 3  # tokens at 0.3, 0.6, 0.9 s
    assert rest == TIMEOUT_TEXT.encode()
    deadline = time.monotonic() + 5
    while cancelled(triton_urls) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cancelled(triton_urls) == before + 2  # both backend requests were cancelled


@pytest.mark.parametrize("target", TRITON)
def test_client_disconnect_cancels_the_backend(
    get_proxy: Callable[[str], Proc], target: str, triton_urls: tuple[str, str]
) -> None:
    proxy = get_proxy(target)
    before = ensemble_probe.settled(triton_urls[0])
    body = json.dumps(
        {"inputs": "a b [delay=150]", "stream": True, "parameters": {"max_new_tokens": 60}}
    ).encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as s:
        s.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.sendall(body)
        got = b""
        while got.count(b"data: ") < 2:
            chunk = s.recv(4096)
            assert chunk
            got += chunk
    assert got.startswith(b"HTTP/1.1 200 OK")
    deadline = time.monotonic() + 5
    while cancelled(triton_urls) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cancelled(triton_urls) == before + 1  # the model saw its request cancelled


@pytest.mark.parametrize("target", TRITON)
def test_client_disconnect_cancels_a_text_generation(
    get_proxy: Callable[[str], Proc], target: str, triton_urls: tuple[str, str]
) -> None:
    """A client that does not stream writes nothing while the model generates: its going away
    is still seen at once (not when the answer is written, 9 s later) and cancels the model."""
    proxy = get_proxy(target)
    before = ensemble_probe.settled(triton_urls[0])
    body = json.dumps({"inputs": "a b [delay=150]", "parameters": {"max_new_tokens": 60}}).encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as s:
        s.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.sendall(body)
        time.sleep(0.6)  # the generation is under way
    deadline = time.monotonic() + 5
    while cancelled(triton_urls) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cancelled(triton_urls) == before + 1  # the model saw its request cancelled


# ---------------------------------------------------------------------- AISBench


def _aisbench(proxy: Proc, max_out_len: int, *prompts: str) -> list[dict[str, Any]]:
    python = Path(os.environ.get("V2PROXY_PEERS_DIR") or launch.peers_dir()) / "aisbench/bin/python"
    if not python.exists():
        pytest.fail(f"AISBench venv missing ({python}): run tests/interop/peers/setup_peers.sh")
    proc = subprocess.run(
        [
            str(python),
            str(HERE / "peers" / "aisbench_mindie_client.py"),
            "127.0.0.1",
            str(proxy.port),
            str(max_out_len),
            *prompts,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("target", ["builtin", "triton-http", "triton-grpc"])
def test_aisbench_mindie_stream_api(get_proxy: Callable[[str], Proc], target: str) -> None:
    prompts = ["My name is Olivier", "你好 世界"]
    if target != "builtin":
        prompts.append("a [fail_after=2]")  # a stream that breaks off after two tokens
    results = _aisbench(get_proxy(target), 7, *prompts)
    assert results[:2] == [
        {"success": True, "content": cycle(p, 7), "error_info": "", "time_points": 8}
        for p in prompts[:2]
    ]
    if target != "builtin":
        # the raw failure line is no event: the client counts the request failed
        assert results[2]["success"] is False
        assert "AISBenchValueError" in results[2]["error_info"]


# ---------------------------------------------------------------------- both directions


@pytest.fixture(scope="module")
def mindie_server() -> Iterator[int]:
    """The MindIE stand-in (peers/mindie_sim.py), its port."""
    with launch.mindie_sim() as (port, _):
        yield port


def test_mindie_clients_through_v2proxy_to_mindie(tmp_path: Path, mindie_server: int) -> None:
    """MindIE's /infer on v2proxy, whose backend is a MindIE server (--backend mindie://): the
    frontend maps onto the v2 model the backend makes of MindIE and back; a MindIE client sees
    what MindIE itself answers (the token ids aside: a v2 text model has none)."""
    direct = Proc("mindie", mindie_server, 0, 0, tmp_path / "none")
    with _proxy_with(tmp_path, "both", f"mindie://127.0.0.1:{mindie_server}", model="llm") as p:
        params = {"max_new_tokens": 7, "details": True, "seed": 11}
        body = {"inputs": "你好 world 😀", "parameters": params}
        (s1, _, via), (s2, _, ref) = post(p, body), post(direct, body)
        assert (s1, s2) == (200, 200)
        ref_obj = json.loads(ref)
        ref_obj["details"].pop("generated_token_ids")
        assert json.loads(via) == ref_obj
        (s1, _, via), (s2, _, ref) = (
            post(p, {**body, "stream": True}),
            post(direct, {**body, "stream": True}),
        )
        got, want = events(via)[0], events(ref)[0]
        for g, w in zip(got, want, strict=True):
            assert g["token"]["text"] == w["token"]["text"]
            assert (g["prefill_time"] is None) == (w["prefill_time"] is None)
            assert (g["decode_time"] is None) == (w["decode_time"] is None)
        assert got[-1]["generated_text"] == want[-1]["generated_text"]
        assert got[-1]["details"] == want[-1]["details"]
