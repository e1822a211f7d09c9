"""The generate extension (``POST /v2/models/{m}/generate`` and ``generate_stream``) through
v2proxy in front of every kind of backend, with a real Triton (serving the builtin models'
twins, peers/triton_models, the decoupled ``llm`` among them) as the oracle:

- in front of the builtin models (mapped in process),
- in front of ``v2proxy reference-server`` over REST (passed through: the reference server has
  the extension) and over gRPC (mapped onto ModelStreamInfer),
- in front of Triton over REST (passed through unchanged) and over gRPC (mapped),
- in front of KServe and MLServer (mapped onto v2 /infer; models that are not decoupled).

Answers are compared with Triton's straight answer byte for byte and element by element, SSE
event by event. Where v2proxy differs from Triton on purpose (400 for malformed JSON and type
errors, which Triton answers 500; 400 for a generate its model answers several times, which
Triton answers 200; an error at the first response of a stream as a JSON answer), the mapped
backends are checked against v2proxy's own behaviour and the pass-through against Triton's.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from procs import Proc, v2proxy

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
REQUEST_ID_PREFIX = "[request id: <id_unknown>] "
SSE_TYPE = "text/event-stream; charset=utf-8"
NOT_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that"
    " generates various number of responses"
)
LOOPS = ["uvloop", "asyncio"]

#: backends with the decoupled `llm`
LLM_BACKENDS = ["builtin", "reference", "reference-grpc", "triton", "triton-grpc"]
#: those where the proxy maps generate onto inference (the others pass it through)
MAPPED = {"builtin", "reference-grpc", "triton-grpc", "kserve", "mlserver"}
#: backends serving `simple` and `identity_fp32` (not decoupled)
SIMPLE_BACKENDS = [*LLM_BACKENDS, "kserve", "mlserver"]


def _start(
    key: tuple[str, str], stack: contextlib.ExitStack, proxies: dict[Any, Proc], urls: Any
) -> Proc:
    """The session's v2proxy for (backend, event loop), shared with conftest's fixtures."""
    if key not in proxies:
        backend, loop = key
        url = "builtin"
        if backend != "builtin":
            server, _, proto = backend.partition("-")
            rest, grpc = urls(server)
            url = f"grpc://{grpc}" if proto == "grpc" else rest
        proxies[key] = stack.enter_context(
            v2proxy("serve", "--backend", url, "--event-loop", loop, name=f"proxy-{backend}")
        )
    return proxies[key]


@pytest.fixture(params=[(b, loop) for b in LLM_BACKENDS for loop in LOOPS], ids="-".join)
def gen_proxy(request: pytest.FixtureRequest, stack: Any, proxies: Any, backend_urls: Any) -> Any:
    """(backend name, a v2proxy in front of a backend with the decoupled llm)."""
    return request.param[0], _start(request.param, stack, proxies, backend_urls)


@pytest.fixture(params=SIMPLE_BACKENDS)
def simple_proxy(
    request: pytest.FixtureRequest, stack: Any, proxies: Any, backend_urls: Any
) -> Any:
    return request.param, _start((request.param, "uvloop"), stack, proxies, backend_urls)


@pytest.fixture(scope="session")
def triton(backend_urls: Any) -> str:
    return str(backend_urls("triton")[0])


def post(base: str, path: str, body: bytes | dict[str, Any], headers: Any = None) -> Any:
    """(status, content type, body) of a POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST", headers=headers or {})
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type"), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type"), exc.read()


