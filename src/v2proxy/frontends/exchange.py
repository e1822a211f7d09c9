"""The exchange envelope of every frontend: what happens around each request (each message of a
gRPC stream), whatever its wire — admission, the in-flight gauge, timing, and the record of its
outcome (metrics, log lines, access log). The frontends keep only the translation of errors to
their wire.

Contract:

- A frontend builds one :class:`Envelope` with its recorder, the process's admission gate, how
  its log lines name a request (``describe``), and what its transport adds (``classify`` its
  own errors, ``keeps`` a failure already recorded, ``show`` a status in log lines).
- Per request: ``exchange = envelope.open(op, source)`` on arrival (in flight +1), ``admit()``
  before any work (:class:`~v2proxy.core.errors.Overloaded` past ``--max-concurrency``), what
  it learns set on the exchange as it goes (``model``, ``status``, wire forms, sizes;
  ``fail(exc)``), and exactly one ``end()``: the slot back, in flight -1, one record
  (:meth:`FrontendRecorder.done <v2proxy.ops.recorders.FrontendRecorder.done>`, a WARNING line
  when it failed, the access line with ``--access-log``). ``undo()`` gives an exchange up
  before any work, recording nothing.
- Coroutines use ``with envelope.open(op, source) as exchange:`` (an exception leaving the block
  fails it); the REST quick lane calls ``end()`` from the callback that finishes its answer.
- A stream holds one slot while it is open (:meth:`Envelope.hold`, :meth:`Envelope.release`);
  its messages are not admitted one by one.
- :meth:`Envelope.failure` says what an exception is recorded as (a ProxyError its status and
  kind; a cancelled task 499, or 503 past ``--drain-timeout``; a transport's own error what
  ``classify`` says; anything else 500).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter
from types import TracebackType
from typing import Any

from v2proxy.core.admission import AdmissionGate
from v2proxy.core.errors import Overloaded, ProxyError
from v2proxy.ops.metrics import Counter, error_kind
from v2proxy.ops.recorders import FrontendRecorder

#: the status recorded for a client that went away before its answer was complete
GONE_STATUS = 499
#: the status and cause recorded for a request the shutdown cut (--drain-timeout passed)
SHUTDOWN_STATUS = 503
SHUTDOWN_CAUSE = "v2proxy shut down before the answer was complete (--drain-timeout passed)"
#: how a frontend's log lines name a request: (request id or None, method, path)
Describe = Callable[[Any], tuple[str | None, str, str]]
#: what a frontend's transport errors are recorded as: (status, error kind, cause), or None for
#: an exception that is none of its transport's
Classify = Callable[[BaseException], tuple[int, str, str] | None]
#: whether an exception that interrupts a failed exchange leaves its failure recorded
Keeps = Callable[[BaseException], bool]
#: what a failed exchange's log lines show as its status, given its exception and status (None:
#: the status itself)
Show = Callable[[BaseException, int], int | str | None]


def _unclassified(exc: BaseException) -> None:
    return None


def _replaced(exc: BaseException) -> bool:
    return False


def _status_shown(exc: BaseException, status: int) -> None:
    return None


class Envelope:
    """One frontend's side of the exchange envelope: its recorder, the process's admission gate,
    how its log lines name a request, the cause recorded for a client that went away, and what
    its transport adds (see the module's docstring)."""

    __slots__ = (
        "access_log",
        "classify",
        "describe",
        "enter",
        "gate",
        "gone",
        "inflight",
        "keeps",
        "ok_shown",
        "recorder",
        "rejected",
        "show",
        "wire",
    )

    def __init__(
        self,
        recorder: FrontendRecorder,
        gate: AdmissionGate,
        describe: Describe,
        gone: str,
        *,
        wire: str = "json",
        classify: Classify = _unclassified,
        keeps: Keeps = _replaced,
        show: Show = _status_shown,
        ok_shown: int | str | None = None,
    ) -> None:
        self.recorder = recorder
        self.gate = gate
        self.describe = describe
        self.gone = gone
        #: the wire form an exchange's bodies are recorded in until the frontend says otherwise
        self.wire = wire
        self.classify = classify
        self.keeps = keeps
        self.show = show
        #: what the log lines show as the status of an exchange that did not fail (None: the
        #: status itself)
        self.ok_shown = ok_shown
        self.access_log = recorder.access_log
        inflight = recorder.inflight
        #: the in-flight gauge's cell, added to directly (a cell of its own, exported nowhere,
        #: with --metrics off)
        self.inflight: Counter = inflight if isinstance(inflight, Counter) else Counter()
        self.rejected = recorder.rejected
        #: enter(op) -> held: admission by operation (:meth:`AdmissionGate.enter
        #: <v2proxy.core.admission.AdmissionGate.enter>`): True when it took a slot, False when
        #: it needs none; raises Overloaded when every slot is taken
        self.enter: Callable[[str], bool] = gate.enter

    def open(self, op: str, source: Any) -> Exchange:
        """A request (a stream's message) of operation ``op`` arrives: its exchange, in flight,
        not yet admitted; ``source`` is what :attr:`describe` names it from."""
        return Exchange(self, op, source)

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
        if isinstance(exc, asyncio.CancelledError):
            if self.gate.closing:
                return SHUTDOWN_STATUS, "shutdown", SHUTDOWN_CAUSE
            return GONE_STATUS, "client_disconnected", self.gone
        known = self.classify(exc)
        if known is not None:
            return known
        return 500, "internal", f"internal error: {type(exc).__name__}"


class Exchange:
    """One request (one message of a stream) inside its envelope, from :meth:`Envelope.open` to
    its one :meth:`end` (see the module's docstring). The frontend sets what it learns as it
    goes: :attr:`model`, :attr:`status`, the bodies' wire forms and sizes."""

    __slots__ = (
        "cause",
        "envelope",
        "error",
        "held",
        "model",
        "n_in",
        "n_out",
        "op",
        "shown",
        "source",
        "status",
        "t0",
        "wire_in",
        "wire_out",
    )

    def __init__(self, envelope: Envelope, op: str, source: Any) -> None:
        envelope.inflight.value += 1
        self.envelope = envelope
        self.op = op
        self.source = source
        #: None: never admitted (a stream's message); False: admitted without a slot, or
        #: refused; True: holds a slot of the gate
        self.held: bool | None = None
        self.model = ""
        #: an exchange that ends without saying how is an internal error
        self.status = 500
        self.error: str | None = "internal"
        #: set by :meth:`fail` (None: it did not fail)
        self.cause: str | None = None
        #: what the log lines show as the status of a failure (set by :meth:`fail`)
        self.shown: int | str | None
        self.wire_in = self.wire_out = envelope.wire
        self.n_in = self.n_out = 0
        self.t0 = perf_counter()

    def admit(self) -> None:
        """Admission by the exchange's operation, before any work: raises Overloaded when every
        slot of the gate is taken (answered like any error, and counted as rejected when the
        exchange ends failed ``overloaded``)."""
        try:
            self.held = self.envelope.enter(self.op)
        except Overloaded:
            self.held = False  # refused: counted as rejected once its failure is recorded
            raise

    def fail(self, exc: BaseException) -> None:
        """The exchange failed with ``exc`` (:meth:`Envelope.failure`): its status, error kind
        and cause, and the status its log lines show."""
        env = self.envelope
        status, self.error, self.cause = env.failure(exc)
        self.status = status
        self.shown = env.show(exc, status)

    def undo(self) -> None:
        """The exchange is given up before any work, to be served elsewhere (in an exchange of
        its own, recorded there): its slot given back, no longer in flight, nothing recorded."""
        env = self.envelope
        if self.held:
            env.gate.leave()
        env.inflight.value -= 1

    def end(self) -> None:
        """The exchange is over (exactly once): its slot given back, no longer in flight, and
        recorded (the metrics; a WARNING line when it failed, status >= 400; the access line
        with ``--access-log``)."""
        env = self.envelope
        held = self.held
        if held:
            env.gate.leave()
        env.inflight.value -= 1
        duration = perf_counter() - self.t0
        status = self.status
        failed = status >= 400
        error = self.error
        if not failed:
            error = None
        elif error == "overloaded" and held is not None:
            env.rejected.inc()
        rec = env.recorder
        model, n_in, n_out = self.model, self.n_in, self.n_out
        rec.done(duration, self.op, model, status, error, self.wire_in, n_in, self.wire_out, n_out)
        if failed or env.access_log:
            request_id, method, path = env.describe(self.source)
            shown = env.ok_shown if self.cause is None else self.shown
            if shown is None:
                shown = status
            rec.log(
                failed, request_id, model, method, path, shown, duration, n_in, n_out, self.cause
            )

    def __enter__(self) -> Exchange:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Ends the exchange; one that an exception ended is recorded as failed by it, unless it
        had failed already and the envelope keeps that failure (a failure's answer cut short)."""
        if exc is not None and not (self.cause is not None and self.envelope.keeps(exc)):
            self.fail(exc)
        self.end()
