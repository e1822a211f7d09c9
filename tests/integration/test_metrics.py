"""Metrics and request logs, in process: known traffic over REST and gRPC, then ``GET /metrics``
parsed with prometheus_client's parser and every family checked exactly; ``/metrics`` is the
proxy's own in front of a REST backend that has one; ``--metrics off`` answers 404; a failed
request's WARNING line carries its fields and formats as JSON."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Factory, ProxyClient, proxy_to, settings
from tests.interop.peers.launch import _free_ports
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.app import build_grpc_server, build_rest
from v2proxy.app_core import build_metrics, build_pipeline
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.backends.metered import metered
from v2proxy.ops.request_log import JsonFormatter, TextFormatter

IHCL = "Inference-Header-Content-Length"
DATA = np.arange(16, dtype=np.int32).reshape(1, 16)


def json_body(model: str = "simple") -> bytes:
    inputs = [
        {"name": n, "datatype": "INT32", "shape": [1, 16], "data": DATA.ravel().tolist()}
        for n in ("INPUT0", "INPUT1")
    ]
    return json.dumps({"inputs": inputs}).encode()


def binary_body() -> tuple[bytes, int]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                }
                for n in ("INPUT0", "INPUT1")
            ],
            "outputs": [
                {"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")
            ],
        }
    ).encode()
    return header + DATA.tobytes() * 2, len(header)


def grpc_request(model: str = "simple") -> bytes:
    req = pb.ModelInferRequest(model_name=model)
    for n in ("INPUT0", "INPUT1"):
        t = req.inputs.add(name=n, datatype="INT32", shape=[1, 16])
        t.contents.int_contents.extend(DATA.ravel().tolist())
    return bytes(req.SerializeToString())


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape_text(text: str) -> tuple[set[str], Samples]:
    families: set[str] = set()
    samples: Samples = {}
    for fam in text_string_to_metric_families(text):
        families.add(fam.name)
        for s in fam.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


@dataclass
class Stack:
    rest: ProxyClient
    grpc_target: str


@pytest.fixture
async def stack(make_client: Factory) -> AsyncIterator[Stack]:
    """REST and gRPC frontends on one pipeline, a metered builtin backend and one registry,
    wired as app.serve does."""
    s = settings()
    metrics = build_metrics(s)
    pipeline = build_pipeline(s, metered(BuiltinBackend(), metrics))
    rest = await make_client(build_rest(s, pipeline, metrics))
    server = build_grpc_server(s, pipeline, metrics=metrics)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield Stack(rest, f"127.0.0.1:{port}")
    await server.stop(0)


async def scrape(client: ProxyClient) -> tuple[set[str], Samples]:
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    return scrape_text(await resp.text())


async def test_metrics_count_known_traffic_exactly(stack: Stack) -> None:
    rest = stack.rest
    out: dict[str, int] = {"json": 0, "binary": 0, "other": 0, "bad": 0}
    jbody = json_body()
    for _ in range(3):
        resp = await rest.post("/v2/models/simple/infer", data=jbody)
        assert resp.status == 200
        out["json"] += int(resp.headers["Content-Length"])
    bbody, ihcl = binary_body()
    for _ in range(2):
        resp = await rest.post("/v2/models/simple/infer", data=bbody, headers={IHCL: str(ihcl)})
        assert resp.status == 200 and IHCL in resp.headers
        out["binary"] += int(resp.headers["Content-Length"])
    nosuch = json_body("nosuch")
    resp = await rest.post("/v2/models/nosuch/infer", data=nosuch)
    assert resp.status == 404
    out["other"] += int(resp.headers["Content-Length"])
    bad = b'{"inputs": ['
    resp = await rest.post("/v2/models/simple/infer", data=bad)
    assert resp.status == 400
    out["bad"] += int(resp.headers["Content-Length"])

    g_out = 0
    greq = grpc_request()
    async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for _ in range(2):
            g_out += len(await infer(greq))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await infer(grpc_request("nosuch"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        call = stream(iter([greq, greq]))
        answers = [a async for a in call]
        assert len(answers) == 2
        assert all(not pb.ModelStreamInferResponse.FromString(a).error_message for a in answers)
        g_out += sum(len(a) for a in answers)

    families, m = await scrape(rest)
    fe = {"backend": "builtin"}
    rest_l = {"frontend": "rest", **fe}
    grpc_l = {"frontend": "grpc", **fe}
    req = "v2proxy_requests_total"
    # requests by model, operation, frontend and status class
    assert value(m, req, model="simple", operation="infer", code_class="2xx", **rest_l) == 5
    assert value(m, req, model="simple", operation="infer", code_class="4xx", **rest_l) == 1
    assert value(m, req, model="other", operation="infer", code_class="4xx", **rest_l) == 1
    assert value(m, req, model="simple", operation="infer", code_class="2xx", **grpc_l) == 2
    assert value(m, req, model="other", operation="infer", code_class="4xx", **grpc_l) == 1
    assert value(m, req, model="simple", operation="stream_infer", code_class="2xx", **grpc_l) == 2
    assert value(m, req) == 12  # nothing else: scrapes are not requests
    assert not any(lab["model"] == "nosuch" for lab, _ in m[req])
    # errors by cause
    err = "v2proxy_request_errors_total"
    assert value(m, err, model="simple", error="invalid_request", **rest_l) == 1
    assert value(m, err, model="other", error="not_found", **rest_l) == 1
    assert value(m, err, model="other", error="not_found", **grpc_l) == 1
    assert value(m, err) == 3
    # end-to-end durations
    dur = "v2proxy_request_duration_seconds_count"
    assert value(m, dur, model="simple", operation="infer", **rest_l) == 6
    assert value(m, dur, model="other", operation="infer", **rest_l) == 1
    assert value(m, dur, model="simple", operation="infer", **grpc_l) == 2
    assert value(m, dur, model="simple", operation="stream_infer", **grpc_l) == 2
    inf = value(m, "v2proxy_request_duration_seconds_bucket", le="+Inf")
    assert inf == value(m, dur) == 12
    # bytes by wire form
    rb, sb = "v2proxy_request_bytes_total", "v2proxy_response_bytes_total"
    assert value(m, rb, model="simple", frontend="rest", wire="json") == 3 * len(jbody) + len(bad)
    assert value(m, rb, model="simple", frontend="rest", wire="binary") == 2 * len(bbody)
    assert value(m, rb, model="other", frontend="rest", wire="json") == len(nosuch)
    assert value(m, sb, model="simple", frontend="rest", wire="json") == out["json"] + out["bad"]
    assert value(m, sb, model="simple", frontend="rest", wire="binary") == out["binary"]
    assert value(m, sb, model="other", frontend="rest", wire="json") == out["other"]
    assert value(m, rb, model="simple", frontend="grpc", wire="grpc") == 4 * len(greq)
    assert value(m, rb, model="other", frontend="grpc") == len(grpc_request("nosuch"))
    assert value(m, sb, model="simple", frontend="grpc", wire="grpc") == g_out
    # transcoding
    tc = "v2proxy_transcode_duration_seconds_count"
    assert value(m, tc, frontend="rest", direction="decode", wire="json") == 4
    assert value(m, tc, frontend="rest", direction="decode", wire="binary") == 2
    assert value(m, tc, frontend="rest", direction="encode", wire="json") == 3
    assert value(m, tc, frontend="rest", direction="encode", wire="binary") == 2
    assert value(m, tc, frontend="grpc", direction="decode", wire="grpc") == 5
    assert value(m, tc, frontend="grpc", direction="encode", wire="grpc") == 4
    # in flight: none now
    assert value(m, "v2proxy_requests_in_flight", frontend="rest") == 0
    assert value(m, "v2proxy_requests_in_flight", frontend="grpc") == 0
    # the backend's side
    bd = "v2proxy_backend_request_duration_seconds_count"
    assert value(m, bd, model="simple", operation="infer", backend="builtin") == 7
    assert value(m, bd, model="other", operation="infer", backend="builtin") == 2
    assert value(m, bd, model="simple", operation="stream_infer", backend="builtin") == 2
    assert value(m, "v2proxy_backend_connection_errors_total") == 0
    # declared, filled by later issues
    for name in (
        "v2proxy_backend_retries",
        "v2proxy_shm_registered_regions",
        "v2proxy_shm_registered_bytes",
        "v2proxy_mindie_time_to_first_token_seconds",
        "v2proxy_mindie_time_per_output_token_seconds",
    ):
        assert name in families


async def test_model_label_is_capped(stack: Stack) -> None:
    for i in range(5):  # unknown models never become labels
        resp = await stack.rest.post(f"/v2/models/m{i}/infer", data=json_body(f"m{i}"))
        assert resp.status == 404
    _, m = await scrape(stack.rest)
    assert {lab["model"] for lab, _ in m["v2proxy_requests_total"]} == {"other"}
    assert value(m, "v2proxy_requests_total", model="other", code_class="4xx") == 5


async def test_non_infer_operations_are_labelled(stack: Stack) -> None:
    assert (await stack.rest.get("/v2/health/ready")).status == 200
    assert (await stack.rest.get("/v2/models/simple")).status == 200
    assert (await stack.rest.post("/v2/health/ready")).status == 405
    _, m = await scrape(stack.rest)
    req = "v2proxy_requests_total"
    assert value(m, req, operation="health", model="", code_class="2xx") == 1
    assert value(m, req, operation="metadata", model="simple", code_class="2xx") == 1
    assert value(m, req, operation="health", code_class="4xx") == 1
    assert value(m, "v2proxy_request_errors_total", error="method_not_allowed") == 1
    bd = "v2proxy_backend_request_duration_seconds_count"
    assert value(m, bd, operation="server_ready") == 1
    assert value(m, bd, operation="model_metadata", model="simple") == 1


async def test_mindie_errors_are_counted_by_their_cause(stack: Stack) -> None:
    """MindIE's POST /infer answers errors in MindIE's shape (422 here) and counts them by
    their cause, as every other route does (they were counted as ``other``)."""
    resp = await stack.rest.post("/infer", data=b'{"inputs": 7}')
    assert resp.status == 422
    body = await resp.json()
    assert body["error_type"] == "Input Validation Error" and "inputs" in body["error"]
    resp = await stack.rest.post("/infer", data=b"not json")
    assert resp.status == 422
    _, m = await scrape(stack.rest)
    errors = "v2proxy_request_errors_total"
    assert value(m, errors, operation="mindie", error="invalid_request") == 2
    assert value(m, errors, operation="mindie", error="other") == 0
    assert value(m, "v2proxy_requests_total", operation="mindie", code_class="4xx") == 2


@pytest.fixture
async def backend_with_metrics(make_client: Factory) -> Any:
    """A REST 'backend' whose own /metrics answers something else, and counts its calls."""
    calls: list[str] = []

    async def own_metrics(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.Response(text="backend_metric_total 42\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", own_metrics)
    client = await make_client(app)
    return str(client.make_url("")).rstrip("/"), calls


async def test_metrics_are_the_proxys_own_in_front_of_a_rest_backend(
    make_client: Factory, backend_with_metrics: tuple[str, list[str]]
) -> None:
    url, calls = backend_with_metrics
    proxy = await proxy_to(make_client, url)
    resp = await proxy.get("/metrics")
    assert resp.status == 200
    text = await resp.text()
    assert "backend_metric_total" not in text
    families, m = scrape_text(text)
    assert "v2proxy_requests" in families
    assert value(m, "v2proxy_requests_total") == 0  # scrapes are not counted
    assert calls == []  # never passed through


async def test_metrics_off_answers_404_and_records_nothing(make_client: Factory) -> None:
    s = settings(metrics="off")
    metrics = build_metrics(s)
    pipeline = build_pipeline(s, metered(BuiltinBackend(), metrics))
    proxy = await make_client(build_rest(s, pipeline, metrics))
    assert (await proxy.post("/v2/models/simple/infer", data=json_body())).status == 200
    resp = await proxy.get("/metrics")
    assert resp.status == 404
    assert await resp.json() == {"error": "Not Found"}
    assert not metrics.enabled
    assert type(pipeline.backend) is BuiltinBackend  # not metered


async def test_backend_unreachable_counts_and_logs(
    make_client: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    (port,) = _free_ports(1)
    s = settings(backend=f"http://127.0.0.1:{port}")
    metrics = build_metrics(s)
    from v2proxy.app_core import build_backend

    pipeline = build_pipeline(s, metered(build_backend(s), metrics))
    proxy = await make_client(build_rest(s, pipeline, metrics))
    with caplog.at_level(logging.WARNING, logger="v2proxy.requests"):
        resp = await proxy.post(
            "/v2/models/simple/infer", data=json_body(), headers={"x-request-id": "rid-503"}
        )
    assert resp.status == 503
    _, m = await scrape(proxy)
    assert value(m, "v2proxy_backend_connection_errors_total", backend="rest") == 1
    assert (
        value(m, "v2proxy_backend_connection_errors_total", operation="infer", error="unavailable")
        == 1
    )
    assert value(m, "v2proxy_requests_total", code_class="5xx", backend="rest") == 1
    assert value(m, "v2proxy_request_errors_total", error="backend_unavailable") == 1
    (record,) = [r for r in caplog.records if r.name == "v2proxy.requests"]
    assert record.levelno == logging.WARNING
    fields = record.request  # type: ignore[attr-defined]
    assert fields["request_id"] == "rid-503"
    assert fields["status"] == 503
    assert fields["backend"] == "rest" and fields["frontend"] == "rest"
    assert fields["model"] == "simple"  # logs name the model; only metric labels are capped
    assert "unavailable" in fields["cause"]


async def test_failed_request_warning_line_and_json_format(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        resp = await stack.rest.post(
            "/v2/models/nosuch/infer", data=json_body("nosuch"), headers={"X-Request-ID": "r-1"}
        )
        assert resp.status == 404
        async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            with pytest.raises(grpc.aio.AioRpcError):
                await infer(grpc_request("nosuch"), metadata=[("x-request-id", "g-1")])
        ok = await stack.rest.post("/v2/models/simple/infer", data=json_body())
        assert ok.status == 200
    failed = [r for r in caplog.records if r.name == "v2proxy.requests"]
    assert [r.levelno for r in failed] == [logging.WARNING] * 2  # the 200 logs nothing
    rest_f, grpc_f = (r.request for r in failed)  # type: ignore[attr-defined]
    assert rest_f["request_id"] == "r-1" and grpc_f["request_id"] == "g-1"
    assert (rest_f["frontend"], grpc_f["frontend"]) == ("rest", "grpc")
    assert rest_f["backend"] == grpc_f["backend"] == "builtin"
    assert (rest_f["status"], grpc_f["status"]) == (404, "NOT_FOUND")
    assert "Request for unknown model" in rest_f["cause"]
    assert "Request for unknown model" in grpc_f["cause"]
    assert rest_f["path"] == "/v2/models/nosuch/infer"
    assert not [r for r in caplog.records if r.name == "v2proxy.access"]  # off by default

    line = JsonFormatter().format(failed[0])
    obj = json.loads(line)
    assert "\n" not in line
    assert obj["level"] == "WARNING" and obj["logger"] == "v2proxy.requests"
    assert obj["message"] == "request failed" and obj["ts"]
    assert obj["request_id"] == "r-1" and obj["status"] == 404 and obj["model"] == "nosuch"
    text = TextFormatter().format(failed[0])
    assert 'request_id="r-1"' in text and "status=404" in text and "WARNING" in text


async def test_access_log_one_info_line_per_request(
    make_client: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    s = settings(access_log="on")
    metrics = build_metrics(s)
    proxy = await make_client(
        build_rest(s, build_pipeline(s, metered(BuiltinBackend(), metrics)), metrics)
    )
    body = json_body()
    with caplog.at_level(logging.INFO, logger="v2proxy.access"):
        resp = await proxy.post("/v2/models/simple/infer", data=body)
        n_out = int(resp.headers["Content-Length"])
        assert (await proxy.get("/v2/health/live")).status == 200
    lines = [r for r in caplog.records if r.name == "v2proxy.access"]
    assert [r.levelno for r in lines] == [logging.INFO] * 2
    f = lines[0].request  # type: ignore[attr-defined]
    assert (f["method"], f["path"], f["status"]) == ("POST", "/v2/models/simple/infer", 200)
    assert (f["bytes_in"], f["bytes_out"]) == (len(body), n_out)
    assert f["duration_s"] >= 0 and "cause" not in f
    assert lines[1].request["path"] == "/v2/health/live"  # type: ignore[attr-defined]
