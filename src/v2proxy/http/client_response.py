"""An answer of :mod:`v2proxy.http.client` whose head is in: its body read whole or in pieces,
once; its connection goes back to the pool when the body was read to its end.

An answer must be read to its end or closed; a failed or cancelled read closes the connection.
The request's ``call_timeout`` goes on covering the body until :meth:`ClientResponse.stream`
lifts it. An answer that came whole with its head frees its connection at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from v2proxy.http.client_conn import ClientConnection
from v2proxy.http.client_errors import AnswerTooLarge

__all__ = ["ClientResponse", "Pool"]


class Pool(Protocol):
    """Where an answer's connection goes back (:class:`~v2proxy.http.client.HttpClient`)."""

    def _release(self, conn: ClientConnection, keep: bool) -> None:
        """Take ``conn`` back: idle for the next request when ``keep`` and it is fit, else
        closed; its slot is free either way."""


class ClientResponse:
    """An answer whose head is in; its body is read whole or in pieces, once."""

    __slots__ = (
        "_body",
        "_client",
        "_conn",
        "_covered",
        "_timeout",
        "chunked",
        "content_length",
        "headers",
        "keep_alive",
        "reason",
        "status",
        "version",
    )

    def __init__(
        self,
        client: Pool,
        conn: ClientConnection,
        timeout: float | None,
        covered: bool = False,
    ) -> None:
        self.status = conn.status
        self.reason = conn.reason
        self.version = conn.version
        self.headers = conn.headers
        #: 0 for HEAD, 204, 304; None when chunked or read to the connection's end
        self.content_length = conn.content_length
        self.chunked = conn.chunked
        self.keep_alive = conn.keep
        self._client = client
        self._timeout = timeout
        #: the call's deadline is armed and comes before any idle-read timeout
        self._covered = covered
        self._body: bytes | None = None
        self._conn: ClientConnection | None = conn
        if conn.body_done:  # the usual small answer came whole
            self._body = conn.take_all()
            self._conn = None
            client._release(conn, conn.keep)

    def header(self, name: bytes) -> bytes | None:
        """The value of header ``name`` (any case); several are joined with ``, ``."""
        name = name.lower()
        found = [v for n, v in self.headers if n == name]
        if not found:
            return None
        return found[0] if len(found) == 1 else b", ".join(found)

    def stream(self) -> None:
        """Lift the call's deadline: the rest of the body is bounded by ``read_timeout`` between
        its pieces only."""
        self._covered = False
        if self._conn is not None:
            self._conn.set_deadline(None)

    async def read(self, limit: int | None = None) -> bytes | bytearray:
        """The whole body (:class:`AnswerTooLarge` when it is over ``limit`` bytes)."""
        conn = self._conn
        if conn is None:
            body, self._body = self._body or b"", None
            if limit is not None and len(body) > limit:
                raise AnswerTooLarge(limit, len(body))
            return body
        try:
            length = self.content_length
            if limit is not None and length is not None and length > limit:
                raise AnswerTooLarge(limit, length)
            conn.read_whole(limit)
            while not conn.body_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(None if self._covered else self._timeout)
        except BaseException:
            self.close()
            raise
        body = conn.take_all()
        self._conn = None
        self._client._release(conn, conn.keep)
        return body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body in the pieces the transport delivered (no copy)."""
        conn = self._conn
        if conn is None:
            body, self._body = self._body, None
            if body:
                yield body
            return
        try:
            pieces = conn.pieces
            while True:
                if pieces:
                    yield conn.take()
                elif conn.body_done:
                    break
                elif conn.error is not None:
                    raise conn.error
                else:
                    await conn.wait(None if self._covered else self._timeout)
        except BaseException:
            self.close()
            raise
        if self._conn is conn:  # not closed meanwhile (while a piece was out)
            self._conn = None
            self._client._release(conn, conn.keep)

    def close(self) -> None:
        """Give the answer up: an unread body closes its connection."""
        conn = self._conn
        self._body = None
        if conn is not None:
            self._conn = None
            self._client._release(conn, False)
