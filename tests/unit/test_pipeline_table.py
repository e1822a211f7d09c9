"""The pipeline's decisions, table-driven, against a fake backend (``fake_backend.py``): no
sockets, no subprocesses. Part of the issue "One pass per request" (tests of the core without
sockets).

Each row is one client request: a wire form, a stage that applies to it (or none), and what the
backend can do. It asserts exactly which backend calls happened (names in order, and the
arguments of the inference call: the body relayed, or the request the backend was asked), how
many times the access policy was checked (per group), and what the answer is: the backend's
pass-through answer unchanged, or an InferResponse with the request id and model name filled in,
the outputs the client did not ask for dropped, and its outputs classified or written to shared
memory as the stage says.

Wire forms:

- ``json`` and ``binary`` (binary tensors, Inference-Header-Content-Length): a small REST body
  through the REST frontend's own handler (``RestFrontend.dispatch`` with a fake request and
  response object, and the counting access policy, so the counts are those of one whole client
  request, the frontend's access check before the body is read included);
- ``grpc``: a decoded request through ``Pipeline.staged``;
- ``message``: a gRPC ModelInfer through ``Pipeline.infer_message`` (what the gRPC frontend
  calls): the decoded request with the message's bytes, relayed by ``relay_message`` when
  nothing needs changing (``norelay``: the backend declines);
- ``stream``: a decoded request through ``Pipeline.stream_infer`` (gRPC's ModelStreamInfer),
  the backend answering once (a plain model) or three times (``x3``: a decoupled model);
- ``stream-message``: one message of a gRPC ModelStreamInfer through
  ``Pipeline.stream_message`` (what the gRPC frontend calls): the decoded request with the
  message's bytes, relayed by ``relay_message`` when nothing needs changing, else through
  ``stream_infer``'s path (``norelay``: the backend declines, as a gRPC backend does for a
  decoupled model; ``final-flag``: the client asked for the final-response flag, so the
  frontend says the answer may not go back as it came).

Stages: ``none``; ``class-labels`` (a ``classification`` parameter on an output, labels
configured for it here), ``class-backend`` (no labels, the backend lists the ``classification``
extension: the parameter passes through), ``class-proxy`` (no labels, the backend does not list
it: the proxy classifies without labels); ``shm-in`` / ``shm-out`` (an input read from, an output
written to, a region of the real registry ``v2proxy.shm.registry.Registry`` on a real POSIX
object); ``binary-output`` (``binary_data_output`` with no outputs listed), ``binary-output-
listed`` (the same with the outputs listed, where it changes nothing in the answer),
``binary-data`` (an output's ``binary_data``); ``fp16`` (an FP16 input); ``shm-out+class`` (two
stages at once: OUT0 written to a region, OUT1 classified by the proxy). Backend capability:
``relay_infer`` taking the body unchanged or declining (``norelay``) for either wire form.

The expected counts are the columns ``backend_calls`` and ``access_checks`` of :data:`ROWS` (and,
where a row fills it, ``region_holds``: the regions acquired, each released exactly once),
written as the code behaves today, so that a change to the pipeline changes them there (and
nowhere else). The access policy of these tests restricts every group (``restricts`` is True),
so every check the code would make is counted; the REST frontend is given it, the pipeline has
none (it checks no access).

What the table shows today (the access checked by the frontends only, as they admit a request):

- Every REST request is checked once, for the group ``inference``, by ``RestFrontend.dispatch``
  as it admits it, before its body is read (``Pipeline.infer_body`` does not check again),
  relayed or not. The pipeline checks no access: a call of ``Pipeline.staged``,
  ``infer_message``, ``stream_infer`` or ``stream_message`` is checked 0 times (the gRPC
  frontend checks each call, each stream, once as it admits it:
  ``tests/integration/test_access_once.py``). Before ce01b69 (at 48514c1) the same table
  counted 2 checks for a relayed REST request (dispatch and ``Pipeline.relay``) and 3 for one
  that was not relayed (dispatch, ``Pipeline.relay`` and ``Pipeline.infer``, now ``staged``);
  until the access moved out of the pipeline, each pipeline call here counted 1.
- A REST request that may be relayed asks the backend once: ``relay_infer``, which answers
  (before, ``can_relay`` was asked first: two asks). Whether the backend takes it as sent is
  decided from its relay facts (``v2proxy.core.relay.relays``: data, no call); where they say
  no (``norelay`` rows) the request goes to ``infer`` alone (until the decision moved into the
  core, ``relay_infer`` was asked and declined: one call more). A
  request that a stage applies to never offers a relay: ``nothing_to_do`` decides first. A
  JSON body to a backend that takes every JSON body transcoded (``norelay-known``:
  ``transcodes_json``, ``--backend-encoding binary``) is not offered at all: ``infer`` only.
- Classification costs backend calls besides the inference: ``server_metadata`` (cached 30 s,
  :mod:`v2proxy.core.knowledge`) whenever no labels are configured here, and ``model_metadata``
  plus ``model_config`` (cached 30 s per model) to learn the batching whenever the proxy classifies.
  A decoupled model's three responses share the cache: those calls happen once per stream.
- ``class-backend``: the backend classifies and the request reaches it with its parameter
  unchanged, yet a REST body is not relayed (``classification`` is in ``STAGE_PARAMS``): it is
  decoded, re-encoded, and costs a ``server_metadata`` question besides.
- ``binary_data_output`` in a JSON body stops the relay even when every output is listed, where
  it changes nothing in the answer (each listed output's own ``binary_data`` decides).
- A binary body relays with FP16 inputs, ``binary_data_output`` or ``binary_data``; a JSON one
  does not.
- A shared-memory output of a decoupled model is written into the same place of the region once
  per response (each response comes back ``in_shm``): the last response wins.
- A request naming a region is checked for ``inference`` only: ``--client-shm`` decides on the
  region, not ``--restricted-api``'s ``shared-memory`` group.
- Unary and streamed inference go through the same loop of the stages
  (``v2proxy.core.stages.chain.Stages.run``): with two stages at once (``shm-out+class``) every
  response of a decoupled model is classified and written to the region, and the region is
  acquired once for the whole stream and released once at its end.
- A gRPC message (``message`` rows) is relayed with one ``relay_message`` call when no stage
  applies, FP16 inputs included; one carrying a parameter the full path's encoder leaves out
  (``binary_data_output``, an output's ``binary_data``) goes the full path, as does one a stage
  applies to; to a backend whose facts decline it (``norelay``) it goes as ``infer``.
- A message of a gRPC stream (``stream-message`` rows) is decided as a unary message is: one
  ``relay_message`` call (told ``streamed``) when no stage applies, the backend's bytes its one
  answer; to a backend whose facts decline it (``norelay``, a decoupled model) it goes as
  ``stream_infer`` (all three responses of ``x3``); a stage, a wire-only parameter or the
  final-response flag go to ``stream_infer`` without offering a relay.
- A decoupled model reached over REST is the backend's business (``infer``, one answer): the
  pipeline does not tell the two apart, so the ``x3`` rows are stream rows only.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import posix_ipc
import pytest

from tests.unit.fake_backend import Answers, FakeBackend, Sent
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.codecs import binary as binc
from v2proxy.codecs.dtypes import deserialize_bytes
from v2proxy.core.model import Datatype, InferRequest, InferResponse, RequestedOutput, Tensor
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import Headers
from v2proxy.frontends.rest import RestFrontend
from v2proxy.ops.config_sections import ModelSettings, OutputSettings
from v2proxy.shm.registry import Registry

MODEL = "m"
RID = "rid-1"
LIMIT = 1 << 20
#: the client's own end-to-end header: what every backend call must carry
TOKEN: Headers = [(b"x-token", b"t1")]

X = [0.5, 3.0, 1.5, 2.0]  # the client's input, in the body
X_SHM = [9.0, 8.0, 7.0, 6.0]  # the same input, in the client's region
OUT0 = np.array([[0.5, 3.0, 1.5, 2.0]], "<f4")  # the backend's outputs
OUT1 = np.array([[1.0, 1.0, 1.0, 1.0]], "<f4")
LABELS = ("a", "b", "c", "d")
TOP2 = ["3.000000:1", "2.000000:3"]
TOP2_LABELLED = ["3.000000:1:b", "2.000000:3:d"]
TOP2_ONES = ["1.000000:0", "1.000000:1"]


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Stage:
    """What the client asks for, and what the stages make of it when they run."""

    name: str
    # the client's request
    input_datatype: str = "FP32"
    input_shm: bool = False
    #: requested outputs (name, parameters); None: none listed
    outputs: tuple[tuple[str, dict[str, Any]], ...] | None = (("OUT0", {}),)
    parameters: dict[str, Any] = field(default_factory=dict)
    #: labels configured here for (m, OUT0)
    labels: bool = False
    #: the backend's server metadata ``extensions``
    extensions: tuple[str, ...] = ("classification",)
    # when the request goes through the stages: what the backend is asked ...
    sent_outputs: tuple[tuple[str, dict[str, Any]], ...] | None = (("OUT0", {}),)
    # ... and what the client gets: the outputs' names, and OUT0 as
    #: "raw" (the backend's bytes), "top2" / "top2-labelled" (classified), "shm" (in the region)
    answer_outputs: tuple[str, ...] = ("OUT0",)
    out0: str = "raw"
    #: OUT1 as "raw" (not checked) or "top2-ones" (classified: the backend's OUT1 is all ones)
    out1: str = "raw"


CLASS = {"classification": 2}
SHM_OUT = {"shared_memory_region": "out", "shared_memory_byte_size": 64}

NONE = Stage("none")
CLASS_LABELS = Stage("class-labels", outputs=(("OUT0", CLASS),), labels=True, out0="top2-labelled")
CLASS_BACKEND = Stage("class-backend", outputs=(("OUT0", CLASS),), sent_outputs=(("OUT0", CLASS),))
CLASS_PROXY = Stage("class-proxy", outputs=(("OUT0", CLASS),), extensions=(), out0="top2")
SHM_IN = Stage("shm-in", input_shm=True)
SHM_OUT_STAGE = Stage("shm-out", outputs=(("OUT0", SHM_OUT),), out0="shm")
BINARY_OUTPUT = Stage(
    "binary-output",
    outputs=None,
    parameters={"binary_data_output": True},
    sent_outputs=None,
    answer_outputs=("OUT0", "OUT1"),
)
BINARY_OUTPUT_LISTED = Stage("binary-output-listed", parameters={"binary_data_output": True})
BINARY_DATA = Stage(
    "binary-data",
    outputs=(("OUT0", {"binary_data": True}),),
    sent_outputs=(("OUT0", {"binary_data": True}),),
)
FP16 = Stage("fp16", input_datatype="FP16")
SHM_OUT_CLASS = Stage(
    "shm-out+class",
    outputs=(("OUT0", SHM_OUT), ("OUT1", CLASS)),
    extensions=(),
    sent_outputs=(("OUT0", {}), ("OUT1", {})),
    answer_outputs=("OUT0", "OUT1"),
    out0="shm",
    out1="top2-ones",
)

JSON, BINARY, GRPC, STREAM, MESSAGE = "json", "binary", "grpc", "stream", "message"
STREAM_MESSAGE = "stream-message"
FORWARD, RESPONSE = "forward", "response"

# backend calls
RELAY, INFER, STREAM_INFER = "relay_infer", "infer", "stream_infer"
RELAY_MESSAGE = "relay_message"
SERVER_META, MODEL_META, MODEL_CONFIG = "server_metadata", "model_metadata", "model_config"


@dataclass(frozen=True)
class Row:
    wire: str
    stage: Stage
    #: whether the backend's ``relay_infer`` takes the body (for both wire forms), else None
    can_relay: bool = True
    #: how many responses ``stream_infer`` gives (3: a decoupled model)
    responses: int = 1
    # ---- what happens today: change these when the pipeline changes
    #: every backend call, in order
    backend_calls: tuple[str, ...] = ()
    #: ``AccessPolicy.check`` calls with the group ``inference`` (no other group is checked):
    #: the REST frontend's one, as it admits the request; none in the pipeline
    access_checks: int = 1
    #: FORWARD (the backend's pass-through answer, unchanged) or RESPONSE (an InferResponse)
    answer: str = RESPONSE
    #: regions acquired for the request, each released exactly once (None: not counted)
    region_holds: int | None = None
    #: a stream message whose client asked for the final-response flag (not relayable)
    final_flag: bool = False
    #: the backend takes every JSON body transcoded (``transcodes_json``)
    known: bool = False

    @property
    def id(self) -> str:
        parts = [self.wire, self.stage.name]
        if not self.can_relay:
            parts.append("norelay-known" if self.known else "norelay")
        if self.final_flag:
            parts.append("final-flag")
        if self.responses != 1:
            parts.append(f"x{self.responses}")
        return "/".join(parts)


_CLASS_LABELS_CALLS = (INFER, MODEL_META, MODEL_CONFIG)
_CLASS_BACKEND_CALLS = (SERVER_META, INFER)
_CLASS_PROXY_CALLS = (SERVER_META, INFER, MODEL_META, MODEL_CONFIG)

# fmt: off
ROWS = [
    # ---- REST, JSON body
    Row(JSON, NONE, backend_calls=(RELAY,), access_checks=1, answer=FORWARD),
    Row(JSON, NONE, can_relay=False, backend_calls=(INFER,), access_checks=1),
    Row(JSON, NONE, can_relay=False, known=True, backend_calls=(INFER,), access_checks=1),
    Row(JSON, FP16, backend_calls=(INFER,), access_checks=1),
    Row(JSON, BINARY_OUTPUT, backend_calls=(INFER,), access_checks=1),
    Row(JSON, BINARY_OUTPUT_LISTED, backend_calls=(INFER,), access_checks=1),
    Row(JSON, BINARY_DATA, backend_calls=(INFER,), access_checks=1),
    Row(JSON, CLASS_LABELS, backend_calls=_CLASS_LABELS_CALLS, access_checks=1),
    Row(JSON, CLASS_BACKEND, backend_calls=_CLASS_BACKEND_CALLS, access_checks=1),
    Row(JSON, CLASS_PROXY, backend_calls=_CLASS_PROXY_CALLS, access_checks=1),
    Row(JSON, SHM_IN, backend_calls=(INFER,), access_checks=1),
    Row(JSON, SHM_OUT_STAGE, backend_calls=(INFER,), access_checks=1),
    # ---- REST, binary tensors
    Row(BINARY, NONE, backend_calls=(RELAY,), access_checks=1, answer=FORWARD),
    Row(BINARY, NONE, can_relay=False, backend_calls=(INFER,), access_checks=1),
    Row(BINARY, FP16, backend_calls=(RELAY,), access_checks=1, answer=FORWARD),
    Row(BINARY, FP16, can_relay=False, backend_calls=(INFER,), access_checks=1),
    Row(BINARY, BINARY_OUTPUT, backend_calls=(RELAY,), access_checks=1,
        answer=FORWARD),
    Row(BINARY, BINARY_DATA, backend_calls=(RELAY,), access_checks=1,
        answer=FORWARD),
    Row(BINARY, CLASS_LABELS, backend_calls=_CLASS_LABELS_CALLS, access_checks=1),
    Row(BINARY, CLASS_BACKEND, backend_calls=_CLASS_BACKEND_CALLS, access_checks=1),
    Row(BINARY, CLASS_PROXY, backend_calls=_CLASS_PROXY_CALLS, access_checks=1),
    Row(BINARY, SHM_IN, backend_calls=(INFER,), access_checks=1),
    Row(BINARY, SHM_OUT_STAGE, backend_calls=(INFER,), access_checks=1),
    # ---- a decoded request: Pipeline.staged (gRPC); no relay is ever offered
    Row(GRPC, NONE, backend_calls=(INFER,), access_checks=0),
    Row(GRPC, FP16, backend_calls=(INFER,), access_checks=0),
    Row(GRPC, BINARY_OUTPUT, backend_calls=(INFER,), access_checks=0),
    Row(GRPC, CLASS_LABELS, backend_calls=_CLASS_LABELS_CALLS, access_checks=0),
    Row(GRPC, CLASS_BACKEND, backend_calls=_CLASS_BACKEND_CALLS, access_checks=0),
    Row(GRPC, CLASS_PROXY, backend_calls=_CLASS_PROXY_CALLS, access_checks=0),
    Row(GRPC, SHM_IN, backend_calls=(INFER,), access_checks=0),
    Row(GRPC, SHM_OUT_STAGE, backend_calls=(INFER,), access_checks=0),
    # ---- a gRPC message: Pipeline.infer_message, relayed when nothing needs changing
    Row(MESSAGE, NONE, backend_calls=(RELAY_MESSAGE,), access_checks=0, answer=FORWARD),
    Row(MESSAGE, NONE, can_relay=False, backend_calls=(INFER,), access_checks=0),
    Row(MESSAGE, FP16, backend_calls=(RELAY_MESSAGE,), access_checks=0, answer=FORWARD),
    Row(MESSAGE, BINARY_OUTPUT, backend_calls=(INFER,), access_checks=0),
    Row(MESSAGE, BINARY_DATA, backend_calls=(INFER,), access_checks=0),
    Row(MESSAGE, CLASS_LABELS, backend_calls=_CLASS_LABELS_CALLS, access_checks=0),
    Row(MESSAGE, CLASS_BACKEND, backend_calls=_CLASS_BACKEND_CALLS, access_checks=0),
    Row(MESSAGE, CLASS_PROXY, backend_calls=_CLASS_PROXY_CALLS, access_checks=0),
    Row(MESSAGE, SHM_IN, backend_calls=(INFER,), access_checks=0),
    Row(MESSAGE, SHM_OUT_STAGE, backend_calls=(INFER,), access_checks=0),
    Row(MESSAGE, SHM_OUT_CLASS, backend_calls=(SERVER_META, INFER, MODEL_META, MODEL_CONFIG),
        access_checks=0, region_holds=1),
    # ---- a decoded request: Pipeline.stream_infer, a plain model (1) or a decoupled one (x3)
    Row(STREAM, NONE, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM, NONE, responses=3, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM, CLASS_LABELS, backend_calls=(STREAM_INFER, MODEL_META, MODEL_CONFIG),
        access_checks=0),
    Row(STREAM, CLASS_LABELS, responses=3, backend_calls=(STREAM_INFER, MODEL_META,
        MODEL_CONFIG), access_checks=0),
    Row(STREAM, CLASS_BACKEND, responses=3, backend_calls=(SERVER_META, STREAM_INFER),
        access_checks=0),
    Row(STREAM, CLASS_PROXY, responses=3, backend_calls=(SERVER_META, STREAM_INFER,
        MODEL_META, MODEL_CONFIG), access_checks=0),
    Row(STREAM, SHM_IN, responses=3, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM, SHM_OUT_STAGE, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM, SHM_OUT_STAGE, responses=3, backend_calls=(STREAM_INFER,), access_checks=0),
    # ---- two stages at once, unary and streamed: the one loop of the stages
    Row(GRPC, SHM_OUT_CLASS, backend_calls=(SERVER_META, INFER, MODEL_META, MODEL_CONFIG),
        access_checks=0, region_holds=1),
    Row(STREAM, SHM_OUT_CLASS, backend_calls=(SERVER_META, STREAM_INFER, MODEL_META,
        MODEL_CONFIG), access_checks=0, region_holds=1),
    Row(STREAM, SHM_OUT_CLASS, responses=3, backend_calls=(SERVER_META, STREAM_INFER,
        MODEL_META, MODEL_CONFIG), access_checks=0, region_holds=1),
    # ---- a message of a gRPC stream: Pipeline.stream_message, relayed when nothing needs
    # changing, else stream_infer's path (a decoupled model: the backend declines the relay)
    Row(STREAM_MESSAGE, NONE, backend_calls=(RELAY_MESSAGE,), access_checks=0, answer=FORWARD),
    Row(STREAM_MESSAGE, NONE, can_relay=False, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM_MESSAGE, NONE, can_relay=False, responses=3, backend_calls=(STREAM_INFER,),
        access_checks=0),
    Row(STREAM_MESSAGE, NONE, final_flag=True, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM_MESSAGE, FP16, backend_calls=(RELAY_MESSAGE,), access_checks=0,
        answer=FORWARD),
    Row(STREAM_MESSAGE, BINARY_OUTPUT, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM_MESSAGE, BINARY_DATA, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM_MESSAGE, CLASS_LABELS, backend_calls=(STREAM_INFER, MODEL_META, MODEL_CONFIG),
        access_checks=0),
    Row(STREAM_MESSAGE, CLASS_BACKEND, backend_calls=(SERVER_META, STREAM_INFER),
        access_checks=0),
    Row(STREAM_MESSAGE, CLASS_PROXY, can_relay=False, responses=3, backend_calls=(
        SERVER_META, STREAM_INFER, MODEL_META, MODEL_CONFIG), access_checks=0),
    Row(STREAM_MESSAGE, SHM_IN, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM_MESSAGE, SHM_OUT_STAGE, backend_calls=(STREAM_INFER,), access_checks=0),
    Row(STREAM_MESSAGE, SHM_OUT_CLASS, can_relay=False, responses=3, backend_calls=(
        SERVER_META, STREAM_INFER, MODEL_META, MODEL_CONFIG), access_checks=0,
        region_holds=1),
]
# fmt: on


# --------------------------------------------------------------------------- fakes and fixtures


class CountingAccess:
    """An AccessPolicy that restricts every group (so none is skipped), allows every request
    and counts its checks per group."""

    def __init__(self) -> None:
        self.checks: Counter[str] = Counter()
        self.headers: list[Headers] = []

    def restricts(self, group: str) -> bool:
        return True

    def check(self, group: str, headers: Headers) -> None:
        self.checks[group] += 1
        self.headers.append(list(headers))


class FakeHttpRequest:
    """What ``RestFrontend.dispatch`` and the /infer handler read of an HTTP request: a whole
    body, already arrived, from a unix socket (``client`` None: a local client)."""

    def __init__(self, path: str, headers: Headers, body: bytes) -> None:
        self.method = "POST"
        self.path = path
        self.target = path.encode()
        self.query = b""
        self.headers = headers
        self.content_length = len(body)
        self.chunked = False
        self.keep_alive = True
        self.client = None
        self._body = body
        self.state = None  # (what a handler made of it: HttpRequest.state)

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)

    def whole(self, limit: int) -> bytes | None:
        return self._body if len(self._body) <= limit else None

    async def read(self, limit: int | None = None) -> bytearray:
        return bytearray(self._body)

    async def chunks(self) -> Any:
        yield self._body


class FakeHttpResponse:
    """Keeps what the frontend writes."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: Any = None

    async def send(self, status: int, headers: list[tuple[bytes, bytes]], body: Any) -> None:
        self.status, self.headers, self.body = status, list(headers), body

    async def start(self, status: int, headers: list[tuple[bytes, bytes]], length: Any) -> None:
        self.status, self.headers, self.body = status, list(headers), bytearray()

    async def write(self, chunk: bytes) -> None:
        self.body += chunk

    async def end(self) -> None:
        return None

    def abort(self) -> None:
        raise AssertionError("the answer broke off")


