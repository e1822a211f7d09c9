"""The pipeline's stages behind one interface (``v2proxy.core.stages``): the loop that runs them
around a backend call (``chain.Stages.run``: order, every response, release once whatever
happens), whether any applies (``Stages.applies``, exactly when some stage's ``applies`` would
say so, and what the relay's ``nothing_to_do`` asks), and each stage's ``applies`` /
``before`` / ``after`` / ``release`` in isolation: client shared memory on in-memory regions,
classification on a fake of what is known of the backend's models. No sockets, no backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from v2proxy.codecs.classification import BAD_COUNT
from v2proxy.codecs.dtypes import deserialize_bytes
from v2proxy.core.errors import BackendError, Forbidden, InvalidRequest, NotFound, ProxyError
from v2proxy.core.model import (
    Buffer,
    Datatype,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)
from v2proxy.core.relay import nothing_to_do
from v2proxy.core.stages.base import Applied
from v2proxy.core.stages.chain import Stages, finish
from v2proxy.core.stages.classification import ClassificationStage
from v2proxy.core.stages.shm import SharedMemoryStage

# --------------------------------------------------------------------------- the loop


class Recorder:
    """A stage that applies when an output carries its key, recording every call in ``log``."""

    def __init__(self, name: str, log: list[str], fail: str = "") -> None:
        self.name = name
        self.log = log
        #: where it raises: "before", "after" or ""
        self.fail = fail
        self.input_keys: frozenset[str] = frozenset()
        self.output_keys = frozenset({name})

    def applies(self, request: InferRequest, peer: str | None) -> Applied | None:
        self.log.append(f"{self.name}.applies")
        if any(self.name in o.parameters for o in request.outputs or ()):
            return _Recording(self)
        return None


class _Recording:
    def __init__(self, stage: Recorder) -> None:
        self.stage = stage
        self.responses = 0

    async def before(self, request: InferRequest) -> InferRequest:
        self.stage.log.append(f"{self.stage.name}.before")
        if self.stage.fail == "before":
            raise InvalidRequest(f"{self.stage.name} refuses")
        request.parameters[self.stage.name] = True  # what the backend is sent
        return request

    async def after(self, response: InferResponse) -> InferResponse:
        self.responses += 1
        self.stage.log.append(f"{self.stage.name}.after{self.responses}")
        if self.stage.fail == "after":
            raise ProxyError(f"{self.stage.name} failed")
        response.parameters.setdefault("by", []).append(self.stage.name)
        return response

    def release(self) -> None:
        self.stage.log.append(f"{self.stage.name}.release")


def _request(*output_params: dict[str, Any], rid: str = "r1") -> InferRequest:
    outputs = [RequestedOutput(f"O{i}", dict(p)) for i, p in enumerate(output_params)]
    return InferRequest("m", [Tensor("I", Datatype.FP32, (1,), b"\0" * 4)], outputs, rid)


def _answers(n: int, log: list[str], fail_at: int = 0) -> Any:
    """A backend call of ``n`` responses (raising instead of response ``fail_at``)."""

    async def call(sent: InferRequest) -> AsyncIterator[InferResponse]:
        log.append(f"call{sorted(k for k in sent.parameters)}")
        for i in range(1, n + 1):
            if i == fail_at:
                raise BackendError("backend broke", 500)
            yield InferResponse("", [Tensor("O0", Datatype.FP32, (1,), b"\0" * 4)])

    return call


async def _all(responses: AsyncIterator[InferResponse]) -> list[InferResponse]:
    return [r async for r in responses]


async def test_run_orders_the_stages_around_every_response() -> None:
    log: list[str] = []
    stages = Stages([Recorder("a", log), Recorder("b", log), Recorder("c", log)])
    got = await _all(stages.run(_request({"a": 1}, {"c": 1}), None, _answers(2, log)))
    assert log == [
        "a.applies", "a.before", "b.applies", "c.applies", "c.before",
        "call['a', 'c']",
        "c.after1", "a.after1", "c.after2", "a.after2",
        "c.release", "a.release",
    ]  # fmt: skip
    # every response finished first (id, model name), then the innermost stage's after
    assert [(r.id, r.model_name, r.parameters["by"]) for r in got] == [("r1", "m", ["c", "a"])] * 2


@pytest.mark.parametrize(
    ("fail", "fail_at", "error", "log"),
    [
        # a stage's before refuses: the earlier stage is released, the backend never called
        ("before", 0, InvalidRequest, ["a.applies", "a.before", "b.applies", "b.before",
                                       "b.release", "a.release"]),
        # the backend breaks off at its second response
        ("", 2, BackendError, ["a.applies", "a.before", "b.applies", "b.before", "call",
                               "b.after1", "a.after1", "b.release", "a.release"]),
        # a stage's after fails on the first response
        ("after", 0, ProxyError, ["a.applies", "a.before", "b.applies", "b.before", "call",
                                  "b.after1", "b.release", "a.release"]),
    ],
)  # fmt: skip
async def test_run_releases_once_whatever_happens(
    fail: str, fail_at: int, error: type[ProxyError], log: list[str]
) -> None:
    got: list[str] = []
    stages = Stages([Recorder("a", got), Recorder("b", got, fail=fail)])
    with pytest.raises(error):
        await _all(stages.run(_request({"a": 1, "b": 1}), None, _answers(3, got, fail_at)))
    assert [e if not e.startswith("call") else "call" for e in got] == log


async def test_run_closed_early_releases_once() -> None:
    log: list[str] = []
    stages = Stages([Recorder("a", log)])
    responses = stages.run(_request({"a": 1}), None, _answers(3, log))
    await responses.__anext__()
    assert log[-1] == "a.after1"
    await responses.aclose()  # the consumer went away after one of three responses
    assert log.count("a.release") == 1
    assert log[-1] == "a.release"


async def test_run_with_no_stage_applying_only_finishes() -> None:
    log: list[str] = []
    stages = Stages([Recorder("a", log)])
    request = _request({"x": 1}, {})
    assert not stages.applies(request)
    got = await _all(stages.run(request, None, _answers(2, log)))
    assert log == ["a.applies", "call[]"]
    assert [(r.id, r.model_name) for r in got] == [("r1", "m")] * 2


def test_finish_fills_in_and_drops_what_was_not_asked_for() -> None:
    request = InferRequest("m", [], [RequestedOutput("B")], "rid")
    response = InferResponse(
        "", [Tensor("A", Datatype.FP32, (1,), b"1234"), Tensor("B", Datatype.FP32, (1,), b"5678")]
    )
    assert finish(request, response) is response
    assert (response.id, response.model_name, [t.name for t in response.outputs]) == (
        "rid",
        "m",
        ["B"],
    )
    # what the backend said is kept; no outputs listed: every output returned
    kept = InferResponse("other", [Tensor("A", Datatype.FP32, (1,), b"1234")], id="theirs")
    finish(InferRequest("m", [], None, "rid"), kept)
    assert (kept.id, kept.model_name, len(kept.outputs)) == ("theirs", "other", 1)


# --------------------------------------------------------------------------- applies


def _real_stages() -> Stages:
    return Stages([SharedMemoryStage(None, "on"), ClassificationStage({}, Knowledge())])


# (input parameters, output parameters per output; None: outputs not listed), whether a stage
# applies
SCREEN = [
    ({}, None, False),
    ({}, [{}, {}], False),
    ({"binary_data_size": 4}, [{"binary_data": True}], False),
    ({"shared_memory_region": "r"}, None, True),
    ({}, [{}, {"shared_memory_region": "r"}], True),
    ({}, [{"binary_data": False}, {"classification": 2}], True),
    ({}, [{"classification": 0}], True),
    # classification is an output's parameter: on an input it asks for nothing
    ({"classification": 2}, [{}], False),
]


@pytest.mark.parametrize(("inputs", "outputs", "applies"), SCREEN)
def test_applies_is_exactly_some_stage_applying(
    inputs: dict[str, Any], outputs: list[dict[str, Any]] | None, applies: bool
) -> None:
    stages = _real_stages()
    request = InferRequest(
        "m",
        [Tensor("I", Datatype.FP32, (1,), b"\0" * 4, dict(inputs))],
        None if outputs is None else [RequestedOutput(f"O{i}", p) for i, p in enumerate(outputs)],
    )
    assert stages.applies(request) is applies
    assert any(s.applies(request, None) is not None for s in stages.stages) is applies
    # the relay asks the same of the stages, besides its wire-form checks
    assert nothing_to_do(request, True, stages) is not applies


def test_nothing_to_do_asks_the_stages() -> None:
    """A stage's own keys stop the relay; what no stage asks for does not."""
    request = _request({"custom": 1})
    assert nothing_to_do(request, False, Stages([]))
    assert not nothing_to_do(request, False, Stages([Recorder("custom", [])]))
    # the wire-form half stays the relay's own: a JSON body asking for a binary answer
    binary_out = _request({"binary_data": True})
    assert not nothing_to_do(binary_out, False, Stages([]))
    assert nothing_to_do(binary_out, True, Stages([]))


