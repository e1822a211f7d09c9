"""Helpers shared by the backends (the interface itself, :class:`v2proxy.pipeline.Backend`,
belongs to the pipeline that calls it)."""

from __future__ import annotations

from collections.abc import AsyncIterator


async def single_chunk(data: bytes) -> AsyncIterator[bytes]:
    """A body stream of one chunk."""
    yield data
