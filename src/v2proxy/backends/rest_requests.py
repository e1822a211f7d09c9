"""What the REST backend sends: the headers of its /infer requests and the paths of a model's
endpoints (quoted once per model and remembered), plus the empty body of answers read whole.
Pure: no I/O."""

from __future__ import annotations

from urllib.parse import quote

from v2proxy.backends.rest_answers import IHCL
from v2proxy.http_io import forwardable
from v2proxy.ports import Headers

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

#: what infer_headers adds (never changed by its users: the HTTP client only reads them)
_JSON_ONLY: Headers = [(b"Accept-Encoding", b"identity"), (b"Content-Type", b"application/json")]


def infer_headers(headers: Headers, ihcl: int | None) -> Headers:
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
