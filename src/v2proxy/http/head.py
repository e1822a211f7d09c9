"""What a complete request head means to the server, or why it is refused (RFC 9112 §2.3, §3.2,
§6, §9.3; RFC 9110 §7.8 Upgrade, §10.1.1 Expect).

Pure: :func:`check_head` reads what llhttp parsed plus the fields the connection collected
(names lowercased), and returns the framing facts of :data:`Head` or raises :class:`Rejection`
with the status and fixed message to answer; the first failing check wins. An Upgrade without a
body is served as if the header were absent. llhttp has already refused a Content-Length that
is not all digits and any repeated one.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Final, Protocol

#: (method, version, content_length, chunked, keep_alive, expect_continue)
Head = tuple[str, tuple[int, int], int | None, bool, bool, bool]

_V11: Final = (1, 1)
_V10: Final = (1, 0)
_VERSIONS: Final = {"1.1": _V11, "1.0": _V10}
_SLASH: Final = ord("/")
#: the fields llhttp's keep-alive verdict reads
_CONNECTION: Final = frozenset((b"connection", b"proxy-connection"))
_METHODS: Final = {
    m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")
}
FRAMING: Final = frozenset(
    (
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"upgrade",
        b"expect",
        b"proxy-connection",
    )
)


class ParsedHead(Protocol):
    """What :func:`check_head` asks of the parser (httptools' ``HttpRequestParser``)."""

    def get_http_version(self) -> str: ...

    def get_method(self) -> bytes: ...

    def should_upgrade(self) -> bool: ...


class Rejection(Exception):
    """The head is refused: answer :attr:`status` with :attr:`message` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message


#: field names as they came -> lowercased (bounded: names a peer makes up are not kept)
_LOWERED: Final[dict[bytes, bytes]] = {}
_LOWERED_KEPT: Final = 256


def field_name(name: bytes) -> bytes:
    """``name`` lowercased, as the connections keep field names: a look-up for the names seen
    before (``bytes.lower`` is a generic method call from compiled code, a few times dearer)."""
    low = _LOWERED.get(name)
    if low is None:
        low = name.lower()
        if len(_LOWERED) < _LOWERED_KEPT:
            _LOWERED[name] = low
    return low


#: names a connection keeps of its last head, at most
_NAMES_KEPT: Final = 64


class FieldNames:
    """The field names of a connection's last head, as they came and lowercased. A peer sends
    the same names in the same order head after head, so the ``k``-th name of a head is most
    often the last head's ``k``-th: compared with it, not hashed (:func:`field_name`)."""

    __slots__ = ("came", "lowered")

    def __init__(self) -> None:
        self.came: list[bytes] = []
        self.lowered: list[bytes] = []

    def lower(self, k: int, name: bytes) -> bytes:
        """The ``k``-th field name of a head, lowercased."""
        came = self.came
        if k < len(came):
            if came[k] == name:
                return self.lowered[k]
            low = field_name(name)
            came[k] = name
            self.lowered[k] = low
            return low
        low = field_name(name)
        if k == len(came) and k < _NAMES_KEPT:
            came.append(name)
            self.lowered.append(low)
        return low


def check_head(
    parser: ParsedHead,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    max_body_size: int,
    keeps_alive: bool = False,
    framed: bool = True,
    length_field: bytes | None = None,
) -> Head:
    """The framing facts of a complete head; :class:`Rejection` when it is refused.
    ``keeps_alive`` (llhttp's verdict) with no Connection field means HTTP/1.1, so the version
    need not be asked; ``framed=False``: no framing field but Content-Length was seen."""
    if keeps_alive and not framed:
        method = _METHODS.get(parser.get_method())
        if method is not None and target and target[0] == _SLASH:
            size = None if length_field is None else int(length_field)
            if size is None or size <= max_body_size:
                return method, _V11, size, False, True, False
    if keeps_alive:
        version = _V11
    else:
        found = _VERSIONS.get(parser.get_http_version())
        if found is None:
            raise Rejection(505, "HTTP version not supported; use HTTP/1.1")
        version = found
    try:
        raw = parser.get_method()
        method = _METHODS.get(raw) or raw.decode("ascii", "replace")
        if method == "CONNECT":
            raise Rejection(400, "CONNECT is not supported")
        if not target or target[0] != _SLASH:
            raise Rejection(400, "the request target must be a path (origin-form)")
        length: int | None = None
        chunked = close = keep = expect = upgrade = False
        for name, value in headers:
            if name not in FRAMING:
                continue
            if name == b"content-length":
                length = int(value)  # llhttp let only digits and one such header through
            elif name == b"transfer-encoding":
                if version == _V10:
                    raise Rejection(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request")
                for coding in value.split(b","):
                    if coding.strip().lower() != b"chunked":
                        raise Rejection(501, "only the chunked transfer coding is supported")
                chunked = True
            elif keeps_alive and name in _CONNECTION:
                return check_head(parser, target, headers, max_body_size)  # ask the version
            elif name == b"connection":
                tokens = [t.strip() for t in value.lower().split(b",")]
                close = close or b"close" in tokens
                keep = keep or b"keep-alive" in tokens
            elif name == b"upgrade":
                upgrade = True
            elif name == b"expect":
                if value.strip().lower() != b"100-continue":
                    raise Rejection(417, "only 'Expect: 100-continue' is supported")
                expect = version == _V11
            # proxy-connection: only llhttp's keep-alive verdict reads it
        if chunked and length is not None:
            raise Rejection(400, "Content-Length together with Transfer-Encoding")
        if length is not None and length > max_body_size:
            raise Rejection(413, f"request body larger than {max_body_size} bytes")
        if upgrade and (chunked or length) and parser.should_upgrade():
            raise Rejection(400, "an Upgrade request cannot have a body here")
    except Rejection:
        if keeps_alive:  # refused as HTTP/1.1: the version decides what is answered
            return check_head(parser, target, headers, max_body_size)
        raise
    return (
        method,
        version,
        length,
        chunked,
        not close and (keep or version == _V11),
        expect and (chunked or bool(length)),
    )


__all__ = ["FRAMING", "FieldNames", "Head", "ParsedHead", "Rejection", "check_head"]


def fields_size(fields: Sequence[tuple[bytes, bytes]]) -> int:
    """The bytes ``fields`` take in a head (each name and value, ``: `` and CRLF)."""
    return sum(map(len, chain.from_iterable(fields))) + 4 * len(fields)


def fields_over(
    fields: Sequence[tuple[bytes, bytes]], max_bytes: int, max_fields: int
) -> tuple[int, str] | None:
    """The 431 due to the fields gathered so far (whichever limit they crossed first), or
    None."""
    if fields_size(fields) <= max_bytes and len(fields) <= max_fields:
        return None
    size = 0
    for i, (name, value) in enumerate(fields, 1):
        if i > max_fields:
            return 431, "too many header fields"
        size += len(name) + len(value) + 4
        if size > max_bytes:
            break
    return 431, "request head too large"
