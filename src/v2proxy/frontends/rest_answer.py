"""The answers of the REST frontend's handlers, and how one passed through from the backend is
written to the client.

A handler answers an :data:`Answer`: complete, or a
:class:`~v2proxy.core.ports.ForwardResponse` passed through (or a stream of server-sent events
made like one). An answer that breaks off after its head was sent closes the connection: the
client sees a broken answer, never a complete-looking short one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from v2proxy.codecs.json import dumps
from v2proxy.core.admission import RETRY_AFTER_S
from v2proxy.core.errors import Overloaded, ProxyError, UnsupportedEncoding
from v2proxy.core.model import Buffer
from v2proxy.core.ports import ForwardResponse, no_release
from v2proxy.frontends.exchange import Exchange
from v2proxy.http.request import HttpRequest, Request
from v2proxy.http.response import HttpResponse

log = logging.getLogger(__name__)

#: a complete answer: status, headers, body; or one passed through
Answer = tuple[int, list[tuple[bytes, bytes]], Buffer | list[Buffer]] | ForwardResponse
#: (request, path match, exchange: where a handler sets the model it serves) -> answer
Handler = Callable[[HttpRequest, Any, Exchange], Awaitable[Answer]]

JSON: Final = [(b"content-type", b"application/json")]


def json_answer(status: int, obj: Any) -> Answer:
    return status, list(JSON), dumps(obj)


def error_answer(exc: ProxyError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The one translator from the error tree to a v2 REST answer: ``{"error": message}`` with
    the error's status and fields (:func:`error_fields`)."""
    return exc.http_status, [*JSON, *error_fields(exc)], dumps({"error": exc.message})


def error_fields(exc: ProxyError) -> list[tuple[bytes, bytes]]:
    """The header fields an error answer carries whatever the API's shape of its body (415's
    Accept-Encoding, 503's Retry-After)."""
    if isinstance(exc, UnsupportedEncoding):
        return [(b"accept-encoding", b"gzip, deflate")]
    if isinstance(exc, Overloaded):
        return [(b"retry-after", b"%d" % RETRY_AFTER_S)]
    return []


def forwarded_headers(answer: ForwardResponse, rid: bytes | None) -> list[tuple[bytes, bytes]]:
    """The headers of a passed-through answer, with ``x-request-id`` added unless it has one."""
    headers = answer.headers
    if rid is not None and all(k != b"x-request-id" for k, _ in headers):
        return [*headers, (b"x-request-id", rid)]
    return headers


async def write_forwarded(
    request: Request, response: HttpResponse, answer: ForwardResponse, rid: bytes | None
) -> int:
    """Write a backend's answer through: in one piece when it was read whole, else streamed as
    it comes (with its Content-Length when it has one). Returns the body bytes written."""
    headers = forwarded_headers(answer, rid)
    try:
        if answer.content is not None:
            await response.send(answer.status, headers, answer.content)
            return len(answer.content)
        await response.start(answer.status, headers, answer.length)
        sent = 0
        try:
            async for chunk in answer.body:
                await response.write(chunk)
                sent += len(chunk)
        except ProxyError as exc:
            log.warning("answer to %s broke off: %s", request.path, exc.message)
            response.abort()
            return sent
        await response.end()
        return sent
    finally:
        if answer.release is not no_release:
            await answer.release()
