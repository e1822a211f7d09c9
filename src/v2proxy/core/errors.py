"""The one error tree of v2proxy.

Every error a request can meet is a :class:`ProxyError` carrying its HTTP status and its gRPC
status-code name; each frontend translates them in one place, and foreign exceptions are mapped
to this tree where they occur. A message always encodes to UTF-8 (:func:`safe_text`)."""

from __future__ import annotations


def safe_text(text: str) -> str:
    """``text`` that encodes to UTF-8: each lone surrogate (which no UTF-8 text holds) becomes
    its Python escape, ``\\ud800``; any other text is returned as is."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class ProxyError(Exception):
    """Base of every error v2proxy answers with."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return self._message

    @message.setter
    def message(self, text: str) -> None:
        self._message = safe_text(text)

    def __str__(self) -> str:
        return self.message


class InvalidRequest(ProxyError):
    """The request is malformed or inconsistent (a field at fault is named in the message)."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class CodecError(InvalidRequest):
    """Raised by the pure codecs: the bytes do not decode to a valid request or response."""


class InvalidText(CodecError):
    """A JSON string that is no Unicode text: a ``\\ud800``-``\\udfff`` escape without its pair (RFC
    8259 §8.2), which no UTF-8 encoder can write."""

    def __init__(self, message: str, field: str = "", in_key: bool = False, char: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.in_key = in_key
        self.char = char


class InvalidField(CodecError):
    """One field of a request is at fault: ``field`` names it as the client wrote it (``messages``,
    ``stop``, ``stream_options.include_usage``), for the APIs whose error shape has a place for it
    (OpenAI's ``param``)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class PayloadTooLarge(InvalidRequest):
    """A body, header or decoded tensor exceeds the configured size limit (Triton answers 400)."""


class BodyTooLarge(ProxyError):
    """The HTTP body exceeds the hard cap on any body (``--max-body-size``)."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class ExpectationFailed(InvalidRequest):
    """An HTTP ``Expect`` header other than ``100-continue`` (RFC 9110 §10.1.1)."""

    http_status = 417


class AlreadyExists(InvalidRequest):
    """A name that must be new is taken (a shared-memory region; Triton: 400 / ALREADY_EXISTS)."""

    grpc_code = "ALREADY_EXISTS"


class Forbidden(ProxyError):
    """The operation belongs to a restricted API group (``--restricted-api``) and the request
    lacks the header that opens it (Triton answers 403 too)."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"


class NotFound(ProxyError):
    """Unknown model, version, region or route."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class MethodNotAllowed(ProxyError):
    """A known path asked with a method it does not take (answered by the frontend with
    ``Allow``; an error of this tree so that each API writes it in its own shape)."""

    http_status = 405
    grpc_code = "UNIMPLEMENTED"


class Unsupported(ProxyError):
    """The request asks for something this server or backend does not provide."""

    http_status = 501
    grpc_code = "UNIMPLEMENTED"


class UnsupportedEncoding(InvalidRequest):
    """A request ``Content-Encoding`` this server cannot decode: 415 with ``Accept-Encoding``
    naming those it can (RFC 9110 §15.5.16; Triton answers 501, a server error for a client's
    fault)."""

    http_status = 415


class Overloaded(ProxyError):
    """The proxy is serving as many requests as ``--max-concurrency`` allows: refused at once,
    to be retried later (REST: 503 with ``Retry-After``; gRPC: RESOURCE_EXHAUSTED)."""

    http_status = 503
    grpc_code = "RESOURCE_EXHAUSTED"


class BackendError(ProxyError):
    """The backend answered with an error of its own; status and message are passed on."""

    grpc_code = "UNKNOWN"

    def __init__(self, message: str, http_status: int = 500, grpc_code: str | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.grpc_code = grpc_code or _GRPC_BY_HTTP.get(http_status, "UNKNOWN")


class BadGateway(ProxyError):
    """The backend could not be reached or answered with something that is not v2."""

    http_status = 502
    grpc_code = "UNAVAILABLE"


class BackendUnavailable(ProxyError):
    """The backend refused the connection or said it is not ready."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class GatewayTimeout(ProxyError):
    """The backend did not answer in time."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


_GRPC_BY_HTTP = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    413: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
