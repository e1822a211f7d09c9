"""Fuzz target: the generate extension (codecs.generate): a generate or generate_stream body
mapped onto a builtin model's inputs (parse_body, request_from_generate), and a backend's
generate_stream events (SseParser).

Input: a control byte, then the body. Control bits 0-2 pick the model (its metadata: llm,
simple, simple_string, simple_identity, identity_fp32, classifier), bit 3 a small
--max-input-size; bit 4: the body is an event stream instead, fed in pieces of a size from
bits 5-7.

Invariants: success or a ProxyError; a mapped request encodes for every kind of backend (REST
JSON and binary, gRPC); the answer built from its inputs as outputs encodes as a generate
answer and an SSE event.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import instrumented, main, survives, take

with instrumented(__name__ == "__main__"):
    from v2proxy.backends.rest_requests import infer_body
    from v2proxy.codecs import generate as gc
    from v2proxy.codecs import grpc as grpcc
    from v2proxy.core.model import InferResponse
    from v2proxy.reference.models import MODELS

NAMES = ("llm", "simple", "simple_string", "simple_identity", "identity_fp32", "classifier")
METADATA = [MODELS[n].metadata() for n in NAMES]
PIECES = (1, 2, 3, 7, 16, 64, 512, 1 << 16)


def _stream(body: bytes, piece: int) -> None:
    parser = gc.SseParser()
    for i in range(0, len(body), piece):
        if survives(parser.feed, body[i : i + piece]) is None:
            return
    survives(parser.close)


def test_one_input(data: bytes) -> None:
    control, body = take(data, 1)
    if control & 16:
        _stream(body, PIECES[control >> 5])
        return
    index = (control & 7) % len(NAMES)
    limit = 64 if control & 8 else 1 << 20
    obj = survives(gc.parse_body, body)
    if obj is None:
        return
    req = survives(gc.request_from_generate, obj, NAMES[index], "", METADATA[index], limit)
    if req is None:
        return
    for binary in (False, True):
        survives(infer_body, req, binary)
    survives(grpcc.request_to_proto, req)
    resp = InferResponse(req.model_name, req.inputs, "1", req.id, dict(req.parameters))
    answer = survives(gc.response_to_generate, resp)
    if answer is not None:
        survives(gc.sse_event, answer)


if __name__ == "__main__":
    main(test_one_input)
