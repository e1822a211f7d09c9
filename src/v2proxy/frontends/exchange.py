"""The exchange envelope of every frontend: what happens around each request (each message of a
gRPC stream), whatever its wire — admission, the in-flight gauge, timing, and the record of its
outcome (metrics, log lines, access log). The frontends keep only the translation of errors to
their wire (REST and MindIE bodies, gRPC status and trailers).

Contract:

- A frontend builds one :class:`Envelope` (per gRPC method: each names its requests' path): its
  :class:`~v2proxy.ops.recorders.FrontendRecorder`, the process's
  :class:`~v2proxy.core.admission.AdmissionGate`, how its log lines name a request
  (``describe(source)``: request id, method, path; called only when a line is written) and the
  cause it records for a client that went away.
- Per request (per message of a stream) it opens one exchange on arrival,
  ``t0 = envelope.open()`` (in flight +1; ``t0`` the start time), admits it by its operation
  before any work, ``held = envelope.admit(op)`` (a slot of the gate;
  :class:`~v2proxy.core.errors.Overloaded` beyond ``--max-concurrency``, which the frontend
  answers like any error), does its work, and ends it with exactly one
  ``envelope.done(t0, held, ...)`` carrying the outcome: the slot is given back, in flight -1,
  and the request is recorded (:meth:`FrontendRecorder.done
  <v2proxy.ops.recorders.FrontendRecorder.done>`; a WARNING line when it failed, status >= 400;
  the access line with ``--access-log``). ``held`` is what ``admit`` returned, False when it was
  refused (set before the call), None for an exchange never admitted (a stream's message); an
  admitted exchange (``held`` not None) that failed as ``overloaded`` is counted as rejected.
- The messages of a stream are not admitted one by one: the stream holds one slot for as long as
  it is open (:meth:`Envelope.hold`, :meth:`Envelope.release`; a refusal is counted as rejected
  there, and recorded by an exchange of its own).
- What an exception that ended the work is recorded as (:meth:`Envelope.failure`): a ProxyError
  its status, kind and message; a client that went away (the HTTP server's
  ``ClientDisconnected``, a cancelled task) 499 ``client_disconnected``, unless the task was
  cancelled by the shutdown (the gate is ``closing``: past ``--drain-timeout``), then 503
  ``shutdown``; a request body the HTTP
  layer refused its status and ``invalid_request``; anything else 500 ``internal``.

An exchange is no object: its state is the two values the frontend keeps (``t0``, ``held``), so
the REST hot path pays what it paid before the envelope (one ``perf_counter`` pair, one gauge
increment and decrement, the gate, one record) and allocates nothing for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter
from typing import Any

from v2proxy.core.admission import AdmissionGate
from v2proxy.core.errors import Overloaded, ProxyError
from v2proxy.http.request import BodyError, ClientDisconnected
from v2proxy.ops.metrics import Counter, error_kind
from v2proxy.ops.recorders import FrontendRecorder

#: the status recorded for a client that went away before its answer was complete
GONE_STATUS = 499
#: the status and cause recorded for a request the shutdown cut (--drain-timeout passed)
SHUTDOWN_STATUS = 503
SHUTDOWN_CAUSE = "v2proxy shut down before the answer was complete (--drain-timeout passed)"
#: how a frontend's log lines name a request: (request id or None, method, path)
Describe = Callable[[Any], tuple[str | None, str, str]]


class Envelope:
    """One frontend's side of the exchange envelope: its recorder, the process's admission gate,
    how its log lines name a request, and the cause recorded for a client that went away."""

    __slots__ = (
        "access_log",
        "admit",
        "describe",
        "gate",
        "gone",
        "inflight",
        "recorder",
        "rejected",
    )

    def __init__(
        self, recorder: FrontendRecorder, gate: AdmissionGate, describe: Describe, gone: str
    ) -> None:
        self.recorder = recorder
        self.gate = gate
        self.describe = describe
        self.gone = gone
        self.access_log = recorder.access_log
        inflight = recorder.inflight
        #: the in-flight gauge's cell, added to directly (a cell of its own, exported nowhere,
        #: with --metrics off)
        self.inflight: Counter = inflight if isinstance(inflight, Counter) else Counter()
        self.rejected = recorder.rejected
        #: admit(op) -> held: admission by operation (:meth:`AdmissionGate.enter
        #: <v2proxy.core.admission.AdmissionGate.enter>`): True when it took a slot, False when
        #: it needs none; raises Overloaded when every slot is taken
        self.admit: Callable[[str], bool] = gate.enter

    def open(self) -> float:
        """A request (a stream's message) arrives: in flight +1; returns its start time."""
        self.inflight.value += 1
        return perf_counter()

    def undo(self, held: bool) -> None:
        """An exchange opened (and admitted: ``held``) is given up before any work, to be
        served elsewhere (its own exchange, recorded there)."""
        if held:
            self.gate.leave()
        self.inflight.value -= 1

    def done(
        self,
        t0: float,
        held: bool | None,
        op: str,
        model: str,
        status: int,
        error: str | None,
        cause: str | None,
        wire_in: str,
        n_in: int,
        wire_out: str,
        n_out: int,
        source: Any,
        shown: int | str,
    ) -> None:
        """The exchange opened at ``t0`` is over (``held``: see the module's contract):
        ``status`` (HTTP, or what a gRPC code stands for; >= 400 is a failure, whose ``error``
        kind and ``cause`` are recorded; otherwise both are ignored), ``n_in``/``n_out`` bytes
        in the ``wire_in``/``wire_out`` forms, ``model`` and ``op`` its labels; ``source`` what
        ``describe`` names the request from, ``shown`` the status its log lines print (an HTTP
        status, a gRPC code's name)."""
        if held:
            self.gate.leave()
        self.inflight.value -= 1
        duration = perf_counter() - t0
        failed = status >= 400
        if not failed:
            error = None
        elif error == "overloaded" and held is not None:
            self.rejected.inc()
        rec = self.recorder
        rec.done(duration, op, model, status, error, wire_in, n_in, wire_out, n_out)
        if failed or self.access_log:
            request_id, method, path = self.describe(source)
            rec.log(failed, request_id, model, method, path, shown, duration, n_in, n_out, cause)

    def hold(self, op: str) -> bool:
        """A stream's admission: one slot of the gate for as long as it is open (True: taken,
        give it back with :meth:`release`). Raises Overloaded, counted as rejected."""
        try:
            return self.gate.enter(op)
        except Overloaded:
            self.rejected.inc()
            raise

    def release(self, held: bool) -> None:
        """The stream that :meth:`hold` admitted is over."""
        if held:
            self.gate.leave()

    def failure(self, exc: BaseException) -> tuple[int, str, str]:
        """What a request that ended by raising ``exc`` is recorded as: (status, error kind,
        cause)."""
        if isinstance(exc, ProxyError):
            return exc.http_status, error_kind(exc), exc.message
        if isinstance(exc, asyncio.CancelledError) and self.gate.closing:
            return SHUTDOWN_STATUS, "shutdown", SHUTDOWN_CAUSE
        if isinstance(exc, ClientDisconnected | asyncio.CancelledError):
            return GONE_STATUS, "client_disconnected", self.gone
        if isinstance(exc, BodyError):
            return exc.status, "invalid_request", str(exc)
        return 500, "internal", f"internal error: {type(exc).__name__}"
