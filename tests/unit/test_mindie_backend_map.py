"""The MindIE backend's pure mapping (v2proxy.codecs.mindie_backend): v2 tensors and request
parameters onto MindIE's /infer body, MindIE's answers, stream events and errors back."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from v2proxy.codecs import mindie_backend as mb
from v2proxy.codecs.dtypes import as_numpy, from_numpy, serialize_bytes
from v2proxy.core.errors import (
    BackendError,
    BackendUnavailable,
    BadGateway,
    InvalidRequest,
    NotFound,
    ProxyError,
)
from v2proxy.core.model import Datatype, InferResponse, Tensor
from v2proxy.ops.config import parse_backend

DTYPES = {
    "max_tokens": Datatype.INT32,
    "stream": Datatype.BOOL,
    "temperature": Datatype.FP32,
    "top_k": Datatype.INT32,
    "top_p": Datatype.FP32,
    "seed": Datatype.UINT64,
}


def tensors(text: str | bytes = "hello world", **knobs: Any) -> dict[str, Tensor]:
    raw = text.encode() if isinstance(text, str) else text
    out = {"text_input": Tensor("text_input", Datatype.BYTES, (1,), serialize_bytes([raw]))}
    for name, value in knobs.items():
        dtype = DTYPES[name]
        out[name] = from_numpy(name, dtype, np.array([value]))
    return out


def text_of(response: InferResponse) -> str:
    (tensor,) = response.outputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("text_output", Datatype.BYTES, (1,))
    value = as_numpy(tensor)[0]
    assert isinstance(value, bytes)
    return value.decode()


# ------------------------------------------------------------------ requests

REQUESTS = [
    # (tensors, request parameters, expected body parameters besides details, stream)
    (tensors(), {}, {}, False),
    (tensors(stream=True), {}, {}, True),
    (tensors(stream=False, max_tokens=7), {}, {"max_new_tokens": 7}, False),
    (
        tensors(temperature=0.5, top_k=10, top_p=0.95, seed=846930886),
        {},
        {"temperature": 0.5, "top_k": 10, "top_p": 0.95, "seed": 846930886},
        False,
    ),
    # v2 LLM backends' "off" values, as MindIE takes them
    (tensors(temperature=0.0), {}, {"do_sample": False}, False),
    (tensors(top_k=0), {}, {}, False),
    (tensors(top_p=1.0), {}, {}, False),
    # the request's parameters: MindIE's knobs, max_tokens renamed; tensors win
    ({**tensors()}, {"max_tokens": 3}, {"max_new_tokens": 3}, False),
    (
        tensors(max_tokens=9),
        {"max_new_tokens": 3, "repetition_penalty": 1.03, "do_sample": True},
        {"max_new_tokens": 9, "repetition_penalty": 1.03, "do_sample": True},
        False,
    ),
    (tensors(), {"temperature": 0}, {"do_sample": False}, False),
    # Triton's priority and timeout mean something else than MindIE's: not passed; nor unknown
    (tensors(), {"priority": 1, "timeout": 1000, "exclude_input_in_output": True}, {}, False),
    (tensors(seed=2**63 + 5), {}, {"seed": 2**63 + 5}, False),
]


@pytest.mark.parametrize(("inputs", "params", "expected", "stream"), REQUESTS)
def test_infer_body(
    inputs: dict[str, Tensor], params: dict[str, Any], expected: dict[str, Any], stream: bool
) -> None:
    call = mb.infer_body(inputs, params)
    assert call.stream is stream
    assert call.body == {
        "inputs": "hello world",
        "stream": stream,
        "parameters": {**expected, "details": True},
    }
    for key, value in call.body["parameters"].items():
        assert type(value) is type(expected.get(key, True)), key


@pytest.mark.parametrize(
    ("text", "inputs"),
    [
        ("My name is 中文", "My name is 中文"),
        ("[1, 2]", "[1, 2]"),
        ("[not json", "[not json"),
        (
            '[{"type":"text","text":"Describe"},{"type":"image_url","image_url":"/a.png"}]',
            [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": "/a.png"}],
        ),
    ],
)
def test_prompt_forms(text: str, inputs: Any) -> None:
    assert mb.infer_body(tensors(text), {}).body["inputs"] == inputs


def test_prompt_not_utf8() -> None:
    with pytest.raises(InvalidRequest, match=r"text_input.*UTF-8"):
        mb.infer_body(tensors(b"\xff\xfe"), {})


def test_scalar_knob_with_two_elements() -> None:
    inputs = tensors()
    inputs["max_tokens"] = from_numpy("max_tokens", Datatype.INT32, np.array([1, 2]))
    with pytest.raises(InvalidRequest, match="'max_tokens' must hold one element, not 2"):
        mb.infer_body(inputs, {})


# ------------------------------------------------------------------ non-stream answers


def test_non_stream_response() -> None:
    body = (
        b'{"generated_text":"am a French","details":{"finish_reason":"length",'
        b'"generated_tokens":3,"generated_token_ids":[1,2,3],"seed":846930886}}'
    )
    r = mb.non_stream_response("llm", "req-1", body)
    assert (r.model_name, r.model_version, r.id) == ("llm", "1", "req-1")
    assert text_of(r) == "am a French"
    assert r.parameters == {"finish_reason": "length", "generated_tokens": 3, "seed": 846930886}


def test_non_stream_without_details() -> None:
    r = mb.non_stream_response("llm", None, '{"generated_text":"中文"}'.encode())
    assert text_of(r) == "中文"
    assert r.parameters == {}


@pytest.mark.parametrize(
    "body", [b"", b"not json", b"[]", b'{"text":"x"}', b'{"generated_text":1}']
)
def test_non_stream_not_mindie(body: bytes) -> None:
    with pytest.raises(BadGateway, match="invalid answer from MindIE to /infer"):
        mb.non_stream_response("llm", None, body)


# ------------------------------------------------------------------ errors

ERRORS = [
    (422, b'{"error":"Parameter top_p must be in (0.0,1.0], got 1.0.","error_type":'
     b'"Input Validation Error"}', InvalidRequest, 400, "INVALID_ARGUMENT",
     "Parameter top_p must be in (0.0,1.0], got 1.0."),
    (400, b'{"error":"bad","error_type":"Bad Request"}', InvalidRequest, 400, "INVALID_ARGUMENT",
     "bad"),
    (413, b"Payload Too Large", InvalidRequest, 400, "INVALID_ARGUMENT", "Payload Too Large"),
    (404, b'{"error":"nope","error_type":"NotFoundError"}', NotFound, 404, "NOT_FOUND", "nope"),
    (424, b'{"error":"Failed to build","error_type":"Generation Error"}', BackendError, 500,
     "INTERNAL", "Failed to build"),
    (500, b'{"error":"Engine callback timeout: client timeout","error_type":'
     b'"Incomplete Generation"}', BackendError, 500, "INTERNAL",
     "Engine callback timeout: client timeout"),
    (503, b'{"error":"The service has been stopped","error_type":"Service Unavailable"}',
     BackendUnavailable, 503, "UNAVAILABLE", "The service has been stopped"),
    (503, b"", BackendUnavailable, 503, "UNAVAILABLE", "MindIE is not ready (HTTP 503)"),
    (429, b'{"error":"busy"}', BackendError, 429, "RESOURCE_EXHAUSTED", "busy"),
    (502, b"", BackendError, 502, "UNAVAILABLE", "MindIE answered HTTP 502"),
]  # fmt: skip


@pytest.mark.parametrize(("status", "body", "cls", "http", "grpc", "message"), ERRORS)
def test_error_for(
    status: int, body: bytes, cls: type[ProxyError], http: int, grpc: str, message: str
) -> None:
    err = mb.error_for(status, body)
    assert type(err) is cls
    assert (err.http_status, err.grpc_code, err.message) == (http, grpc, message)


# ------------------------------------------------------------------ streams

SEED_STREAM = (
    b'data: {"prefill_time":45,"decode_time":null,"token":{"id":626,"text":"am"}}\n\n'
    b'data: {"prefill_time":null,"decode_time":12,"token":{"id":263,"text":" a"}}\n\n'
    b'data: {"prefill_time":null,"decode_time":11,"generated_text":"am a French",'
    b'"details":{"finish_reason":"length","generated_tokens":3,"seed":846930886},'
    b'"token":{"id":306,"text":null}}\n\n'
)


def run_stream(pieces: list[bytes]) -> list[InferResponse]:
    parser = mb.SseParser()
    mapper = mb.StreamMapper("llm", "id-1")
    out = []
    for piece in [*pieces, None]:
        events = parser.feed(piece) if piece is not None else parser.finish()
        for event in events:
            r = mapper.map(event)
            if r is not None:
                out.append(r)
    mapper.end()
    return out


@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("size", [1, 2, 7, 64, len(SEED_STREAM)])
def test_stream_in_any_pieces(size: int, crlf: bool) -> None:
    body = SEED_STREAM.replace(b"\n", b"\r\n") if crlf else SEED_STREAM
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    out = run_stream(pieces)
    assert [text_of(r) for r in out] == ["am", " a", " French"]
    assert [r.parameters for r in out] == [
        {},
        {},
        {"finish_reason": "length", "generated_tokens": 3, "seed": 846930886},
    ]
    assert all((r.model_name, r.id) == ("llm", "id-1") for r in out)


@pytest.mark.parametrize(
    "framed",
    [
        SEED_STREAM.replace(b"data: ", b"data:"),  # MindIE's Triton route: no space
        SEED_STREAM.replace(b"\n", b"\r\n"),
        SEED_STREAM[:-2],  # the last event not closed by a blank line
        b": comment\n\n" + SEED_STREAM,
    ],
)
def test_stream_framing_variants(framed: bytes) -> None:
    assert [text_of(r) for r in run_stream([framed])] == ["am", " a", " French"]


def test_stream_single_token_final_only() -> None:
    event = b'data: {"prefill_time":3,"decode_time":null,"generated_text":"\xe4\xb8\xad",'
    event += b'"details":null,"token":{"id":1,"text":null}}\n\n'
    out = run_stream([event])
    assert [text_of(r) for r in out] == ["中"]
    assert out[0].parameters == {}


def test_stream_final_adds_nothing() -> None:
    """An EOS token whose text is empty: nothing more to send."""
    events = (
        b'data: {"token":{"id":1,"text":"x"}}\n\n'
        b'data: {"generated_text":"x","details":null,"token":{"id":2,"text":null}}\n\n'
    )
    assert [text_of(r) for r in run_stream([events])] == ["x"]


@pytest.mark.parametrize(
    ("body", "cls", "message"),
    [
        (
            b'data: {"token":{"id":1,"text":"a"}}\n\nEngine callback timeout: client timeout',
            BackendError,
            "MindIE stream failed: Engine callback timeout: client timeout",
        ),
        (
            b'data: {"error":"boom","error_type":"Incomplete Generation"}\n\n',
            BackendError,
            "MindIE stream failed: boom",
        ),
        (
            b'data: {"token":{"id":1,"text":"a"}}\n\n',
            BadGateway,
            "MindIE's stream ended before its final event",
        ),
        (b"", BadGateway, "MindIE's stream ended before its final event"),
        (b'data: {"prefill_time":1}\n\n', BadGateway, "no 'token' object"),
        (b'data: {"token":{"id":1,"text":5}}\n\n', BadGateway, "'token.text' is not text"),
    ],
)
def test_stream_failures(body: bytes, cls: type[ProxyError], message: str) -> None:
    with pytest.raises(cls) as info:
        run_stream([body])
    assert message in info.value.message
    if cls is BackendError:
        assert (info.value.http_status, info.value.grpc_code) == (500, "INTERNAL")


# ------------------------------------------------------------------ --backend mindie://


@pytest.mark.parametrize(
    ("value", "kind", "url", "tls"),
    [
        ("mindie://127.0.0.1:1025", "mindie", "127.0.0.1:1025", False),
        ("mindie://mindie.svc:1025/", "mindie", "mindie.svc:1025", False),
        ("mindie://[::1]:1025", "mindie", "[::1]:1025", False),
        ("mindies://mindie.svc:1025", "mindie", "mindie.svc:1025", True),
    ],
)
def test_backend_url(value: str, kind: str, url: str, tls: bool) -> None:
    target = parse_backend(value)
    assert (target.kind, target.url, target.tls) == (kind, url, tls)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mindie://127.0.0.1", r"has no port: give host:port, e\.g\. mindie://127\.0\.0\.1:1025"),
        ("mindie:1025", r"mindies://host:port \(a MindIE server"),
        ("mindie://:1025", r"mindies://host:port \(a MindIE server"),
    ],
)
def test_backend_url_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_backend(value)


def test_backend_address_split() -> None:
    from v2proxy.backends.endpoints import HostPort
    from v2proxy.backends.mindie import MindieBackend

    b = MindieBackend("[::1]:1025", model="ensemble")
    assert (b._pool.endpoints.names, b.model, b.spec.name) == (
        (HostPort("::1", 1025),),
        "ensemble",
        "ensemble",
    )
