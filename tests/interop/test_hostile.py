"""Hostile input against a running v2proxy process (``v2proxy serve`` in front of the builtin
models), the way an attacker on the network would send it: raw sockets, raw gRPC bytes.

Each case was a defect found by probing the proxy: request targets that made it connect to any
host (SSRF), a Content-Length that made it allocate memory before any body byte arrived, slow and
idle clients held forever, malformed requests answered with tracebacks and echoed bytes, remote
clients unloading models. Every case checks that the proxy still serves afterwards.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from procs import Proc, v2proxy

SIMPLE = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        ]
    }
).encode()


@pytest.fixture(scope="module")
def proxy() -> Iterator[Proc]:
    with v2proxy(
        "serve",
        "--client-header-timeout",
        "1",
        "--client-idle-timeout",
        "1",
        "--client-body-timeout",
        "1",
        name="hostile",
    ) as p:
        yield p


def still_serves(proxy: Proc) -> None:
    req = urllib.request.Request(
        f"{proxy.base_url}/v2/models/simple/infer", data=SIMPLE, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        out = json.loads(resp.read())
    assert out["outputs"][0]["data"] == [i + 1 for i in range(16)]


def exchange(proxy: Proc, raw: bytes, timeout: float = 10.0) -> bytes:
    """Send ``raw`` and read until the proxy closes the connection."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout) as s:
        s.sendall(raw)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@contextlib.contextmanager
