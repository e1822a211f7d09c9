"""ops/memory: --reuse-large-buffers keeps large blocks' memory between requests (glibc's
mallopt), and gives it back (malloc_trim) once no request has come for a tick."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from v2proxy.core.admission import AdmissionGate
from v2proxy.ops import memory

SRC = Path(__file__).resolve().parents[2] / "src"


class FakeLibc:
    def __init__(self, mallopt_ok: int = 1) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.ok = mallopt_ok

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", (param, value)))
        return self.ok

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", (pad,)))
        return 1


def test_sets_malloc_to_keep_large_blocks() -> None:
    libc = FakeLibc()
    assert memory.reuse_large_buffers(lambda: 0, libc) is not None
    assert libc.calls == [
        ("mallopt", (memory.M_MMAP_MAX, 0)),
        ("mallopt", (memory.M_TRIM_THRESHOLD, memory.KEEP_BYTES)),
    ]


def test_nothing_where_mallopt_refuses(caplog: pytest.LogCaptureFixture) -> None:
    assert memory.reuse_large_buffers(lambda: 0, FakeLibc(mallopt_ok=0)) is None
    assert "mallopt refused" in caplog.text


def test_nothing_where_the_c_library_is_not_glibc(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert memory.reuse_large_buffers(lambda: 0) is None
    assert "not glibc" in caplog.text


def test_memory_given_back_only_after_an_idle_tick() -> None:
    libc = FakeLibc()
    count = [0]
    releaser = memory.reuse_large_buffers(lambda: count[0], libc)
    assert releaser is not None
    libc.calls.clear()
    count[0] += 3  # requests came during the first tick: kept
    releaser.tick()
    assert libc.calls == [] and releaser.trims == 0
    releaser.tick()  # none during the second: given back
    assert libc.calls == [("malloc_trim", (0,))] and releaser.trims == 1
    count[0] += 1
    releaser.tick()
    assert releaser.trims == 1


def test_the_gate_counts_arrivals_but_not_probes() -> None:
    gate = AdmissionGate(0)
    for op in ("infer", "health", "metadata", "infer", "generate"):
        gate.enter(op)
    assert gate.arrived == 3
    limited = AdmissionGate(1)
    assert limited.enter("infer")
    with pytest.raises(Exception, match="too many requests"):
        limited.enter("infer")
    assert limited.arrived == 2 and limited.refused == 1


_FAULTS = """
import resource, sys
from v2proxy.ops import memory
if sys.argv[1] == "on":
    releaser = memory.reuse_large_buffers(lambda: 0)
    assert releaser is not None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
    b = bytearray(64 << 20)
    del b
f0 = faults()
for _ in range(4):
    b = bytearray(64 << 20)  # zero-filled: every page touched
    del b
kept = faults() - f0
if sys.argv[1] == "on":
    releaser.tick()  # nothing arrived: given back
    f0 = faults()
    b = bytearray(64 << 20)
    del b
    print(kept, faults() - f0)
else:
    print(kept, 0)
"""


def _faults(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode],
        env={"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_large_blocks_reused_without_page_faults_then_given_back() -> None:
    pages = (64 << 20) // 4096  # per 64 MiB block
    default, _ = _faults("off")
    assert default > 3 * pages  # each block fresh: a fault per page
    kept, after_trim = _faults("on")
    assert kept < pages // 10  # the same heap memory each time
    assert after_trim > pages // 2  # given back: the next block faults again


async def test_serve_sets_it_up_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from v2proxy import app
    from v2proxy.ops.config import Settings

    asked: list[int] = []
    libc = FakeLibc()

    def fake(arrived: Any) -> memory.Releaser:
        asked.append(arrived())
        return memory.Releaser(libc, arrived)

    monkeypatch.setattr(memory, "reuse_large_buffers", fake)
    gate = AdmissionGate(0)
    gate.enter("infer")
    off = dataclasses.replace(Settings(), reuse_large_buffers=False)
    assert app._release_memory(off, gate) is None and asked == []
    task = app._release_memory(Settings(), gate)  # on by default
    assert task is not None and asked == [1]
    task.cancel()
