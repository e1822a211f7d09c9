"""The REST backend's binary requests and its reading of a refusal (backends/rest_requests.py,
backends/rest_encoding.py): a binary /infer body asks every output binary both ways (each listed
output's ``binary_data`` and the request's ``binary_data_output``); only an error answer about
the binary body itself is taken for a refusal of binary tensors. The error bodies are those the
real servers wrote (KServe 0.21, MLServer 1.7.1), each read as the backend reads it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from v2proxy.backends.rest import RestBackend
from v2proxy.backends.rest_answers import error_message
from v2proxy.backends.rest_encoding import AUTO_BINARY_MIN, Encoding, refuses_binary
from v2proxy.backends.rest_requests import JOIN_MAX, BinaryHeads, infer_body, infer_headers
from v2proxy.core.decide import BINARY, JSON, relays
from v2proxy.core.errors import BackendUnavailable
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.model import Buffer, Datatype, InferRequest, RequestedOutput, Tensor

X = np.array([0.5, -1.25, 65504.0], dtype=np.float16)


class _Server:
    """A backend's metadata calls: ``GET /v2`` answers ``answer`` (an exception is raised)."""

    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer

    async def server_metadata(self) -> dict[str, Any]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        raise AssertionError("not asked")

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        raise AssertionError("not asked")


def _request(outputs: list[RequestedOutput] | None, **params: Any) -> InferRequest:
    tensor = Tensor("INPUT0", Datatype.FP16, (3,), X.tobytes())
    return InferRequest("m", [tensor], outputs, parameters=dict(params))


def _head(chunks: list[Buffer], ihcl: int | None) -> Any:
    return json.loads(bytes(chunks[0]) if ihcl is None else bytes(chunks[0])[:ihcl])


