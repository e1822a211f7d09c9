"""The port to client shared memory, which the shm adapters implement (docs/protocol.md).

:class:`Regions` is the registry as the pipeline uses it: register, status, unregister, and per
request :meth:`Regions.acquire` / :meth:`Regions.release` of :class:`Region` handles. Pure:
``v2proxy.shm`` imports this module, never the reverse."""

from __future__ import annotations

from typing import Any, Protocol

from v2proxy.core.errors import InvalidRequest
from v2proxy.core.model import Buffer


class Region(Protocol):
    """A registered region as a request uses it (offsets are relative to its start)."""

    name: str
    byte_size: int

    def check(self) -> None:
        """Raise a ProxyError when the object no longer holds the registered bytes."""
        ...

    def read(self, offset: int, size: int) -> memoryview:
        """A private copy of ``size`` bytes at ``offset`` (bounds checked by the caller)."""
        ...

    def write(self, offset: int, data: Buffer) -> None:
        """Copy ``data`` to ``offset`` (bounds checked by the caller)."""
        ...


class Regions(Protocol):
    """The registered regions (:class:`v2proxy.shm.registry.Registry`: one process's,
    :class:`v2proxy.shm.shared.SharedRegistry`: those every worker shares)."""

    def acquire(self, name: str) -> Region:
        """The region named ``name``, held until :meth:`release` (NotFound if unknown)."""
        ...

    def release(self, region: Region) -> None: ...

    def status(self, name: str, kind: str = "system") -> list[dict[str, Any]]:
        """Triton's status list of the ``kind`` ("system" | "cuda") regions, sorted by name;
        one entry when ``name`` is given."""
        ...

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """A CUDA region (Triton's CPU-build text when this proxy has no CUDA adapter)."""
        ...

    def unregister(self, name: str, kind: str = "system") -> None:
        """Unregister one region of ``kind`` ("" = all of them); in-use regions go when their
        last user ends; a name of the other kind is left alone."""
        ...

    def served(self, direction: str, n: int) -> None:
        """Count ``n`` tensors read (``"input"``) or written (``"output"``) in regions."""
        ...


def cuda_register(name: str) -> None:
    """Triton's answer on a build without GPUs or without cupy (docs/protocol.md, CUDA regions)."""
    raise InvalidRequest(
        f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
    )
