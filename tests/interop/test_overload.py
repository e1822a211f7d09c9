"""Overload protection through ``v2proxy serve`` with real clients (tritonclient HTTP and gRPC):

- ``--max-concurrency N``: with N requests held by a backend that answers only when the test
  lets it, exactly the next one is refused (503 + ``Retry-After`` and ``{"error"}`` naming the
  limit and the option; gRPC RESOURCE_EXHAUSTED), REST and gRPC counting against one limit;
  health, metadata and ``/metrics`` keep answering; the refusals are counted; once the held
  requests are answered, N at once are accepted again. An open ModelStreamInfer stream holds one
  slot until it is closed. With ``--workers`` the limit is per worker.
- ``--max-tensors``: a request naming more inputs or outputs is 400 / INVALID_ARGUMENT naming the
  limit, on both protocols.
- Fairness: while one client uploads a huge body slowly (or several clients send large bodies
  over and over), other clients' small requests keep being answered; the slow upload is checked
  to be still in flight when they are done, and is answered in full afterwards.

No timing is asserted beyond clients' own timeouts of a few seconds.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from procs import Proc, v2proxy, wait_listening
from simple_io import IN0, IN1, grpc_inputs, http_inputs
from standin import StandIn, serving
from tritonclient.utils import InferenceServerException

#: a few seconds: what "answered" means here (never a speed assertion)
ANSWER_S = 10.0


class _Gate:
    """What the held backend shares with the test: arrivals, and the release."""

    def __init__(self) -> None:
        self.arrived = 0
        self.cond = threading.Condition()
        self.release = threading.Event()

    def wait_arrivals(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.arrived >= n, timeout=ANSWER_S), self.arrived


def _held_backend(gate: _Gate) -> type[StandIn]:
    class Held(StandIn):
        """A v2 REST backend whose /infer of ``simple`` answers (OUTPUT0 = sum, OUTPUT1 =
        difference, JSON) only once the test releases it."""

        def do_GET(self) -> None:
            if self.path == "/v2":
                self._send_json(200, {"name": "held", "version": "1", "extensions": []})
            elif self.path == "/v2/models/simple/config":
                self._send_json(200, {"name": "simple", "max_batch_size": 8})
            elif self.path.startswith("/v2/models/simple"):
                self._send_json(
                    200, {"name": "simple", "platform": "held", "inputs": [], "outputs": []}
                )
            else:
                self._send_json(200, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = {i["name"]: i["data"] for i in body["inputs"]}
            with gate.cond:
                gate.arrived += 1
                gate.cond.notify_all()
            gate.release.wait(60)
            a, b = data["INPUT0"], data["INPUT1"]
            outputs = [
                {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16],
                 "data": [x + y for x, y in zip(a, b, strict=True)]},
                {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16],
                 "data": [x - y for x, y in zip(a, b, strict=True)]},
            ]  # fmt: skip
            self._send_json(200, {"model_name": "simple", "outputs": outputs})

    return Held


@pytest.fixture
def held() -> Iterator[tuple[_Gate, str]]:
    gate = _Gate()
    with serving(_held_backend(gate)) as url:
        try:
            yield gate, url
        finally:
            gate.release.set()  # before the server shuts down: it waits for held requests


def _http(p: Proc) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(p.url, connection_timeout=ANSWER_S,
                                            network_timeout=60)  # fmt: skip


def _http_infer(p: Proc, *args: Any, **kwargs: Any) -> httpclient.InferResult:
    """One request on a client of its own, closed before returning: a client left to the
    garbage collector leaves its socket to it too (a ResourceWarning in whichever test is
    running when it is collected)."""
    with _http(p) as c:
        return c.infer(*args, **kwargs)


def _http_sum(p: Proc) -> list[int]:
    out = _http_infer(p, "simple", http_inputs()).as_numpy("OUTPUT0")
    assert out is not None
    return [int(x) for x in out.reshape(-1)]


def _grpc_sum(p: Proc) -> list[int]:
    with grpcclient.InferenceServerClient(p.grpc_url) as c:
        out = c.infer("simple", grpc_inputs(), client_timeout=60).as_numpy("OUTPUT0")
    assert out is not None
    return [int(x) for x in out.reshape(-1)]


SUM = (IN0 + IN1).reshape(-1).tolist()
#: simple's request with its data flattened, as tritonclient sends it (the held backend adds lists)
JSON_BODY = json.dumps(
    {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": d.reshape(-1).tolist()}
            for n, d in (("INPUT0", IN0), ("INPUT1", IN1))
        ]
    }
).encode()
LIMIT_TEXT = (
    "too many requests in progress: v2proxy serves at most 3 at once (--max-concurrency);"
    " retry after 1 s"
)


def _raw(
    p: Proc, method: str, path: str, body: bytes = b"", timeout: float = ANSWER_S
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _rejected(p: Proc) -> dict[str, float]:
    status, _, text = _raw(p, "GET", "/metrics")
    assert status == 200
    found = re.findall(
        r'^v2proxy_requests_rejected_total\{frontend="(\w+)",reason="max_concurrency"\} (\S+)$',
        text.decode(),
        re.M,
    )
    return {fe: float(v) for fe, v in found}


def _overloaded(exposition: str) -> dict[tuple[str, str], float]:
    """(frontend, operation) -> requests answered with the error kind ``overloaded``."""
    found: dict[tuple[str, str], float] = {}
    for labels, value in re.findall(
        r"^v2proxy_request_errors_total\{([^}]*)\} (\S+)$", exposition, re.M
    ):
        kv = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if kv["error"] == "overloaded":
            found[(kv["frontend"], kv["operation"])] = float(value)
    return found


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_the_request_beyond_max_concurrency_is_refused_and_probes_keep_answering(
    held: tuple[_Gate, str], loop: str
) -> None:
    gate, url = held
    args = ("serve", "--backend", url, "--backend-encoding", "json", "--max-concurrency", "3")
    with v2proxy(*args, "--event-loop", loop, name="overload") as p, ThreadPoolExecutor(8) as pool:
        try:
            # 3 requests held by the backend: two REST, one gRPC (one limit for both)
            running = [
                pool.submit(_http_sum, p),
                pool.submit(_grpc_sum, p),
                pool.submit(_http_sum, p),
            ]
            gate.wait_arrivals(3)

            # the 4th, REST: refused at once with 503, Retry-After and the limit named
            status, headers, answer = _raw(p, "POST", "/v2/models/simple/infer", JSON_BODY)
            assert (status, headers.get("retry-after")) == (503, "1")
            assert json.loads(answer) == {"error": LIMIT_TEXT}
            with pytest.raises(InferenceServerException) as err:
                _http_infer(p, "simple", http_inputs())
            assert (err.value.status(), err.value.message()) == ("503", LIMIT_TEXT)
            # ... and over gRPC: RESOURCE_EXHAUSTED, unary and stream alike
            with grpcclient.InferenceServerClient(p.grpc_url) as c:
                with pytest.raises(InferenceServerException) as err:
                    c.infer("simple", grpc_inputs(), client_timeout=ANSWER_S)
                assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
                assert err.value.message() == LIMIT_TEXT
                results: queue.Queue[Any] = queue.Queue()
                c.start_stream(callback=lambda result, error: results.put(error or result))
                # the stream is refused when it opens: maybe before the request is sent
                with contextlib.suppress(InferenceServerException):
                    c.async_stream_infer("simple", grpc_inputs())
                error = results.get(timeout=ANSWER_S)
                c.stop_stream()
                assert isinstance(error, InferenceServerException)
                assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"

                # probes and monitoring never wait for a slot
                assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("simple")
                assert c.get_server_metadata().name == "held"
                assert c.get_model_metadata("simple").name == "simple"
            with _http(p) as h:
                assert h.is_server_live() and h.is_server_ready()
                assert h.is_model_ready("simple")
                assert h.get_server_metadata()["name"] == "held"
                assert h.get_model_metadata("simple")["name"] == "simple"
                assert h.get_model_config("simple") == {"name": "simple", "max_batch_size": 8}
            # (the OpenAI routes' frontend has its series too, from the start)
            assert _rejected(p) == {"rest": 2.0, "grpc": 2.0, "openai": 0.0}

            # the held requests are answered in full; then 3 at once are accepted again
            gate.release.set()
            assert [f.result(timeout=ANSWER_S) for f in running] == [SUM] * 3
            again = [
                pool.submit(_http_sum, p),
                pool.submit(_grpc_sum, p),
                pool.submit(_http_sum, p),
            ]
            assert [f.result(timeout=ANSWER_S) for f in again] == [SUM] * 3
            assert _rejected(p) == {"rest": 2.0, "grpc": 2.0, "openai": 0.0}
            status, _, text = _raw(p, "GET", "/metrics")
            # the refusals are in the request metrics too, as errors of kind overloaded
            assert _overloaded(text.decode()) == {
                ("rest", "infer"): 2.0,
                ("grpc", "infer"): 1.0,
                ("grpc", "stream_infer"): 1.0,
            }
        finally:
            gate.release.set()


def test_an_open_stream_holds_one_slot_until_it_is_closed() -> None:
    with v2proxy("serve", "--max-concurrency", "1", name="overload-stream") as p:
        with grpcclient.InferenceServerClient(p.grpc_url) as c:
            results: queue.Queue[Any] = queue.Queue()
            c.start_stream(callback=lambda result, error: results.put(error or result))
            for _ in range(3):  # several requests on the one stream: one slot
                c.async_stream_infer("simple", grpc_inputs())
                result = results.get(timeout=ANSWER_S)
                assert not isinstance(result, InferenceServerException), result
                assert result.as_numpy("OUTPUT0").reshape(-1).tolist() == SUM
            # the stream is idle but open: the one slot is taken
            with pytest.raises(InferenceServerException) as err:
                _http_infer(p, "simple", http_inputs())
            assert err.value.status() == "503"
            with pytest.raises(InferenceServerException) as err:
                c.infer("simple", grpc_inputs(), client_timeout=ANSWER_S)
            assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            c.stop_stream()
        # closed: the slot is free again (the stream's end reaches the proxy shortly after)
        deadline = time.monotonic() + ANSWER_S
        while True:
            try:
                assert _http_sum(p) == SUM
                break
            except InferenceServerException as exc:
                assert exc.status() == "503" and time.monotonic() < deadline
                time.sleep(0.05)
        assert _grpc_sum(p) == SUM


def _notify(gate: _Gate) -> None:
    with gate.cond:
        gate.cond.notify_all()


def test_max_concurrency_is_per_worker(held: tuple[_Gate, str]) -> None:
    """With ``--workers 2 --max-concurrency 1`` each worker holds one request: requests on new
    connections land on either worker until both hold one (a refusal before that came from the
    worker already full), then every further one is refused; the refusals are summed over the
    workers on /metrics; once released, the held requests are answered in full."""
    gate, url = held
    args = ("serve", "--backend", url, "--backend-encoding", "json", "--max-concurrency", "1")
    with (
        v2proxy(*args, "--workers", "2", name="overload-workers") as p,
        ThreadPoolExecutor(8) as pool,
    ):
        wait_listening(p.port, 2)  # a worker still starting gets no connection yet
        try:
            running, refused = [], 0
            for _ in range(40):  # a new connection each: the kernel spreads them over workers
                before = gate.arrived
                attempt = pool.submit(_raw, p, "POST", "/v2/models/simple/infer", JSON_BODY, 60)
                attempt.add_done_callback(lambda _f: _notify(gate))  # a refusal wakes the wait
                with gate.cond:
                    gate.cond.wait_for(
                        lambda f=attempt, n=before: gate.arrived > n or f.done(),
                        timeout=ANSWER_S,
                    )
                if attempt.done():
                    status, headers, answer = attempt.result()
                    assert (status, headers.get("retry-after")) == (503, "1"), answer
                    assert json.loads(answer)["error"].startswith(
                        "too many requests in progress: v2proxy serves at most 1 at once"
                    )
                    refused += 1
                else:
                    running.append(attempt)
                if gate.arrived == 2:
                    break
            assert gate.arrived == 2 and len(running) == 2, (gate.arrived, refused)
            # both workers full: whichever takes the connection refuses it
            for _ in range(6):
                status, _, _ = _raw(p, "POST", "/v2/models/simple/infer", JSON_BODY)
                assert status == 503
                refused += 1
            assert _raw(p, "GET", "/v2/health/ready")[0] == 200
            deadline = time.monotonic() + ANSWER_S  # workers publish their metrics every second
            while _rejected(p).get("rest") != refused:
                assert time.monotonic() < deadline, (_rejected(p), refused)
                time.sleep(0.2)
            gate.release.set()
            for f in running:
                status, _, answer = f.result(timeout=ANSWER_S)
                assert status == 200
                outputs = {o["name"]: o["data"] for o in json.loads(answer)["outputs"]}
                assert outputs["OUTPUT0"] == SUM
            assert _http_sum(p) == SUM
        finally:
            gate.release.set()


def test_too_many_inputs_or_outputs_are_refused_on_both_protocols() -> None:
    with v2proxy("serve", "--max-tensors", "4", name="overload-tensors") as p:
        extra = [httpclient.InferInput(f"X{i}", [1], "INT32") for i in range(3)]
        for t in extra:
            t.set_data_from_numpy(np.zeros(1, np.int32), binary_data=False)
        with pytest.raises(InferenceServerException) as err:
            _http_infer(p, "simple", http_inputs() + extra)
        assert err.value.status() == "400"
        assert err.value.message() == (
            "the request names 5 inputs, more than the maximum of 4 per request. Use"
            " --max-tensors to increase the limit."
        )
        outputs = [httpclient.InferRequestedOutput(f"O{i}") for i in range(5)]
        with pytest.raises(InferenceServerException) as err:
            _http_infer(p, "simple", http_inputs(), outputs=outputs)
        assert err.value.status() == "400" and "names 5 outputs" in err.value.message()
        with grpcclient.InferenceServerClient(p.grpc_url) as c:
            gextra = [grpcclient.InferInput(f"X{i}", [1], "INT32") for i in range(3)]
            for t in gextra:
                t.set_data_from_numpy(np.zeros(1, np.int32))
            with pytest.raises(InferenceServerException) as err:
                c.infer("simple", grpc_inputs() + gextra)
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "names 5 inputs, more than the maximum of 4" in err.value.message()
            gouts = [grpcclient.InferRequestedOutput(f"O{i}") for i in range(5)]
            with pytest.raises(InferenceServerException) as err:
                c.infer("simple", grpc_inputs(), outputs=gouts)
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "names 5 outputs" in err.value.message()
            # within the limit everything is as usual
            assert _grpc_sum(p) == SUM
        assert _http_sum(p) == SUM


# ---------------------------------------------------------------------- fairness

BIG = 48 * 1024 * 1024  # bytes of FP32 data in the slow upload


def _slow_upload_head(p: Proc) -> tuple[socket.socket, bytes]:
    """A binary identity_fp32 request of BIG bytes: its head, JSON header and first MiB sent."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [BIG // 4],
                                     "parameters": {"binary_data_size": BIG}}],
                         "outputs": [{"name": "OUTPUT0",
                                      "parameters": {"binary_data": True}}]}).encode()  # fmt: skip
    sock = socket.create_connection(("127.0.0.1", p.port), timeout=ANSWER_S)
    head = (
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (len(header), len(header) + BIG)
    )
    sock.sendall(head + header)
    return sock, header


