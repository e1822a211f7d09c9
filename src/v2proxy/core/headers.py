"""Which headers go on from one side to the other: one table (:data:`DROPPED`), applied once
where they enter, into bytes pairs; a gRPC backend gets them as metadata (:func:`metadata`)."""

from __future__ import annotations

from collections.abc import Iterable

from v2proxy.core.errors import InvalidRequest

ALWAYS, BODY, GRPC, MAPPED = 1, 2, 4, 8

#: name -> the edges that drop it (MAPPED: a generate request mapped onto inference)
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
    b"accept": MAPPED,
    b"user-agent": GRPC,
    b"grpc-accept-encoding": GRPC,
    b"grpc-encoding": GRPC,
    b"grpc-timeout": GRPC,
    b"triton_grpc_error": GRPC,
}


def _of(edges: int) -> frozenset[bytes]:
    return frozenset(name for name, dropped in DROPPED.items() if dropped & edges)


PASSED = _of(ALWAYS)
WRITTEN = _of(ALWAYS | BODY)
CALL = _of(ALWAYS | BODY | GRPC)
INFERRED = _of(ALWAYS | BODY | MAPPED)


class Forwarded(list[tuple[bytes, bytes]]):
    """Filtered (lowercase name, value) pairs that keep their gRPC metadata once made
    (an HTTP request's headers are a plain list, cheaper on the hot path)."""

    __slots__ = ("grpc",)
    grpc: list[tuple[str, str]]


def forwarded(
    headers: Iterable[tuple[bytes, bytes]], dropped: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """The pairs of ``headers`` (names lowercase) whose name is not in ``dropped``."""
    return [(name, value) for name, value in headers if name not in dropped]


def metadata(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """``headers`` as gRPC metadata, which carries printable ASCII only: a non-ASCII value is
    refused, not re-encoded behind the client's back."""
    made: list[tuple[str, str]] | None = getattr(headers, "grpc", None)
    if made is not None:
        return made
    made = []
    for name, value in headers:
        try:
            made.append((name.decode("ascii"), value.decode("ascii")))
        except UnicodeDecodeError:
            raise InvalidRequest(
                f"header '{name.decode('latin-1')}' has a value that is not ASCII, which a gRPC"
                " backend cannot take"
            ) from None
    if type(headers) is Forwarded:
        headers.grpc = made
    return made


def answer_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A passed-through answer's headers (names lowercase) that go on to the client."""
    return [(name, value) for name, value in headers if name not in PASSED]


def call_headers(entries: Iterable[tuple[str, str | bytes]]) -> Forwarded:
    """A gRPC call's metadata as the headers that go on (``-bin`` entries, pseudo-headers and
    ``grpc-`` fields stay with the call)."""
    out = Forwarded()
    kept: list[tuple[str, str]] | None = []
    for key, value in entries:
        name = key.encode("ascii")
        if name in CALL or key.startswith((":", "grpc-")) or key.endswith("-bin"):
            continue
        if isinstance(value, str):
            out.append((name, value.encode()))
            if kept is not None:
                kept.append((key, value))
        else:
            out.append((name, value))
            kept = None  # bytes: checked and made when needed
    if kept is not None:
        out.grpc = kept
    return out