# --------------------------------------------------------------------------- shared memory


class MemRegion:
    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.byte_size = size
        self.data = bytearray(size)

    def check(self) -> None:
        return None

    def read(self, offset: int, size: int) -> memoryview:
        return memoryview(bytes(self.data[offset : offset + size]))

    def write(self, offset: int, data: Buffer) -> None:
        raw = bytes(data)
        self.data[offset : offset + len(raw)] = raw


class MemRegions:
    """In-memory regions counting who holds them (the part of the port a request uses)."""

    def __init__(self, **sizes: int) -> None:
        self.regions = {n: MemRegion(n, s) for n, s in sizes.items()}
        self.users = dict.fromkeys(sizes, 0)
        self.acquired = self.released = 0
        self.served_counts: dict[str, int] = {}

    def acquire(self, name: str) -> MemRegion:
        if name not in self.regions:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        self.acquired += 1
        self.users[name] += 1
        return self.regions[name]

    def release(self, region: Any) -> None:
        self.released += 1
        self.users[region.name] -= 1

    def served(self, direction: str, n: int) -> None:
        self.served_counts[direction] = self.served_counts.get(direction, 0) + n


def _shm_request() -> InferRequest:
    return InferRequest(
        "m",
        [
            Tensor(
                "I",
                Datatype.FP32,
                (1, 2),
                b"",
                {"shared_memory_region": "in", "shared_memory_byte_size": 8, "x": 1},
            )
        ],
        [
            RequestedOutput("O", {"shared_memory_region": "out", "shared_memory_byte_size": 8}),
            RequestedOutput("P", {"binary_data": True}),
        ],
    )


