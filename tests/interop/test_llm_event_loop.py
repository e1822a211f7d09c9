"""One huge generation of the builtin ``llm`` must not hold v2proxy's event loop, nor its memory.

A ``v2proxy serve`` process (builtin backend, MindIE ``/infer`` on the builtin ``llm`` by
default) is asked for 1,000,000 tokens over MindIE ``/infer`` (stream and not) and over gRPC
``ModelStreamInfer``; the client goes away after the first event (or, not streaming, a moment
after sending). Meanwhile ``GET /v2/health/live`` is asked every ~20 ms on a new connection:
each must answer within :data:`LATENCY_BOUND_S`. Afterwards the process must be idle again (the
generation stopped with its client: little CPU used over a second) and its memory back near
where it started (VmRSS from ``/proc``; the peak, VmHWM, bounded too).

Found by hand: the stream variant blocked every other client for 30-70 s, peaked at ~680 MiB
and kept ~190 MiB; the non-stream and the gRPC variants blocked 18-25 s.

The same holds for an OpenAI completion with a stop sequence of 200,000 characters that the
text carries on before a short one ends it (:func:`test_a_huge_stop_sequence_leaves_the_loop_free`,
health within 100 ms): the stop scanner's quadratic search held the loop for 0.6 s."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from procs import Proc, v2proxy

from v2proxy._proto import grpc_service_pb2 as pb

#: the longest a health request may wait while the generation runs
LATENCY_BOUND_S = 0.5
#: how often health is asked (each on a new connection)
PROBE_EVERY_S = 0.02
#: how long the health probes go on after the client went away
AFTER_S = 1.5
#: CPU seconds the process may use in the idle second that follows (health probes included)
IDLE_CPU_S = 0.3
#: how much more resident memory than before the request is tolerated, after it and at peak
RSS_SLACK = 48 << 20
HWM_SLACK = 96 << 20
HUGE = 1_000_000
LOOPS = ["uvloop", "asyncio"]


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Probe:
    """``GET /v2/health/live`` on a new connection every PROBE_EVERY_S, in a thread; each
    request's latency (None: no answer within the socket timeout, then probing stops)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[float | None] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self) -> float | None:
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                head = s.recv(64)
        except OSError:
            return None
        if not head.startswith(b"HTTP/1.1 200"):
            return None
        return time.monotonic() - t0

    def _run(self) -> None:
        while not self._stop.is_set():
            latency = self._one()
            self.latencies.append(latency)
            if latency is None:
                return
            self._stop.wait(PROBE_EVERY_S)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def check(self, bound: float = LATENCY_BOUND_S) -> None:
        assert None not in self.latencies, (
            "a health request got no answer within 5 s: the event loop was held"
        )
        assert len(self.latencies) >= 20, f"too few health probes: {self.latencies}"
        worst = max(x for x in self.latencies if x is not None)
        assert worst < bound, (
            f"a health request waited {worst:.3f} s (bound {bound} s): the event loop was held"
        )


def _post_infer(port: int, body: dict[str, object]) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(
            b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
    except BaseException:
        s.close()  # the caller's `with` closes it only once it is returned
        raise
    return s


def mindie_stream(proxy: Proc, tokens: int) -> None:
    """A MindIE stream; the client leaves after the first event."""
    body = {"inputs": "hi", "stream": True, "parameters": {"max_new_tokens": tokens}}
    with _post_infer(proxy.port, body) as s:
        got = b""
        while b"data:" not in got or b"\n\n" not in got.split(b"data:", 1)[1]:
            chunk = s.recv(65536)
            assert chunk, f"the stream ended before its first event: {got!r}"
            got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got[:300]


def mindie_text(proxy: Proc, tokens: int) -> None:
    """A MindIE non-stream request; the client leaves a moment after sending it (or when the
    answer comes, if it comes first)."""
    body = {"inputs": "hi", "stream": False, "parameters": {"max_new_tokens": tokens}}
    with _post_infer(proxy.port, body) as s:
        s.settimeout(0.3)
        with contextlib.suppress(TimeoutError):
            s.recv(65536)


def grpc_stream(proxy: Proc, tokens: int) -> None:
    """ModelStreamInfer asking the llm to stream; the call is cancelled after the first
    response."""
    msg = pb.ModelInferRequest(model_name="llm")
    t = msg.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append(b"hi")
    msg.inputs.add(name="max_tokens", datatype="INT32", shape=[1]).contents.int_contents.append(
        tokens
    )
    msg.inputs.add(name="stream", datatype="BOOL", shape=[1]).contents.bool_contents.append(True)
    done = threading.Event()

    def requests() -> Iterator[pb.ModelInferRequest]:
        yield msg
        done.wait(10)  # the request side stays open until the call ends

    with grpc.insecure_channel(proxy.grpc_url) as channel:
        call: Any = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )(requests(), timeout=30)
        try:
            first = next(call)
            assert not first.error_message, first.error_message
            assert first.infer_response.outputs[0].name == "text_output"
        finally:
            call.cancel()
            done.set()


