"""Stand-in v2 REST backends that a test writes for one behaviour (a slow /infer, one held until
the test lets it go): ``StandIn``, the base of their request handlers (HTTP/1.1 keep-alive, JSON
answers with a Content-Length, no request log on stderr), and ``serving``, which serves one on a
free loopback port from a thread until the block ends."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StandIn(BaseHTTPRequestHandler):
    """A handler answering JSON over keep-alive HTTP/1.1 connections, quietly."""

    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: bytes) -> None:
        """Answer ``status`` with the JSON document ``body``."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, obj: Any) -> None:
        """Answer ``status`` with ``obj`` as a JSON document."""
        self._send(status, json.dumps(obj).encode())

    def log_message(self, *_args: object) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on a free port of 127.0.0.1 until the block ends; yields the base URL
    (``http://127.0.0.1:PORT``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
