"""What the REST frontend tells the exchange envelope (:mod:`v2proxy.frontends.exchange`) of each
answered request (:meth:`RestFrontend.dispatch`): how its log lines name it, the wire forms and
sizes of its bodies, and the ``error`` label of an error answer that is no ProxyError.

The ``error`` label: the ProxyError's kind when the handler raised one; for an error answer that
is none (a handler's own 405 or 400 "not ready", or the backend's answer passed through) it is
taken from the status (:func:`answer_error`). The wire forms: ``json``, ``binary`` (an
Inference-Header-Content-Length) or ``raw`` (one of 0), for /infer only.
"""

from __future__ import annotations

from typing import Any

from v2proxy.core.model import Buffer
from v2proxy.http.request import HttpRequest
from v2proxy.http.response import nbytes

REQUEST_ID = b"x-request-id"
#: the cause recorded for a client that went away before its answer was complete
GONE = "the client went away"
#: the ``error`` label of error answers that are no ProxyError
_STATUS_ERRORS = {405: "method_not_allowed", 400: "not_ready"}
_IHCL = b"inference-header-content-length"


def describe(request: Any) -> tuple[str | None, str, str]:
    """How the log lines name a request: its ``x-request-id``, method and path."""
    r: HttpRequest = request
    rid = r.header(REQUEST_ID)
    return None if rid is None else rid.decode("latin-1"), r.method, r.path


def answer_error(op: str, status: int) -> str:
    """The ``error`` label of an error answer that no ProxyError caused."""
    return "backend_error" if op == "passthrough" else _STATUS_ERRORS.get(status, "other")


def wire_in(request: HttpRequest) -> str:
    """The wire form of an /infer request, from its headers."""
    ihcl = request.header(_IHCL)
    if ihcl is None:
        return "json"
    return "raw" if ihcl.strip() == b"0" else "binary"


def infer_facts(request: HttpRequest) -> tuple[bytes | None, str]:
    """The ``x-request-id`` of an /infer request (its first value) and its wire form
    (:func:`wire_in`), in one pass over its headers."""
    rid = ihcl = None
    for name, value in request.headers:
        if name == REQUEST_ID:
            if rid is None:
                rid = value
        elif name == _IHCL and ihcl is None:
            ihcl = value
    if ihcl is None:
        return rid, "json"
    return rid, "raw" if ihcl.strip() == b"0" else "binary"


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
