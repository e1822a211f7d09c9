"""The fuzz invariant (docs/reliability.md, fuzzing): any bytes either decode or raise CodecError
(or another ProxyError subclass), nothing else: no ValueError, TypeError, IndexError,
RecursionError, numpy warning or anything else that would end up as a 500 with a traceback.

Inputs are raw random bytes, and structured requests/responses that are then corrupted (a node
replaced or deleted, bytes flipped, the body cut) with random IHCL values. What decodes must also
encode again (JSON and binary) without any error other than a ProxyError.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from v2proxy.backends.rest_requests import infer_body
from v2proxy.codecs import binary as binc
from v2proxy.codecs.compression import choose_encoding, compress, decompress
from v2proxy.codecs.dtypes import count_bytes_elements, deserialize_bytes
from v2proxy.codecs.json_data import data_to_buffer
from v2proxy.codecs.raw import decode_raw_request
from v2proxy.core.errors import ProxyError
from v2proxy.core.model import Buffer, Datatype, InferRequest, InferResponse

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))

T = TypeVar("T")


def survives(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Run ``fn``; a ProxyError is a fine answer, any other exception fails the test."""
    try:
        return fn(*args, **kwargs)
    except ProxyError as exc:
        assert exc.message  # errors always say something
        assert 400 <= exc.http_status < 600
        return None


def _join(chunks: list[Buffer]) -> bytes:
    return b"".join(bytes(c) for c in chunks)


def _reencode_request(req: InferRequest) -> None:
    for binary in (True, False):
        survives(infer_body, req, binary)
    survives(binc.encode_response, InferResponse("M", req.inputs, "1"), lambda _t: False)


def _reencode_response(resp: InferResponse) -> None:
    for rule in (lambda _t: True, lambda _t: False):
        out = survives(binc.encode_response, resp, rule)
        if out is not None:
            chunks, ihcl = out
            survives(binc.decode_response, _join(chunks), ihcl)


def decode_request_anyhow(body: bytes, ihcl_text: str | None) -> None:
    """What the REST frontend does with a body and its IHCL header."""
    ihcl = survives(binc.parse_ihcl, ihcl_text, len(body))
    if ihcl_text is not None and ihcl is None:
        return  # rejected header
    if ihcl == 0:
        meta = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [-1]}]}
        survives(decode_raw_request, body, "M", "", meta, None, 1 << 20)
        return
    req = survives(binc.decode_request, body, ihcl, "M", "", 1 << 16)
    if req is not None:
        _reencode_request(req)


# --------------------------------------------------------------------------- strategies

JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)  # json.dumps writes NaN/Infinity literals for these anyway
    | st.floats()
    | st.text(max_size=8)
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)

DATATYPES = [dt.value for dt in Datatype]
NAMES = st.sampled_from(["A", "B", "C"])


def _leaf_for(datatype: str) -> st.SearchStrategy[Any]:
    if datatype == "BOOL":
        return st.booleans()
    if datatype == "BYTES":
        return st.text(max_size=6)
    if datatype.startswith(("UINT", "INT")):
        return st.integers(min_value=-(2**64), max_value=2**64)
    return st.floats() | st.integers(min_value=-1000, max_value=1000)


@st.composite
def tensor_objs(draw: st.DrawFn, with_binary: bool) -> tuple[dict[str, Any], bytes]:
    datatype = draw(st.sampled_from([*DATATYPES, "INT33", "bytes"]))
    shape = draw(st.lists(st.integers(min_value=0, max_value=4), max_size=3))
    obj: dict[str, Any] = {"name": draw(NAMES), "datatype": datatype, "shape": shape}
    blob = b""
    if with_binary and draw(st.booleans()):
        blob = draw(st.binary(max_size=40))
        obj["parameters"] = {"binary_data_size": draw(st.sampled_from([len(blob), 0, 3]))}
    else:
        leaf = _leaf_for(datatype if datatype in DATATYPES else "FP32")
        nested = st.recursive(st.lists(leaf, max_size=6), lambda c: st.lists(c, max_size=3))
        obj["data"] = draw(nested)
    return obj, blob


