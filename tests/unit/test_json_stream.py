"""codecs.json_stream.StreamCheck: the check of a JSON request body fed in pieces as it arrives.

Its one promise: when it says "valid" (``finish`` returns a request), the full decoder
(``codecs.binary.decode_request``) accepts the same body and reads the same request from it
(less the tensors' bytes); whenever the full decoder refuses a body, the check does not say
"valid" (it answers None and leaves the verdict, and the message, to the full decoder). Bodies
are fed in every kind of slicing, with pieces made small so that cuts fall everywhere.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from v2proxy.codecs import binary as binc
from v2proxy.codecs import json_stream
from v2proxy.core.errors import CodecError, PayloadTooLarge
from v2proxy.core.model import Datatype, InferRequest

MODEL = "identity_fp32"
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of a few bytes, so that small bodies are cut at many commas."""
    monkeypatch.setattr(json_stream, "PIECE_SIZE", 8)


def check(body: bytes, sizes: list[int] | None = None, limit: int = 1 << 26) -> InferRequest | None:
    """Feed ``body`` in slices of the given sizes (cycled), then finish."""
    sc = json_stream.StreamCheck(MODEL, "", limit)
    sizes = sizes or [len(body) or 1]
    pos, i = 0, 0
    while pos < len(body):
        n = max(1, sizes[i % len(sizes)])
        sc.feed(body[pos : pos + n])
        pos, i = pos + n, i + 1
    return sc.finish()


def meta(req: InferRequest) -> Any:
    outputs = None if req.outputs is None else [(o.name, o.parameters) for o in req.outputs]
    inputs = [(t.name, t.datatype, t.shape, t.parameters) for t in req.inputs]
    return req.id, req.parameters, outputs, inputs, req.model_name, req.model_version


def full(body: bytes, limit: int = 1 << 26) -> InferRequest | Exception:
    try:
        return binc.decode_request(body, None, MODEL, "", limit)
    except (CodecError, PayloadTooLarge) as exc:
        return exc


def agree(body: bytes, sizes: list[int] | None = None, limit: int = 1 << 26) -> InferRequest | None:
    """The promise, for one body and one slicing; the check's verdict."""
    verdict = check(body, sizes, limit)
    reference = full(body, limit)
    if verdict is not None:
        assert isinstance(reference, InferRequest), f"check said valid, decoder: {reference}"
        assert meta(verdict) == meta(reference)
    return verdict


