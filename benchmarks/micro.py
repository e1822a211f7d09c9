"""Codec micro-benchmarks: v2proxy's codecs against the obvious alternative, in one process.

    .venv/bin/python benchmarks/micro.py [--quick] [--json]

Each case times v2proxy's function and the alternative on the same input (best of N runs,
``time.perf_counter``, garbage collected before each run) and reports the speedup
(alternative time / v2proxy time: above 1 means v2proxy is faster). v2proxy's result is checked
against the expected values once, so a fast but wrong codec shows as an error, not a win. A
case whose v2proxy function fails (the code changes under us) is reported with its error; the
other cases still run. ``--json`` prints one JSON document (what run.py reads); otherwise a
table.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import orjson

N_ELEMENTS = 1_000_000
SPLIT_BYTES = 64 * 1024 * 1024
PROTO_BYTES = 4 * 1024 * 1024


@dataclass
class Case:
    name: str
    v2proxy: str
    alternative: str
    v2proxy_ms: float | None = None
    alternative_ms: float | None = None
    speedup: float | None = None
    error: str | None = None


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    """Best wall time of ``repeat`` calls, in milliseconds."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def _json_request(datatype: str, values: np.ndarray) -> bytes:
    """A v2 JSON request as a Python client writes it (floats widened to doubles)."""
    data = values.astype(np.float64) if values.dtype.kind == "f" else values
    obj = {
        "inputs": [
            {"name": "INPUT0", "datatype": datatype, "shape": [values.size], "data": data},
        ]
    }
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def _run(case: Case, ours: Callable[[], Any], alt: Callable[[], Any], repeat: int) -> Case:
    try:
        case.v2proxy_ms = best_of(ours, repeat)
    except Exception as exc:
        case.error = f"v2proxy: {type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    case.alternative_ms = best_of(alt, repeat)
    if case.v2proxy_ms and case.alternative_ms:
        case.speedup = case.alternative_ms / case.v2proxy_ms
    return case


def _verify(case: Case, check: Callable[[], bool]) -> bool:
    try:
        if check():
            return True
        case.error = "v2proxy's result differs from the expected values"
    except Exception as exc:
        case.error = f"v2proxy: {type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    return False


def json_decode_cases(repeat: int) -> list[Case]:
    from v2proxy.codecs import binary as codec

    rng = np.random.default_rng(1)
    inputs = {
        "FP32": (rng.random(N_ELEMENTS, dtype=np.float32), np.float32),
        "INT32": (
            rng.integers(-(2**31), 2**31 - 1, N_ELEMENTS, dtype=np.int32, endpoint=True),
            np.int32,
        ),
    }
    cases = []
    for datatype, (values, npdt) in inputs.items():
        body = _json_request(datatype, values)
        case = Case(
            f"JSON decode 1M {datatype} ({len(body) / 1e6:.1f} MB)",
            "codecs.binary.decode_request + numpy view",
            "np.array(orjson.loads(body)[...]['data'], dtype)",
        )

        def ours(body: bytes = body, npdt: Any = npdt) -> np.ndarray:
            req = codec.decode_request(body, None, "m")
            return np.frombuffer(req.inputs[0].data, dtype=npdt)

        def alt(body: bytes = body, npdt: Any = npdt) -> np.ndarray:
            return np.array(orjson.loads(body)["inputs"][0]["data"], dtype=npdt)

        if _verify(case, lambda ours=ours, values=values: np.array_equal(ours(), values)):
            _run(case, ours, alt, repeat)
        cases.append(case)
    return cases


def json_encode_cases(repeat: int) -> list[Case]:
    from v2proxy.codecs import binary as codec
    from v2proxy.core.model import Datatype, InferResponse, Tensor

    rng = np.random.default_rng(2)
    inputs = {
        Datatype.FP32: rng.random(N_ELEMENTS, dtype=np.float32),
        Datatype.INT32: rng.integers(-(2**31), 2**31 - 1, N_ELEMENTS, dtype=np.int32),
    }
    cases = []
    for datatype, values in inputs.items():
        resp = InferResponse("m", [Tensor("OUTPUT0", datatype, (values.size,), values.tobytes())])
        case = Case(
            f"JSON encode 1M {datatype.value}",
            "codecs.binary.encode_response (JSON output)",
            "orjson.dumps(array, OPT_SERIALIZE_NUMPY)",
        )

        def ours(resp: InferResponse = resp) -> Any:
            return codec.encode_response(resp, lambda _t: False)

        def alt(values: np.ndarray = values) -> bytes:
            return orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)

        def check(ours: Callable[[], Any] = ours, values: np.ndarray = values) -> bool:
            chunks, ihcl = ours()
            obj = orjson.loads(b"".join(bytes(c) for c in chunks))
            got = np.array(obj["outputs"][0]["data"], dtype=np.float64)
            return ihcl is None and np.array_equal(got.astype(values.dtype), values)

        if _verify(case, check):
            _run(case, ours, alt, repeat)
        cases.append(case)
    return cases