@st.composite
def request_objs(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    parts = draw(st.lists(tensor_objs(with_binary=True), max_size=3))
    obj: dict[str, Any] = {"inputs": [p[0] for p in parts]}
    if draw(st.booleans()):
        obj["id"] = draw(st.text(max_size=5))
    if draw(st.booleans()):
        obj["parameters"] = draw(
            st.dictionaries(
                st.sampled_from(["binary_data_output", "triton_x", "k", "sequence_id"]),
                JSON_LEAF,
                max_size=2,
            )
        )
    if draw(st.booleans()):
        obj["outputs"] = [
            {"name": draw(NAMES), "parameters": {"binary_data": draw(JSON_LEAF)}}
            for _ in range(draw(st.integers(0, 3)))
        ]
    return obj, b"".join(p[1] for p in parts)


@st.composite
def response_objs(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    parts = draw(st.lists(tensor_objs(with_binary=True), max_size=3))
    obj: dict[str, Any] = {
        "model_name": draw(st.text(max_size=4) | JSON_LEAF),
        "model_version": draw(st.sampled_from(["1", 1, None])),
        "outputs": [p[0] for p in parts],
    }
    if draw(st.booleans()):
        obj["id"] = draw(JSON_LEAF)
    if draw(st.booleans()):
        obj["parameters"] = draw(JSON_VALUE)
    return obj, b"".join(p[1] for p in parts)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


@st.composite
def corrupt_tree(draw: st.DrawFn, obj: Any) -> Any:
    """Replace or delete a few random nodes of a JSON tree."""
    for _ in range(draw(st.integers(0, 3))):
        paths = [p for p in _paths(obj) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            parent[path[-1]] = draw(JSON_VALUE)
        else:
            del parent[path[-1]]
    return obj


@st.composite
def corrupt_bytes(draw: st.DrawFn, body: bytes) -> bytes:
    """Flip, insert or cut bytes."""
    data = bytearray(body)
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "insert", "cut", "truncate"]))
        if action == "flip":
            data[pos] = draw(st.integers(0, 255))
        elif action == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif action == "cut":
            del data[pos : pos + draw(st.integers(1, 8))]
        else:
            del data[pos:]
    return bytes(data)


@st.composite
def framed_bodies(
    draw: st.DrawFn, objs: st.SearchStrategy[tuple[dict[str, Any], bytes]]
) -> tuple[bytes, int]:
    obj, blob = draw(objs)
    obj = draw(corrupt_tree(obj))
    head = json.dumps(obj, separators=(",", ":")).encode()
    body = draw(corrupt_bytes(head + blob))
    ihcl = draw(st.sampled_from([len(head), len(body)]) | st.integers(0, len(body) + 4))
    return body, ihcl


# --------------------------------------------------------------------------- requests


@FUZZ
@given(body=st.binary(max_size=300), ihcl=st.none() | st.integers(-3, 400).map(str) | st.text())
def test_decode_request_random_bytes(body: bytes, ihcl: str | None) -> None:
    decode_request_anyhow(body, ihcl)


@FUZZ
@given(framed=framed_bodies(request_objs()), header=st.booleans())
def test_decode_request_corrupted_structure(framed: tuple[bytes, int], header: bool) -> None:
    body, ihcl = framed
    decode_request_anyhow(body, str(ihcl) if header else None)


@FUZZ
@given(obj=request_objs(), data=st.data())
def test_decode_request_valid_structure(obj: tuple[dict[str, Any], bytes], data: Any) -> None:
    # Uncorrupted but random: mostly decodes, sometimes a clean error; never a crash.
    head = json.dumps(obj[0]).encode()
    decode_request_anyhow(head + obj[1], str(len(head)) if data.draw(st.booleans()) else None)


NASTY = [
    b"1" * 5000,  # an integer literal beyond Python's digit limit
    b'{"inputs":[{"name":"X","datatype":"FP64","shape":[2],"data":[NaN,' + b"9" * 400 + b"]}]}",
    b"[" * 5000 + b"]" * 5000,
    b'{"inputs":' + b"[" * 2000 + b"]" * 2000 + b"}",
    b'\xef\xbb\xbf{"inputs":[]}',
    b'{"id":"\\ud800","inputs":[{"name":"X","datatype":"BYTES","shape":[1],"data":["\\udc00"]}]}',
    b'{"inputs":[{"name":"\\ud800","datatype":"INT8","shape":[1],"data":[1]}],"outputs":[]}',
    b'{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1e400]}]}',
    b'{"inputs":[{"name":"X","datatype":"FP16","shape":[2],"data":[-1e400,1e-400]}]}',
    b'{"inputs":[{"name":"X","datatype":"INT64","shape":[2],"data":[1, [2, [3]]]}]}',
    b'{"inputs":[{"name":"X","datatype":"INT64","shape":[3],"data":[1, [[2, 3]], 4]}]}',
    b'{"inputs":[{"name":"X","datatype":"BOOL","shape":[3],"data":[true, [[false]], 1]}]}',
    b'{"inputs":[{"name":"X","datatype":"UINT64","shape":[1],"data":[18446744073709551616]}]}',
    b'{"inputs":[{"name":"X","datatype":"INT8","shape":[' + b"1," * 3000 + b'1],"data":[1]}]}',
    b'{"inputs":[{"name":"X","datatype":"INT8","shape":[4611686018427387904,4],"data":[]}]}',
    b'{"inputs":[{"name":"X","datatype":"INT8","shape":[0,99999999999999999999999],"data":[]}]}',
]