@pytest.fixture
def regions() -> Iterator[Registry]:
    """The registry with "in" (16 bytes holding X_SHM) and "out" (64 bytes, zeroed) on one
    real POSIX object, unlinked at the end."""
    key = f"/v2proxy_unit_table_{os.getpid()}"
    mem = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=2 * 4096)
    reg = Registry()
    try:
        reg.register("in", key, 0, 16)
        reg.register("out", key, 4096, 64)
        held = reg.acquire("in")
        held.write(0, np.array(X_SHM, "<f4").tobytes())
        reg.release(held)
        yield reg
    finally:
        reg.close()
        mem.close_fd()
        mem.unlink()


class CountingRegions:
    """The registry as the pipeline sees it, counting the acquisitions and releases."""

    def __init__(self, inner: Registry) -> None:
        self.inner = inner
        self.acquired = 0
        self.released = 0

    def acquire(self, name: str) -> Any:
        self.acquired += 1
        return self.inner.acquire(name)

    def release(self, region: Any) -> None:
        self.released += 1
        self.inner.release(region)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _region_bytes(reg: Registry, name: str, size: int) -> bytes:
    region = reg.acquire(name)
    try:
        return bytes(region.read(0, size))
    finally:
        reg.release(region)


# --------------------------------------------------------------------------- requests