def events(base: str, path: str, body: dict[str, Any]) -> tuple[int, str, list[bytes]]:
    """(status, content type, the SSE events as they arrive, each ``data: ...\\n\\n``)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, json.dumps(body).encode())
        resp = conn.getresponse()
        out: list[bytes] = []
        event = b""
        while line := resp.readline():
            event += line
            if line in (b"\n", b"\r\n"):
                out.append(event)
                event = b""
        assert event == b"", event  # nothing after the last blank line
        return resp.status, resp.headers.get("Content-Type"), out
    finally:
        conn.close()


def _triton_text(text: str) -> str:
    """Triton's core prefixes its errors with the request id; v2proxy's own do not."""
    return text.replace(REQUEST_ID_PREFIX, "")


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() + b"\n\n"


def _llm(text: str, rid: str | None = None) -> dict[str, Any]:
    out = {"model_name": "llm", "model_version": "1", "text_output": text}
    return out if rid is None else {"id": rid, **out}


# ------------------------------------------------------------------ answers


def test_generate(gen_proxy: Any, triton: str) -> None:
    _, proxy = gen_proxy
    body = {"id": "r-1", "text_input": "hello big world", "max_tokens": 5}
    status, ctype, raw = post(proxy.base_url, "/v2/models/llm/generate", body)
    assert (status, ctype) == (200, "application/json")
    answer = json.loads(raw)
    assert list(answer) == ["id", "model_name", "model_version", "text_output"]
    assert answer["id"] == "r-1"
    assert answer["model_name"] == "llm"
    assert answer["model_version"] == "1"
    assert answer["text_output"] == "hello big world hello big world hello big"
    assert raw == post(triton, "/v2/models/llm/generate", body)[2]


def test_generate_stream_event_by_event(gen_proxy: Any, triton: str) -> None:
    _, proxy = gen_proxy
    body = {"text_input": "one two three", "max_tokens": 5, "stream": True, "id": "s"}
    status, ctype, got = events(proxy.base_url, "/v2/models/llm/generate_stream", body)
    assert (status, ctype) == (200, SSE_TYPE)
    tokens = ["one", " two", " three", " one", " two"]
    assert got == [_event(_llm(t, "s")) for t in tokens]
    assert (status, ctype, got) == events(triton, "/v2/models/llm/generate_stream", body)


def test_generate_stream_one_response(gen_proxy: Any, triton: str) -> None:
    """Without ``stream`` the model answers once: one event with the prompt and the text."""
    _, proxy = gen_proxy
    body = {"text_input": "a b", "max_tokens": 3}
    got = events(proxy.base_url, "/v2/models/llm/generate_stream", body)
    assert got == (200, SSE_TYPE, [_event(_llm("a b a b a"))])
    assert got == events(triton, "/v2/models/llm/generate_stream", body)


def test_generate_chinese_text(gen_proxy: Any) -> None:
    _, proxy = gen_proxy
    body = {"text_input": "你好 世界", "max_tokens": 3, "exclude_input_in_output": True}
    status, _, raw = post(proxy.base_url, "/v2/models/llm/generate", body)
    assert status == 200
    assert json.loads(raw)["text_output"] == "你好 世界 你好"


def test_generate_version_path(gen_proxy: Any, triton: str) -> None:
    _, proxy = gen_proxy
    body = {"text_input": "x", "max_tokens": 1}
    ours = post(proxy.base_url, "/v2/models/llm/versions/1/generate", body)
    assert ours == (
        200,
        "application/json",
        json.dumps(_llm("x x"), separators=(",", ":")).encode(),
    )
    assert ours[2] == post(triton, "/v2/models/llm/versions/1/generate", body)[2]


# (id, path, body): answered alike by Triton and v2proxy whatever the backend
SAME: list[tuple[str, str, dict[str, Any]]] = [
    (
        "inputs-inside-parameters",
        "llm/generate",
        {"text_input": "x", "parameters": {"max_tokens": 2, "foo": "bar"}},
    ),
    (
        "other-keys-are-parameters",
        "llm/generate",
        {"text_input": "x", "max_tokens": 1, "bogus": 1, "f": 1.5},
    ),
    ("arrays-of-one", "llm/generate", {"text_input": ["a b"], "max_tokens": [[2]]}),
    (
        "knobs",
        "llm/generate",
        {"text_input": "a", "max_tokens": 2, "temperature": 0.5, "top_k": 3, "top_p": 1, "seed": 5},
    ),
    ("empty-id", "llm/generate", {"text_input": "a", "max_tokens": 1, "id": ""}),
    ("unknown-model", "nope/generate", {"text_input": "x"}),
    ("unknown-model-stream", "nope/generate_stream", {"text_input": "x"}),
    ("unknown-version", "llm/versions/2/generate", {"text_input": "x"}),
    ("shape", "llm/generate", {"text_input": "a", "max_tokens": [2, 3]}),
    ("shape-stream", "llm/generate_stream", {"text_input": "a", "max_tokens": [2, 3]}),
    ("parameter-array", "llm/generate", {"text_input": "a", "bogus": [1, 2]}),
    ("parameter-null", "llm/generate", {"text_input": "a", "bogus": None}),
    ("nested-parameter-object", "llm/generate", {"text_input": "a", "parameters": {"x": {"y": 1}}}),
    ("input-twice", "llm/generate", {"text_input": "a", "parameters": {"text_input": "b"}}),
    ("model-error", "llm/generate", {"text_input": "a", "max_tokens": 0}),
]


@pytest.mark.parametrize(("path", "body"), [c[1:] for c in SAME], ids=[c[0] for c in SAME])
def test_same_as_triton(gen_proxy: Any, triton: str, path: str, body: dict[str, Any]) -> None:
    name, proxy = gen_proxy
    status, ctype, raw = post(proxy.base_url, "/v2/models/" + path, body)
    t_status, t_ctype, t_raw = post(triton, "/v2/models/" + path, body)
    assert (status, ctype) == (t_status, t_ctype)
    if name == "triton":
        assert raw == t_raw  # passed through unchanged
    elif status == 200:
        assert json.loads(raw) == json.loads(t_raw)
        assert raw == t_raw
    else:
        assert json.loads(raw) == {"error": _triton_text(json.loads(t_raw)["error"])}


# (id, path, body, status, error): what v2proxy answers where Triton answers otherwise
OWN: list[tuple[str, str, bytes, int, str]] = [
    ("bad-json", "llm/generate", b"not json", 400, "failed to parse the request JSON buffer: "),
    (
        "bad-json-stream",
        "llm/generate_stream",
        b"{",
        400,
        "failed to parse the request JSON buffer: ",
    ),
    ("empty-body", "llm/generate", b"", 400, "failed to parse the request JSON buffer: "),
    ("not-object", "llm/generate", b"[1, 2]", 400, "the generate request must be a JSON object"),
    (
        "bytes-type",
        "llm/generate",
        b'{"text_input": 5}',
        400,
        "Unable to parse 'data' for input 'text_input': BYTES elements must be strings",
    ),
    (
        "int-type",
        "llm/generate",
        b'{"text_input": "a", "max_tokens": "3"}',
        400,
        "Unable to parse 'data' for input 'max_tokens': INT32 elements must be integers",
    ),
    (
        "id-type",
        "llm/generate",
        b'{"text_input": "a", "id": 5}',
        400,
        "Unable to parse 'id': attempt to access JSON non-string as string",
    ),
    (
        "parameters-type",
        "llm/generate",
        b'{"text_input": "a", "parameters": 5}',
        400,
        "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object",
    ),
    (
        "several-responses",
        "llm/generate",
        b'{"text_input": "a b", "max_tokens": 2, "stream": true}',
        400,
        NOT_ONE,
    ),
    (
        "stream-first-error",
        "llm/generate_stream",
        b'{"text_input": "a", "max_tokens": 0}',
        400,
        "input 'max_tokens' of model 'llm' must be at least 1",
    ),
]


def _passed_through(body: bytes) -> bool:
    """Whether v2proxy passes the body on to Triton: a JSON object whose parameters (if any)
    are an object; others v2proxy refuses itself (Triton answers them with 500)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("parameters", {}), dict)


