"""``core.decide.relays``: the one decision whether a body goes to the backend as the client sent
it, from its wire form, its size, whether the frontend rewrites the answer and the backend's
relay facts (data), as a table; and every way a request goes asks it and does what it says:
the pipeline's whole and streamed bodies, gRPC messages (unary and of a stream), and the REST
quick lane (tests/integration/test_quick_lane.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.unit import test_pipeline_table as pt
from tests.unit.fake_backend import Answers, FakeBackend
from tests.unit.test_pipeline_table import regions  # noqa: F401  (the fixture)
from v2proxy.codecs.binary import decode_request
from v2proxy.core import relay as relay_module
from v2proxy.core.decide import BINARY, JSON, MESSAGE, RAW, relays
from v2proxy.core.model import Buffer, InferRequest
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import TAKES_NOTHING, RelayFacts, StreamedBody

SMALL = 16 * 1024
ALL = 1 << 62


def rest(json: str, binary: bool | None) -> RelayFacts:
    """A REST backend's facts by ``--backend-encoding`` (as the REST backend's encoding makes
    them)."""
    below, auto = {"json": (ALL, False), "binary": (0, False)}.get(json, (SMALL, True))
    return RelayFacts(True, False, below, auto, binary, 0, False)


def grpc(below: int, decoupled: bool | None) -> RelayFacts:
    return RelayFacts(False, True, 0, False, False, below, decoupled)


# (form, size, facts, before learning, once learnt)
TABLE = [
    # REST, --backend-encoding json: every JSON body; binary ones as the backend takes them
    (JSON, 100, rest("json", None), True, True),
    (JSON, 10 * SMALL, rest("json", True), True, True),
    (BINARY, 100, rest("json", False), False, False),
    (BINARY, 100, rest("json", True), True, True),
    # --backend-encoding binary: JSON bodies transcoded, binary ones relayed
    (JSON, 100, rest("binary", True), False, False),
    (BINARY, 100, rest("binary", True), True, True),
    # auto: a small JSON body whatever the backend; a large one unless it takes binary tensors
    (JSON, SMALL - 1, rest("auto", None), True, True),
    (JSON, SMALL, rest("auto", None), None, True),  # unknown: every v2 server takes JSON
    (JSON, SMALL, rest("auto", True), False, False),
    (JSON, SMALL, rest("auto", False), True, True),
    (BINARY, 100, rest("auto", None), None, False),  # unknown: decoded, sent as it can be
    (BINARY, 100, rest("auto", False), False, False),
    (BINARY, 100, rest("auto", True), True, True),
    # a raw binary body: never (its shape is the model's)
    (RAW, 100, rest("json", True), False, False),
    # a REST backend takes no message, a gRPC one no REST body
    (MESSAGE, 100, rest("json", True), False, False),
    (JSON, 100, grpc(ALL, False), False, False),
    (BINARY, 100, grpc(ALL, False), False, False),
    # gRPC: a message of a model not decoupled, below the staging bound
    (MESSAGE, 100, grpc(ALL, False), True, True),
    (MESSAGE, 100, grpc(ALL, None), None, False),
    (MESSAGE, 100, grpc(ALL, True), False, False),
    (MESSAGE, 4096, grpc(4096, False), False, False),
    (MESSAGE, 4095, grpc(4096, False), True, True),
    # a backend that takes nothing as it came
    (JSON, 100, TAKES_NOTHING, False, False),
    (BINARY, 100, TAKES_NOTHING, False, False),
    (MESSAGE, 100, TAKES_NOTHING, False, False),
]


@pytest.mark.parametrize(("form", "size", "facts", "before", "learnt"), TABLE)
def test_the_decision_table(
    form: str, size: int, facts: RelayFacts, before: bool | None, learnt: bool
) -> None:
    assert relays(form, size, facts) is before
    assert relays(form, size, facts, learnt=True) is learnt


@pytest.mark.parametrize(("form", "size", "facts", "before", "learnt"), TABLE)
def test_a_rewritten_answer_is_never_relayed(
    form: str, size: int, facts: RelayFacts, before: bool | None, learnt: bool
) -> None:
    """Whatever the backend takes: an answer the frontend compresses, or adds a flag to, is
    never the backend's as it wrote it, so nothing goes as sent (and nothing needs learning)."""
    assert relays(form, size, facts, rewritten=True) is False
    assert relays(form, size, facts, rewritten=True, learnt=True) is False


# ---- every way a request goes asks it, once, and does what it says

