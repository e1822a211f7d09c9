"""The MindIE backend (``--backend mindie://host:port``): a MindIE server's native ``POST /infer``
served to v2 clients as one v2 model with the builtin ``llm``'s tensors."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from time import perf_counter
from typing import Any, Protocol

from v2proxy.backends.base import BalancedClient, HttpPool, NonRestBackend, single_response
from v2proxy.backends.builtin import unknown_model, validate_inputs
from v2proxy.backends.endpoints import split_hosts
from v2proxy.backends.rest_answers import failure, json_answer, mapped
from v2proxy.codecs import mindie_backend as mb
from v2proxy.codecs.json import dumps
from v2proxy.core.errors import InvalidRequest, ProxyError, Unsupported
from v2proxy.core.model import Buffer, Datatype, InferRequest, InferResponse
from v2proxy.core.ports import Headers
from v2proxy.http.client_response import ClientResponse
from v2proxy.reference.models import ModelSpec, TensorSpec

PLATFORM = "mindie"
_JSON = ((b"content-type", b"application/json"),)  # a tuple: the client remembers its head


def _no_compute(inputs: Any) -> Iterator[Any]:
    raise Unsupported("the MindIE model is computed by MindIE")


def model_spec(name: str) -> ModelSpec:
    """The builtin ``llm``'s tensors under ``name`` (without exclude_input_in_output: MindIE
    never echoes the prompt)."""

    def opt(n: str, d: Datatype) -> TensorSpec:
        return TensorSpec(n, d, (1,), optional=True)

    return ModelSpec(
        name,
        (
            TensorSpec("text_input", Datatype.BYTES, (1,)),
            opt("max_tokens", Datatype.INT32),
            opt("stream", Datatype.BOOL),
            opt("temperature", Datatype.FP32),
            opt("top_k", Datatype.INT32),
            opt("top_p", Datatype.FP32),
            opt("seed", Datatype.UINT64),
        ),
        (TensorSpec(mb.OUTPUT, Datatype.BYTES, (-1,)),),
        0,
        _no_compute,
        decoupled=True,
    )


class TokenSink(Protocol):
    """Where token timings go (:class:`v2proxy.ops.recorders.TokenRecorder`)."""

    def first_token(self, model: str, seconds: float) -> None: ...
    def next_token(self, model: str, seconds: float) -> None: ...
    def generated(self, model: str, tokens: int) -> None: ...


class MindieBackend(NonRestBackend):
    """Serves MindIE at ``address`` (host:port) as the v2 model ``model``."""

    name = "mindie"

    def __init__(
        self,
        address: str,
        model: str = "llm",
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        connections: int = 100,
        tokens: TokenSink | None = None,
        ssl_context: ssl.SSLContext | None = None,
        *,
        max_answer_size: int = 1 << 20,
        max_infer_answer: int | None = None,
    ) -> None:
        self._max_answer = max_answer_size
        self._max_infer = max_infer_answer
        self._pool = HttpPool(
            "MindIE", split_hosts(address), ssl_context, connect_timeout, connections
        )
        self.base_url = f"mindie{'s' if ssl_context is not None else ''}://{address}"
        self.model = model
        self.spec = model_spec(model)
        self._timeout = timeout
        self.tokens = tokens

    async def start(self) -> None:
        await self._pool.start()

    async def close(self) -> None:
        await self._pool.close()

    @property
    def client(self) -> BalancedClient:
        return self._pool.client

    def _check(self, model: str, version: str) -> None:
        if model != self.model:
            raise unknown_model(model)
        if version not in ("", "1"):
            raise unknown_model(model, version)

    async def _call(
        self,
        method: str,
        target: str,
        body: list[Buffer] | None,
        what: str,
        *,
        infer: bool = False,
        status_only: bool = False,
    ) -> tuple[ClientResponse, bytes | bytearray]:
        """One call read whole within --backend-timeout and its size bound."""
        try:
            return await self.client.fetch(
                method,
                target,
                _JSON if body is not None else (),
                body,
                call_timeout=self._timeout,
                limit=self._max_infer if infer else self._max_answer,
                idempotent=method == "GET",
                status_only=status_only,
            )
        except Exception as exc:
            mapped_exc = failure(exc, self.base_url, self._timeout, what)
            if mapped_exc is None:
                raise
            raise mapped_exc from None

    async def server_ready(self) -> bool:
        resp, _ = await self._call(
            "GET", "/v2/health/ready", None, "health/ready", status_only=True
        )
        return resp.status == 200

    async def server_metadata(self) -> dict[str, Any]:
        resp, body = await self._call("GET", "/v2", None, "server metadata")
        obj: Any = {}
        if resp.status == 200:
            obj = json_answer(body, "/v2", "backend response")
        elif resp.status != 404:  # 404: a MindIE without the route
            raise mb.error_for(resp.status, body)
        if not isinstance(obj, dict):
            obj = {}
        return {"name": "mindie", "version": "", "extensions": [], **obj}

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        self._check(model, version)
        return {**self.spec.metadata(), "platform": PLATFORM}

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        self._check(model, version)
        return {**self.spec.config(), "platform": PLATFORM, "backend": PLATFORM}

    async def model_ready(self, model: str, version: str) -> bool:
        self._check(model, version)
        return await self.server_ready()

    async def infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        return await single_response(request.model_name, self.stream_infer(request, headers))

    async def stream_infer(
        self, request: InferRequest, headers: Headers
    ) -> AsyncIterator[InferResponse]:
        """MindIE's answer to one request: one response, or one per token when ``stream``."""
        self._check(request.model_name, request.model_version)
        inputs = validate_inputs(self.spec, request)
        if request.outputs is not None:
            for o in request.outputs:
                if o.name != mb.OUTPUT:
                    raise InvalidRequest(
                        f"unexpected inference output '{o.name}' for model '{self.model}'"
                    )
        call = mb.infer_body(inputs, request.parameters)
        payload: list[Buffer] = [dumps(call.body)]
        if not call.stream:
            resp, body = await self._call("POST", "/infer", payload, "inference", infer=True)
            if resp.status != 200:
                raise mb.error_for(resp.status, body)
            response = mb.non_stream_response(self.model, request.id or None, bytes(body))
            count = response.parameters.get("generated_tokens")
            if self.tokens is not None and isinstance(count, int):
                self.tokens.generated(self.model, count)
            yield response
            return
        async for response in self._stream(request, payload):
            yield response

    async def _stream(
        self, request: InferRequest, payload: list[Buffer]
    ) -> AsyncIterator[InferResponse]:
        sink = self.tokens
        count = 0
        before = perf_counter()
        with mapped(self.base_url, self._timeout, "inference"):
            resp = await self.client.request(
                "POST", "/infer", _JSON, payload, read_timeout=self._timeout
            )
        try:
            if resp.status != 200:
                with mapped(self.base_url, self._timeout, "inference's error answer"):
                    body = await resp.read(self._max_answer)
                raise mb.error_for(resp.status, body)
            parser = mb.SseParser()
            mapper = mb.StreamMapper(self.model, request.id or None)
            chunks = resp.iter_chunks()
            while True:
                with mapped(self.base_url, self._timeout, "inference stream"):
                    chunk = await anext(chunks, None)
                events = parser.feed(chunk) if chunk is not None else parser.finish()
                for event in events:
                    if sink is not None and isinstance(event, dict) and "token" in event:
                        now = perf_counter()
                        if count == 0:
                            sink.first_token(self.model, now - before)
                        else:
                            sink.next_token(self.model, now - before)
                        before = now
                        count += 1
                    out = mapper.map(event)
                    if out is not None:
                        yield out
                if chunk is None:
                    break
            mapper.end()
        finally:
            resp.close()
            if sink is not None and count:
                sink.generated(self.model, count)

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        raise Unsupported("statistics are not available from a MindIE backend")

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]:
        try:
            up = await self.server_ready()
        except ProxyError:
            up = False
        if ready and not up:
            return []
        state = "READY" if up else "UNAVAILABLE"
        return [{"name": self.model, "version": "1", "state": state, "reason": ""}]

    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        raise Unsupported("a MindIE backend has no model repository API")

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        raise Unsupported("a MindIE backend has no trace API")

    async def log_settings(self, update: dict[str, Any] | None, headers: Headers) -> dict[str, Any]:
        raise Unsupported("a MindIE backend has no logging API")
