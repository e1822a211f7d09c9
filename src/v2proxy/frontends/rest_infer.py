"""``POST /v2/models/{m}[/versions/{v}]/infer`` of the REST frontend, in every wire form
(JSON, binary tensors, raw binary; gzip/deflate both ways: docs/protocol.md).

Every body is checked before anything of it reaches the backend. A body of at least
:data:`STREAM_RELAY_MIN` bytes may be relayed while it arrives, checked on the way; a smaller one
is read whole and the pipeline decides (:meth:`Pipeline.infer_body`). The usual small JSON body
is taken earlier by the quick lane (:mod:`v2proxy.frontends.rest_quick`).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Final

from v2proxy.codecs import binary as binc
from v2proxy.codecs import compression
from v2proxy.core.headers import WRITTEN
from v2proxy.core.model import Buffer, InferRequest, InferResponse
from v2proxy.core.pipeline import Answered, Decode, Pipeline
from v2proxy.core.ports import ForwardResponse, Headers, StreamedBody
from v2proxy.frontends.exchange import Exchange
from v2proxy.frontends.rest_answer import Answer
from v2proxy.frontends.rest_request import BodyReader
from v2proxy.http.request import Request
from v2proxy.ops.recorders import FrontendRecorder

#: (Final, as every name compiled code reads per request: a C static, not a look-up in the
#: module's dict)
perf_counter: Final = time.perf_counter
STREAM_RELAY_MIN: Final = 4 * 1024 * 1024
_IHCL: Final = binc.IHCL_HEADER.lower().encode()
_REQUEST_ID: Final = b"x-request-id"
#: what header_pass does with a field it does not pass on (:data:`WRITTEN`): note its first
#: value (Accept-Encoding 1, Content-Encoding 2, Inference-Header-Content-Length 3) or drop
#: it (0); one look-up a field
_DROPPED: Final[dict[bytes, int]] = {
    **dict.fromkeys(WRITTEN, 0),
    b"accept-encoding": 1,
    b"content-encoding": 2,
    _IHCL: 3,
}


#: what :func:`infer_headers` finds: Accept-Encoding, Content-Encoding and
#: Inference-Header-Content-Length (first values), the headers passed on, ``x-request-id``
InferHeaders = tuple[str | None, str | None, str | None, Headers, bytes | None]


def infer_headers(r: Request) -> InferHeaders:
    """:func:`header_pass` of ``r``'s headers, kept as its ``state`` (see infer)."""
    found = r.state = header_pass(r.headers)
    return found


def header_pass(headers: Headers) -> InferHeaders:
    """Accept-Encoding, Content-Encoding and Inference-Header-Content-Length (first values), the
    headers passed on (:data:`~v2proxy.core.headers.WRITTEN`) and ``x-request-id``, in one pass:
    an /infer request's headers are filtered here only."""
    accept = content_encoding = ihcl = rid = None
    forwarded: Headers = []
    for name, value in headers:
        dropped = _DROPPED.get(name)
        if dropped is None:
            forwarded.append((name, value))
            if name == _REQUEST_ID and rid is None:
                rid = value
        elif dropped == 0:
            continue
        elif dropped == 1:
            if accept is None:
                accept = value.decode("latin-1")
        elif dropped == 2:
            if content_encoding is None:
                content_encoding = value.decode("latin-1")
        elif ihcl is None:
            ihcl = value.decode("latin-1")
    return accept, content_encoding, ihcl, forwarded, rid


class InferEndpoint:
    """``POST .../infer`` on top of the pipeline: the body read (or relayed as it arrives),
    the pipeline's decision, and its answer in the client's wire form."""

    __slots__ = ("max_body_size", "max_input_size", "pipeline", "read_body", "recorder")

    def __init__(
        self,
        pipeline: Pipeline,
        recorder: FrontendRecorder,
        body: BodyReader,
        max_input_size: int,
    ) -> None:
        self.pipeline = pipeline
        self.recorder = recorder
        self.max_body_size = body.max_body_size
        self.read_body = body.read
        #: --max-input-size: a decompressed body, a decoded tensor
        self.max_input_size = max_input_size

    async def infer(self, r: Request, m: Any, _x: Exchange) -> Answer:
        """The handler of the route (``m``: its path match)."""
        model, version = m.group("model", "version")
        model = model or ""
        version = version or ""
        # the quick lane's pass when it declined the request, else this one
        accept, content_encoding, ihcl_value, forwarded, _ = r.state or infer_headers(r)
        encoding = None if accept is None else compression.choose_encoding(accept)
        client = r.client
        peer = None if client is None else str(client[0])
        decode: Decode = self.decode
        length = r.content_length
        if (
            length is not None
            and STREAM_RELAY_MIN <= length <= self.max_body_size
            and (content_encoding or "identity").strip().lower() == "identity"
        ):
            ihcl = binc.parse_ihcl(ihcl_value, length)
            if ihcl != 0:  # JSON or binary-framed: the pipeline may relay it while it arrives
                answer = await self.pipeline.infer_body(
                    model,
                    version,
                    StreamedBody(length, r.chunks()),
                    ihcl,
                    encoding is not None,
                    decode,
                    forwarded,
                    peer,
                )
                return self._answer(answer, encoding)
        body: Buffer | None = r.whole(self.max_body_size)  # the usual small body: here whole
        if body is None:
            body = await self.read_body(r)
        if content_encoding is not None:
            # decompression counts as decoding
            decode = partial(self.decode, t0=perf_counter())
            body = compression.decompress(body, content_encoding, self.max_input_size)
        ihcl = None if ihcl_value is None else binc.parse_ihcl(ihcl_value, len(body))
        answer = await self.pipeline.infer_body(
            model, version, body, ihcl, encoding is not None, decode, forwarded, peer
        )
        if type(answer) is ForwardResponse:
            return answer
        return self._answer(answer, encoding)

    async def decode(
        self, data: Buffer, ihcl: int | None, model: str, version: str, t0: float | None = None
    ) -> InferRequest:
        """The request of an /infer body (:data:`~v2proxy.core.pipeline.Decode`), called only
        when the pipeline needs it; its time is recorded from ``t0`` (decompression counts)."""
        if t0 is None:
            t0 = perf_counter()
        if ihcl == 0:  # raw: the model's shape, from the pipeline's metadata cache, counts too
            request = await self.pipeline.decode_raw(data, model, version)
        else:
            request = binc.decode_request(
                data, ihcl, model, version, self.max_input_size, self.pipeline.max_tensors
            )
        wire = "json" if ihcl is None else "raw" if ihcl == 0 else "binary"
        self.recorder.decode[wire].observe(perf_counter() - t0)
        return request

    def _answer(self, answer: ForwardResponse | Answered, encoding: str | None) -> Answer:
        if isinstance(answer, ForwardResponse):
            return answer
        return self.encode(answer.request, answer.response, encoding)

    def encode(
        self, request: InferRequest, response: InferResponse, encoding: str | None
    ) -> Answer:
        """The answer in the client's wire form (JSON or binary outputs, compressed as asked)."""
        t0 = perf_counter()
        chunks, json_length = binc.encode_response(response, binc.binary_output_rule(request))
        if json_length is None:
            headers = [(b"content-type", b"application/json")]
        else:
            headers = [
                (b"content-type", b"application/octet-stream"),
                (_IHCL, str(json_length).encode()),
            ]
        if encoding is not None:
            chunks = [compression.compress(chunks, encoding)]
            headers.append((b"content-encoding", encoding.encode()))
        self.recorder.encode["json" if json_length is None else "binary"].observe(
            perf_counter() - t0
        )
        return 200, headers, chunks
