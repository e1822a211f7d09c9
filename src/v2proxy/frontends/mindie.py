"""MindIE's native text/stream interface, ``POST /infer`` on the HTTP port (docs/protocol.md,
MindIE), served from the v2 model ``mindie.model`` with the ``mindie.profile`` mapping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from v2proxy.codecs import mindie_answer as answer
from v2proxy.codecs.mindie import Limits, LlmRequest, parse_request
from v2proxy.core.errors import (
    BackendError,
    BackendUnavailable,
    BadGateway,
    BodyTooLarge,
    GatewayTimeout,
    InvalidRequest,
    NotFound,
    ProxyError,
    Unsupported,
)
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import ForwardResponse, Headers
from v2proxy.frontends.llm_call import LlmBackendSide, Target
from v2proxy.ops.config_sections import MindieSettings
from v2proxy.ops.metrics_export import AnyMetrics
from v2proxy.ops.recorders import TokenRecorder

log = logging.getLogger("v2proxy.mindie")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes] | ForwardResponse
JSON = (b"content-type", b"application/json")
SSE = (b"content-type", b"text/event-stream")
DEFAULT = MindieSettings("llm")


def _open() -> None:
    """No access check: a MindIE frontend used on its own."""


def translate(exc: ProxyError) -> tuple[int, str, str]:
    """An error as MindIE answers it: status, ``error_type``, message."""
    status, message = exc.http_status, exc.message
    if isinstance(exc, BodyTooLarge):
        status = 413
    elif isinstance(exc, GatewayTimeout):
        status, message = 500, answer.TIMEOUT_MESSAGE
    elif isinstance(exc, BackendUnavailable) or status in (429, 503):
        status = 503
    elif isinstance(exc, NotFound | Unsupported) or status in (404, 501):
        status = 424
    elif isinstance(exc, InvalidRequest) or status in (400, 422):
        status = 422
    elif isinstance(exc, BadGateway | BackendError) or status >= 500:
        status = 500
    return status, answer.ERROR_TYPES.get(status, "Bad Request"), message


def error_answer(exc: ProxyError) -> Answer:
    status, kind, message = translate(exc)
    return status, [JSON], answer.error_body(message, kind)


class MindieFrontend:
    """Serves ``POST /infer`` through the pipeline (called by the REST frontend's route)."""

    def __init__(
        self,
        pipeline: Pipeline,
        settings: MindieSettings | None = None,
        metrics: AnyMetrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        s = settings or DEFAULT
        self.settings = s
        self.limits = Limits(s.max_input_chars, s.max_new_tokens, s.timeout)
        self.backend_side = LlmBackendSide(pipeline, s.model, s.profile, s.seed_input)
        self.tokens = TokenRecorder(metrics, "frontend") if metrics is not None else None
        self._rng = rng or random.SystemRandom()

    async def check(self) -> None:
        """Look the model up at start-up, so what serves ``/infer`` (or a warning) is logged."""
        with contextlib.suppress(ProxyError):
            await self.backend_side.target()

    def _draw_seed(self) -> int:
        return self._rng.getrandbits(63)

    async def infer(
        self, body: bytes | bytearray, headers: Headers, admit: Callable[[], None] = _open
    ) -> Answer:
        """The answer to one ``/infer`` body; errors are raised (see :func:`error_answer`)."""
        req = parse_request(body, self.limits, self._draw_seed)
        target = await self.backend_side.target()
        admit()
        if req.stream:
            return await self._stream(target, req, headers)
        return await self._text(target, req, headers)

    async def _text(self, target: Target, req: LlmRequest, headers: Headers) -> Answer:
        parts = answer.TextParts()
        reported: int | None = None
        reason: str | None = None
        try:
            async with asyncio.timeout(req.timeout):
                async for chunk, _ in self.backend_side.chunks(target, req, headers):
                    if chunk.text:
                        parts.append(chunk.text)
                    if chunk.tokens is not None:
                        reported = (reported or 0) + chunk.tokens
                    reason = chunk.finish_reason or reason
        except TimeoutError:
            raise BackendError(answer.TIMEOUT_MESSAGE, 500) from None
        text = parts.text()
        n_chunks = parts.count
        del parts
        if not target.view.decoupled and not target.view.has("exclude_input_in_output"):
            # a model that cannot be told not to echo the prompt
            text = answer.strip_echo(text, req.text)
        if reported is not None:
            tokens = reported
        else:
            tokens = n_chunks if target.view.decoupled else answer.count_words(text)
        if self.tokens is not None:
            self.tokens.generated(target.view.name, tokens)
        detail = None
        if req.details:
            why = answer.finish_reason(reason, tokens, req.max_new_tokens)
            detail = answer.details(why, tokens, req.seed)
        return 200, [JSON], answer.text_answer(text, detail)

    async def _stream(self, target: Target, req: LlmRequest, headers: Headers) -> Answer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.timeout
        t0 = time.perf_counter()
        chunks = self.backend_side.chunks(target, req, headers)
        state = _StreamState(t0, req)
        try:
            first = await state.next_token(chunks, deadline)
        except TimeoutError:
            await chunks.aclose()  # type: ignore[attr-defined]
            raise BackendError(answer.TIMEOUT_MESSAGE, 500) from None
        except BaseException:
            await chunks.aclose()  # type: ignore[attr-defined]
            raise
        events = self._events(target, state, first, chunks, deadline)

        async def release() -> None:
            await events.aclose()  # type: ignore[attr-defined]
            await chunks.aclose()  # type: ignore[attr-defined]

        return ForwardResponse(200, [SSE], events, release=release)

    async def _events(
        self,
        target: Target,
        state: _StreamState,
        held: _Token | None,
        chunks: AsyncIterator[tuple[answer.Chunk, float]],
        deadline: float,
    ) -> AsyncIterator[bytes]:
        model = target.view.name
        rec = self.tokens
        try:
            if held is None:
                yield state.final(None, time.perf_counter())
                return
            if rec is not None:
                rec.first_token(model, held.prefill or 0.0)
            failure: bytes | None = None
            while True:
                try:
                    nxt = await state.next_token(chunks, deadline)
                except TimeoutError:
                    failure = answer.STREAM_TIMEOUT
                    break
                except ProxyError as exc:
                    log.warning("MindIE /infer stream broke off: %s", exc.message)
                    failure = b"Incomplete Generation: " + exc.message.encode()
                    break
                if nxt is None:
                    break
                if rec is not None and nxt.decode is not None:
                    rec.next_token(model, nxt.decode)
                yield answer.token_event(held.prefill, held.decode, held.text)
                held = nxt
            if failure is not None:
                yield answer.token_event(held.prefill, held.decode, held.text)
                yield failure
                return
            yield state.final(held, time.perf_counter())
        finally:
            if rec is not None:
                rec.generated(model, state.tokens())
            await chunks.aclose()  # type: ignore[attr-defined]


class _Token:
    __slots__ = ("decode", "prefill", "text")

    def __init__(self, text: str, prefill: float | None, decode: float | None) -> None:
        self.text = text
        self.prefill = prefill
        self.decode = decode


class _StreamState:
    """The running account of a stream: texts, token counts, finish reason, arrival times."""

    def __init__(self, t0: float, req: LlmRequest) -> None:
        self.t0 = t0
        self.req = req
        self.prev: float | None = None
        self.parts = answer.TextParts()
        self.reported: int | None = None
        self.reason: str | None = None

    def tokens(self) -> int:
        return self.reported if self.reported is not None else self.parts.count

    async def next_token(
        self, chunks: AsyncIterator[tuple[answer.Chunk, float]], deadline: float
    ) -> _Token | None:
        while True:
            async with asyncio.timeout_at(deadline):
                try:
                    chunk, at = await anext(chunks)
                except StopAsyncIteration:
                    return None
            if chunk.tokens is not None:
                self.reported = (self.reported or 0) + chunk.tokens
            self.reason = chunk.finish_reason or self.reason
            if not chunk.text:
                continue
            self.parts.append(chunk.text)
            if self.prev is None:
                token = _Token(chunk.text, at - self.t0, None)
            else:
                token = _Token(chunk.text, None, at - self.prev)
            self.prev = at
            return token

    def final(self, last: _Token | None, now: float) -> bytes:
        req = self.req
        detail: dict[str, Any] | None = None
        if req.details:
            n = self.tokens()
            why = answer.finish_reason(self.reason, n, req.max_new_tokens)
            detail = answer.details(why, n, req.seed)
        if last is None:
            return answer.final_event(now - self.t0, None, "", detail)
        return answer.final_event(last.prefill, last.decode, self.parts.text(), detail)