#: the pipeline table's rows whose request the backend takes as it came, and what they become
#: when the one decision says no: (row, the backend calls then, the form asked)
_DECLINED = [
    (pt.Row(pt.JSON, pt.NONE, backend_calls=(pt.INFER,)), JSON),
    (pt.Row(pt.BINARY, pt.NONE, backend_calls=(pt.INFER,)), BINARY),
    (pt.Row(pt.BINARY, pt.FP16, backend_calls=(pt.INFER,)), BINARY),
    (pt.Row(pt.MESSAGE, pt.NONE, backend_calls=(pt.INFER,), access_checks=0), MESSAGE),
    (
        pt.Row(pt.STREAM_MESSAGE, pt.NONE, backend_calls=(pt.STREAM_INFER,), access_checks=0),
        MESSAGE,
    ),
]


@pytest.mark.parametrize(("row", "form"), [pytest.param(r, f, id=r.id) for r, f in _DECLINED])
async def test_every_way_obeys_the_one_decision(
    row: pt.Row,
    form: str,
    regions: pt.Registry,  # noqa: F811  (the pipeline table's fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the decision saying no, a request the backend would take as it came is decoded and
    sent as the pipeline encodes it: the same table row, its relay call gone."""
    asked: list[str] = []

    def declines(
        form: str, size: int, facts: RelayFacts, *, rewritten: bool = False, learnt: bool = False
    ) -> bool:
        asked.append(form)
        return False

    monkeypatch.setattr(relay_module, "relays", declines)
    await pt.test_pipeline_table(row, regions)
    assert asked == [form]


# ---- every way a body comes goes as the one decision says, yes or no


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(body), 7):
        yield body[i : i + 7]


async def _decode(data: Buffer, ihcl: int | None, model: str, version: str) -> InferRequest:
    return decode_request(data, ihcl, model, version, pt.LIMIT, 64)


async def _json_whole(pipeline: Pipeline) -> None:
    body, _ = pt._rest_body(pt.NONE, binary=False)
    await pipeline.infer_body(pt.MODEL, "", body, None, False, _decode, [], None)


async def _binary_whole(pipeline: Pipeline) -> None:
    body, ihcl = pt._rest_body(pt.NONE, binary=True)
    await pipeline.infer_body(pt.MODEL, "", body, ihcl, False, _decode, [], None)


async def _json_arriving(pipeline: Pipeline) -> None:
    body, _ = pt._rest_body(pt.NONE, binary=False)
    streamed = StreamedBody(len(body), _chunks(body))
    await pipeline.infer_body(pt.MODEL, "", streamed, None, False, _decode, [], None)


async def _binary_arriving(pipeline: Pipeline) -> None:
    body, ihcl = pt._rest_body(pt.NONE, binary=True)
    streamed = StreamedBody(len(body), _chunks(body))
    await pipeline.infer_body(pt.MODEL, "", streamed, ihcl, False, _decode, [], None)


async def _message(pipeline: Pipeline) -> None:
    await pipeline.infer_message(b"the message", pt._decoded(pt.NONE), [], None)


async def _stream_message(pipeline: Pipeline) -> None:
    async for _ in pipeline.stream_message(b"the message", pt._decoded(pt.NONE), True, [], None):
        pass


#: (the way, the form it asks about, the backend's relay call, its call when transcoded)
WAYS = [
    ("rest-json-whole", _json_whole, JSON, "relay_infer", "infer"),
    ("rest-binary-whole", _binary_whole, BINARY, "relay_infer", "infer"),
    ("rest-json-arriving", _json_arriving, JSON, "relay_infer", "infer"),
    ("rest-binary-arriving", _binary_arriving, BINARY, "relay_infer", "infer"),
    ("grpc-message", _message, MESSAGE, "relay_message", "infer"),
    ("grpc-stream-message", _stream_message, MESSAGE, "relay_message", "stream_infer"),
]


@pytest.mark.parametrize("says", [True, False], ids=["yes", "no"])
@pytest.mark.parametrize(
    ("way", "form", "relayed", "transcoded"),
    [pytest.param(w, f, r, t, id=i) for i, w, f, r, t in WAYS],
)
async def test_the_one_decision_rules_every_way(
    says: bool,
    way: Callable[[Pipeline], Awaitable[None]],
    form: str,
    relayed: str,
    transcoded: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever the backend's facts (here: it would take nothing as sent), the one function's
    answer alone says whether a body no stage applies to goes as sent or transcoded: asked once,
    about the body's wire form, on every way of the REST general path (whole or still
    arriving, JSON or binary-framed) and of gRPC (ModelInfer, ModelStreamInfer). The REST quick
    lane: tests/integration/test_quick_lane.py."""
    asked: list[str] = []

    def decides(
        form: str, size: int, facts: RelayFacts, *, rewritten: bool = False, learnt: bool = False
    ) -> bool:
        asked.append(form)
        return says

    monkeypatch.setattr(relay_module, "relays", decides)
    backend = FakeBackend(Answers(relay={False: False, True: False}, relay_message=False))
    await way(Pipeline(backend, pt.LIMIT))  # type: ignore[arg-type]
    assert asked == [form]
    assert backend.names() == [relayed if says else transcoded]
