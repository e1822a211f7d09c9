"""Fuzz target: binary-framed /infer bodies (the binary-tensor extension): the
Inference-Header-Content-Length header (codecs.binary.parse_ihcl), the framed request
(decode_request with an IHCL), the check of its JSON header alone before the binary section
arrives (decode_request_header), and a backend's framed answer (decode_response).

Input: a control byte, two bytes of IHCL (little-endian), then the body. Control bits: 0 sends
no IHCL header, 1 writes the header value with blanks and a sign, 2 picks a small
--max-input-size.

Invariants: every call succeeds or raises a ProxyError; the header-only check never refuses a
request the full decoder accepts (and reads the same tensor names, types and shapes); a decoded
request encodes for a backend and decodes again to the same tensors, bytes included for the
binary form; a decoded response encodes for a client.
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
    from v2proxy.core.model import InferResponse


def _header_value(control: int, number: int) -> str | None:
    if control & 1:
        return None
    if control & 2:
        return f" +{number} " if number % 2 else f"\t{number}\t"
    return str(number)


def test_one_input(data: bytes) -> None:
    control, rest = take(data, 1)
    number, body = take(rest, 2)
    limit = 512 if control & 4 else 1 << 20
    value = _header_value(control, number)
    ihcl = survives(binc.parse_ihcl, value, len(body))
    if value is not None and ihcl is None:
        return  # the header was refused
    if ihcl == 0:
        return  # a raw request: fuzz_raw
    req = survives(binc.decode_request, body, ihcl, "m", "1", limit)
    if ihcl:
        probe = survives(binc.decode_request_header, body[:ihcl], len(body) - ihcl, "m", "1", limit)
        if req is not None:
            expect(probe is not None, "the header check refused a request the decoder accepts")
            assert probe is not None
            same_tensors(probe.inputs, req.inputs, with_bytes=False)
    if req is not None:
        request_reencodes(req, "1")
        rule = binc.binary_output_rule(req)
        survives(binc.encode_response, InferResponse("m", req.inputs), rule)
    resp = survives(binc.decode_response, body, ihcl)
    if resp is not None:
        response_encodes(resp, decodes_again=True)


if __name__ == "__main__":
    main(test_one_input)
