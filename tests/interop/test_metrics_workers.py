"""`v2proxy serve --workers 2`: GET /metrics, on whichever worker answers, reports the sum over
both workers (prometheus_client's multiprocess mode) of the traffic sent."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import time
from pathlib import Path

import grpc
from procs import v2proxy
from prometheus_client.parser import text_string_to_metric_families

from v2proxy._proto import grpc_service_pb2 as pb

REST_N, GRPC_N = 40, 10
BODY = json.dumps(
    {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
            for n in ("INPUT0", "INPUT1")
        ]
    }
).encode()


def _post(port: int, path: str, body: bytes) -> int:
    """One request on a fresh connection (so that both workers get some)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200
        text = resp.read().decode()
    finally:
        conn.close()
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _sum(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **lab: str
) -> float:
    want = set(lab.items())
    return sum(v for (n, labels), v in samples.items() if n == name and want <= labels)


def _metrics_files(pid: int) -> dict[int, list[str]]:
    """Each worker of the supervisor ``pid``: the kinds of metrics files it holds open
    (``counter``, ``gauge_livesum``, ``histogram``: the name less ``_<pid>.db``)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = {}
    for child in map(int, children):
        names = []
        for fd in Path(f"/proc/{child}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.endswith(f"_{child}.db"):
                    names.append(Path(target).name.removesuffix(f"_{child}.db"))
        found[child] = sorted(set(names))
    return found


def test_workers_metrics_are_summed_over_workers() -> None:
    with v2proxy("serve", "--workers", "2", "--access-log", name="metrics-workers") as proxy:
        # every metrics file a worker will use is open from its start, before any request: none
        # opens late (the soak counts file descriptors; a gauge back to 0 at each flush opened
        # its file whenever a flush first caught it non-zero). Polled until both workers hold
        # all three (a worker seen while it starts holds some of them); no request is sent
        # meanwhile, so a file opened only by traffic never comes and the wait fails.
        want = ["counter", "gauge_livesum", "histogram"]
        deadline = time.monotonic() + 10
        while len(files := _metrics_files(proxy.pid)) < 2 or any(
            names != want for names in files.values()
        ):
            assert time.monotonic() < deadline, files
            time.sleep(0.1)
        assert list(files.values()) == [want] * 2
        for _ in range(REST_N):
            assert _post(proxy.port, "/v2/models/simple/infer", BODY) == 200
        assert _post(proxy.port, "/v2/models/nosuch/infer", BODY) == 404
        req = pb.ModelInferRequest(model_name="simple")
        for n in ("INPUT0", "INPUT1"):
            req.inputs.add(name=n, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(
                range(16)
            )
        data = req.SerializeToString()
        for _ in range(GRPC_N):
            with grpc.insecure_channel(proxy.grpc_url) as channel:  # a fresh connection each
                channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(data)

        rest = {"model": "simple", "operation": "infer", "frontend": "rest", "code_class": "2xx"}
        deadline = time.monotonic() + 20  # workers flush every second; scrapes land anywhere
        while True:
            m = _scrape(proxy.port)
            if (
                _sum(m, "v2proxy_requests_total", **rest) >= REST_N
                and _sum(m, "v2proxy_requests_total", frontend="grpc", operation="infer") >= GRPC_N
                and _sum(m, "v2proxy_requests_total", code_class="4xx") >= 1
            ):
                break
            assert time.monotonic() < deadline, "the sums never reached the traffic sent"
            time.sleep(0.3)
        pids = set(
            re.findall(r"v2proxy\.access\[(\d+)\].*?/v2/models/simple/infer", proxy.log.read_text())
        )
        assert len(pids) == 2, "both workers served requests"
        assert _sum(m, "v2proxy_requests_total", **rest) == REST_N
        assert _sum(m, "v2proxy_requests_total", frontend="grpc", operation="infer") == GRPC_N
        assert _sum(m, "v2proxy_requests_total", model="other", code_class="4xx") == 1
        dur = "v2proxy_request_duration_seconds_count"
        assert _sum(m, dur, model="simple", operation="infer", frontend="rest") == REST_N
        assert _sum(
            m, "v2proxy_request_bytes_total", model="simple", frontend="rest", wire="json"
        ) == (REST_N * len(BODY))
        assert _sum(m, "v2proxy_request_bytes_total", frontend="grpc") == GRPC_N * len(data)
        bd = "v2proxy_backend_request_duration_seconds_count"
        assert _sum(m, bd, model="simple", operation="infer") == REST_N + GRPC_N
        assert _sum(m, "v2proxy_requests_in_flight") == 0
        assert _metrics_files(proxy.pid) == files
