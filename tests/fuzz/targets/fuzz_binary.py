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

from fuzzlib import expect, instrumented, main, survives, take

with instrumented(__name__ == "__main__"):
    from v2proxy.codecs import binary as binc
    from v2proxy.codecs.dtypes import check_tensor_size
    from v2proxy.errors import ProxyError
    from v2proxy.model import InferRequest, InferResponse


def _same(a: InferRequest, b: InferRequest, with_bytes: bool) -> None:
    expect(len(a.inputs) == len(b.inputs), "input count differs")
    for x, y in zip(a.inputs, b.inputs, strict=True):
        expect((x.name, x.datatype, x.shape) == (y.name, y.datatype, y.shape), f"{x} != {y}")
        if with_bytes:
            expect(bytes(x.data) == bytes(y.data), f"bytes of input {x.name!r} differ")


def _header_value(control: int, number: int) -> str | None:
    if control & 1:
        return None
    if control & 2:
        return f" +{number} " if number % 2 else f"\t{number}\t"
    return str(number)


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
            _same(probe, req, with_bytes=False)
    if req is not None:
        for binary in (False, True):
            # BYTES elements of a binary input are checked where they are read (a JSON
            # backend's encoding, the builtin models): that CodecError is a fine answer
            encoded = survives(binc.encode_request, req, binary)
            if encoded is None:
                continue
            chunks, length = encoded
            again = survives(
                binc.decode_request, b"".join(bytes(c) for c in chunks), length, "m", "1", 1 << 24
            )
            # BYTES element framing and counts of binary inputs are checked where the tensors
            # are read (the builtin models, shared-memory staging, the backend): only requests
            # that pass that check must survive the trip
            if again is None and not _sizes_valid(req):
                continue
            expect(again is not None, f"a request does not decode again ({binary=})")
            assert again is not None
            _same(req, again, with_bytes=binary)
        rule = binc.binary_output_rule(req)
        survives(binc.encode_response, InferResponse("m", req.inputs), rule)
    resp = survives(binc.decode_response, body, ihcl)
    if resp is not None:
        for each in (lambda _t: False, lambda _t: True):
            out = survives(binc.encode_response, resp, each)
            if out is not None:
                chunks, length = out
                back = survives(binc.decode_response, b"".join(bytes(c) for c in chunks), length)
                expect(back is not None, "an encoded response does not decode again")


if __name__ == "__main__":
    main(test_one_input)
