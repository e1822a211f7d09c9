"""The gRPC side of every call of the frontend: the request parsed (a malformed one is
INVALID_ARGUMENT), the error tree translated to a gRPC status (:func:`guard`), the answer
serialized, and the end-to-end metadata forwarded (:func:`forwarded_headers`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from v2proxy.core.admission import RETRY_AFTER_S, AdmissionGate
from v2proxy.core.errors import CodecError, Overloaded, ProxyError
from v2proxy.core.headers import call_headers
from v2proxy.core.ports import Headers
from v2proxy.core.restricted import OPEN, AccessPolicy
from v2proxy.frontends.exchange import GONE_STATUS, SHUTDOWN_STATUS, Envelope
from v2proxy.frontends.grpc_routes import RPCS
from v2proxy.ops.recorders import FrontendRecorder

log = logging.getLogger("v2proxy.frontends.grpc")

Context = grpc.aio.ServicerContext[Any, Any]


#: the cause recorded for a call that the client cancelled
GONE = "cancelled by the client"
_GRPC = "grpc"


#: the gRPC code a log line shows for a call that ended by a cancellation: the client's, or the
#: shutdown's (whose client saw UNAVAILABLE)
_SHOWN = {GONE_STATUS: "CANCELLED", SHUTDOWN_STATUS: "UNAVAILABLE"}


def status_code(exc: ProxyError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.UNKNOWN)


def refusal_trailers(exc: ProxyError) -> tuple[tuple[str, str], ...]:
    """The trailers of a failed call: an admission refusal tells gRPC's retry policy when to
    try again (``grpc-retry-pushback-ms``)."""
    if not isinstance(exc, Overloaded):
        return ()
    return (("grpc-retry-pushback-ms", str(RETRY_AFTER_S * 1000)),)


def _shown(exc: BaseException, status: int) -> str:
    """The gRPC code a failed call's log lines show: its ProxyError's, or what a cancellation
    stands for (the client's, the shutdown's)."""
    if isinstance(exc, ProxyError):
        return status_code(exc).name
    return _SHOWN.get(status, "INTERNAL")


def _kept(exc: BaseException) -> bool:
    """A call that failed keeps its failure whatever interrupts its answer (a stream's message
    answered in band)."""
    return True


class CallEnvelope(Envelope):
    """The exchange envelope of the calls of one method (its path, ``/service/method``); their
    log lines take the request id from the call's ``x-request-id`` metadata and show gRPC's
    code names; their bodies are recorded as ``grpc``."""

    __slots__ = ()

    def __init__(self, rec: FrontendRecorder, gate: AdmissionGate, path: str) -> None:
        def describe(context: Any) -> tuple[str | None, str, str]:
            metadata = context.invocation_metadata() or ()
            rid = next((v for k, v in metadata if k == "x-request-id"), None)
            return None if rid is None else str(rid), "POST", path

        super().__init__(
            rec, gate, describe, GONE, wire=_GRPC, keeps=_kept, show=_shown, ok_shown="OK"
        )


def answerable(exc: Exception, op: str) -> ProxyError:
    """The ProxyError a call that raised ``exc`` is answered with; anything else is logged once and
    answered as internal. Without its traceback, whose frames would make a reference cycle."""
    if isinstance(exc, ProxyError):
        return exc.with_traceback(None)
    log.exception("unexpected error in gRPC %s", op, exc_info=exc)
    return ProxyError(f"internal error: {type(exc).__name__}")


def parse(message_type: Any, data: bytes, rpc: str) -> Any:
    """A request message from its bytes; a malformed one is the client's error."""
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        raise CodecError(f"malformed {rpc} request: {exc}") from None


def check_call(access: AccessPolicy, group: str, context: Context) -> None:
    """The one access check of a call (a stream): ``group``, its row's in
    :data:`~v2proxy.frontends.grpc_routes.RPCS`, with the call's forwarded metadata (gathered only
    for a group that is restricted). Raises the policy's ProxyError."""
    if access.restricts(group):
        access.check(group, context.invocation_metadata() or ())


def guard(
    fn: Callable[[Any, Context], Awaitable[Any]],
    message_type: Any,
    rpc: str,
    rec: FrontendRecorder,
    gate: AdmissionGate | None = None,
    with_bytes: bool = False,
    access: AccessPolicy | None = OPEN,
) -> Callable[[bytes, Context], Any]:
    """The one translator from the error tree to gRPC status; it also serializes the answer (one
    already serialized, bytes, is answered as it is), all inside the call's exchange envelope:
    admission, the access check of the RPC's group (its row of
    :data:`~v2proxy.frontends.grpc_routes.RPCS`: once, when the message is parsed, before ``fn``
    runs; ``access`` None: ``fn`` checks it itself, as the health service does), in flight, the
    record."""
    row = RPCS[rpc]
    op, field, group = row.operation, row.model_field, row.group
    env = CallEnvelope(rec, gate or AdmissionGate(), row.path)

    async def handler(data: bytes, context: Context) -> Any:
        # a cancellation fails the exchange as it leaves the block, and goes on
        with env.open(op, context) as x:
            x.n_in = len(data)
            try:
                x.admit()
                msg = parse(message_type, data, rpc)
                if field is not None:
                    x.model = getattr(msg, field)
                if access is not None:
                    check_call(access, group, context)
                answer = await fn((msg, data) if with_bytes else msg, context)
                out = answer if isinstance(answer, bytes) else answer.SerializeToString()
            except Exception as exc:
                failure = answerable(exc, op)
            else:
                x.status = 200
                x.n_out = len(out)
                return out
            x.fail(failure)
        # the status set and no answer (grpc discards one with a non-OK code), not
        # context.abort(): its exception, kept by grpc's call state, makes a reference cycle
        context.set_code(status_code(failure))
        context.set_details(failure.message)
        trailers = refusal_trailers(failure)
        if trailers:
            context.set_trailing_metadata(trailers)
        return None

    return handler


def forwarded_headers(context: Context) -> Headers:
    """End-to-end request metadata, passed on to the backend like HTTP headers
    (:func:`~v2proxy.core.headers.call_headers`: filtered once, by the one table)."""
    return call_headers(context.invocation_metadata() or ())