async def test_shm_stage_reads_writes_and_releases_once() -> None:
    regions = MemRegions(**{"in": 8, "out": 8})
    regions.regions["in"].data[:] = np.array([1.5, 2.5], "<f4").tobytes()
    stage = SharedMemoryStage(regions, "local")
    request = _shm_request()
    state = stage.applies(request, None)  # a unix socket: local
    assert state is not None
    assert regions.acquired == 0  # applies holds nothing
    sent = await state.before(request)
    assert sent is request  # changed in place: ordinary tensors for the backend
    assert (bytes(sent.inputs[0].data), sent.inputs[0].parameters) == (
        np.array([1.5, 2.5], "<f4").tobytes(),
        {"x": 1},
    )
    assert sent.outputs is not None and sent.outputs[0].parameters == {}
    assert regions.users == {"in": 1, "out": 1}
    for value in (7.0, 9.0):  # every response of a stream written there
        out = np.array([value, value], "<f4").tobytes()
        response = InferResponse("m", [Tensor("O", Datatype.FP32, (1, 2), out)])
        assert await state.after(response) is response
        assert response.outputs[0].in_shm and bytes(response.outputs[0].data) == b""
        assert bytes(regions.regions["out"].data) == out
    state.release()
    assert regions.users == {"in": 0, "out": 0}
    assert (regions.acquired, regions.released) == (2, 2)
    assert regions.served_counts == {"input": 1, "output": 2}


def test_shm_stage_does_not_apply_without_a_region() -> None:
    stage = SharedMemoryStage(MemRegions(), "on")
    assert stage.applies(_request({"binary_data": True}, {}), None) is None
    assert stage.applies(InferRequest("m", [], None), None) is None


