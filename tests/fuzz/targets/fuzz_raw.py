"""Fuzz target: raw binary /infer bodies (``Inference-Header-Content-Length: 0``,
codecs.raw.decode_raw_request): the one input's shape deduced from the model's metadata.

Input: a control byte, then the body. Control bits 0-3 pick the model metadata (the builtin
models' and a few odd ones: two variable dims, zero dims, BYTES of more than one element), bits
4-5 its max_batch_size (None, 0, 1, 8), bit 6 a small --max-input-size. Bit 7: the metadata is
itself in the input (a length byte, then that many bytes of JSON; a backend's metadata is not
trusted either), the body after it.

Invariants: success or a ProxyError; a decoded request's one tensor holds exactly its shape's
bytes (BYTES: one element, the body) and encodes for a backend.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, survives, take

with instrumented(__name__ == "__main__"):
    from v2proxy.backends.rest_requests import infer_body
    from v2proxy.codecs.dtypes import ITEM_SIZE, deserialize_bytes
    from v2proxy.codecs.json import loads
    from v2proxy.codecs.raw import decode_raw_request
    from v2proxy.core.errors import ProxyError
    from v2proxy.core.model import Datatype, element_count
    from v2proxy.reference.models import MODELS


def _one(datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "IN", "datatype": datatype, "shape": shape}]}


METADATA: list[dict[str, Any]] = [m.metadata() for m in MODELS.values()] + [
    _one("FP32", [-1, -1]),
    _one("INT8", [-1, -1, 4]),
    _one("FP16", [0, -1]),
    _one("BYTES", [2, -1]),
    _one("BF16", [-1]),
    _one("UINT64", [3, 0]),
    _one("FP64", []),
    {"inputs": []},
    {"name": "no inputs"},
    {"inputs": [{"name": "A", "datatype": "FP32", "shape": [-2]}]},
]
BATCH = (None, 0, 1, 8)


def test_one_input(data: bytes) -> None:
    control, body = take(data, 1)
    metadata: Any = METADATA[(control & 15) % len(METADATA)]
    if control & 128:
        length, rest = take(body, 1)
        try:
            metadata = loads(rest[:length], "metadata")
        except ProxyError:
            return
        if not isinstance(metadata, dict):
            return  # the pipeline takes a model's metadata only as a JSON object
        body = rest[length:]
    batch = BATCH[(control >> 4) & 3]
    limit = 64 if control & 64 else 1 << 20
    req = survives(decode_raw_request, body, "m", "", metadata, batch, limit)
    if req is None:
        return
    (tensor,) = req.inputs
    if tensor.datatype is Datatype.BYTES:
        expect(deserialize_bytes(tensor.data) == [body], "BYTES raw input is not the body")
    else:
        size = element_count(tensor.shape) * ITEM_SIZE[tensor.datatype]
        expect(size == len(body), f"shape {tensor.shape} does not hold {len(body)} bytes")
    infer_body(req, True)


if __name__ == "__main__":
    main(test_one_input)
