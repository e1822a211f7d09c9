"""``v2proxy`` as a user starts it: real processes, their exit status and the lines they print.

The first test runs the documented two-command trial with every default: ``v2proxy
reference-server`` (HTTP 8000, gRPC 8001, like Triton) and ``v2proxy serve --backend
http://127.0.0.1:8000`` (9000, 9001) side by side. It skips, naming the port, when one of those
ports is held by another program (someone's ``make run``); no other test listens on them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

DEFAULT_PORTS = (8000, 8001, 9000, 9001)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def v2proxy(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """``python -m v2proxy ARGS`` running (stderr captured); stopped with SIGTERM at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "v2proxy", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def wait_ready(port: int, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Until GET /v2/health/ready on ``port`` answers 200 (fails if ``proc`` exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2):
                return
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise AssertionError(f"nothing ready on port {port} after {timeout} s")


def infer_simple(port: int) -> dict[str, object]:
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        ]
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/simple/infer", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        result: dict[str, object] = json.loads(answer.read())
    return result


def test_reference_server_and_serve_with_their_defaults_side_by_side() -> None:
    taken = [p for p in DEFAULT_PORTS if not _port_free(p)]
    if taken:
        pytest.skip(
            f"ports {taken} are held by another program; this test needs 8000-8001, 9000-9001"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("V2PROXY_")}
    with v2proxy("reference-server", env=env) as ref:
        wait_ready(8000, ref)
        with v2proxy("serve", "--backend", "http://127.0.0.1:8000", env=env) as proxy:
            wait_ready(9000, proxy)
            answer = infer_simple(9000)
            outputs = {o["name"]: o["data"] for o in answer["outputs"]}  # type: ignore[attr-defined]
            assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]
            assert outputs["OUTPUT1"] == [i - 1 for i in range(16)]
            with socket.create_connection(("127.0.0.1", 9001), timeout=5):
                pass  # serve's gRPC port is listening too
            with socket.create_connection(("127.0.0.1", 8001), timeout=5):
                pass  # and the reference server's
        assert proxy.returncode == 0
