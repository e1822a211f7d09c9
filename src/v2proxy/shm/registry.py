"""The system shared-memory regions clients registered with this process (docs/protocol.md, shared
memory), reference counted so that no mapping is closed under a request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from v2proxy.core.errors import AlreadyExists, InvalidRequest, NotFound
from v2proxy.core.regions import Region, cuda_register
from v2proxy.shm import cuda, system


class _Cell(Protocol):
    def inc(self, amount: float = 1.0) -> None: ...
    def dec(self, amount: float = 1.0) -> None: ...


class Mapped(Region, Protocol):
    """A region the registry can list and close (:class:`system.SystemRegion`)."""

    key: str
    offset: int

    def close(self) -> None: ...


Opener = Callable[[str, str, int, int], Mapped]


@dataclass(slots=True)
class _Entry:
    region: Mapped | cuda.CudaRegion
    kind: str = "system"
    users: int = 0
    doomed: bool = False


#: ``--max-shm-regions``' default
MAX_REGIONS = 256


def full(name: str, limit: int) -> InvalidRequest:
    """The refusal of a registration beyond ``--max-shm-regions``."""
    return InvalidRequest(
        f"cannot register shared memory region '{name}': v2proxy already has {limit} regions"
        " registered, the most it allows (--max-shm-regions); unregister some first"
    )


class Registry:
    """The regions by name; ``gauges``: (regions, bytes) metric cells, or None."""

    def __init__(
        self,
        opener: Opener = system.open_region,
        gauges: tuple[_Cell, _Cell] | None = None,
        tensors: dict[str, _Cell] | None = None,
        cuda_adapter: cuda.CudaAdapter | None = None,
        cuda_gauges: tuple[_Cell, _Cell] | None = None,
        max_regions: int = MAX_REGIONS,
    ) -> None:
        self._open = opener
        self.max_regions = max_regions
        self._gauges = {"system": gauges, "cuda": cuda_gauges}
        self._tensors = tensors
        self._cuda = cuda_adapter
        self._entries: dict[str, _Entry] = {}

    def status(self, name: str, kind: str = "system") -> list[dict[str, Any]]:
        if name:
            entry = self._entries.get(name)
            if entry is None:
                raise NotFound(f"Unable to find {kind} shared memory region: '{name}'")
            if entry.kind != kind:
                raise NotFound(cuda.wrong_kind(name, entry.kind, kind))
            return [_status(entry.region)]
        found = (self._entries[n] for n in sorted(self._entries))
        return [_status(e.region) for e in found if e.kind == kind]

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        system.normal_key(name, key)
        if name in self._entries:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if len(self._entries) >= self.max_regions:
            raise full(name, self.max_regions)
        region = self._open(name, key, offset, byte_size)
        self._entries[name] = _Entry(region)
        self._count(region, 1)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if self._cuda is None:
            cuda_register(name)  # Triton's CPU-build answer
        system.check_name(name)
        if name in self._entries:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if len(self._entries) >= self.max_regions:
            raise full(name, self.max_regions)
        assert self._cuda is not None
        region = cuda.open_region(self._cuda, name, raw_handle, device_id, byte_size)
        self._entries[name] = _Entry(region, "cuda")
        self._count(region, 1)

    def unregister(self, name: str, kind: str = "system") -> None:
        for n in [name] if name else list(self._entries):
            entry = self._entries.get(n)
            if entry is None or entry.kind != kind:
                continue
            if entry.users:
                entry.doomed = True  # closed by the last release
            else:
                self._remove(n, entry)

    def close(self) -> None:
        """Unregister everything (when the proxy stops)."""
        self.unregister("", "system")
        self.unregister("", "cuda")

    def served(self, direction: str, n: int) -> None:
        if self._tensors is not None:
            self._tensors[direction].inc(n)

    def acquire(self, name: str) -> Region:
        entry = self._entries.get(name)
        if entry is None or entry.doomed:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        entry.users += 1
        return entry.region

    def release(self, region: Region) -> None:
        entry = self._entries.get(region.name)
        if entry is None or entry.region is not region:
            return
        entry.users -= 1
        if entry.users <= 0 and entry.doomed:
            self._remove(region.name, entry)

    def users(self, name: str) -> int:
        """How many requests hold ``name`` now (tests, diagnostics)."""
        entry = self._entries.get(name)
        return 0 if entry is None else entry.users

    def _remove(self, name: str, entry: _Entry) -> None:
        del self._entries[name]
        self._count(entry.region, -1)
        entry.region.close()

    def _count(self, region: Mapped | cuda.CudaRegion, sign: int) -> None:
        gauges = self._gauges["cuda" if isinstance(region, cuda.CudaRegion) else "system"]
        if gauges is not None:
            regions, size = gauges
            regions.inc(sign)
            size.inc(sign * region.byte_size)


def _status(region: Mapped | cuda.CudaRegion) -> dict[str, Any]:
    if isinstance(region, cuda.CudaRegion):
        return region.status()
    return {
        "name": region.name,
        "key": region.key,
        "offset": region.offset,
        "byte_size": region.byte_size,
    }
