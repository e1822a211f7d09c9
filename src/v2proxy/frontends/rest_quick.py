"""The REST frontend's quick lane: a small JSON ``POST .../infer`` that needs nothing of the proxy
is relayed from the HTTP server's parser callback and answered from the backend connection's,
with no task and no coroutine (:data:`~v2proxy.http.server_conn.QuickHandler`).

Each step is the general path's (:meth:`RestFrontend.dispatch
<v2proxy.frontends.rest.RestFrontend.dispatch>`), taken without awaiting; a binary-framed body
is checked by :func:`~v2proxy.codecs.framed_check.plain_framed_request`. Whatever would take a
decision of its own (another route, a body not whole, compression, restricted inference,
overload, a stage, no idle connection) is declined untouched to the serving task. An answer that
cannot be written at once is finished by a task running the general path's writer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from v2proxy.codecs import binary as binc
from v2proxy.codecs import compression
from v2proxy.codecs.framed_check import plain_framed_request
from v2proxy.codecs.json_plain import plain_request
from v2proxy.core.decide import BINARY, JSON, relays, relays_as_sent
from v2proxy.core.errors import Overloaded, ProxyError
from v2proxy.core.model import InferRequest, InferResponse
from v2proxy.core.ports import ForwardResponse, no_release
from v2proxy.core.relay import nothing_to_do
from v2proxy.core.stages.chain import finish
from v2proxy.frontends import rest_record
from v2proxy.frontends.exchange import Envelope, Exchange
from v2proxy.frontends.rest_answer import error_answer, forwarded_headers, write_forwarded
from v2proxy.frontends.rest_infer import header_pass
from v2proxy.http.request import ClientDisconnected, HttpRequest
from v2proxy.http.response import HttpResponse

#: (Final, as every name compiled code reads per request: a C static, not a look-up in the
#: module's dict)
perf_counter: Final = time.perf_counter

if TYPE_CHECKING:
    from v2proxy.frontends.rest import RestFrontend

_OP: Final = "infer"
_IHCL: Final = b"inference-header-content-length"
_TARGETS_KEPT: Final = 1024
log = logging.getLogger(__name__)


class QuickLane:
    """The quick lane of one REST frontend."""

    __slots__ = (
        "backend",
        "decoded",
        "decoded_json",
        "encode",
        "envelope",
        "found",
        "framed_plain",
        "max_body_size",
        "max_input_size",
        "max_tensors",
        "restricted",
        "route",
        "row",
        "speaks_rest",
        "stages",
        "taken",
        "takes_json",
        "targets",
        "tasks",
    )

    def __init__(self, frontend: RestFrontend) -> None:
        pipeline = frontend.pipeline
        self.backend = pipeline.backend
        self.speaks_rest = self.backend.speaks_rest
        self.takes_json = self.speaks_rest and not self.backend.transcodes_json
        #: with ``takes_json`` False (``--backend-encoding binary``) a JSON body is decoded here,
        #: sent with :meth:`Backend.infer_now` and its answer encoded as the general path does
        self.encode = frontend.infer_endpoint.encode
        self.decoded_json = frontend.recorder.decode["json"]
        self.stages = pipeline.stages
        #: plain_framed_request lets binary_data_size (inputs) and binary_data (outputs)
        #: through: used only while no stage applies by either
        self.framed_plain = (
            "binary_data_size" not in self.stages.input_keys
            and "binary_data" not in self.stages.output_keys
        )
        self.decoded = frontend.recorder.decode["binary"]
        self.envelope: Envelope = frontend.envelope
        self.max_body_size = frontend.max_body_size
        self.max_input_size = frontend.max_input_size
        self.max_tensors = pipeline.max_tensors
        self.found = frontend._found
        self.route = frontend._route
        self.row = frontend.routing[0][2]
        #: path -> (model, version), for the paths of the lane's row
        self.targets: dict[str, tuple[str, str]] = {}
        #: a restricted row goes to the general path, which checks it once
        self.restricted = frontend.access.restricts(self.row.check_first or "")
        self.taken = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def wants(self, request: HttpRequest) -> bool:
        """Whether to wait for a short body before ``request`` is started: it may be the
        lane's."""
        return (
            request.method == "POST"
            and self.speaks_rest
            and not self.restricted
            and self._target(request.path) is not None
        )

    def _target(self, path: str) -> tuple[str, str] | None:
        """The model and version of ``path`` when it is the lane's row, else None."""
        target = self.targets.get(path)
        if target is None:
            found = self.found.get(path) or self.route(path)
            if found[2] is not self.row:
                return None
            model, version = found[1].group("model", "version")
            target = (model or "", version or "")
            if len(self.targets) < _TARGETS_KEPT:
                self.targets[path] = target
        return target

    def take(self, request: HttpRequest, response: HttpResponse) -> bool:
        """The HTTP server's quick handler: True when the lane has taken ``request``."""
        if request.method != "POST" or not self.speaks_rest:
            return False
        target = self.targets.get(request.path) or self._target(request.path)
        if target is None:
            return False
        body = request.whole(self.max_body_size, take=False)
        if body is None:
            return False
        seen = request.state = header_pass(request.headers)  # (infer_headers, typed)
        accept, encoding, ihcl_value, forwarded, rid = seen
        if (
            encoding is not None
            or (accept is not None and compression.choose_encoding(accept) is not None)
            or self.restricted
        ):
            return False
        model, version = target
        decoded = 0.0
        transcoded: InferRequest | None = None
        if ihcl_value is None:
            ihcl = None
            if self.takes_json:
                # the decision (data) first: the check parses the body
                if relays(
                    JSON, len(body), self.backend.relay_facts(model, version)
                ) is not True or not relays_as_sent(body, self.max_input_size, self.max_tensors):
                    return False
            else:  # decoded by the full decoder (its error is the general path's to say)
                t0 = perf_counter()
                transcoded = plain_request(
                    body, model, version, self.max_input_size, self.max_tensors
                )
                if transcoded is None:  # not of the plain shape: the full decoder's
                    try:
                        transcoded = binc.decode_request(
                            body,
                            None,
                            model,
                            version,
                            self.max_input_size,
                            self.max_tensors,
                            plain=False,
                        )
                    except ProxyError:
                        return False
                if self.stages.applies(transcoded):
                    return False
                decoded = perf_counter() - t0
        else:  # binary-framed (a fault is the general path's to say)
            if relays(BINARY, len(body), self.backend.relay_facts(model, version)) is not True:
                return False
            t0 = perf_counter()
            try:
                ihcl = binc.parse_ihcl(ihcl_value, len(body))
            except ProxyError:
                return False
            if not ihcl:  # raw: its shape comes from the model's metadata
                return False
            if self.framed_plain:  # the header's common shape, checked in one typed parse
                if not plain_framed_request(body, ihcl, self.max_input_size, self.max_tensors):
                    return False
            else:  # checked by the full decoder
                try:
                    checked = binc.decode_request(
                        body, ihcl, model, version, self.max_input_size, self.max_tensors
                    )
                except ProxyError:
                    return False
                if not nothing_to_do(checked, True, self.stages):
                    return False
            decoded = perf_counter() - t0
        exchange = _Exchange(self, request, response, rid, model, len(body), transcoded)
        try:
            exchange.held = self.envelope.enter(_OP)  # (Exchange.admit, written out)
        except Overloaded:
            exchange.held = False
            exchange.undo()
            return False
        if transcoded is None:
            cancel = self.backend.relay_now(
                model, version, body, forwarded, exchange.answered, ihcl=ihcl
            )
        else:
            try:
                cancel = self.backend.infer_now(transcoded, forwarded, exchange.answered)
            except ProxyError:
                cancel = None
        if cancel is None:
            exchange.undo()
            return False
        if ihcl is not None:
            exchange.wire_in = "binary"
            self.decoded.observe(decoded)
        elif transcoded is not None:
            self.decoded_json.observe(decoded)
        exchange.cancel = cancel
        response.on_cut = exchange.cut
        request.taken()
        self.taken += 1
        return True


