"""http/lazy_timer.LazyTimer: one handle at a time, moved earlier at once, later only when it
fires; the owner's fire() decides whether to be called again."""

from __future__ import annotations

from collections.abc import Callable

from v2proxy.http.lazy_timer import LazyTimer


class FakeHandle:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.done = False

    def cancel(self) -> None:
        self.done = True

    def cancelled(self) -> bool:
        return self.done


class FakeLoop:
    """call_at recorded, never run: the test fires handles itself."""

    def __init__(self) -> None:
        self.handles: list[tuple[float, FakeHandle]] = []

    def call_at(self, when: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle(callback)
        self.handles.append((when, handle))
        return handle

    def live(self) -> list[float]:
        return [w for w, h in self.handles if not h.cancelled()]


def timer(answers: list[float | None]) -> tuple[LazyTimer, FakeLoop, list[int]]:
    loop = FakeLoop()
    calls: list[int] = []

    def fire() -> float | None:
        calls.append(1)
        return answers.pop(0)

    return LazyTimer(loop, fire), loop, calls  # type: ignore[arg-type]


def run_due(loop: FakeLoop) -> None:
    """Run the one live handle."""
    (live,) = [h for _, h in loop.handles if not h.cancelled()]
    live.cancel()  # it has fired: no longer live
    live.callback()


def test_a_later_deadline_leaves_the_pending_handle() -> None:
    t, loop, _ = timer([])
    t.at(10.0)
    t.at(20.0)
    t.at(10.0)
    assert loop.live() == [10.0]
    assert len(loop.handles) == 1  # no timer call for the later ones


def test_an_earlier_deadline_replaces_the_pending_handle() -> None:
    t, loop, _ = timer([])
    t.at(10.0)
    t.at(5.0)
    assert loop.live() == [5.0]
    assert len(loop.handles) == 2


def test_fire_asks_again_for_its_later_deadline() -> None:
    t, loop, calls = timer([20.0, None])
    t.at(10.0)
    run_due(loop)
    assert calls == [1] and loop.live() == [20.0] and t.pending
    run_due(loop)
    assert calls == [1, 1] and loop.live() == [] and not t.pending


def test_fire_may_set_a_new_deadline_itself() -> None:
    loop = FakeLoop()
    t: LazyTimer

    def fire() -> float | None:
        t.at(30.0)  # another kind of deadline, set by the action
        return None

    t = LazyTimer(loop, fire)  # type: ignore[arg-type]
    t.at(10.0)
    run_due(loop)
    assert loop.live() == [30.0] and t.pending


def test_cancel_drops_the_pending_handle() -> None:
    t, loop, calls = timer([])
    t.at(10.0)
    t.cancel()
    assert loop.live() == [] and not t.pending and calls == []
    t.cancel()  # twice is fine
    t.at(40.0)
    assert loop.live() == [40.0]


def test_close_forgets_the_owner() -> None:
    t, loop, calls = timer([])
    t.at(10.0)
    t.close()
    assert loop.live() == [] and not t.pending
    t.at(50.0)  # set after the end: fires into nothing
    run_due(loop)
    assert calls == [] and not t.pending


def test_due_says_when_the_pending_handle_fires() -> None:
    # an owner asks at() only for a deadline earlier than due: due must never be later than
    # the live handle, nor finite without one
    t, loop, _ = timer([None, None])
    assert t.due == float("inf")
    t.at(10.0)
    t.at(20.0)
    assert t.due == 10.0 == min(loop.live())
    t.at(5.0)
    assert t.due == 5.0 == min(loop.live())
    run_due(loop)
    assert t.due == float("inf") and not t.pending
    t.at(7.0)
    t.cancel()
    assert t.due == float("inf") and loop.live() == []
