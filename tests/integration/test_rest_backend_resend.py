"""v2proxy's REST backend when the backend ends a kept-alive connection. An /infer POST is
never sent twice: whether its connection was kept or new, one that ended before any byte of
answer is a 502 naming the backend (the backend may have run the inference). A GET (health,
metadata) whose kept connection ended so is sent once more, on a new connection, counted by
``v2proxy_backend_retries_total``. A 5xx's connection is never reused: uvicorn after a 500
(MLServer, KServe) sends a whole answer, keep-alive by its head, then closes the connection, and
the next request would race that close."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.integration import test_rest_backend
from tests.integration.conftest import Factory, settings
from tests.integration.test_rest_backend import ANSWER, GOOD, RawHandler, post_infer, read_request
from v2proxy.app import build_rest
from v2proxy.app_core import build_backend, build_pipeline
from v2proxy.ops.metrics import BACKEND_RETRIES, Counter
from v2proxy.ops.metrics_export import Metrics

# the loop is what is tested: on uvloop and plain asyncio (tests/conftest.py)
pytestmark = pytest.mark.both_loops

#: test_rest_backend's fixture ``raw_backend``, here named ``backend``: backend(handler) -> the
#: URL of a loopback server running ``handler`` per connection
backend = test_rest_backend.raw_backend
Backend = Callable[[RawHandler], Awaitable[str]]

_ERROR = b'{"error":"ValueError : cannot reshape"}'
_500 = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
_500 += b"Content-Length: %d\r\n\r\n%s" % (len(_ERROR), _ERROR)
_READY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


async def proxy_counting(make_client: Factory, url: str) -> tuple[Any, Counter]:
    """A proxy to ``url`` (JSON to the backend) and its backend's resend counter
    (``v2proxy_backend_retries_total{backend="rest"}``), as the app wires it."""
    s = settings(backend=url, backend_encoding="json")
    metrics = Metrics(CollectorRegistry(), "rest")
    proxy = await make_client(build_rest(s, build_pipeline(s, build_backend(s, metrics))))
    return proxy, metrics.store(BACKEND_RETRIES).child("rest")


@pytest.mark.parametrize("close", ["at-once", "as-the-next-comes"])
async def test_request_after_a_500_and_a_silent_close_is_answered(
    make_client: Factory, backend: Backend, close: str
) -> None:
    """Answers alternate 500, 200; a 200 keeps its connection, a 500 ends it without saying so:
    at once, or when the next request has come on it (uvicorn logs the traceback first: the
    race), which would be dropped. Every POST is answered, sent once: the 500's connection is
    not used again."""
    seen: list[bytes] = []
    accepts = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepts
        accepts += 1
        while True:
            seen.append(await read_request(reader))
            if len(seen) % 2 == 0:
                writer.write(ANSWER)
                await writer.drain()
                continue
            writer.write(_500)
            await writer.drain()
            if close != "at-once":
                await reader.readuntil(b"\r\n\r\n")  # the next request's head: dropped
            return

    proxy, retries = await proxy_counting(make_client, await backend(handler))
    for _ in range(3):
        status, body = await post_infer(proxy, "identity")
        assert status == 500 and "cannot reshape" in json.loads(body)["error"]
        assert await post_infer(proxy, "identity") == (200, GOOD)
    assert len(seen) == 6  # each POST sent once
    assert accepts == 4  # 500 | 200 500 | 200 500 | 200: a 200's connection kept, a 500's not
    assert retries.value == 0


async def test_post_dropped_on_a_kept_connection_is_not_sent_again(
    make_client: Factory, backend: Backend
) -> None:
    """The kept connection ends after the backend read the POST, unanswered: the backend may
    have run it; 502 naming the backend, and the POST is not sent again on a new connection."""
    seen: list[bytes] = []
    accepts = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepts
        accepts += 1
        seen.append(await read_request(reader))
        writer.write(ANSWER)
        await writer.drain()
        seen.append(await read_request(reader))  # the second: read, then dropped

    url = await backend(handler)
    proxy, retries = await proxy_counting(make_client, url)
    assert await post_infer(proxy, "identity") == (200, GOOD)
    status, body = await post_infer(proxy, "identity")
    assert status == 502
    error = json.loads(body)["error"]
    assert url in error and "failed during inference: the connection ended" in error
    await asyncio.sleep(0.05)  # a resend would have reached the backend by now
    assert len(seen) == 2 and seen[0] == seen[1]
    assert accepts == 1 and retries.value == 0


async def test_get_dropped_on_a_kept_connection_is_sent_once_more(
    make_client: Factory, backend: Backend
) -> None:
    """The health check's GET on the connection an /infer left kept, which the backend ends
    unanswered: sent once more on a new connection, and counted."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = not seen
        request = await read_request(reader)
        seen.append(request)
        if first:
            writer.write(ANSWER)
            await writer.drain()
            seen.append(await read_request(reader))  # the GET: read, then dropped
        else:
            writer.write(_READY)
            await writer.drain()
            await asyncio.sleep(30)

    proxy, retries = await proxy_counting(make_client, await backend(handler))
    assert await post_infer(proxy, "identity") == (200, GOOD)
    async with asyncio.timeout(10):
        assert (await proxy.get("/v2/health/ready")).status == 200
    assert [r.split(b" HTTP/", 1)[0] for r in seen] == [
        b"POST /v2/models/simple/infer",
        b"GET /v2/health/ready",
        b"GET /v2/health/ready",
    ]
    assert retries.value == 1


async def test_post_dropped_on_a_new_connection_is_not_sent_again(
    make_client: Factory, backend: Backend
) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))  # read, then dropped unanswered

    proxy, retries = await proxy_counting(make_client, await backend(handler))
    status, body = await post_infer(proxy, "identity")
    assert status == 502
    assert "failed during inference: the connection ended" in json.loads(body)["error"]
    assert len(seen) == 1 and retries.value == 0


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

    proxy, retries = await proxy_counting(make_client, await backend(handler))
    assert await post_infer(proxy, "identity") == (200, GOOD)
    status, body = await post_infer(proxy, "identity")
    assert status == 502
    assert "failed during inference: the connection ended" in json.loads(body)["error"]
    assert len(seen) == 2 and retries.value == 0
