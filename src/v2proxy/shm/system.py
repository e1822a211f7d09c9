"""POSIX system shared memory: a client's object opened with ``posix_ipc`` and mapped with
``mmap`` (reference §4.1).

Contract:

- :func:`normal_key` checks a key before anything is opened. Leading slashes are dropped, as
  glibc's ``shm_open`` does (``/k``, ``//k`` and ``k`` name ``/dev/shm/k``); what remains must
  be a plain file name: not empty (Triton's ``invalid shm key`` for ``/`` and ``///``), no other
  ``/``, not ``.`` or ``..``, no NUL, at most 255 bytes; nor may it start with Triton's reserved
  ``triton_python_backend_shm_region_``.
- :func:`open_region` maps ``byte_size`` bytes from ``offset`` after checking them against the
  object's size (Triton's ``invalid args``); an offset need not be page-aligned (the mapping
  starts at the page below it). ``byte_size`` 0 is refused with Triton's text.
- :class:`SystemRegion` keeps the object's descriptor: :meth:`SystemRegion.check` ``fstat``s it
  before each use, so a client that truncated its object gets an error rather than the proxy a
  SIGBUS. An object unlinked after registration stays mapped and keeps working (the client still
  has it). The proxy never unlinks a client's object.
- :meth:`SystemRegion.close` releases the mapping; while views exported to a request still exist
  the memory stays mapped until the last of them goes (never unmapped under a request).
- Messages never contain the key (Triton PR 8269).

Not the stdlib's ``multiprocessing.shared_memory``: before Python 3.13 its resource tracker may
unlink segments the client still uses (reference/ecosystem.md).
"""

from __future__ import annotations

import contextlib
import mmap
import os

import posix_ipc

from v2proxy.errors import InvalidRequest, ProxyError
from v2proxy.model import Buffer

RESERVED_PREFIX = "triton_python_backend_shm_region_"
_NAME_MAX = 255


def normal_key(name: str, key: str) -> str:
    """The POSIX name (``/`` + file name) of a register request's key, or InvalidRequest."""
    base = key.lstrip("/")
    if (
        not base
        or "/" in base
        or base in (".", "..")
        or "\x00" in base
        or len(base.encode("utf-8", "surrogatepass")) > _NAME_MAX
    ):
        raise InvalidRequest(f"cannot register shared memory region '{name}' - invalid shm key")
    if base.startswith(RESERVED_PREFIX):
        raise InvalidRequest(
            f"cannot register shared memory region '{name}' as the key contains the reserved"
            f" prefix '{RESERVED_PREFIX}'"
        )
    return "/" + base


def _invalid_args(name: str) -> InvalidRequest:
    return InvalidRequest(f"failed to register shared memory region '{name}': invalid args")


class SystemRegion:
    """One registered system region: ``byte_size`` bytes at ``offset`` of the object ``key``."""

    __slots__ = ("_fd", "_map", "_view", "byte_size", "key", "name", "offset")

    def __init__(
        self, name: str, key: str, offset: int, byte_size: int, fd: int, mapping: mmap.mmap
    ) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._fd = fd
        self._map: mmap.mmap | None = mapping
        delta = offset % mmap.ALLOCATIONGRANULARITY
        self._view = memoryview(mapping)[delta : delta + byte_size]

    def check(self) -> None:
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            size = -1
        if size < self.offset + self.byte_size:
            raise InvalidRequest(
                f"shared memory region '{self.name}' is no longer usable: its object is smaller"
                " than the registered offset + byte_size (it was truncated after registration)"
            )

    def view(self, offset: int, size: int) -> memoryview:
        return self._view[offset : offset + size]

    def write(self, offset: int, data: Buffer) -> None:
        src = memoryview(data).cast("B")
        self._view[offset : offset + src.nbytes] = src

    def close(self) -> None:
        """Unmap (at once, or when the last view a request still holds goes) and close."""
        mapping, self._map = self._map, None
        if mapping is None:
            return
        with contextlib.suppress(BufferError):
            self._view.release()
        with contextlib.suppress(BufferError):
            mapping.close()  # else views still exist: unmapped when the last of them goes
        with contextlib.suppress(OSError):
            os.close(self._fd)


def open_region(name: str, key: str, offset: int, byte_size: int) -> SystemRegion:
    """Open and map a client's object (``key`` as the client gave it; InvalidRequest for a bad
    key or one that names no object, ProxyError 500 when an object exists but cannot be opened;
    Triton answers 500 to both, but a key naming nothing is the client's fault)."""
    posix_name = normal_key(name, key)
    try:
        mem = posix_ipc.SharedMemory(posix_name, flags=0)
    except (posix_ipc.Error, OSError, ValueError) as exc:
        cause = type(exc).__name__
        error = InvalidRequest if isinstance(exc, posix_ipc.ExistentialError) else ProxyError
        raise error(
            f"Unable to open shared memory region: '{name}' (the key names no shared memory"
            f" object this proxy can open: {cause}; the client and v2proxy must share /dev/shm)"
        ) from None
    try:
        fd = os.dup(mem.fd)  # ours alone, whatever posix_ipc does with its own
    finally:
        mem.close_fd()
    try:
        size = os.fstat(fd).st_size
        if offset + byte_size > size:
            raise _invalid_args(name)
        if byte_size == 0:
            raise InvalidRequest(
                f"failed to register shared memory region '{name}': unable to process address"
                " spaceInvalid argument"
            )
        delta = offset % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(
                fd,
                delta + byte_size,
                mmap.MAP_SHARED,
                mmap.PROT_READ | mmap.PROT_WRITE,
                offset=offset - delta,
            )
        except (OSError, ValueError, OverflowError) as exc:
            raise InvalidRequest(
                f"failed to register shared memory region '{name}': unable to process address"
                f" space{exc.strerror if isinstance(exc, OSError) else exc}"
            ) from None
        return SystemRegion(name, key, offset, byte_size, fd, mapping)
    except BaseException:
        os.close(fd)
        raise
