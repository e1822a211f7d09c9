"""The gRPC backend's deadline watchdog (``backends/grpc_deadlines``): a call still running at
its end has its task cancelled, as a timeout of its own; a call over in time is left alone; a
task cancelled by someone else as well is not answered as a timeout; one timer serves the calls
in flight, armed again for the next end.
"""

from __future__ import annotations

import asyncio

import pytest

from v2proxy.backends.grpc_deadlines import Watchdog

pytestmark = pytest.mark.both_loops


async def _call(dog: Watchdog, end_in: float, takes: float) -> str:
    """A call that takes ``takes`` s, watched to end ``end_in`` s from now."""
    loop = asyncio.get_running_loop()
    watch = dog.watch(loop.time() + end_in)
    try:
        await asyncio.sleep(takes)
    except asyncio.CancelledError:
        if watch.timed_out():
            return "timed out"
        raise
    finally:
        dog.unwatch(watch)
    return "done"


async def test_a_call_past_its_end_times_out() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    task = asyncio.ensure_future(_call(dog, 0.05, 30))
    assert await task == "timed out"
    assert task.cancelling() == 0  # the watchdog's cancellation taken back


async def test_calls_in_time_are_left_alone_and_later_ones_still_watched() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    quick = [asyncio.ensure_future(_call(dog, 0.05, 0)) for _ in range(3)]
    slow = asyncio.ensure_future(_call(dog, 0.2, 30))
    assert await asyncio.gather(*quick) == ["done"] * 3
    # the timer, armed for the first quick call's end, is armed again for the slow one's
    assert await slow == "timed out"
    assert not dog._watched


async def test_only_the_calls_that_reached_their_end() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    first = asyncio.ensure_future(_call(dog, 0.05, 30))
    second = asyncio.ensure_future(_call(dog, 30, 0.3))
    assert await first == "timed out"
    assert await second == "done"


async def test_someone_elses_cancellation_goes_on() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    started = asyncio.Event()

    async def outer() -> str:
        started.set()
        return await _call(dog, 0.05, 30)

    task = asyncio.ensure_future(outer())
    await started.wait()
    task.cancel()  # the client went away before the end
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not dog._watched
