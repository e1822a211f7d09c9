"""Which headers go on from one side to the other: one table (:data:`DROPPED`), applied once
where they enter, into one value (:data:`~v2proxy.core.ports.Headers`): bytes pairs as an HTTP
backend sends them, and as gRPC metadata (:func:`metadata`) for a gRPC one, ready from the start
when they came as gRPC metadata (:class:`Forwarded`). A backend only adds its own framing to
it."""

from __future__ import annotations

from collections.abc import Iterable

from v2proxy.core.errors import InvalidRequest

ALWAYS, BODY, GRPC, MAPPED = 1, 2, 4, 8

#: name -> the edges that drop it (ALWAYS | BODY | GRPC | MAPPED: a request v2proxy maps onto
#: another operation, a generate request onto inference, drops what the client accepts)
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


#: what a passed-through request or answer drops (its body goes as it came)
PASSED = _of(ALWAYS)
#: what a request whose body v2proxy writes drops
WRITTEN = _of(ALWAYS | BODY)
#: what a gRPC call's metadata drops (its message is always v2proxy's to write)
CALL = _of(ALWAYS | BODY | GRPC)
#: what a request mapped onto inference drops (of what its edge forwarded)
INFERRED = _of(ALWAYS | BODY | MAPPED)


class Forwarded(list[tuple[bytes, bytes]]):
    """The end-to-end headers of a gRPC call, filtered once where they came in: (lowercase name,
    value) pairs, with their gRPC metadata kept ready (:func:`metadata`). (An HTTP request's are
    a plain list, cheaper to make on the hot path: their metadata is made when a gRPC backend
    needs it, kept when they are a Forwarded.)"""

    __slots__ = ("grpc",)
    #: the gRPC metadata of these headers (unset until made)
    grpc: list[tuple[str, str]]


def forwarded(
    headers: Iterable[tuple[bytes, bytes]], dropped: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """The pairs of ``headers`` (names lowercase) whose name is not in ``dropped``."""
    return [(name, value) for name, value in headers if name not in dropped]


def metadata(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """``headers`` as gRPC metadata, which carries printable ASCII only: a header whose value
    is not is refused, naming it (nothing is re-encoded behind the client's back). Ready, or
    made once, for a :class:`Forwarded` value."""
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
    """A gRPC call's metadata as the headers that go on, their metadata ready (gRPC metadata is
    printable ASCII; the ``-bin`` entries, pseudo-headers and ``grpc-`` fields stay with the
    call)."""
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
            kept = None  # (not as gRPC gives them: made, and checked, when needed)
    if kept is not None:
        out.grpc = kept
    return out