CASES = {"mindie-stream": mindie_stream, "mindie-text": mindie_text, "grpc-stream": grpc_stream}


@pytest.fixture(params=LOOPS)
def proxy(request: pytest.FixtureRequest) -> Iterator[Proc]:
    """A fresh process per case (one that a case leaves blocked is stopped with it)."""
    with v2proxy("serve", "--backend", "builtin", "--event-loop", request.param) as p:
        # warm up every path once (imports, caches, the gRPC server's threads)
        for case in CASES.values():
            case(p, 3)
        time.sleep(0.5)
        yield p


@pytest.mark.parametrize("case", list(CASES))
def test_huge_generation_leaves_the_loop_free(proxy: Proc, case: str) -> None:
    pid = proxy.pid
    rss_before = _status_kib(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here on
    with Probe(proxy.port) as probe:
        time.sleep(0.1)
        CASES[case](proxy, HUGE)
        time.sleep(AFTER_S)
    probe.check()
    # the generation ended with its client: the process is idle again
    cpu0 = _cpu_s(pid)
    time.sleep(1.0)
    used = _cpu_s(pid) - cpu0
    assert used < IDLE_CPU_S, f"{used:.2f} s of CPU in the second after the client left"
    rss_after = _status_kib(pid, "VmRSS")
    hwm = _status_kib(pid, "VmHWM")
    mib = 1 << 20
    assert rss_after - rss_before < RSS_SLACK, (
        f"RSS {rss_before // mib} MiB before, {rss_after // mib} MiB after"
    )
    assert hwm - rss_before < HWM_SLACK, f"RSS {rss_before // mib} MiB before, peak {hwm // mib}"
    # and the proxy still serves a small generation
    status, raw = _text_answer(proxy)
    assert status == 200 and json.loads(raw)["generated_text"] == "hi hi", raw


def _text_answer(proxy: Proc) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        body = json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": 2}})
        conn.request("POST", "/infer", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


#: the longest stop sequence the proxy below accepts (--max-stop-length), and one of that length
#: that the generated text ("hi hi hi ...") carries on until a short one ("STOP") ends it
STOP_LENGTH = 200_000
LONG_STOP = ("hi " * STOP_LENGTH)[: STOP_LENGTH - 1] + "Z"
#: words of the prompt, generated in turn: the text goes 210,000 characters, past the long one
WORDS = 70_000


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "text"])
def test_a_huge_stop_sequence_leaves_the_loop_free(loop: str, stream: bool) -> None:
    """A stop sequence of 200,000 characters (the most --max-stop-length allows here), a
    generation that carries it on for 210,000 characters, then a short stop sequence: health
    answers within 100 ms throughout. The scanner sliced its held text again at every position
    once a stop sequence was found (quadratic): the same request held every other client for
    seconds."""
    with v2proxy(
        "serve", "--event-loop", loop, "--max-stop-length", str(STOP_LENGTH), name="stop-loop"
    ) as proxy:
        body = {
            "model": "llm",
            "prompt": "hi " * WORDS + "STOP",
            "max_tokens": WORDS + 1,
            "stream": stream,
            "stop": [LONG_STOP, "STOP"],
        }
        data = json.dumps(body).encode()
        with Probe(proxy.port) as probe:
            time.sleep(0.1)
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
            try:
                conn.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
            finally:
                conn.close()
            time.sleep(0.2)
        assert resp.status == 200, raw[:300]
        if stream:
            events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
            choices = [json.loads(e[6:])["choices"][0] for e in events]
            text = "".join(c["text"] for c in choices)
            reason = choices[-1]["finish_reason"]
        else:
            choice = json.loads(raw)["choices"][0]
            text, reason = choice["text"], choice["finish_reason"]
        assert (text, reason) == ("hi " * WORDS, "stop")
        probe.check(bound=0.1)
