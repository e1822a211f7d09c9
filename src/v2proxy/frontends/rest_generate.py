"""``POST /v2/models/{m}[/versions/{v}]/generate`` and ``.../generate_stream`` of the REST
frontend: Triton's generate extension (docs/protocol.md, generate extension), whatever the
backend (:mod:`v2proxy.core.generate` decides between passing through and mapping)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from v2proxy.codecs import generate as gc
from v2proxy.core.errors import ProxyError
from v2proxy.core.generate import single
from v2proxy.core.model import InferResponse
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import ForwardResponse
from v2proxy.frontends.exchange import Exchange
from v2proxy.frontends.rest_answer import Answer
from v2proxy.frontends.rest_request import BodyReader, headers_of
from v2proxy.http.request import ClientDisconnected, HttpRequest

_JSON = (b"content-type", b"application/json")
_SSE = (b"content-type", gc.SSE_CONTENT_TYPE)
_END = object()


class GenerateEndpoint:
    """``POST .../generate`` and ``.../generate_stream`` on top of the pipeline."""

    __slots__ = ("pipeline", "read_body")

    def __init__(self, pipeline: Pipeline, body: BodyReader) -> None:
        self.pipeline = pipeline
        #: the body is the generation's input: within --max-input-size
        self.read_body = body.read_input

    async def generate(self, r: HttpRequest, m: Any, _x: Exchange) -> Answer:
        return await self._generate(r, m, stream=False)

    async def generate_stream(self, r: HttpRequest, m: Any, _x: Exchange) -> Answer:
        return await self._generate(r, m, stream=True)

    async def _generate(self, r: HttpRequest, m: Any, stream: bool) -> Answer:
        body = await self.read_body(r)
        model, version = m.group("model") or "", m.group("version") or ""
        target = r.target.decode("latin-1")
        pipeline = self.pipeline
        outcome = await pipeline.generate(model, version, target, body, headers_of(r), stream)
        if isinstance(outcome, ForwardResponse):
            if outcome.content is None:
                outcome.body = _watched(r, aiter(outcome.body))
            return outcome
        if not stream:
            response = await single(outcome.responses)
            return 200, [_JSON], gc.encode(gc.response_to_generate(response))
        responses = outcome.responses
        try:
            first = await _next(r, responses)
        except BaseException:
            await _close(responses)
            raise
        if first is _END:  # no response at all: an empty stream
            return 200, [_SSE], b""
        events = _events(r, first, responses)
        return ForwardResponse(200, [_SSE], events, release=events.aclose)


async def _events(
    r: HttpRequest, first: InferResponse, responses: AsyncIterator[InferResponse]
) -> AsyncGenerator[bytes, None]:
    """The SSE events of the responses; closing this closes (cancels) the backend stream."""
    try:
        yield gc.sse_event(gc.response_to_generate(first))
        while True:
            try:
                item = await _next(r, responses)
                if item is _END:
                    return
                event = gc.sse_event(gc.response_to_generate(item))
            except ProxyError as exc:
                yield gc.error_event(exc.message)
                return
            yield event
    finally:
        await _close(responses)


async def _watched(r: HttpRequest, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A passed-through body, given up when the client goes away while it waits."""
    try:
        while True:
            item = await _next(r, chunks)
            if item is _END:
                return
            yield item
    finally:
        await _close(chunks)


async def _step(it: AsyncIterator[Any]) -> Any:
    try:
        return await anext(it)
    except StopAsyncIteration:
        return _END


async def _next(r: HttpRequest, it: AsyncIterator[Any]) -> Any:
    """The next item of ``it`` (``_END`` after the last); ClientDisconnected when the client
    goes away first (the pending step is cancelled)."""
    gone = r.gone()
    if gone.done():
        raise ClientDisconnected("client went away")
    task = asyncio.ensure_future(_step(it))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected("client went away")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _close(it: AsyncIterator[Any]) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
