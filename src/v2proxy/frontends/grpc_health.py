"""``grpc.health.v1.Health`` on the gRPC frontend: one readiness state per frontend (per worker
process), shared by every ``Watch`` stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from v2proxy._proto import health_pb2
from v2proxy.core.errors import ProxyError
from v2proxy.core.restricted import OPEN, AccessPolicy
from v2proxy.frontends.grpc_call import Context, check_call
from v2proxy.frontends.grpc_routes import RPCS

log = logging.getLogger("v2proxy.frontends.grpc")

#: seconds between two readiness calls while a Watch stream is open
POLL_S = 1.0
Status = health_pb2.HealthCheckResponse.ServingStatus
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """The Health service's two RPCs over one readiness state; ``ready``: the pipeline's
    readiness as the health service asks it, ``limit``: ``--max-health-watches``, ``access``:
    the policy its calls are checked with."""

    def __init__(
        self, ready: Callable[[], Awaitable[bool]], limit: int, access: AccessPolicy = OPEN
    ) -> None:
        self._ready = ready
        self.limit = limit
        self.access = access
        #: the status last learnt (None: not known since the poller started)
        self.status: Status | None = None
        #: Watch streams open now
        self.watching = 0
        #: set, and replaced, when the status changes
        self._changed = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    async def _ask(self) -> Status:
        try:
            ready = await self._ready()
        except ProxyError:
            ready = False
        self._publish(SERVING if ready else NOT_SERVING)
        return SERVING if ready else NOT_SERVING

    def _publish(self, status: Status) -> None:
        if status != self.status:
            self.status = status
            self._changed.set()
            self._changed = asyncio.Event()

    async def _poll(self) -> None:
        """Asks every POLL_S seconds until no Watch stream is left."""
        while self.watching:
            try:
                await self._ask()
            except Exception:
                log.exception("gRPC health: readiness could not be asked")
                self._publish(NOT_SERVING)
            await asyncio.sleep(POLL_S)

    def _refused(self, rpc: str, context: Context) -> bool:
        """The one access check of a call (a stream): whether its row's group refuses it."""
        try:
            check_call(self.access, RPCS[rpc].group, context)
        except ProxyError:
            return True
        return False

    async def Check(
        self, _r: health_pb2.HealthCheckRequest, c: Context
    ) -> health_pb2.HealthCheckResponse:
        if self._refused("Check", c):
            return health_pb2.HealthCheckResponse(status=NOT_SERVING)
        return health_pb2.HealthCheckResponse(status=await self._ask())

    async def Watch(
        self, _r: health_pb2.HealthCheckRequest, context: Context
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        if self.limit and self.watching >= self.limit:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many Health.Watch streams: v2proxy keeps at most {self.limit} open at once"
                " (--max-health-watches)",
            )
        self.watching += 1
        try:
            if self._refused("Watch", context):
                yield health_pb2.HealthCheckResponse(status=NOT_SERVING)
                await asyncio.Event().wait()  # never set: told nothing more until it leaves
                return
            if self._poller is None or self._poller.done():
                self.status = None  # not asked while nobody watched: unknown until asked
                self._poller = asyncio.create_task(self._poll())
            last = None
            while True:
                changed = self._changed
                if self.status is not None and self.status != last:
                    last = self.status
                    yield health_pb2.HealthCheckResponse(status=last)
                    continue  # it may have changed while the client read
                await changed.wait()
        finally:
            self.watching -= 1
