"""OpenAI's API through v2proxy (docs/guides/openai.md), driven by the official ``openai`` Python
client (PyPI) as the real client: completions and chat completions, stream and not, in front of
the builtin ``llm`` (in process), a real Triton (2.51, python backend) serving the decoupled toy
``ensemble`` with TensorRT-LLM's tensors over REST (generate/generate_stream) and over gRPC
(ModelStreamInfer), its vLLM-shaped and generate-extension twins, and the MindIE simulator
(peers/mindie_sim.py, the one stand-in: MindIE needs Ascend hardware) behind ``mindie://``.

The toy models "generate" the words of the prompt in a cycle (``[knob]`` words left out); the
ensemble's test knobs (``[delay=MS]``, ``[fail_after=N]``, ``[cancelled?]``) are described in its
model.py. With the default chat template, a chat's prompt is ``<role>: <content>`` per message then
``assistant:``, so the model cycles those words."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ensemble_probe
import openai
import pytest
from peers import launch
from procs import Proc, v2proxy

HERE = Path(__file__).resolve().parent
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cycle(prompt: str, n: int) -> str:
    words = [w for w in prompt.split() if not w.startswith("[")]
    return " ".join(words[i % len(words)] for i in range(n))


def chat_prompt(messages: list[dict[str, str]]) -> str:
    """The default template's prompt (docs/guides/openai.md)."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


# ---------------------------------------------------------------------- the proxies

#: name -> (backend: builtin | triton-rest | triton-grpc | mindie, extra args, openai models)
TARGETS: dict[str, tuple[str, tuple[str, ...], dict[str, dict[str, Any]]]] = {
    "builtin": (
        "builtin",
        ("--max-input-size", "256"),
        {
            "llm": {"model": "llm"},
            "org/llm-7b": {"model": "llm", "profile": "generate", "max_tokens": 3},
        },
    ),
    "triton-limited": (
        "triton-rest",
        ("--max-concurrency", "2"),
        {"ensemble": {"model": "ensemble", "profile": "trtllm"}},
    ),
    "triton-http": (
        "triton-rest",
        (),
        {
            "ensemble": {"model": "ensemble", "profile": "trtllm"},
            "vllm": {"model": "vllm_model", "profile": "vllm"},
            "generate": {"model": "llm", "profile": "generate"},
            "short": {"model": "ensemble", "timeout": 1},
        },
    ),
    "triton-grpc": (
        "triton-grpc",
        (),
        {
            "ensemble": {"model": "ensemble", "profile": "trtllm"},
            "chatml": {"model": "ensemble", "chat_template": "chatml.jinja"},
            "vllm": {"model": "vllm_model", "profile": "vllm"},
            "short": {"model": "ensemble", "timeout": 1},
        },
    ),
    "mindie": ("mindie", (), {"llm": {"model": "llm"}}),
}
#: each target's model id of the TensorRT-LLM-shaped model
MAIN = {"builtin": "llm", "triton-http": "ensemble", "triton-grpc": "ensemble", "mindie": "llm"}
ALL = ["builtin", "triton-http", "triton-grpc", "mindie"]
TRITON = ["triton-http", "triton-grpc"]


@pytest.fixture(scope="module")
def get_proxy(
    tmp_path_factory: pytest.TempPathFactory,
    backend_urls: Callable[[str], tuple[str, str]],
    sims: dict[str, int],
) -> Iterator[Callable[[str], Proc]]:
    tmp = tmp_path_factory.mktemp("openai")
    (tmp / "chatml.jinja").write_text(CHATML)
    started: dict[str, Proc] = {}
    with contextlib.ExitStack() as stack:

        def get(name: str) -> Proc:
            if name not in started:
                backend, args, models = TARGETS[name]
                if backend == "builtin":
                    url = "builtin"
                elif backend == "mindie":
                    sims[name] = stack.enter_context(launch.mindie_sim())[0]
                    url = f"mindie://127.0.0.1:{sims[name]}"
                else:
                    rest, grpc = backend_urls("triton")
                    url = rest if backend == "triton-rest" else f"grpc://{grpc}"
                cfg = tmp / f"{name}.yaml"
                cfg.write_text(json.dumps({"openai": {"models": models}}))  # JSON is YAML
                started[name] = stack.enter_context(
                    v2proxy("serve", "--backend", url, "--config", str(cfg), *args, name=name)
                )
            return started[name]

        yield get


