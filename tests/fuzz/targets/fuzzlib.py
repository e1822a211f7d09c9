"""What every fuzz target shares: the invariant check and the atheris entry point.

The invariant (DESIGN.md, issue 14): whatever bytes a codec is fed, it either succeeds or raises
one of the project's own errors (a :class:`~v2proxy.errors.ProxyError`, with a message and a
4xx/5xx status); any other exception is a defect, and atheris reports it as a crash. A target's
``test_one_input(data: bytes)`` is an ordinary function: the corpus replay test calls it
without atheris.

``main`` runs a target under atheris with libFuzzer's own flags (``-runs=N``, ``-max_len=N``,
``-timeout=S``, ``-merge=1``, corpus folders): ``python tests/fuzz/targets/fuzz_json.py
-runs=100000 tests/fuzz/corpus/json``. Only the project's modules are instrumented for
coverage (``instrumented``), so that the fuzzer steers by v2proxy's branches.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from v2proxy.errors import ProxyError

T = TypeVar("T")


def survives(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """``fn``'s result, or None when it raised a ProxyError (a fine answer); anything else
    propagates: the fuzzer reports it."""
    try:
        return fn(*args, **kwargs)
    except ProxyError as exc:
        if not exc.message or not 400 <= exc.http_status < 600:
            raise AssertionError(f"malformed error {type(exc).__name__}: {exc!r}") from exc
        return None


def expect(condition: bool, what: str) -> None:
    """An invariant of a target beyond "no foreign exception" (the fuzzer reports a failure)."""
    if not condition:
        raise AssertionError(what)


@contextlib.contextmanager
def instrumented(enabled: bool) -> Iterator[None]:
    """Imports inside the block get atheris' coverage instrumentation when ``enabled`` (the
    target runs as the fuzzer's script), else nothing happens (corpus replay)."""
    if not enabled:
        yield
        return
    import atheris

    with atheris.instrument_imports(include=["v2proxy"]):
        yield


def main(test_one_input: Callable[[bytes], None]) -> None:
    """Fuzz ``test_one_input`` with libFuzzer's arguments from the command line."""
    import atheris

    # libFuzzer runs its own child processes (-merge=1, -fork) as a shell command made of
    # argv[0] and flags: make that the interpreter and the script, not the bare script
    command = f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(sys.argv[0]))}"
    atheris.Setup([command, *sys.argv[1:]], test_one_input)
    atheris.Fuzz()


def take(data: bytes, n: int) -> tuple[int, bytes]:
    """The first ``n`` bytes of ``data`` as a little-endian control number, and the rest."""
    return int.from_bytes(data[:n], "little"), data[n:]
