"""What a REST backend (:mod:`v2proxy.backends.rest`) answers, checked and mapped to the error tree
(docs/architecture.md, the error tree): the HTTP client's failures, error answers, the JSON of
structured answers, and the v2 checks of a relayed /infer answer.

A 404 about a model is reported in Triton's ``Request for unknown model`` words, which clients
match on. A 200 /infer answer relayed unchanged must be JSON or ``application/octet-stream``
with an Inference-Header-Content-Length within the body, and parse as a JSON object; else 502.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from v2proxy.codecs import binary as binc
from v2proxy.codecs.json import is_object, loads
from v2proxy.core.errors import (
    BackendError,
    BackendUnavailable,
    BadGateway,
    CodecError,
    GatewayTimeout,
    InvalidRequest,
    NotFound,
    ProxyError,
)
from v2proxy.core.model import Buffer
from v2proxy.core.ports import Headers
from v2proxy.http.client_errors import (
    AnswerTooLarge,
    ConnectFailed,
    ConnectTimeout,
    Http2Answer,
    HttpClientError,
    ReadTimeout,
)

__all__ = [
    "IHCL",
    "error_message",
    "failure",
    "json_answer",
    "mapped",
    "model_answer",
    "raise_for_status",
    "relayed_headers",
    "unknown_model",
]

IHCL: Final = binc.IHCL_HEADER.lower().encode()


def failure(exc: Exception, base_url: str, timeout: float, what: str) -> ProxyError | None:
    """The error-tree error for the HTTP client's failure ``exc`` in one call (``what``); None
    when ``exc`` is to be raised as it is."""
    if isinstance(exc, ProxyError):
        return None
    where = f"backend at {base_url}"
    if isinstance(exc, AnswerTooLarge):
        option = "--max-body-size" if what == "inference" else "--backend-max-answer-size"
        return BadGateway(f"{where} answered {what} with more than {exc.limit} bytes ({option})")
    if isinstance(exc, ConnectFailed):
        return BackendUnavailable(f"{where} is unavailable for {what}: {exc}")
    if isinstance(exc, ConnectTimeout):
        return GatewayTimeout(f"{where} did not answer {what} in time: {exc}")
    if isinstance(exc, ReadTimeout | TimeoutError):
        return GatewayTimeout(
            f"{where} did not answer {what} in time (--backend-timeout {timeout:g} s)"
        )
    if isinstance(exc, Http2Answer):
        scheme, _, rest = base_url.partition("://")
        grpc = "grpcs" if scheme == "https" else "grpc"
        return BadGateway(
            f"{where} failed during {what}: {exc}: this port speaks gRPC: use {grpc}://{rest}"
        )
    if isinstance(exc, HttpClientError):  # ProtocolError, RemoteClosed
        return BadGateway(f"{where} failed during {what}: {exc}")
    if isinstance(exc, ValueError):  # a header or path the HTTP client refuses to send
        return InvalidRequest(f"cannot pass the request on to the backend: {exc}")
    return None


@contextmanager
def mapped(base_url: str, timeout: float, what: str) -> Iterator[None]:
    """Map the HTTP client's failures in the block (:func:`failure`) to the error tree."""
    try:
        yield
    except Exception as exc:
        mapped_exc = failure(exc, base_url, timeout, what)
        if mapped_exc is None:
            raise
        raise mapped_exc from None


def error_message(body: Buffer, status: int) -> str:
    """The message of an error answer: its JSON ``error``, ``detail`` or ``message``, else its
    text (at most 1000 characters)."""
    try:
        obj = loads(body, what="error")
    except CodecError:
        text = bytes(body).decode("utf-8", "replace").strip()
        return text[:1000] or f"backend answered HTTP {status}"
    if isinstance(obj, dict):
        for key in ("error", "detail", "message"):
            if key in obj:
                value = obj[key]
                return value if isinstance(value, str) else str(value)
    return str(obj)[:1000]


def unknown_model(model: str, detail: str) -> NotFound:
    """A 404 about ``model``, in Triton's words (the backend's ``detail`` kept)."""
    msg = f"Request for unknown model: '{model}' is not found"
    if detail and not detail.startswith("Request for unknown model"):
        msg += f" (backend: {detail})"
    return NotFound(detail if detail.startswith("Request for unknown model") else msg)


def raise_for_status(status: int, body: Buffer, model: str | None) -> None:
    """Raise a non-200 answer with its status and message; a 404 as NotFound (about
    ``model`` in Triton's words, when the call was about one)."""
    if status == 200:
        return
    message = error_message(body, status)
    if status == 404:
        raise NotFound(message) if model is None else unknown_model(model, message)
    raise BackendError(message, status)


def model_answer(status: int, obj: Any, model: str) -> dict[str, Any]:
    """A model's metadata or config: ``obj`` when the answer was a 200 with a JSON object."""
    if status == 404:
        raise unknown_model(model, str(obj))
    if status != 200 or not isinstance(obj, dict):
        raise BackendError(str(obj), status if status != 200 else 502)
    return obj


def json_answer(body: bytes | bytearray, to: str, what: str) -> Any:
    """The JSON of a 200 answer to the call ``to`` (``{}`` when empty); BadGateway when it is
    not JSON (``what``: how the codec names it)."""
    try:
        return loads(body, what=what) if body.strip() else {}
    except CodecError as exc:
        raise BadGateway(f"invalid answer from backend to {to}: {exc}") from None


def _what(base_url: str) -> str:
    return f"inference response from backend at {base_url}"


def _json_object(buf: Buffer, base_url: str) -> None:
    try:
        found = is_object(buf, what="response")
    except CodecError as exc:
        raise BadGateway(f"invalid {_what(base_url)}: {exc}") from None
    if not found:
        raise BadGateway(f"invalid {_what(base_url)}: not a JSON object")


def relayed_headers(
    headers: list[tuple[bytes, bytes]],
    length: int | None,
    content: bytes | bytearray | None,
    base_url: str,
) -> Headers:
    """The headers passed on with a 200 /infer answer, once it is seen to be v2 (``content``,
    when read, parsed); BadGateway else."""
    ctype = ihcl_value = None
    relayed = []
    for k, v in headers:  # one pass: several values of one name are joined, as header()
        if k == b"content-type":
            ctype = v if ctype is None else ctype + b", " + v
            relayed.append((k, v))
        elif k == IHCL:
            ihcl_value = v if ihcl_value is None else ihcl_value + b", " + v
            relayed.append((k, v))
    if ihcl_value is None and ctype == b"application/json":  # the usual answer, as below
        if content is not None:
            _json_object(content, base_url)
        return relayed
    media = (ctype or b"").split(b";", 1)[0].strip().lower()
    is_json = media == b"application/json" or media.endswith(b"+json")
    if ihcl_value is not None and (is_json or media == b"application/octet-stream"):
        text = ihcl_value.strip()
        n = int(text) if text.isdigit() else 0
        if n == 0 or (length is not None and n > length):
            raise BadGateway(
                f"invalid {_what(base_url)}: Inference-Header-Content-Length {ihcl_value[:40]!r} is"
                f" not within the body of {length} bytes"
            )
        if content is not None:
            _json_object(memoryview(content)[:n], base_url)
    elif is_json:
        if content is not None:
            _json_object(content, base_url)
    else:
        raise BadGateway(
            f"invalid {_what(base_url)}: Content-Type {media[:80]!r} is neither JSON nor"
            " application/octet-stream with Inference-Header-Content-Length"
        )
    return relayed