@pytest.fixture(scope="module")
def sims() -> dict[str, int]:
    """The MindIE simulators the proxies of this module started, their ports by proxy name."""
    return {}


def client(proxy: Proc, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="unused", max_retries=0, **kw
    )


@contextlib.contextmanager
def opened(proxy: Proc) -> Iterator[openai.OpenAI]:
    with client(proxy) as c:
        yield c


def post(
    proxy: Proc, path: str, body: Any, timeout: float = 60
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def sse(raw: bytes) -> list[Any]:
    """The events of a stream, its framing checked exactly: ``data: <json>`` events, each ended
    by a blank line, the last ``data: [DONE]``."""
    assert raw.endswith(b"data: [DONE]\n\n"), raw[-200:]
    events = raw[: -len(b"data: [DONE]\n\n")].split(b"\n\n")
    assert events.pop() == b""
    out = []
    for event in events:
        assert event.startswith(b"data: "), event
        out.append(json.loads(event[len(b"data: ") :]))
    return out


def cancelled(backend_urls: Callable[[str], tuple[str, str]]) -> int:
    return ensemble_probe.cancelled(backend_urls("triton")[0])


def settled(backend_urls: Callable[[str], tuple[str, str]]) -> int:
    return ensemble_probe.settled(backend_urls("triton")[0])


# ---------------------------------------------------------------------- models


def test_models_list_and_retrieve(get_proxy: Callable[[str], Proc]) -> None:
    with opened(get_proxy("builtin")) as c:
        listed = c.models.list()
        assert [m.id for m in listed.data] == ["llm", "org/llm-7b"]
        assert all(m.object == "model" and m.owned_by == "v2proxy" for m in listed.data)
        one = c.models.retrieve("org/llm-7b")
        assert (one.id, one.object) == ("org/llm-7b", "model")
        with pytest.raises(openai.NotFoundError) as info:
            c.models.retrieve("nope")
        assert info.value.body == {
            "message": "The model 'nope' does not exist",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }


# ---------------------------------------------------------------------- completions


@pytest.mark.parametrize("target", ALL)
def test_completion(get_proxy: Callable[[str], Proc], target: str) -> None:
    prompt = "My name is Olivier and I"
    with opened(get_proxy(target)) as c:
        done = c.completions.create(model=MAIN[target], prompt=prompt, max_tokens=8, seed=3)
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    assert done.model == MAIN[target]
    (choice,) = done.choices
    assert choice.text == cycle(prompt, 8)
    assert (choice.index, choice.finish_reason, choice.logprobs) == (0, "length", None)
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (6, 8)
    assert done.usage.total_tokens == 14


@pytest.mark.parametrize("target", ALL)
def test_completion_stream_with_usage(get_proxy: Callable[[str], Proc], target: str) -> None:
    prompt = "你好 世界 😀"
    with opened(get_proxy(target)) as c:
        chunks = list(
            c.completions.create(
                model=MAIN[target],
                prompt=prompt,
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    *texts, last = chunks
    assert "".join(ch.choices[0].text for ch in texts) == cycle(prompt, 5)
    assert [ch.choices[0].finish_reason for ch in texts][-1] == "length"
    assert all(ch.choices[0].finish_reason is None for ch in texts[:-1])
    assert all(ch.usage is None and ch.object == "text_completion" for ch in texts)
    assert len({ch.id for ch in chunks}) == 1
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 5)
    # the wire: events, no usage key without include_usage, [DONE] last
    status, headers, raw = post(
        get_proxy(target),
        "/v1/completions",
        {"model": MAIN[target], "prompt": prompt, "max_tokens": 2, "stream": True},
    )
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert headers["cache-control"] == "no-cache"
    events = sse(raw)
    assert "".join(e["choices"][0]["text"] for e in events) == cycle(prompt, 2)
    assert all("usage" not in e for e in events)


# ---------------------------------------------------------------------- chat


@pytest.mark.parametrize("target", ALL)
def test_chat_completion(get_proxy: Callable[[str], Proc], target: str) -> None:
    messages = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi there"}]
    with opened(get_proxy(target)) as c:
        done = c.chat.completions.create(
            model=MAIN[target],
            messages=messages,  # type: ignore[arg-type]
            max_completion_tokens=7,
            temperature=0.5,
            top_p=0.9,
        )
    prompt = chat_prompt(messages)
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-")
    (choice,) = done.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == cycle(prompt, 7)
    assert choice.finish_reason == "length"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (len(prompt.split()), 7)


@pytest.mark.parametrize("target", ALL)
def test_chat_stream(get_proxy: Callable[[str], Proc], target: str) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "one two"}]}]
    with opened(get_proxy(target)) as c:
        chunks = list(
            c.chat.completions.create(
                model=MAIN[target],
                messages=messages,  # type: ignore[arg-type]
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    prompt = "user: one two\nassistant:"
    *deltas, last = chunks
    assert deltas[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].delta.role is None for ch in deltas[1:])
    assert "".join(ch.choices[0].delta.content or "" for ch in deltas) == cycle(prompt, 6)
    assert deltas[-1].choices[0].finish_reason == "length"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 6)
    # the wire: the usage chunk, then [DONE] (sse() checks the framing and that it ends so)
    status, headers, raw = post(
        get_proxy(target),
        "/v1/chat/completions",
        {
            "model": MAIN[target],
            "messages": messages,
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200 and headers["content-type"] == "text/event-stream"
    *events, usage = sse(raw)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == cycle(prompt, 2)
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 6


def test_chat_template_from_a_file(get_proxy: Callable[[str], Proc]) -> None:
    with opened(get_proxy("triton-grpc")) as c:
        done = c.chat.completions.create(
            model="chatml", messages=[{"role": "user", "content": "Hi there"}], max_tokens=5
        )
    prompt = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    assert done.choices[0].message.content == cycle(prompt, 5)
    assert done.choices[0].message.content.startswith("<|im_start|>user Hi there<|im_end|>")


# ---------------------------------------------------------------------- stop, finish reasons


@pytest.mark.parametrize("target", ["builtin", *TRITON])
def test_stop_sequences_cut_the_text(get_proxy: Callable[[str], Proc], target: str) -> None:
    with opened(get_proxy(target)) as c:
        done = c.completions.create(
            model=MAIN[target], prompt="a b c d", max_tokens=8, stop=["c d", "zz"]
        )
        assert done.choices[0].text == "a b "
        assert done.choices[0].finish_reason == "stop"
        chunks = list(
            c.completions.create(
                model=MAIN[target], prompt="a b c d", max_tokens=8, stop="b c", stream=True
            )
        )
    assert "".join(ch.choices[0].text for ch in chunks) == "a "
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("target", TRITON)
def test_stop_sequence_cancels_the_backend(
    get_proxy: Callable[[str], Proc], target: str, backend_urls: Callable[[str], tuple[str, str]]
) -> None:
    before = settled(backend_urls)
    with opened(get_proxy(target)) as c:
        done = c.completions.create(
            model="ensemble", prompt="a b c [delay=100]", max_tokens=40, stop="c"
        )
    assert (done.choices[0].text, done.choices[0].finish_reason) == ("a b ", "stop")
    deadline = time.monotonic() + 5
    while cancelled(backend_urls) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cancelled(backend_urls) == before + 1  # the model saw the rest of its work dropped


@pytest.mark.parametrize("target", TRITON)
def test_vllm_model_reports_tokens_and_finish_reason(
    get_proxy: Callable[[str], Proc], target: str
) -> None:
    with opened(get_proxy(target)) as c:
        done = c.completions.create(model="vllm", prompt="a b <eos> c", max_tokens=10)
        assert done.choices[0].text == "a b"
        assert done.choices[0].finish_reason == "stop"  # vLLM's own reason
        assert done.usage is not None and done.usage.completion_tokens == 2
        chat = c.chat.completions.create(
            model="vllm", messages=[{"role": "user", "content": "x y"}], max_tokens=3
        )
    assert chat.choices[0].message.content == cycle("user: x y\nassistant:", 3)


def test_generate_profile(get_proxy: Callable[[str], Proc]) -> None:
    with opened(get_proxy("triton-http")) as c:
        done = c.completions.create(model="generate", prompt="p q r", max_tokens=4)
    assert done.choices[0].text == cycle("p q r", 4)
    with opened(get_proxy("builtin")) as c:  # its default max_tokens: 3
        done = c.completions.create(model="org/llm-7b", prompt="p q r s")
    assert done.choices[0].text == "p q r"


def test_mindie_backend_receives_the_knobs(
    get_proxy: Callable[[str], Proc], sims: dict[str, int]
) -> None:
    with opened(get_proxy("mindie")) as c:
        done = c.completions.create(
            model="llm", prompt="x y z", max_tokens=4, temperature=0.25, top_p=0.5, seed=99
        )
    assert done.choices[0].text == "x y z x"
    conn = http.client.HTTPConnection("127.0.0.1", sims["mindie"], timeout=10)
    try:
        conn.request("GET", "/sim/last")
        last = json.loads(conn.getresponse().read())["body"]
    finally:
        conn.close()
    assert last["inputs"] == "x y z"
    params = last["parameters"]
    assert (params["max_new_tokens"], params["seed"]) == (4, 99)
    assert params["temperature"] == pytest.approx(0.25)
    assert params["top_p"] == pytest.approx(0.5)


# ---------------------------------------------------------------------- errors and limits


ERRORS: list[tuple[str, Any, int, str | None, str]] = [
    ("/v1/completions", b"{not json", 400, "", "not valid JSON"),
    ("/v1/completions", {"model": "llm"}, 400, "prompt", "'prompt' is required"),
    ("/v1/completions", {"prompt": "x"}, 400, "model", "'model' is required"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "n": 3}, 400, "n", "must be 1"),
    ("/v1/completions", {"model": "llm", "prompt": [1, 2]}, 400, "prompt", "token ids"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "max_tokens": 0}, 400, "max_tokens", ""),
    ("/v1/completions", {"model": "llm", "prompt": "x", "temperature": 9}, 400, "temperature", ""),
    # the body itself is over --max-input-size (256): refused as it is read
    ("/v1/completions", {"model": "llm", "prompt": "x" * 300}, 413, None, "--max-input-size"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, None, "does not exist"),
    ("/v1/chat/completions", {"model": "llm", "messages": []}, 400, "messages", "non-empty"),
    (
        "/v1/chat/completions",
        {"model": "llm", "messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages[0].role",
        "one of system",
    ),
    (
        "/v1/chat/completions",
        {"model": "llm", "messages": [{"role": "user", "content": "x"}], "tools": [{}]},
        400,
        "tools",
        "tool calls",
    ),
    (
        "/v1/chat/completions",
        {"model": "llm", "messages": [{"role": "user", "content": "x" * 300}]},
        413,
        None,
        "--max-input-size",
    ),
    (
        "/v1/completions",
        {"model": "llm", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]},
        400,
        "stop",
        "--max-stops",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "param", "fragment"), ERRORS)
