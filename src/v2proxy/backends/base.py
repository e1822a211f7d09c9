"""Helpers shared by the backends (the interface itself, :class:`v2proxy.ports.Backend`,
belongs to the core that calls it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from v2proxy.errors import InvalidRequest, NotFound, Unsupported
from v2proxy.model import Buffer, InferResponse
from v2proxy.ports import Body, ForwardResponse, Headers


async def single_response(model: str, responses: AsyncIterator[InferResponse]) -> InferResponse:
    """The one response of a (decoupled) model to a unary request; a request that makes it
    answer several times (or none) belongs on a stream."""
    got = [r async for r in responses]
    if len(got) != 1:
        raise InvalidRequest(
            f"model '{model}' answers this request with {len(got)} responses: ask with"
            " streaming (gRPC ModelStreamInfer) or set 'stream' to false"
        )
    return got[0]


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
