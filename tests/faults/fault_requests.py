"""The requests of the fault-injection matrix (:mod:`tests.faults.fault_matrix`), sent to a
v2proxy with blocking clients and classified.

Request kinds (all checked element by element when they answer 200):

- ``unary``: ``simple`` over the proxy's REST frontend (JSON);
- ``large``: ``identity_fp32`` with a binary tensor of :data:`LARGE_BYTES` over REST;
- ``stream``: the decoupled ``llm``, one response per token: ``generate_stream`` (server-sent
  events, passed through) in front of the REST backend, ``ModelStreamInfer`` over the proxy's
  gRPC frontend in front of the gRPC backend.

Outcome classes (:class:`Outcome`): ``ok`` (200, right body), ``error`` (502/503/504 or the gRPC
UNAVAILABLE/DEADLINE_EXCEEDED/INTERNAL, within --backend-timeout plus a margin), ``cut`` (an
answer whose 200 head went out, ended by an error event or a broken transfer: all it can still
say), and the defects: ``wrong`` (a 200 with a wrong body, or another status), ``slow`` (an
error, but later than --backend-timeout plus the margin) and ``hang`` (no answer within the
client's own limit).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np

from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy._proto.service import SERVICE
from v2proxy.reference.models import iter_llm_tokens

#: --backend-timeout of the proxies under test (seconds), per backend transport: the large
#: request alone takes up to 1 s over REST and 1-3 s over gRPC (grpcio's copies) on a loaded
#: 2-core machine
TIMEOUTS = {"rest": 2.5, "grpc": 4.0}
#: how much later than --backend-timeout an error may come (a loaded 2-core machine)
MARGIN = 2.0
#: how long after a fault is cleared a good request may still fail (the gRPC channel's
#: reconnect backoff, at most 1 s plus 20 % jitter: v2proxy.backends.grpc.RECONNECT_BACKOFF_MS)
RECOVERY_S = 1.5
#: the client's own limit: beyond it the case is a hang
CLIENT_LIMIT = max(TIMEOUTS.values()) + 8.0
LARGE_BYTES = 16 << 20
PROMPT = "faults in the relay"
MAX_TOKENS = 6
GATEWAY = {502, 503, 504}
GRPC_GATEWAY = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL"}
KINDS = ("unary", "large", "stream")
TRANSPORTS = ("rest", "grpc")


@dataclass
class Outcome:
    cls: str  # ok, error, cut, wrong, slow, hang
    status: str  # "200", "504", "UNAVAILABLE", "200+cut", ...
    elapsed: float
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.cls} {self.status} {self.elapsed:.2f}s {self.detail[:160]}"


def _timed(fn: Callable[[], Outcome]) -> Outcome:
    start = time.monotonic()
    out = fn()
    out.elapsed = time.monotonic() - start
    return out


def _http_error(status: int, body: bytes) -> Outcome:
    text = body[:300].decode("utf-8", "replace")
    return Outcome("error" if status in GATEWAY else "wrong", str(status), 0.0, text)


@contextlib.contextmanager
def _post(
    port: int, path: str, body: bytes, headers: dict[str, str]
) -> Iterator[http.client.HTTPResponse]:
    """A POST on a connection of its own, closed after the block."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_LIMIT)
    try:
        conn.request("POST", path, body, headers)
        yield conn.getresponse()
    finally:
        conn.close()


def _answer_200(
    port: int, path: str, body: bytes, headers: dict[str, str]
) -> tuple[http.client.HTTPResponse, bytes] | Outcome:
    """POST and read the whole answer: the response and its body when it is a 200; else its
    outcome: ``cut`` when the body of a 200 broke off, the classified status for another (an
    answer of another status that breaks off raises, as a broken request does)."""
    with _post(port, path, body, headers) as resp:
        try:
            raw = resp.read()
        except (http.client.IncompleteRead, OSError) as exc:
            if resp.status == 200:
                return Outcome("cut", "200+cut", 0.0, repr(exc)[:200])
            raise
    if resp.status != 200:
        return _http_error(resp.status, raw)
    return resp, raw


def unary(port: int) -> Outcome:
    a = np.arange(16, dtype=np.int32) * 7 - 40
    b = np.arange(16, dtype=np.int32)[::-1].copy()
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.tolist()},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.tolist()},
            ]
        }
    ).encode()
    with _post(port, "/v2/models/simple/infer", body, {"Content-Type": "application/json"}) as resp:
        raw = resp.read()
    if resp.status != 200:
        return _http_error(resp.status, raw)
    got = {o["name"]: np.asarray(o["data"], dtype=np.int32) for o in json.loads(raw)["outputs"]}
    if not (np.array_equal(got["OUTPUT0"], a + b) and np.array_equal(got["OUTPUT1"], a - b)):
        return Outcome("wrong", "200", 0.0, "outputs differ from the sums and differences")
    return Outcome("ok", "200", 0.0)


