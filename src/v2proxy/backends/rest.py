"""The REST backend: v2 JSON or binary tensors to a model server over HTTP/1.1 (http or https),
every call through one keep-alive pool (:mod:`v2proxy.http.client`), and the REST↔REST
pass-through (``relay_infer``, ``forward``).

Every /infer request carries a Content-Type (KServe 0.21 refuses requests without one).
``--backend-timeout`` bounds the whole answer, head and body; a relayed answer passed on as it
comes keeps what is left of it for the waits on its pieces, so a backend that stalls mid-body
ends the answer, never hangs it. Every answer read whole is bounded (--max-body-size for
inferences, else --backend-max-answer-size). Health and metadata questions go on to the next
endpoint when one fails; inferences never do.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from v2proxy.backends.base import OUTCOME, BalancedClient, HttpPool
from v2proxy.backends.endpoints import EndpointCells, split_hosts
from v2proxy.backends.rest_answers import (
    IHCL,
    error_message,
    failure,
    json_answer,
    mapped,
    model_answer,
    raise_for_status,
    relayed_headers,
    unknown_model,
)
from v2proxy.backends.rest_encoding import Encoding, refuses_binary
from v2proxy.backends.rest_relay import READ_WHOLE, RelayCall, RelayNow, RelaySide
from v2proxy.backends.rest_requests import (
    BinaryHeads,
    ModelPaths,
    infer_body,
    infer_headers,
)
from v2proxy.backends.rest_stream import streamed, then_arm
from v2proxy.backends.staging import Stager
from v2proxy.codecs import binary as binc
from v2proxy.codecs.answer_heads import AnswerHeads
from v2proxy.codecs.json import dumps
from v2proxy.core.errors import (
    BackendError,
    BadGateway,
    CodecError,
    ProxyError,
    Unsupported,
)
from v2proxy.core.headers import answer_headers
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.model import Buffer, InferRequest, InferResponse
from v2proxy.core.ports import (
    NO_CHUNKS,
    Body,
    ForwardResponse,
    Headers,
    Record,
    RelayFacts,
    StreamedBody,
)
from v2proxy.http.client import HttpClient, StreamBody
from v2proxy.http.client_errors import ConnectFailed, ConnectTimeout, HttpClientError
from v2proxy.http.client_response import ClientResponse

log = logging.getLogger(__name__)


def _header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    found = None
    for k, v in headers:
        if k == name:
            found = v if found is None else found + b", " + v
    return found


class RestBackend:
    """Talks to a v2 REST model server at ``base_url`` (``http://`` or ``https://``)."""

    name = "rest"
    speaks_rest = True

    def stream_call(self, decoupled: bool) -> str:
        return "rest backend's stream_infer"

    def __init__(
        self,
        base_url: str,
        encoding: str = "auto",
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        connections: int = 100,
        staging: Stager | None = None,
        ssl_context: ssl.SSLContext | None = None,
        on_retry: Callable[[], object] | None = None,
        *,
        resolve_every: float = 30.0,
        cells: EndpointCells | None = None,
        knowledge: BackendKnowledge | None = None,
        max_answer_size: int = 1 << 20,
        max_infer_answer: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        #: --backend-max-answer-size: every answer read whole but an inference's
        self._max_answer = max_answer_size
        self._max_infer = max_infer_answer
        self.knowledge = knowledge or BackendKnowledge(self)
        self.encoding = Encoding(encoding, self.base_url, self.knowledge)
        self.relay_facts: Callable[[str, str], RelayFacts] = self.encoding.facts
        #: ``--backend-encoding binary``: every JSON body goes as binary tensors
        self.transcodes_json = self.encoding.fixed is True
        self._paths = ModelPaths()
        self._answer_heads = AnswerHeads()
        self._binary_heads = BinaryHeads()
        self._timeout = timeout
        parts = urlsplit(self.base_url)
        https = parts.scheme == "https"
        self._prefix = parts.path.rstrip("/")
        # one pool per endpoint (several host:port, or a name with several addresses)
        self._pool = HttpPool(
            "REST",
            split_hosts(parts.netloc),
            (ssl_context or ssl.create_default_context()) if https else None,
            connect_timeout,
            connections,
            on_retry,
            resolve_every=resolve_every,
            cells=cells,
        )
        #: --backend-shm; None: never
        self.staging = staging
        if staging is not None and staging.knowledge is None:
            staging.knowledge = self.knowledge
        self._targets: dict[tuple[str, str], str] = {}
        self._relay_side = RelaySide(
            self._pool.endpoints,
            self.base_url,
            timeout,
            max_infer_answer,
            self._targets,
            self._infer_target,
        )
        #: :meth:`Backend.relay_now <v2proxy.core.ports.Backend.relay_now>`: the relay side's
        #: (compiled: the quick lane's call runs no interpreted frame)
        self.relay_now: RelayNow = self._relay_side.relay
        #: kept at start: ``asyncio.get_running_loop()`` makes a getpid system call each time
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = self._relay_side.loop = asyncio.get_running_loop()
        await self._pool.start()

    def _now(self) -> float:
        loop = self._loop
        if loop is None:  # used without start (tests): the running loop
            loop = self._loop = asyncio.get_running_loop()
        return loop.time()

    async def close(self) -> None:
        if self.staging is not None and self._pool.started:
            await self.staging.close(self)
        await self._pool.close()

    @property
    def client(self) -> BalancedClient:
        return self._pool.client

    async def _call(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: list[Buffer] | None,
        what: str,
        *,
        infer: bool = False,
        idempotent: bool = False,
        status_only: bool = False,
    ) -> tuple[ClientResponse, bytes | bytearray]:
        """One call whose answer is read whole, within --backend-timeout and its bound."""
        limit = self._max_infer if infer else self._max_answer
        try:
            return await self.client.fetch(
                method,
                self._prefix + target,
                headers,
                body,
                call_timeout=self._timeout,
                limit=limit,
                idempotent=idempotent,
                status_only=status_only,
            )
        except Exception as exc:
            mapped_exc = failure(exc, self.base_url, self._timeout, what)
            if mapped_exc is None:
                raise
            raise mapped_exc from None

    async def _get_json(self, path: str, what: str) -> tuple[int, Any]:
        resp, body = await self._call("GET", path, (), None, what, idempotent=True)
        if resp.status != 200:
            return resp.status, error_message(body, resp.status)
        return 200, json_answer(body, what, "backend response")

    async def _status(self, path: str, what: str) -> int:
        call = await self._call("GET", path, (), None, what, idempotent=True, status_only=True)
        return call[0].status

    async def server_ready(self) -> bool:
        """Ready while one endpoint says so: each asked in turn until one does."""
        for _ in range(len(self._pool.endpoints.all) or 1):
            if await self._status("/v2/health/ready", "health/ready") == 200:
                return True
        return False

    async def server_metadata(self) -> dict[str, Any]:
        status, obj = await self._get_json("/v2", "server metadata")
        if status != 200 or not isinstance(obj, dict):
            raise BackendError(str(obj), status if status != 200 else 502)
        return obj

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        status, obj = await self._get_json(self._paths(model, version), "model metadata")
        return model_answer(status, obj, model)

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        status, obj = await self._get_json(self._paths(model, version) + "/config", "model config")
        return model_answer(status, obj, model)

    async def model_ready(self, model: str, version: str) -> bool:
        status = await self._status(self._paths(model, version) + "/ready", "model ready")
        if status == 404:
            raise unknown_model(model, "")
        return status == 200

    async def infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        staging = self.staging
        if staging is not None and self._pool.endpoints.one_server and staging.wanted(request):
            return await staging.infer(self, request, lambda r: self._infer(r, headers))
        binary = self.encoding.fixed
        if binary is not None:  # json or binary: nothing to ask, nothing to try
            return await self._infer_as(request, headers, binary)
        return await self._infer(request, headers)

    async def _infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        binary = await self.encoding.binary()
        if not binary and self.encoding.try_unlisted(request):
            try:
                response = await self._infer_as(request, headers, True)
            except BackendError as exc:
                # only a body the backend could not read is a refusal; any other error is the
                # client's answer
                if not refuses_binary(exc.http_status, exc.message):
                    raise
                self.encoding.unlisted(False, f"refused binary tensors: {exc.message}")
            else:
                self.encoding.unlisted(True)
                return response
        return await self._infer_as(request, headers, binary)

    async def _infer_as(
        self, request: InferRequest, headers: Headers, binary: bool
    ) -> InferResponse:
        try:
            chunks, ihcl = infer_body(request, binary, self._binary_heads)
        except CodecError as exc:
            # e.g. non-UTF-8 BYTES sent binary by the client
            raise CodecError(
                f"cannot send the request to this backend, which takes JSON only: {exc}"
            ) from None
        path = self._paths(request.model_name, request.model_version) + "/infer"
        sent = infer_headers(headers, ihcl)
        if len(chunks) == 1:  # one buffer: sent, and its answer read whole, in one call
            timeout = self._timeout
            try:
                status, answer_headers, body = await self.client.post_whole(
                    self._prefix + path,
                    sent,
                    chunks[0],
                    deadline=self._now() + timeout,
                    limit=self._max_infer,
                )
            except Exception as exc:  # as _call maps them
                mapped_exc = failure(exc, self.base_url, timeout, "inference")
                if mapped_exc is None:
                    raise
                raise mapped_exc from None
        else:
            resp, body = await self._call("POST", path, sent, chunks, "inference", infer=True)
            status, answer_headers = resp.status, resp.headers
        raise_for_status(status, body, request.model_name)
        return self._decoded(answer_headers, body)

    def _decoded(
        self, headers: list[tuple[bytes, bytes]], body: bytes | bytearray
    ) -> InferResponse:
        """The response of a 200 /infer answer (BadGateway when it is not a v2 one)."""
        resp_ihcl = _header_value(headers, IHCL)
        try:
            ihcl = int(resp_ihcl) if resp_ihcl is not None else None
            return binc.decode_response(body, ihcl, self._answer_heads)
        except (CodecError, ValueError) as exc:
            raise BadGateway(f"invalid inference response from backend: {exc}") from None

    def infer_now(
        self,
        request: InferRequest,
        headers: Headers,
        done: Callable[[InferResponse | ProxyError], None],
    ) -> Callable[[], None] | None:
        """:meth:`infer` sent at once without a coroutine on an idle connection (with
        ``--backend-encoding binary``, one buffer, not staged): the call's cancel, its outcome
        given to ``done`` later. None, with nothing sent, else."""
        loop = self._loop
        if loop is None or self.encoding.fixed is not True:
            return None
        chunks, ihcl = infer_body(request, True, self._binary_heads)
        if len(chunks) != 1:
            return None
        body = chunks[0]
        staging = self.staging
        if (
            staging is not None
            and len(body) >= staging.threshold  # (else no input reaches it)
            and self._pool.endpoints.one_server
            and staging.wanted(request)
        ):
            return None
        model = request.model_name
        target = self._infer_target(model, request.model_version)
        due = loop.time() + self._timeout
        sent = infer_headers(headers, ihcl)
        return self._relay_side.now(target, model, body, sent, done, due, self._decoded)

    async def stream_infer(
        self, request: InferRequest, headers: Headers
    ) -> AsyncIterator[InferResponse]:
        """One response per request: v2 REST /infer has no decoupled answers."""
        yield await self.infer(request, headers)

    async def relay_message(
        self, model: str, version: str, message: bytes, headers: Headers, *, streamed: bool = False
    ) -> bytes:
        # never asked: its relay facts take no message
        raise Unsupported("a REST backend takes no gRPC message as it came")

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: Headers
    ) -> ForwardResponse:
        """Send a client's /infer body unchanged (piped through when it is still arriving) and
        pass the answer back unchanged once it is seen to be a v2 answer."""
        if not isinstance(body, StreamedBody):
            return await self._relay_whole(model, version, body, ihcl, headers)
        target = self._infer_target(model, version)
        resp, length, content, due = await self._relay_streamed(target, body, ihcl, headers)
        if content is not None:
            raise_for_status(resp.status, content, model)
        try:
            relayed = relayed_headers(resp.headers, length, content, self.base_url)
        except ProxyError:
            resp.close()
            raise
        if content is not None:
            return ForwardResponse(200, relayed, NO_CHUNKS, content=content, length=length)
        return streamed(resp, self.base_url, self._timeout, "inference", relayed, due)

    def _infer_target(self, model: str, version: str) -> str:
        target = self._targets.get((model, version))
        if target is None:
            target = self._prefix + self._paths(model, version) + "/infer"
            if len(self._targets) < ModelPaths.KEPT:
                self._targets[(model, version)] = target
        return target

    async def learn_relay_facts(self, model: str, version: str, asked_for: str) -> RelayFacts:
        return await self.encoding.learn()

    def time_now(self, record: Record) -> None:
        self._relay_side.record = record

    async def _relay_whole(
        self,
        model: str,
        version: str,
        body: bytes | bytearray | memoryview,
        ihcl: int | None,
        headers: Headers,
    ) -> ForwardResponse:
        """A whole body relayed on the endpoint picked for it, or on the next when it cannot be
        reached; the outcome awaited."""
        endpoints = self.client.endpoints  # (BackendUnavailable before start)
        loop = asyncio.get_running_loop()
        due = loop.time() + self._timeout
        tried: list[Any] = []
        last: Exception | None = None
        fut: asyncio.Future[ForwardResponse | ProxyError] = loop.create_future()

        def done(outcome: ForwardResponse | ProxyError) -> None:
            if not fut.done():
                fut.set_result(outcome)

        try:
            while True:
                ep = endpoints.next(tried, last)
                client: HttpClient = ep.client
                head = client.head(
                    "POST",
                    self._infer_target(model, version),
                    infer_headers(headers, ihcl),
                    len(body),
                )
                try:
                    conn = await client.connection(due)
                except (ConnectFailed, ConnectTimeout) as exc:
                    endpoints.failed(ep)
                    tried.append(ep)
                    last = exc
                    continue
                except HttpClientError as exc:  # no connection came free in time
                    endpoints.failed(ep, OUTCOME.get(type(exc), "malformed"))
                    raise
                call = RelayCall(self._relay_side, ep, conn, model, done, due)
                call.send(head, body)
                break
        except Exception as exc:
            raise self._relay_side.failed(exc) from None
        finally:
            last = None  # no cycle: the exception's traceback holds this frame
        try:
            outcome = await fut
        except BaseException:
            call.abandon()  # given up (cancelled): the connection closes
            raise
        if isinstance(outcome, ProxyError):
            raise outcome
        return outcome

    async def _relay_streamed(
        self, target: str, body: StreamedBody, ihcl: int | None, headers: Headers
    ) -> tuple[ClientResponse, int | None, bytes | bytearray | None, float]:
        """The head of the answer to a body piped through while it arrives (and the body when
        read whole), and the deadline left for the rest of the answer; the deadline bounds the
        backend's waits only (:func:`rest_stream.then_arm`)."""
        deadline = asyncio.timeout(None)
        payload = StreamBody(body.length, then_arm(body, deadline, self._timeout))
        with mapped(self.base_url, self._timeout, "inference"):
            async with deadline:
                resp = await self.client.request(
                    "POST",
                    target,
                    infer_headers(headers, ihcl),
                    payload,
                    read_timeout=self._timeout,
                )
                length = resp.content_length
                whole = resp.status != 200 or (length is not None and length <= READ_WHOLE)
                content = await resp.read(self._max_infer) if whole else None
        due = deadline.when()
        if due is None:  # answered before the whole body was sent (waiting on the client)
            due = self._now() + self._timeout
        return resp, length, content, due

    async def forward(
        self, method: str, target: str, headers: Headers, body: Buffer
    ) -> ForwardResponse:
        """Any other REST request, passed through: the answer read whole when small, else
        streamed as it comes."""
        what = f"{method} {target.split('?', 1)[0]}"
        with mapped(self.base_url, self._timeout, what):
            resp = await self.client.request(
                method,
                self._prefix + target,
                headers,
                [body] if body else None,
                read_timeout=self._timeout,
                call_timeout=self._timeout,
            )
            length = resp.content_length
            whole = length is not None and length <= READ_WHOLE
            content = await resp.read() if whole else None
        out = answer_headers(resp.headers)
        if content is not None:
            return ForwardResponse(resp.status, out, NO_CHUNKS, content=content, length=length)
        return streamed(resp, self.base_url, self._timeout, what, out)

    async def register_staging(self, name: str, key: str, byte_size: int) -> None:
        """Register one of v2proxy's own regions (``--backend-shm``) with the backend."""
        path = f"/v2/systemsharedmemory/region/{quote(name, safe='')}/register"
        await self._side("POST", path, [], {"key": key, "offset": 0, "byte_size": byte_size})

    async def unregister_staging(self, name: str) -> None:
        path = f"/v2/systemsharedmemory/region/{quote(name, safe='')}/unregister"
        await self._side("POST", path, [], {})

    async def _side(self, method: str, path: str, headers: Headers, body: Any = None) -> Any:
        """A side endpoint's JSON answer; non-200 answers raised with their status."""
        out = list(headers)
        if body is not None:
            out.append((b"Content-Type", b"application/json"))
        payload: list[Buffer] | None = None if body is None else [dumps(body)]
        resp, raw = await self._call(
            method, path, out, payload, f"{method} {path}", idempotent=method == "GET"
        )
        raise_for_status(resp.status, raw, None)
        return json_answer(raw, path, "backend answer")

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        path = self._paths(model, version) + "/stats" if model else "/v2/models/stats"
        obj = await self._side("GET", path, headers)
        if not isinstance(obj, dict):
            raise BadGateway(f"invalid answer from backend to {path}: not a JSON object")
        return obj

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]:
        obj = await self._side("POST", "/v2/repository/index", headers, {"ready": ready})
        if not isinstance(obj, list):
            raise BadGateway("invalid answer from backend to the repository index: not a list")
        return obj

    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        action = "load" if load else "unload"
        path = f"/v2/repository/models/{quote(model, safe='')}/{action}"
        await self._side("POST", path, headers, {"parameters": parameters} if parameters else {})

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        path = self._paths(model, "") + "/trace/setting" if model else "/v2/trace/setting"
        method = "GET" if update is None else "POST"
        obj = await self._side(method, path, headers, update)
        return obj if isinstance(obj, dict) else {}

    async def log_settings(self, update: dict[str, Any] | None, headers: Headers) -> dict[str, Any]:
        obj = await self._side("GET" if update is None else "POST", "/v2/logging", headers, update)
        return obj if isinstance(obj, dict) else {}
