"""Helpers shared by the backends (the interface itself, :class:`v2proxy.pipeline.Backend`,
belongs to the pipeline that calls it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from v2proxy.errors import Unsupported
from v2proxy.model import Buffer
from v2proxy.pipeline import ForwardResponse


async def single_chunk(data: bytes) -> AsyncIterator[bytes]:
    """A body stream of one chunk."""
    yield data


class DecodedOnly:
    """For backends that take decoded requests only: nothing is relayed as bytes."""

    async def can_relay(self, binary: bool) -> bool:
        return False

    async def relay_infer(
        self, model: str, version: str, body: Buffer, ihcl: int | None, headers: dict[str, str]
    ) -> ForwardResponse:
        raise Unsupported("this backend takes decoded requests only")
