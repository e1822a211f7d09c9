"""v2proxy.backends.endpoints: resolution, picking, passive health (no sockets: a fake
resolver and plain objects as clients)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from v2proxy.backends.endpoints import (
    BACKOFF_MAX_S,
    BACKOFF_S,
    EJECT_AFTER,
    EJECT_BACKOFF_MAX_S,
    EJECT_BACKOFF_S,
    Endpoints,
    HostPort,
    split_hosts,
)


class Cells:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.ups: dict[str, float] = {}

    class _C:
        def __init__(self, owner: Cells, key: tuple[str, str]) -> None:
            self.owner, self.key = owner, key

        def inc(self, amount: float = 1.0) -> None:
            self.owner.counts[self.key] += int(amount)

    def calls(self, endpoint: str, outcome: str) -> Cells._C:
        return Cells._C(self, (endpoint, outcome))

    def up(self, endpoint: str, value: float) -> None:
        self.ups[endpoint] = value

    def forget(self, endpoint: str) -> None:
        self.ups.pop(endpoint, None)
        for k in [k for k in self.counts if k[0] == endpoint]:
            del self.counts[k]


def _fake(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[str]:
        answer = table.get(host)
        if answer is None:
            raise OSError(f"{host}: Name or service not known")
        return list(answer)

    return resolve


closed: list[str] = []


async def _close(client: str) -> None:
    closed.append(client)


def _make(name: HostPort, address: str) -> str:
    return f"{name.host}@{address}:{name.port}"


@pytest.mark.parametrize(
    ("netloc", "hosts"),
    [
        ("a:1", [HostPort("a", 1)]),
        ("10.0.0.1:8001,10.0.0.2:8001", [HostPort("10.0.0.1", 8001), HostPort("10.0.0.2", 8001)]),
        ("[::1]:8000,h:9", [HostPort("::1", 8000), HostPort("h", 9)]),
        ("user@h:9", [HostPort("h", 9)]),
    ],
)
def test_split_hosts(netloc: str, hosts: list[HostPort]) -> None:
    assert split_hosts(netloc) == hosts
    assert [h.authority for h in hosts] == [
        f"[{h.host}]:{h.port}" if ":" in h.host else f"{h.host}:{h.port}" for h in hosts
    ]


async def test_names_resolve_to_every_address_and_follow_changes() -> None:
    table = {"svc": ["10.0.0.1", "10.0.0.2"]}
    cells = Cells()
    eps: Endpoints[str] = Endpoints(
        [HostPort("svc", 8001), HostPort("10.0.0.9", 8001)],
        _make,
        _close,
        resolve_every=0,
        cells=cells,
        resolver=_fake(table),
    )
    await eps.start()
    assert [e.client for e in eps.all] == [
        "svc@10.0.0.1:8001",
        "svc@10.0.0.2:8001",
        "10.0.0.9@10.0.0.9:8001",
    ]
    assert cells.ups == {"10.0.0.1:8001": 1.0, "10.0.0.2:8001": 1.0, "10.0.0.9:8001": 1.0}
    first = eps.all[0]
    # one address leaves, one joins: the one that stays keeps its client
    table["svc"] = ["10.0.0.1", "10.0.0.3"]
    closed.clear()
    await eps.resolve()
    assert [e.label for e in eps.all] == ["10.0.0.1:8001", "10.0.0.3:8001", "10.0.0.9:8001"]
    assert eps.all[0] is first
    assert closed == ["svc@10.0.0.2:8001"]
    assert "10.0.0.2:8001" not in cells.ups
    # the name stops resolving: its last addresses are kept
    del table["svc"]
    await eps.resolve()
    assert [e.label for e in eps.all] == ["10.0.0.1:8001", "10.0.0.3:8001", "10.0.0.9:8001"]
    closed.clear()
    await eps.close()
    assert sorted(closed) == ["10.0.0.9@10.0.0.9:8001", "svc@10.0.0.1:8001", "svc@10.0.0.3:8001"]
    assert eps.all == [] and cells.ups == {}


async def test_a_name_that_never_resolved_is_kept_as_the_name() -> None:
    eps: Endpoints[str] = Endpoints(
        [HostPort("later", 80)], _make, _close, resolve_every=0, resolver=_fake({})
    )
    await eps.start()
    assert [e.client for e in eps.all] == ["later@later:80"]
    assert eps.one_server


@pytest.mark.parametrize(
    ("names", "table", "one"),
    [
        (["h"], {"h": ["10.0.0.1"]}, True),
        (["h"], {"h": ["127.0.0.1", "::1"]}, True),  # localhost: one server
        (["h"], {"h": ["10.0.0.1", "10.0.0.2"]}, False),
        (["a", "b"], {"a": ["127.0.0.1"], "b": ["127.0.0.2"]}, False),
    ],
)
async def test_one_server(names: list[str], table: dict[str, list[str]], one: bool) -> None:
    eps: Endpoints[str] = Endpoints(
        [HostPort(n, 1) for n in names], _make, _close, resolve_every=0, resolver=_fake(table)
    )
    await eps.start()
    assert eps.one_server is one


async def _three() -> Endpoints[str]:
    eps: Endpoints[str] = Endpoints(
        [HostPort(f"10.0.0.{i}", 80) for i in (1, 2, 3)], _make, _close, resolve_every=0
    )
    await eps.start()
    return eps


async def test_idle_calls_go_round_robin() -> None:
    eps = await _three()
    picked = []
    for _ in range(9):
        ep = eps.pick()
        assert ep is not None
        picked.append(ep.address)
    assert Counter(picked) == {"10.0.0.1": 3, "10.0.0.2": 3, "10.0.0.3": 3}


async def test_the_least_busy_endpoint_is_picked() -> None:
    eps = await _three()
    eps.all[0].outstanding = 5
    eps.all[1].outstanding = 1
    eps.all[2].outstanding = 2
    assert {eps.pick().address for _ in range(6)} == {"10.0.0.2"}  # type: ignore[union-attr]


async def test_tried_endpoints_are_left_out_until_none_is_left() -> None:
    eps = await _three()
    tried = []
    for _ in range(3):
        ep = eps.pick(tried)
        assert ep is not None and ep not in tried
        tried.append(ep)
    assert eps.pick(tried) is None


async def test_a_failed_endpoint_is_out_for_its_backoff_then_back() -> None:
    cells = Cells()
    eps: Endpoints[str] = Endpoints(
        [HostPort("10.0.0.1", 80), HostPort("10.0.0.2", 80)],
        _make,
        _close,
        resolve_every=0,
        cells=cells,
    )
    await eps.start()
    bad = eps.all[0]
    eps.failed(bad)
    assert cells.ups["10.0.0.1:80"] == 0.0
    assert cells.counts[("10.0.0.1:80", "unreachable")] == 1
    assert {eps.pick().address for _ in range(4)} == {"10.0.0.2"}  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()
    assert bad.down_until == pytest.approx(loop.time() + BACKOFF_S, abs=0.05)
    # failures in a row double the back-off, up to the longest
    for _ in range(10):
        eps.failed(bad)
    assert bad.down_until == pytest.approx(loop.time() + BACKOFF_MAX_S, abs=0.05)
    # due back: tried again; an answer puts it back in rotation
    bad.down_until = loop.time() - 1
    assert {eps.pick().address for _ in range(4)} == {"10.0.0.1", "10.0.0.2"}  # type: ignore[union-attr]
    eps.ok(bad)
    assert (bad.failures, bad.down_until, cells.ups["10.0.0.1:80"]) == (0, 0.0, 1.0)
    assert cells.counts[("10.0.0.1:80", "ok")] == 1


async def test_when_every_endpoint_is_out_the_one_due_first_is_tried() -> None:
    eps = await _three()
    for ep in eps.all:
        eps.failed(ep)
    eps.all[1].down_until -= 0.25
    assert eps.pick().address == "10.0.0.2"  # type: ignore[union-attr]


async def test_a_single_endpoint_is_always_picked() -> None:
    eps: Endpoints[str] = Endpoints([HostPort("10.0.0.1", 80)], _make, _close, resolve_every=0)
    await eps.start()
    eps.failed(eps.all[0])
    assert eps.pick() is eps.all[0]
    assert eps.pick([eps.all[0]]) is None


async def test_names_are_resolved_again_periodically() -> None:
    table = {"svc": ["10.0.0.1"]}
    eps: Endpoints[str] = Endpoints(
        [HostPort("svc", 80)], _make, _close, resolve_every=0.01, resolver=_fake(table)
    )
    await eps.start()
    table["svc"] = ["10.0.0.1", "10.0.0.2"]
    for _ in range(200):
        if len(eps.all) == 2:
            break
        await asyncio.sleep(0.01)
    assert [e.address for e in eps.all] == ["10.0.0.1", "10.0.0.2"]
    await eps.close()


@pytest.mark.parametrize("outcome", ["timeout", "malformed", "5xx"])
async def test_failures_in_a_row_take_an_endpoint_out_for_a_growing_backoff(outcome: str) -> None:
    cells = Cells()
    eps: Endpoints[str] = Endpoints(
        [HostPort(f"10.0.0.{i}", 80) for i in (1, 2, 3)],
        _make,
        _close,
        resolve_every=0,
        cells=cells,
    )
    await eps.start()
    loop = asyncio.get_running_loop()
    bad = eps.all[0]
    for _ in range(EJECT_AFTER - 1):
        eps.failed(bad, outcome)
    assert bad.down_until == 0.0 and cells.ups["10.0.0.1:80"] == 1.0  # not yet
    eps.ok(bad)  # an answer clears the record: the count starts again
    for _ in range(EJECT_AFTER - 1):
        eps.failed(bad, outcome)
    assert bad.down_until == 0.0
    eps.failed(bad, outcome)
    assert cells.counts[("10.0.0.1:80", outcome)] == 2 * EJECT_AFTER - 1
    assert cells.ups["10.0.0.1:80"] == 0.0
    assert bad.down_until == pytest.approx(loop.time() + EJECT_BACKOFF_S, abs=0.05)
    assert {eps.pick().address for _ in range(6)} == {"10.0.0.2", "10.0.0.3"}  # type: ignore[union-attr]
    # due back, it is tried; one more failure takes it out again, for twice as long
    bad.down_until = loop.time() - 1
    eps.failed(bad, outcome)
    assert bad.down_until == pytest.approx(loop.time() + 2 * EJECT_BACKOFF_S, abs=0.05)
    for _ in range(10):
        bad.down_until = loop.time() - 1
        eps.failed(bad, outcome)
    assert bad.down_until == pytest.approx(loop.time() + EJECT_BACKOFF_MAX_S, abs=0.05)
    assert cells.ups["10.0.0.1:80"] == 0.0
    eps.ok(bad)
    assert (bad.failures, bad.ejections, bad.down_until) == (0, 0, 0.0)
    assert cells.ups["10.0.0.1:80"] == 1.0


async def test_at_most_half_the_endpoints_are_out_for_misbehaving_never_the_last() -> None:
    eps = await _three()
    for ep in eps.all:
        for _ in range(EJECT_AFTER):
            eps.failed(ep, "timeout")
    out = [ep for ep in eps.all if ep.down_until]
    # 0 of 3 out, then 1 of 3 (under half): two go out; a third would be over half
    assert len(out) == 2
    assert eps.all[2].down_until == 0.0 and eps.all[2].failures == EJECT_AFTER
    # the third stays in rotation whatever it does
    for _ in range(5):
        eps.failed(eps.all[2], "5xx")
    assert eps.all[2].down_until == 0.0
    assert {eps.pick().address for _ in range(4)} == {"10.0.0.3"}  # type: ignore[union-attr]
    # one back in rotation: the next failure of the third may take it out
    eps.ok(eps.all[0])
    eps.failed(eps.all[2], "5xx")
    assert eps.all[2].down_until > 0.0

    two: Endpoints[str] = Endpoints(
        [HostPort("10.0.0.1", 80), HostPort("10.0.0.2", 80)], _make, _close, resolve_every=0
    )
    await two.start()
    for ep in two.all:
        for _ in range(EJECT_AFTER):
            two.failed(ep, "malformed")
    assert [bool(ep.down_until) for ep in two.all] == [True, False]

    one: Endpoints[str] = Endpoints([HostPort("10.0.0.1", 80)], _make, _close, resolve_every=0)
    await one.start()
    for _ in range(EJECT_AFTER * 2):
        one.failed(one.all[0], "timeout")
    assert one.all[0].down_until == 0.0  # the last one in rotation is never taken out


async def test_an_unreachable_endpoint_is_out_at_once_whatever_the_cap() -> None:
    eps = await _three()
    for ep in eps.all:
        eps.failed(ep)  # refused: nothing was sent, no share is kept in
    assert all(ep.down_until for ep in eps.all)
    assert eps.pick() is not None  # the one due back first
