"""The fault-injection matrix: v2proxy (a process) in front of ``v2proxy reference-server`` (a
process) through :class:`~tests.faults.fault_relay.Relay`, one relay and one proxy per backend
transport (REST, gRPC); scenarios x transports x request kinds, each run once, classified.

Request kinds (all checked element by element when they answer 200):

- ``unary``: ``simple`` over the proxy's REST frontend (JSON);
- ``large``: ``identity_fp32`` with a binary tensor of :data:`LARGE_BYTES` over REST;
- ``stream``: the decoupled ``llm``, one response per token: ``generate_stream`` (server-sent
  events, passed through) in front of the REST backend, ``ModelStreamInfer`` over the proxy's
  gRPC frontend in front of the gRPC backend.

Outcome classes (:class:`Outcome`): ``ok`` (200, right body), ``error`` (502/503/504 or the gRPC
UNAVAILABLE/DEADLINE_EXCEEDED/INTERNAL, within --backend-timeout plus a margin), ``cut`` (a
stream whose 200 head went out, ended by an error event or a broken transfer: all a stream can
still say), and the defects: ``wrong`` (a 200 with a wrong body, or another status), ``slow``
(an error, but later than --backend-timeout plus the margin) and ``hang`` (no answer within
the client's own limit).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from tests.faults.fault_relay import Faults, Relay
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy._proto.service import SERVICE
from v2proxy.reference.models import llm_tokens

#: --backend-timeout of the proxies under test (seconds), per backend transport: the large
#: request alone takes up to 1 s over REST and 1-3 s over gRPC (grpcio's copies) on a loaded
#: 2-core machine
TIMEOUTS = {"rest": 2.5, "grpc": 4.0}
#: how much later than --backend-timeout an error may come (a loaded 2-core machine)
MARGIN = 2.0
#: how long after a fault is cleared a good request may still fail (the gRPC channel's
#: reconnect backoff, at most 1 s plus 20 % jitter: v2proxy.backends.grpc.RECONNECT_BACKOFF_MS)
RECOVERY_S = 1.5
#: the client's own limit: beyond it the case is a hang
CLIENT_LIMIT = max(TIMEOUTS.values()) + 8.0
LARGE_BYTES = 16 << 20
PROMPT = "faults in the relay"
MAX_TOKENS = 6
GATEWAY = {502, 503, 504}
GRPC_GATEWAY = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL"}
KINDS = ("unary", "large", "stream")
TRANSPORTS = ("rest", "grpc")


@dataclass
class Outcome:
    cls: str  # ok, error, cut, wrong, slow, hang
    status: str  # "200", "504", "UNAVAILABLE", "200+cut", ...
    elapsed: float
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.cls} {self.status} {self.elapsed:.2f}s {self.detail[:160]}"


# ---------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _live(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@dataclass
class Server:
    name: str
    http_port: int
    grpc_port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def wait_live(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _live(self.http_port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM by its pid, SIGKILL after 5 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.unlink(missing_ok=True)


def spawn(*args: str, name: str) -> Server:
    """``python -m v2proxy ARGS`` on loopback (free ports), not yet waited for."""
    http_port, grpc_port = _free_port(), _free_port()
    log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "v2proxy", *args, "--host", "127.0.0.1"]
    cmd += ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--drain-timeout", "1"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    return Server(name, http_port, grpc_port, proc, log)


@dataclass
class Stack:
    """The reference server, a relay in front of each of its ports, a proxy behind each relay."""

    relays: dict[str, Relay]
    proxies: dict[str, Server]
    reference: Server


@contextlib.contextmanager
def stack(loop: str = "uvloop") -> Iterator[Stack]:
    """The processes start together (the proxies reach the backend only when asked), then the
    stack is warmed up: each kind once through each proxy (the first requests also ask the
    backend's metadata)."""
    with contextlib.ExitStack() as es:
        ref = spawn("reference-server", name="fault-reference")
        es.callback(ref.stop)
        relays = {
            "rest": Relay("127.0.0.1", ref.http_port),
            "grpc": Relay("127.0.0.1", ref.grpc_port),
        }
        proxies = {}
        for transport, relay in relays.items():
            es.callback(relay.close)
            relay.start()
            scheme = "http" if transport == "rest" else "grpc"
            proxies[transport] = spawn(
                "serve",
                "--backend",
                f"{scheme}://{relay.address}",
                "--backend-timeout",
                str(TIMEOUTS[transport]),
                "--backend-connect-timeout",
                str(TIMEOUTS[transport]),
                "--backend-shm",
                "off",  # every byte through the relay
                "--event-loop",
                loop,
                name=f"fault-proxy-{transport}",
            )
            es.callback(proxies[transport].stop)
        for server in (ref, *proxies.values()):
            server.wait_live()
        st = Stack(relays, proxies, ref)
        for transport in TRANSPORTS:
            for kind in KINDS:
                for _ in range(10):  # a loaded machine may make one late; the gRPC channel
                    out = run_kind(st, transport, kind)  # may wait out its reconnect backoff
                    if out.cls == "ok":
                        break
                    time.sleep(0.3)
                else:
                    raise RuntimeError(f"{transport} {kind} fails without a fault: {out}")
        yield st


# ---------------------------------------------------------------------- requests


def _timed(fn: Callable[[], Outcome]) -> Outcome:
    start = time.monotonic()
    out = fn()
    out.elapsed = time.monotonic() - start
    return out


def _http_error(status: int, body: bytes) -> Outcome:
    text = body[:300].decode("utf-8", "replace")
    return Outcome("error" if status in GATEWAY else "wrong", str(status), 0.0, text)


@contextlib.contextmanager
def _post(
    port: int, path: str, body: bytes, headers: dict[str, str]
) -> Iterator[http.client.HTTPResponse]:
    """A POST on a connection of its own, closed after the block."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_LIMIT)
    try:
        conn.request("POST", path, body, headers)
        yield conn.getresponse()
    finally:
        conn.close()


def unary(port: int) -> Outcome:
    a = np.arange(16, dtype=np.int32) * 7 - 40
    b = np.arange(16, dtype=np.int32)[::-1].copy()
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.tolist()},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.tolist()},
            ]
        }
    ).encode()
    with _post(port, "/v2/models/simple/infer", body, {"Content-Type": "application/json"}) as resp:
        raw = resp.read()
    if resp.status != 200:
        return _http_error(resp.status, raw)
    got = {o["name"]: np.asarray(o["data"], dtype=np.int32) for o in json.loads(raw)["outputs"]}
    if not (np.array_equal(got["OUTPUT0"], a + b) and np.array_equal(got["OUTPUT1"], a - b)):
        return Outcome("wrong", "200", 0.0, "outputs differ from the sums and differences")
    return Outcome("ok", "200", 0.0)


_LARGE = np.random.default_rng(14).standard_normal(LARGE_BYTES // 4).astype(np.float32)


def large(port: int) -> Outcome:
    data = _LARGE
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [data.size],
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    with _post(port, "/v2/models/identity_fp32/infer", header + data.tobytes(), headers) as resp:
        try:
            raw = resp.read()
        except (http.client.IncompleteRead, OSError) as exc:
            if resp.status == 200:
                return Outcome("cut", "200+cut", 0.0, repr(exc)[:200])
            raise
    if resp.status != 200:
        return _http_error(resp.status, raw)
    hlen = resp.getheader("Inference-Header-Content-Length")
    n = int(hlen) if hlen is not None else len(raw)
    out = json.loads(raw[:n])["outputs"][0]
    got = np.frombuffer(raw[n:], dtype=np.float32)
    if out["shape"] != [data.size] or got.size != data.size or not np.array_equal(got, data):
        return Outcome("wrong", "200", 0.0, f"{got.size} elements back, or different ones")
    return Outcome("ok", "200", 0.0)


EXPECTED_TOKENS = llm_tokens(PROMPT, MAX_TOKENS)


def stream_sse(port: int) -> Outcome:
    body = json.dumps({"text_input": PROMPT, "max_tokens": MAX_TOKENS, "stream": True}).encode()
    path = "/v2/models/llm/generate_stream"
    with _post(port, path, body, {"Content-Type": "application/json"}) as resp:
        try:
            raw = resp.read()
        except (http.client.IncompleteRead, OSError) as exc:
            if resp.status == 200:
                return Outcome("cut", "200+cut", 0.0, repr(exc)[:200])
            raise
    if resp.status != 200:
        return _http_error(resp.status, raw)
    events = [json.loads(line[5:]) for line in raw.decode().split("\n") if line.startswith("data:")]
    errors = [e["error"] for e in events if "error" in e]
    if errors:
        return Outcome("cut", "200+error", 0.0, str(errors[0]))
    tokens = [e.get("text_output") for e in events]
    if tokens != EXPECTED_TOKENS:
        return Outcome("wrong", "200", 0.0, f"tokens {tokens!r}")
    return Outcome("ok", "200", 0.0)


def _llm_request() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="llm")
    t = req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append(PROMPT.encode())
    t = req.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    t.contents.int_contents.append(MAX_TOKENS)
    t = req.inputs.add(name="stream", datatype="BOOL", shape=[1])
    t.contents.bool_contents.append(True)
    return req


def _text(resp: pb.ModelInferResponse) -> str:
    raw = resp.raw_output_contents[0]
    n = int.from_bytes(raw[:4], "little")
    return raw[4 : 4 + n].decode()


def stream_grpc(port: int) -> Outcome:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        tokens: list[str] = []
        try:
            for item in call(iter([_llm_request()]), timeout=CLIENT_LIMIT):
                if item.error_message:
                    cls = "cut" if tokens else "error"
                    return Outcome(cls, "stream error", 0.0, item.error_message)
                if item.infer_response.raw_output_contents:
                    tokens.append(_text(item.infer_response))
        except grpc.RpcError as exc:
            code = exc.code()
            name = code.name if code is not None else "?"
            if name == "DEADLINE_EXCEEDED":  # the client's own limit
                return Outcome("hang", name, 0.0, str(exc.details()))
            cls = ("cut" if tokens else "error") if name in GRPC_GATEWAY else "wrong"
            return Outcome(cls, name, 0.0, str(exc.details()))
    if tokens != EXPECTED_TOKENS:
        return Outcome("wrong", "OK", 0.0, f"tokens {tokens!r}")
    return Outcome("ok", "OK", 0.0)


def run_kind(st: Stack, transport: str, kind: str) -> Outcome:
    """One request of ``kind`` through the proxy in front of ``transport``, classified."""
    proxy = st.proxies[transport]

    def call() -> Outcome:
        try:
            if kind == "unary":
                return unary(proxy.http_port)
            if kind == "large":
                return large(proxy.http_port)
            if transport == "grpc":
                return stream_grpc(proxy.grpc_port)
            return stream_sse(proxy.http_port)
        except TimeoutError as exc:
            return Outcome("hang", "no answer", 0.0, repr(exc))
        except (OSError, http.client.HTTPException) as exc:
            return Outcome("wrong", "broken", 0.0, repr(exc)[:200])

    out = _timed(call)
    if out.cls in ("error", "cut") and out.elapsed > TIMEOUTS[transport] + MARGIN:
        out.cls = "slow"
    return out


# ---------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    """A fault: ``faults(kind)`` set on the relay before the request (None: none), ``during``
    run on the relay meanwhile (in a thread, after ``during_after`` s), ``down`` the relay
    stopped for the request; ``expect`` the outcome classes allowed per kind."""

    name: str
    what: str
    faults: Callable[[str], Faults | None] = lambda kind: None
    during: Callable[[Relay], None] | None = None
    during_after: float = 0.2
    down: bool = False
    expect: dict[str, set[str]] = field(default_factory=dict)


#: bytes after which a fault cuts a request or an answer: inside the body of each kind
_REQUEST_CUT = {"unary": 60, "large": 4 << 20, "stream": 60}
_ANSWER_CUT = {"unary": 40, "large": 4 << 20, "stream": 200}
OK = {"ok"}
FAILS = {"error"}
STREAM_FAILS = {"error", "cut"}


def _restart(relay: Relay) -> None:
    relay.stop(reset=True)
    relay.start()


SCENARIOS = [
    Scenario("none", "no fault", expect=dict.fromkeys(KINDS, OK)),
    Scenario(
        "latency-small",
        "0.1 s added each way",
        lambda kind: Faults(latency_up=0.1, latency_down=0.1),
        expect=dict.fromkeys(KINDS, OK),
    ),
    Scenario(
        "latency-over-timeout",
        "answer delayed by --backend-timeout + 1 s",
        lambda kind: Faults(latency_down=max(TIMEOUTS.values()) + 1.0),
        expect=dict.fromkeys(KINDS, FAILS),
    ),
    Scenario(
        "reset-mid-request",
        "RST after part of the request",
        lambda kind: Faults(reset_request_after=_REQUEST_CUT[kind]),
        expect=dict.fromkeys(KINDS, FAILS),
    ),
    Scenario(
        "reset-mid-answer",
        "RST after part of the answer",
        lambda kind: Faults(reset_answer_after=_ANSWER_CUT[kind]),
        expect={"unary": FAILS, "large": FAILS | {"cut"}, "stream": STREAM_FAILS},
    ),
    Scenario(
        "truncated-answer",
        "clean close (FIN) after part of the answer",
        lambda kind: Faults(truncate_answer_after=_ANSWER_CUT[kind]),
        expect={"unary": FAILS, "large": FAILS | {"cut"}, "stream": STREAM_FAILS},
    ),
    Scenario(
        "backend-stops-reading",
        "the relay stops reading the request",
        lambda kind: Faults(stall_request_after=_REQUEST_CUT[kind]),
        expect=dict.fromkeys(KINDS, FAILS),
    ),
    Scenario(
        "backend-stops-sending",
        "the relay stops passing the answer on, the connection open",
        lambda kind: Faults(stall_answer_after=_ANSWER_CUT[kind]),
        expect={"unary": FAILS, "large": FAILS | {"cut"}, "stream": STREAM_FAILS},
    ),
    Scenario(
        "bandwidth-fast",
        "64 MiB/s each way",
        lambda kind: Faults(bandwidth=64 << 20),
        expect=dict.fromkeys(KINDS, OK),
    ),
    Scenario(
        "bandwidth-slow",
        "2 MiB/s each way (the large request needs 8 s)",
        lambda kind: Faults(bandwidth=2 << 20),
        expect={"unary": OK, "large": FAILS, "stream": OK},
    ),
    Scenario(
        "slow-request",
        "requests taken at 2 MiB/s (the large one needs 8 s)",
        lambda kind: Faults(bandwidth_up=2 << 20),
        expect={"unary": OK, "large": FAILS, "stream": OK},
    ),
    Scenario(
        "slow-answer",
        "answers at 2 MiB/s (the large answer needs 8 s)",
        lambda kind: Faults(bandwidth_down=2 << 20),
        expect={"unary": OK, "large": FAILS | {"cut"}, "stream": OK},
    ),
    Scenario("backend-down", "nothing listens", down=True, expect=dict.fromkeys(KINDS, FAILS)),
    Scenario(
        "backend-restart",
        "restarted (RST to all) while the answer is delayed",
        lambda kind: Faults(latency_down=1.0),
        during=_restart,
        expect={"unary": FAILS, "large": FAILS, "stream": STREAM_FAILS},
    ),
]


@dataclass
class Result:
    scenario: str
    transport: str
    kind: str
    outcome: Outcome
    recovery: Outcome
    expected: set[str]
    #: seconds from the fault's end to the first good request that succeeded (0: the first)
    recovered_after: float = 0.0

    @property
    def passed(self) -> bool:
        return self.outcome.cls in self.expected and self.recovery.cls == "ok"


def run_case(st: Stack, sc: Scenario, transport: str, kind: str) -> Result:
    """Arm the scenario, send one request, disarm, send one good request (the recovery)."""
    relay = st.relays[transport]
    faults = sc.faults(kind)
    if faults is not None:
        relay.set(faults)
    if sc.down:
        relay.stop()
    timer = None
    if sc.during is not None:
        timer = threading.Timer(sc.during_after, sc.during, (relay,))
        timer.start()
    try:
        outcome = run_kind(st, transport, kind)
    finally:
        if timer is not None:
            timer.join()
        relay.clear()
        if sc.down:
            relay.start()
    cleared = time.monotonic()
    while True:  # good requests until one succeeds, for at most RECOVERY_S
        began = time.monotonic()
        recovery = run_kind(st, transport, kind)
        if recovery.cls == "ok" or began - cleared > RECOVERY_S:
            break
        time.sleep(0.05)
    after = began - cleared if began - cleared > 0.05 else 0.0
    return Result(sc.name, transport, kind, outcome, recovery, sc.expect[kind], after)


def run_scenario(
    st: Stack, sc: Scenario, cells: dict[str, tuple[str, ...]] | None = None
) -> list[Result]:
    """The scenario's cases, each transport's in its own thread (their relays and proxies are
    apart); ``cells``: the kinds to run per transport (default: all)."""
    results: dict[str, list[Result]] = {t: [] for t in TRANSPORTS}

    def column(transport: str) -> None:
        for kind in (cells or {}).get(transport, KINDS if cells is None else ()):
            results[transport].append(run_case(st, sc, transport, kind))

    threads = [threading.Thread(target=column, args=(t,)) for t in TRANSPORTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for t in TRANSPORTS for r in results[t]]


def environment_note() -> str:
    timeouts = ", ".join(f"{t} {s:g} s" for t, s in TIMEOUTS.items())
    return f"--backend-timeout: {timeouts}; large = {LARGE_BYTES >> 20} MiB FP32"
