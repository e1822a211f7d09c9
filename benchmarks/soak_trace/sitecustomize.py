"""tracemalloc snapshots of a v2proxy under soak (``soak.py --tracemalloc DIR``).

``soak.py`` puts this folder first on the proxy's ``PYTHONPATH`` and sets
``V2PROXY_SOAK_TRACEMALLOC=DIR``; Python imports this module at start-up. Without that variable
it does nothing. With it, tracemalloc starts (``V2PROXY_SOAK_TRACEMALLOC_FRAMES`` frames, default
1) and a daemon thread dumps a snapshot every ``V2PROXY_SOAK_TRACEMALLOC_EVERY`` seconds (default
60) to ``DIR/PID-NNN.tracemalloc``; forked workers start their own thread (``os.register_at_fork``).
``soak.py --tracemalloc-compare DIR`` compares each process's snapshots.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc

_DIR = os.environ.get("V2PROXY_SOAK_TRACEMALLOC")


def _dump_every(folder: str, seconds: float) -> None:
    n = 0
    while True:
        time.sleep(seconds)
        tracemalloc.take_snapshot().dump(os.path.join(folder, f"{os.getpid()}-{n:03d}.tracemalloc"))
        n += 1


def _start() -> None:
    assert _DIR is not None
    every = float(os.environ.get("V2PROXY_SOAK_TRACEMALLOC_EVERY", "60"))
    threading.Thread(target=_dump_every, args=(_DIR, every), daemon=True).start()


if _DIR:
    tracemalloc.start(int(os.environ.get("V2PROXY_SOAK_TRACEMALLOC_FRAMES", "1")))
    os.register_at_fork(after_in_child=_start)
    _start()