def body_of(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def tensor(name: str, datatype: str, data: Any, shape: list[int] | None = None) -> dict[str, Any]:
    shape = shape if shape is not None else [len(data)]
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


SLICINGS = [None, [1], [2, 3], [7], [64], [1, 100, 5]]

VALID = [
    body_of({"inputs": [tensor("INPUT0", "FP32", [0.5, -1.25, 3, 1e-45, 3.4e38])]}),
    body_of({"inputs": [tensor("A", "INT32", [-(2**31), 0, 2**31 - 1])]}),
    body_of({"inputs": [tensor("A", "INT8", [-128, 127]), tensor("B", "UINT8", [0, 255])]}),
    body_of({"inputs": [tensor("A", "UINT64", [0, 2**64 - 1]), tensor("B", "INT64", [-(2**63)])]}),
    body_of({"inputs": [tensor("A", "FP64", [0.1, -2, 1.7976931348623157e308, 5e-324])]}),
    body_of({"inputs": [tensor("A", "UINT16", [0, 65535]), tensor("B", "INT16", [-32768])]}),
    body_of({"inputs": [tensor("A", "FP32", [1.0, 2.0, 3.0, 4.0], [2, 2])]}),
    body_of({"inputs": [tensor("A", "FP32", [], [0])]}),
    # Triton does not look at the data of a zero-element tensor
    body_of({"inputs": [tensor("A", "FP32", [1, 2, 3], [0])]}),
    body_of(
        {
            "id": "r-1",
            "parameters": {"priority": 2, "note": 'a "quoted", [bracketed] {note}'},
            "inputs": [
                {
                    "name": 'IN"0',
                    "shape": [3],
                    "datatype": "FP32",
                    "parameters": {"x": [1, 2]},
                    "data": [1, 2, 3],
                },
                tensor("IN1", "INT32", [7]),
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
        }
    ),
    b'\n { "inputs" : [ { "name" : "A" , "datatype" : "FP32" , "shape" : [ 3 ] ,'
    b' "data" : [ 1.5 ,\n 2 , -3e2 ] } ] } \n\n',
    b'{"inputs":[{"name":"A\\u0000","datatype":"FP32","shape":[1],"data":[1]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[ ]}]}',  # count mismatch
]


@pytest.mark.parametrize("sizes", SLICINGS)
@pytest.mark.parametrize("body", VALID)
def test_valid_bodies_agree(body: bytes, sizes: list[int] | None) -> None:
    agree(body, sizes)


def test_common_bodies_are_decided_here() -> None:
    """The usual big request (datatype before flat numeric data) is decided without the full
    decoder, and its tensors carry no bytes."""
    data = np.random.default_rng(1).random(1000).astype(np.float64).tolist()
    body = body_of({"inputs": [tensor("INPUT0", "FP32", data)]})
    for sizes in SLICINGS:
        req = agree(body, sizes)
        assert req is not None
        assert req.inputs[0].shape == (1000,)
        assert bytes(req.inputs[0].data) == b""
    for body in VALID[:-1]:
        assert check(body) is not None, body


UNDECIDED = [
    # valid, but left to the full decoder
    b'{"inputs":[{"name":"A","shape":[2],"data":[1,2],"datatype":"FP32"}]}',  # datatype last
    body_of({"inputs": [tensor("A", "FP32", [[1, 2], [3, 4]], [2, 2])]}),  # nested
    body_of({"inputs": [tensor("A", "BOOL", [True, False])]}),
    body_of({"inputs": [tensor("A", "BYTES", ["x", "y"])]}),
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[NaN,Infinity]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1e400,-1e400]}]}',
    # invalid: the full decoder names the fault
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[3],"data":[1,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2,]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[,1,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1 2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,"2"]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,"a]b"]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,true]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,null]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,{"a":1}]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,01]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,1.]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,-]}]}',
    b'{"inputs":[{"name":"A","datatype":"INT32","shape":[2],"data":[1,2.5]}]}',
    b'{"inputs":[{"name":"A","datatype":"INT32","shape":[2],"data":[1,2147483648]}]}',
    b'{"inputs":[{"name":"A","datatype":"INT8","shape":[2],"data":[1,-129]}]}',
    b'{"inputs":[{"name":"A","datatype":"UINT8","shape":[2],"data":[1,-1]}]}',
    b'{"inputs":[{"name":"A","datatype":"UINT64","shape":[1],"data":[18446744073709551616]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP33","shape":[2],"data":[1,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[-2],"data":[1,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","data":[1,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]}]',  # unfinished
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]}]}}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]}]} x',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]},]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]}],}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2],}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32" "shape":[2],"data":[1,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data" [1,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]},'
    b'{"name":"A","datatype":"FP32","shape":[1],"data":[3]}]}',  # the same name twice
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2],"data":[1,2]}]}',
    b'{"inputs":[{"name":"A","datatype":"INT32","datatype":"FP32","shape":[1],"data":[1.5]}]}',
    b'{"inputs":[],"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2],'
    b'"parameters":{"binary_data_size":8}}]}',
    b'{"parameters":{"triton_x":1},"inputs":[{"name":"A","datatype":"FP32","shape":[1],'
    b'"data":[1]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1]}],"outputs":[{"x":1}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1]}],"id":5}',
    b'["inputs"]',
    b"[1,2,3]",
    b"",
    b"   ",
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1]}]}\x00',
    b'\xef\xbb\xbf{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":[1]}]}',
    b'{"inputs":[{"name":"A\\x","datatype":"FP32","shape":[1],"data":[1]}]}',
    b'{"inputs":[{"name":"A\xff","datatype":"FP32","shape":[1],"data":[1]}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":5}]}',
    b'{"inputs":[{"name":"A","datatype":"FP32","shape":[1],"data":"1"}]}',
]


@pytest.mark.parametrize("sizes", SLICINGS)
@pytest.mark.parametrize("body", UNDECIDED)
def test_other_bodies_left_to_the_full_decoder(body: bytes, sizes: list[int] | None) -> None:
    """Nothing unusual is decided here: the check answers None, whatever the decoder says."""
    agree(body, sizes)
    assert check(body, sizes) is None


def test_size_limits() -> None:
    """--max-input-size bounds the JSON text and each tensor's bytes, as in the decoder."""
    body = body_of({"inputs": [tensor("A", "FP64", [0.123456] * 100)]})
    assert len(body) > 800
    assert agree(body, limit=len(body) - 1) is None
    assert agree(body, limit=len(body)) is not None
    body = body_of({"inputs": [tensor("A", "FP64", [1] * 100)]})
    assert len(body) < 700
    assert agree(body, limit=799) is None
    assert agree(body, limit=800) is not None


def test_oversized_skeleton_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "SKELETON_LIMIT", 64)
    body = body_of({"parameters": {"x": "y" * 100}, "inputs": [tensor("A", "FP32", [1])]})
    assert agree(body, [5]) is None


