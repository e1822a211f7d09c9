"""HTTP body compression for /infer (docs/protocol.md, compression)."""

from __future__ import annotations

import zlib

from v2proxy.core.errors import CodecError, PayloadTooLarge, UnsupportedEncoding
from v2proxy.core.model import Buffer

SUPPORTED = ("gzip", "deflate")


def decompress(body: Buffer, encoding: str | None, limit: int) -> Buffer:
    """The request body with its Content-Encoding removed."""
    if encoding is None:
        return body
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in SUPPORTED:
        raise UnsupportedEncoding(f"Unsupported compression type '{encoding}'")
    if memoryview(body).nbytes == 0:
        raise CodecError("nothing to be decompressed")
    inflater = zlib.decompressobj(15 | 32)
    try:
        out = inflater.decompress(body, limit + 1)
        if len(out) > limit:
            raise PayloadTooLarge(
                f"Decompressed data size exceeds the maximum allowed value of {limit} bytes."
                " Raise --max-input-size to increase the limit."
            )
        if not inflater.eof:
            raise CodecError(f"failed to decompress the {enc} request body: data is truncated")
    except zlib.error as exc:
        raise CodecError(f"failed to decompress the {enc} request body: {exc}") from None
    return out


def choose_encoding(accept: str | None) -> str | None:
    """gzip, deflate or None (identity) for a response, from an Accept-Encoding value."""
    if not accept:
        return None
    best, best_q = "identity", 0.0
    for part in accept.split(","):
        token, _, params = part.strip().partition(";")
        token = token.strip().lower()
        if token not in ("identity", "gzip", "deflate"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                continue
        if q > best_q:
            best, best_q = token, q
    return None if best == "identity" else best


def compress(chunks: list[Buffer], encoding: str) -> bytes:
    """The whole body compressed (gzip or zlib wrapper)."""
    wbits = 31 if encoding == "gzip" else 15
    comp = zlib.compressobj(6, zlib.DEFLATED, wbits)
    parts = [comp.compress(c) for c in chunks]
    parts.append(comp.flush())
    return b"".join(parts)