async def test_shm_stage_refusals_hold_nothing() -> None:
    regions = MemRegions(**{"in": 8, "out": 8})
    remote = SharedMemoryStage(regions, "local")
    state = remote.applies(_shm_request(), "10.0.0.9")
    assert state is not None
    with pytest.raises(Forbidden):
        await state.before(_shm_request())
    state.release()  # released all the same, once: nothing was held
    unregistered = SharedMemoryStage(None, "on").applies(_shm_request(), None)
    assert unregistered is not None
    with pytest.raises(NotFound):
        await unregistered.before(_shm_request())
    unregistered.release()
    assert (regions.acquired, regions.released) == (0, 0)


async def test_shm_stage_released_without_before() -> None:
    regions = MemRegions(**{"in": 8, "out": 8})
    state = SharedMemoryStage(regions, "on").applies(_shm_request(), None)
    assert state is not None
    state.release()  # an earlier stage failed: nothing acquired, nothing to give back
    assert (regions.acquired, regions.released) == (0, 0)


# --------------------------------------------------------------------------- classification


class Knowledge:
    """What is known of the backend's models, counting the questions."""

    def __init__(self, lists: bool = False, max_batch_size: int | None = 8) -> None:
        self.lists = lists
        self.max_batch_size = max_batch_size
        self.asked: list[str] = []

    async def lists_classification(self) -> bool:
        self.asked.append("extensions")
        return self.lists

    async def shape_info(self, model: str, version: str) -> tuple[dict[str, Any], int | None]:
        self.asked.append(f"shape {model}")
        return {}, self.max_batch_size


class _Out:
    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels


class _Model:
    def __init__(self, outputs: dict[str, _Out]) -> None:
        self.outputs = outputs


def _scores() -> InferResponse:
    scores = np.array([[0.5, 3.0, 1.5, 2.0]], "<f4").tobytes()
    return InferResponse(
        "m",
        [Tensor("O0", Datatype.FP32, (1, 4), scores), Tensor("O1", Datatype.FP32, (1, 4), scores)],
    )


def _classes(t: Tensor) -> list[str]:
    return [b.decode() for b in deserialize_bytes(t.data)]


async def test_classification_stage_plans_and_classifies_every_response() -> None:
    knowledge = Knowledge(lists=False)
    stage = ClassificationStage({}, knowledge)
    request = _request({"classification": 2, "binary_data": True}, {})
    state = stage.applies(request, None)
    assert state is not None and knowledge.asked == []  # applies asks nothing
    sent = await state.before(request)
    assert sent is not request  # the client's request is left as it came
    assert sent.outputs == [RequestedOutput("O0", {"binary_data": True}), RequestedOutput("O1")]
    assert knowledge.asked == ["extensions"]  # no labels here: can the backend classify?
    for _ in range(2):
        response = await state.after(_scores())
        assert _classes(response.outputs[0]) == ["3.000000:1", "2.000000:3"]
        assert response.outputs[1].datatype is Datatype.FP32  # not asked for: left alone
    assert knowledge.asked == ["extensions", "shape m", "shape m"]
    state.release()


async def test_classification_stage_with_labels_asks_no_extension() -> None:
    knowledge = Knowledge(lists=True)
    stage = ClassificationStage({"m": _Model({"O0": _Out(("a", "b", "c", "d"))})}, knowledge)
    request = _request({"classification": 1})
    state = stage.applies(request, None)
    assert state is not None
    await state.before(request)
    response = await state.after(_scores())
    assert _classes(response.outputs[0]) == ["3.000000:1:b"]
    assert knowledge.asked == ["shape m"]


async def test_classification_stage_passes_through_to_a_backend_that_classifies() -> None:
    knowledge = Knowledge(lists=True)
    request = _request({"classification": 2})
    state = ClassificationStage({}, knowledge).applies(request, None)
    assert state is not None
    assert await state.before(request) is request  # the parameter goes on to the backend
    response = _scores()
    assert await state.after(response) is response
    assert knowledge.asked == ["extensions"]  # nothing to classify: no batching asked


def test_classification_stage_applies() -> None:
    stage = ClassificationStage({}, Knowledge())
    assert stage.applies(_request({}, {"binary_data": True}), None) is None
    assert stage.applies(InferRequest("m", [], None), None) is None
    with pytest.raises(InvalidRequest) as err:  # a malformed k is the request's error
        stage.applies(_request({"classification": -1}), None)
    assert err.value.message == BAD_COUNT
