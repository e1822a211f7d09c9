"""A connection whose answer completed while reading was paused (its last piece crossed the
high-water mark before anyone read it) reads again once the answer is taken, before it goes back
to the pool: it once went back paused, and the next request on it waited for an answer it never
read (found in front of Triton with 1.3 MB JSON answers: a 504 after --backend-timeout)."""

from __future__ import annotations

import asyncio

from v2proxy.http.client_conn import _HIGH_WATER, ClientConnection


class FakeTransport:
    """Records flow control calls."""

    def __init__(self) -> None:
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default  # no socket to look at


async def test_answer_completed_while_paused_resumes_reading_when_taken() -> None:
    conn = ClientConnection(asyncio.get_running_loop(), 65536)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.begin(False)
    size = _HIGH_WATER + 200_000
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
    conn.data_received(b"x" * (_HIGH_WATER - 1000))  # under the mark: still reading
    assert transport.reading
    conn.data_received(b"x" * (size - _HIGH_WATER + 1000))  # crosses it and completes
    assert conn.body_done and not transport.reading
    assert conn.take_all() == b"x" * size
    assert transport.reading  # ready to carry the next exchange
