"""``Pipeline.generate_objects`` (core.generate.GenerateExtension.objects), the generate call the
MindIE frontend's ``generate`` profile may reuse: a generate body as a JSON object in, the
answers as JSON objects out, whether the backend has the extension (a real Triton over REST:
passed through, SSE parsed) or not (builtin models in process, Triton over gRPC: mapped), and
the backend's errors raised as ProxyError with their status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.backends.grpc import GrpcBackend
from v2proxy.backends.rest import RestBackend
from v2proxy.core.errors import ProxyError
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import Backend

KINDS = ["builtin", "triton-rest", "triton-grpc"]


@pytest.fixture(params=KINDS)
async def pipeline(request: pytest.FixtureRequest, backend_urls: Any) -> AsyncIterator[Any]:
    backend: Backend
    if request.param == "builtin":
        backend = BuiltinBackend()
    elif request.param == "triton-rest":
        backend = RestBackend(backend_urls("triton")[0])
    else:
        backend = GrpcBackend(backend_urls("triton")[1])
    await backend.start()
    try:
        yield request.param, Pipeline(backend, 64 * 1024 * 1024)
    finally:
        await backend.close()


async def _all(p: Pipeline, body: dict[str, Any], stream: bool, model: str = "llm") -> list[Any]:
    return [o async for o in p.generate_objects(model, "", body, [], stream)]


def _llm(text: str) -> dict[str, Any]:
    return {"model_name": "llm", "model_version": "1", "text_output": text}


async def test_objects_stream(pipeline: Any) -> None:
    kind, p = pipeline
    body = {"text_input": "x y", "max_tokens": 3, "stream": True}
    assert await _all(p, body, True) == [_llm("x"), _llm(" y"), _llm(" x")]
    assert p.generation.native is (kind == "triton-rest")


async def test_objects_one(pipeline: Any) -> None:
    _, p = pipeline
    body = {"text_input": "x y", "max_tokens": 2, "id": "q"}
    assert await _all(p, body, False) == [{"id": "q", **_llm("x y x y")}]


async def test_objects_stop_early(pipeline: Any) -> None:
    """Closing the iterator after the first answer gives the backend's stream up."""
    _, p = pipeline
    body = {"text_input": "x y", "max_tokens": 50, "stream": True}
    it = p.generate_objects("llm", "", body, [], True)
    assert await anext(it) == _llm("x")
    await it.aclose()
    assert await _all(p, {"text_input": "z", "max_tokens": 1}, False) == [_llm("z z")]


@pytest.mark.parametrize(
    ("model", "body", "stream", "status", "message"),
    [
        ("nope", {"text_input": "x"}, False, 404, "Request for unknown model: 'nope' is not found"),
        ("llm", {"text_input": "a", "max_tokens": 0}, True, 400, "input 'max_tokens' of model"),
        ("llm", {"text_input": "a", "max_tokens": [1, 2]}, False, 400, "The schema can not"),
        (
            "llm",
            {"text_input": "a b", "max_tokens": 2, "stream": True},
            False,
            400,
            "generate expects",
        ),
    ],
    ids=["unknown-model", "model-error", "shape", "several-responses"],
)
async def test_objects_errors(
    pipeline: Any, model: str, body: dict[str, Any], stream: bool, status: int, message: str
) -> None:
    _, p = pipeline
    with pytest.raises(ProxyError) as err:
        await _all(p, body, stream, model)
    assert err.value.http_status == status
    assert message in err.value.message