def _input_bytes(stage: Stage) -> bytes:
    dtype = "<f2" if stage.input_datatype == "FP16" else "<f4"
    return np.array([X], dtype).tobytes()


def _input_params(stage: Stage) -> dict[str, Any]:
    if stage.input_shm:
        return {"shared_memory_region": "in", "shared_memory_byte_size": 16}
    return {}


def _rest_body(stage: Stage, binary: bool) -> tuple[bytes, int | None]:
    """The client's body and its Inference-Header-Content-Length (None: JSON)."""
    entry: dict[str, Any] = {"name": "IN0", "datatype": stage.input_datatype, "shape": [1, 4]}
    params = _input_params(stage)
    section = b""
    if not stage.input_shm:
        if binary:
            section = _input_bytes(stage)
            params = {**params, "binary_data_size": len(section)}
        else:
            entry["data"] = X
    if params:
        entry["parameters"] = params
    obj: dict[str, Any] = {"id": RID, "inputs": [entry]}
    if stage.outputs is not None:
        obj["outputs"] = [
            {"name": n, "parameters": p} if p else {"name": n} for n, p in stage.outputs
        ]
    if stage.parameters:
        obj["parameters"] = stage.parameters
    header = json.dumps(obj).encode()
    if not binary:
        return header, None
    return header + section, len(header)


