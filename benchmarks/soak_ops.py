"""The soak's request kinds and the exact check of each answer.

Every kind is one coroutine taking a :class:`Conn` (one keep-alive aiohttp session and one gRPC
channel per client) that returns None when the answer is exactly what the builtin models must
give, else what is wrong; an exception is an error too. Expected errors are checked exactly:
status (or gRPC code) and the start of the message. Answers are parsed with orjson, tritonclient
and tritonclient's protobuf messages, never with v2proxy's own codecs.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from multiprocessing import shared_memory

import aiohttp
import grpc
import numpy as np
import orjson
from bodies import IHCL, SIMPLE_DIFF, SIMPLE_IN0, SIMPLE_IN1, SIMPLE_SUM
from bodies import _check_simple_binary as check_simple_binary
from bodies import _check_simple_json as check_simple_json
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

PROMPT = "soak the proxy"
TOKENS = 8
_WORDS = PROMPT.split()
EXPECTED_TOKENS = [("" if i == 0 else " ") + _WORDS[i % len(_WORDS)] for i in range(TOKENS)]
TIMEOUT_S = 30.0


def _simple_inputs(shape: list[int]) -> list[dict[str, object]]:
    n = int(np.prod(shape))
    return [
        {"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": SIMPLE_IN0.ravel()[:n]},
        {"name": "INPUT1", "datatype": "INT32", "shape": shape, "data": SIMPLE_IN1.ravel()[:n]},
    ]


_OPT = orjson.OPT_SERIALIZE_NUMPY
SIMPLE_JSON = orjson.dumps({"inputs": _simple_inputs([1, 16])}, option=_OPT)
BAD_SHAPE_JSON = orjson.dumps({"inputs": _simple_inputs([1, 3])}, option=_OPT)
MALFORMED_JSON = b'{"inputs":[{"name":"INPUT0",'
_BIN_HEADER = orjson.dumps(
    {
        "inputs": [
            {
                "name": n,
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {"binary_data_size": 64},
            }
            for n in ("INPUT0", "INPUT1")
        ],
        "outputs": [
            {"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")
        ],
    }
)
SIMPLE_BINARY = _BIN_HEADER + SIMPLE_IN0.tobytes() + SIMPLE_IN1.tobytes()
BINARY_HEADERS = {"Content-Type": "application/octet-stream", IHCL: str(len(_BIN_HEADER))}
STREAM_JSON = orjson.dumps({"text_input": PROMPT, "max_tokens": TOKENS, "stream": True})


def _grpc_simple(model: str) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=model)
    for name, arr in (("INPUT0", SIMPLE_IN0), ("INPUT1", SIMPLE_IN1)):
        msg.inputs.add(name=name, datatype="INT32", shape=list(arr.shape))
        msg.raw_input_contents.append(arr.tobytes())
    return msg


GRPC_SIMPLE = _grpc_simple("simple")
GRPC_MISSING = _grpc_simple("soak_missing")


def _grpc_stream_request() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="llm", id="soak")
    t = msg.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append(PROMPT.encode())
    msg.inputs.add(name="max_tokens", datatype="INT32", shape=[1]).contents.int_contents.append(
        TOKENS
    )
    msg.inputs.add(name="stream", datatype="BOOL", shape=[1]).contents.bool_contents.append(True)
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    return msg


GRPC_STREAM = _grpc_stream_request()
GRPC_LLM = pb.ModelInferRequest()
GRPC_LLM.CopyFrom(GRPC_STREAM)
GRPC_LLM.inputs[2].contents.bool_contents[0] = False
del GRPC_LLM.parameters["triton_enable_empty_final_response"]


@dataclass
class Conn:
    """One client's connections to the proxy."""

    http_port: int
    session: aiohttp.ClientSession
    channel: grpc.aio.Channel
    stub: pbg.GRPCInferenceServiceStub

    @classmethod
    def open(cls, http_port: int, grpc_port: int) -> Conn:
        session = aiohttp.ClientSession(
            # idle connections are dropped by the client before the proxy's idle timeout (5 s)
            # closes them, so a stall of this process never reuses a closed connection
            connector=aiohttp.TCPConnector(limit=1, keepalive_timeout=2.0),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
        )
        # a connection of its own (gRPC shares one between channels to the same address by
        # default): with --workers N, each client's connections land on a worker of their own
        options = [("grpc.use_local_subchannel_pool", 1)]
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}", options=options)
        return cls(http_port, session, channel, pbg.GRPCInferenceServiceStub(channel))

    async def close(self) -> None:
        await self.session.close()
        await self.channel.close(None)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    async def post(
        self, path: str, data: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        async with self.session.post(self.url(path), data=data, headers=headers) as resp:
            body = await resp.read()
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, body


def _error_problem(status: int, body: bytes, want_status: int, want_start: str) -> str | None:
    if status != want_status:
        return f"HTTP {status} (expected {want_status}): {body[:200]!r}"
    try:
        text = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"HTTP {status} without a JSON error: {body[:200]!r}"
    if not isinstance(text, str) or not text.startswith(want_start):
        return f"error text {text!r} does not start with {want_start!r}"
    return None


async def json_infer(c: Conn) -> str | None:
    return check_simple_json(*await c.post("/v2/models/simple/infer", SIMPLE_JSON))


async def binary_infer(c: Conn) -> str | None:
    path = "/v2/models/simple/infer"
    return check_simple_binary(*await c.post(path, SIMPLE_BINARY, BINARY_HEADERS))


async def err_unknown_model(c: Conn) -> str | None:
    status, _, body = await c.post("/v2/models/soak_missing/infer", SIMPLE_JSON)
    return _error_problem(status, body, 404, "Request for unknown model: 'soak_missing'")


async def err_malformed_json(c: Conn) -> str | None:
    status, _, body = await c.post("/v2/models/simple/infer", MALFORMED_JSON)
    return _error_problem(status, body, 400, "failed to parse the request JSON buffer")


async def err_bad_shape(c: Conn) -> str | None:
    status, _, body = await c.post("/v2/models/simple/infer", BAD_SHAPE_JSON)
    return _error_problem(status, body, 400, "unexpected shape for input 'INPUT0'")


async def rest_stream(c: Conn) -> str | None:
    """generate_stream of the decoupled llm: one server-sent event per token."""
    texts: list[str] = []
    async with c.session.post(c.url("/v2/models/llm/generate_stream"), data=STREAM_JSON) as r:
        if r.status != 200:
            return f"HTTP {r.status}: {(await r.read())[:200]!r}"
        if not r.headers.get("Content-Type", "").startswith("text/event-stream"):
            return f"content-type {r.headers.get('Content-Type')!r}"
        async for line in r.content:
            if line.startswith(b"data: "):
                event = orjson.loads(line[6:])
                if "error" in event:
                    return f"error event {event!r}"
                texts.append(event["text_output"])
    return None if texts == EXPECTED_TOKENS else f"tokens {texts!r}"


async def grpc_infer(c: Conn) -> str | None:
    resp = await c.stub.ModelInfer(GRPC_SIMPLE, timeout=TIMEOUT_S)
    outs = {o.name: i for i, o in enumerate(resp.outputs)}
    if set(outs) != {"OUTPUT0", "OUTPUT1"} or len(resp.raw_output_contents) != 2:
        return f"unexpected ModelInferResponse: {resp}"[:300]
    got0 = np.frombuffer(resp.raw_output_contents[outs["OUTPUT0"]], dtype="<i4")
    got1 = np.frombuffer(resp.raw_output_contents[outs["OUTPUT1"]], dtype="<i4")
    if np.array_equal(got0, SIMPLE_SUM.ravel()) and np.array_equal(got1, SIMPLE_DIFF.ravel()):
        return None
    return "wrong values in the ModelInferResponse"


async def grpc_unknown_model(c: Conn) -> str | None:
    try:
        await c.stub.ModelInfer(GRPC_MISSING, timeout=TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        want = "Request for unknown model: 'soak_missing'"
        if exc.code() == grpc.StatusCode.NOT_FOUND and (exc.details() or "").startswith(want):
            return None
        return f"gRPC {exc.code()}: {exc.details()!r}"
    return "ModelInfer of an unknown model succeeded"


async def _one(msg: pb.ModelInferRequest) -> AsyncIterator[pb.ModelInferRequest]:
    yield msg


async def grpc_stream(c: Conn) -> str | None:
    """ModelStreamInfer of the decoupled llm: one response per token, the last one final."""
    texts, final = [], False
    async for r in c.stub.ModelStreamInfer(_one(GRPC_STREAM), timeout=TIMEOUT_S):
        if r.error_message:
            return f"stream error {r.error_message!r}"
        resp = r.infer_response
        if resp.id != "soak" or final:
            return f"unexpected response after the final one or with id {resp.id!r}"
        for raw in resp.raw_output_contents:
            n = int.from_bytes(raw[:4], "little")
            texts.append(raw[4 : 4 + n].decode())
        final = resp.parameters["triton_final_response"].bool_param
    if texts != EXPECTED_TOKENS or not final:
        return f"tokens {texts!r}, final flag {final}"
    return None


async def grpc_llm(c: Conn) -> str | None:
    """ModelInfer of the llm without streaming: one answer, the prompt and its tokens (what
    the schedule sends over gRPC instead of a stream when the backend is v2 REST, which has no
    streaming infer)."""
    resp = await c.stub.ModelInfer(GRPC_LLM, timeout=TIMEOUT_S)
    want = f"{PROMPT} {''.join(EXPECTED_TOKENS)}".encode()
    got = [r[4 : 4 + int.from_bytes(r[:4], "little")] for r in resp.raw_output_contents]
    return None if got == [want] else f"llm answered {got!r}"


async def shm_cycle(c: Conn) -> str | None:
    """A fresh system shared-memory region: register, infer simple from and into it,
    unregister; the outputs are read back from the region."""
    name = f"v2proxy_soak_{secrets.token_hex(4)}"
    seg = shared_memory.SharedMemory(name=name, create=True, size=256)
    base = f"/v2/systemsharedmemory/region/{name}"
    registered = False
    buf = seg.buf
    assert buf is not None
    try:
        buf[0:64] = SIMPLE_IN0.tobytes()
        buf[64:128] = SIMPLE_IN1.tobytes()
        reg = orjson.dumps({"key": f"/{name}", "offset": 0, "byte_size": 256})
        status, _, body = await c.post(f"{base}/register", reg)
        if status != 200:
            return f"register: HTTP {status}: {body[:200]!r}"
        registered = True

        def region(offset: int) -> dict[str, object]:
            return {
                "shared_memory_region": name,
                "shared_memory_byte_size": 64,
                "shared_memory_offset": offset,
            }

        ins = [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "parameters": region(o)}
            for n, o in (("INPUT0", 0), ("INPUT1", 64))
        ]
        outs = [
            {"name": n, "parameters": region(o)} for n, o in (("OUTPUT0", 128), ("OUTPUT1", 192))
        ]
        req = orjson.dumps({"inputs": ins, "outputs": outs})
        status, _, body = await c.post("/v2/models/simple/infer", req)
        if status != 200:
            return f"infer: HTTP {status}: {body[:200]!r}"
        got0 = np.frombuffer(bytes(buf[128:192]), dtype=np.int32)
        got1 = np.frombuffer(bytes(buf[192:256]), dtype=np.int32)
        if not (
            np.array_equal(got0, SIMPLE_SUM.ravel()) and np.array_equal(got1, SIMPLE_DIFF.ravel())
        ):
            return "wrong values in the output region"
        status, _, body = await c.post(f"{base}/unregister", b"")
        registered = False
        return None if status == 200 else f"unregister: HTTP {status}: {body[:200]!r}"
    finally:
        if registered:
            with contextlib.suppress(Exception):
                await c.post(f"{base}/unregister", b"")
        seg.close()
        seg.unlink()
