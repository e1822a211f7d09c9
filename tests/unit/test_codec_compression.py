"""Body compression for /infer (docs/protocol.md, compression): request inflation and response
encoding."""

from __future__ import annotations

import gzip
import zlib

import pytest

from v2proxy.codecs.compression import choose_encoding, compress, decompress
from v2proxy.core.errors import CodecError, PayloadTooLarge, UnsupportedEncoding
from v2proxy.core.model import Buffer

PAYLOAD = b'{"inputs":[]}' + bytes(range(256)) * 40
LIMIT = 1 << 20


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


# (id, encoded body, Content-Encoding): zlib's 15|32 window auto-detects either wrapper.
INFLATE = [
    ("gzip-as-gzip", gzip.compress(PAYLOAD), "gzip"),
    ("zlib-as-deflate", zlib.compress(PAYLOAD), "deflate"),
    ("gzip-as-deflate", gzip.compress(PAYLOAD), "deflate"),
    ("zlib-as-gzip", zlib.compress(PAYLOAD), "gzip"),
    ("gzip-level-9", gzip.compress(PAYLOAD, 9), "gzip"),
    ("zlib-level-0", zlib.compress(PAYLOAD, 0), "deflate"),
    ("ours-gzip", compress([PAYLOAD], "gzip"), "gzip"),
    ("ours-deflate", compress([PAYLOAD], "deflate"), "deflate"),
    ("padded-encoding", gzip.compress(PAYLOAD), " gzip "),
]


@pytest.mark.parametrize(("body", "encoding"), [pytest.param(b, e, id=i) for i, b, e in INFLATE])
@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_decompress(body: bytes, encoding: str, wrap: type[Buffer]) -> None:
    assert bytes(decompress(wrap(body), encoding, LIMIT)) == PAYLOAD


@pytest.mark.parametrize("encoding", [None, "", "identity", " identity "])
def test_identity_passes_through(encoding: str | None) -> None:
    body = b"\x1f\x8b not really gzip"
    assert decompress(body, encoding, 4) is body  # no limit applies, no copy


def test_empty_gzip_stream_is_empty() -> None:
    assert decompress(gzip.compress(b""), "gzip", 0) == b""


@pytest.mark.parametrize("encoding", ["br", "compress", "zstd", "gzip, deflate", "x-gzip"])
def test_unknown_encoding_is_415(encoding: str) -> None:
    # Triton answers 501; a content coding the server cannot decode is the client's fault, and
    # RFC 9110 §15.5.16 names 415 for it (found by schemathesis: no 5xx for client faults)
    with pytest.raises(UnsupportedEncoding) as info:
        decompress(gzip.compress(PAYLOAD), encoding, LIMIT)
    assert info.value.http_status == 415
    assert info.value.grpc_code == "INVALID_ARGUMENT"
    assert "Unsupported compression type" in info.value.message
    assert encoding in info.value.message


def test_encoding_names_are_case_insensitive() -> None:
    # Triton answers 501 to `GZIP`; the proxy is liberal in what it accepts (docs/architecture.md).
    assert decompress(gzip.compress(PAYLOAD), "GZIP", LIMIT) == PAYLOAD


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_empty_compressed_body(encoding: str) -> None:
    with pytest.raises(CodecError) as info:
        decompress(b"", encoding, LIMIT)
    assert info.value.message == "nothing to be decompressed"


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        (b"this is not gzip", "gzip"),
        (b"\x1f\x8b\x08\x00garbage-after-magic", "gzip"),
        (PAYLOAD, "deflate"),
        (_raw_deflate(PAYLOAD), "deflate"),  # no zlib header: zlib refuses it, as Triton does
        (gzip.compress(PAYLOAD)[:10] + b"\xff" * 20, "gzip"),
    ],
)
def test_invalid_compressed_body(body: bytes, encoding: str) -> None:
    with pytest.raises(CodecError) as info:
        decompress(body, encoding, LIMIT)
    assert info.value.message.startswith(f"failed to decompress the {encoding} request body")


@pytest.mark.parametrize("cut", [1, 4, 8, 100])
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_truncated_body(cut: int, encoding: str) -> None:
    body = compress([PAYLOAD], encoding)[:-cut]
    with pytest.raises(CodecError) as info:
        decompress(body, encoding, LIMIT)
    assert info.value.message.startswith(f"failed to decompress the {encoding} request body")


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_limit(encoding: str) -> None:
    body = compress([PAYLOAD], encoding)
    assert decompress(body, encoding, len(PAYLOAD)) == PAYLOAD
    with pytest.raises(PayloadTooLarge) as info:
        decompress(body, encoding, len(PAYLOAD) - 1)
    assert info.value.message.startswith(
        f"Decompressed data size exceeds the maximum allowed value of {len(PAYLOAD) - 1} bytes"
    )
    assert info.value.http_status == 400


def test_decompression_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (64 << 20))
    assert len(bomb) < 100_000
    with pytest.raises(PayloadTooLarge):
        decompress(bomb, "gzip", 1 << 20)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compress_round_trips(encoding: str) -> None:
    chunks: list[Buffer] = [b"head", memoryview(b"\x00\x01"), bytearray(b"tail"), b""]
    body = compress(chunks, encoding)
    expected = b"head\x00\x01tail"
    if encoding == "gzip":
        assert body[:2] == b"\x1f\x8b"
        assert gzip.decompress(body) == expected
    else:
        assert body[0] & 0x0F == 8  # zlib header: deflate method
        assert zlib.decompress(body) == expected
    assert decompress(body, encoding, LIMIT) == expected


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("identity", None),
        ("gzip, deflate", "gzip"),  # ties go to the first listed
        ("deflate, gzip", "deflate"),
        ("deflate;q=1.0, gzip;q=1.0", "deflate"),
        ("identity, gzip", None),
        ("gzip;q=0.5, deflate;q=0.8", "deflate"),
        ("gzip;q=0.9, deflate;q=0.8", "gzip"),
        ("gzip;q=0.5, identity", None),
        ("identity;q=0.1, gzip;q=0.2", "gzip"),
        ("gzip;q=0", None),  # starting state is identity at q=0
        ("gzip;q=0, deflate;q=0", None),
        ("deflate;q=0.001", "deflate"),
        ("*", None),
        ("br", None),
        ("br, gzip", "gzip"),
        ("*;q=1, deflate;q=0.1", "deflate"),
        ("br;q=1.0, zstd, gzip;q=0.3", "gzip"),
        ("gzip;q=abc, deflate;q=0.1", "deflate"),
        ("  gzip  ,deflate", "gzip"),
    ],
)
def test_choose_encoding(accept: str | None, expected: str | None) -> None:
    assert choose_encoding(accept) == expected