def listener() -> Iterator[tuple[int, list[socket.socket]]]:
    """A listening socket that records every connection made to it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.1)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                conn, _ = srv.accept()
                accepted.append(conn)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], accepted
    finally:
        done.set()
        t.join()
        srv.close()
        for c in accepted:
            c.close()


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def hwm_kib(pid: int) -> int:
    """The peak RSS since the last reset (``/proc/PID/clear_refs``)."""
    return rss_kib(pid, "VmHWM")


@pytest.mark.parametrize(
    "request_line",
    [
        b"CONNECT 0@127.0.0.1:{port} HTTP/1.1",
        b"CONNECT 127.0.0.1:{port} HTTP/1.1",
        b"GET http://127.0.0.1:{port}/v2 HTTP/1.1",
        b"GET 0@127.0.0.1:{port}/v2 HTTP/1.1",
        b"POST http://127.0.0.1:{port}/v2/models/simple/infer HTTP/1.1",
    ],
)
def test_request_target_never_names_a_host(proxy: Proc, request_line: bytes) -> None:
    """SSRF: the backend is fixed; a request target is a path or the request is refused."""
    with listener() as (port, accepted):
        line = request_line.replace(b"{port}", str(port).encode())
        answer = exchange(proxy, line + b"\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        time.sleep(0.3)  # a connection the proxy made would have been accepted by now
        assert accepted == []
    status = int(answer.split(b" ", 2)[1])
    assert status in (400, 405), answer
    assert str(port).encode() not in answer.split(b"\r\n\r\n", 1)[1]  # nothing echoed
    still_serves(proxy)


@pytest.mark.parametrize(
    "path,extra",
    [
        (b"/v2/models/simple/infer", b""),
        (b"/v2/models/simple/infer", b"Content-Encoding: gzip\r\n"),
        (b"/v2/models/simple/generate", b""),
        (b"/v2/repository/index", b""),
    ],
)
def test_content_length_alone_allocates_nothing(proxy: Proc, path: bytes, extra: bytes) -> None:
    """Six connections announce 2 GB bodies and send none: memory follows the bytes received."""
    before = rss_kib(proxy.pid)
    conns = []
    try:
        for _ in range(6):
            s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            conns.append(s)
            s.sendall(
                b"POST "
                + path
                + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000000\r\n"
                + extra
                + b"\r\n"
                + SIMPLE[:100]
            )
        time.sleep(0.5)
        grown_mib = (rss_kib(proxy.pid) - before) / 1024
        assert grown_mib < 64, f"RSS grew by {grown_mib:.0f} MiB"
    finally:
        for s in conns:
            s.close()
    still_serves(proxy)


def test_slowloris_and_idle_clients_are_closed(proxy: Proc) -> None:
    """50 clients sending a head one byte at a time and 200 that send nothing: the proxy
    closes them all (here after --client-header-timeout 1 s) and serves meanwhile."""
    slow: list[socket.socket] = []
    idle: list[socket.socket] = []
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    closed_slow: set[int] = set()
    try:
        # made one by one inside the try: all closed in the finally even if one fails
        for conns, n in ((slow, 50), (idle, 200)):
            for _ in range(n):
                conns.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=10))
        for s in slow:
            s.setblocking(False)
        deadline = time.monotonic() + 30
        i = 0
        while len(closed_slow) < len(slow) and time.monotonic() < deadline:
            for n, s in enumerate(slow):
                if n in closed_slow:
                    continue
                try:
                    s.send(head[i % len(head) : i % len(head) + 1])
                    data = s.recv(4096)
                    if data == b"" or data.startswith(b"HTTP/1.1 408"):
                        closed_slow.add(n)
                except BlockingIOError:
                    pass
                except OSError:
                    closed_slow.add(n)
            i += 1
            time.sleep(0.2)
        still_serves(proxy)
        assert len(closed_slow) == len(slow)
        for s in idle:
            # an idle connection gets at most a 408 and then its end (a timeout fails the test)
            s.settimeout(20)
            got = b""
            while chunk := s.recv(4096):
                got += chunk
            assert got == b"" or got.startswith(b"HTTP/1.1 408"), got
    finally:
        for s in slow + idle:
            s.close()
    still_serves(proxy)


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /v2\x00<script>evil HTTP/1.1\r\n\r\n",
        b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header<script>: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03<script>",
    ],
)
def test_malformed_http_gets_400_no_echo_no_traceback(proxy: Proc, raw: bytes) -> None:
    answer = exchange(proxy, raw)
    assert answer.startswith(b"HTTP/1.1 4"), answer
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert b"<script>" not in body and b"evil" not in body
    assert "error" in json.loads(body)
    assert "Traceback" not in proxy.log.read_text()
    still_serves(proxy)


def test_malformed_protobuf_is_invalid_argument(proxy: Proc) -> None:
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\xff\xff\xff\xff", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed ModelInfer request" in info.value.details()
    still_serves(proxy)


def test_surplus_raw_input_contents_refused(proxy: Proc) -> None:
    from v2proxy._proto import grpc_service_pb2 as pb

    msg = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    msg.raw_input_contents.extend([bytes(64), bytes(64), b"smuggled"])
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            call(msg, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected 2 raw_input_contents" in info.value.details()


def test_unread_grpc_stream_is_held_back(proxy: Proc) -> None:
    """One ModelStreamInfer sending 60,000 small requests and never reading an answer: the
    proxy stops reading the stream while --max-stream-in-flight requests are served, so HTTP/2
    flow control holds the client back and memory stays bounded; a cancel releases the stream.
    Each message used to start a task of its own: RSS grew by 240 MiB in 8 s and more after,
    and 80 MiB were still held 5 s after the cancel."""
    from v2proxy._proto import grpc_service_pb2 as pb

    msg = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    msg.raw_input_contents.extend([bytes(64), bytes(64)])
    sent = 0
    deadline = time.monotonic() + 8.0

    def requests() -> Iterator[pb.ModelInferRequest]:
        nonlocal sent
        while sent < 60_000 and time.monotonic() < deadline:
            sent += 1
            yield msg

    before = rss_kib(proxy.pid)
    peak = before
    with grpc.insecure_channel(proxy.grpc_url) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        call = stream(requests())  # answers never read
        while time.monotonic() < deadline + 1.0:  # the last second: what was sent arrives
            peak = max(peak, rss_kib(proxy.pid))
            time.sleep(0.1)
        call.cancel()
        grown_mib = (peak - before) / 1024  # 6 MiB here, 44,000 requests taken in 8 s
        assert grown_mib < 100, f"RSS grew by {grown_mib:.0f} MiB for {sent} requests"
        after = time.monotonic() + 5.0
        while (rss_kib(proxy.pid) - before) / 1024 > 20 and time.monotonic() < after:
            time.sleep(0.1)
        left_mib = (rss_kib(proxy.pid) - before) / 1024
        assert left_mib <= 20, f"{left_mib:.0f} MiB still held 5 s after the cancel"
        # the stream's slots and tasks are gone: a new stream is answered at once
        answers = stream(iter([msg]), timeout=10)
        assert next(answers).infer_response.outputs[0].name == "OUTPUT0"
    still_serves(proxy)


def test_restricted_apis_refused_by_default(proxy: Proc) -> None:
    """Repository, logging and trace settings are refused to remote clients by default."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with httpclient.InferenceServerClient(proxy.url) as http:
        with pytest.raises(InferenceServerException) as info:
            http.unload_model("simple")
        assert "This API is restricted" in info.value.message()
        assert info.value.status() == "403"
        for call in (
            lambda: http.update_log_settings({"log_info": False}),
            lambda: http.update_trace_settings(settings={"trace_file": "/tmp/x"}),
            http.get_model_repository_index,
        ):
            with pytest.raises(InferenceServerException, match="This API is restricted"):
                call()
        with (
            grpcclient.InferenceServerClient(proxy.grpc_url) as g,
            pytest.raises(InferenceServerException) as ginfo,
        ):
            g.unload_model("simple")
        assert ginfo.value.status() == "StatusCode.PERMISSION_DENIED"
        # a restricted path spelled another way is refused too
        answer = exchange(
            proxy,
            b"POST /v2/%72epository/models/simple/unload/ HTTP/1.1\r\nHost: x\r\n"
            b"Connection: close\r\nContent-Length: 0\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 403"), answer
        assert http.is_model_ready("simple")
        still_serves(proxy)


