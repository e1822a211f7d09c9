"""OpenAI's API on the HTTP port (docs/guides/openai.md): ``/v1/models``, ``/v1/completions``
and ``/v1/chat/completions``, served from the v2 LLM models the ``openai:`` section names."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from v2proxy.codecs import mindie_answer, openai_answer
from v2proxy.codecs.json import dumps
from v2proxy.codecs.mindie import LlmRequest
from v2proxy.codecs.openai import (
    LIMITS,
    OpenAIRequest,
    RequestLimits,
    parse_chat,
    parse_completion,
    too_large,
)
from v2proxy.codecs.openai_answer import Chunks, StopScanner
from v2proxy.core.errors import (
    BodyTooLarge,
    Forbidden,
    GatewayTimeout,
    InvalidField,
    InvalidRequest,
    NotFound,
    Overloaded,
    ProxyError,
)
from v2proxy.core.model import Buffer
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import ForwardResponse, Headers
from v2proxy.frontends.llm_call import LlmBackendSide, Target
from v2proxy.frontends.rest_answer import error_fields
from v2proxy.ops.config_sections import OpenAIModel, OpenAISettings
from v2proxy.ops.metrics_export import AnyMetrics
from v2proxy.ops.recorders import TokenRecorder

log = logging.getLogger("v2proxy.openai")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes] | ForwardResponse
JSON = (b"content-type", b"application/json")
SSE = (b"content-type", b"text/event-stream")
NO_CACHE = (b"cache-control", b"no-cache")
#: the backend's responses to one generation, each with the time it arrived
_Chunks = AsyncIterator[tuple[mindie_answer.Chunk, float]]


def translate(exc: ProxyError) -> tuple[int, str, str | None, str | None]:
    """An error as OpenAI answers it: status, ``type``, ``param``, ``code``."""
    status = exc.http_status
    param = exc.field or None if isinstance(exc, InvalidField) else None
    if isinstance(exc, NotFound):
        return 404, "invalid_request_error", param, "model_not_found"
    if isinstance(exc, Forbidden):
        return 403, "permission_error", param, None
    if isinstance(exc, Overloaded):
        return 503, "server_error", None, "overloaded"
    if isinstance(exc, GatewayTimeout):
        return 504, "server_error", None, "timeout"
    if isinstance(exc, InvalidRequest | BodyTooLarge) or 400 <= status < 500:
        return status, "invalid_request_error", param, None
    return status, "server_error", None, None


def error_answer(exc: ProxyError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The error answer in OpenAI's shape, with the header fields every API's error carries."""
    status, kind, param, code = translate(exc)
    body = dumps(openai_answer.error(exc.message, kind, param, code))
    return status, [JSON, *error_fields(exc)], body


@dataclass(slots=True)
class _Served:
    """One model id: its settings and the backend side that reaches its v2 model."""

    settings: OpenAIModel
    side: LlmBackendSide


class _Generation:
    """One generation under way: what was asked and the running account (text sent, stop
    scanner, token counts, finish reason)."""

    __slots__ = ("count", "echo", "gen", "parts", "reason", "reported", "req", "scanner", "target")

    def __init__(self, req: OpenAIRequest, gen: LlmRequest, target: Target) -> None:
        self.req = req
        self.gen = gen
        self.target = target
        self.scanner = StopScanner(req.stop)
        view = target.view
        #: one answer of a model that cannot be told not to echo the prompt
        self.echo = not view.decoupled and not view.has("exclude_input_in_output")
        self.parts = mindie_answer.TextParts()
        self.count = 0
        self.reported: int | None = None
        self.reason: str | None = None

    def take(self, chunk: mindie_answer.Chunk) -> str:
        if chunk.tokens is not None:
            self.reported = (self.reported or 0) + chunk.tokens
        self.reason = chunk.finish_reason or self.reason
        if not chunk.text:
            return ""
        self.count += 1
        text = chunk.text
        if self.echo:
            text = mindie_answer.strip_echo(text, self.gen.text)
        text = self.scanner.feed(text)
        if text:
            self.parts.append(text)
        return text

    def rest(self) -> str:
        text = self.scanner.flush()
        if text:
            self.parts.append(text)
        return text

    def tokens(self) -> int:
        """Tokens generated: the backend's count, else one per response of a decoupled model,
        else words."""
        if self.reported is not None:
            return self.reported
        if self.target.view.decoupled:
            return self.count
        return mindie_answer.count_words(self.parts.text())

    def outcome(self) -> tuple[str, dict[str, int]]:
        tokens = self.tokens()
        reason = openai_answer.finish_reason(
            self.reason, self.scanner.stopped, tokens, self.gen.max_new_tokens
        )
        return reason, openai_answer.usage(mindie_answer.count_words(self.gen.text), tokens)


