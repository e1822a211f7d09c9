"""Fuzz target: JSON /infer bodies (codecs.binary.decode_request with no IHCL -> json_v2,
json_data, json.parse_header) and the streamed check of large JSON bodies
(codecs.json_stream.StreamCheck), plus a backend's JSON answers (decode_response).

Input: one control byte, then the body. Control bits: 0 pads the body with leading blanks past
``json.SMALL_DOCUMENT`` (the simdjson path instead of orjson's), 1-3 pick the piece size the
streamed check is fed in (MAX_PIECES at most), 4 picks a small --max-input-size,
5 runs the streamed check too (half the runs: it is the slow part).

Invariants: every call succeeds or raises a ProxyError; StreamCheck never raises and never calls
valid what the full decoder refuses (and then reads the same tensors' names, types and shapes);
a decoded request encodes for a backend (JSON and binary) and that body decodes again to the
same tensors; a decoded response encodes for a client.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, survives, take

with instrumented(__name__ == "__main__"):
    from v2proxy.codecs import binary as binc
    from v2proxy.codecs import json as jsonc
    from v2proxy.codecs import json_stream
    from v2proxy.codecs.dtypes import check_tensor_size
    from v2proxy.errors import ProxyError
    from v2proxy.model import InferRequest, InferResponse

PIECES = (1, 2, 3, 5, 8, 13, 64, 4096)
MAX_PIECES = 48
PAD = b" " * (jsonc.SMALL_DOCUMENT + 1)


def _same_tensors(a: InferRequest, b: InferRequest, with_bytes: bool) -> None:
    expect(len(a.inputs) == len(b.inputs), "input count changed through a re-encoding")
    for x, y in zip(a.inputs, b.inputs, strict=True):
        expect((x.name, x.datatype, x.shape) == (y.name, y.datatype, y.shape), f"{x} != {y}")
        if with_bytes:
            expect(bytes(x.data) == bytes(y.data), f"bytes of input {x.name!r} changed")


def _stream_check(pad: bytes, body: bytes, piece: int, limit: int) -> InferRequest | None:
    saved = json_stream.PIECE_SIZE
    json_stream.PIECE_SIZE = 8  # check numbers in many small pieces: cuts fall everywhere
    try:
        check = json_stream.StreamCheck("m", "", limit)
        if pad:
            check.feed(pad)
        cut = piece * (MAX_PIECES - 1)  # the rest in one last piece: bounded work per run
        for i in range(0, min(cut, len(body)), piece):
            check.feed(body[i : min(i + piece, cut)])
        if len(body) > cut:
            check.feed(body[cut:])
        return check.finish()
    finally:
        json_stream.PIECE_SIZE = saved


def _sizes_valid(req: InferRequest) -> bool:
    """Whether every tensor holds what its datatype and shape need (what the pipeline and the
    builtin models check before reading BYTES elements of binary inputs)."""
    for t in req.inputs:
        if "shared_memory_region" in t.parameters:
            continue
        try:
            check_tensor_size(t, t.name)
        except ProxyError:
            return False
    return True


def test_one_input(data: bytes) -> None:
    control, body = take(data, 1)
    pad = PAD if control & 1 else b""
    piece = PIECES[(control >> 1) & 7]
    limit = 256 if control & 16 else 1 << 20
    verdict = _stream_check(pad, body, piece, limit) if control & 32 else None
    body = pad + body
    req = survives(binc.decode_request, body, None, "m", "", limit)
    if verdict is not None:
        expect(req is not None, "StreamCheck called valid a body the full decoder refuses")
        assert req is not None
        _same_tensors(verdict, req, with_bytes=False)
    if req is not None:
        for binary in (False, True):
            # BYTES elements of a binary input are checked where they are read (a JSON
            # backend's encoding, the builtin models): that CodecError is a fine answer
            encoded = survives(binc.encode_request, req, binary)
            if encoded is None:
                continue
            chunks, ihcl = encoded
            again = survives(
                binc.decode_request, b"".join(bytes(c) for c in chunks), ihcl, "m", "", 1 << 24
            )
            # BYTES element framing and counts of binary inputs are checked where the tensors
            # are read (the builtin models, shared-memory staging, the backend): only requests
            # that pass that check must survive the trip
            if again is None and not _sizes_valid(req):
                continue
            expect(again is not None, f"a request does not decode again ({binary=})")
            assert again is not None
            _same_tensors(req, again, with_bytes=binary)
        survives(binc.encode_response, InferResponse("m", req.inputs), lambda _t: False)
    resp = survives(binc.decode_response, body, None)
    if resp is not None:
        for rule in (lambda _t: False, lambda _t: True):
            survives(binc.encode_response, resp, rule)


if __name__ == "__main__":
    main(test_one_input)