@SETTINGS
@given(
    base=st.sampled_from(VALID[:3] + UNDECIDED[:3]),
    edits=st.lists(
        st.tuples(
            st.integers(0, 10_000),
            st.sampled_from(["delete", "insert", "replace"]),
            st.sampled_from([*b'[]{},:"\\ 0123456789.-+eEtrunfalsNIyx\n\xff']),
        ),
        min_size=1,
        max_size=3,
    ),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4),
)
def test_mutated_bodies_never_pass_wrongly(
    base: bytes, edits: list[tuple[int, str, int]], sizes: list[int]
) -> None:
    body = bytearray(base)
    for where, how, byte in edits:
        at = where % (len(body) + 1)
        if how == "insert":
            body[at:at] = bytes([byte])
        elif at < len(body):
            body[at : at + 1] = b"" if how == "delete" else bytes([byte])
    agree(bytes(body), sizes)


@SETTINGS
@given(
    datatype=st.sampled_from([Datatype.FP32, Datatype.INT32, Datatype.UINT8, Datatype.FP64]),
    values=st.lists(st.integers(-300, 300) | st.floats(-1e6, 1e6), max_size=30),
    count=st.integers(0, 32),
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=4),
    blank=st.sampled_from(["", " ", "\n\t"]),
)
def test_number_arrays(
    datatype: Datatype, values: list[float], count: int, sizes: list[int], blank: str
) -> None:
    """Arrays of numbers of any kind and length against any shape: the check agrees, and
    decides every valid one."""
    data = blank + ("," + blank).join(json.dumps(v) for v in values) + blank
    body = (
        f'{{"inputs":[{{"name":"A","datatype":"{datatype.value}","shape":[{count}],'
        f'"data":[{data}]}}]}}'
    ).encode()
    verdict = agree(body, sizes)
    if isinstance(full(body), InferRequest) and count == len(values):
        assert verdict is not None


# A long token or a run of blanks arriving in small pieces (found by fuzzing, tests/fuzz: the
# check kept an unfinished token and its leading blanks, and scanned them again from the start
# with every piece: a 256 KiB string in 100-byte pieces held the event loop for ~35 s).

SLOW_BODY = b'{"inputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]}]}'


def _feed_watching(body: bytes, piece: int) -> tuple[InferRequest | None, int]:
    """The verdict on ``body`` fed in pieces, and the most bytes the check ever kept pending."""
    sc = json_stream.StreamCheck(MODEL, "", 1 << 26)
    most = 0
    for i in range(0, len(body), piece):
        sc.feed(body[i : i + piece])
        most = max(most, len(sc._pending))
    return sc.finish(), most


def test_blanks_between_tokens_are_not_kept() -> None:
    body = b" " * 300_000 + SLOW_BODY.replace(b",", b"  ,\n\t")
    verdict, most = _feed_watching(body, 100)
    assert most < 100  # blanks never accumulate: each piece is scanned once
    assert verdict is not None
    assert meta(verdict) == meta(binc.decode_request(body, None, MODEL, "", 1 << 26))


@pytest.mark.parametrize(
    "token", [b'"' + b"a" * 300_000 + b'"', b'"' + b'\\"' * 150_000 + b'"', b"1" * 300_000]
)
def test_long_token_in_small_pieces_gives_up(token: bytes) -> None:
    body = b'{"id":' + token + b"," + SLOW_BODY[1:]
    verdict, most = _feed_watching(body, 100)
    assert verdict is None  # undecided: the full decoder decides
    assert most <= (json_stream.MAX_CARRIED + 2) * 100  # never rescanned past a few pieces
    assert isinstance(full(body), Exception if token.startswith(b"1") else InferRequest)


@pytest.mark.parametrize("piece", [1, 4, 13, 64])
def test_blanks_still_separate_tokens(piece: int) -> None:
    """Found by fuzzing the fix above: blanks dropped between two pieces of a literal made
    'fal', blanks, 'se' read as 'false'. The full decoder refuses it, so must the check."""
    body = (
        SLOW_BODY[:-2]
        + b',"outputs":[{"name":"B","parameters":{"binary_data":fal'
        + (b"\n" * 50 + b"se}}]}")
    )
    assert isinstance(full(body), CodecError)
    assert _feed_watching(body, piece)[0] is None


def test_token_over_a_few_pieces_still_checked() -> None:
    body = b'{"id":"' + b"x" * 500 + b'",' + SLOW_BODY[1:]
    verdict, _ = _feed_watching(body, 100)
    assert verdict is not None and verdict.id == "x" * 500
