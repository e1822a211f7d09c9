"""Writes the seed inputs of the fuzz targets (tests/fuzz/targets): real request bodies as
tritonclient encodes them (HTTP JSON and binary, gRPC messages), MindIE and generate bodies as
their clients send them, backends' answers, and the raw requests of the HTTP server's
conformance table. Each seed is the target's control byte(s) followed by the bytes.

``python tests/fuzz/seeds.py DIR`` writes DIR/<target>/seed-*; ``make fuzz`` starts from the
committed corpus (tests/fuzz/corpus), which began as these seeds and grew by fuzzing.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import _utils as grpc_utils

from v2proxy.codecs import grpc as grpcc
from v2proxy.core.model import InferResponse, Tensor

HERE = Path(__file__).resolve().parent

ARRAYS = {
    "INT32": np.arange(16, dtype=np.int32).reshape(1, 16),
    "FP32": np.array([[0.5, -1.25, 3.0e38, 1e-45]], dtype=np.float32),
    "FP16": np.array([1.5, -2.0], dtype=np.float16),
    "FP64": np.array([[1.0, 2.5], [-0.0, 1e308]], dtype=np.float64),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "UINT64": np.array([0, 2**64 - 1], dtype=np.uint64),
    "INT64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "BOOL": np.array([True, False, True]),
    "BYTES": np.array([b"12", b"", "\u20ac".encode()], dtype=np.object_),
    "UINT8": np.zeros((2, 2, 2), dtype=np.uint8),
}


def _http_inputs(binary: bool) -> list[list[httpclient.InferInput]]:
    out = []
    for datatype, array in ARRAYS.items():
        inp = httpclient.InferInput("INPUT0", list(array.shape), datatype)
        inp.set_data_from_numpy(array, binary_data=binary)
        out.append([inp])
    two = []
    for name in ("INPUT0", "INPUT1"):
        inp = httpclient.InferInput(name, [1, 16], "INT32")
        inp.set_data_from_numpy(ARRAYS["INT32"], binary_data=binary)
        two.append(inp)
    out.append(two)
    shm = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    shm.set_shared_memory("region", 64, offset=0)
    out.append([shm])
    return out


def _http_bodies(binary: bool) -> list[tuple[bytes, int | None]]:
    bodies = []
    for i, inputs in enumerate(_http_inputs(binary)):
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary, class_count=3),
        ]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            inputs,
            outputs=outputs if i % 2 else None,
            request_id=str(i) if i % 3 else "",
            sequence_id=i if i % 4 == 1 else 0,
            parameters={"custom": "x", "n": 3} if i % 5 == 2 else None,
        )
        bodies.append((body, json_size))
    return bodies


JSON_EXTRA = [
    b'{"inputs":[{"name":"X","datatype":"FP64","shape":[2],"data":[NaN,-Infinity]}]}',
    b'{"inputs":[{"name":"X","datatype":"INT32","shape":[2,2],"data":[[1,2],[3,4]]}]}',
    b'{"id":"a","inputs":[{"name":"X","datatype":"BF16","shape":[1],"data":[1.5]}],'
    b'"outputs":[{"name":"Y","parameters":{"shared_memory_region":"r",'
    b'"shared_memory_byte_size":8}}],"parameters":{"binary_data_output":true}}',
    b'{"model_name":"m","model_version":"1","outputs":[{"name":"Y","datatype":"INT32",'
    b'"shape":[2],"data":[1,2]}],"parameters":{"sequence_end":true}}',
]


def _grpc_requests() -> list[bytes]:
    msgs = []
    for datatype, array in ARRAYS.items():
        inp = grpcclient.InferInput("INPUT0", list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)
        req = grpc_utils._get_inference_request(
            "simple", [inp], "1", "id", [out], 0, False, False, 0, None, {"p": 1}
        )
        msgs.append(req.SerializeToString())
    typed = grpc_utils._get_inference_request(
        "simple", [], "", "", None, 7, True, False, 2, 100, None
    )
    tensor = typed.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 4])
    tensor.contents.int_contents.extend([1, 2, 3, 4])
    text = typed.inputs.add(name="T", datatype="BYTES", shape=[2])
    text.contents.bytes_contents.extend([b"a", b"bc"])
    shm = typed.inputs.add(name="S", datatype="FP32", shape=[4])
    shm.parameters["shared_memory_region"].string_param = "r"
    shm.parameters["shared_memory_byte_size"].int64_param = 16
    msgs.append(typed.SerializeToString())
    return msgs


def _grpc_responses() -> list[bytes]:
    outputs = [
        Tensor(name, "INT32", (1, 16), ARRAYS["INT32"].tobytes())  # type: ignore[arg-type]
        for name in ("OUTPUT0", "OUTPUT1")
    ]
    from v2proxy.core.model import Datatype

    for t in outputs:
        t.datatype = Datatype.INT32
    resp = grpcc.response_to_proto(InferResponse("simple", outputs, "1", "x", {"k": 1}))
    typed = grpcc.response_to_proto(InferResponse("simple", [], "1"))
    out = typed.outputs.add(name="Y", datatype="FP32", shape=[2])
    out.contents.fp32_contents.extend([1.0, 2.0])
    return [resp.SerializeToString(), typed.SerializeToString()]


RAW_META = b'{"inputs":[{"name":"I","datatype":"INT8","shape":[-1]}]}'
MINDIE_CLIENT = [
    {"inputs": "My name is Olivier and I", "stream": False},
    {
        "inputs": "What is deep learning?",
        "stream": True,
        "parameters": {
            "temperature": 0.5,
            "top_k": 10,
            "top_p": 0.95,
            "typical_p": 0.5,
            "do_sample": True,
            "seed": 1,
            "repetition_penalty": 1.03,
            "watermark": True,
            "priority": 5,
            "timeout": 10,
            "max_new_tokens": 20,
            "details": True,
        },
    },
    {
        "inputs": [
            {"type": "text", "text": "describe"},
            {"type": "image_url", "image_url": "https://example.com/a.png"},
            {"type": "video_url", "video_url": {"url": "file:///v.mp4"}},
        ],
        "parameters": {"do_sample": False},
    },
    {"input_id": [1, 2, 3]},
]
MINDIE_ANSWERS = [
    b'{"generated_text":" am a student","details":{"finish_reason":"length",'
    b'"generated_tokens":4,"seed":1}}',
]
MINDIE_ERRORS = [
    b'{"error":"Parameter temperature must be in (0, 3.4028e+38], got 0.","error_type":'
    b'"Input Validation Error"}',
    b"Engine callback timeout: client timeout",
    b"",
]
MINDIE_SSE = [
    b'data: {"token":{"id":1,"text":" am","logprob":null,"special":null},'
    b'"generated_text":null,"details":null}\n\n'
    b'data: {"token":{"id":2,"text":null},"generated_text":" am a","details":'
    b'{"finish_reason":"eos_token","generated_tokens":2,"seed":3}}\n\n',
    b'data: {"token":{"text":"x"}}\r\n\r\nEngine callback timeout: client timeout\r\n\r\n',
]
GENERATE_SSE = [
    b'data: {"model_name":"llm","model_version":"1","text_output":"a"}\n\n'
    b'data: {"model_name":"llm","model_version":"1","text_output":"b",'
    b'"finish_reason":"length"}\n\n',
    b': comment\r\ndata: {"error":"failed"}\r\n\r\ndata: [DONE]\n\n',
]
GENERATE_BODIES = [
    (0, {"text_input": "hello", "max_tokens": 3, "stream": False,
         "parameters": {"temperature": 0.5, "custom": "x"}}),
    (0, {"id": "7", "text_input": ["a", "b"], "parameters": {"seed": 5}}),
    (1, {"INPUT0": list(range(16)), "INPUT1": [[1] * 16]}),
    (2, {"INPUT0": [str(i) for i in range(16)], "INPUT1": ["1"] * 16}),
    (3, {"INPUT0": ["x", "y"]}),
    (4, {"INPUT0": [1.5, -2.0, 1e30]}),
    (5, {"INPUT0": [0.1] * 10, "sequence_id": 3, "triton_x": True}),
]  # fmt: skip

#: OpenAI bodies as the openai client sends them (with the control bits of fuzz_openai: bit 0
#: set for a chat body)
OPENAI_BODIES = [
    (0, {"model": "llm", "prompt": "Say this is a test.\nEND", "max_tokens": 7,
         "temperature": 0, "stop": ["\n", "END"]}),
    (0, {"model": "llm", "prompt": ["Once upon a time"], "stream": True,
         "stream_options": {"include_usage": True}, "top_p": 0.9, "seed": 3, "n": 1,
         "logprobs": None, "echo": False, "presence_penalty": 0, "stop": "time"}),
    (1, {"model": "llm", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello! Human: hi\n\nAI:"}],
         "max_completion_tokens": 5, "temperature": 1.5, "stop": ["Human:", "\n\n"]}),
    (1, {"model": "llm", "stream": True, "stream_options": {"include_usage": False},
         "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"},
                                                   {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "42"},
        {"role": "system", "content": "late"}],
         "tool_choice": "none", "response_format": {"type": "text"}, "stop": "b"}),
    (0, {"model": "llm", "prompt": "x" * 20}),
    (0, {"model": "llm", "prompt": "hi", "best_of": 2, "logit_bias": {"1": 2}}),
    (1, {"model": "llm", "messages": [{"role": "user",
                                       "content": [{"type": "image_url", "image_url": "u"}]}]}),
]  # fmt: skip

#: texts for fuzz_openai's stop scanner alone, with the stop sequences to cut from them
OPENAI_SCANS = [
    ("Hello there", ["there"]),
    ("Thought: x\nAction: y\nObservation: z", ["\nAction:", "Observat"]),
    ("User: hé\n### Réponse: ok\n", ["###", "\n", "User:", "ok"]),
]


def _scan_seed(text: str, stops: list[str], control: int) -> bytes:
    """fuzz_openai's input for the scanner alone: control bits 17-18 the number of stop
    sequences less one (bits 19-21: characters dropped from the text's end), then each one's
    offset and length less one in the text, then the text."""
    head = b"".join(bytes([text.index(s), len(s) - 1]) for s in stops)
    control |= 1 << 16 | (len(stops) - 1) << 17
    return control.to_bytes(3, "little") + head + text.encode()


def _http_cases() -> list[bytes]:
    path = HERE.parent / "unit" / "test_http_server.py"
    spec = importlib.util.spec_from_file_location("_conformance_cases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    out = []
    for case in module.CASES:
        raw = case.raw if isinstance(case.raw, bytes) else case.raw[0] + case.raw[1]
        out.append(raw)
    out += [
        b"POST /chunks HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        b"POST /limit HTTP/1.1\r\nContent-Length: 20\r\n\r\n" + b"x" * 20,
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        b"\r\nInference-Header-Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    ]
    return out


def _http(method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}"
    if body or method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _rest_requests() -> list[bytes]:
    """A request to each route of the REST frontend, as clients send them."""
    simple = [b for b, n in _http_bodies(False) if n is None][-2]  # INPUT0 and INPUT1
    framed, length = _http_bodies(True)[-2]
    m = "/v2/models"
    out = [
        _http("GET", "/v2/health/live"),
        _http("GET", "/v2/health/ready"),
        _http("GET", "/v2"),
        _http("GET", f"{m}/simple"),
        _http("GET", f"{m}/simple/versions/1/ready"),
        _http("GET", f"{m}/simple/config"),
        _http("GET", f"{m}/simple/stats"),
        _http("GET", f"{m}/stats"),
        _http("POST", f"{m}/simple/infer", simple),
        _http("POST", f"{m}/simple/versions/1/infer", simple, "Accept-Encoding: gzip\r\n"),
        _http("POST", f"{m}/simple/infer", gzip.compress(simple), "Content-Encoding: gzip\r\n"),
        _http(
            "POST",
            f"{m}/simple/infer",
            framed,
            f"Inference-Header-Content-Length: {length}\r\n"
            "Content-Type: application/octet-stream\r\n",
        ),
        _http(
            "POST",
            f"{m}/identity_fp32/infer",
            ARRAYS["FP32"].tobytes(),
            "Inference-Header-Content-Length: 0\r\n",
        ),
        _http(
            "POST",
            f"{m}/classifier/infer",
            json.dumps(
                {
                    "inputs": [
                        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 10], "data": [1] * 10}
                    ],
                    "outputs": [{"name": "SCORES", "parameters": {"classification": 3}}],
                }
            ).encode(),
        ),
        _http("POST", f"{m}/llm/generate", json.dumps(GENERATE_BODIES[0][1]).encode()),
        _http("POST", f"{m}/llm/generate_stream", b'{"text_input":"a b","max_tokens":2}'),
        _http("POST", "/infer", json.dumps(MINDIE_CLIENT[0]).encode()),
        _http("POST", "/infer", json.dumps(MINDIE_CLIENT[1]).encode()),
        _http("POST", "/v2/repository/index", b'{"ready":true}'),
        _http("POST", "/v2/repository/models/simple/unload", b"{}"),
        _http("POST", "/v2/repository/models/simple/load", b'{"parameters":{}}'),
        _http("GET", "/v2/systemsharedmemory/status"),
        _http(
            "POST",
            "/v2/systemsharedmemory/region/r/register",
            b'{"key":"/k","offset":0,"byte_size":64}',
        ),
        _http("GET", "/v2/trace/setting"),
        _http("POST", "/v2/logging", b'{"log_verbose_level":1}'),
        _http("GET", "/metrics"),
        _http("GET", "/openapi.json"),
    ]
    return out


def seeds() -> dict[str, list[bytes]]:
    json_bodies = [b for b, n in _http_bodies(False) if n is None] + JSON_EXTRA
    framed = _http_bodies(True)
    dumps = json.dumps
    out: dict[str, list[bytes]] = {
        "json": [bytes([c]) + b for b in json_bodies for c in (0, 1, 8, 16, 33, 42, 52)],
        "binary": [
            bytes([0]) + (n or 0).to_bytes(2, "little") + b for b, n in framed if n is not None
        ]
        + [b"\x01\x00\x00" + b for b in json_bodies[:4]]
        + [b"\x02" + len(b).to_bytes(2, "little") + b for b in json_bodies[:2]],
        "raw": [bytes([c]) + ARRAYS["FP32"].tobytes() for c in range(16)]
        + [bytes([c | 16]) + b"hello" for c in (2, 3, 8)]
        + [b"\x80" + bytes([len(RAW_META)]) + RAW_META + b"\x01\x02\x03"],
        "grpc": [b"\x00" + m for m in _grpc_requests()] + [b"\x01" + m for m in _grpc_responses()],
        "compression": [],
        "mindie": [bytes([c]) + dumps(b).encode() for b in MINDIE_CLIENT for c in (0, 1, 2)]
        + [b"\x04" + a for a in MINDIE_ANSWERS]
        + [bytes([5 | s << 3]) + e for e in MINDIE_ERRORS for s in (0, 3, 6)]
        + [bytes([6 | p << 3]) + s for s in MINDIE_SSE for p in (0, 4, 7)]
        + [bytes([7 | p << 3]) + s for s in GENERATE_SSE for p in (0, 4, 7)],
        "generate": [bytes([i]) + dumps(b).encode() for i, b in GENERATE_BODIES]
        + [bytes([16 | p << 5]) + s for s in GENERATE_SSE + MINDIE_SSE for p in (0, 3, 7)],
        "http": [bytes([c]) + raw for raw in _http_cases() for c in (7, 0)],
        "rest": [bytes([c]) + raw for raw in _rest_requests() for c in (7, 3)],
        "openai": [
            (kind | c).to_bytes(3, "little") + dumps(b).encode()
            for kind, b in OPENAI_BODIES
            for c in (0, 2, 4 | 1 << 3, 4 | 0x1B00, 3 << 3 | 1 << 6, 7 << 3 | 3 << 6)
        ]
        + [
            _scan_seed(t, stops, c)
            for t, stops in OPENAI_SCANS
            for c in (0x1B00, 2 << 3, 1 << 3 | 3 << 19)
        ],
    }
    for body in [*json_bodies[:6], framed[0][0]]:
        out["compression"] += [
            b"\x00" + gzip.compress(body),
            b"\x01" + zlib.compress(body),
            b"\x19" + zlib.compress(body),
            b"\x08" + gzip.compress(body)[:-6],
        ]
    out["compression"] += [b"\x00" + gzip.compress(b"\0" * (1 << 20)), b"\x03gzip;q=0.5, deflate"]
    return out


def write(folder: Path) -> None:
    for target, items in seeds().items():
        d = folder / target
        d.mkdir(parents=True, exist_ok=True)
        for item in items:
            (d / f"seed-{hashlib.sha1(item).hexdigest()[:16]}").write_bytes(item)


if __name__ == "__main__":
    write(Path(sys.argv[1]))
