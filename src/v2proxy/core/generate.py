"""The generate extension through any backend (docs/protocol.md, generate extension): how a
``generate`` / ``generate_stream`` request reaches the model server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from v2proxy.codecs import compression
from v2proxy.codecs import generate as gc
from v2proxy.codecs.json import loads
from v2proxy.core.errors import (
    BackendError,
    CodecError,
    InvalidRequest,
    NotFound,
    ProxyError,
    Unsupported,
)
from v2proxy.core.headers import INFERRED
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.model import Buffer, InferRequest, InferResponse
from v2proxy.core.ports import Backend, ForwardResponse, Headers

StreamFn = Callable[[InferRequest, Headers], AsyncIterator[InferResponse]]

#: the most of a 404/405 answer read to decide whether the route exists
_PROBE_READ = 64 * 1024
_NATIVE = ("generate native",)


async def _no_chunks() -> AsyncIterator[bytes]:
    return
    yield  # pragma: no cover


@dataclass(slots=True)
class Mapped:
    """A generate request mapped onto v2 inference: the request and its responses (closing
    the iterator cancels the backend call)."""

    request: InferRequest
    responses: AsyncIterator[InferResponse]


def generate_target(model: str, version: str, stream: bool) -> str:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    return path + ("/generate_stream" if stream else "/generate")


async def single(responses: AsyncIterator[InferResponse]) -> InferResponse:
    """The one response a (non-stream) generate request needs; Triton's error at the second
    (the stream is closed then: there may be a million more)."""
    got: InferResponse | None = None
    try:
        async for response in responses:
            if got is not None:
                raise InvalidRequest(gc.NOT_ONE_RESPONSE)
            got = response
    finally:
        aclose = getattr(responses, "aclose", None)
        if aclose is not None:
            await aclose()
    if got is None:
        raise InvalidRequest(gc.NOT_ONE_RESPONSE)
    return got


async def read_answer(answer: ForwardResponse, limit: int) -> bytes:
    """The whole body of a forwarded answer (at most ``limit`` bytes), which is released."""
    try:
        if answer.content is not None:
            return bytes(answer.content[:limit])
        out = bytearray()
        async for chunk in answer.body:
            out += chunk
            if len(out) >= limit:
                break
        return bytes(out[:limit])
    finally:
        await answer.release()


def _route_missing(body: bytes) -> bool:
    """Whether a 404/405 answer says the path does not exist (rather than, say, the model)."""
    try:
        obj = loads(body, "error")
    except CodecError:
        return True
    if not isinstance(obj, dict):
        return True
    error = obj.get("error")
    return not isinstance(error, str) or error == "Not Found"


def _error_of(body: bytes, status: int) -> str:
    """The message of a backend's generate error answer (JSON or one SSE event)."""
    try:
        events = gc.SseParser().feed(body + b"\n\n") if body.startswith(b"data:") else []
        obj = events[0] if events else loads(body, "error")
    except CodecError:
        return body.decode("utf-8", "replace").strip()[:1000] or f"backend answered HTTP {status}"
    if isinstance(obj, dict):
        for key in ("error", "detail", "message"):
            if key in obj:
                return str(obj[key])
    return str(obj)[:1000]