def test_restricted_apis_open_with_the_configured_header() -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with (
        v2proxy("serve", "--restricted-api-header", "x-admin-key=s3cret", name="restricted") as p,
        httpclient.InferenceServerClient(p.url) as http,
    ):
        with pytest.raises(InferenceServerException) as info:
            http.unload_model("simple", headers={"x-admin-key": "wrong"})
        assert info.value.message() == "This API is restricted, expecting header 'x-admin-key'"
        assert http.is_model_ready("simple")
        http.unload_model("simple", headers={"X-Admin-Key": "s3cret"})
        assert not http.is_model_ready("simple")
        http.load_model("simple", headers={"x-admin-key": "s3cret"})
        assert http.is_model_ready("simple")
        assert http.get_log_settings(headers={"x-admin-key": "s3cret"})["log_info"] is True
        # statistics are not restricted by default
        assert http.get_inference_statistics("simple")["model_stats"][0]["name"] == "simple"


# ------------------------------------------------------------ --max-input-size on every route

#: a 16 MiB field the routes ignore, against --max-input-size 4Mi
PAD = "x" * (16 << 20)
#: route -> (a small valid body, the shape of its error answer)
LLM_ROUTES = {
    "/v1/completions": ({"model": "llm", "prompt": "hi", "max_tokens": 2}, "openai"),
    "/v1/chat/completions": (
        {"model": "llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "openai",
    ),
    "/v2/models/llm/generate": ({"text_input": "hi", "max_tokens": 2}, "v2"),
    "/v2/models/llm/generate_stream": ({"text_input": "hi", "max_tokens": 2}, "v2"),
    "/infer": ({"inputs": "hi", "parameters": {"max_new_tokens": 2}}, "mindie"),
}


@pytest.fixture(scope="module")
def small_input() -> Iterator[Proc]:
    with v2proxy("serve", "--max-input-size", "4Mi", name="small-input") as p:
        yield p


def post_whole(proxy: Proc, path: str, body: bytes, chunked: bool) -> tuple[int, bytes]:
    """POST ``body`` from a thread (a refused send is ignored) and read the answer: its status
    and body (the proxy closes the connection after a 413)."""
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if chunked:
        step = 1 << 20
        frames = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + step]), body[i : i + step])
            for i in range(0, len(body), step)
        )
        raw = head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + frames + b"0\r\n\r\n"
    else:
        raw = head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body

    def send() -> None:
        with contextlib.suppress(OSError):
            s.sendall(raw)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            assert chunk, f"no answer: {got!r}"
            got += chunk
        head_bytes, rest = got.split(b"\r\n\r\n", 1)
        length = int(head_bytes.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        while len(rest) < length:
            chunk = s.recv(65536)
            assert chunk, f"answer cut short: {got!r}"
            rest += chunk
        return int(head_bytes.split(b" ", 2)[1]), rest[:length]
    finally:
        s.close()
        sender.join(10)


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
@pytest.mark.parametrize("path", list(LLM_ROUTES))
def test_max_input_size_bounds_every_llm_route(small_input: Proc, path: str, chunked: bool) -> None:
    """A 16 MiB field with --max-input-size 4Mi: 413 from every LLM route, refused while the
    body is read, in the route's error shape; was 200 (only --max-body-size bounded them)."""
    body, shape = LLM_ROUTES[path]
    before = rss_kib(small_input.pid)
    status, raw = post_whole(small_input, path, json.dumps({**body, "user": PAD}).encode(), chunked)
    assert status == 413, raw[:300]
    doc = json.loads(raw)
    limit = "maximum input size of 4194304 bytes (--max-input-size)"
    if shape == "openai":
        assert doc["error"]["type"] == "invalid_request_error", doc
        assert limit in doc["error"]["message"], doc
    elif shape == "mindie":
        assert limit in doc["error"] and doc["error_type"], doc
    else:
        assert limit in doc["error"], doc
    grown_mib = (rss_kib(small_input.pid) - before) / 1024
    assert grown_mib < 32, f"RSS grew by {grown_mib:.0f} MiB"
    # the same request, small, is served
    req = urllib.request.Request(
        f"{small_input.base_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        resp.read()
    still_serves(small_input)


def test_a_million_chat_messages_refused_from_the_bytes(proxy: Proc) -> None:
    """1,000,000 chat messages (35 MB, within --max-input-size): 400 naming ``messages``
    (--max-chat-messages, 1024), told from the body's bytes; parsed whole, the body peaked the
    proxy's RSS at 668 MiB before its 400."""
    one = {"role": "user", "content": "hi"}
    body = json.dumps({"model": "llm", "messages": [one] * 1_000_000}).encode()
    pid = proxy.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here on
    before = rss_kib(pid)
    status, raw = post_whole(proxy, "/v1/chat/completions", body, chunked=False)
    assert status == 400, raw[:300]
    error = json.loads(raw)["error"]
    assert error["param"] == "messages" and "--max-chat-messages" in error["message"], error
    peak_mib = (hwm_kib(pid) - before) / 1024
    assert peak_mib < 128, f"RSS peaked {peak_mib:.0f} MiB above where it was"
    # within the limit, the same messages are served
    small = json.dumps({"model": "llm", "messages": [one] * 1024, "max_tokens": 2}).encode()
    assert post_whole(proxy, "/v1/chat/completions", small, chunked=False)[0] == 200
    still_serves(proxy)


@pytest.mark.parametrize(
    ("stop", "param", "option"),
    [
        ("x" * 1025, "stop", "--max-stop-length"),
        (["a", "x" * 1025], "stop[1]", "--max-stop-length"),
        (["a", "b", "c", "d", "e"], "stop", "--max-stops"),
    ],
)
def test_stop_sequences_are_bounded(proxy: Proc, stop: object, param: str, option: str) -> None:
    """Too long a stop sequence (--max-stop-length, 1024 characters) or too many (--max-stops,
    4): 400 naming ``stop``, before any backend is called; an 800,000-character one was taken
    and held the event loop for seconds."""
    body = {"model": "llm", "prompt": "hi", "max_tokens": 2, "stop": stop}
    status, raw = post_whole(proxy, "/v1/completions", json.dumps(body).encode(), chunked=False)
    assert status == 400, raw[:300]
    error = json.loads(raw)["error"]
    assert error["param"] == param and option in error["message"], error
    still_serves(proxy)
