"""Helpers shared by the backends (the interface itself is :class:`v2proxy.core.ports.Backend`):
a unary answer from a decoupled model, the mixin of backends that do not speak v2 REST, and the
HTTP client pool of the REST and MindIE backends, one keep-alive pool per backend endpoint.
A call that never left goes to the next endpoint; each call's outcome counts for or against its
endpoint."""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence

from v2proxy.backends.endpoints import Endpoint, EndpointCells, Endpoints, HostPort
from v2proxy.core.errors import (
    BackendUnavailable,
    InvalidRequest,
    NotFound,
    ProxyError,
    Unsupported,
)
from v2proxy.core.model import Buffer, InferRequest, InferResponse
from v2proxy.core.ports import TAKES_NOTHING, Body, ForwardResponse, Headers, Record, RelayFacts
from v2proxy.http.client import HttpClient, StreamBody
from v2proxy.http.client_errors import (
    AnswerTooLarge,
    ConnectFailed,
    ConnectTimeout,
    HttpClientError,
    ProtocolError,
    ReadTimeout,
    RemoteClosed,
)
from v2proxy.http.client_response import ClientResponse


async def single_response(model: str, responses: AsyncIterator[InferResponse]) -> InferResponse:
    """The one response of a (decoupled) model to a unary request; several (or none) is an
    error. Only the first is kept, the others just counted (there may be a million)."""
    first: InferResponse | None = None
    count = 0
    try:
        async for response in responses:
            count += 1
            if first is None:
                first = response
    finally:
        close = getattr(responses, "aclose", None)
        if close is not None:
            await close()
    if first is None or count != 1:
        raise InvalidRequest(
            f"model '{model}' answers this request with {count} responses: ask with"
            " streaming (gRPC ModelStreamInfer) or set 'stream' to false"
        )
    return first


class NonRestBackend:
    """For backends that do not speak v2 REST: nothing is relayed as bytes (unless the backend
    overrides :meth:`relay_message`) and non-v2 REST requests have nowhere to go."""

    #: the error of a REST path under /v2 that is no v2 operation
    other_v2_error: type[NotFound] | type[Unsupported] = NotFound
    speaks_rest = False
    transcodes_json = True
    name = ""

    def stream_call(self, decoupled: bool) -> str:
        return f"{self.name} backend's stream_infer"

    def relay_facts(self, model: str, version: str) -> RelayFacts:
        return TAKES_NOTHING

    async def learn_relay_facts(self, model: str, version: str, asked_for: str) -> RelayFacts:
        return self.relay_facts(model, version)

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: Headers
    ) -> ForwardResponse:
        raise Unsupported(f"the {self.name} backend takes no REST body as it came")

    def time_now(self, record: Record) -> None:
        return None  # (nothing runs without a coroutine)

    def relay_now(
        self,
        model: str,
        version: str,
        body: bytes | bytearray,
        headers: Headers,
        done: Callable[[ForwardResponse | ProxyError], None],
        *,
        ihcl: int | None = None,
    ) -> Callable[[], None] | None:
        return None

    def infer_now(
        self,
        request: InferRequest,
        headers: Headers,
        done: Callable[[InferResponse | ProxyError], None],
    ) -> Callable[[], None] | None:
        return None

    async def relay_message(
        self, model: str, version: str, message: bytes, headers: Headers, *, streamed: bool = False
    ) -> bytes:
        raise Unsupported(f"the {self.name} backend takes no gRPC message as it came")

    async def forward(
        self, method: str, target: str, headers: Headers, body: Buffer
    ) -> ForwardResponse:
        path = target.split("?", 1)[0]
        if path.startswith("/v2/") and self.other_v2_error is Unsupported:
            raise Unsupported(f"{method} {path} is not available through a gRPC backend")
        raise NotFound("Not Found")


