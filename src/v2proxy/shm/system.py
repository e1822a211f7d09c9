"""POSIX system shared memory: a client's object opened under ``/dev/shm`` and mapped with
``mmap`` (docs/protocol.md, shared memory).

Keys are checked before anything sees them (:func:`normal_key`). A :class:`SystemRegion` never
hands out a view of the client's memory: it reads and writes through :mod:`v2proxy.shm.guarded`,
so a client that truncates its object gets a 400, not the proxy a SIGBUS. The proxy never unlinks
a client's object, and messages never contain the key.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat

from v2proxy.core.errors import InvalidRequest, Overloaded, ProxyError
from v2proxy.core.model import Buffer
from v2proxy.shm import guarded
from v2proxy.shm.staging import STAGING_PREFIX

#: Triton's python backend's objects (refused by Triton since 2.61) and v2proxy's staging
#: objects: no client may register them
RESERVED_PREFIX = "triton_python_backend_shm_region_"
RESERVED_PREFIXES = (RESERVED_PREFIX, STAGING_PREFIX)
SHM_DIR = "/dev/shm"
_NAME_MAX = 255


def check_name(name: str) -> None:
    """A region name must be UTF-8 text (it is echoed in status answers and errors)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            "cannot register shared memory region: its name is not valid UTF-8 text"
        ) from None


def normal_key(name: str, key: str) -> str:
    """The POSIX name (``/`` + file name) of a register request's key, or InvalidRequest."""
    check_name(name)
    base = key.lstrip("/")
    try:
        size = len(base.encode("utf-8"))
    except UnicodeEncodeError:
        size = -1
    if size <= 0 or size > _NAME_MAX or "/" in base or base in (".", "..") or "\x00" in base:
        raise InvalidRequest(f"cannot register shared memory region '{name}' - invalid shm key")
    for prefix in RESERVED_PREFIXES:
        if base.startswith(prefix):
            raise InvalidRequest(
                f"cannot register shared memory region '{name}' as the key contains the"
                f" reserved prefix '{prefix}'"
            )
    return "/" + base


def _invalid_args(name: str) -> InvalidRequest:
    return InvalidRequest(f"failed to register shared memory region '{name}': invalid args")


class SystemRegion:
    """One registered system region: ``byte_size`` bytes at ``offset`` of the object ``key``."""

    __slots__ = ("_map", "_view", "byte_size", "key", "name", "offset")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap):
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._map: mmap.mmap | None = mapping
        delta = offset % mmap.ALLOCATIONGRANULARITY
        self._view = memoryview(mapping)[delta : delta + byte_size]

    def _truncated(self) -> InvalidRequest:
        return InvalidRequest(
            f"shared memory region '{self.name}' is no longer usable: its object is smaller"
            " than the registered offset + byte_size (it was truncated after registration)"
        )

    def check(self) -> None:
        mapping = self._map
        try:
            size = -1 if mapping is None else mapping.size()
        except (OSError, ValueError):
            size = -1
        if size < self.offset + self.byte_size:
            raise self._truncated()

    def read(self, offset: int, size: int) -> memoryview:
        """A private copy of ``size`` bytes at ``offset`` (bounds checked by the caller)."""
        if self._map is None:
            raise self._truncated()
        data = guarded.read(self._view[offset : offset + size])
        if data is None:
            raise self._truncated()
        return data

    def write(self, offset: int, data: Buffer) -> None:
        """Copy ``data`` to ``offset`` (bounds checked by the caller)."""
        src = memoryview(data).cast("B")
        if self._map is None or not guarded.copy(self._view, src, offset):
            raise self._truncated()

    def close(self) -> None:
        """Unmap (no view of the mapping ever leaves this object)."""
        mapping, self._map = self._map, None
        if mapping is None:
            return
        self._view.release()
        mapping.close()


_CLIENT_ERRORS = {
    errno.ENOENT: "the key names no shared memory object",
    errno.ELOOP: "the key names a symbolic link, not a shared memory object",
    errno.EISDIR: "the key names a directory, not a shared memory object",
    errno.EACCES: "v2proxy is not allowed to open the object the key names",
    errno.EPERM: "v2proxy is not allowed to open the object the key names",
    errno.ENXIO: "the key names a special file, not a shared memory object",
    errno.ENAMETOOLONG: "the key is too long",
}
_PROXY_SHORT = {errno.EMFILE, errno.ENFILE, errno.ENOMEM}


def _open_object(name: str, posix_name: str) -> int:
    """The object's descriptor (read-write, not following links, not blocking); InvalidRequest
    when the key names nothing usable, Overloaded when the proxy is out of descriptors."""
    path = SHM_DIR + posix_name
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno in _PROXY_SHORT:
            raise Overloaded(
                f"Unable to open shared memory region: '{name}': v2proxy is out of file"
                " descriptors or memory; try again later"
            ) from None
        why = _CLIENT_ERRORS.get(exc.errno or 0)
        error = ProxyError if why is None else InvalidRequest
        raise error(
            f"Unable to open shared memory region: '{name}' ({why or exc.strerror}; the client"
            " and v2proxy must share /dev/shm)"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidRequest(
            f"Unable to open shared memory region: '{name}' (the key names a special file, not a"
            " shared memory object)"
        )
    return fd


def open_region(name: str, key: str, offset: int, byte_size: int) -> SystemRegion:
    """Open and map a client's object (``key`` as the client gave it)."""
    posix_name = normal_key(name, key)
    fd = _open_object(name, posix_name)
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
        except OSError as exc:
            if exc.errno in _PROXY_SHORT:
                raise Overloaded(
                    f"failed to register shared memory region '{name}': v2proxy is out of file"
                    " descriptors or memory; try again later"
                ) from None
            raise InvalidRequest(
                f"failed to register shared memory region '{name}': unable to process address"
                f" space{exc.strerror}"
            ) from None
        except (ValueError, OverflowError) as exc:
            raise InvalidRequest(
                f"failed to register shared memory region '{name}': unable to process address"
                f" space{exc}"
            ) from None
        return SystemRegion(name, key, offset, byte_size, mapping)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
