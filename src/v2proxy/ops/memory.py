"""``--reuse-large-buffers``: large buffers' memory kept for the next request (glibc only).

Why: glibc's malloc hands every block over its mmap threshold (128 KiB, rising with use to at
most 32 MiB) out as a fresh mapping and unmaps it when it is freed, so each copy of a large
message touches new pages and pays a page fault per 4 KiB. A 16 M FP32 (64 MiB) gRPC call
through the proxy makes ≈ 250k of them, ≈ 0.5 s of system time: most of the proxy's CPU on that
path (docs/performance.md). Those copies are grpcio's and protobuf's as much as v2proxy's, so
the remedy is the allocator's.

Contract:

- :func:`reuse_large_buffers` (called once by ``serve`` in each worker process when the setting
  is on) turns malloc's mmap off (``M_MMAP_MAX`` 0: large blocks come from the heap, whose freed
  memory malloc reuses) and raises the trim threshold (``M_TRIM_THRESHOLD``), so the heap keeps
  freed memory between requests. It returns a :class:`Releaser`, or None where the C library is
  not glibc (nothing is changed there; the setting then does nothing, said once in the log).
- The memory is given back: :meth:`Releaser.tick` (every :data:`RELEASE_EVERY_S` seconds, from
  the event loop) calls ``malloc_trim(0)``, which returns the heap's free pages to the system,
  when no request has arrived since the tick before (the admission gate's count; health and
  metadata probes do not count) — so a run of large requests keeps its buffers, and an idle
  proxy gives them back within two ticks.
- On by default; off, glibc's own behaviour is untouched. What it costs: while requests keep
  coming, the heap keeps the buffers they needed at once, and the peak is somewhat higher
  (four 64 MiB gRPC calls: RSS 762 MiB right after against 222, peak 761 against 670; 202
  against 222 once given back).
"""

from __future__ import annotations

import ctypes
import logging
import platform
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: free memory at the heap's top kept rather than trimmed on each free
KEEP_BYTES = 1 << 30
#: how often an idle proxy gives freed memory back
RELEASE_EVERY_S = 5.0


def _glibc() -> Any | None:
    """The process's C library when it is glibc (mallopt and malloc_trim found), else None."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc


class Releaser:
    """Gives the heap's free memory back once the proxy has been idle for a tick."""

    __slots__ = ("_arrived", "_libc", "_seen", "trims")

    def __init__(self, libc: Any, arrived: Callable[[], int]) -> None:
        self._libc = libc
        #: arrived() -> how many requests have arrived so far (any monotonic count)
        self._arrived = arrived
        self._seen = arrived()
        self.trims = 0

    def tick(self) -> None:
        now = self._arrived()
        if now == self._seen:
            self._libc.malloc_trim(0)
            self.trims += 1
        self._seen = now


def reuse_large_buffers(arrived: Callable[[], int], libc: Any | None = None) -> Releaser | None:
    """Keep large buffers' memory for reuse (see the module's contract); ``arrived``: the
    count of requests so far, which :meth:`Releaser.tick` watches."""
    libc = _glibc() if libc is None else libc
    if libc is None:
        log.warning("--reuse-large-buffers: the C library is not glibc; nothing changed")
        return None
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)):
        log.warning("--reuse-large-buffers: mallopt refused; nothing changed")
        return None
    return Releaser(libc, arrived)