def test_malformed_bodies_get_openai_errors_and_the_proxy_keeps_serving(
    get_proxy: Callable[[str], Proc],
    path: str,
    body: Any,
    status: int,
    param: str | None,
    fragment: str,
) -> None:
    proxy = get_proxy("builtin")
    got, headers, raw = post(proxy, path, body)
    assert got == status, raw
    assert headers["content-type"] == "application/json"
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == (param or None) and fragment in error["message"]
    with opened(proxy) as c:  # and the next request is served
        assert c.completions.create(model="llm", prompt="ok", max_tokens=1).choices[0].text == "ok"


def test_the_openai_client_raises_with_the_param(get_proxy: Callable[[str], Proc]) -> None:
    with opened(get_proxy("builtin")) as c:
        with pytest.raises(openai.BadRequestError) as info:
            c.completions.create(model="llm", prompt="x", logprobs=2)
        assert info.value.status_code == 400
        assert isinstance(info.value.body, dict) and info.value.body["param"] == "logprobs"
        with pytest.raises(openai.NotFoundError) as missing:
            c.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
        assert isinstance(missing.value.body, dict)
        assert missing.value.body["code"] == "model_not_found"


def test_max_concurrency_is_an_openai_503(get_proxy: Callable[[str], Proc]) -> None:
    proxy = get_proxy("triton-limited")  # --max-concurrency 2
    body = json.dumps(
        {"model": "ensemble", "prompt": "a [delay=200]", "max_tokens": 8, "stream": True}
    ).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with contextlib.ExitStack() as held:
        for _ in range(2):
            s = held.enter_context(socket.create_connection(("127.0.0.1", proxy.port), timeout=30))
            s.sendall(head + body)
            assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")
        status, headers, raw = post(proxy, "/v1/completions", {"model": "ensemble", "prompt": "x"})
    assert status == 503 and headers["retry-after"] == "1"
    error = json.loads(raw)["error"]
    assert (error["type"], error["code"]) == ("server_error", "overloaded")
    assert "--max-concurrency" in error["message"]