def _decoded(stage: Stage) -> InferRequest:
    """The request as the gRPC frontend decodes it."""
    data = b"" if stage.input_shm else _input_bytes(stage)
    tensor = Tensor("IN0", Datatype(stage.input_datatype), (1, 4), data, _input_params(stage))
    outputs = (
        None if stage.outputs is None else [RequestedOutput(n, dict(p)) for n, p in stage.outputs]
    )
    return InferRequest(MODEL, [tensor], outputs, RID, dict(stage.parameters))


def _message_answer() -> bytes:
    """The gRPC backend's serialized answer to a relayed message: what the full path would
    answer (the request's id, the model's name, OUT0 raw)."""
    msg = pb.ModelInferResponse(model_name=MODEL, id=RID)
    msg.outputs.add(name="OUT0", datatype="FP32", shape=[1, 4])
    msg.raw_output_contents.append(OUT0.tobytes())
    return msg.SerializeToString()


async def _rest(
    pipeline: Pipeline, access: CountingAccess, body: bytes, ihcl: int | None
) -> FakeHttpResponse:
    headers: Headers = [(b"content-type", b"application/json"), *TOKEN]
    if ihcl is not None:
        headers.append((b"inference-header-content-length", str(ihcl).encode()))
    frontend = RestFrontend(pipeline, LIMIT, LIMIT, access=access)
    response = FakeHttpResponse()
    await frontend.dispatch(  # type: ignore[arg-type]
        FakeHttpRequest(f"/v2/models/{MODEL}/infer", headers, body), response
    )
    return response


