"""The builtin ``llm``'s generation shares the event loop and stops with its consumer: tokens
are made one at a time as they are taken, with the loop's turn between two responses; a whole
text is joined a slice at a time with a pause between; closing the stream closes the model's
generator; a unary request that the model answers several times keeps one response, and a
generate request stops at the second. (End to end, against a ``v2proxy serve`` process:
tests/interop/test_llm_event_loop.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator

import pytest

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.codecs.dtypes import deserialize_bytes, serialize_bytes
from v2proxy.codecs.mindie_answer import TextParts
from v2proxy.core.errors import InvalidRequest
from v2proxy.core.generate import single
from v2proxy.core.model import Datatype, InferRequest, InferResponse, Tensor
from v2proxy.reference import models
from v2proxy.reference.models import LLM_MAX_TOKENS, LLM_SLICE_TOKENS, iter_llm_tokens

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops


def llm_request(prompt: str, max_tokens: int, stream: bool) -> InferRequest:
    return InferRequest(
        model_name="llm",
        inputs=[
            Tensor("text_input", Datatype.BYTES, (1,), serialize_bytes([prompt.encode()])),
            Tensor("max_tokens", Datatype.INT32, (1,), max_tokens.to_bytes(4, "little")),
            Tensor("stream", Datatype.BOOL, (1,), b"\x01" if stream else b"\x00"),
        ],
    )


def text_of(response: InferResponse) -> str:
    (out,) = response.outputs
    return deserialize_bytes(out.data)[0].decode()


class Ticker:
    """Counts the event loop's turns that other tasks get."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.ticks += 1

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        self.ticks = 0
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task


async def test_a_stream_lets_the_loop_run_between_tokens() -> None:
    backend = BuiltinBackend()
    got: list[str] = []
    async with Ticker() as ticker:
        # a consumer that never waits itself (its writes all fit in buffers)
        async for response in backend.stream_infer(llm_request("a b", 200, True), []):
            got.append(text_of(response))
        ticks = ticker.ticks
    assert "".join(got) == " ".join(["a", "b"] * 100)
    assert ticks >= 150, f"the loop ran {ticks} times during 200 tokens"


async def test_a_whole_text_is_made_in_slices() -> None:
    backend = BuiltinBackend()
    async with Ticker() as ticker:
        response = await backend.infer(llm_request("a b", LLM_MAX_TOKENS, False), [])
        ticks = ticker.ticks
    text = text_of(response)
    assert text.startswith("a b a b a") and len(text) == 4 + 2 * LLM_MAX_TOKENS - 1
    slices = LLM_MAX_TOKENS // LLM_SLICE_TOKENS
    assert ticks >= slices, f"the loop ran {ticks} times while {slices} slices were joined"


async def test_closing_the_stream_closes_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = models.MODELS["llm"]
    pulled = 0
    closed = False

    def compute(inputs: dict[str, Tensor]) -> models.Produced:
        nonlocal pulled, closed
        try:
            for item in spec.compute(inputs):
                pulled += 1
                yield item
        finally:
            closed = True

    monkeypatch.setitem(models.MODELS, "llm", dataclasses.replace(spec, compute=compute))
    stream = BuiltinBackend().stream_infer(llm_request("hi", LLM_MAX_TOKENS, True), [])
    first = await anext(stream)
    assert text_of(first) == "hi"
    await stream.aclose()  # type: ignore[attr-defined]
    assert closed and pulled <= 2


async def test_a_consumer_cancelled_between_tokens_ends_the_generation() -> None:
    backend = BuiltinBackend()
    taken = 0

    async def consume() -> None:
        nonlocal taken
        async for _ in backend.stream_infer(llm_request("hi", LLM_MAX_TOKENS, True), []):
            taken += 1

    task = asyncio.create_task(consume())
    for _ in range(50):
        await asyncio.sleep(0)
    assert 0 < taken <= 50  # a token per turn of the loop at most
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stopped_at = taken
    for _ in range(20):
        await asyncio.sleep(0)
    assert taken == stopped_at


async def test_unary_infer_of_a_stream_keeps_one_response() -> None:
    with pytest.raises(InvalidRequest, match="answers this request with 3 responses"):
        await BuiltinBackend().infer(llm_request("a b", 3, True), [])
    response = await BuiltinBackend().infer(llm_request("a b", 3, False), [])
    assert text_of(response) == "a b a b a"


async def test_generate_single_stops_at_the_second_response() -> None:
    made = 0
    closed = False

    async def responses() -> AsyncIterator[InferResponse]:
        nonlocal made, closed
        try:
            for _ in range(1000):
                made += 1
                yield InferResponse(model_name="llm", outputs=[])
        finally:
            closed = True

    with pytest.raises(InvalidRequest):
        await single(responses())
    assert made == 2 and closed


def test_tokens_are_made_as_they_are_taken() -> None:
    tokens: Iterator[str] = iter_llm_tokens("x y z", LLM_MAX_TOKENS)
    assert [next(tokens) for _ in range(4)] == ["x", " y", " z", " x"]
    with pytest.raises(InvalidRequest, match="would generate"):
        iter_llm_tokens("w" * (1 << 20), 17)


def test_mindie_keeps_the_text_compact() -> None:
    text = TextParts()
    pieces = [f" {i}" for i in range(3000)]
    for piece in pieces:
        text.append(piece)
    assert text.count == 3000 and text.text() == "".join(pieces)
    assert len(text.joined) == 2 and len(text.pending) == 3000 - 2048