# ---------------------------------------------------------------------- failures and deadlines


@pytest.mark.parametrize("target", TRITON)
def test_backend_failure_mid_stream(get_proxy: Callable[[str], Proc], target: str) -> None:
    body = {"model": "ensemble", "prompt": "a b [fail_after=2]", "max_tokens": 6, "stream": True}
    status, _, raw = post(get_proxy(target), "/v1/completions", body)
    assert status == 200
    *texts, failure = sse(raw)
    assert "".join(e["choices"][0]["text"] for e in texts) == "a b"
    assert failure["error"]["type"] == "server_error" and failure["error"]["message"]
    with opened(get_proxy(target)) as c:
        stream = c.completions.create(
            model="ensemble", prompt="a b [fail_after=2]", max_tokens=6, stream=True
        )
        with pytest.raises(openai.APIError):
            for _ in stream:
                pass


@pytest.mark.parametrize("target", TRITON)
def test_the_timeout_is_the_proxy_deadline(get_proxy: Callable[[str], Proc], target: str) -> None:
    proxy = get_proxy(target)  # model "short": timeout 1 s
    body = {"model": "short", "prompt": "a b [delay=300]", "max_tokens": 10}
    t0 = time.monotonic()
    status, _, raw = post(proxy, "/v1/completions", body)
    assert status == 504 and time.monotonic() - t0 < 5
    assert json.loads(raw)["error"]["code"] == "timeout"
    status, _, raw = post(proxy, "/v1/completions", {**body, "stream": True})
    assert status == 200
    *texts, failure = sse(raw)
    assert 1 <= len(texts) <= 4
    assert failure["error"]["code"] == "timeout"