class GenerateExtension:
    """Serves generate requests through one backend; one per pipeline."""

    def __init__(
        self,
        backend: Backend,
        knowledge: BackendKnowledge,
        stream: StreamFn,
        max_input_size: int,
    ) -> None:
        self.backend = backend
        self.knowledge = knowledge
        self._stream = stream
        self.max_input_size = max_input_size

    @property
    def native(self) -> bool | None:
        """Whether the backend has the generate extension (None: not known now)."""
        known: bool | None = self.knowledge.recall(_NATIVE)
        return known

    @native.setter
    def native(self, value: bool) -> None:
        self.knowledge.learn(_NATIVE, value)

    async def run(
        self, model: str, version: str, target: str, body: Buffer, headers: Headers, stream: bool
    ) -> ForwardResponse | Mapped:
        """A client's generate request: the backend's answer passed through, or the request
        mapped onto v2 inference."""
        encoding = next((v for k, v in headers if k == b"content-encoding"), None)
        if await self._native():
            if encoding is None or encoding.strip().lower() in (b"", b"identity"):
                gc.parse_body(body)  # no JSON object: 400 here (Triton answers 500)
            answer = await self._forward(target, headers, body)
            if answer is not None:
                return answer
        data = compression.decompress(
            body, None if encoding is None else encoding.decode("latin-1"), self.max_input_size
        )
        return await self.map(model, version, gc.parse_body(data), headers)

    async def map(self, model: str, version: str, obj: dict[str, Any], headers: Headers) -> Mapped:
        """A generate body mapped onto the pipeline's inference (errors named by field)."""
        metadata = (await self.knowledge.model(model, version)).raw
        request = gc.request_from_generate(obj, model, version, metadata, self.max_input_size)
        sent = [(k, v) for k, v in headers if k not in INFERRED]
        return Mapped(request, self._stream(request, sent))

    async def _native(self) -> bool:
        """Whether the backend has Triton's generate extension (asked once per lifetime)."""
        native = self.native
        if native is None:
            try:
                native = (await self.knowledge.server()).generate
            except ProxyError:
                return True
            self.native = native
        return native

    async def _forward(self, target: str, headers: Headers, body: Buffer) -> ForwardResponse | None:
        """The backend's answer, or None when it has no generate extension (remembered)."""
        try:
            answer = await self.backend.forward("POST", target, headers, body)
        except (NotFound, Unsupported):
            self.native = False
            return None
        if answer.status not in (404, 405):
            self.native = True
            return answer
        content = await read_answer(answer, _PROBE_READ)
        if _route_missing(content):
            self.native = False
            return None
        self.native = True
        return ForwardResponse(
            answer.status, answer.headers, _no_chunks(), content=content, length=len(content)
        )

    async def objects(
        self, model: str, version: str, obj: dict[str, Any], headers: Headers, stream: bool
    ) -> AsyncIterator[dict[str, Any]]:
        """Send the generate body ``obj`` to the backend, passed through or mapped, and yield
        its answers as generate JSON objects (one per response when ``stream``)."""
        if await self._native():
            out = [(k, v) for k, v in headers if k not in INFERRED]
            out.append((b"content-type", b"application/json"))
            answer = await self._forward(
                generate_target(model, version, stream), out, gc.encode(obj)
            )
            if answer is not None:
                async for item in self._answers(answer, stream):
                    yield item
                return
        mapped = await self.map(model, version, obj, headers)
        if not stream:
            yield gc.response_to_generate(await single(mapped.responses))
            return
        responses = mapped.responses
        try:
            async for response in responses:
                yield gc.response_to_generate(response)
        finally:
            aclose = getattr(responses, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _answers(
        self, answer: ForwardResponse, stream: bool
    ) -> AsyncIterator[dict[str, Any]]:
        if answer.status != 200 or not stream:
            body = await read_answer(answer, self.max_input_size)
            if answer.status != 200:
                raise BackendError(_error_of(body, answer.status), answer.status)
            obj = loads(body, "generate answer")
            if not isinstance(obj, dict):
                raise BackendError("the backend's generate answer is not a JSON object", 502)
            if "error" in obj:  # Triton answers some errors with 200
                raise BackendError(str(obj["error"]), 400)
            yield obj
            return
        parser = gc.SseParser()
        chunks = answer.body if answer.content is None else _one(bytes(answer.content))
        try:
            async for chunk in chunks:
                for event in parser.feed(chunk):
                    yield _checked(event)
            for event in parser.close():
                yield _checked(event)
        finally:
            await answer.release()


async def _one(content: bytes) -> AsyncIterator[bytes]:
    yield content


def _checked(event: Any) -> dict[str, Any]:
    if not isinstance(event, dict):
        raise BackendError("an event of the backend's generate stream is not a JSON object", 502)
    if "error" in event:
        raise BackendError(str(event["error"]), 500)
    return event