@pytest.mark.parametrize("body", NASTY)
@pytest.mark.parametrize("ihcl", [None, "", "1", "0"])
def test_decode_request_nasty_bodies(body: bytes, ihcl: str | None) -> None:
    decode_request_anyhow(body, ihcl if ihcl != "" else str(len(body)))
    survives(binc.decode_response, body, None)


# --------------------------------------------------------------------------- responses


@FUZZ
@given(body=st.binary(max_size=300), ihcl=st.none() | st.integers(-3, 400))
def test_decode_response_random_bytes(body: bytes, ihcl: int | None) -> None:
    resp = survives(binc.decode_response, body, ihcl)
    if resp is not None:
        _reencode_response(resp)


@FUZZ
@given(framed=framed_bodies(response_objs()), header=st.booleans())
def test_decode_response_corrupted_structure(framed: tuple[bytes, int], header: bool) -> None:
    body, ihcl = framed
    resp = survives(binc.decode_response, body, ihcl if header else None)
    if resp is not None:
        _reencode_response(resp)


# --------------------------------------------------------------------------- the rest


ENCODINGS = st.sampled_from(["gzip", "deflate", "identity", "", "br", "GZIP"]) | st.text(max_size=8)


@FUZZ
@given(body=st.binary(max_size=300), encoding=st.none() | ENCODINGS, limit=st.integers(0, 500))
def test_decompress_random_bytes(body: bytes, encoding: str | None, limit: int) -> None:
    survives(decompress, body, encoding, limit)


@FUZZ
@given(
    payload=st.binary(max_size=300),
    wrapper=st.sampled_from(["gzip", "zlib", "ours-gzip", "ours-deflate"]),
    encoding=st.sampled_from(["gzip", "deflate"]),
    data=st.data(),
)
def test_decompress_corrupted_streams(
    payload: bytes, wrapper: str, encoding: str, data: Any
) -> None:
    stream = {
        "gzip": gzip.compress,
        "zlib": zlib.compress,
        "ours-gzip": lambda p: compress([p], "gzip"),
        "ours-deflate": lambda p: compress([p], "deflate"),
    }[wrapper](payload)
    corrupted = data.draw(corrupt_bytes(stream))
    out = survives(decompress, corrupted, encoding, 1 << 16)
    if corrupted == stream:
        assert out == payload


@FUZZ
@given(
    chunks=st.lists(st.binary(max_size=100), max_size=4),
    encoding=st.sampled_from(["gzip", "deflate"]),
)
def test_compress_decompress_round_trip(chunks: list[bytes], encoding: str) -> None:
    body = compress(list(chunks), encoding)
    assert decompress(body, encoding, 1 << 16) == b"".join(chunks)


@FUZZ
@given(accept=st.text(max_size=40))
def test_choose_encoding_never_fails(accept: str) -> None:
    assert choose_encoding(accept) in (None, "gzip", "deflate")


@FUZZ
@given(body=st.binary(max_size=200))
def test_deserialize_bytes_random(body: bytes) -> None:
    elements = survives(deserialize_bytes, body, "tensor 'T'")
    count = survives(count_bytes_elements, body, "tensor 'T'")
    assert (elements is None) == (count is None)
    if elements is not None:
        assert len(elements) == count
        assert b"".join(len(e).to_bytes(4, "little") + e for e in elements) == body


RAW_META = st.fixed_dictionaries(
    {
        "inputs": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["IN", ""]) | JSON_LEAF,
                    "datatype": st.sampled_from(DATATYPES) | JSON_LEAF,
                    "shape": st.lists(st.integers(-2, 5), max_size=4) | JSON_VALUE,
                }
            )
            | JSON_VALUE,
            max_size=2,
        )
        | JSON_VALUE
    }
) | st.dictionaries(st.text(max_size=6), JSON_VALUE, max_size=3)


@FUZZ
@given(
    body=st.binary(max_size=200),
    metadata=RAW_META,
    max_batch_size=st.none() | st.integers(-1, 8),
    limit=st.integers(0, 300),
)
def test_decode_raw_request_random(
    body: bytes, metadata: dict[str, Any], max_batch_size: int | None, limit: int
) -> None:
    req = survives(decode_raw_request, body, "M", "", metadata, max_batch_size, limit)
    if req is not None:
        (t,) = req.inputs
        assert memoryview(t.data).nbytes >= len(body)
        _reencode_request(req)


@FUZZ
@given(
    value=JSON_VALUE,
    datatype=st.sampled_from(list(Datatype)),
    shape=st.lists(st.integers(0, 4), max_size=3),
)
def test_data_to_buffer_random_values(value: Any, datatype: Datatype, shape: list[int]) -> None:
    survives(data_to_buffer, value, datatype, tuple(shape), "input 'X'")
