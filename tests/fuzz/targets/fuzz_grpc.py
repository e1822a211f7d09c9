"""Fuzz target: gRPC messages (codecs.grpc): a ModelInferRequest's bytes, as grpc.aio hands a
ModelInfer or ModelStreamInfer call to the frontend, to the internal request
(request_from_proto); and a backend's ModelInferResponse to the internal response
(response_from_proto).

Input: a control byte, then the serialized message. Control bit 0: a response instead of a
request. Bytes protobuf cannot parse are refused by grpc itself before any v2proxy code runs
(the call fails with INTERNAL "failed to deserialize"): they end the run.

Invariants: success or a ProxyError; a decoded request encodes for each kind of backend (gRPC,
REST JSON and binary) and for a client's answer; a decoded response encodes for a gRPC and a
REST client, and the gRPC encoding decodes again to the same outputs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, response_encodes, same_tensors, survives, take

with instrumented(__name__ == "__main__"):
    from google.protobuf.message import DecodeError

    from v2proxy._proto import grpc_service_pb2 as pb
    from v2proxy.backends.rest_requests import infer_body
    from v2proxy.codecs import grpc as grpcc
    from v2proxy.core.model import InferResponse

T = TypeVar("T")


def _decoded(message: Any, from_proto: Callable[[Any], T], body: bytes) -> T | None:
    """``body`` parsed as a ``message`` and turned into the internal form; None when protobuf
    cannot parse it (grpc refuses it first) or v2proxy refused it with a ProxyError."""
    try:
        msg = message.FromString(body)
    except DecodeError:
        return None
    return survives(from_proto, msg)


def _request(body: bytes) -> None:
    req = _decoded(pb.ModelInferRequest, grpcc.request_from_proto, body)
    if req is None:
        return
    survives(grpcc.request_to_proto, req)
    for binary in (False, True):
        survives(infer_body, req, binary)
    survives(grpcc.response_to_proto, InferResponse(req.model_name, req.inputs))


def _response(body: bytes) -> None:
    resp = _decoded(pb.ModelInferResponse, grpcc.response_from_proto, body)
    if resp is None:
        return
    out = survives(grpcc.response_to_proto, resp)
    if out is not None:
        again = survives(grpcc.response_from_proto, out)
        expect(again is not None, "an encoded response does not decode again")
        assert again is not None
        same_tensors(resp.outputs, again.outputs, with_bytes=True)
    response_encodes(resp)


def test_one_input(data: bytes) -> None:
    control, body = take(data, 1)
    if control & 1:
        _response(body)
    else:
        _request(body)


if __name__ == "__main__":
    main(test_one_input)
