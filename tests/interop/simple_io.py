"""The ``simple`` model (Triton's example, served by the builtin models and every peer) through
tritonclient: the two INT32 [1, 16] inputs the interop tests send (``IN0``, ``IN1``), as HTTP or
gRPC ``InferInput`` lists, and the check of its answer (OUTPUT0 = IN0 + IN1, OUTPUT1 = IN0 - IN1,
each INT32 [1, 16], element by element)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.full((1, 16), 3, dtype=np.int32)


def http_inputs(binary0: bool = False, binary1: bool | None = None) -> list[httpclient.InferInput]:
    """INPUT0 and INPUT1 for tritonclient.http, each as a binary tensor or as JSON data
    (``binary1``: as INPUT0 when not given)."""
    a = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    a.set_data_from_numpy(IN0, binary_data=binary0)
    b = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    b.set_data_from_numpy(IN1, binary_data=binary0 if binary1 is None else binary1)
    return [a, b]


def grpc_inputs() -> list[grpcclient.InferInput]:
    """INPUT0 and INPUT1 for tritonclient.grpc."""
    a = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    a.set_data_from_numpy(IN0)
    b = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    b.set_data_from_numpy(IN1)
    return [a, b]


def assert_simple(result: Any) -> None:
    """``result`` (an HTTP or gRPC InferResult) is simple's answer to ``IN0`` and ``IN1``."""
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.dtype == np.int32 and out0.shape == (1, 16)
    assert out1.dtype == np.int32 and out1.shape == (1, 16)
    assert out0.tolist() == (IN0 + IN1).tolist()
    assert out1.tolist() == (IN0 - IN1).tolist()