@pytest.mark.parametrize(
    ("path", "body", "status", "error"), [c[1:] for c in OWN], ids=[c[0] for c in OWN]
)
def test_errors(
    gen_proxy: Any, triton: str, path: str, body: bytes, status: int, error: str
) -> None:
    name, proxy = gen_proxy
    ours = post(proxy.base_url, "/v2/models/" + path, body)
    if name == "triton" and _passed_through(body):
        # passed through: Triton's own answer, whatever it is (a body that is no JSON object
        # is refused before: Triton answers 500 to the client's malformed JSON)
        assert ours == post(triton, "/v2/models/" + path, body)
        return
    assert ours[:2] == (status, "application/json")
    message = json.loads(ours[2])["error"]
    assert message.startswith(error), message


def test_gzip_body(gen_proxy: Any) -> None:
    name, proxy = gen_proxy
    body = gzip.compress(b'{"text_input": "a", "max_tokens": 1}')
    status, _, raw = post(
        proxy.base_url, "/v2/models/llm/generate", body, {"Content-Encoding": "gzip"}
    )
    if name == "triton":  # Triton takes no compressed generate bodies
        assert (status, json.loads(raw)) == (
            400,
            {"error": "Unsupported content-encoding, only 'identity' is supported."},
        )
    else:
        assert (status, json.loads(raw)) == (200, _llm("a a"))


