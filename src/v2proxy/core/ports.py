"""The port between the core and the model servers: what the
:class:`~v2proxy.core.pipeline.Pipeline` needs from a backend, typed per operation.

Operations take and return the internal model or the canonical v2 JSON objects of the side
endpoints, never wire bytes; every failure is a :class:`~v2proxy.core.errors.ProxyError`. What a
backend takes as sent is data (:class:`RelayFacts`); the core decides from it, and
``relay_infer``/``relay_message`` only send. Pure: no I/O library is imported here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from v2proxy.core.errors import ProxyError
from v2proxy.core.model import Buffer, InferRequest, InferResponse

#: end-to-end request headers: (lowercase name, value as received)
Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class RelayFacts:
    """What a backend takes as the client sent it, as data (None: not known now; see
    :meth:`Backend.learn_relay_facts`)."""

    rest: bool
    grpc: bool
    #: a JSON body of fewer bytes than this is relayed, whatever the backend's capabilities
    json_below: int
    #: a larger one is relayed unless the backend takes binary tensors (``auto``), else never
    json_auto: bool
    binary_tensors: bool | None
    #: messages of this many bytes or more are not relayed (their tensors may be staged)
    message_below: int
    decoupled: bool | None


TAKES_NOTHING = RelayFacts(False, False, 0, False, False, 0, False)


async def no_release() -> None:
    """The ``release`` of an answer that holds nothing (callers may skip awaiting it)."""
    return None


class _NoChunks:
    """The body of an answer read whole: no pieces (stateless, one serves every answer)."""

    __slots__ = ()

    def __aiter__(self) -> _NoChunks:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration


NO_CHUNKS = _NoChunks()


@dataclass(slots=True, init=False)
class ForwardResponse:
    """A passed-through HTTP answer: status, end-to-end headers (no framing or hop-by-hop ones)
    and a body stream."""

    status: int
    headers: Headers
    body: AsyncIterator[bytes]
    release: Callable[[], Awaitable[None]]
    #: the whole body when it was small enough to read at once (``body`` is then empty)
    content: bytes | bytearray | None
    length: int | None

    def __init__(
        self,
        status: int,
        headers: Headers,
        body: AsyncIterator[bytes],
        release: Callable[[], Awaitable[None]] = no_release,
        content: bytes | bytearray | None = None,
        length: int | None = None,
    ) -> None:
        # (written out: compiled, the dataclass's own __init__ would be interpreted code)
        self.status = status
        self.headers = headers
        self.body = body
        self.release = release
        self.content = content
        self.length = length


@dataclass(slots=True)
class StreamedBody:
    """A request body that is still arriving: ``length`` bytes in ``chunks``."""

    length: int
    chunks: AsyncIterator[bytes]


Body = Buffer | StreamedBody


#: told of a call once it is over: (operation, model, seconds, the failure or None)
Record = Callable[[str, str, float, BaseException | None], None]


class Backend(Protocol):
    """What the pipeline needs from a model server."""

    name: str
    #: whether the backend speaks v2 REST itself, so ``forward`` reaches it
    speaks_rest: bool

    def stream_call(self, decoupled: bool) -> str:
        """How a :meth:`stream_infer` to a model reaches the server, in a log line's words."""
        ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...

    async def server_ready(self) -> bool: ...
    async def server_metadata(self) -> dict[str, Any]: ...
    async def model_metadata(self, model: str, version: str) -> dict[str, Any]: ...
    async def model_config(self, model: str, version: str) -> dict[str, Any]: ...
    async def model_ready(self, model: str, version: str) -> bool: ...

    async def infer(self, request: InferRequest, headers: Headers) -> InferResponse: ...
    def stream_infer(self, request: InferRequest, headers: Headers) -> AsyncIterator[InferResponse]:
        """One or more responses (several for decoupled models)."""
        ...

    async def statistics(self, model: str, version: str, headers: Headers) -> dict[str, Any]:
        """``{"model_stats": [...]}``; every model when ``model`` is ""."""
        ...

    async def repository_index(self, ready: bool, headers: Headers) -> list[dict[str, Any]]: ...
    async def repository_load(
        self, model: str, load: bool, parameters: dict[str, Any], headers: Headers
    ) -> None:
        """Load (``load`` True) or unload a model."""
        ...

    async def trace_settings(
        self, model: str, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]:
        """The trace settings (of one model unless ``model`` is ""), updated first if asked."""
        ...

    async def log_settings(
        self, update: dict[str, Any] | None, headers: Headers
    ) -> dict[str, Any]: ...

    #: whether every JSON /infer body goes to the server transcoded, known at start-up (the
    #: REST quick lane then transcodes it itself)
    transcodes_json: bool

    def relay_facts(self, model: str, version: str) -> RelayFacts:
        """What this backend takes as sent, as known now (asks nothing)."""
        ...

    async def learn_relay_facts(self, model: str, version: str, asked_for: str) -> RelayFacts:
        """:meth:`relay_facts` once what was not known is learnt; errors name ``asked_for``,
        the client's operation."""
        ...

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: Headers
    ) -> ForwardResponse:
        """Send an /infer body unchanged (it may still be arriving; ``ihcl`` None: JSON); the
        answer comes back unchanged once checked."""
        ...

    def time_now(self, record: Record) -> None:
        """Have ``record`` told of every :meth:`relay_now` and :meth:`infer_now` call once it is
        over (the metered backend's timing of the calls that run without a coroutine)."""
        ...

    def relay_now(
        self,
        model: str,
        version: str,
        body: bytes | bytearray,
        headers: Headers,
        done: Callable[[ForwardResponse | ProxyError], None],
        *,
        ihcl: int | None = None,
    ) -> Callable[[], None] | None:
        """:meth:`relay_infer` of a whole body, sent at once without a coroutine: returns the
        call's cancel and gives its outcome (answer or error) to ``done`` later, once. None,
        with nothing sent, when it cannot go at once (then :meth:`relay_infer` it)."""
        ...

    def infer_now(
        self,
        request: InferRequest,
        headers: Headers,
        done: Callable[[InferResponse | ProxyError], None],
    ) -> Callable[[], None] | None:
        """:meth:`infer` of a request no stage applies to, sent at once without a coroutine,
        as :meth:`relay_now` (None: then :meth:`infer` it)."""
        ...

    async def relay_message(
        self, model: str, version: str, message: bytes, headers: Headers, *, streamed: bool = False
    ) -> bytes:
        """Send a checked, serialized ``ModelInferRequest`` unchanged; the serialized answer
        comes back unchanged. ``streamed``: it came on a client's ModelStreamInfer stream."""
        ...

    async def forward(
        self, method: str, target: str, headers: Headers, body: Buffer
    ) -> ForwardResponse:
        """Any other REST request, passed through; ``target`` is origin-form ("/..."). Backends
        that do not speak REST raise NotFound/Unsupported."""
        ...
