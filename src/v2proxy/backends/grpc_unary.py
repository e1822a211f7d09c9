"""A unary gRPC call of bytes on a grpc.aio channel, without grpc.aio's per-call wrapper: the
gRPC backend's ModelInfer pass-through (:meth:`GrpcBackend.relay_message
<v2proxy.backends.grpc.GrpcBackend.relay_message>`) and its decoded ModelInfer."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

import grpc

#: the parameters of the channel's Cython ``call`` this module knows how to use
_CALL_PARAMS = [
    "self",
    "method",
    "deadline",
    "python_call_credentials",
    "wait_for_ready",
    "registered_call_handle",
]
_CANCELLED = "Locally cancelled by application!"
#: the status codes by their number (the Cython call's status carries the number)
_CODES = {code.value[0]: code for code in grpc.StatusCode}

Metadata = Sequence[tuple[str, str]] | None


class UnaryBytes(Protocol):
    """A unary call taking and answering serialized messages."""

    def __call__(
        self, request: bytes, *, timeout: float, metadata: Metadata = None
    ) -> Awaitable[bytes]: ...


def _usable() -> bool:
    """Whether grpcio's Cython channel and call are the ones this module was written for."""
    try:
        cygrpc = importlib.import_module("grpc._cython.cygrpc")
        params = list(inspect.signature(cygrpc.AioChannel.call).parameters)
    except (ImportError, AttributeError, TypeError, ValueError):
        return False
    return params == _CALL_PARAMS and hasattr(cygrpc, "_AioCall")


_USABLE = _usable()


class RawUnary:
    """Unary calls of one method on one channel, bytes in and bytes out."""

    __slots__ = ("_channel", "_in_flight", "_method")

    def __init__(self, channel: Any, method: str) -> None:
        #: the channel's Cython object
        self._channel = channel
        self._method = method.encode()
        #: the Cython calls in flight (cancelled when the channel closes)
        self._in_flight: set[Any] = set()

    def __call__(
        self, request: bytes, *, timeout: float, metadata: Metadata = None
    ) -> Awaitable[bytes]:
        return self._call(request, time.time() + timeout, metadata)

    async def _call(self, request: bytes, deadline: float, metadata: Metadata) -> bytes:
        call = self._channel.call(self._method, deadline, None, None, 0)
        in_flight = self._in_flight
        in_flight.add(call)
        try:
            answer = await call.unary_unary(request, tuple(metadata or ()), None)
        except asyncio.CancelledError:
            if not call.done():
                call.cancel(_CANCELLED)
            raise
        finally:
            in_flight.discard(call)
        if call.is_ok():
            return answer  # type: ignore[no-any-return]
        if call.is_locally_cancelled():
            raise asyncio.CancelledError
        status = await call.status()
        raise grpc.aio.AioRpcError(
            _CODES.get(status.code(), grpc.StatusCode.UNKNOWN),
            grpc.aio.Metadata.from_tuple(await call.initial_metadata()),
            grpc.aio.Metadata.from_tuple(status.trailing_metadata()),
            details=status.details(),
            debug_error_string=status.debug_error_string(),
        )

    def cancel_all(self) -> None:
        """The channel is closing: every call in flight is cancelled."""
        for call in list(self._in_flight):
            if not call.done():
                call.cancel(_CANCELLED)


def raw_unary(channel: grpc.aio.Channel, method: str) -> tuple[UnaryBytes, RawUnary | None]:
    """The unary call of ``method`` on ``channel`` (bytes in and out), and the
    :class:`RawUnary` behind it, None when grpc.aio's own multi-callable is used instead."""
    cython_channel = getattr(channel, "_channel", None)
    if _USABLE and cython_channel is not None:
        raw = RawUnary(cython_channel, method)
        return raw, raw
    public: UnaryBytes = channel.unary_unary(
        method, request_serializer=None, response_deserializer=None
    )
    return public, None