class _Exchange(Exchange):
    """One request taken by the lane, until its answer is written and recorded (:meth:`_done`)."""

    __slots__ = ("cancel", "lane", "over", "request", "response", "rid", "task")

    lane: QuickLane
    response: HttpResponse
    rid: bytes | None
    #: gives the backend call up (its connection closes, no outcome follows)
    cancel: Callable[[], None] | None
    task: asyncio.Task[None] | None
    over: bool
    #: the decoded request of a transcoded call, until its answer is encoded
    request: InferRequest | None

    def __init__(
        self,
        lane: QuickLane,
        source: HttpRequest,
        response: HttpResponse,
        rid: bytes | None,
        model: str,
        n_in: int,
        request: InferRequest | None,
    ) -> None:
        # (Exchange.__init__, written out with the lane's own)
        envelope = self.envelope = lane.envelope
        envelope.inflight.value += 1
        self.op = _OP
        self.source = source
        self.held = None
        self.model = model
        self.status = 500
        self.error = "internal"
        self.cause = None
        self.wire_in = self.wire_out = "json"
        self.n_in = n_in
        self.n_out = 0
        self.lane = lane
        self.response = response
        self.rid = rid
        self.cancel = self.task = None
        self.over = False
        self.request = request
        self.t0 = perf_counter()

    def cut(self) -> None:
        """The server cut the client's connection (shutdown past ``--drain-timeout``): the
        backend call is given up and the request recorded as cut."""
        if self.cancel is not None:
            self.cancel()
        if self.task is not None:
            self.task.cancel()
        if not self.over:
            self.fail(asyncio.CancelledError())
            self._done("json", 0)

    def answered(self, outcome: ForwardResponse | InferResponse | ProxyError) -> None:
        """The backend's outcome, written (or handed to a task), then recorded. Called from the
        backend connection's callback: it never raises (a bug is logged, the connection
        aborted)."""
        try:
            if isinstance(outcome, ForwardResponse):
                content = outcome.content
                if content is None or outcome.release is not no_release:
                    self._later(self._stream(outcome))
                    return
                rid = self.rid
                headers = outcome.headers if rid is None else forwarded_headers(outcome, rid)
                self._write(outcome.status, headers, content, rest_record.wire_out(outcome.headers))
            elif isinstance(outcome, InferResponse):
                self._encoded(outcome)
            else:
                status, headers, body = error_answer(outcome)
                self.fail(outcome)
                if self.rid is not None:
                    headers.append((rest_record.REQUEST_ID, self.rid))
                self._write(status, headers, body, "json")
        except Exception as exc:
            log.exception("the quick lane failed on %s", self.source.path)
            self.response.abort()
            if not self.over:
                self.fail(exc)
                self._done("json", 0)

    def _encoded(self, response: InferResponse) -> None:
        """A transcoded call's response, encoded as the general path does, written."""
        request = self.request
        assert request is not None  # (a transcoded call's)
        self.request = None
        answer = self.lane.encode(request, finish(request, response), None)
        assert not isinstance(answer, ForwardResponse)  # (encoded: never passed through)
        status, headers, chunks = answer
        if isinstance(chunks, list):
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        else:
            body = chunks
        if self.rid is not None:
            headers.append((rest_record.REQUEST_ID, self.rid))
        self._write(status, headers, body, rest_record.wire_out(headers))  # type: ignore[arg-type]

    def _write(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes | bytearray,
        wire_out: str,
    ) -> None:
        """The answer written (at once, or by a task), then recorded."""
        self.status = status
        response = self.response
        if not response.send_now(status, headers, body):
            # not written at once (a client gone, a large body): the general path's writer
            self._later(self._send(status, headers, body, wire_out))
        elif response.paused:  # written; the next request waits until the client keeps up
            self._later(self._drained(wire_out, len(body)))
        else:
            self._done(wire_out, len(body))

    def _done(self, wire_out: str, n_out: int) -> None:
        """The exchange ends (once): recorded, and its response finished."""
        if self.over:
            return
        self.over = True
        self.cancel = self.task = None  # (each holds this exchange: no cycle left behind)
        if self.cause is None and self.status >= 400:  # the backend's error answer
            self.error = rest_record.answer_error(_OP, self.status)
        self.wire_out = wire_out
        self.n_out = n_out
        self.end()
        self.response.finished()

    def _later(self, work: asyncio.Future[None] | object) -> None:
        tasks = self.lane.tasks
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)  # type: ignore[arg-type]
        self.task = task
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _send(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes | bytearray,
        wire_out: str,
    ) -> None:
        try:
            await self.response.send(status, headers, body)
        except Exception as exc:
            # an error answer cut short by the client stays that error
            if self.cause is None or not isinstance(exc, ClientDisconnected):
                self._failed(exc)
        self._done(wire_out, len(body))

    async def _drained(self, wire_out: str, n_out: int) -> None:
        try:
            await self.response.drain()
        except Exception as exc:
            if self.cause is None or not isinstance(exc, ClientDisconnected):
                self._failed(exc)
        self._done(wire_out, n_out)

    async def _stream(self, answer: ForwardResponse) -> None:
        self.status, n_out = answer.status, 0
        wire_out = rest_record.wire_out(answer.headers)
        try:
            n_out = await write_forwarded(self.source, self.response, answer, self.rid)
        except Exception as exc:
            self._failed(exc)
        self._done(wire_out, n_out)

    def _failed(self, exc: Exception) -> None:
        """A write failed: recorded as what it is; anything but the client leaving is a bug,
        logged, and the connection is aborted."""
        if not isinstance(exc, ClientDisconnected):
            log.error("the quick lane's answer to %s failed", self.source.path, exc_info=exc)
            self.response.abort()
        if not self.over:
            self.fail(exc)
