"""Copies to and from memory that a client can take away under the proxy.

A client may truncate its shared-memory object at any moment, and a plain copy past its new end
raises SIGBUS and kills the process: every access to a client's mapping goes through :func:`copy`
(a ``memcpy`` in ``v2proxy.shm._guard`` whose SIGBUS handler turns the fault into False) or
:func:`read` (a private copy, or None on a fault)."""

from __future__ import annotations

import numpy as np

from v2proxy.core.model import Buffer
from v2proxy.shm import _guard


def copy(dst: Buffer, src: Buffer, offset: int = 0) -> bool:
    """Copy ``src`` into ``dst`` from ``offset``; False when memory faulted on the way."""
    return bool(_guard.copy(dst, src, offset))


def read(src: Buffer) -> memoryview | None:
    """A private copy of ``src`` (bytes, format ``B``), or None when memory faulted."""
    n = memoryview(src).nbytes
    out = np.empty(n, dtype=np.uint8).data  # not zero-filled; numpy asks for huge pages
    if n and not _guard.copy(out, src, 0):
        return None
    return out
