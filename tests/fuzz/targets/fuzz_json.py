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

from fuzzlib import (
    expect,
    instrumented,
    main,
    request_reencodes,
    response_encodes,
    same_tensors,
    survives,
    take,
)

with instrumented(__name__ == "__main__"):
    from v2proxy.codecs import binary as binc
    from v2proxy.codecs import json as jsonc
    from v2proxy.codecs import json_stream
    from v2proxy.core.model import InferRequest, InferResponse

PIECES = (1, 2, 3, 5, 8, 13, 64, 4096)
MAX_PIECES = 48
PAD = b" " * (jsonc.SMALL_DOCUMENT + 1)


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
        same_tensors(verdict.inputs, req.inputs, with_bytes=False)
    if req is not None:
        request_reencodes(req, "")
        survives(binc.encode_response, InferResponse("m", req.inputs), lambda _t: False)
    resp = survives(binc.decode_response, body, None)
    if resp is not None:
        response_encodes(resp)


if __name__ == "__main__":
    main(test_one_input)
