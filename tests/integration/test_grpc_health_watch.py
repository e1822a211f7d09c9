"""``grpc.health.v1.Health/Watch`` streams share one readiness state: 1,000 open streams cost the
backend about one ``GET /v2/health/ready`` a second (each stream used to ask every second on its
own), a change reaches every stream, nothing is asked once none is open, and the streams beyond
``--max-health-watches`` are refused with RESOURCE_EXHAUSTED naming the option.
In process: the gRPC frontend in front of a REST stand-in that counts its readiness calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from aiohttp import web

from tests.integration.conftest import Factory, grpc_frontend, settings
from v2proxy._proto import health_pb2
from v2proxy.app_core import build_backend, build_pipeline

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Counting:
    """A v2 REST backend whose readiness is ``ready``, counting the times it is asked."""

    def __init__(self) -> None:
        self.calls = 0
        self.ready = True
        self.app = web.Application()
        self.app.router.add_get("/v2/health/ready", self.health)

    async def health(self, _request: web.Request) -> web.Response:
        self.calls += 1
        return web.json_response({}, status=200 if self.ready else 503)


@pytest.fixture
async def counted(make_client: Factory) -> AsyncIterator[tuple[Counting, str]]:
    """The counting backend, served on a loopback port, and its URL."""
    backend = Counting()
    fake = await make_client(backend.app)
    yield backend, f"http://127.0.0.1:{fake.port}"


def _watch(channel: grpc.aio.Channel) -> Any:
    return channel.unary_stream(
        "/grpc.health.v1.Health/Watch",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


async def test_a_thousand_watches_ask_the_backend_once_a_second(
    counted: tuple[Counting, str],
) -> None:
    fake, url = counted
    s = settings(backend=url, max_health_watches=1000)
    backend = build_backend(s)
    await backend.start()
    try:
        async with grpc_frontend(s, build_pipeline(s, backend)) as channel:
            watch = _watch(channel)
            streams = [watch(health_pb2.HealthCheckRequest()) for _ in range(1000)]
            async with asyncio.timeout(30):
                firsts = await asyncio.gather(*(st.read() for st in streams))
            assert {f.status for f in firsts} == {SERVING}
            before = fake.calls
            await asyncio.sleep(3.0)
            asked = fake.calls - before
            # one a second (a few more for timing): it was 1,000 a second
            assert asked <= 6, asked
            extra = watch(health_pb2.HealthCheckRequest())
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await extra.read()
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert info.value.details() == (
                "too many Health.Watch streams: v2proxy keeps at most 1000 open at once"
                " (--max-health-watches)"
            )
            for st in streams:
                st.cancel()
    finally:
        await backend.close()


async def test_a_change_reaches_every_watch_and_polling_stops_with_the_last(
    counted: tuple[Counting, str],
) -> None:
    fake, url = counted
    s = settings(backend=url, max_health_watches=3)
    backend = build_backend(s)
    await backend.start()
    try:
        async with grpc_frontend(s, build_pipeline(s, backend)) as channel:
            watch = _watch(channel)
            streams = [watch(health_pb2.HealthCheckRequest()) for _ in range(3)]
            async with asyncio.timeout(10):
                assert {(await st.read()).status for st in streams} == {SERVING}
                fake.ready = False
                assert {(await st.read()).status for st in streams} == {NOT_SERVING}
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await watch(health_pb2.HealthCheckRequest()).read()
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            for st in streams:
                st.cancel()
            await asyncio.sleep(1.5)  # the poller's last round
            before = fake.calls
            await asyncio.sleep(2.0)
            assert fake.calls == before  # nobody watches: nothing asked
            # a slot freed by a cancelled stream is taken again, with a fresh status
            async with asyncio.timeout(10):
                assert (await watch(health_pb2.HealthCheckRequest()).read()).status == NOT_SERVING
    finally:
        await backend.close()
