"""The OpenAI frontend (v2proxy.frontends.openai) without sockets, in front of the builtin ``llm``
(which "generates" the prompt's words in a cycle) through a real Pipeline: answers, streams,
stop sequences, the chat template, usage, errors in OpenAI's shape, a failure mid-stream and the
deadline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.codecs import chat_template
from v2proxy.codecs import mindie_answer as mindie
from v2proxy.core.errors import (
    BackendError,
    BodyTooLarge,
    Forbidden,
    GatewayTimeout,
    InvalidField,
    NotFound,
    Overloaded,
    ProxyError,
)
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import ForwardResponse
from v2proxy.frontends.openai import OpenAIFrontend, error_answer, translate
from v2proxy.ops.config_sections import OpenAIModel, OpenAISettings

CHATML = chat_template.compile_template(
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>", "test"
)


def frontend(**model: Any) -> OpenAIFrontend:
    settings = OpenAISettings(
        (
            OpenAIModel("llm", "llm", **model),
            OpenAIModel("chatml", "llm", template=CHATML),
        )
    )
    return OpenAIFrontend(Pipeline(BuiltinBackend(), 1 << 20), settings, 4096)


async def whole(answer: Any) -> tuple[int, Any]:
    assert not isinstance(answer, ForwardResponse)
    status, headers, body = answer
    assert headers == [(b"content-type", b"application/json")]
    return status, json.loads(body)


async def events(answer: Any) -> list[Any]:
    assert isinstance(answer, ForwardResponse)
    assert answer.headers == [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
    ]
    raw = b"".join([piece async for piece in answer.body])
    await answer.release()
    assert raw.endswith(b"data: [DONE]\n\n")
    out = []
    for event in raw[: -len(b"data: [DONE]\n\n")].split(b"\n\n")[:-1]:
        assert event.startswith(b"data: ")
        out.append(json.loads(event[6:]))
    return out


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


async def completions(fe: OpenAIFrontend, raw: bytes, headers: Any) -> Any:
    """``POST /v1/completions`` as the REST frontend serves it: prepared, then generated."""
    return await fe.generate(fe.prepare(False, raw), headers)


async def chat(fe: OpenAIFrontend, raw: bytes, headers: Any) -> Any:
    """``POST /v1/chat/completions`` likewise."""
    return await fe.generate(fe.prepare(True, raw), headers)


async def test_completion() -> None:
    fe = frontend()
    status, doc = await whole(
        await completions(fe, body(model="llm", prompt="a b c", max_tokens=5), [])
    )
    assert status == 200
    assert doc["choices"] == [
        {"index": 0, "text": "a b c a b", "logprobs": None, "finish_reason": "length"}
    ]
    assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert doc["model"] == "llm" and doc["object"] == "text_completion"


async def test_default_max_tokens_is_the_models() -> None:
    fe = frontend(max_tokens=2)
    _, doc = await whole(await completions(fe, body(model="llm", prompt="a b c"), []))
    assert doc["choices"][0]["text"] == "a b"


async def test_chat_with_the_default_and_a_given_template() -> None:
    fe = frontend()
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    _, doc = await whole(await chat(fe, body(model="llm", messages=messages, max_tokens=6), []))
    # the default template: "system: s\nuser: u\nassistant:"
    assert doc["choices"][0]["message"] == {
        "role": "assistant",
        "content": "system: s user: u assistant: system:",
    }
    assert doc["usage"]["prompt_tokens"] == 5
    _, doc = await whole(await chat(fe, body(model="chatml", messages=messages, max_tokens=1), []))
    assert doc["choices"][0]["message"]["content"] == "<system>s<user>u<assistant>"


async def test_stream_with_stop_and_usage() -> None:
    fe = frontend()
    answer = await completions(
        fe,
        body(
            model="llm",
            prompt="one two three four",
            max_tokens=8,
            stop=["three"],
            stream=True,
            stream_options={"include_usage": True},
        ),
        [],
    )
    *chunks, finish, usage = await events(answer)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "one two "
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3


async def test_chat_stream_role_first() -> None:
    fe = frontend()
    answer = await chat(
        fe,
        body(model="llm", messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True),
        [],
    )
    chunks = await events(answer)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "user:"}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:]] == [
        " x",
        " assistant:",
        None,
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_validation_before_the_backend() -> None:
    fe = frontend()
    with pytest.raises(InvalidField) as info:
        await completions(fe, body(model="llm", prompt="x", n=2), [])
    assert info.value.field == "n"
    with pytest.raises(NotFound):
        await completions(fe, body(model="gpt", prompt="x"), [])
    with pytest.raises(InvalidField) as info:  # the rendered prompt over --max-input-size
        await chat(fe, body(model="llm", messages=[{"role": "user", "content": "y" * 4090}]), [])
    assert info.value.field == "messages" and "--max-input-size" in info.value.message


class _Failing:
    """A backend side whose generation breaks after two pieces, or never starts."""

    def __init__(self, fail_at: int, delay: float = 0.0) -> None:
        self.fail_at = fail_at
        self.delay = delay

    async def chunks(self, *_: Any) -> AsyncIterator[tuple[mindie.Chunk, float]]:
        for i in range(10):
            if i == self.fail_at:
                raise BackendError("the model fell over", 500)
            await asyncio.sleep(self.delay)
            yield mindie.Chunk(f" w{i}" if i else "w0"), float(i)


async def test_failure_mid_stream_is_one_error_event() -> None:
    fe = frontend()
    served = fe.models["llm"]
    served.side.chunks = _Failing(2).chunks  # type: ignore[method-assign]
    chunks = await events(await completions(fe, body(model="llm", prompt="p", stream=True), []))
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["w0", " w1"]
    assert chunks[-1] == {
        "error": {
            "message": "the model fell over",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    # before the first piece: an ordinary error answer
    served.side.chunks = _Failing(0).chunks  # type: ignore[method-assign]
    with pytest.raises(BackendError):
        await completions(fe, body(model="llm", prompt="p", stream=True), [])


async def test_deadline() -> None:
    fe = frontend(timeout=1)
    served = fe.models["llm"]
    served.side.chunks = _Failing(99, delay=0.4).chunks  # type: ignore[method-assign]
    with pytest.raises(GatewayTimeout):
        await completions(fe, body(model="llm", prompt="p"), [])
    chunks = await events(await completions(fe, body(model="llm", prompt="p", stream=True), []))
    assert chunks[-1]["error"]["code"] == "timeout"
    assert 1 <= len(chunks) - 1 <= 3


@pytest.mark.parametrize(
    ("exc", "status", "kind", "param", "code"),
    [
        (InvalidField("bad", "stop[1]"), 400, "invalid_request_error", "stop[1]", None),
        (InvalidField("bad", ""), 400, "invalid_request_error", None, None),
        (BodyTooLarge("big"), 413, "invalid_request_error", None, None),
        (Forbidden("no"), 403, "permission_error", None, None),
        (NotFound("no"), 404, "invalid_request_error", None, "model_not_found"),
        (Overloaded("busy"), 503, "server_error", None, "overloaded"),
        (GatewayTimeout("slow"), 504, "server_error", None, "timeout"),
        (BackendError("x", 500), 500, "server_error", None, None),
        (BackendError("x", 400), 400, "invalid_request_error", None, None),
    ],
)
def test_translate(
    exc: ProxyError, status: int, kind: str, param: str | None, code: str | None
) -> None:
    assert translate(exc) == (status, kind, param, code)
    got, headers, raw = error_answer(exc)
    assert got == status
    assert json.loads(raw) == {
        "error": {"message": exc.message, "type": kind, "param": param, "code": code}
    }
    assert ((b"retry-after", b"1") in headers) is isinstance(exc, Overloaded)