def test_small_requests_are_served_while_one_client_uploads_a_huge_body_slowly() -> None:
    with v2proxy("serve", name="overload-slow") as p:
        sock, _ = _slow_upload_head(p)
        data = np.arange(BIG // 4, dtype="<f4").tobytes()
        sent = 0
        stop = threading.Event()

        def trickle(until: int) -> None:
            nonlocal sent
            while sent < until and not stop.is_set():
                piece = data[sent : min(sent + 64 * 1024, until)]
                sock.sendall(piece)
                sent += len(piece)
                time.sleep(0.01)

        # the upload goes on slowly in the background (about 6 MB/s at most)
        uploader = threading.Thread(target=trickle, args=(BIG // 2,), daemon=True)
        uploader.start()
        try:
            with ThreadPoolExecutor(4) as pool:
                small = [pool.submit(_http_sum, p) for _ in range(20)]
                small += [pool.submit(_grpc_sum, p) for _ in range(20)]
                assert [f.result(timeout=ANSWER_S) for f in small] == [SUM] * 40
            # the big request is still in flight: not all sent, and no answer yet
            assert sent < BIG
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
            sock.setblocking(True)
        finally:
            stop.set()
            uploader.join()
        # the rest at full speed: the big request is answered in full
        sock.sendall(data[sent:])
        sock.settimeout(60)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(re.search(rb"(?im)^content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        ihcl = int(re.search(rb"(?im)^inference-header-content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        while len(rest) < length:
            chunk = sock.recv(1 << 20)
            assert chunk
            rest += chunk
        sock.close()
        assert rest[ihcl:] == data


def test_small_requests_are_served_while_others_send_large_bodies_over_and_over() -> None:
    big = np.arange(4 * 1024 * 1024, dtype=np.float32)  # 16 MiB per request
    stop = threading.Event()

    def http_big() -> int:
        done = 0
        with _http(p) as c:
            while not stop.is_set() or done == 0:
                i = httpclient.InferInput("INPUT0", [big.size], "FP32")
                i.set_data_from_numpy(big, binary_data=True)
                out = c.infer("identity_fp32", [i]).as_numpy("OUTPUT0")
                assert out is not None and np.array_equal(out, big)
                done += 1
        return done

    def grpc_big() -> int:
        done = 0
        with grpcclient.InferenceServerClient(p.grpc_url) as c:
            while not stop.is_set() or done == 0:
                i = grpcclient.InferInput("INPUT0", [big.size], "FP32")
                i.set_data_from_numpy(big)
                out = c.infer("identity_fp32", [i], client_timeout=120).as_numpy("OUTPUT0")
                assert out is not None and np.array_equal(out, big)
                done += 1
        return done

    with v2proxy("serve", name="overload-big") as p, ThreadPoolExecutor(8) as pool:
        # three clients each of HTTP and gRPC send large bodies back to back until told to stop
        large = [pool.submit(http_big) for _ in range(3)] + [
            pool.submit(grpc_big) for _ in range(3)
        ]
        try:
            with ThreadPoolExecutor(2) as side:
                quick = [side.submit(_http_sum, p) for _ in range(10)]
                quick += [side.submit(_grpc_sum, p) for _ in range(10)]
                assert [f.result(timeout=ANSWER_S) for f in quick] == [SUM] * 20
            assert not any(f.done() for f in large)  # all the while, large bodies kept coming
        finally:
            stop.set()
        assert all(f.result(timeout=120) >= 1 for f in large)
