"""The error tree of the HTTP client (:mod:`v2proxy.http.client`).

Contract: every failure of a request is an :class:`HttpClientError` subclass (TLS and OS
errors included: they are mapped where they occur), one class per way a request fails, so that
a caller (the REST backend) maps each to its own answer without looking at messages.
"""

from __future__ import annotations

__all__ = [
    "AnswerTooLarge",
    "ConnectFailed",
    "ConnectTimeout",
    "Http2Answer",
    "HttpClientError",
    "ProtocolError",
    "ReadTimeout",
    "RemoteClosed",
]


class HttpClientError(Exception):
    """Base of every failure of a request."""

    #: the status of the answer whose body failed (0: no answer's head came)
    answered = 0


class ConnectFailed(HttpClientError):
    """The connection could not be made (refused, unreachable, name not resolved, TLS)."""


class ConnectTimeout(HttpClientError):
    """The connection was not made within ``connect_timeout``."""


class ProtocolError(HttpClientError):
    """The answer is not valid HTTP/1.1 (or over a size limit)."""


class Http2Answer(ProtocolError):
    """The server sent HTTP/2 frames (its SETTINGS frame): an HTTP/2-only port, gRPC most likely."""


class AnswerTooLarge(ProtocolError):
    """The answer's body is over the limit it was read with."""

    def __init__(self, limit: int, length: int | None = None) -> None:
        of = f"of {length} bytes " if length is not None else ""
        super().__init__(f"answer body {of}over the limit of {limit} bytes")
        #: the limit it was read with
        self.limit = limit


class RemoteClosed(HttpClientError):
    """The connection ended before the answer was complete."""

    def __init__(self, message: str, request_sent: bool = True) -> None:
        super().__init__(message)
        #: whether any byte of the request may have reached the server
        self.request_sent = request_sent


class ReadTimeout(HttpClientError):
    """No byte of the answer came for ``read_timeout`` seconds while one was awaited."""
