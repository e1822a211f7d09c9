"""v2proxy's REST backend when the backend ends a kept-alive connection: an /infer POST whose
connection ended before any byte of answer is sent once more, on a new connection (its body is
in memory); one sent on a new connection, or one of which part of the answer came, is not
(502). The first case is uvicorn's after a 500 (MLServer, KServe): a whole answer, keep-alive
by its head, then the connection closed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from tests.integration import test_rest_backend
from tests.integration.conftest import Factory, proxy_to
from tests.integration.test_rest_backend import ANSWER, GOOD, RawHandler, post_infer, read_request

#: test_rest_backend's fixture ``raw_backend``, here named ``backend``: backend(handler) -> the
#: URL of a loopback server running ``handler`` per connection
backend = test_rest_backend.raw_backend
Backend = Callable[[RawHandler], Awaitable[str]]

_ERROR = b'{"error":"ValueError : cannot reshape"}'
_500 = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
_500 += b"Content-Length: %d\r\n\r\n%s" % (len(_ERROR), _ERROR)


@pytest.mark.parametrize("close", ["at-once", "as-the-next-comes"])
async def test_request_after_a_500_and_a_silent_close_is_answered(
    make_client: Factory, backend: Backend, close: str
) -> None:
    """Each connection: one request, answered 500 (200 after a 500), then closed: at once, or
    when the next request has come (uvicorn logs the traceback first: the race)."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(_500 if len(seen) % 2 else ANSWER)
        await writer.drain()
        if close != "at-once":
            await reader.readuntil(b"\r\n\r\n")  # the next request's head: dropped

    proxy = await proxy_to(make_client, await backend(handler), backend_encoding="json")
    for _ in range(3):
        status, body = await post_infer(proxy, "identity")
        assert status == 500 and "cannot reshape" in json.loads(body)["error"]
        assert await post_infer(proxy, "identity") == (200, GOOD)
    assert len(seen) == 6


async def test_post_dropped_on_a_kept_connection_is_sent_once_more(
    make_client: Factory, backend: Backend
) -> None:
    """The kept connection ends after the backend read the POST, unanswered: sent once more,
    on a new connection, the same bytes."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = not seen
        seen.append(await read_request(reader))
        writer.write(ANSWER)
        await writer.drain()
        if first:
            seen.append(await read_request(reader))  # the second: read, then dropped
        else:
            await asyncio.sleep(30)

    proxy = await proxy_to(make_client, await backend(handler), backend_encoding="json")
    assert await post_infer(proxy, "identity") == (200, GOOD)
    assert await post_infer(proxy, "identity") == (200, GOOD)
    assert len(seen) == 3 and seen[1] == seen[2]


async def test_post_dropped_on_a_new_connection_is_not_sent_again(
    make_client: Factory, backend: Backend
) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))  # read, then dropped unanswered

    proxy = await proxy_to(make_client, await backend(handler), backend_encoding="json")
    status, body = await post_infer(proxy, "identity")
    assert status == 502
    assert "failed during inference: the connection ended" in json.loads(body)["error"]
    assert len(seen) == 1


async def test_post_whose_answer_had_begun_is_not_sent_again(
    make_client: Factory, backend: Backend
) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(ANSWER)
        await writer.drain()
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Ty")  # then closed
        await writer.drain()
        await asyncio.sleep(0.05)

    proxy = await proxy_to(make_client, await backend(handler), backend_encoding="json")
    assert await post_infer(proxy, "identity") == (200, GOOD)
    status, body = await post_infer(proxy, "identity")
    assert status == 502
    assert "failed during inference: the connection ended" in json.loads(body)["error"]
    assert len(seen) == 2
