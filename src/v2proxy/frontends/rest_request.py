"""What the REST frontend's handlers read of a request: its body, whole and bounded by
``--max-body-size``, or by ``--max-input-size`` too for a route whose body is its input
(:class:`BodyReader`), its end-to-end headers as the client sent them
(:func:`headers_of`) and the client's address (:func:`peer_of`)."""

from __future__ import annotations

from v2proxy.core.errors import BodyTooLarge
from v2proxy.core.headers import PASSED, forwarded
from v2proxy.core.ports import Headers
from v2proxy.http import request as http
from v2proxy.http.request import Request


def peer_of(r: Request) -> str | None:
    """The client's IP address for ``--client-shm`` (None: a unix socket)."""
    client = r.client
    return None if client is None else str(client[0])


def headers_of(request: Request, dropped: frozenset[bytes] = PASSED) -> Headers:
    """The request's headers that go on, as the bytes the client sent (filtered once, by the
    one table: :mod:`v2proxy.core.headers`; ``dropped``: :data:`~v2proxy.core.headers.WRITTEN`
    for a request whose body v2proxy writes)."""
    return forwarded(request.headers, dropped)


class BodyReader:
    """Reads request bodies whole, bounded by ``--max-body-size`` (or ``--max-input-size``), and
    keeps the size of each chunked one until the frontend takes it."""

    __slots__ = ("_chunked_sizes", "max_body_size", "max_input_size")

    def __init__(self, max_body_size: int, max_input_size: int | None = None) -> None:
        self.max_body_size = max_body_size
        #: the bound of :meth:`read_input` (None: --max-body-size alone)
        self.max_input_size = max_body_size if max_input_size is None else max_input_size
        #: body sizes of chunked requests, read by read, taken by taken
        self._chunked_sizes: dict[Request, int] = {}

    async def read(self, request: Request) -> bytearray:
        """The whole request body, bounded by --max-body-size."""
        return await self._read(request, self.max_body_size, "body size", "--max-body-size")

    async def read_input(self, request: Request) -> bytearray:
        """The whole request body, bounded by --max-input-size (and --max-body-size): refused
        as it arrives, before any of it is parsed."""
        if self.max_input_size >= self.max_body_size:
            return await self.read(request)
        limit = self.max_input_size
        return await self._read(request, limit, "input size", "--max-input-size")

    async def _read(self, request: Request, limit: int, what: str, option: str) -> bytearray:
        try:
            body = await request.read(limit)
        except http.BodyTooLarge:
            raise BodyTooLarge(
                f"request body exceeds the maximum {what} of {limit} bytes ({option})"
            ) from None
        if request.chunked:
            self._chunked_sizes[request] = len(body)
        return body

    def taken(self, request: Request) -> int:
        """The size of the chunked ``request``'s body, forgotten here (0: never read)."""
        return self._chunked_sizes.pop(request, 0)
