"""Fuzz target: MindIE's native API (codecs.mindie and its mapping): a client's POST /infer body
validated as MindIE validates it (parse_request) and mapped onto the builtin ``llm`` model for
each profile (codecs.mindie_map; the generate profile's body through
codecs.generate.request_from_generate); and a MindIE server's answers to the MindIE backend
(codecs.mindie_backend: the non-stream body, error bodies, the SSE stream) and a v2 backend's
generate_stream events as the MindIE frontend reads them (codecs.generate.SseParser, then
codecs.mindie_answer.chunk_from_generate).

Input: a control byte, then the body. Control bits 0-2: 0-3 a client body (bit 0 a small input
limit, bit 1 the generate profile instead of trtllm/vllm), 4 a MindIE non-stream answer, 5 a
MindIE error answer (bits 3-7: its status), 6 a MindIE SSE stream, 7 a generate_stream body
(bits 3-5: the piece size both streams are fed in).

Invariants: success or a ProxyError, for every step of each path.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, survives, take

with instrumented(__name__ == "__main__"):
    from v2proxy.codecs import generate as gc
    from v2proxy.codecs import mindie as mc
    from v2proxy.codecs import mindie_answer as answer
    from v2proxy.codecs import mindie_backend as mb
    from v2proxy.codecs import mindie_map as mapping
    from v2proxy.core.errors import ProxyError
    from v2proxy.reference.models import MODELS

LLM = MODELS["llm"]
VIEW = mapping.model_view("llm", LLM.metadata(), LLM.config())
SMALL = mc.Limits(max_input_chars=16, max_new_tokens=4, timeout=5)
STATUSES = (400, 404, 413, 422, 424, 500, 503, 200, 302, 429, 502, 504, 0, 999, 418, 501)
PIECES = (1, 2, 3, 7, 16, 64, 512, 1 << 16)


def _client(body: bytes, control: int) -> None:
    limits = SMALL if control & 1 else mc.Limits()
    req = survives(mc.parse_request, body, limits, lambda: 7)
    if req is None:
        return
    if control & 2:  # the generate profile: a generate body, mapped as Triton maps it
        out = survives(mapping.generate_body, req, "generate", VIEW, "seed", req.stream)
        if out is not None:
            survives(gc.request_from_generate, out[0], "llm", "", LLM.metadata())
        return
    for profile in ("trtllm", "vllm"):
        values = survives(mapping.candidate_values, req, profile, VIEW, "seed", req.stream)
        if values is not None:
            kept, _ = mapping.select(values, VIEW)
            survives(mapping.infer_request, kept, VIEW, "id")


def _mindie_stream(body: bytes, piece: int) -> None:
    parser = mb.SseParser()
    mapper = mb.StreamMapper("llm", None)
    events = []
    for i in range(0, len(body), piece):
        events.extend(parser.feed(body[i : i + piece]))
    events.extend(parser.finish())
    try:
        for event in events:
            mapper.map(event)
        mapper.end()
    except ProxyError as exc:
        expect(bool(exc.message), "an error without a message")


def _generate_stream(body: bytes, piece: int) -> None:
    reader = gc.SseParser()
    try:
        objs = []
        for i in range(0, len(body), piece):
            objs.extend(reader.feed(body[i : i + piece]))
        objs.extend(reader.close())
        for obj in objs:
            answer.chunk_from_generate(obj)
    except ProxyError as exc:
        expect(bool(exc.message), "an error without a message")


def test_one_input(data: bytes) -> None:
    control, body = take(data, 1)
    mode = control & 7
    if mode < 4:
        _client(body, mode)
    elif mode == 4:
        survives(mb.non_stream_response, "llm", "id", body)
    elif mode == 5:
        error = mb.error_for(STATUSES[(control >> 3) & 15], body)
        expect(isinstance(error, ProxyError) and 400 <= error.http_status < 600, repr(error))
    elif mode == 6:
        _mindie_stream(body, PIECES[(control >> 3) & 7])
    else:
        _generate_stream(body, PIECES[(control >> 3) & 7])


if __name__ == "__main__":
    main(test_one_input)
