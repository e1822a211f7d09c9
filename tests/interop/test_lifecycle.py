"""SIGTERM while a request is in flight: v2proxy stops accepting and turns not ready, lets the
request finish (its answer complete), closes its backend connections and exits 0; a request
still in flight once --drain-timeout has passed is cut, and recorded as cut by the shutdown."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from peers.launch import _free_ports, _http_status
from standin import StandIn

from v2proxy._proto import grpc_service_pb2, health_pb2
from v2proxy.app import build_grpc_server
from v2proxy.app_core import build_backend, build_pipeline
from v2proxy.ops.config import load_settings

ANSWER = json.dumps(
    {
        "model_name": "simple",
        "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1], "data": [7]}],
    }
).encode()
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
).encode()


class SlowBackend(StandIn):
    """A v2 REST backend whose /infer takes 2 s; ready at once."""

    def do_GET(self) -> None:
        self._send(200, b"{}" if self.path != "/v2" else b'{"name":"slow","extensions":[]}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(2.0)
        self._send(200, ANSWER)


@contextlib.contextmanager
def _proxy_before(
    tmp_path: Path, handler: type[StandIn], *args: str
) -> Iterator[tuple[subprocess.Popen[bytes], int, int, Path]]:
    """v2proxy (ARGS added) in front of a REST backend of ``handler``, ready: yields the
    process, its HTTP and gRPC ports and its log; killed if the test left it running."""
    backend = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    port, grpc_port = _free_ports(2)
    log = tmp_path / "proxy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "v2proxy", "serve",
                "--backend", f"http://127.0.0.1:{backend.server_address[1]}",
                "--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", str(grpc_port),
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while _http_status(f"http://127.0.0.1:{port}/v2/health/ready") != 200:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield proc, port, grpc_port, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        backend.shutdown()
        backend.server_close()


def test_sigterm_drains_a_slow_request_then_exits_0(tmp_path: Path) -> None:
    drain = ("--backend-encoding", "json", "--drain-timeout", "20")
    with _proxy_before(tmp_path, SlowBackend, *drain) as (proc, port, _, log):
        result: dict[str, object] = {}

        def infer() -> None:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v2/models/simple/infer", data=BODY, method="POST"
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                result["status"] = resp.status
                result["body"] = json.loads(resp.read())

        t = threading.Thread(target=infer)
        t.start()
        time.sleep(0.5)  # the request is at the backend now
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # draining: a probe sees the proxy not ready (refused, or not 200)
        assert _http_status(f"http://127.0.0.1:{port}/v2/health/ready") != 200
        assert proc.poll() is None  # still finishing the request in flight
        t.join(30)
        assert result == {"status": 200, "body": json.loads(ANSWER)}
        assert proc.wait(30) == 0, log.read_text()
        assert "draining" in log.read_text()


def _grpc_request() -> grpc_service_pb2.ModelInferRequest:
    """BODY as a ModelInfer request."""
    req = grpc_service_pb2.ModelInferRequest(model_name="simple")
    tensor = req.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    return req


class StuckBackend(SlowBackend):
    """A v2 REST backend whose /infer never answers (within the test)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(8.0)


@pytest.mark.parametrize("wire", ["rest", "grpc"])
def test_a_request_cut_at_shutdown_is_recorded_as_such(tmp_path: Path, wire: str) -> None:
    """Past --drain-timeout the request still in flight is cut: the REST client's connection
    closes (the gRPC client gets UNAVAILABLE), and the request is recorded as cut by the
    shutdown (REST: not a 500 of no cause; gRPC: not a cancellation by the client)."""
    with _proxy_before(tmp_path, StuckBackend, "--drain-timeout", "1") as (
        proc,
        port,
        grpc_port,
        log,
    ):
        failed: list[BaseException] = []

        def infer() -> None:
            try:
                if wire == "grpc":
                    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                        call(_grpc_request().SerializeToString(), timeout=30)
                    return
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v2/models/simple/infer", data=BODY, method="POST"
                )
                with urllib.request.urlopen(req, timeout=30) as resp:
                    resp.read()
            except Exception as exc:  # the connection closed, or UNAVAILABLE
                failed.append(exc)

        t = threading.Thread(target=infer)
        t.start()
        time.sleep(0.5)  # the request is at the backend now
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert proc.wait(30) == 0, log.read_text()
        assert len(failed) == 1
        text = log.read_text()
        line = next(x for x in text.splitlines() if "request failed" in x)
        assert ("status=503" if wire == "rest" else 'status="UNAVAILABLE"') in line, line
        assert 'cause="v2proxy shut down before the answer was complete' in line, line


async def test_readiness_is_false_while_draining() -> None:
    """REST ready, gRPC ServerReady and the gRPC health service all say not ready once the
    pipeline drains (while connections that are open can still ask)."""
    s = load_settings({}, None, env={})
    backend = build_backend(s)
    pipeline = build_pipeline(s, backend)
    server = build_grpc_server(s, pipeline)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
            serving = health_pb2.HealthCheckResponse.SERVING
            assert (await check(health_pb2.HealthCheckRequest())).status == serving
            assert await pipeline.server_ready() is True
            pipeline.draining = True
            assert await pipeline.server_ready() is False
            assert (await check(health_pb2.HealthCheckRequest())).status != serving
            assert await pipeline.server_live() is True  # liveness stays the proxy's own
    finally:
        await server.stop(None)