_LARGE = np.random.default_rng(14).standard_normal(LARGE_BYTES // 4).astype(np.float32)


def large(port: int) -> Outcome:
    data = _LARGE
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [data.size],
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    answer = _answer_200(port, "/v2/models/identity_fp32/infer", header + data.tobytes(), headers)
    if isinstance(answer, Outcome):
        return answer
    resp, raw = answer
    hlen = resp.getheader("Inference-Header-Content-Length")
    n = int(hlen) if hlen is not None else len(raw)
    out = json.loads(raw[:n])["outputs"][0]
    got = np.frombuffer(raw[n:], dtype=np.float32)
    if out["shape"] != [data.size] or got.size != data.size or not np.array_equal(got, data):
        return Outcome("wrong", "200", 0.0, f"{got.size} elements back, or different ones")
    return Outcome("ok", "200", 0.0)


EXPECTED_TOKENS = list(iter_llm_tokens(PROMPT, MAX_TOKENS))


def stream_sse(port: int) -> Outcome:
    body = json.dumps({"text_input": PROMPT, "max_tokens": MAX_TOKENS, "stream": True}).encode()
    path = "/v2/models/llm/generate_stream"
    answer = _answer_200(port, path, body, {"Content-Type": "application/json"})
    if isinstance(answer, Outcome):
        return answer
    _, raw = answer
    events = [json.loads(line[5:]) for line in raw.decode().split("\n") if line.startswith("data:")]
    errors = [e["error"] for e in events if "error" in e]
    if errors:
        return Outcome("cut", "200+error", 0.0, str(errors[0]))
    tokens = [e.get("text_output") for e in events]
    if tokens != EXPECTED_TOKENS:
        return Outcome("wrong", "200", 0.0, f"tokens {tokens!r}")
    return Outcome("ok", "200", 0.0)


def _llm_request() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="llm")
    t = req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append(PROMPT.encode())
    t = req.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    t.contents.int_contents.append(MAX_TOKENS)
    t = req.inputs.add(name="stream", datatype="BOOL", shape=[1])
    t.contents.bool_contents.append(True)
    return req


def _text(resp: pb.ModelInferResponse) -> str:
    raw = resp.raw_output_contents[0]
    n = int.from_bytes(raw[:4], "little")
    return raw[4 : 4 + n].decode()


def stream_grpc(port: int) -> Outcome:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        tokens: list[str] = []
        try:
            for item in call(iter([_llm_request()]), timeout=CLIENT_LIMIT):
                if item.error_message:
                    cls = "cut" if tokens else "error"
                    return Outcome(cls, "stream error", 0.0, item.error_message)
                if item.infer_response.raw_output_contents:
                    tokens.append(_text(item.infer_response))
        except grpc.RpcError as exc:
            code = exc.code()
            name = code.name if code is not None else "?"
            if name == "DEADLINE_EXCEEDED":  # the client's own limit
                return Outcome("hang", name, 0.0, str(exc.details()))
            cls = ("cut" if tokens else "error") if name in GRPC_GATEWAY else "wrong"
            return Outcome(cls, name, 0.0, str(exc.details()))
    if tokens != EXPECTED_TOKENS:
        return Outcome("wrong", "OK", 0.0, f"tokens {tokens!r}")
    return Outcome("ok", "OK", 0.0)


def request(transport: str, kind: str, http_port: int, grpc_port: int) -> Outcome:
    """One request of ``kind`` through the proxy (its ports) in front of ``transport``,
    timed and classified."""

    def call() -> Outcome:
        try:
            if kind == "unary":
                return unary(http_port)
            if kind == "large":
                return large(http_port)
            if transport == "grpc":
                return stream_grpc(grpc_port)
            return stream_sse(http_port)
        except TimeoutError as exc:
            return Outcome("hang", "no answer", 0.0, repr(exc))
        except (OSError, http.client.HTTPException) as exc:
            return Outcome("wrong", "broken", 0.0, repr(exc)[:200])

    out = _timed(call)
    if out.cls in ("error", "cut") and out.elapsed > TIMEOUTS[transport] + MARGIN:
        out.cls = "slow"
    return out
