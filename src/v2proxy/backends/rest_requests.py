"""What the REST backend sends: the body and headers of its /infer requests and the paths of a
model's endpoints (quoted once per model and remembered), plus the empty body of answers read
whole. Pure: no I/O.

An /infer body (:func:`infer_body`) is all JSON, or binary: every input as binary tensor data
and every output asked binary, both ways a v2 server may read it: each listed output's
``binary_data`` and the request's ``binary_data_output`` (KServe 0.21 writes its response as
its model passes on one or the other: a model that keeps only the flag has FP16 outputs it
cannot write as JSON). Outputs staged in shared memory are never asked binary, and the
request-level flag is then left out, so that no server applies it to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from v2proxy.backends.rest_answers import IHCL
from v2proxy.codecs.json_v2 import dumps_tree, request_to_obj
from v2proxy.core.model import Buffer, InferRequest
from v2proxy.core.ports import Headers
from v2proxy.http.headers import forwardable

#: client headers not passed on with the requests whose body the REST backend writes
OWN = frozenset({b"content-type", b"content-encoding", b"accept-encoding", IHCL})


class _NoChunks:
    """The body of an answer read whole: no pieces (stateless, so one serves every answer)."""

    __slots__ = ()

    def __aiter__(self) -> _NoChunks:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration


NO_CHUNKS = _NoChunks()


def infer_body(request: InferRequest, binary: bool) -> tuple[list[Buffer], int | None]:
    """The /infer body for ``request`` and its Inference-Header-Content-Length (None: JSON).
    CodecError when a tensor cannot be written as JSON (e.g. non-UTF-8 BYTES)."""
    obj = request_to_obj(request, binary_inputs=binary, binary_outputs=binary)
    if not binary:
        return [dumps_tree(obj)], None
    if request.outputs is not None and not any(
        "shared_memory_region" in o.parameters for o in request.outputs
    ):
        obj.setdefault("parameters", {})["binary_data_output"] = True
    head = dumps_tree(obj)
    chunks: list[Buffer] = [head]
    chunks.extend(t.data for t in request.inputs if memoryview(t.data).nbytes)
    return chunks, len(head)


#: what infer_headers adds: a tuple, so that the HTTP client remembers the head it makes
_JSON_ONLY = ((b"Accept-Encoding", b"identity"), (b"Content-Type", b"application/json"))


def infer_headers(headers: Headers, ihcl: int | None) -> Sequence[tuple[bytes, bytes]]:
    """Headers of an /infer request: the client's, a Content-Type always (KServe refuses
    requests without one), and an uncompressed answer asked for (it is read or relayed)."""
    if not headers and ihcl is None:
        return _JSON_ONLY  # the usual small JSON request, which forwards no header
    out = forwardable(headers, OWN)
    out.append((b"Accept-Encoding", b"identity"))
    if ihcl is None:
        out.append((b"Content-Type", b"application/json"))
    else:
        out.append((b"Content-Type", b"application/octet-stream"))
        out.append((b"Inference-Header-Content-Length", b"%d" % ihcl))
    return out


class ModelPaths:
    """``/v2/models/{model}[/versions/{version}]``, quoted, built once per model (at most
    :attr:`KEPT` remembered)."""

    KEPT = 1024

    __slots__ = ("_paths",)

    def __init__(self) -> None:
        self._paths: dict[tuple[str, str], str] = {}

    def __call__(self, model: str, version: str) -> str:
        path = self._paths.get((model, version))
        if path is None:
            path = f"/v2/models/{quote(model, safe='')}"
            if version:
                path = f"{path}/versions/{version}"
            if len(self._paths) < self.KEPT:
                self._paths[(model, version)] = path
        return path
