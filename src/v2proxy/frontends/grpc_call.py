"""The envelope of every gRPC call of the frontend: the request's bytes parsed into its message (a
malformed one is INVALID_ARGUMENT naming the RPC, where gRPC's own deserializer failure would be
UNKNOWN), the one translator from the error tree to a gRPC status (:func:`guard`;
docs/architecture.md, the error tree), the answer serialized (so that its size is known), the call
recorded (metrics and log lines, :class:`Call`; each message of a stream is recorded on its own),
and the end-to-end request metadata forwarded to the backend (:func:`forwarded_headers`). A call is
admitted first by the process's :class:`~v2proxy.core.admission.AdmissionGate`
(``--max-concurrency``): refused, it is RESOURCE_EXHAUSTED with the trailer
``grpc-retry-pushback-ms`` (:func:`refusal_trailers`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from v2proxy._proto.service import SERVICE
from v2proxy.core.admission import RETRY_AFTER_S, AdmissionGate
from v2proxy.core.errors import CodecError, Overloaded, ProxyError
from v2proxy.core.ports import Headers
from v2proxy.http.headers import HOP_BY_HOP
from v2proxy.ops.metrics import error_kind
from v2proxy.ops.recorders import FrontendRecorder

log = logging.getLogger("v2proxy.frontends.grpc")  # the gRPC frontend's logger

HEALTH_SERVICE = "grpc.health.v1.Health"
#: request metadata that is about this gRPC hop and never forwarded
_HOP_METADATA = frozenset(
    {
        "user-agent",
        "content-type",
        "te",
        "grpc-accept-encoding",
        "grpc-encoding",
        "grpc-timeout",
        "triton_grpc_error",
        "accept-encoding",
    }
)

Context = grpc.aio.ServicerContext[Any, Any]


def status_code(exc: ProxyError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.UNKNOWN)


def refusal_trailers(exc: ProxyError, rec: FrontendRecorder) -> tuple[tuple[str, str], ...]:
    """The trailers of a failed call: an admission refusal is counted and tells gRPC's retry
    policy when to try again (``grpc-retry-pushback-ms``)."""
    if not isinstance(exc, Overloaded):
        return ()
    rec.rejected.inc()
    return (("grpc-retry-pushback-ms", str(RETRY_AFTER_S * 1000)),)


def parse(message_type: Any, data: bytes, rpc: str) -> Any:
    """A request message from its bytes; a malformed one is the client's error."""
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        raise CodecError(f"malformed {rpc} request: {exc}") from None


#: RPC -> the ``operation`` label of its metrics (others: "side")
_OPERATIONS = {
    "ModelInfer": "infer",
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "Check": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelConfig": "metadata",
}
#: RPC -> the request field that names the model
_MODEL_FIELDS = {
    "ModelInfer": "model_name",
    "ModelReady": "name",
    "ModelMetadata": "name",
    "ModelConfig": "name",
    "ModelStatistics": "name",
    "RepositoryModelLoad": "model_name",
    "RepositoryModelUnload": "model_name",
    "TraceSetting": "model_name",
}


def guard(
    fn: Callable[[Any, Context], Awaitable[Any]],
    message_type: Any,
    rpc: str,
    rec: FrontendRecorder,
    gate: AdmissionGate | None = None,
) -> Callable[[bytes, Context], Any]:
    """The one translator from the error tree to gRPC status; it also serializes the answer
    and records the call (metrics, log lines)."""
    op = _OPERATIONS.get(rpc, "side")
    field = _MODEL_FIELDS.get(rpc)
    path = f"/{HEALTH_SERVICE if rpc == 'Check' else SERVICE}/{rpc}"
    admission = gate or AdmissionGate()

    async def handler(data: bytes, context: Context) -> Any:
        t0 = perf_counter()
        rec.inflight.inc()
        call = Call(op, "")
        held = False
        try:
            with call:
                held = admission.enter(op)
                msg = parse(message_type, data, rpc)
                if field is not None:
                    call.model = getattr(msg, field)
                out = (await fn(msg, context)).SerializeToString()
                call.n_out = len(out)
                return out
        finally:
            if held:
                admission.leave()
            rec.inflight.dec()
            call.record(rec, context, t0, len(data), path)
        failure = call.exc
        assert failure is not None
        # the status set and no answer (grpc discards one with a non-OK code), not
        # context.abort(): its exception, kept by grpc's call state, makes a reference cycle
        context.set_code(status_code(failure))
        context.set_details(failure.message)
        trailers = refusal_trailers(failure, rec)
        if trailers:
            context.set_trailing_metadata(trailers)
        return None

    return handler


class Call:
    """What is recorded of one call (one message of a stream)."""

    __slots__ = ("error", "exc", "model", "n_out", "op", "status")

    def __init__(self, op: str, model: str) -> None:
        self.op = op
        self.model = model
        self.status = 200
        self.error: str | None = None
        self.exc: ProxyError | None = None
        self.n_out = 0

    def failed(self, exc: ProxyError, kind: str | None = None) -> None:
        # without its traceback: its frames (the handler's among them, which holds this call)
        # would make a reference cycle that only the garbage collector's rare full passes free
        self.exc = exc.with_traceback(None)
        self.status = exc.http_status
        self.error = kind or error_kind(exc)

    def cancelled(self) -> None:
        self.failed(ProxyError("cancelled by the client"), "client_disconnected")
        self.status = 499

    def __enter__(self) -> Call:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: Any
    ) -> bool:
        """The one mapping of what a call raised: a ProxyError is its failure; a cancellation
        is recorded and goes on; anything else is logged once and answered as internal."""
        if exc is None:
            return False
        if isinstance(exc, ProxyError):
            self.failed(exc)
            return True
        if isinstance(exc, asyncio.CancelledError):
            self.cancelled()
            return False
        if isinstance(exc, Exception):
            log.exception("unexpected error in gRPC %s", self.op, exc_info=exc)
            self.failed(ProxyError(f"internal error: {type(exc).__name__}"), "internal")
            return True
        return False

    def record(
        self, rec: FrontendRecorder, context: Context, t0: float, n_in: int, path: str
    ) -> None:
        duration = perf_counter() - t0
        status = self.status
        rec.done(
            duration, self.op, self.model, status, self.error, "grpc", n_in, "grpc", self.n_out
        )
        if status >= 400 or rec.access_log:
            exc = self.exc
            rid = next(
                (v for k, v in context.invocation_metadata() or () if k == "x-request-id"), None
            )
            rec.log(
                status >= 400,
                None if rid is None else str(rid),
                self.model,
                "POST",
                path,
                "OK" if exc is None else ("CANCELLED" if status == 499 else status_code(exc).name),
                duration,
                n_in,
                self.n_out,
                None if exc is None else exc.message,
            )


def forwarded_headers(context: Context) -> Headers:
    """End-to-end request metadata, passed on to the backend like HTTP headers (gRPC metadata
    values are printable ASCII; binary ``-bin`` entries are not forwarded)."""
    out: Headers = []
    for key, value in context.invocation_metadata() or ():
        if (
            key.startswith((":", "grpc-"))
            or key in _HOP_METADATA
            or key in HOP_BY_HOP
            or key.endswith("-bin")
        ):
            continue
        out.append((key.encode("ascii"), value if isinstance(value, bytes) else value.encode()))
    return out
