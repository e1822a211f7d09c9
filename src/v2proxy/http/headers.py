"""Header filtering shared by the REST frontend, the REST backend and the gRPC frontend: which
headers describe one connection (hop-by-hop, RFC 9110 §7.6.1) and are never forwarded."""

from __future__ import annotations

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
