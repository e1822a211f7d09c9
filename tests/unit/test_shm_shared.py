"""The registry every worker of ``--workers N`` shares (v2proxy.shm.shared): two
SharedRegistry objects on one folder stand for two workers, on real POSIX shared-memory objects
(each unlinked at the end)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import posix_ipc
import pytest

from v2proxy.core.errors import AlreadyExists, InvalidRequest, NotFound
from v2proxy.core.model import Datatype, InferRequest, InferResponse, RequestedOutput, Tensor
from v2proxy.core.stages.shm import resolve
from v2proxy.ops.metrics import Counter
from v2proxy.shm.registry import Registry
from v2proxy.shm.shared import SharedRegistry


@pytest.fixture
def key() -> Iterator[str]:
    key = f"/v2proxy_unit_shared_{os.getpid()}"
    mem = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=4 * 4096)
    try:
        yield key
    finally:
        mem.close_fd()
        mem.unlink()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[SharedRegistry, SharedRegistry]]:
    a, b = SharedRegistry(str(tmp_path)), SharedRegistry(str(tmp_path))
    yield a, b
    a.close()
    b.close()


def test_one_view_and_same_refusals(key: str, tmp_path: Path) -> None:
    gauges = (Counter(), Counter())
    a, b = SharedRegistry(str(tmp_path), gauges=gauges), SharedRegistry(str(tmp_path))
    a.register("x", key, 4096 + 3, 100)
    a.register("a", key, 0, 128)
    listed = [
        {"name": "a", "key": key, "offset": 0, "byte_size": 128},
        {"name": "x", "key": key, "offset": 4099, "byte_size": 100},
    ]
    assert a.status("") == b.status("") == listed
    assert b.status("x") == [listed[1]]
    assert (gauges[0].value, gauges[1].value) == (2, 228)
    with pytest.raises(AlreadyExists, match="'a' already in manager"):
        b.register("a", key, 0, 1)
    with pytest.raises(InvalidRequest) as err:
        b.register("c", key, 1, 4 * 4096)
    assert err.value.message == "failed to register shared memory region 'c': invalid args"
    with pytest.raises(InvalidRequest, match="invalid shm key"):
        b.register("c", "/", 0, 1)
    with pytest.raises(InvalidRequest) as perr:  # Triton: 500 for the client's fault
        b.register("c", "/v2proxy_unit_no_such_object", 0, 1)
    assert perr.value.http_status == 400
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'c'"):
        a.status("c")
    # a region registered by one is used by the other (mapped lazily)
    region = a.acquire("a")
    region.write(0, np.arange(4, dtype="<i4").tobytes())
    a.release(region)
    other = b.acquire("a")
    assert bytes(other.read(0, 16)) == np.arange(4, dtype="<i4").tobytes()
    b.release(other)
    b.unregister("")  # all, from the other worker
    assert a.status("") == b.status("") == []
    assert (gauges[0].value, gauges[1].value) == (2, 228)  # a's part; b's gauges are b's
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'a'"):
        a.acquire("a")  # a's cached mapping is dropped
    assert os.listdir(tmp_path) == []
    a.close()
    b.close()


def test_re_registration_is_noticed(key: str, pair: tuple[SharedRegistry, SharedRegistry]) -> None:
    a, b = pair
    a.register("r", key, 0, 64)
    r = a.acquire("r")
    r.write(0, b"\1" * 8)
    a.release(r)
    assert bytes(b.acquire("r").read(0, 1)) == b"\1"  # b now caches the mapping (in use)
    a.unregister("r")
    a.register("r", key, 4096, 64)  # the same name elsewhere
    r = b.acquire("r")
    assert r.byte_size == 64 and bytes(r.read(0, 1)) == b"\0"
    b.release(r)
    assert b.users("r") == 0


def test_deferred_unregister_across_workers(
    key: str, pair: tuple[SharedRegistry, SharedRegistry]
) -> None:
    a, b = pair
    a.register("r", key, 0, 64)
    held = a.acquire("r")
    a.unregister("r")  # a's request holds it: deferred, still listed everywhere
    assert [s["name"] for s in b.status("")] == ["r"]
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'r'"):
        b.acquire("r")
    with pytest.raises(NotFound):
        a.acquire("r")
    with pytest.raises(AlreadyExists):
        b.register("r", key, 0, 64)
    b.unregister("r")  # a no-op: a removes it
    held.write(0, b"\7")
    a.release(held)
    assert a.status("") == b.status("") == []
    b.register("r", key, 0, 64)  # the name is free again
    # in use by another worker: the record goes at once, the mapping stays until its user ends
    in_b = b.acquire("r")
    a.unregister("r")
    assert b.status("") == []
    assert bytes(in_b.read(0, 1)) == b"\7"  # still mapped for b's request
    b.release(in_b)
    with pytest.raises(NotFound):
        b.acquire("r")


def test_record_of_a_dead_worker_is_dropped(key: str, tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    a = SharedRegistry(str(tmp_path))
    a.register("r", key, 0, 64)
    (path,) = [p for p in tmp_path.iterdir()]
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "doomed": int(dead.stdout)}))
    assert a.status("") == []
    a.register("r", key, 0, 64)
    a.close()


@pytest.mark.parametrize("shared", [True, False])
def test_resolve_counts_tensors(key: str, tmp_path: Path, shared: bool) -> None:
    tensors = {"input": Counter(), "output": Counter()}
    reg: Any = (
        SharedRegistry(str(tmp_path), tensors=tensors) if shared else Registry(tensors=tensors)
    )
    # shared: registered by another worker, used by this one
    (SharedRegistry(str(tmp_path)) if shared else reg).register("in", key, 0, 128)
    shm: dict[str, Any] = {"shared_memory_region": "in", "shared_memory_byte_size": 64}
    out = {"shared_memory_region": "in", "shared_memory_byte_size": 64, "shared_memory_offset": 64}
    req = InferRequest(
        "simple",
        [Tensor(n, Datatype.INT32, (1, 16), b"", dict(shm)) for n in ("INPUT0", "INPUT1")],
        [RequestedOutput("OUTPUT0", out), RequestedOutput("OUTPUT1")],
    )
    use = resolve(req, reg, peer=None)
    assert use is not None and reg.users("in") == 1
    assert (tensors["input"].value, tensors["output"].value) == (2, 0)
    answer = [Tensor(n, Datatype.INT32, (1, 16), b"\1" * 64) for n in ("OUTPUT0", "OUTPUT1")]
    use.write_outputs(InferResponse("simple", answer))
    assert (tensors["input"].value, tensors["output"].value) == (2, 1)
    use.release()
    assert reg.users("in") == 0
    assert resolve(InferRequest("simple", [], None), reg, peer=None) is None
    assert (tensors["input"].value, tensors["output"].value) == (2, 1)
    reg.close()
