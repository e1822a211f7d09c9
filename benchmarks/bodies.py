"""Request bodies of the benchmark, pre-built into files, and the checks of their answers.

Every body is written once into the run's temporary folder; the load generators send that
file's bytes unchanged, and the correctness gate sends the same bytes once with Python and
checks the answer against what the model must return (``simple``: sum and difference;
``identity_fp32``: the input, bit for bit). Answers are parsed with tritonclient and orjson,
never with v2proxy's own codecs, so the gate does not trust the system under test.
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

IHCL = "Inference-Header-Content-Length"
GRPC_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
GRPC_HEADERS = {"content-type": "application/grpc", "te": "trailers"}

#: an answer check: (status, lower-cased headers, body) -> None when right, else what is wrong
Check = Callable[[int, dict[str, str], bytes], str | None]

SIMPLE_IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_IN1 = np.full((1, 16), 3, dtype=np.int32)
SIMPLE_SUM = SIMPLE_IN0 + SIMPLE_IN1
SIMPLE_DIFF = SIMPLE_IN0 - SIMPLE_IN1


@dataclass
class Body:
    """One REST request: a body file, its headers, the model, and the check of the answer."""

    key: str
    model: str
    path: Path
    headers: dict[str, str]
    check: Check
    size: int = 0
    description: str = ""

    @property
    def url_path(self) -> str:
        return f"/v2/models/{self.model}/infer"


@dataclass
class GrpcBody:
    """One gRPC ModelInfer request: the serialized message, and the same message framed as a
    gRPC length-prefixed message in a file for h2load."""

    key: str
    model: str
    path: Path
    message: bytes
    check: Callable[[bytes], str | None]  # serialized ModelInferResponse -> error or None
    size: int = 0
    description: str = ""
    headers: dict[str, str] = field(default_factory=lambda: dict(GRPC_HEADERS))


def _json_header(obj: dict[str, object]) -> bytes:
    return orjson.dumps(obj)


def _split_answer(headers: dict[str, str], body: bytes) -> tuple[dict[str, object], memoryview]:
    """The JSON header of an answer and its binary section (empty for plain JSON)."""
    mv = memoryview(body)
    ihcl = headers.get(IHCL.lower())
    n = len(body) if ihcl is None else int(ihcl)
    return orjson.loads(mv[:n]), mv[n:]


def _status_problem(status: int, body: bytes) -> str | None:
    if status == 200:
        return None
    return f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}"


def _outputs_by_name(obj: dict[str, object]) -> dict[str, dict[str, object]]:
    outs = obj.get("outputs")
    if not isinstance(outs, list):
        raise ValueError("answer has no 'outputs' list")
    return {o["name"]: o for o in outs}


def _check_simple_json(status: int, headers: dict[str, str], body: bytes) -> str | None:
    if (problem := _status_problem(status, body)) is not None:
        return problem
    try:
        outs = _outputs_by_name(orjson.loads(body))
        got0 = np.array(outs["OUTPUT0"]["data"], dtype=np.int64).reshape(SIMPLE_SUM.shape)
        got1 = np.array(outs["OUTPUT1"]["data"], dtype=np.int64).reshape(SIMPLE_DIFF.shape)
    except (ValueError, KeyError, TypeError) as exc:
        return f"unexpected JSON answer ({exc}): {body[:200]!r}"
    if not (np.array_equal(got0, SIMPLE_SUM) and np.array_equal(got1, SIMPLE_DIFF)):
        return f"wrong values: {body[:200]!r}"
    return None


def _check_simple_binary(status: int, headers: dict[str, str], body: bytes) -> str | None:
    if (problem := _status_problem(status, body)) is not None:
        return problem
    if IHCL.lower() not in headers:
        return "answer has no Inference-Header-Content-Length (binary outputs were asked for)"
    try:
        import tritonclient.http as httpclient

        result = httpclient.InferenceServerClient.parse_response_body(
            body, header_length=int(headers[IHCL.lower()])
        )
        got0 = result.as_numpy("OUTPUT0")
        got1 = result.as_numpy("OUTPUT1")
    except Exception as exc:
        return f"unparseable binary answer: {exc}"
    if got0 is None or got1 is None:
        return "answer lacks OUTPUT0 or OUTPUT1"
    if not (np.array_equal(got0, SIMPLE_SUM) and np.array_equal(got1, SIMPLE_DIFF)):
        return "wrong values in the binary answer"
    return None


def _identity_json_check(expected: np.ndarray) -> Check:
    def check(status: int, headers: dict[str, str], body: bytes) -> str | None:
        if (problem := _status_problem(status, body)) is not None:
            return problem
        try:
            outs = list(_outputs_by_name(orjson.loads(body)).values())
            got = np.array(outs[0]["data"], dtype=np.float64).astype(np.float32).ravel()
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return f"unexpected JSON answer ({exc}): {body[:200]!r}"
        if got.shape != expected.shape or not np.array_equal(got, expected):
            return f"the echoed tensor differs from the input ({got.size} elements)"
        return None

    return check


def _identity_binary_check(expected: bytes) -> Check:
    def check(status: int, headers: dict[str, str], body: bytes) -> str | None:
        if (problem := _status_problem(status, body)) is not None:
            return problem
        if IHCL.lower() not in headers:
            return "answer has no Inference-Header-Content-Length (binary_data_output was set)"
        try:
            obj, section = _split_answer(headers, body)
            outs = list(_outputs_by_name(obj).values())
            size = outs[0]["parameters"]["binary_data_size"]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return f"unexpected binary answer header ({exc})"
        if size != len(expected) or section != expected:
            return f"the echoed bytes differ from the input ({len(section)} bytes back)"
        return None

    return check


def _write(path: Path, chunks: list[bytes]) -> int:
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)
    return sum(len(c) for c in chunks)


def _binary_body(key: str, folder: Path, model: str, header: bytes, blobs: list[bytes]) -> Body:
    path = folder / f"{key}.bin"
    return Body(
        key,
        model,
        path,
        {"Content-Type": "application/octet-stream", IHCL: str(len(header))},
        _check_simple_binary,
        size=_write(path, [header, *blobs]),
    )


def build_rest_bodies(folder: Path, quick: bool) -> dict[str, Body]:
    """simple (JSON and binary), 1 M FP32 as JSON, 64 MiB FP32 binary."""
    del quick  # the same bodies either way: only durations shrink
    rng = np.random.default_rng(20240601)
    bodies: dict[str, Body] = {}

    # simple, plain JSON both ways (what a JSON client sends; tritonclient-shaped)
    simple_json = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": SIMPLE_IN0.ravel()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": SIMPLE_IN1.ravel()},
        ]
    }
    path = folder / "simple.json"
    data = orjson.dumps(simple_json, option=orjson.OPT_SERIALIZE_NUMPY)
    bodies["simple_json"] = Body(
        "simple_json",
        "simple",
        path,
        {"Content-Type": "application/json"},
        _check_simple_json,
        size=_write(path, [data]),
        description="simple, 2 x INT32[1,16] as JSON, JSON answer",
    )

    # simple, binary tensors both ways
    header = _json_header(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                }
                for name in ("INPUT0", "INPUT1")
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    b = _binary_body(
        "simple_binary", folder, "simple", header, [SIMPLE_IN0.tobytes(), SIMPLE_IN1.tobytes()]
    )
    b.description = "simple, 2 x INT32[1,16] binary, binary answer"
    bodies[b.key] = b

    # 1 M FP32 as JSON numbers, written as a Python/tritonclient JSON client writes them
    # (each float32 widened to a double, shortest double repr: ~20 bytes a number)
    n = 1_000_000
    fp32 = rng.random(n, dtype=np.float32)
    obj = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [n],
                "data": fp32.astype(np.float64),
            }
        ]
    }
    path = folder / "fp32_1m.json"
    size = _write(path, [orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)])
    bodies["fp32_1m_json"] = Body(
        "fp32_1m_json",
        "identity_fp32",
        path,
        {"Content-Type": "application/json"},
        _identity_json_check(fp32),
        size=size,
        description="identity_fp32, FP32[1000000] as JSON, JSON answer",
    )

    # 64 MiB FP32 binary, binary answer
    count = 64 * 1024 * 1024 // 4
    big = rng.random(count, dtype=np.float32).tobytes()
    header = _json_header(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [count],
                    "parameters": {"binary_data_size": len(big)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    path = folder / "fp32_64mib.bin"
    bodies["fp32_64mib_binary"] = Body(
        "fp32_64mib_binary",
        "identity_fp32",
        path,
        {"Content-Type": "application/octet-stream", IHCL: str(len(header))},
        _identity_binary_check(big),
        size=_write(path, [header, big]),
        description="identity_fp32, FP32[16777216] (64 MiB) binary, binary answer",
    )
    return bodies


def build_grpc_bodies(folder: Path) -> dict[str, GrpcBody]:
    """simple as a ModelInferRequest with raw_input_contents, framed for h2load."""
    from tritonclient.grpc import service_pb2 as pb

    msg = pb.ModelInferRequest(model_name="simple")
    for name, arr in (("INPUT0", SIMPLE_IN0), ("INPUT1", SIMPLE_IN1)):
        msg.inputs.add(name=name, datatype="INT32", shape=list(arr.shape))
        msg.raw_input_contents.append(arr.tobytes())
    raw = msg.SerializeToString()
    path = folder / "simple.grpc"
    size = _write(path, [b"\x00", len(raw).to_bytes(4, "big"), raw])

    def check(answer: bytes) -> str | None:
        resp = pb.ModelInferResponse.FromString(answer)
        outs = {o.name: i for i, o in enumerate(resp.outputs)}
        if set(outs) != {"OUTPUT0", "OUTPUT1"} or len(resp.raw_output_contents) != 2:
            return f"unexpected ModelInferResponse: {resp}"[:300]
        got0 = np.frombuffer(resp.raw_output_contents[outs["OUTPUT0"]], dtype="<i4")
        got1 = np.frombuffer(resp.raw_output_contents[outs["OUTPUT1"]], dtype="<i4")
        if not (
            np.array_equal(got0, SIMPLE_SUM.ravel()) and np.array_equal(got1, SIMPLE_DIFF.ravel())
        ):
            return "wrong values in the ModelInferResponse"
        return None

    return {
        "simple_grpc": GrpcBody(
            "simple_grpc",
            "simple",
            path,
            raw,
            check,
            size=size,
            description="simple, 2 x INT32[1,16] in raw_input_contents",
        )
    }


def post(
    port: int, body: Body, data: bytes | None = None, timeout: float = 120.0
) -> tuple[int, dict[str, str], bytes, float]:
    """One POST of the body to 127.0.0.1:port; (status, lower-cased headers, answer, seconds)."""
    payload = body.path.read_bytes() if data is None else data
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        start = time.perf_counter()
        conn.request("POST", body.url_path, body=payload, headers=body.headers)
        resp = conn.getresponse()
        answer = resp.read()
        elapsed = time.perf_counter() - start
        headers = {k.lower(): v for k, v in resp.getheaders()}
        return resp.status, headers, answer, elapsed
    finally:
        conn.close()


def gate_rest(port: int, body: Body, timeout: float = 120.0) -> str | None:
    """Send the body once; None when the answer is right, else what is wrong."""
    try:
        status, headers, answer, _ = post(port, body, timeout=timeout)
    except (OSError, http.client.HTTPException) as exc:
        return f"request failed: {exc!r}"
    return body.check(status, headers, answer)


def gate_grpc(port: int, body: GrpcBody, nghttp: str | None, timeout: float = 30.0) -> str | None:
    """The message once through a Python gRPC channel (answer checked), then the exact framed
    file and headers h2load sends through ``nghttp`` (its trailers must say grpc-status 0:
    h2load counts any HTTP 200 as a success, gRPC errors included)."""
    import grpc

    channel = grpc.insecure_channel(
        f"127.0.0.1:{port}",
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
    )
    try:
        call = channel.unary_unary(GRPC_INFER_PATH)  # bytes in, bytes out
        answer = call(body.message, timeout=timeout)
    except grpc.RpcError as exc:
        return f"gRPC {exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
    finally:
        channel.close()
    problem = body.check(answer)
    if problem is not None or nghttp is None:
        return problem
    from procs import run_tool

    cmd = [nghttp, "-v", "-d", str(body.path)]
    for k, v in body.headers.items():
        cmd += ["-H", f"{k}: {v}"]
    rc, out, err = run_tool([*cmd, f"http://127.0.0.1:{port}{GRPC_INFER_PATH}"], timeout)
    if rc != 0:
        return f"nghttp rc={rc}: {(err or out)[-300:]}"
    found = {}
    for line in out.splitlines():
        for key in ("grpc-status", "grpc-message"):
            marker = f") {key}: "
            if marker in line and line.lstrip().startswith("["):
                found[key] = line.split(marker, 1)[1].strip()
    if found.get("grpc-status") != "0":
        message = urllib.parse.unquote(found.get("grpc-message", ""))
        return (
            f"the exact request h2load sends (sent with nghttp) is answered with grpc-status"
            f" {found.get('grpc-status', '<none>')}: {message[:100]}"
        )
    return None
