"""What a complete request head means to the server, or why it is refused (RFC 9112 §2.3, §3.2,
§6, §9.3; RFC 9110 §7.8 Upgrade, §10.1.1 Expect).

Pure: no I/O, no state. :func:`check_head` reads what llhttp parsed (version, method, and
whether llhttp would switch protocols after the head) plus the target and header fields the
connection collected (names lowercased) and llhttp's keep-alive verdict (which, for most
heads, tells HTTP/1.1 without asking for the version), and returns the framing facts of
:data:`Head` or raises :class:`Rejection` with the status and the fixed message to answer.
Checks run in this order, the first failing one wins:

- 505: a version other than 1.0/1.1;
- 400: ``CONNECT``; a target not in origin-form (absolute-form, ``*``, authority-form);
- in header order: 400 any Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1: its
  framing is faulty, whatever else it carries); 501 a transfer coding other than ``chunked``;
  417 an Expect other than ``100-continue``;
- 400: Content-Length together with Transfer-Encoding; 413: Content-Length over
  ``max_body_size``; 400: an Upgrade request (one llhttp would switch protocols after) with a
  body. An Upgrade without a body is served as if the header were absent.

llhttp has already refused a Content-Length that is not all digits and any repeated one, so
the value is parsed as is. The limits on the fields while the head arrives are measured here
(:func:`fields_size`, :func:`fields_over`: 431 for too many fields or too many bytes of them,
whichever came first) and applied by the connection (:mod:`.server_conn`), which also bounds
the target's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Protocol

#: (method, version, content_length, chunked, keep_alive, expect_continue): ``expect_continue``
#: only when the request is HTTP/1.1 and has a body; ``keep_alive`` per RFC 9112 §9.3
Head = tuple[str, tuple[int, int], int | None, bool, bool, bool]

_V11, _V10 = (1, 1), (1, 0)
_VERSIONS = {"1.1": _V11, "1.0": _V10}
_SLASH = ord("/")
#: the fields llhttp's keep-alive verdict reads
_CONNECTION = frozenset((b"connection", b"proxy-connection"))
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
#: the fields that the framing facts come from (the rest are skipped at once)
FRAMING = _FRAMING = frozenset(
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

    ``keeps_alive``: llhttp's ``should_keep_alive()`` at the end of this head. llhttp takes only
    versions 0.9, 1.0, 1.1 and 2.0, and with no Connection or Proxy-Connection field it keeps
    only an HTTP/1.1 request alive: then the version need not be asked (a formatted string
    each time). A head with such a field, and a refused one, is checked again with the
    version asked.

    ``framed=False``: the caller saw no framing field among ``headers`` but Content-Length,
    whose value is ``length_field``: the usual head is then taken without a look at each field."""
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
            if name not in _FRAMING:
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


__all__ = ["FRAMING", "Head", "ParsedHead", "Rejection", "check_head"]


def fields_size(fields: Sequence[tuple[bytes, bytes]]) -> int:
    """The bytes ``fields`` take in a head (each name and value, ``: `` and CRLF)."""
    return sum(map(len, chain.from_iterable(fields))) + 4 * len(fields)


def fields_over(
    fields: Sequence[tuple[bytes, bytes]], max_bytes: int, max_fields: int
) -> tuple[int, str] | None:
    """The 431 due to the fields gathered so far — over ``max_bytes`` of them or over
    ``max_fields`` fields, whichever limit the fields crossed first — or None."""
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
