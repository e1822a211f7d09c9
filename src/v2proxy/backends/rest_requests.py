"""What the REST backend sends: the body and headers of its /infer requests and the paths of a
model's endpoints (quoted once per model and remembered), plus the empty body of answers read
whole. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Final
from urllib.parse import quote

from v2proxy.codecs.json_v2 import dumps_tree, request_to_obj
from v2proxy.core.model import Buffer, Datatype, InferRequest
from v2proxy.core.ports import Headers

JOIN_MAX: Final = 64 * 1024


def infer_body(
    request: InferRequest, binary: bool, heads: BinaryHeads | None = None
) -> tuple[list[Buffer], int | None]:
    """The /infer body for ``request`` and its Inference-Header-Content-Length (None: JSON).
    CodecError when a tensor cannot be written as JSON (e.g. non-UTF-8 BYTES)."""
    if not binary:
        return [dumps_tree(request_to_obj(request, False, False))], None
    head = _binary_head(request) if heads is None else heads.head(request)
    chunks: list[Buffer] = [head]
    size = len(head)
    for t in request.inputs:
        data = t.data
        nbytes = len(data) if type(data) is bytes else memoryview(data).nbytes
        if nbytes:
            chunks.append(data)
            size += nbytes
    if size <= JOIN_MAX:
        return [b"".join(chunks)], len(head)
    return chunks, len(head)


def _binary_head(request: InferRequest) -> bytes:
    obj = request_to_obj(request, binary_inputs=True, binary_outputs=True)
    if request.outputs is not None and not any(
        "shared_memory_region" in o.parameters for o in request.outputs
    ):
        obj.setdefault("parameters", {})["binary_data_output"] = True
    return dumps_tree(obj)


#: the only parameters of the plain kind: the binary header sets their values itself
_PLAIN_REQUEST: Final = frozenset({"binary_data_output"})
_PLAIN_OUTPUT: Final = frozenset({"binary_data"})
#: ((name, datatype, shape, bytes) per input, the requested outputs' names or None)
_Key = tuple[tuple[tuple[str, Datatype, tuple[int, ...], int], ...], tuple[str, ...] | None]


class BinaryHeads:
    """The JSON headers of a backend's binary /infer bodies, made once per kind of request."""

    KEPT: Final = 256

    __slots__ = ("_heads",)

    def __init__(self) -> None:
        self._heads: dict[_Key, bytes] = {}

    def head(self, request: InferRequest) -> bytes:
        """The JSON header of the binary /infer body for ``request``, kept when the request is of
        the plain kind (no id, no parameters but those the header sets)."""
        params = request.parameters
        if request.id or (params and not params.keys() <= _PLAIN_REQUEST):
            return _binary_head(request)
        inputs = []
        for t in request.inputs:
            data = t.data
            if t.parameters or type(t.shape) is not tuple:
                return _binary_head(request)
            size = len(data) if type(data) is bytes else memoryview(data).nbytes
            inputs.append((t.name, t.datatype, t.shape, size))
        names = None
        if request.outputs is not None:
            names = []
            for o in request.outputs:
                if o.parameters and not o.parameters.keys() <= _PLAIN_OUTPUT:
                    return _binary_head(request)
                names.append(o.name)
        key: _Key = (tuple(inputs), None if names is None else tuple(names))
        heads = self._heads
        head = heads.get(key)
        if head is None:
            head = _binary_head(request)
            if len(heads) >= self.KEPT:
                del heads[next(iter(heads))]
            heads[key] = head
        return head


#: what infer_headers adds: a tuple, so that the HTTP client remembers the head it makes (typed
#: as a sequence: compiled, a tuple constant would be built anew on each use)
_JSON_ONLY: Final[Sequence[tuple[bytes, bytes]]] = (
    (b"Accept-Encoding", b"identity"),
    (b"Content-Type", b"application/json"),
)


def infer_headers(headers: Headers, ihcl: int | None) -> Sequence[tuple[bytes, bytes]]:
    """Headers of an /infer request: the client's, a Content-Type always (KServe refuses
    requests without one), and an uncompressed answer asked for."""
    if not headers:  # the usual request, which forwards no header
        return _JSON_ONLY if ihcl is None else _binary_only(ihcl)
    out = list(headers)
    out.append((b"Accept-Encoding", b"identity"))
    if ihcl is None:
        out.append((b"Content-Type", b"application/json"))
    else:
        out.append((b"Content-Type", b"application/octet-stream"))
        out.append((b"Inference-Header-Content-Length", b"%d" % ihcl))
    return out


@lru_cache(maxsize=256)
def _binary_only(ihcl: int) -> tuple[tuple[bytes, bytes], ...]:
    """What infer_headers adds to a binary request (the same tuple per ``ihcl``: the HTTP
    client remembers the head it makes)."""
    return (
        (b"Accept-Encoding", b"identity"),
        (b"Content-Type", b"application/octet-stream"),
        (b"Inference-Header-Content-Length", b"%d" % ihcl),
    )


class ModelPaths:
    """``/v2/models/{model}[/versions/{version}]``, quoted, built once per model."""

    KEPT: Final = 1024

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
