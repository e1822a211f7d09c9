"""The guarded copy (``v2proxy.shm._guard`` through :mod:`v2proxy.shm.guarded`): a fault while
copying from or into a truncated shared-memory mapping is a return value, in either direction
and whoever installed a SIGBUS handler since; a fault anywhere else still ends the process as
it would have (the handler hides nothing but its own copies). The faulting cases run in child
processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np

from v2proxy.shm import guarded

_SETUP = """
import faulthandler, mmap, os, sys
from v2proxy.shm import guarded
key = f"/dev/shm/v2proxy_guard_test_{os.getpid()}"
fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.unlink(key)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
view = memoryview(m)
assert guarded.copy(bytearray(16), view[:16])  # installs the handler
"""


def _child(body: str) -> subprocess.CompletedProcess[str]:
    code = _SETUP + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_copies_and_offsets() -> None:
    dst = bytearray(8)
    assert guarded.copy(dst, b"abc", 2)
    assert dst == b"\0\0abc\0\0\0"
    data = guarded.read(np.arange(4, dtype="<i4").tobytes())
    assert data is not None and bytes(data) == np.arange(4, dtype="<i4").tobytes()
    big = np.arange(1 << 16, dtype="<u4")  # over the size where the GIL is released
    out = guarded.read(big.data)
    assert out is not None and np.array_equal(np.frombuffer(out, "<u4"), big)


def test_a_fault_while_copying_is_false_both_ways() -> None:
    proc = _child(
        """
        os.ftruncate(fd, 4096)
        print(guarded.copy(bytearray(1 << 20), view), guarded.copy(view, bytes(1 << 20)))
        print(guarded.read(view[8192:9000]))
        faulthandler.enable()  # another SIGBUS handler installed since: still caught
        print(guarded.copy(bytearray(100), view[8192:8292]))
        os.ftruncate(fd, 1 << 20)
        print(guarded.copy(view, b"ok", 8192), bytes(view[8192:8194]))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == ["False False", "None", "False", "True b'ok'"]


def test_a_fault_elsewhere_is_not_hidden() -> None:
    proc = _child(
        """
        os.ftruncate(fd, 4096)
        bytes(view[8192:8200])  # a plain read past the end: the process dies as before
        print("survived")
        """
    )
    assert proc.returncode == -signal.SIGBUS
    assert "survived" not in proc.stdout
