"""HTTP helpers shared by the REST frontend and the REST backend (aiohttp on both sides):
hop-by-hop header filtering and reading a body into one buffer with a single copy."""

from __future__ import annotations

from aiohttp import StreamReader

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


def end_to_end(
    headers: list[tuple[str, str]], also_drop: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """The headers that may cross a proxy hop."""
    return [
        (k, v) for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() not in also_drop
    ]


_HOP_BY_HOP_B = frozenset(h.encode() for h in HOP_BY_HOP)


def forwardable(
    headers: list[tuple[bytes, bytes]], also_drop: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """The end-to-end headers among raw ``headers`` (names lowercased), values untouched."""
    out = []
    for k, v in headers:
        name = k.lower()
        if name not in _HOP_BY_HOP_B and name not in also_drop:
            out.append((name, v))
    return out


class ShortBody(Exception):
    """The peer closed the body before Content-Length bytes arrived."""


async def read_exactly(stream: StreamReader, length: int) -> bytearray:
    """Read a body of known length into one preallocated buffer (one copy from the socket
    buffers, where aiohttp's read() makes two)."""
    buf = bytearray(length)
    view = memoryview(buf)
    pos = 0
    while pos < length:
        chunk = await stream.readany()
        if not chunk:
            raise ShortBody(f"body ended after {pos} of {length} bytes")
        end = pos + len(chunk)
        if end > length:
            raise ShortBody(f"body is longer than its Content-Length of {length} bytes")
        view[pos:end] = chunk
        pos = end
    return buf
