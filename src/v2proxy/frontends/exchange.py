"""The exchange envelope of every frontend: what happens around each request (each message of a
gRPC stream), whatever its wire: admission, the in-flight gauge, timing, and the record of its
outcome. The frontends keep only the translation of errors to their wire.

Per request: ``exchange = envelope.open(op, source)``, ``admit()`` before any work, what it
learns set on the exchange as it goes, and exactly one ``end()`` (or ``undo()`` to give it up
unrecorded); ``with envelope.open(...)`` fails it on an exception. A stream holds one slot while
open (:meth:`Envelope.hold`); its messages are not admitted one by one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

from mypy_extensions import mypyc_attr

from v2proxy.core.admission import AdmissionGate
from v2proxy.core.errors import Overloaded, ProxyError
from v2proxy.ops.metrics import Counter, error_kind
from v2proxy.ops.recorders import FrontendRecorder

#: (Final, as every name compiled code reads per request: a C static, not a look-up in the
#: module's dict)
perf_counter: Final = time.perf_counter

GONE_STATUS: Final = 499
SHUTDOWN_STATUS: Final = 503
SHUTDOWN_CAUSE: Final = "v2proxy shut down before the answer was complete (--drain-timeout passed)"
#: how a frontend's log lines name a request: (request id or None, method, path)
Describe = Callable[[Any], tuple[str | None, str, str]]
#: a transport's own errors as (status, error kind, cause); None for any other exception
Classify = Callable[[BaseException], tuple[int, str, str] | None]
#: whether an exception that interrupts a failed exchange leaves its failure recorded
Keeps = Callable[[BaseException], bool]
#: what a failed exchange's log lines show as its status (None: the status itself)
Show = Callable[[BaseException, int], int | str | None]


def _unclassified(exc: BaseException) -> None:
    return None


def _replaced(exc: BaseException) -> bool:
    return False


def _status_shown(exc: BaseException, status: int) -> None:
    return None


@mypyc_attr(allow_interpreted_subclasses=True)  # (grpc_call.CallEnvelope)
class Envelope:
    """One frontend's side of the exchange envelope: its recorder, the admission gate, and what
    its transport adds (``classify``, ``keeps``, ``show``)."""

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
        self.wire = wire
        self.classify = classify
        self.keeps = keeps
        self.show = show
        self.ok_shown = ok_shown
        self.access_log = recorder.access_log
        inflight = recorder.inflight
        #: the in-flight gauge's cell, added to directly (a private one with --metrics off)
        self.inflight: Counter = inflight if isinstance(inflight, Counter) else Counter()
        self.rejected = recorder.rejected
        #: enter(op) -> True when it took a slot, False when it needs none; raises Overloaded
        self.enter: Callable[[str], bool] = gate.enter

    def open(self, op: str, source: Any) -> Exchange:
        """The exchange of an arriving request, in flight but not yet admitted; ``source`` is
        what :attr:`describe` names it from."""
        return Exchange(self, op, source)

    def hold(self, op: str) -> bool:
        """A stream's admission: one slot for as long as it is open (True: taken, give it back
        with :meth:`release`). Raises Overloaded, counted as rejected."""
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
        """(status, error kind, cause) for a request ended by ``exc``: a cancelled task is 499,
        or 503 past ``--drain-timeout``; an unknown exception 500."""
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
    """One request (one message of a stream) from :meth:`Envelope.open` to its one :meth:`end`;
    the frontend sets :attr:`model`, :attr:`status`, wire forms and sizes as it learns them."""

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
        self.status = 500
        self.error: str | None = "internal"
        #: set by :meth:`fail` (None: it did not fail)
        self.cause: str | None = None
        self.shown: int | str | None
        self.wire_in = self.wire_out = envelope.wire
        self.n_in = self.n_out = 0
        self.t0 = perf_counter()

    def admit(self) -> None:
        """Admission before any work: raises Overloaded when every slot is taken (counted as
        rejected when the exchange ends)."""
        try:
            self.held = self.envelope.enter(self.op)
        except Overloaded:
            self.held = False  # refused: counted as rejected once its failure is recorded
            raise

    def fail(self, exc: BaseException) -> None:
        """Records ``exc`` as the exchange's failure (:meth:`Envelope.failure`)."""
        env = self.envelope
        status, self.error, self.cause = env.failure(exc)
        self.status = status
        self.shown = env.show(exc, status)

    def undo(self) -> None:
        """Gives the exchange up before any work (served in an exchange of its own elsewhere):
        its slot back, no longer in flight, nothing recorded."""
        env = self.envelope
        if self.held:
            env.gate.leave()
        env.inflight.value -= 1

    def end(self) -> None:
        """Ends the exchange (exactly once): its slot back, no longer in flight, recorded in the
        metrics, a WARNING line when it failed and the access line with ``--access-log``."""
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
        """Ends the exchange, failed by the exception unless it had failed already and the
        envelope keeps that failure (a failure's answer cut short)."""
        if exc is not None and not (self.cause is not None and self.envelope.keeps(exc)):
            self.fail(exc)
        self.end()
