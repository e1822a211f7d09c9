"""The head of each request of :mod:`v2proxy.http.client` (RFC 9112 §3, RFC 9110 §5.5), built
and checked in one pass; pure (no I/O).

``Host`` and Content-Length are written here. :class:`ValueError` for CR, LF or NUL in a header,
a header name that is not a token or one the client sets itself (framing, hop-by-hop), or a
target that is not origin-form. Headers given as a ``tuple`` are taken as fixed: the head up to
Content-Length is remembered per (method, target) with that tuple and not checked again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = ["RequestHeads"]

_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_TCHAR: Final = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_CTL_SP: Final = bytes(range(0x21)) + b"\x7f"  # never in a request target
_OWN = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection", b"upgrade"})
_OWN |= {b"te", b"keep-alive", b"trailer"}


def _bad_token(name: bytes) -> bool:
    return not name or bool(name.translate(None, _TCHAR))


#: request lines and header names remembered as valid, per client, at most
_CACHED: Final = 1024


class _Fixed:
    """The head of one (method, target) with one fixed headers tuple: all but its
    Content-Length (``prefix``), and the last head made of it (``length``, ``head``): the
    requests of one model mostly have one size."""

    __slots__ = ("head", "headers", "length", "prefix")

    def __init__(self, headers: object, prefix: bytes) -> None:
        self.headers = headers
        self.prefix = prefix
        self.length: int | None = -1
        self.head = b""


class RequestHeads:
    """Request heads for one origin (``authority``: its ``host:port``); header names and
    request lines found valid are remembered (bounded) and not checked again."""

    __slots__ = ("_fixed", "_host_line", "_lines", "_names_ok", "authority")

    def __init__(self, host: str, port: int) -> None:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.authority = authority
        try:
            self._host_line = b" HTTP/1.1\r\nHost: " + authority.encode("ascii") + b"\r\n"
        except UnicodeEncodeError:
            self._host_line = b" HTTP/1.1\r\nHost: %s:%d\r\n" % (host.encode("idna"), port)
        self._names_ok: set[bytes] = set()
        self._lines: dict[tuple[str, str], bytes] = {}
        #: (method, target) -> its head with a fixed headers tuple
        self._fixed: dict[tuple[str, str], _Fixed] = {}

    def build(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        length: int | None,
    ) -> bytes:
        """The head of ``method target`` with ``headers`` (and ``length`` as Content-Length)."""
        key = (method, target)
        fixed = self._fixed.get(key)
        if fixed is not None and fixed.headers is headers:
            if length == fixed.length:
                return fixed.head
            if length is None:
                head = fixed.prefix + b"\r\n"
            else:
                head = b"%sContent-Length: %d\r\n\r\n" % (fixed.prefix, length)
            fixed.length = length
            fixed.head = head
            return head
        head = self._build(method, target, headers, length)
        if type(headers) is tuple and (fixed is not None or len(self._fixed) < _CACHED):
            end = (
                len(head)
                - 2
                - (len(b"Content-Length: \r\n%d" % length) if length is not None else 0)
            )
            self._fixed[key] = _Fixed(headers, head[:end])
        return head

    def _build(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        length: int | None,
    ) -> bytes:
        line = self._lines.get((method, target))
        if line is None:
            line = self._request_line(method, target)
        parts = [line]
        ok = self._names_ok
        for name, value in headers:
            if name not in ok:
                self._check_name(name)
            parts += (name, b": ", value, b"\r\n")
        if length is not None:
            parts += (b"Content-Length: ", b"%d" % length, b"\r\n")
        parts.append(b"\r\n")
        head = b"".join(parts)
        # Every CR and LF must be one of the line ends written here, and no NUL (C-level scans)
        ends = len(headers) + 3 + (length is not None)
        if head.count(b"\n") != ends or head.count(b"\r") != ends or b"\0" in head:
            for name, value in headers:
                if b"\r" in value or b"\n" in value or b"\0" in value:
                    raise ValueError(f"CR, LF or NUL in the value of header {name!r}")
            raise AssertionError("unreachable")  # pragma: no cover
        return head

    def _request_line(self, method: str, target: str) -> bytes:
        """The request line and Host of ``method target``, checked (and remembered)."""
        if method not in _METHODS and (not method.isascii() or _bad_token(method.encode())):
            raise ValueError(f"invalid request method {method[:80]!r}")
        raw = target.encode("latin-1")  # a UnicodeEncodeError is a ValueError
        if raw[:1] != b"/" or len(raw.translate(None, _CTL_SP)) != len(raw):
            raise ValueError(f"the request target must be origin-form (/...): {target[:80]!r}")
        line = method.encode() + b" " + raw + self._host_line
        if len(self._lines) < _CACHED:
            self._lines[(method, target)] = line
        return line

    def _check_name(self, name: bytes) -> None:
        if _bad_token(name):
            raise ValueError(f"invalid header name {name[:80]!r}")
        if name.lower() in _OWN:
            raise ValueError(f"header {name!r} is set by the HTTP client, not by its caller")
        if len(self._names_ok) < _CACHED:
            self._names_ok.add(name)
