"""Helpers shared by the backends (the interface itself, :class:`v2proxy.ports.Backend`,
belongs to the core that calls it): a unary answer from a decoupled model, the mixin of
backends that take decoded requests only, and the HTTP client pool the REST and MindIE
backends open on ``start`` and close on ``close``."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable

from v2proxy.errors import BackendUnavailable, InvalidRequest, NotFound, Unsupported
from v2proxy.http.client import HttpClient
from v2proxy.model import Buffer, InferResponse
from v2proxy.ports import Body, ForwardResponse, Headers


async def single_response(model: str, responses: AsyncIterator[InferResponse]) -> InferResponse:
    """The one response of a (decoupled) model to a unary request; a request that makes it
    answer several times (or none) belongs on a stream. Only the first response is kept, the
    others are counted for the message (there may be a million); the iterator is closed."""
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


class DecodedOnly:
    """For backends that take decoded requests only: nothing is relayed as bytes, and REST
    requests that are not v2 operations have nowhere to go."""

    #: what a REST path under /v2 that is no v2 operation gets from this backend
    other_v2_error: type[NotFound] | type[Unsupported] = NotFound

    async def can_relay(self, binary: bool, size: int = 0) -> bool:
        return False

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: Headers
    ) -> ForwardResponse:
        raise Unsupported("this backend takes decoded requests only")

    async def forward(
        self, method: str, target: str, headers: Headers, body: Buffer
    ) -> ForwardResponse:
        path = target.split("?", 1)[0]
        if path.startswith("/v2/") and self.other_v2_error is Unsupported:
            raise Unsupported(f"{method} {path} is not available through a gRPC backend")
        raise NotFound("Not Found")


class HttpPool:
    """One backend's keep-alive pool to ``host:port`` (TLS with ``ssl_context`` when given):
    built on :meth:`start`, closed on :meth:`close`; :attr:`client` before ``start`` or after
    ``close`` is :class:`BackendUnavailable` naming ``what``."""

    def __init__(
        self,
        what: str,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        connect_timeout: float,
        connections: int,
        on_retry: Callable[[], object] | None = None,
    ) -> None:
        self.what = what
        self.host = host
        self.port = port
        self.ssl = ssl_context
        self._connect_timeout = connect_timeout
        self._connections = connections
        self._on_retry = on_retry
        self._client: HttpClient | None = None

    @property
    def started(self) -> bool:
        return self._client is not None

    def start(self) -> None:
        self._client = HttpClient(
            self.host,
            self.port,
            ssl=self.ssl,
            on_retry=self._on_retry,
            limit=self._connections,
            connect_timeout=self._connect_timeout,
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def client(self) -> HttpClient:
        if self._client is None:
            raise BackendUnavailable(f"the {self.what} backend is not started")
        return self._client
