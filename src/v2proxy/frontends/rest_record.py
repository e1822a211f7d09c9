"""What the REST frontend records of each answered request (:meth:`RestFrontend.dispatch`):
the metrics of :mod:`v2proxy.ops.metrics` through a
:class:`~v2proxy.ops.recorders.FrontendRecorder`, a WARNING line per failed request, and the access
line with ``--access-log``.

The ``error`` label: the ProxyError's kind when the handler raised one; for an error answer that
is none (a handler's own 405 or 400 "not ready", or the backend's answer passed through) it is
taken from the status. The wire forms: ``json``, ``binary`` (an
Inference-Header-Content-Length) or ``raw`` (one of 0), for /infer only.
"""

from __future__ import annotations

from time import perf_counter

from v2proxy.core.model import Buffer
from v2proxy.http.request import HttpRequest
from v2proxy.http.response import nbytes
from v2proxy.ops.recorders import FrontendRecorder

REQUEST_ID = b"x-request-id"
#: the ``error`` label of error answers that are no ProxyError
_STATUS_ERRORS = {405: "method_not_allowed", 400: "not_ready"}
_IHCL = b"inference-header-content-length"


def record(
    rec: FrontendRecorder,
    request: HttpRequest,
    t0: float,
    op: str,
    model: str,
    status: int,
    error: str | None,
    cause: str,
    n_in: int,
    wire_out: str,
    n_out: int,
) -> None:
    """One answered request (``t0``: its ``perf_counter()`` start; ``n_in``/``n_out``: body
    bytes in and out)."""
    duration = perf_counter() - t0
    if status < 400:
        error = None
    elif not cause:  # an answer of the handler's own (405, not ready) or the backend's
        error = "backend_error" if op == "passthrough" else _STATUS_ERRORS.get(status, "other")
    wire_in = _wire_in(request) if op == "infer" else "json"
    rec.done(duration, op, model, status, error, wire_in, n_in, wire_out, n_out)
    if status >= 400 or rec.access_log:
        rid = request.header(REQUEST_ID)
        rec.log(
            status >= 400,
            None if rid is None else rid.decode("latin-1"),
            model,
            request.method,
            request.path,
            status,
            duration,
            n_in,
            n_out,
            cause,
        )


def _wire_in(request: HttpRequest) -> str:
    ihcl = request.header(_IHCL)
    if ihcl is None:
        return "json"
    return "raw" if ihcl.strip() == b"0" else "binary"


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