class OpenAIFrontend:
    """Serves the OpenAI routes through the pipeline (called by the REST frontend's routes)."""

    def __init__(
        self,
        pipeline: Pipeline,
        settings: OpenAISettings,
        max_input_size: int,
        metrics: AnyMetrics | None = None,
        rng: random.Random | None = None,
        limits: RequestLimits = LIMITS,
    ) -> None:
        self.max_input_size = max_input_size
        self.limits = limits
        self.models: dict[str, _Served] = {
            m.id: _Served(
                m,
                LlmBackendSide(
                    pipeline, m.model, m.profile, m.seed_input, f"OpenAI model '{m.id}'", log
                ),
            )
            for m in settings.models
        }
        self.created = int(time.time())
        self._listed = openai_answer.models(list(self.models), self.created)
        self.tokens = TokenRecorder(metrics, "frontend") if metrics is not None else None
        self._rng = rng or random.SystemRandom()

    async def check(self) -> None:
        """Look each model up at start-up, so what serves it (or a warning) is logged."""
        for served in self.models.values():
            with contextlib.suppress(ProxyError):
                await served.side.target()

    def list_models(self) -> Answer:
        """``GET /v1/models``: the list, written once at start-up."""
        return 200, [JSON], self._listed

    def get_model(self, model_id: str) -> Answer:
        self.served(model_id)
        return 200, [JSON], dumps(openai_answer.model(model_id, self.created))

    def prepare(self, chat: bool, body: Buffer) -> tuple[_Served, OpenAIRequest, str]:
        """A completions or chat body validated, its model found and its prompt made: what
        :meth:`generate` needs, before any backend is called."""
        if not chat:
            req = parse_completion(body, self.max_input_size, self.limits)
            return self._served(req), req, req.prompt
        req = parse_chat(body, self.max_input_size, self.limits)
        served = self._served(req)
        prompt = served.settings.template.render(req.messages)
        size = len(prompt.encode())
        if size > self.max_input_size:
            raise too_large("messages", size, self.max_input_size)
        return served, req, prompt

    def _served(self, req: OpenAIRequest) -> _Served:
        return self.served(req.model)

    def served(self, model_id: str) -> _Served:
        """The model of an id; NotFound for an unknown one."""
        served = self.models.get(model_id)
        if served is None:
            raise NotFound(f"The model '{model_id}' does not exist")
        return served

    def _generation_request(self, served: _Served, req: OpenAIRequest, prompt: str) -> LlmRequest:
        s = served.settings
        gen = LlmRequest(prompt, stream=req.stream, timeout=s.timeout)
        gen.max_new_tokens = req.max_tokens or s.max_tokens
        if req.temperature == 0.0:
            gen.do_sample = False
        else:
            gen.temperature = req.temperature
        gen.top_p = req.top_p
        gen.seed = self._rng.getrandbits(63) if req.seed is None else req.seed
        return gen

    async def generate(
        self, prepared: tuple[_Served, OpenAIRequest, str], headers: Headers
    ) -> Answer:
        """The answer to a prepared request: one JSON object, or a stream."""
        served, req, prompt = prepared
        gen = self._generation_request(served, req, prompt)
        target = await served.side.target()
        acc = _Generation(req, gen, target)
        chunks = served.side.chunks(target, gen, headers)
        rid = ("chatcmpl-" if req.chat else "cmpl-") + secrets.token_hex(12)
        if req.stream:
            return await self._stream(acc, chunks, rid)
        return await self._whole(acc, chunks, rid)

    def _timeout(self, gen: LlmRequest) -> GatewayTimeout:
        return GatewayTimeout(f"the generation took longer than {gen.timeout} s (openai timeout)")

    async def _whole(self, acc: _Generation, chunks: _Chunks, rid: str) -> Answer:
        try:
            async with asyncio.timeout(acc.gen.timeout):
                async for chunk, _ in chunks:
                    acc.take(chunk)
                    if acc.scanner.stopped:
                        break
        except TimeoutError:
            raise self._timeout(acc.gen) from None
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        acc.rest()
        if self.tokens is not None:
            self.tokens.generated(acc.target.view.name, acc.tokens())
        reason, counts = acc.outcome()
        req = acc.req
        text = acc.parts.text()
        body = openai_answer.whole(req.chat, rid, int(time.time()), req.model, text, reason, counts)
        return 200, [JSON], body

    async def _stream(self, acc: _Generation, chunks: _Chunks, rid: str) -> Answer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + acc.gen.timeout
        t0 = time.perf_counter()
        try:
            # awaited before the status, so an error there is still an error answer
            async with asyncio.timeout_at(deadline):
                first = await anext(chunks, None)
        except TimeoutError:
            await chunks.aclose()  # type: ignore[attr-defined]
            raise self._timeout(acc.gen) from None
        except BaseException:
            await chunks.aclose()  # type: ignore[attr-defined]
            raise
        req = acc.req
        out = Chunks(req.chat, rid, int(time.time()), req.model, req.include_usage)
        events = self._events(acc, out, first, chunks, deadline, t0)

        async def release() -> None:
            await events.aclose()  # type: ignore[attr-defined]
            await chunks.aclose()  # type: ignore[attr-defined]

        return ForwardResponse(200, [SSE, NO_CACHE], events, release=release)

    async def _events(
        self,
        acc: _Generation,
        out: Chunks,
        first: tuple[mindie_answer.Chunk, float] | None,
        chunks: _Chunks,
        deadline: float,
        t0: float,
    ) -> AsyncIterator[bytes]:
        model = acc.target.view.name
        rec = self.tokens
        prev: float | None = None
        failure: ProxyError | None = None
        item = first
        try:
            while item is not None:
                chunk, at = item
                text = acc.take(chunk)
                if text:
                    if rec is not None:
                        if prev is None:
                            rec.first_token(model, at - t0)
                        else:
                            rec.next_token(model, at - prev)
                    prev = at
                    yield out.text(text)
                if acc.scanner.stopped:
                    break
                try:
                    async with asyncio.timeout_at(deadline):
                        item = await anext(chunks, None)
                except TimeoutError:
                    failure = self._timeout(acc.gen)
                    break
                except ProxyError as exc:
                    log.warning("OpenAI stream broke off: %s", exc.message)
                    failure = exc
                    break
            if failure is not None:
                code = translate(failure)[3]
                error = openai_answer.error(failure.message, "server_error", None, code)
                yield openai_answer.event(error)
                yield openai_answer.DONE
                return
            rest = acc.rest()
            if rest:
                yield out.text(rest)
            reason, counts = acc.outcome()
            yield out.finish(reason)
            if acc.req.include_usage:
                yield out.usage(counts)
            yield openai_answer.DONE
        finally:
            if rec is not None:
                rec.generated(model, acc.tokens())
            await chunks.aclose()  # type: ignore[attr-defined]