def binary_cases(repeat: int) -> list[Case]:
    from v2proxy.codecs import binary as codec
    from v2proxy.core.model import Datatype, InferResponse, Tensor

    blob = np.random.default_rng(3).bytes(SPLIT_BYTES)
    count = SPLIT_BYTES // 4
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [count],
                    "parameters": {"binary_data_size": SPLIT_BYTES},
                }
            ]
        }
    )
    body = header + blob
    ihcl = len(header)
    split = Case(
        "binary split 64 MiB request",
        "codecs.binary.decode_request (views into the body)",
        "orjson.loads(header) + bytes slice (a copy)",
    )

    def split_ours() -> Any:
        return codec.decode_request(body, ihcl, "m").inputs[0].data

    def split_alt() -> bytes:
        obj = orjson.loads(body[:ihcl])
        size = obj["inputs"][0]["parameters"]["binary_data_size"]
        return body[ihcl : ihcl + size]

    if _verify(split, lambda: bytes(split_ours()) == blob):
        _run(split, split_ours, split_alt, repeat)

    out = memoryview(blob)
    resp = InferResponse("m", [Tensor("OUTPUT0", Datatype.FP32, (count,), out)])
    join = Case(
        "binary join 64 MiB response",
        "codecs.binary.encode_response (header + buffer list)",
        "b''.join([orjson.dumps(header), data])",
    )

    def join_ours() -> Any:
        return codec.encode_response(resp, lambda _t: True)

    out_header = {
        "model_name": "m",
        "model_version": "",
        "outputs": [
            {
                "name": "OUTPUT0",
                "datatype": "FP32",
                "shape": [count],
                "parameters": {"binary_data_size": SPLIT_BYTES},
            }
        ],
    }

    def join_alt() -> bytes:
        return b"".join([orjson.dumps(out_header), out])

    def join_check() -> bool:
        chunks, n = join_ours()
        whole = b"".join(bytes(c) for c in chunks)
        return n is not None and whole[n:] == blob

    if _verify(join, join_check):
        _run(join, join_ours, join_alt, repeat)
    return [split, join]


def proto_cases(repeat: int) -> list[Case]:
    from tritonclient.grpc import service_pb2 as tpb

    from v2proxy._proto import grpc_service_pb2 as vpb
    from v2proxy.codecs import grpc as gcodec
    from v2proxy.core.model import Datatype, InferResponse, Tensor

    values = np.random.default_rng(4).random(PROTO_BYTES // 4, dtype=np.float32)
    msg = tpb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[values.size])
    msg.raw_input_contents.append(values.tobytes())
    wire = msg.SerializeToString()

    parse = Case(
        "protobuf parse 4 MiB ModelInferRequest",
        "ModelInferRequest.FromString + codecs.grpc.request_from_proto",
        "tritonclient service_pb2 FromString + np.frombuffer",
    )

    def parse_ours() -> Any:
        return gcodec.request_from_proto(vpb.ModelInferRequest.FromString(wire))

    def parse_alt() -> np.ndarray:
        m = tpb.ModelInferRequest.FromString(wire)
        return np.frombuffer(m.raw_input_contents[0], dtype=np.float32)

    if _verify(parse, lambda: bytes(parse_ours().inputs[0].data) == values.tobytes()):
        _run(parse, parse_ours, parse_alt, repeat)

    resp = InferResponse("m", [Tensor("OUTPUT0", Datatype.FP32, (values.size,), values.tobytes())])
    serialize = Case(
        "protobuf serialize 4 MiB ModelInferResponse",
        "codecs.grpc.response_to_proto + SerializeToString",
        "tritonclient service_pb2 ModelInferResponse + SerializeToString",
    )

    def ser_ours() -> bytes:
        return bytes(gcodec.response_to_proto(resp).SerializeToString())

    def ser_alt() -> bytes:
        m = tpb.ModelInferResponse(model_name="m")
        m.outputs.add(name="OUTPUT0", datatype="FP32", shape=[values.size])
        m.raw_output_contents.append(values.tobytes())
        return bytes(m.SerializeToString())

    def ser_check() -> bool:
        back = tpb.ModelInferResponse.FromString(ser_ours())
        return back.raw_output_contents[0] == values.tobytes()

    if _verify(serialize, ser_check):
        _run(serialize, ser_ours, ser_alt, repeat)
    return [parse, serialize]


def run_all(quick: bool) -> dict[str, Any]:
    repeat = 3 if quick else 10
    cases: list[Case] = []
    for group in (json_decode_cases, json_encode_cases, binary_cases, proto_cases):
        try:
            cases.extend(group(repeat))
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            cases.append(Case(group.__name__, "", "", error=f"{type(exc).__name__}: {exc}"))
    return {"repeat": repeat, "cases": [asdict(c) for c in cases]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="best of 3 instead of best of 10")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args()
    result = run_all(args.quick)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'case':46} {'v2proxy ms':>11} {'alt ms':>9} {'speedup':>8}")
    for c in result["cases"]:
        ours = "-" if c["v2proxy_ms"] is None else f"{c['v2proxy_ms']:.2f}"
        alt = "-" if c["alternative_ms"] is None else f"{c['alternative_ms']:.2f}"
        speed = "-" if c["speedup"] is None else f"{c['speedup']:.2f}x"
        print(f"{c['name']:46} {ours:>11} {alt:>9} {speed:>8}  {c['error'] or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