def _answer_of(response: FakeHttpResponse) -> InferResponse:
    """The client's answer decoded (it is JSON or binary-framed)."""
    assert response.status == 200, response.body
    body = response.body
    data = b"".join(bytes(c) for c in body) if isinstance(body, list) else bytes(body)
    ihcl = next((v for n, v in response.headers if n == b"inference-header-content-length"), None)
    return binc.decode_response(data, None if ihcl is None else int(ihcl))


# --------------------------------------------------------------------------- the test


def _strings(t: Tensor) -> list[str]:
    assert t.datatype is Datatype.BYTES
    return [b.decode() for b in deserialize_bytes(t.data)]


def _check_response(row: Row, response: InferResponse, regions: Registry) -> None:
    stage = row.stage
    assert response.id == RID
    assert response.model_name == MODEL
    assert tuple(t.name for t in response.outputs) == stage.answer_outputs
    out0 = response.outputs[0]
    if stage.out0 == "raw":
        assert (out0.datatype, bytes(out0.data)) == (Datatype.FP32, OUT0.tobytes())
    elif stage.out0 == "top2":
        assert (out0.shape, _strings(out0)) == ((1, 2), TOP2)
    elif stage.out0 == "top2-labelled":
        assert (out0.shape, _strings(out0)) == ((1, 2), TOP2_LABELLED)
    else:
        assert stage.out0 == "shm"
        assert bytes(out0.data) == b""
        assert _region_bytes(regions, "out", OUT0.nbytes) == OUT0.tobytes()
    if stage.out1 == "top2-ones":
        out1 = response.outputs[1]
        assert (out1.shape, _strings(out1)) == ((1, 2), TOP2_ONES)


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
async def test_pipeline_table(row: Row, regions: Registry) -> None:
    stage = row.stage
    backend = FakeBackend(
        Answers(
            outputs=[
                Tensor("OUT0", Datatype.FP32, (1, 4), OUT0.tobytes()),
                Tensor("OUT1", Datatype.FP32, (1, 4), OUT1.tobytes()),
            ],
            relay={False: row.can_relay, True: row.can_relay},
            declines_json=row.known,
            relay_message=row.can_relay,
            message_answer=_message_answer(),
            extensions=("binary_tensor_data", *stage.extensions),
            stream_responses=row.responses,
            model_metadata={"name": MODEL, "outputs": [{"name": "OUT0", "shape": [-1, 4]}]},
            model_config={"max_batch_size": 8},
        )
    )
    access = CountingAccess()
    models = {MODEL: ModelSettings({"OUT0": OutputSettings(LABELS)})} if stage.labels else None
    counting = CountingRegions(regions)
    pipeline = Pipeline(backend, LIMIT, models=models, shm=counting)

    responses: list[InferResponse] = []
    body: bytes | None = None
    ihcl: int | None = None
    if row.wire in (JSON, BINARY):
        body, ihcl = _rest_body(stage, binary=row.wire == BINARY)
        http = await _rest(pipeline, access, body, ihcl)
        if row.answer == FORWARD:
            # the backend's answer, passed through unchanged (its very body object)
            (forwarded,) = backend.forwarded
            assert http.status == forwarded.status
            assert http.headers == forwarded.headers
            assert http.body is forwarded.content
        else:
            responses.append(_answer_of(http))
    elif row.wire == MESSAGE:
        body = b"the client's message, opaque to the pipeline"
        answer = await pipeline.infer_message(body, _decoded(stage), list(TOKEN), None)
        if row.answer == FORWARD:
            assert answer is backend.answers.message_answer  # the backend's bytes, unchanged
        else:
            assert isinstance(answer, InferResponse)
            responses.append(answer)
    elif row.wire == STREAM_MESSAGE:
        body = b"the client's message, opaque to the pipeline"
        answers = [
            a
            async for a in pipeline.stream_message(
                body, _decoded(stage), not row.final_flag, list(TOKEN), None
            )
        ]
        if row.answer == FORWARD:
            # the backend's bytes, unchanged, as the one answer
            assert len(answers) == 1
            assert answers[0] is backend.answers.message_answer
        else:
            assert all(isinstance(a, InferResponse) for a in answers)
            responses = [a for a in answers if isinstance(a, InferResponse)]
    elif row.wire == GRPC:
        responses.append(await pipeline.staged(_decoded(stage), list(TOKEN), None))
    else:
        responses = [r async for r in pipeline.stream_infer(_decoded(stage), list(TOKEN), None)]

    # the backend calls, exactly
    assert tuple(backend.names()) == row.backend_calls
    # the access policy: only the inference group, this many times
    assert access.checks == Counter({"inference": row.access_checks})

    for call in backend.called("relay_infer"):
        assert call.args == (MODEL, "", body, ihcl, TOKEN)  # the client's bytes, unchanged
    for call in backend.called("relay_message"):
        assert call.args == (MODEL, "", body, TOKEN)  # the client's bytes unchanged
        # a stream's message is told so (its errors name streaming inference)
        assert call.kwargs == {"streamed": row.wire == STREAM_MESSAGE}
    for call in backend.called("model_metadata") + backend.called("model_config"):
        assert call.args == (MODEL, "")
    for call in backend.called("infer") + backend.called("stream_infer"):
        sent, headers = call.args
        assert isinstance(sent, Sent)
        assert headers == TOKEN
        assert (sent.model, sent.id) == (MODEL, RID)
        ((name, datatype, shape, data, params),) = sent.inputs
        assert (name, datatype, shape, params) == ("IN0", stage.input_datatype, (1, 4), {})
        if stage.input_shm:
            assert data == np.array([X_SHM], "<f4").tobytes()  # read from the region
        else:
            assert data == _input_bytes(stage)
        assert sent.outputs == stage.sent_outputs

    if row.answer == FORWARD:
        assert responses == []
        assert _region_bytes(regions, "out", 64) == bytes(64)  # no stage ran
        return
    assert len(responses) == row.responses
    for response in responses:
        _check_response(row, response, regions)
    if stage.out0 != "shm":
        assert _region_bytes(regions, "out", 64) == bytes(64)
    assert [r["name"] for r in regions.status("")] == ["in", "out"]
    assert (regions.users("in"), regions.users("out")) == (0, 0)  # every region released
    if row.region_holds is not None:
        assert (counting.acquired, counting.released) == (row.region_holds, row.region_holds)
