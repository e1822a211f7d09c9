"""docs/troubleshooting.md quotes v2proxy's messages exactly: each marked message block is what
a running v2proxy prints or answers in that case (addresses, ports and the limits the page names
put back). The taken port and the gRPC port behind an http:// URL are checked in
test_cli_start.py."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.doc_blocks import block
from tests.integration.test_cli_start import _free_port, v2proxy, wait_ready
from v2proxy.core.errors import Forbidden
from v2proxy.core.stages.shm import check_client

PAGE = "docs/troubleshooting.md"


def shown(name: str, **replace: str) -> str:
    text = block(PAGE, name, output=True)
    for old, new in replace.items():
        text = text.replace(old.replace("_", ":"), new)
    return text


def answer(port: int, path: str, body: bytes) -> str:
    """``STATUS BODY`` of a POST, as the page writes an answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", body, timeout=30) as got:
            return f"{got.status} {got.read().decode()}"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.read().decode()}"


@contextlib.contextmanager
def silent_backend() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            server.settimeout(0.2)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    held.append(server.accept()[0])

        thread = threading.Thread(target=accept)
        thread.start()
        try:
            yield server.getsockname()[1]
        finally:
            stop.set()
            thread.join()
            for conn in held:
                conn.close()


def _log_line(log: str, words: str) -> str:
    """The log line holding ``words``, its time and pid dropped as the page does."""
    lines = [line for line in log.splitlines() if words in line]
    assert len(lines) == 1, log
    return re.sub(r"^\S+ \S+ (\w+) ([\w.]+)\[\d+\]:", r"\1 \2:", lines[0])


INFER = "/v2/models/simple/infer"


def test_unreachable_unavailable_restricted_and_too_large() -> None:
    dead, http, grpc = _free_port(), _free_port(), _free_port()
    backend = f"http://127.0.0.1:{dead}"
    log: list[str] = []
    args = ["serve", "--host=127.0.0.1", f"--http-port={http}", f"--grpc-port={grpc}"]
    with v2proxy(*args, f"--backend={backend}", "--max-body-size=1000", log=log) as proc:
        wait_ready(http, proc, what="live")  # never ready: its backend is not
        there = {"127.0.0.1_8000": f"127.0.0.1:{dead}"}
        assert answer(http, INFER, b'{"inputs":[]}') == shown("msg-unavailable", **there)
        assert answer(http, "/v2/repository/index", b"") == shown("msg-restricted")
        assert answer(http, INFER, b"0" * 2000) == shown("msg-too-large")
    assert _log_line(log[0], "backend unreachable at start-up") == shown("msg-unreachable", **there)


def test_timeout() -> None:
    http, grpc = _free_port(), _free_port()
    with silent_backend() as port:
        args = ["serve", "--host=127.0.0.1", f"--http-port={http}", f"--grpc-port={grpc}"]
        with v2proxy(*args, f"--backend=http://127.0.0.1:{port}", "--backend-timeout=1") as proc:
            wait_ready(http, proc, what="live")
            got = answer(http, INFER, b'{"inputs":[]}')
    page = shown("msg-timeout", **{"127.0.0.1_8000": f"127.0.0.1:{port}"})
    assert got == page.replace("--backend-timeout 60 s", "--backend-timeout 1 s")


def test_shared_memory_from_another_host() -> None:
    with pytest.raises(Forbidden) as refused:
        check_client("local", "10.1.2.3")
    status, body = shown("msg-shm-remote").split(" ", 1)
    assert int(status) == refused.value.http_status
    assert json.loads(body) == {"error": refused.value.message}