@pytest.mark.parametrize("target", TRITON)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_client_going_away_cancels_the_backend(
    get_proxy: Callable[[str], Proc],
    backend_urls: Callable[[str], tuple[str, str]],
    target: str,
    stream: bool,
) -> None:
    proxy = get_proxy(target)
    before = settled(backend_urls)
    body = json.dumps(
        {
            "model": "ensemble",
            "messages": [{"role": "user", "content": "a b [delay=150]"}],
            "max_tokens": 60,
            "stream": stream,
        }
    ).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as s:
        s.sendall(head % len(body) + body)
        if stream:
            got = b""
            while got.count(b"data: ") < 2:
                chunk = s.recv(4096)
                assert chunk
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 OK")
        else:
            time.sleep(0.6)  # the generation is under way
    deadline = time.monotonic() + 5
    while cancelled(backend_urls) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cancelled(backend_urls) == before + 1


# ---------------------------------------------------------------------- metrics


def test_metrics_say_frontend_openai(get_proxy: Callable[[str], Proc]) -> None:
    proxy = get_proxy("builtin")
    with opened(proxy) as c:
        list(c.completions.create(model="llm", prompt="m n", max_tokens=3, stream=True))
        c.models.retrieve("org/llm-7b")
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()

    def sample(name: str, *labels: str) -> float:
        for line in text.splitlines():
            if line.startswith(name + "{") and all(label in line for label in labels):
                return float(line.split()[-1])
        raise AssertionError(f"{name} {labels} not in /metrics")

    labels = ('frontend="openai"', 'operation="openai"', 'model="llm"', 'code_class="2xx"')
    assert sample("v2proxy_requests_total", *labels) >= 1
    retrieved = ('frontend="openai"', 'operation="metadata"', 'model="org/llm-7b"')
    assert sample("v2proxy_requests_total", *retrieved) >= 1
    assert (
        sample("v2proxy_mindie_generated_tokens_total", 'direction="frontend"', 'model="llm"') >= 3
    )
    assert sample("v2proxy_mindie_time_to_first_token_seconds_count", 'model="llm"') >= 1


def test_compressed_bodies_and_wrong_methods(get_proxy: Callable[[str], Proc]) -> None:
    proxy = get_proxy("builtin")
    raw = json.dumps({"model": "llm", "prompt": "z y", "max_tokens": 3}).encode()
    for encoding, data in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw))):
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        try:
            conn.request("POST", "/v1/completions", data, {"Content-Encoding": encoding})
            resp = conn.getresponse()
            assert resp.status == 200
            assert json.loads(resp.read())["choices"][0]["text"] == "z y z"
        finally:
            conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", raw, {"Content-Encoding": "br"})
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("accept-encoding")) == (415, "gzip, deflate")
        assert json.loads(resp.read())["error"]["type"] == "invalid_request_error"
        conn.request("GET", "/v1/chat/completions")
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("allow")) == (405, "POST")
        assert json.loads(resp.read())["error"]["message"] == "Method Not Allowed"
    finally:
        conn.close()
