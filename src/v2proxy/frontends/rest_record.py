"""What the REST frontend tells the exchange envelope (:mod:`v2proxy.frontends.exchange`) of each
answered request (:meth:`RestFrontend.dispatch`): how its log lines name it, what the HTTP
layer's own errors are recorded as (:func:`transport_failure`, :func:`cut_short`), the wire
forms and sizes of its bodies, and the ``error`` label of an error answer that is no ProxyError.

The HTTP layer's errors: a client that went away (``ClientDisconnected``) is 499
``client_disconnected``, and one that leaves while an error answer is written leaves that error
recorded; a request body the server refused (``BodyError``) its status and ``invalid_request``.

The ``error`` label: the ProxyError's kind when the handler raised one; for an error answer that
is none (a handler's own 405 or 400 "not ready", or the backend's answer passed through) it is
taken from the status (:func:`answer_error`). The wire forms: ``json``, ``binary`` (an
Inference-Header-Content-Length) or ``raw`` (one of 0), for /infer only.
"""

from __future__ import annotations

from typing import Any, Final

from v2proxy.core.model import Buffer
from v2proxy.frontends.exchange import GONE_STATUS
from v2proxy.http.request import BodyError, ClientDisconnected, Request
from v2proxy.http.response import nbytes

REQUEST_ID: Final = b"x-request-id"
#: the cause recorded for a client that went away before its answer was complete
GONE: Final = "the client went away"
#: the ``error`` label of error answers that are no ProxyError
_STATUS_ERRORS: Final = {405: "method_not_allowed", 400: "not_ready"}
_IHCL: Final = b"inference-header-content-length"


def describe(request: Any) -> tuple[str | None, str, str]:
    """How the log lines name a request: its ``x-request-id``, method and path."""
    r: Request = request
    seen = r.state  # an /infer request's headers' one pass, when it was made
    rid = r.header(REQUEST_ID) if seen is None else seen[4]
    return None if rid is None else rid.decode("latin-1"), r.method, r.path


def transport_failure(exc: BaseException) -> tuple[int, str, str] | None:
    """What an error of the HTTP layer is recorded as (the envelope's ``classify``): (status,
    error kind, cause), or None for an exception that is none of its."""
    if isinstance(exc, ClientDisconnected):
        return GONE_STATUS, "client_disconnected", GONE
    if isinstance(exc, BodyError):
        return exc.status, "invalid_request", str(exc)
    return None


def cut_short(exc: BaseException) -> bool:
    """Whether ``exc``, interrupting an error answer, leaves that error recorded (the
    envelope's ``keeps``): the client went away while it was written."""
    return isinstance(exc, ClientDisconnected)


def answer_error(op: str, status: int) -> str:
    """The ``error`` label of an error answer that no ProxyError caused."""
    return "backend_error" if op == "passthrough" else _STATUS_ERRORS.get(status, "other")


def wire_in(ihcl: str | None) -> str:
    """The wire form of an /infer request, from its Inference-Header-Content-Length (found by
    the pass that filters its headers: :func:`~v2proxy.frontends.rest_infer.infer_headers`)."""
    if ihcl is None:
        return "json"
    return "raw" if ihcl.strip() == "0" else "binary"


def wire_out(headers: list[tuple[bytes, bytes]]) -> str:
    """The wire form of a 200 /infer answer, from its headers."""
    for name, _ in headers:
        if name == _IHCL:
            return "binary"
    return "json"


def size(body: Buffer | list[Buffer]) -> int:
    """The bytes of an answer's body."""
    if isinstance(body, list):
        return sum(nbytes(b) for b in body)
    return nbytes(body)