# ------------------------------------------------------------------ models that are not decoupled


SIMPLE_BODY = {"INPUT0": list(range(16)), "INPUT1": [2] * 16}


def test_generate_simple(simple_proxy: Any, triton: str) -> None:
    _, proxy = simple_proxy
    status, ctype, raw = post(proxy.base_url, "/v2/models/simple/generate", SIMPLE_BODY)
    assert (status, ctype) == (200, "application/json")
    answer = json.loads(raw)
    assert answer["OUTPUT0"] == [i + 2 for i in range(16)]
    assert answer["OUTPUT1"] == [i - 2 for i in range(16)]
    assert answer["model_name"] == "simple"
    expected = json.loads(post(triton, "/v2/models/simple/generate", SIMPLE_BODY)[2])
    for key in ("OUTPUT0", "OUTPUT1", "model_name"):
        assert answer[key] == expected[key], key


def test_generate_stream_simple(simple_proxy: Any) -> None:
    _, proxy = simple_proxy
    status, ctype, got = events(proxy.base_url, "/v2/models/simple/generate_stream", SIMPLE_BODY)
    assert (status, ctype, len(got)) == (200, SSE_TYPE, 1)
    answer = json.loads(got[0].removeprefix(b"data: "))
    assert answer["OUTPUT0"] == [i + 2 for i in range(16)]
    assert answer["OUTPUT1"] == [i - 2 for i in range(16)]


def test_generate_fp32(simple_proxy: Any, triton: str) -> None:
    _, proxy = simple_proxy
    body = {"INPUT0": [1.5, 2, 3.3]}
    status, _, raw = post(proxy.base_url, "/v2/models/identity_fp32/generate", body)
    assert status == 200
    answer = json.loads(raw)
    assert answer["OUTPUT0"] == [1.5, 2.0, 3.299999952316284]
    assert (
        answer["OUTPUT0"]
        == json.loads(post(triton, "/v2/models/identity_fp32/generate", body)[2])["OUTPUT0"]
    )


def test_generate_shape_error_simple(simple_proxy: Any, triton: str) -> None:
    _, proxy = simple_proxy
    body = {"INPUT0": [1, 2, 3], "INPUT1": [1, 2, 3]}
    ours = post(proxy.base_url, "/v2/models/simple/generate", body)
    assert ours == post(triton, "/v2/models/simple/generate", body)
    assert json.loads(ours[2]) == {
        "error": "The schema can not convert input 'INPUT0' to tensor with proper shape"
    }


# ------------------------------------------------------------------ the reference server itself


def test_reference_server_serves_generate(backend_urls: Any, triton: str) -> None:
    base = backend_urls("reference")[0]
    body = {"text_input": "x y", "max_tokens": 3, "stream": True}
    assert events(base, "/v2/models/llm/generate_stream", body) == events(
        triton, "/v2/models/llm/generate_stream", body
    )
    body = {"text_input": "x y", "max_tokens": 3}
    assert post(base, "/v2/models/llm/generate", body)[:3] == (
        200,
        "application/json",
        post(triton, "/v2/models/llm/generate", body)[2],
    )
    with _OPENER.open(base + "/v2", timeout=10) as resp:
        assert "generate" in json.loads(resp.read())["extensions"]


