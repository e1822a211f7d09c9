"""Raw binary requests (``Inference-Header-Content-Length: 0``, docs/protocol.md): shape deduction
and the decoded request, as tables."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from v2proxy.codecs.raw import decode_raw_request, deduce_shape
from v2proxy.core.errors import CodecError, PayloadTooLarge
from v2proxy.core.model import Datatype

FP32, INT8, INT64, BYTES = Datatype.FP32, Datatype.INT8, Datatype.INT64, Datatype.BYTES

# (id, datatype, metadata dims, body bytes, max_batch_size, deduced shape)
DEDUCE: list[tuple[str, Datatype, list[int], int, int | None, tuple[int, ...]]] = [
    # batching known: metadata shows the batch dim as a leading -1, which becomes 1
    ("batching-var", FP32, [-1, -1], 64, 8, (1, 16)),
    ("batching-fixed", FP32, [-1, 16], 64, 8, (1, 16)),
    ("batching-fixed-2d", INT8, [-1, 2, 3], 6, 4, (1, 2, 3)),
    ("batching-var-middle", FP32, [-1, 2, -1], 24, 8, (1, 2, 3)),
    # not batching: the only -1 takes the whole body
    ("no-batching-var", FP32, [-1], 64, 0, (16,)),
    ("no-batching-fixed", FP32, [16], 64, 0, (16,)),
    ("no-batching-var-2d", INT64, [-1, 2], 48, 0, (3, 2)),
    # batching unknown (no /config): one -1 is computed ...
    ("unknown-one-var", FP32, [-1], 64, None, (16,)),
    ("unknown-fixed", FP32, [4, 4], 64, None, (4, 4)),
    # ... and with two -1 dims the leading one is taken as a batch of 1
    ("unknown-two-var", FP32, [-1, -1], 64, None, (1, 16)),
    ("unknown-two-var-3d", INT8, [-1, 2, -1], 10, None, (1, 2, 5)),
    # remainders are left for the size check (integer division)
    ("remainder", FP32, [-1], 66, None, (16,)),
    ("zero-body", FP32, [-1], 0, 0, (0,)),
    ("zero-known-dim", FP32, [-1, 0], 0, None, (0, 0)),
    # BYTES: the whole body is one element
    ("bytes-no-batching", BYTES, [-1], 3, 0, (1,)),
    ("bytes-one", BYTES, [1], 3, 0, (1,)),
    ("bytes-batching", BYTES, [-1, -1], 3, 8, (1, 1)),
    ("bytes-batching-fixed", BYTES, [-1, 1], 3, 8, (1, 1)),
    ("bytes-unknown", BYTES, [-1, 1], 100, None, (1, 1)),
]


@pytest.mark.parametrize(
    ("datatype", "dims", "nbytes", "max_batch_size", "shape"),
    [pytest.param(*row[1:], id=row[0]) for row in DEDUCE],
)
def test_deduce_shape(
    datatype: Datatype,
    dims: list[int],
    nbytes: int,
    max_batch_size: int | None,
    shape: tuple[int, ...],
) -> None:
    assert deduce_shape("IN", datatype, dims, nbytes, max_batch_size) == shape


DEDUCE_ERRORS: list[tuple[str, Datatype, list[int], int | None, str]] = [
    (
        "two-var-no-batching",
        FP32,
        [-1, -1],
        0,
        "The shape of the raw input 'IN' can not be deduced because there are more than one"
        " variable-sized dimension",
    ),
    ("three-var-batching", FP32, [-1, -1, -1], 8, "more than one variable-sized dimension"),
    ("three-var-unknown", FP32, [-1, -1, -1], None, "more than one variable-sized dimension"),
    ("two-var-not-leading", FP32, [2, -1, -1], None, "more than one variable-sized dimension"),
    (
        "bytes-two",
        BYTES,
        [2],
        0,
        "For BYTE datatype raw input 'IN', the model must have input shape [1]",
    ),
    ("bytes-batching-two", BYTES, [-1, 2], 8, "the model must have input shape [1]"),
    ("bytes-1x2", BYTES, [1, 2], None, "the model must have input shape [1]"),
]


@pytest.mark.parametrize(
    ("datatype", "dims", "max_batch_size", "message"),
    [pytest.param(*row[1:], id=row[0]) for row in DEDUCE_ERRORS],
)
def test_deduce_shape_errors(
    datatype: Datatype, dims: list[int], max_batch_size: int | None, message: str
) -> None:
    with pytest.raises(CodecError) as info:
        deduce_shape("IN", datatype, dims, 64, max_batch_size)
    assert message in info.value.message


def _meta(*inputs: tuple[str, str, list[int]]) -> dict[str, Any]:
    return {"name": "M", "inputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in inputs]}


def test_decode_raw_fixed_size_is_a_view() -> None:
    body = struct.pack("<4f", 1, 2, 3, 4)
    req = decode_raw_request(body, "M", "2", _meta(("IN", "FP32", [-1, -1])), 8, 1 << 20)
    assert (req.model_name, req.model_version, req.id) == ("M", "2", None)
    assert req.outputs is None
    assert req.parameters == {"binary_data_output": True}
    (t,) = req.inputs
    assert (t.name, t.datatype, t.shape) == ("IN", FP32, (1, 4))
    assert isinstance(t.data, memoryview)
    assert t.data.obj is body
    assert bytes(t.data) == body


@pytest.mark.parametrize(
    ("dims", "max_batch_size", "shape"),
    [([-1], 0, (1,)), ([1], None, (1,)), ([-1, -1], 8, (1, 1)), ([-1, 1], None, (1, 1))],
)
@pytest.mark.parametrize("body", [b"427", b"", b"\x00\x01\xff"])
def test_decode_raw_bytes_is_one_element(
    dims: list[int], max_batch_size: int | None, shape: tuple[int, ...], body: bytes
) -> None:
    req = decode_raw_request(body, "M", "", _meta(("IN", "BYTES", dims)), max_batch_size, 1024)
    (t,) = req.inputs
    assert (t.datatype, t.shape) == (BYTES, shape)
    assert bytes(t.data) == struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    ("datatype", "dims", "nbytes", "max_batch_size", "expected"),
    [
        ("FP32", [-1], 66, 0, 64),
        ("FP32", [16], 60, 0, 64),
        ("INT64", [-1, -1, 3], 50, 4, 48),
        ("INT64", [-1, 3], 50, 4, 24),
        ("INT64", [2, 2], 0, None, 32),
        ("FP32", [-1, 0], 4, None, 0),
    ],
)
def test_decode_raw_size_mismatch(
    datatype: str, dims: list[int], nbytes: int, max_batch_size: int | None, expected: int
) -> None:
    meta = _meta(("IN", datatype, dims))
    with pytest.raises(CodecError) as info:
        decode_raw_request(b"\0" * nbytes, "M", "", meta, max_batch_size, 1 << 20)
    assert info.value.message == (
        f"input byte size mismatch for input 'IN' for model 'M'. Expected {expected}, got {nbytes}"
    )


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (
            _meta(("A", "FP32", [-1]), ("B", "FP32", [-1])),
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'M'"
            " model configuration",
        ),
        ({"name": "M", "inputs": []}, "model metadata of 'M'"),
        ({"name": "M"}, "model metadata of 'M'"),
        ({"inputs": "x"}, "model metadata of 'M'"),
        ({"inputs": [5]}, "model metadata of 'M'"),
        ({"inputs": [{"name": "A", "datatype": "FP32"}]}, "model metadata of 'M'"),
        ({"inputs": [{"name": "A", "datatype": "FP32", "shape": ["x"]}]}, "model metadata of 'M'"),
        ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [None]}]}, "model metadata of 'M'"),
        ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1.5]}]}, "model metadata of 'M'"),
        ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [-2]}]}, "model metadata of 'M'"),
        ({"inputs": [{"name": "A", "datatype": "FLOAT", "shape": [-1]}]}, "datatype 'FLOAT'"),
    ],
)
def test_decode_raw_metadata_errors(metadata: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_raw_request(b"\0" * 8, "M", "", metadata, None, 1024)
    assert message in info.value.message


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
def test_decode_raw_over_max_size(datatype: str) -> None:
    with pytest.raises(PayloadTooLarge) as info:
        decode_raw_request(b"\0" * 17, "M", "", _meta(("IN", datatype, [-1])), 0, 16)
    assert info.value.message.startswith(
        "Raw input has a byte_size (17 bytes) that exceeds the maximum allowed value of 16 bytes"
    )
    assert info.value.http_status == 400


def test_decode_raw_at_max_size() -> None:
    req = decode_raw_request(b"\0" * 16, "M", "", _meta(("IN", "FP32", [-1])), 0, 16)
    assert req.inputs[0].shape == (4,)
