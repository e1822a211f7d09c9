"""Shared test configuration: the event loops async tests run on, the ``gpu`` skip, and the
``from_source`` tests, which look inside the modules setup.py compiles (a method replaced, a
module function counted): compiled code calls its own functions directly, so they run where those
modules are imported from source (``V2PROXY_PURE_PYTHON=1``, a pass of its own in ``make test``)
and are skipped beside the compiled modules.

An async test runs on uvloop (what ``v2proxy serve`` uses by default) and, where the loop itself
is what is tested, on plain asyncio too: a test module (or test) marked ``both_loops`` -- v2proxy's
HTTP server and client, TLS, streaming and flow control, deadlines, the gRPC backend's failures,
the builtin llm's turns on the loop. The two loops differ in their transports (write buffers,
flow control, TLS, close) and timers, not in what v2proxy computes, so a test of codecs, messages,
metrics or settings gains nothing from the second run. (Interop tests choose the loop of the
``v2proxy serve`` process they start by their own fixtures; the test's own loop is only a client.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import uvloop

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], Any]]:
    if item.get_closest_marker("both_loops") is not None:
        return LOOPS
    return {"uvloop": LOOPS["uvloop"]}


def _gpu_missing() -> str | None:
    """Why ``gpu`` tests cannot run here (None: they can): cupy, cuda-python (tritonclient's
    cuda_shared_memory) and a CUDA device are all needed."""
    try:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
        import tritonclient.utils.cuda_shared_memory  # noqa: F401
    except Exception as exc:  # ImportError, or cupy finding no driver
        return f"needs cupy, cuda-python and a CUDA GPU ({type(exc).__name__}: {exc})"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from v2proxy import _compiled

    if _compiled.COMPILED:
        skip = pytest.mark.skip(
            reason="looks inside compiled modules: runs in make test's V2PROXY_PURE_PYTHON=1 pass"
        )
        for item in items:
            if item.get_closest_marker("from_source") is not None:
                item.add_marker(skip)
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = _gpu_missing() if gpu else None
    if reason is not None:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=reason))