# ------------------------------------------------------------------ client going away, metrics


def _metric(base: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    with _OPENER.open(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


@contextlib.contextmanager
def _first_event_then_leave(proxy: Proc, body: dict[str, Any]) -> Iterator[bytes]:
    """Open a generate_stream, read until its first event, then drop the connection."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
    try:
        data = json.dumps(body).encode()
        sock.sendall(
            b"POST /v2/models/llm/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        got = b""
        while b"\n\n" not in got.partition(b"\r\n\r\n")[2].partition(b"data:")[2]:
            chunk = sock.recv(4096)
            assert chunk, got
            got += chunk
        yield got
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()


def _wait_for(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


LONG = {"text_input": "a b c d", "max_tokens": 200000, "stream": True}


@pytest.mark.parametrize("loop", LOOPS)
def test_client_leaving_cancels_passed_through_stream(
    loop: str, stack: Any, proxies: Any, backend_urls: Any
) -> None:
    """In front of the reference server (REST, passed through): the reference server sees the
    proxy give its answer up, and the proxy records the client's leaving."""
    proxy = _start(("reference", loop), stack, proxies, backend_urls)
    ref = backend_urls("reference")[0]
    labels = {"operation": "generate", "error": "client_disconnected"}
    before = _metric(ref, "v2proxy_request_errors_total", **labels)
    mine = _metric(proxy.base_url, "v2proxy_request_errors_total", **labels)
    with _first_event_then_leave(proxy, LONG) as got:
        assert got.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b'data: {"model_name":"llm","model_version":"1","text_output":"a"}' in got
    _wait_for(lambda: _metric(ref, "v2proxy_request_errors_total", **labels) == before + 1)
    _wait_for(lambda: _metric(proxy.base_url, "v2proxy_request_errors_total", **labels) == mine + 1)


# (not triton-grpc: Triton's python-backend twin does not look at cancellation and would go on
# producing its 200000 responses, holding its one model instance for the tests after this one)
@pytest.mark.parametrize("backend", ["builtin", "reference-grpc"])
def test_client_leaving_cancels_mapped_stream(
    backend: str, stack: Any, proxies: Any, backend_urls: Any
) -> None:
    """Mapped (in process, or onto ModelStreamInfer): the backend stream is closed (cancelled)
    when the client goes away, long before its 200000 responses could have been sent, and the
    request is recorded as the client's leaving."""
    proxy = _start((backend, "uvloop"), stack, proxies, backend_urls)
    streams = {"operation": "stream_infer", "model": "llm"}
    gone = {"operation": "generate", "error": "client_disconnected"}
    count = "v2proxy_backend_request_duration_seconds_count"
    before = _metric(proxy.base_url, count, **streams)
    mine = _metric(proxy.base_url, "v2proxy_request_errors_total", **gone)
    with _first_event_then_leave(proxy, LONG) as got:
        assert b'"text_output":"a"' in got
    t0 = time.monotonic()
    _wait_for(lambda: _metric(proxy.base_url, count, **streams) == before + 1)
    _wait_for(lambda: _metric(proxy.base_url, "v2proxy_request_errors_total", **gone) == mine + 1)
    # the whole stream of 200000 events takes more than 20 s here (over a minute via gRPC)
    assert time.monotonic() - t0 < 5


def test_generate_counted_in_metrics(gen_proxy: Any) -> None:
    _, proxy = gen_proxy
    labels = {"operation": "generate", "model": "llm", "frontend": "rest", "code_class": "2xx"}
    before = _metric(proxy.base_url, "v2proxy_requests_total", **labels)
    post(proxy.base_url, "/v2/models/llm/generate", {"text_input": "a", "max_tokens": 1})
    events(proxy.base_url, "/v2/models/llm/generate_stream", {"text_input": "a", "max_tokens": 1})
    assert _metric(proxy.base_url, "v2proxy_requests_total", **labels) == before + 2
