"""Helpers shared by the backends (the interface itself, :class:`v2proxy.pipeline.Backend`,
belongs to the pipeline that calls it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

#: Headers that describe one connection, never forwarded (RFC 9110 §7.6.1), plus the framing
#: headers every hop recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


async def single_chunk(data: bytes) -> AsyncIterator[bytes]:
    """A body stream of one chunk."""
    yield data


def end_to_end(
    headers: list[tuple[str, str]], also_drop: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """The headers that may cross a proxy hop."""
    return [
        (k, v) for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() not in also_drop
    ]
