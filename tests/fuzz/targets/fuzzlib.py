"""What every fuzz target shares: the invariant check and the atheris entry point.

The invariant (docs/architecture.md, rules the code follows): whatever bytes a codec is fed, it
either succeeds or raises one of the project's own errors (a
:class:`~v2proxy.core.errors.ProxyError`, with a message and a 4xx/5xx status); any other exception
is a defect, and atheris reports it as a crash. A target's ``test_one_input(data: bytes)`` is an
ordinary function: the corpus replay test calls it without atheris.

``main`` runs a target under atheris with libFuzzer's own flags (``-runs=N``, ``-max_len=N``,
``-timeout=S``, ``-merge=1``, corpus folders): ``python tests/fuzz/targets/fuzz_json.py
-runs=100000 tests/fuzz/corpus/json``. Only the project's modules are instrumented for
coverage (``instrumented``), so that the fuzzer steers by v2proxy's branches.

The codec checks the /infer targets share (``same_tensors``, ``sizes_valid``,
``request_reencodes``, ``response_encodes``) import the codecs when called, not here: the
target imports them first inside ``instrumented``, so that they carry the coverage hooks.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from v2proxy.core.errors import ProxyError

if TYPE_CHECKING:
    from v2proxy.core.model import InferRequest, InferResponse, Tensor

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


def same_tensors(a: Sequence[Tensor], b: Sequence[Tensor], with_bytes: bool) -> None:
    """``b`` holds the tensors of ``a`` (names, datatypes and shapes; their bytes too when
    ``with_bytes``): what a re-encoding or a header-only check must keep."""
    expect(len(a) == len(b), f"tensor count differs: {len(a)} != {len(b)}")
    for x, y in zip(a, b, strict=True):
        expect((x.name, x.datatype, x.shape) == (y.name, y.datatype, y.shape), f"{x} != {y}")
        if with_bytes:
            expect(bytes(x.data) == bytes(y.data), f"bytes of tensor {x.name!r} differ")


def sizes_valid(req: InferRequest) -> bool:
    """Whether every tensor holds what its datatype and shape need (what the pipeline and the
    builtin models check before reading BYTES elements of binary inputs)."""
    from v2proxy.codecs.dtypes import check_tensor_size

    for t in req.inputs:
        if "shared_memory_region" in t.parameters:
            continue
        try:
            check_tensor_size(t, t.name)
        except ProxyError:
            return False
    return True


def request_reencodes(req: InferRequest, version: str) -> None:
    """A decoded request encodes for a backend (JSON, then binary) and that body decodes again
    (as model "m", ``version``) to the same tensors, bytes included for the binary form."""
    from v2proxy.backends.rest_requests import infer_body
    from v2proxy.codecs import binary as binc

    for binary in (False, True):
        # BYTES elements of a binary input are checked where they are read (a JSON
        # backend's encoding, the builtin models): that CodecError is a fine answer
        encoded = survives(infer_body, req, binary)
        if encoded is None:
            continue
        chunks, ihcl = encoded
        again = survives(
            binc.decode_request, b"".join(bytes(c) for c in chunks), ihcl, "m", version, 1 << 24
        )
        # BYTES element framing and counts of binary inputs are checked where the tensors
        # are read (the builtin models, shared-memory staging, the backend): only requests
        # that pass that check must survive the trip
        if again is None and not sizes_valid(req):
            continue
        expect(again is not None, f"a request does not decode again ({binary=})")
        assert again is not None
        same_tensors(req.inputs, again.inputs, with_bytes=binary)


def response_encodes(resp: InferResponse, decodes_again: bool = False) -> None:
    """A decoded response encodes for a client, every output as JSON and every output binary;
    with ``decodes_again`` each encoded body must decode again."""
    from v2proxy.codecs import binary as binc

    for rule in (lambda _t: False, lambda _t: True):
        out = survives(binc.encode_response, resp, rule)
        if decodes_again and out is not None:
            chunks, length = out
            back = survives(binc.decode_response, b"".join(bytes(c) for c in chunks), length)
            expect(back is not None, "an encoded response does not decode again")
