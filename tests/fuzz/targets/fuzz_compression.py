"""Fuzz target: compressed /infer and generate bodies (codecs.compression.decompress: gzip and
deflate under --max-input-size) and the Accept-Encoding choice (choose_encoding).

Input: a control byte, then the body. Control bits 0-2 pick the Content-Encoding value, bits 3-4
the size limit.

Invariants: success or a ProxyError; an inflated body is never longer than the limit (zip bombs
stop at the limit); the Accept-Encoding value (the body read as Latin-1) yields gzip, deflate
or None; what ``compress`` writes inflates back to the same bytes.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, survives, take

with instrumented(__name__ == "__main__"):
    from v2proxy.codecs.compression import choose_encoding, compress, decompress

ENCODINGS = ("gzip", "deflate", None, "identity", " GZIP ", "Deflate", "br", "gzip, deflate")
LIMITS = (0, 16, 4096, 1 << 20)


def test_one_input(data: bytes) -> None:
    control, body = take(data, 1)
    encoding = ENCODINGS[control & 7]
    limit = LIMITS[(control >> 3) & 3]
    out = survives(decompress, body, encoding, limit)
    if out is not None and encoding is not None and encoding.strip().lower() in ("gzip", "deflate"):
        expect(len(out) <= limit, f"inflated {len(out)} bytes past the limit {limit}")
    expect(
        choose_encoding(body.decode("latin-1")) in (None, "gzip", "deflate"), "odd encoding chosen"
    )
    for enc in ("gzip", "deflate"):
        packed = compress([body[: len(body) // 2], body[len(body) // 2 :]], enc)
        expect(decompress(packed, enc, len(body)) == body, f"{enc} round trip changed the body")


if __name__ == "__main__":
    main(test_one_input)
