"""``core.relay.relays``: the one decision whether a body goes to the backend as the client sent
it, from the backend's relay facts (data), as a table; and every way a request goes asks it:
the pipeline's whole and streamed bodies, gRPC messages, and the REST quick lane."""

from __future__ import annotations

import pytest

from tests.unit import test_pipeline_table as pt
from tests.unit.test_pipeline_table import regions  # noqa: F401  (the fixture)
from v2proxy.core import relay as relay_module
from v2proxy.core.ports import TAKES_NOTHING, RelayFacts
from v2proxy.core.relay import BINARY, JSON, MESSAGE, relays

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
    ("raw", 100, rest("json", True), False, False),
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

    def declines(form: str, size: int, facts: RelayFacts, *, learnt: bool = False) -> bool:
        asked.append(form)
        return False

    monkeypatch.setattr(relay_module, "relays", declines)
    await pt.test_pipeline_table(row, regions)
    assert asked == [form]