class HttpPool:
    """One backend's keep-alive pools, one per endpoint of ``names``; :attr:`client` outside
    :meth:`start`..:meth:`close` raises :class:`BackendUnavailable`."""

    def __init__(
        self,
        what: str,
        names: Sequence[HostPort],
        ssl_context: ssl.SSLContext | None,
        connect_timeout: float,
        connections: int,
        on_retry: Callable[[], object] | None = None,
        *,
        resolve_every: float = 30.0,
        cells: EndpointCells | None = None,
    ) -> None:
        self.what = what
        self.ssl = ssl_context
        self._connect_timeout = connect_timeout
        self._connections = connections
        self._on_retry = on_retry
        self.endpoints: Endpoints[HttpClient] = Endpoints(
            names, self._make, _close, resolve_every=resolve_every, cells=cells
        )
        self._client: BalancedClient | None = None

    def _make(self, name: HostPort, address: str) -> HttpClient:
        return HttpClient(
            name.host,
            name.port,
            address=address,
            ssl=self.ssl,
            on_retry=self._on_retry,
            limit=self._connections,
            connect_timeout=self._connect_timeout,
        )

    @property
    def started(self) -> bool:
        return self._client is not None

    async def start(self) -> None:
        await self.endpoints.start()
        self._client = BalancedClient(self.endpoints)

    async def close(self) -> None:
        if self._client is not None:
            self._client = None
            await self.endpoints.close()

    @property
    def client(self) -> BalancedClient:
        if self._client is None:
            raise BackendUnavailable(f"the {self.what} backend is not started")
        return self._client


async def _close(client: HttpClient) -> None:
    await client.close()


#: what a failure of the HTTP client says of the endpoint
OUTCOME: dict[type[HttpClientError], str] = {
    ConnectFailed: "unreachable",
    ConnectTimeout: "unreachable",
    RemoteClosed: "unreachable",
    ReadTimeout: "timeout",
    ProtocolError: "malformed",
}
_JOIN_MAX = 64 * 1024
#: the most of an answer read when only its status matters (else its connection is closed)
DRAIN_MAX = 64 * 1024