def test_binary_body_asks_listed_outputs_binary_both_ways() -> None:
    req = _request([RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT1", {"binary_data": False})])
    chunks, ihcl = infer_body(req, binary=True)
    head = _head(chunks, ihcl)
    assert len(chunks) == 1  # a small body: one buffer
    assert bytes(chunks[0])[ihcl:] == X.tobytes()
    assert head["inputs"][0]["parameters"] == {"binary_data_size": X.nbytes}
    assert [o["parameters"]["binary_data"] for o in head["outputs"]] == [True, True]
    assert head["parameters"] == {"binary_data_output": True}


def test_binary_body_without_outputs_asks_all_binary() -> None:
    chunks, ihcl = infer_body(_request(None, binary_data_output=False, priority=2), binary=True)
    head = _head(chunks, ihcl)
    assert "outputs" not in head
    assert head["parameters"] == {"priority": 2, "binary_data_output": True}


def test_shared_memory_output_is_not_asked_binary() -> None:
    shm = {"shared_memory_region": "r", "shared_memory_byte_size": 6}
    req = _request([RequestedOutput("OUTPUT0", shm), RequestedOutput("OUTPUT1")])
    chunks, ihcl = infer_body(req, binary=True)
    head = _head(chunks, ihcl)
    assert [o["parameters"]["binary_data"] for o in head["outputs"]] == [False, True]
    assert "parameters" not in head  # Triton refuses binary data for a shared-memory output


def test_json_body_asks_nothing_binary() -> None:
    chunks, ihcl = infer_body(
        _request([RequestedOutput("OUTPUT0")], binary_data_output=True), False
    )
    head = _head(chunks, ihcl)
    assert ihcl is None and len(chunks) == 1
    assert head["inputs"][0]["data"] == X.tolist()
    assert head["outputs"][0]["parameters"] == {"binary_data": False}
    assert "parameters" not in head


_MLSERVER_JSON_INVALID = (
    b'{"detail":[{"type":"json_invalid","loc":["body",149],"msg":"JSON decode error",'
    b'"input":{},"ctx":{"error":"unexpected content after document"}}]}'
)
_MLSERVER_NOT_AN_OBJECT = (
    b'{"detail":[{"type":"model_attributes_type","loc":["body"],"msg":"Input should be a valid'
    b' dictionary or object to extract fields from","input":"{\\"inputs\\": []}"}]}'
)

REFUSALS = [
    (422, _MLSERVER_JSON_INVALID),
    (422, _MLSERVER_NOT_AN_OBJECT),
    (500, b"Internal Server Error"),  # MLServer: a binary body that is not UTF-8
    (400, b'{"detail":"There was an error parsing the body"}'),  # FastAPI (KServe)
    (400, b'{"error":"Unrecognized request format: unexpected character: line 1 column 150"}'),
    (
        400,
        b'{"error":"received byte inputs, but the\'inference-header-content-length\' header is'
        b' missing."}',
    ),
    (415, b"Unsupported Media Type"),
]

NOT_REFUSALS = [
    # KServe took the binary inputs; its model writes FP16 outputs as JSON whatever was asked
    (
        400,
        b'{"error":"Sending FP16 data via JSON is not supported. Please use the binary data'
        b' format for output OUTPUT0"}',
    ),
    (400, b"{\"error\":\"Unexpected inference output 'NOPE' for model 'identity_fp16'\"}"),
    (400, b'{"error":"INPUT0/INPUT1 must both be [N,16] or [16], got [3] and [3]"}'),
    (400, b'{"error":"input \'INPUT0\' must be FP32, got FP16"}'),  # MLServer's model, JSON
    (500, b'{"error":"TypeError : sequence item 1: expected a bytes-like object, NoneType found"}'),
    (500, b'{"error":"Internal Server Error: the model crashed"}'),
    (503, b'{"error":"Model with name identity_fp16 is not ready."}'),
    (422, b'{"error":"Input Validation Error"}'),
    (404, b'{"error":"Model with name nope does not exist."}'),
]


@pytest.mark.parametrize(("status", "body"), REFUSALS)
def test_refusals_of_binary_tensors(status: int, body: bytes) -> None:
    assert refuses_binary(status, error_message(body, status))


@pytest.mark.parametrize(("status", "body"), NOT_REFUSALS)
def test_errors_that_are_no_refusal_of_binary_tensors(status: int, body: bytes) -> None:
    assert not refuses_binary(status, error_message(body, status))


@pytest.mark.parametrize(
    ("metadata", "tried"),
    [
        ({"name": "mlserver", "version": "1.7.1", "extensions": []}, False),
        (
            {"name": "kserve", "version": "0.21.0", "extensions": ["model_repository_extension"]},
            True,
        ),
    ],
)
async def test_mlserver_is_never_tried_binary(metadata: dict[str, Any], tried: bool) -> None:
    encoding = Encoding("auto", "http://b", BackendKnowledge(_Server(metadata)))
    assert await encoding.binary() is False
    assert encoding.try_unlisted(_request(None)) is tried


@pytest.mark.parametrize("setting", ["auto", "json", "binary"])
@pytest.mark.parametrize("listed", [True, False, None])  # None: the backend cannot be asked
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("size", [100, AUTO_BINARY_MIN])
async def test_the_relay_decision_from_the_encodings_facts(
    setting: str, listed: bool | None, binary: bool, size: int
) -> None:
    """The core's one decision (``relays``) from a REST backend's facts: known without asking
    for the small JSON body whatever the setting; else, once learnt, a binary body relays to a
    backend that lists binary tensors, a large JSON one in ``auto`` to one that does not (or
    cannot say), each as the setting fixes it otherwise; and what was learnt stays known."""
    answer: dict[str, Any] | Exception = (
        BackendUnavailable("no answer")
        if listed is None
        else {"extensions": ["binary_tensor_data"] if listed else []}
    )
    encoding = Encoding(setting, "http://b", BackendKnowledge(_Server(answer)))
    form = BINARY if binary else JSON
    known = relays(form, size, encoding.facts())
    if not binary and size < AUTO_BINARY_MIN:
        assert known is (setting != "binary")
    facts = await encoding.learn()  # a backend that cannot say leaves its capability unknown
    learnt = relays(form, size, facts, learnt=True)
    takes_binary = {"json": False, "binary": True}.get(setting, bool(listed))
    if binary:
        expected = takes_binary
    elif setting == "auto" and size >= AUTO_BINARY_MIN:
        expected = not takes_binary
    else:
        expected = setting != "binary"
    assert learnt is expected
    if known is not None:
        assert known is learnt
    if listed is not None or setting != "auto":  # learnt once: known from then on
        assert relays(form, size, encoding.facts()) is learnt


@pytest.mark.parametrize(
    ("setting", "transcodes"), [("json", False), ("auto", False), ("binary", True)]
)
def test_only_binary_transcodes_every_json_body(setting: str, transcodes: bool) -> None:
    """The REST backend takes every JSON body transcoded with ``--backend-encoding binary``
    only (``auto`` relays a small one, and asks for a large one)."""
    assert RestBackend("http://127.0.0.1:1", setting).transcodes_json is transcodes


def _plain(
    outputs: list[RequestedOutput] | None = None, size: int = 3, **params: Any
) -> InferRequest:
    tensor = Tensor("INPUT0", Datatype.FP16, (size,), np.zeros(size, np.float16).tobytes())
    return InferRequest("m", [tensor], outputs, parameters=dict(params))


@pytest.mark.parametrize(
    "request_",
    [
        _plain(),
        _plain(binary_data_output=False),
        _plain([RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT1", {"binary_data": False})]),
        _plain([]),
        _plain(size=4),
        _plain(sequence_id=3),
        _plain([RequestedOutput("OUTPUT0", {"classification": 2})]),
        _plain([RequestedOutput("OUTPUT0", {"shared_memory_region": "r"})]),
        InferRequest("m", _plain().inputs, id="r1"),
        InferRequest("m", [Tensor("I", Datatype.INT8, (1,), b"\x01", {"p": 1})]),
    ],
    ids=[
        "plain",
        "binary_data_output",
        "outputs listed",
        "no outputs",
        "another size",
        "other parameters",
        "output parameters",
        "shm output",
        "id",
        "input parameters",
    ],
)
def test_binary_heads_are_the_headers_made_each_time(request_: InferRequest) -> None:
    """Whatever the request, the header a backend's :class:`BinaryHeads` gives (made once
    for a request of the plain kind, then reused) is the one made for it alone."""
    heads = BinaryHeads()
    alone = infer_body(request_, True)
    for _ in range(2):
        assert infer_body(request_, True, heads) == alone
    for other in (_plain(), _plain(size=5), _plain([RequestedOutput("X")])):
        assert infer_body(other, True, heads) == infer_body(other, True)


def test_binary_heads_keep_the_plain_kind_only_and_at_most_kept() -> None:
    heads = BinaryHeads()
    first = heads.head(_plain())
    assert heads.head(_plain()) is first  # made once
    assert heads.head(_plain(sequence_id=3)) is not heads.head(_plain(sequence_id=3))
    for size in range(heads.KEPT):
        heads.head(_plain(size=size + 10))
    assert heads.head(_plain()) is not first  # the oldest, forgotten


def test_binary_request_headers_are_one_tuple_per_length() -> None:
    """A binary request that forwards no header has its headers as one tuple per JSON length
    (the HTTP client then remembers the head it makes), the same headers as with one."""
    first = infer_headers([], 231)
    assert isinstance(first, tuple)
    assert infer_headers([], 231) is first
    assert list(first) == [
        (b"Accept-Encoding", b"identity"),
        (b"Content-Type", b"application/octet-stream"),
        (b"Inference-Header-Content-Length", b"231"),
    ]
    forwarded = infer_headers([(b"x-a", b"1")], 231)
    assert list(forwarded) == [(b"x-a", b"1"), *first]


def test_a_large_binary_body_comes_in_pieces() -> None:
    """A binary body over JOIN_MAX is its header, then each tensor's own buffer (not copied
    into one); a smaller one is one buffer."""
    big = np.zeros(JOIN_MAX, np.uint8).tobytes()
    req = InferRequest("m", [Tensor("A", Datatype.UINT8, (JOIN_MAX,), big)])
    chunks, ihcl = infer_body(req, True)
    assert len(chunks) == 2 and ihcl == len(chunks[0]) and chunks[1] is big
    small = InferRequest("m", [Tensor("A", Datatype.UINT8, (4,), big[:4])])
    chunks, ihcl = infer_body(small, True)
    assert len(chunks) == 1 and bytes(chunks[0])[ihcl:] == big[:4]
