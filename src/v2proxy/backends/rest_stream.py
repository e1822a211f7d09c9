"""Deadlines for the REST backend's answers and bodies that pass through in pieces."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from v2proxy.backends.rest_answers import mapped
from v2proxy.core.ports import ForwardResponse, Headers, StreamedBody
from v2proxy.http.client_response import ClientResponse


def streamed(
    resp: ClientResponse,
    base_url: str,
    timeout: float,
    what: str,
    headers: Headers,
    deadline: float | None = None,
) -> ForwardResponse:
    """``resp`` passed on as it comes (``deadline`` in ``loop.time()``); released by closing
    it."""
    resp.stream()

    async def body() -> AsyncIterator[bytes]:
        with mapped(base_url, timeout, what):
            if deadline is None:
                async for chunk in resp.iter_chunks():
                    yield chunk
                return
            loop = asyncio.get_running_loop()
            left = deadline - loop.time()
            chunks = aiter(resp.iter_chunks())
            while True:
                began = loop.time()
                try:
                    async with asyncio.timeout(left):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                left -= loop.time() - began
                yield chunk

    async def release() -> None:
        resp.close()

    return ForwardResponse(resp.status, headers, body(), release, length=resp.content_length)


async def then_arm(
    body: StreamedBody, deadline: asyncio.Timeout, budget: float
) -> AsyncIterator[bytes]:
    """The chunks of ``body``, with ``deadline`` off while the next one is awaited from the
    client and on while the backend takes one; at the end it is left armed with what remains
    of ``budget`` (seconds, --backend-timeout) for the answer."""
    loop = asyncio.get_running_loop()
    chunks = aiter(body.chunks)
    left = budget
    while True:
        deadline.reschedule(None)
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        began = loop.time()
        deadline.reschedule(began + left)
        yield chunk
        left -= loop.time() - began
    deadline.reschedule(loop.time() + left)
