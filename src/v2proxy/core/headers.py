"""Which headers go on from one side to the other: one table (:data:`DROPPED`), applied once
where they enter."""

from __future__ import annotations

from collections.abc import Iterable

ALWAYS, BODY, GRPC = 1, 2, 4

#: name -> the edges that drop it (ALWAYS | BODY | GRPC)
DROPPED: dict[bytes, int] = {
    b"connection": ALWAYS,
    b"keep-alive": ALWAYS,
    b"proxy-authenticate": ALWAYS,
    b"proxy-authorization": ALWAYS,
    b"proxy-connection": ALWAYS,
    b"te": ALWAYS,
    b"trailer": ALWAYS,
    b"transfer-encoding": ALWAYS,
    b"upgrade": ALWAYS,
    b"host": ALWAYS,
    b"content-length": ALWAYS,
    b"content-type": BODY,
    b"content-encoding": BODY,
    b"accept-encoding": BODY,
    b"inference-header-content-length": BODY,
    b"user-agent": GRPC,
    b"grpc-accept-encoding": GRPC,
    b"grpc-encoding": GRPC,
    b"grpc-timeout": GRPC,
    b"triton_grpc_error": GRPC,
}


def _of(edges: int) -> frozenset[bytes]:
    return frozenset(name for name, dropped in DROPPED.items() if dropped & edges)


#: what a passed-through request or answer drops (its body goes as it came)
PASSED = _of(ALWAYS)
#: what a request whose body v2proxy writes drops
WRITTEN = _of(ALWAYS | BODY)
#: what a gRPC call's metadata drops (its message is always v2proxy's to write)
CALL = _of(ALWAYS | BODY | GRPC)


def forwarded(
    headers: Iterable[tuple[bytes, bytes]], dropped: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """The pairs of ``headers`` (names lowercase) whose name is not in ``dropped``."""
    return [(name, value) for name, value in headers if name not in dropped]


def answer_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A passed-through answer's headers (names lowercase) that go on to the client."""
    return [(name, value) for name, value in headers if name not in PASSED]


def call_headers(metadata: Iterable[tuple[str, str | bytes]]) -> list[tuple[bytes, bytes]]:
    """A gRPC call's metadata as the headers that go on (gRPC metadata is printable ASCII; the
    ``-bin`` entries, pseudo-headers and ``grpc-`` fields stay with the call)."""
    out = []
    for key, value in metadata:
        name = key.encode("ascii")
        if name in CALL or key.startswith((":", "grpc-")) or key.endswith("-bin"):
            continue
        out.append((name, value if isinstance(value, bytes) else value.encode()))
    return out