class BalancedClient:
    """:meth:`HttpClient.request <v2proxy.http.client.HttpClient.request>` over the endpoints.
    A call that could not be sent goes to the next endpoint within what is left of
    ``call_timeout``; any other failure counts against the endpoint and fails the call, so an
    inference is never sent twice (only :meth:`fetch` of an idempotent call tries again)."""

    __slots__ = ("endpoints",)

    def __init__(self, endpoints: Endpoints[HttpClient]) -> None:
        self.endpoints = endpoints

    async def request(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: list[Buffer] | StreamBody | None = None,
        *,
        read_timeout: float | None = None,
        call_timeout: float | None = None,
    ) -> ClientResponse:
        endpoints = self.endpoints
        tried: list[Endpoint[HttpClient]] = []
        last: Exception | None = None
        first = time.monotonic() if call_timeout is not None else 0.0
        timeout = call_timeout
        while True:
            ep = endpoints.next(tried, last)
            if tried and call_timeout is not None:
                timeout = max(call_timeout - (time.monotonic() - first), 0.001)
            ep.outstanding += 1
            try:
                resp = await ep.client.request(
                    method, target, headers, body, read_timeout=read_timeout, call_timeout=timeout
                )
            except (ConnectFailed, ConnectTimeout) as exc:
                endpoints.failed(ep)
                tried.append(ep)
                last = exc
                continue
            except HttpClientError as exc:
                endpoints.failed(ep, OUTCOME.get(type(exc), "malformed"))
                raise
            finally:
                ep.outstanding -= 1
            endpoints.answered(ep, resp.status)
            return resp

    async def post_whole(
        self,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: Buffer,
        *,
        deadline: float,
        limit: int | None,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes | bytearray]:
        """:meth:`fetch` of a POST of one buffer without a response object: (status, headers,
        body) of the whole answer within ``limit`` bytes, by ``deadline`` (``loop.time()``);
        never sent twice."""
        endpoints = self.endpoints
        tried: list[Endpoint[HttpClient]] = []
        last: Exception | None = None
        try:
            while True:
                ep = endpoints.next(tried, last)
                ep.outstanding += 1
                try:
                    got = await _post_whole(ep.client, target, headers, body, deadline, limit)
                except HttpClientError as exc:
                    endpoints.failed(ep, OUTCOME.get(type(exc), "malformed"))
                    if not isinstance(exc, ConnectFailed | ConnectTimeout):
                        raise
                    tried.append(ep)
                    last = exc
                    continue
                finally:
                    ep.outstanding -= 1
                endpoints.answered(ep, got[0])
                return got
        finally:
            last = None  # no cycle: the exception's traceback holds this frame

    async def fetch(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: list[Buffer] | None,
        *,
        call_timeout: float,
        limit: int | None,
        idempotent: bool = False,
        status_only: bool = False,
    ) -> tuple[ClientResponse, bytes | bytearray]:
        """One call and its whole answer within ``limit`` bytes (``status_only``: at most
        :data:`DRAIN_MAX` read). ``idempotent``: a failure or a 5xx is asked of the next
        endpoint, with the whole ``call_timeout`` again (the last 5xx returned if none is left)."""
        endpoints = self.endpoints
        tried: list[Endpoint[HttpClient]] = []
        last: Exception | None = None
        answer: tuple[ClientResponse, bytes | bytearray] | None = None
        first = time.monotonic()
        timeout = call_timeout
        try:
            while True:
                ep = endpoints.pick(tried)
                if ep is None:
                    if answer is not None:
                        return answer
                    if last is None:
                        raise BackendUnavailable("the backend has no endpoint")
                    raise last
                if tried and not idempotent:
                    timeout = max(call_timeout - (time.monotonic() - first), 0.001)
                ep.outstanding += 1
                try:
                    resp = await ep.client.request(
                        method, target, headers, body, call_timeout=timeout
                    )
                    if status_only:
                        content = await _drain(resp)
                    else:
                        content = await resp.read(limit)
                except HttpClientError as exc:
                    unsent = isinstance(exc, ConnectFailed | ConnectTimeout)
                    endpoints.failed(ep, OUTCOME.get(type(exc), "malformed"))
                    if not (unsent or idempotent):
                        raise
                    tried.append(ep)
                    last = exc
                    continue
                finally:
                    ep.outstanding -= 1
                if resp.status < 500:
                    endpoints.ok(ep)
                    return resp, content
                endpoints.failed(ep, "5xx")
                if not idempotent:
                    return resp, content
                tried.append(ep)
                answer = resp, content
        finally:
            last = None  # no cycle: the exception's traceback holds this frame


async def _post_whole(
    client: HttpClient,
    target: str,
    headers: Sequence[tuple[bytes, bytes]],
    body: Buffer,
    deadline: float,
    limit: int | None,
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One POST of one buffer and its whole answer (status, headers, body) by ``deadline``,
    within ``limit``; the connection is closed after any failure."""
    length = memoryview(body).nbytes
    conn = await client.connection(deadline)
    head = client.head("POST", target, headers, length)
    try:
        conn.begin(False, deadline)
        if length <= _JOIN_MAX:
            conn.transport.write(head + body)
        else:
            conn.transport.writelines([head, body])
        if conn.writing_paused:
            await conn.drain()
        while not conn.head_done:
            if conn.error is not None:
                raise conn.error
            await conn.wait(None)
        size = conn.content_length
        if limit is not None and size is not None and size > limit:
            raise AnswerTooLarge(limit, size)
        if not conn.body_done:
            conn.read_whole(limit)
            while not conn.body_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(None)
    except BaseException:
        conn.close()
        client.release(conn)
        raise
    status, answer_headers, content = conn.status, conn.headers, conn.take_all()
    client.release(conn)
    if limit is not None and len(content) > limit:
        raise AnswerTooLarge(limit, len(content))
    return status, answer_headers, content


async def _drain(resp: ClientResponse) -> bytes | bytearray:
    """At most :data:`DRAIN_MAX` of the body; a longer one reads as empty."""
    length = resp.content_length
    if length is not None and length > DRAIN_MAX:
        resp.close()
        return b""
    try:
        return await resp.read(DRAIN_MAX)
    except AnswerTooLarge:
        return b""  # read() closed the connection
