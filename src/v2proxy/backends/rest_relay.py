"""A whole /infer body relayed to a REST backend and its answer taken, driven by the client
connection's callbacks (:class:`RelayCall`), with no coroutine and no task; callers either are
called back (:meth:`RelaySide.relay`, the REST backend's ``relay_now``) or await the outcome
(:meth:`RestBackend.relay_infer <v2proxy.backends.rest.RestBackend.relay_infer>`).

A 200 over :data:`READ_WHOLE` bytes (or of unknown length) is handed on as it comes; any other
answer is read whole. A transcoded call (``finish`` set) always reads its 200 whole.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from v2proxy.backends.base import OUTCOME
from v2proxy.backends.endpoints import Endpoint, Endpoints
from v2proxy.backends.rest_answers import failure, raise_for_status, relayed_headers
from v2proxy.backends.rest_requests import infer_headers
from v2proxy.backends.rest_stream import streamed
from v2proxy.core.errors import BadGateway, ProxyError
from v2proxy.core.ports import NO_CHUNKS, ForwardResponse, Headers, Record
from v2proxy.http.client import HttpClient
from v2proxy.http.client_conn import ClientConnection
from v2proxy.http.client_errors import AnswerTooLarge
from v2proxy.http.client_response import ClientResponse

#: (Final, as every name compiled code reads per request: a C static, not a look-up in the
#: module's dict)
perf_counter: Final = time.perf_counter

READ_WHOLE: Final = 256 * 1024
_NEVER: Final = 1 << 62  # (a 200 of unknown length still comes to the event at its head)

Done = Callable[[ForwardResponse | ProxyError], None]
#: :meth:`Backend.relay_now <v2proxy.core.ports.Backend.relay_now>`
RelayNow = Callable[..., Callable[[], None] | None]
#: what a transcoded call makes of its whole 200 answer (headers, body): its outcome
Finish = Callable[[list[tuple[bytes, bytes]], bytes], Any]


class RelaySide:
    """What every relayed call to one REST backend shares."""

    __slots__ = (
        "base_url",
        "endpoints",
        "limit",
        "loop",
        "record",
        "target_of",
        "targets",
        "timeout",
    )

    def __init__(
        self,
        endpoints: Endpoints[HttpClient],
        base_url: str,
        timeout: float,
        limit: int | None,
        targets: dict[tuple[str, str], str],
        target_of: Callable[[str, str], str],
    ) -> None:
        self.endpoints = endpoints
        self.base_url = base_url
        self.timeout = timeout
        self.limit = limit
        #: told of each call once it is over (:meth:`Backend.time_now
        #: <v2proxy.core.ports.Backend.time_now>`)
        self.record: Record | None = None
        #: (model, version) -> the /infer target, as far as ``target_of`` remembered it (the
        #: backend's own table, read here without calling it)
        self.targets = targets
        self.target_of = target_of
        #: the event loop, once the backend started (:meth:`relay` sends nothing before)
        self.loop: asyncio.AbstractEventLoop | None = None

    def relay(
        self,
        model: str,
        version: str,
        body: bytes | bytearray,
        headers: Headers,
        done: Done,
        *,
        ihcl: int | None = None,
    ) -> Callable[[], None] | None:
        """The REST backend's :meth:`~v2proxy.core.ports.Backend.relay_now`: a whole /infer body
        sent unchanged at once on an idle connection, its headers those of
        :func:`~v2proxy.backends.rest_requests.infer_headers`; the call's cancel, its outcome
        given to ``done`` later. None, with nothing sent, when it cannot go at once (then
        ``relay_infer``)."""
        loop = self.loop
        if loop is None:
            return None
        target = self.targets.get((model, version)) or self.target_of(model, version)
        sent = infer_headers(headers, ihcl)
        return self.now(target, model, body, sent, done, loop.time() + self.timeout)

    def now(
        self,
        target: str,
        model: str,
        body: bytes | bytearray | memoryview,
        headers: Sequence[tuple[bytes, bytes]],
        done: Callable[[Any], None],
        due: float,
        finish: Finish | None = None,
    ) -> Callable[[], None] | None:
        """A whole body sent at once to ``target`` on an idle connection of the endpoint picked
        for it, timed (:attr:`record`): the call's cancel, its outcome given to ``done`` later.
        None, with nothing sent, when none is idle or the head cannot be written (then the
        awaited call, which waits for a connection or says why)."""
        endpoints = self.endpoints
        ep = endpoints.pick()
        if ep is None:
            return None
        client = ep.client
        try:
            head = client.head("POST", target, headers, len(body))
            conn = client.idle_now()
        except ValueError:
            conn = None
        if conn is None:
            endpoints.unpick()  # the awaited call picks it again
            return None
        call = RelayCall(self, ep, conn, model, done, due, finish, True)
        call.send(head, body)
        return call.abandon

    def failed(self, exc: BaseException) -> ProxyError:
        """The error-tree error of a failure of the call (an unexpected one is a 502)."""
        if isinstance(exc, ProxyError):
            return exc
        mapped = failure(exc, self.base_url, self.timeout, "inference")  # type: ignore[arg-type]
        if mapped is None:
            return BadGateway(
                f"backend at {self.base_url} failed during inference: {type(exc).__name__}"
            )
        return mapped


class RelayCall:
    """One relayed call on one connection of one endpoint."""

    __slots__ = (
        "client",
        "conn",
        "done",
        "due",
        "ep",
        "finish",
        "model",
        "record",
        "side",
        "t0",
        "upto",
    )

    def __init__(
        self,
        side: RelaySide,
        ep: Endpoint[HttpClient],
        conn: ClientConnection,
        model: str,
        done: Callable[[Any], None],
        due: float,
        finish: Finish | None = None,
        timed: bool = False,
    ) -> None:
        self.side = side
        self.ep = ep
        self.client = ep.client
        self.conn = conn
        self.model = model
        self.done = done
        self.due = due
        self.finish = finish
        self.upto = READ_WHOLE if finish is None else None
        #: ``timed`` (a call made without a coroutine): told of the call once it is over,
        #: timed from ``t0``
        self.record: Record | None = side.record if timed else None
        self.t0 = 0.0 if self.record is None else perf_counter()

    def _over(self, outcome: Any) -> None:
        record = self.record
        if record is not None:
            failed = outcome if isinstance(outcome, ProxyError) else None
            op = "relay_infer" if self.finish is None else "infer"
            record(op, self.model, perf_counter() - self.t0, failed)
        self.done(outcome)

    def send(self, head: bytes, body: bytes | bytearray | memoryview) -> None:
        """The request out, in one write; the answer comes to :meth:`event`."""
        conn = self.conn
        self.ep.outstanding += 1
        conn.on_event = self.event
        conn.begin(False, self.due)
        upto = self.upto  # (read whole with no event at its head)
        conn.read_upto = _NEVER if upto is None else upto
        conn.read_limit = self.side.limit
        conn.transport.write(head + body if len(body) <= 65536 else b"".join((head, body)))

    def abandon(self) -> None:
        """The caller gave the call up: the connection closes, no outcome follows."""
        conn = self.conn
        if conn.on_event is not None:
            conn.on_event = None
            self.ep.outstanding -= 1
            conn.close()
            self.client.release(conn)

    def event(self) -> None:
        """The connection's answer came to its head, its end or a failure."""
        conn = self.conn
        if conn.error is None and not conn.body_done:
            if conn.whole:  # (read whole: its end or its failure is next)
                return
            status = conn.status
            size = conn.content_length
            upto = self.upto
            if upto is not None and status == 200 and (size is None or size > upto):
                self._stream()
                return
            limit = self.side.limit
            if limit is not None and size is not None and size > limit:
                conn._fail(AnswerTooLarge(limit, size))
                return
            conn.read_whole(limit)  # (may fail at once, calling back here)
            return
        side = self.side
        ep = self.ep
        ep.outstanding -= 1
        conn.on_event = None
        error = conn.error
        if error is not None:
            self.client.release(conn)
            if conn.head_done:  # a failure once the head came counts as that head
                error.answered = conn.status
                side.endpoints.answered(ep, conn.status)
            else:
                side.endpoints.failed(ep, OUTCOME.get(type(error), "malformed"))
            self._over(side.failed(error))
            return
        status = conn.status
        headers = conn.headers
        content = conn.take_all()
        self.client.release(conn)
        side.endpoints.answered(ep, status)
        finish = self.finish
        try:
            if status != 200:
                raise_for_status(status, content, self.model)
            if finish is not None:
                outcome = finish(headers, content)
            else:
                relayed = relayed_headers(headers, len(content), content, side.base_url)
                length = len(content)
                outcome = ForwardResponse(200, relayed, NO_CHUNKS, content=content, length=length)
        except ProxyError as exc:
            self._over(exc)
            return
        self._over(outcome)

    def _stream(self) -> None:
        conn = self.conn
        conn.on_event = None
        side = self.side
        self.ep.outstanding -= 1
        side.endpoints.answered(self.ep, 200)
        resp = ClientResponse(self.client, conn, side.timeout, True)
        try:
            relayed = relayed_headers(resp.headers, resp.content_length, None, side.base_url)
        except ProxyError as exc:
            resp.close()
            self._over(exc)
            return
        self._over(streamed(resp, side.base_url, side.timeout, "inference", relayed, self.due))
