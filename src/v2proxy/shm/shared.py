"""The system shared-memory regions of ``--workers N``: one registry all workers see, kept as
small record files in a folder the supervisor creates before forking (and removes at exit)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from typing import Any

from v2proxy.core.errors import AlreadyExists, NotFound
from v2proxy.core.regions import Region, cuda_register
from v2proxy.shm import cuda, system
from v2proxy.shm.registry import MAX_REGIONS, Mapped, Opener, _Cell, full

Ident = tuple[int, int]  # (st_ino, st_mtime_ns) of a record


class _Entry:
    __slots__ = ("doomed", "ident", "path", "region", "users")

    def __init__(self, region: Mapped | cuda.CudaRegion, path: str, ident: Ident) -> None:
        self.region = region
        self.path = path
        self.ident = ident
        self.users = 0
        self.doomed = False  # by this worker: it removes the record at the last release


class SharedRegistry:
    """The regions recorded in ``folder``; ``gauges``: (regions, bytes) metric cells, or None."""

    def __init__(
        self,
        folder: str,
        opener: Opener = system.open_region,
        gauges: tuple[_Cell, _Cell] | None = None,
        tensors: dict[str, _Cell] | None = None,
        cuda_adapter: cuda.CudaAdapter | None = None,
        cuda_gauges: tuple[_Cell, _Cell] | None = None,
        max_regions: int = MAX_REGIONS,
    ) -> None:
        self._folder = folder
        self.max_regions = max_regions
        self._open = opener
        self._cuda = cuda_adapter
        self._gauges = {"system": gauges, "cuda": cuda_gauges}
        self._tensors = tensors
        self._entries: dict[str, _Entry] = {}  # this worker's mappings
        self._old: dict[int, _Entry] = {}  # id(region) -> dropped entries still in use
        self._seq = 0

    def status(self, name: str, kind: str = "system") -> list[dict[str, Any]]:
        if name:
            found = self._read(self._path(name))
            if found is None:
                raise NotFound(f"Unable to find {kind} shared memory region: '{name}'")
            if _kind(found[0]) != kind:
                raise NotFound(cuda.wrong_kind(name, _kind(found[0]), kind))
            return [_status(found[0])]
        return [_status(r) for r in self._records() if _kind(r) == kind]

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        system.normal_key(name, key)
        path = self._path(name)
        if self._read(path) is not None:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        self._room(name)
        region = self._open(name, key, offset, byte_size)
        record = {"name": name, "key": key, "offset": offset, "byte_size": byte_size}
        self._create(path, {**record, "kind": "system"}, region)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if self._cuda is None:
            cuda_register(name)  # Triton's CPU-build answer
        system.check_name(name)
        path = self._path(name)
        if self._read(path) is not None:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        self._room(name)
        assert self._cuda is not None
        region = cuda.open_region(self._cuda, name, raw_handle, device_id, byte_size)
        handle = base64.b64encode(raw_handle).decode()
        record = {"name": name, "device_id": device_id, "byte_size": byte_size}
        self._create(path, {**record, "raw_handle": handle, "kind": "cuda"}, region)

    def _room(self, name: str) -> None:
        """Refuse a registration beyond ``max_regions`` records (every worker's)."""
        with os.scandir(self._folder) as it:
            count = sum(1 for e in it if not e.name.startswith("."))
        if count >= self.max_regions:
            raise full(name, self.max_regions)

    def _create(self, path: str, record: dict[str, Any], region: Mapped | cuda.CudaRegion) -> None:
        name = record["name"]
        try:
            ident = self._write(path, record, create=True)
        except FileExistsError:
            region.close()
            raise AlreadyExists(f"shared memory region '{name}' already in manager") from None
        except BaseException:
            region.close()
            raise
        self._drop(name)
        self._entries[name] = _Entry(region, path, ident)
        self._count(record["kind"], record["byte_size"], 1)

    def unregister(self, name: str, kind: str = "system") -> None:
        records = [] if name else self._records()
        for n in [name] if name else [r["name"] for r in records if _kind(r) == kind]:
            path = self._path(n)
            entry = self._entries.get(n)
            if entry is not None and entry.doomed:
                continue  # already waiting for this worker's requests
            found = self._read(path)
            if found is None:
                self._drop(n)
                continue
            record, ident = found
            if _kind(record) != kind:
                continue  # a region of the other kind: Triton leaves it alone
            if record.get("doomed"):
                continue  # another worker's deferred unregister
            if entry is not None and entry.users and entry.ident == ident:
                entry.ident = self._write(path, {**record, "doomed": os.getpid()}, create=False)
                entry.doomed = True  # the record goes with this worker's last user
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                self._count(_kind(record), record["byte_size"], -1)
            self._drop(n)

    def sweep(self) -> None:
        """Drop the cached mappings whose record was removed or replaced."""
        for name, entry in list(self._entries.items()):
            if not entry.doomed and _ident(entry.path) != entry.ident:
                self._drop(name)

    def close(self) -> None:
        """Unmap this worker's regions (when it stops); the records stay for the others."""
        for name, entry in list(self._entries.items()):
            if entry.doomed:
                self._remove_record(entry)
            del self._entries[name]
            entry.region.close()

    def served(self, direction: str, n: int) -> None:
        if self._tensors is not None:
            self._tensors[direction].inc(n)

    def acquire(self, name: str) -> Region:
        entry = self._entries.get(name)
        path = self._path(name) if entry is None else entry.path
        if entry is None or _ident(path) != entry.ident:
            found = self._read(path)
            if found is None or found[0].get("doomed"):
                if entry is not None and not entry.doomed:
                    self._drop(name)
                raise NotFound(f"Unable to find shared memory region: '{name}'")
            record, ident = found
            self._drop(name)
            region = self._open_record(record)
            entry = self._entries[name] = _Entry(region, path, ident)
        elif entry.doomed:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        entry.users += 1
        return entry.region

    def release(self, region: Region) -> None:
        entry = self._entries.get(region.name)
        if entry is None or entry.region is not region:
            old = self._old.get(id(region))
            if old is not None:
                old.users -= 1
                if old.users <= 0:
                    del self._old[id(region)]
                    old.region.close()
            return
        entry.users -= 1
        if entry.users <= 0 and entry.doomed:
            del self._entries[region.name]
            self._remove_record(entry)
            entry.region.close()

    def users(self, name: str) -> int:
        """How many requests of this worker hold ``name`` now (tests, diagnostics)."""
        entry = self._entries.get(name)
        return 0 if entry is None else entry.users

    def _path(self, name: str) -> str:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
        return os.path.join(self._folder, digest)

    def _open_record(self, record: dict[str, Any]) -> Mapped | cuda.CudaRegion:
        """This worker's mapping (system) or opened IPC handle (cuda) of a record."""
        name, size = record["name"], record["byte_size"]
        if _kind(record) == "system":
            return self._open(name, record["key"], record["offset"], size)
        if self._cuda is None:
            cuda_register(name)
        assert self._cuda is not None
        handle = base64.b64decode(record["raw_handle"])
        return cuda.open_region(self._cuda, name, handle, record["device_id"], size)

    def _drop(self, name: str) -> None:
        """Forget this worker's mapping of ``name``: closed now, or by its last user."""
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        if entry.users:
            self._old[id(entry.region)] = entry
        else:
            entry.region.close()

    def _remove_record(self, entry: _Entry) -> None:
        if _ident(entry.path) == entry.ident:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                kind = "cuda" if isinstance(entry.region, cuda.CudaRegion) else "system"
                self._count(kind, entry.region.byte_size, -1)

    def _records(self) -> list[dict[str, Any]]:
        found = []
        with os.scandir(self._folder) as it:
            for e in it:
                if not e.name.startswith("."):
                    one = self._read(e.path)
                    if one is not None:
                        found.append(one[0])
        return sorted(found, key=lambda r: r["name"])

    def _read(self, path: str) -> tuple[dict[str, Any], Ident] | None:
        """A record and its identity; None when there is none (or its doomer died)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            record: dict[str, Any] = json.loads(os.read(fd, st.st_size + 1))
        finally:
            os.close(fd)
        doomer = record.get("doomed")
        if doomer and doomer != os.getpid() and not _alive(doomer):
            if _ident(path) == (st.st_ino, st.st_mtime_ns):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return None
        return record, (st.st_ino, st.st_mtime_ns)

    def _write(self, path: str, record: dict[str, Any], create: bool) -> Ident:
        """Put ``record`` at ``path`` whole: linked (FileExistsError if one is there) or
        replacing it."""
        self._seq += 1
        tmp = os.path.join(self._folder, f".tmp-{os.getpid()}-{self._seq}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, json.dumps(record).encode())
            st = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            if create:
                os.link(tmp, path)
            else:
                os.replace(tmp, path)
        finally:
            if create:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return st.st_ino, st.st_mtime_ns

    def _count(self, kind: str, size: int, sign: int) -> None:
        gauges = self._gauges[kind]
        if gauges is not None:
            regions, total = gauges
            regions.inc(sign)
            total.inc(sign * size)


def _ident(path: str) -> Ident | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kind(record: dict[str, Any]) -> str:
    return str(record.get("kind", "system"))


def _status(record: dict[str, Any]) -> dict[str, Any]:
    if _kind(record) == "cuda":
        return {k: record[k] for k in ("name", "device_id", "byte_size")}
    return {k: record[k] for k in ("name", "key", "offset", "byte_size")}
