"""The admission gate (--max-concurrency): slots taken and given back, refusals, exempt
operations, no limit."""

from __future__ import annotations

import pytest

from v2proxy.core.admission import EXEMPT, RETRY_AFTER_S, AdmissionGate
from v2proxy.core.errors import Overloaded

#: (limit, operations entered in order, expected outcome of each: True = took a slot,
#: False = needs none, "refused")
CASES = [
    (2, ["infer", "infer", "infer"], [True, True, "refused"]),
    (1, ["stream_infer", "generate", "passthrough"], [True, "refused", "refused"]),
    (1, ["infer", "health", "metadata", "health"], [True, False, False, False]),
    (1, ["side", "mindie"], [True, "refused"]),
    (0, ["infer"] * 5, [False] * 5),  # 0: no limit, nothing counted
    (
        3,
        ["health", "infer", "metadata", "infer", "infer", "infer"],
        [False, True, False, True, True, "refused"],
    ),
]


@pytest.mark.parametrize(("limit", "ops", "expected"), CASES)
def test_enter_takes_a_slot_up_to_the_limit(
    limit: int, ops: list[str], expected: list[object]
) -> None:
    gate = AdmissionGate(limit)
    got: list[object] = []
    for op in ops:
        try:
            got.append(gate.enter(op))
        except Overloaded:
            got.append("refused")
    assert got == expected
    assert gate.in_use == sum(1 for e in expected if e is True)
    assert gate.refused == expected.count("refused")


def test_refusal_names_the_limit_and_the_option_and_maps_to_503_and_resource_exhausted() -> None:
    gate = AdmissionGate(3)
    for _ in range(3):
        gate.enter("infer")
    with pytest.raises(Overloaded) as err:
        gate.enter("infer")
    assert err.value.message == (
        "too many requests in progress: v2proxy serves at most 3 at once (--max-concurrency);"
        f" retry after {RETRY_AFTER_S} s"
    )
    assert err.value.http_status == 503
    assert err.value.grpc_code == "RESOURCE_EXHAUSTED"


def test_leave_frees_a_slot_for_the_next_request() -> None:
    gate = AdmissionGate(2)
    assert gate.enter("infer") and gate.enter("infer")
    with pytest.raises(Overloaded):
        gate.enter("infer")
    gate.leave()
    assert gate.in_use == 1
    assert gate.enter("infer") is True
    gate.leave()
    gate.leave()
    assert gate.in_use == 0
    # all free again: the limit is whole
    assert [gate.enter("infer") for _ in range(2)] == [True, True]


def test_exempt_operations_are_never_refused_even_when_full() -> None:
    gate = AdmissionGate(1)
    gate.enter("infer")
    for op in sorted(EXEMPT):
        for _ in range(100):
            assert gate.enter(op) is False
    assert gate.in_use == 1 and gate.refused == 0
    assert {"health", "metadata"} == EXEMPT


def test_leave_without_enter_is_a_bug_not_a_negative_count() -> None:
    gate = AdmissionGate(1)
    with pytest.raises(RuntimeError):
        gate.leave()
    assert gate.in_use == 0


def test_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError):
        AdmissionGate(-1)
