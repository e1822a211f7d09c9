"""v2proxy's own POSIX shared-memory regions, pooled, for staging tensors in a backend's shared
memory (``--backend-shm``; :mod:`v2proxy.backends.staging` registers them with the backend)."""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import secrets

import posix_ipc

from v2proxy.core.errors import ProxyError
from v2proxy.core.model import Buffer
from v2proxy.shm import guarded

#: every staging object's name starts with it (reserved: clients may not register such keys)
STAGING_PREFIX = "v2proxy-"
#: the smallest region created (and the alignment of tensors inside one)
MIN_REGION = 64 * 1024
ALIGN = 64


def region_size(need: int) -> int:
    """The size of a region created for ``need`` bytes: a power of two, at least MIN_REGION."""
    size = MIN_REGION
    while size < need:
        size *= 2
    return size


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _truncated(name: str) -> ProxyError:
    return ProxyError(f"v2proxy's staging region '{name}' was truncated by another process")


class StagingRegion:
    """One pooled region: ``name`` (also the backend's region name), ``key`` (its POSIX name)."""

    __slots__ = ("_map", "_view", "key", "name", "registered", "size")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.key = "/" + name
        self.size = size
        #: whether the backend has it registered (set by the caller)
        self.registered = False
        mem = posix_ipc.SharedMemory(self.key, flags=posix_ipc.O_CREX, mode=0o600)
        try:
            os.ftruncate(mem.fd, size)
            os.posix_fallocate(mem.fd, 0, size)
            self._map: mmap.mmap | None = mmap.mmap(mem.fd, size)
        except BaseException:
            with contextlib.suppress(posix_ipc.Error):
                mem.unlink()
            raise
        finally:
            mem.close_fd()
        self._view = memoryview(self._map)

    def write(self, offset: int, data: Buffer) -> None:
        """Copy ``data`` in (guarded: a staging object truncated by someone else is an error)."""
        if not guarded.copy(self._view, memoryview(data).cast("B"), offset):
            raise _truncated(self.name)

    def view(self, offset: int, size: int) -> memoryview:
        """``size`` bytes at ``offset``, not copied (valid while the region is lent)."""
        return self._view[offset : offset + size]

    def read(self, offset: int, size: int) -> memoryview:
        """A copy of ``size`` bytes at ``offset`` (the region goes back to the pool after)."""
        data = guarded.read(self._view[offset : offset + size])
        if data is None:
            raise _truncated(self.name)
        return data

    def close(self) -> None:
        """Unlink the object and unmap it."""
        with contextlib.suppress(posix_ipc.Error):
            posix_ipc.unlink_shared_memory(self.key)
        mapping, self._map = self._map, None
        if mapping is not None:
            with contextlib.suppress(BufferError):
                self._view.release()
                mapping.close()


class StagingPool:
    """Regions lent to one request at a time."""

    def __init__(self, max_bytes: int, prefix: str | None = None) -> None:
        self.max_bytes = max_bytes
        self.prefix = prefix or f"{STAGING_PREFIX}{secrets.token_hex(16)}"
        self._numbers = itertools.count()
        self._free: list[StagingRegion] = []
        self._lent: set[StagingRegion] = set()
        self.total = 0

    def acquire(self, need: int) -> tuple[StagingRegion | None, list[StagingRegion]]:
        """A region of at least ``need`` bytes (None when the pool cannot hold one) and the free
        regions dropped to make room (unlinked already: unregister them from the backend)."""
        fits = [r for r in self._free if r.size >= need]
        if fits:
            region = min(fits, key=lambda r: r.size)
            self._free.remove(region)
            self._lent.add(region)
            return region, []
        size = region_size(need)
        dropped: list[StagingRegion] = []
        self._free.sort(key=lambda r: r.size)
        while self.total + size > self.max_bytes and self._free:
            dropped.append(self._drop(self._free.pop()))
        if self.total + size > self.max_bytes:
            return None, dropped
        region = StagingRegion(f"{self.prefix}-{next(self._numbers)}", size)
        self.total += size
        self._lent.add(region)
        return region, dropped

    def _drop(self, region: StagingRegion) -> StagingRegion:
        self.total -= region.size
        region.close()
        return region

    def release(self, region: StagingRegion, keep: bool = True) -> None:
        """Give a region back (``keep`` False: it is unusable, unlinked now)."""
        self._lent.discard(region)
        if keep:
            self._free.append(region)
        else:
            self._drop(region)

    def close(self) -> list[StagingRegion]:
        """Unlink every region (those still lent too); the registered ones are handed back."""
        regions = [*self._free, *self._lent]
        self._free.clear()
        self._lent.clear()
        for r in regions:
            self._drop(r)
        return [r for r in regions if r.registered]
