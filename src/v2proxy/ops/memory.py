"""``--reuse-large-buffers``: large buffers' memory kept for the next request (glibc only).

glibc maps each large block afresh and unmaps it when freed, so every large copy pays a page fault
per 4 KiB. :func:`reuse_large_buffers` turns malloc's mmap off and raises its trim threshold so
that the heap keeps freed memory; :meth:`Releaser.tick` gives it back (``malloc_trim``) once no
request arrived since the tick before.
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
    """Keep large buffers' memory for reuse; ``arrived``: the count of requests so far, which
    :meth:`Releaser.tick` watches. None where the C library is not glibc (nothing changed)."""
    libc = _glibc() if libc is None else libc
    if libc is None:
        log.warning("--reuse-large-buffers: the C library is not glibc; nothing changed")
        return None
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)):
        log.warning("--reuse-large-buffers: mallopt refused; nothing changed")
        return None
    return Releaser(libc, arrived)
