"""``codecs.answer_heads.AnswerHeads``: a backend's binary-framed answer whose JSON header was
decoded before decodes to what the full decoder makes of it; any other answer, and a known
header with a binary section of another length, take the full decoder (and its messages)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from v2proxy.codecs.answer_heads import MAX_HEAD, AnswerHeads
from v2proxy.codecs.binary import decode_response
from v2proxy.core.errors import CodecError


def _output(name: str, size: int, **params: Any) -> dict[str, Any]:
    shape = [1, size // 4]
    return {
        "name": name,
        "datatype": "INT32",
        "shape": shape,
        "parameters": {"binary_data_size": size, **params},
    }


def _answer(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, int]:
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b"".join(blobs), len(head)


SIMPLE = {
    "model_name": "simple",
    "model_version": "1",
    "outputs": [_output("OUTPUT0", 64), _output("OUTPUT1", 64)],
}
BLOBS = (struct.pack("<16i", *range(16)), struct.pack("<16i", *range(-16, 0)))


def test_a_known_header_decodes_as_the_full_decoder_does() -> None:
    heads = AnswerHeads()
    body, ihcl = _answer(SIMPLE, *BLOBS)
    first = decode_response(body, ihcl, heads)
    assert heads.decode(body, ihcl) is not None  # learnt
    other = bytearray(_answer(SIMPLE, *reversed(BLOBS))[0])
    again = decode_response(other, ihcl, heads)
    assert again == decode_response(other, ihcl)
    assert again != first
    assert bytes(again.outputs[0].data) == BLOBS[1]
    assert again.outputs[0].parameters is not first.outputs[0].parameters
    assert again.parameters is not first.parameters


@pytest.mark.parametrize(
    ("blobs", "message"),
    [
        ((BLOBS[0],), "unexpected size for input 'OUTPUT1', expecting 64 additional bytes"),
        ((*BLOBS, b"x"), "unexpected additional input data for model 'simple'"),
    ],
)
def test_a_section_of_another_length_takes_the_full_decoder(
    blobs: tuple[bytes, ...], message: str
) -> None:
    heads = AnswerHeads()
    body, ihcl = _answer(SIMPLE, *BLOBS)
    decode_response(body, ihcl, heads)
    body, ihcl = _answer(SIMPLE, *blobs)
    assert heads.decode(body, ihcl) is None
    with pytest.raises(CodecError, match=message):
        decode_response(body, ihcl, heads)


@pytest.mark.parametrize(
    "header",
    [
        dict(SIMPLE, id="r1"),
        dict(SIMPLE, parameters={"sequence_id": 3}),
        dict(SIMPLE, outputs=[_output("OUTPUT0", 64, other=1), _output("OUTPUT1", 64)]),
        dict(
            SIMPLE,
            outputs=[
                _output("OUTPUT0", 64),
                {"name": "OUTPUT1", "datatype": "INT32", "shape": [1], "data": [7]},
            ],
        ),
        dict(SIMPLE, model_name="m" * MAX_HEAD),
    ],
    ids=["id", "parameters", "output parameters", "data inline", "long"],
)
def test_answers_with_anything_of_their_own_are_not_kept(header: dict[str, Any]) -> None:
    heads = AnswerHeads()
    blobs = BLOBS if len(header["outputs"][1].get("parameters", {})) else BLOBS[:1]
    body, ihcl = _answer(header, *blobs)
    first = decode_response(body, ihcl, heads)
    assert heads.decode(body, ihcl) is None
    assert decode_response(body, ihcl, heads) == first


def test_at_most_kept_the_oldest_forgotten_first() -> None:
    heads = AnswerHeads()
    bodies = [_answer(dict(SIMPLE, model_version=str(i)), *BLOBS) for i in range(heads.KEPT + 1)]
    for body, ihcl in bodies:
        decode_response(body, ihcl, heads)
    assert heads.decode(*bodies[0]) is None
    assert all(heads.decode(*b) is not None for b in bodies[1:])
