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
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.doc_blocks import block

PAGE = "docs/guides/local-backend.md"
TROUBLESHOOTING = "docs/troubleshooting.md"

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
def v2proxy(
    *args: str, env: dict[str, str] | None = None, log: list[str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``python -m v2proxy ARGS`` running; stopped with SIGTERM at the end, its stderr then
    added to ``log``."""
    if env is None:  # none of the caller's settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("V2PROXY_")}
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
            if log is not None:
                log.append(proc.stderr.read())
            proc.stderr.close()


def wait_ready(
    port: int, proc: subprocess.Popen[str], timeout: float = 60.0, what: str = "ready"
) -> None:
    """Until GET /v2/health/WHAT on ``port`` answers 200 (fails if ``proc`` exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/{what}", timeout=2):
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


def _documented(name: str) -> list[str]:
    """The one ``v2proxy ...`` command of the local-backend page's block ``name``, as args."""
    code = block(PAGE, name).split("#", 1)[0]
    words = shlex.split(code)
    assert words[0] == "v2proxy", code
    return words[1:]


def _curl(name: str) -> str:
    """What the page's curl block ``name`` prints."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", block(PAGE, name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reference_server_and_serve_with_their_defaults_side_by_side() -> None:
    """docs/guides/local-backend.md's commands as they are written: ``v2proxy reference-server``
    and ``v2proxy serve --backend http://127.0.0.1:8000`` (then ``grpc://127.0.0.1:8001``), and
    the page's curl through them answers what the page shows."""
    taken = [p for p in DEFAULT_PORTS if not _port_free(p)]
    if taken:
        pytest.skip(
            f"ports {taken} are held by another program; this test needs 8000-8001, 9000-9001"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("V2PROXY_")}
    expected = block(PAGE, "ref-infer", output=True)
    with v2proxy(*_documented("ref-server"), env=env) as ref:
        wait_ready(8000, ref)
        for serve in ("ref-serve", "ref-serve-grpc"):
            with v2proxy(*_documented(serve), env=env) as proxy:
                wait_ready(9000, proxy)
                assert _curl("ref-infer").rstrip("\n") == expected
                answer = infer_simple(9000)
                outputs = {o["name"]: o["data"] for o in answer["outputs"]}  # type: ignore[attr-defined]
                assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]
                with socket.create_connection(("127.0.0.1", 9001), timeout=5):
                    pass  # serve's gRPC port is listening too
            assert proxy.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.contextmanager
def _held_port() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("V2PROXY_")}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env=clean | (env or {}),
    )


@pytest.mark.parametrize(
    ("command", "option", "workers"),
    [
        ("serve", "--grpc-port", "1"),
        ("serve", "--http-port", "1"),
        ("serve", "--grpc-port", "2"),
        ("serve", "--http-port", "2"),
        ("reference-server", "--grpc-port", "1"),
    ],
)
def test_a_taken_port_stops_the_start_with_one_line_naming_its_option(
    command: str, option: str, workers: str
) -> None:
    with _held_port() as taken:
        ports = {"--http-port": str(_free_port()), "--grpc-port": str(_free_port())}
        ports[option] = str(taken)
        args = [f"{k}={v}" for k, v in ports.items()]
        if command == "serve":
            args.append(f"--workers={workers}")
        proc = _run("-m", "v2proxy", command, "--host=127.0.0.1", *args)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # grpcio's own E... add_port.cc line kept off stderr
    what = "gRPC" if option == "--grpc-port" else "HTTP"
    names = (
        option
        if command == "reference-server"
        else f"{option} / V2PROXY_{option[2:].replace('-', '_').upper()}"
    )
    assert lines[0].endswith(
        f"ERROR v2proxy[{lines[0].split('[')[1].split(']')[0]}]: cannot listen for {what} on"
        f" 127.0.0.1:{taken}: address already in use; another program holds the port: stop it,"
        f" or choose another port with {names}"
    ), lines[0]
    if (command, option) == ("serve", "--grpc-port"):  # as docs/troubleshooting.md quotes it
        quoted = block(TROUBLESHOOTING, "msg-port-taken", output=True)
        assert lines[0].endswith(": " + quoted.replace("0.0.0.0:9001", f"127.0.0.1:{taken}"))


_WORKER_FAILS = """
import sys
from v2proxy import app
from v2proxy.ops.config import load_settings

def fails(*args, **kwargs):
    raise SystemExit(1)  # what a worker that cannot listen does

app._run_one = fails
app.run(load_settings({"workers": "2", "http_port": sys.argv[1], "grpc_port": sys.argv[2]}, None))
"""


def test_a_worker_that_cannot_start_makes_the_whole_process_exit_non_zero() -> None:
    """Past the ports' check (a port taken in between, a TLS file changed): the supervisor stops
    the other workers and exits 1 (it exited 0)."""
    proc = _run("-c", _WORKER_FAILS, str(_free_port()), str(_free_port()))
    assert proc.returncode == 1, proc.stderr
    assert "a worker could not start: stopping the others" in proc.stderr


def test_an_http_backend_url_at_a_grpc_port_is_named_as_such() -> None:
    """``--backend http://HOST:8001`` (a gRPC port): the start-up warning and each 502 say so."""
    ref_http, ref_grpc, http, grpc = (_free_port() for _ in range(4))
    ref_args = ("reference-server", "--host=127.0.0.1", f"--http-port={ref_http}")
    with v2proxy(*ref_args, f"--grpc-port={ref_grpc}") as ref:
        wait_ready(ref_http, ref)
        backend = f"http://127.0.0.1:{ref_grpc}"
        args = ("serve", "--host=127.0.0.1", f"--http-port={http}", f"--grpc-port={grpc}")
        log: list[str] = []
        with v2proxy(*args, f"--backend={backend}", log=log):
            hint = f"this port speaks gRPC: use grpc://127.0.0.1:{ref_grpc}"
            deadline = time.monotonic() + 30
            with pytest.raises(urllib.error.HTTPError) as answer:
                while time.monotonic() < deadline:
                    try:
                        infer_simple(http)
                    except urllib.error.URLError as exc:
                        if isinstance(exc, urllib.error.HTTPError):
                            raise
                        time.sleep(0.2)
            assert answer.value.code == 502
            body = answer.value.read().decode()
            error = json.loads(body)["error"]
            assert error.endswith(f"the server sent HTTP/2 frames: {hint}"), error
            quoted = block(TROUBLESHOOTING, "msg-grpc-port", output=True)
            assert f"502 {body}" == quoted.replace("127.0.0.1:8001", f"127.0.0.1:{ref_grpc}")
    lines = log[0].splitlines()
    start_up = [line for line in lines if "backend unreachable at start-up" in line]
    assert len(start_up) == 1 and hint in start_up[0], log
