"""Helpers shared by the backends (the interface itself, :class:`v2proxy.ports.Backend`,
belongs to the core that calls it)."""

from __future__ import annotations

from v2proxy.errors import NotFound, Unsupported
from v2proxy.model import Buffer
from v2proxy.ports import Body, ForwardResponse, Headers


class DecodedOnly:
    """For backends that take decoded requests only: nothing is relayed as bytes, and REST
    requests that are not v2 operations have nowhere to go."""

    #: what a REST path under /v2 that is no v2 operation gets from this backend
    other_v2_error: type[NotFound] | type[Unsupported] = NotFound

    async def can_relay(self, binary: bool) -> bool:
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
