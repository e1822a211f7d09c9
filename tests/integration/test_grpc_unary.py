"""The gRPC backend's unary call of bytes without grpc.aio's wrapper (``backends/grpc_unary``),
against a grpc.aio server in process, side by side with grpc.aio's own multi-callable: the same
answer, the same error (code, details, trailers), the same deadline, the metadata delivered,
a cancelled caller cancelling the call at the server, and the calls in flight cancelled when
the channel closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from v2proxy.backends import grpc_unary
from v2proxy.backends.grpc_unary import RawUnary, UnaryBytes, raw_unary

pytestmark = pytest.mark.both_loops

METHOD = "/test.Echo/Call"


class Server:
    """What the server saw: the metadata of each call, and the calls cancelled."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Server]]:
    """Echo: ``fail`` is FAILED_PRECONDITION with a trailer, ``slow`` answers after 10 s."""
    seen = Server()

    async def call(data: bytes, context: Any) -> bytes:
        seen.metadata.append(dict(context.invocation_metadata() or ()))
        if data == b"fail":
            context.set_trailing_metadata((("why", "asked"),))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "failed as asked")
        if data == b"slow":
            seen.started.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.cancelled.set()
                raise
        return b"echo:" + data

    srv = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(call)
    srv.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("test.Echo", {"Call": handler})]
    )
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield f"127.0.0.1:{port}", seen
    finally:
        await srv.stop(None)


@pytest.fixture
async def channel(server: tuple[str, Server]) -> AsyncIterator[grpc.aio.Channel]:
    ch = grpc.aio.insecure_channel(server[0])
    try:
        yield ch
    finally:
        await ch.close(None)


def both(channel: grpc.aio.Channel) -> list[UnaryBytes]:
    """The raw call and grpc.aio's own, to compare."""
    raw, held = raw_unary(channel, METHOD)
    assert isinstance(held, RawUnary)  # the internals are the expected ones (pinned grpcio)
    public: UnaryBytes = channel.unary_unary(METHOD)
    return [raw, public]


async def test_answer_and_metadata(channel: grpc.aio.Channel, server: tuple[str, Server]) -> None:
    for call in both(channel):
        assert await call(b"x", timeout=5, metadata=[("x-request-id", "r1")]) == b"echo:x"
    assert [m.get("x-request-id") for m in server[1].metadata] == ["r1", "r1"]


async def test_error_is_the_same(channel: grpc.aio.Channel) -> None:
    errors = []
    for call in both(channel):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"fail", timeout=5)
        errors.append(info.value)
    raw, public = errors
    assert raw.code() == public.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert raw.details() == public.details() == "failed as asked"
    assert tuple(raw.trailing_metadata()) == tuple(public.trailing_metadata())
    assert ("why", "asked") in tuple(raw.trailing_metadata())


async def test_deadline(channel: grpc.aio.Channel) -> None:
    for call in both(channel):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"slow", timeout=0.2)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_unreachable_is_unavailable() -> None:
    async with grpc.aio.insecure_channel("127.0.0.1:1") as ch:
        for call in both(ch):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(b"x", timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_cancelled_caller_cancels_the_call(
    channel: grpc.aio.Channel, server: tuple[str, Server]
) -> None:
    call, _ = raw_unary(channel, METHOD)
    task = asyncio.ensure_future(call(b"slow", timeout=30))
    await asyncio.wait_for(server[1].started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(server[1].cancelled.wait(), 5)


async def test_closing_cancels_calls_in_flight(server: tuple[str, Server]) -> None:
    ch = grpc.aio.insecure_channel(server[0])
    call, raw = raw_unary(ch, METHOD)
    assert raw is not None
    task = asyncio.ensure_future(call(b"slow", timeout=30))
    await asyncio.wait_for(server[1].started.wait(), 5)
    raw.cancel_all()
    await ch.close(None)
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_other_internals_fall_back_to_the_public_call(
    channel: grpc.aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grpc_unary, "_USABLE", False)
    call, raw = raw_unary(channel, METHOD)
    assert raw is None
    assert await call(b"y", timeout=5) == b"echo:y"
