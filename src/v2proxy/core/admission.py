"""The admission gate: at most ``--max-concurrency`` requests in progress per process, the
rest refused at once (Envoy's overload manager, uvicorn's ``--limit-concurrency``).

A request holds its slot from its head until its answer is complete (a stream: while it is open).
Health and metadata are never refused or counted, so that an overloaded pod stays live and ready.
A refusal is :class:`~v2proxy.core.errors.Overloaded`; ``limit`` 0 means no limit."""

from __future__ import annotations

from typing import Final

from v2proxy.core.errors import Overloaded

#: operations (the ``operation`` label of the frontends' metrics) that are never refused
EXEMPT: Final = frozenset({"health", "metadata"})
#: seconds a refused client is asked to wait (REST ``Retry-After``, gRPC retry pushback)
RETRY_AFTER_S: Final = 1


class AdmissionGate:
    """Counts the requests in progress and refuses those beyond ``limit`` (0: no limit)."""

    __slots__ = ("arrived", "closing", "in_use", "limit", "refused")

    def __init__(self, limit: int = 0) -> None:
        if limit < 0:
            raise ValueError("the concurrency limit must be >= 0 (0: no limit)")
        self.limit = limit
        #: requests holding a slot now
        self.in_use = 0
        #: requests refused since the start
        self.refused = 0
        #: requests of a counted operation since the start, admitted or not (what an idle
        #: process is told by: ops/memory.py)
        self.arrived = 0
        #: the process is shutting down: a request still in progress once --drain-timeout has
        #: passed is cut (the frontends' records say so)
        self.closing = False

    def enter(self, operation: str) -> bool:
        """Admit a request of ``operation``: True when it took a slot (the caller must :meth:`leave`
        once it is answered), False when it needs none (exempt operations, no limit);
        :class:`Overloaded` when every slot is taken."""
        if operation in EXEMPT:
            return False
        self.arrived += 1
        if self.limit == 0:
            return False
        if self.in_use >= self.limit:
            self.refused += 1
            raise Overloaded(
                f"too many requests in progress: v2proxy serves at most {self.limit} at once"
                f" (--max-concurrency); retry after {RETRY_AFTER_S} s"
            )
        self.in_use += 1
        return True

    def leave(self) -> None:
        """A request that took a slot is answered (or abandoned)."""
        if self.in_use <= 0:
            raise RuntimeError("AdmissionGate.leave without a matching enter")
        self.in_use -= 1
