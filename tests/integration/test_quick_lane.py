"""The REST frontend's quick lane (frontends/rest_quick.py): a small JSON /infer relayed from the
HTTP server's callbacks holds every rule of the general path — the same answer as the decoded
path, request ids, metrics and the access log, deadlines, the backend's errors, restricted groups,
admission, pipelining, large answers — and it declines what it must not take."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.integration.conftest import Factory, ProxyClient, Seen, settings
from tests.integration.test_metrics import scrape, value
from tests.integration.test_rest_backend import url_of
from tests.integration.test_rest_errors import BIN_HEADER, BLOB, framed, simple_json
from v2proxy.app import build_rest
from v2proxy.app_core import build_backend, build_metrics, build_pipeline
from v2proxy.backends.metered import metered
from v2proxy.core.decide import JSON, relays
from v2proxy.core.ports import RelayFacts

pytestmark = pytest.mark.both_loops

INFER = "/v2/models/simple/infer"


async def lane_proxy(make_client: Factory, url: str, **overrides: Any) -> ProxyClient:
    """v2proxy in front of ``url`` as ``v2proxy serve`` builds it (metrics on, metered)."""
    s = settings(backend=url, **overrides)
    metrics = build_metrics(s)
    pipeline = build_pipeline(s, metered(build_backend(s), metrics))
    proxy: ProxyClient = await make_client(build_rest(s, pipeline, metrics))
    return proxy


def post(proxy: ProxyClient, body: bytes, **headers: str) -> Any:
    """A POST of /infer as a plain JSON client sends it (aiohttp would ask for gzip, which
    the lane leaves to the general path)."""
    return proxy.post(
        INFER,
        data=body,
        headers={k.replace("_", "-"): v for k, v in headers.items()},
        skip_auto_headers=["Accept-Encoding"],
    )


def taken(proxy: ProxyClient) -> int:
    return proxy.frontend.quick.taken


async def warm(proxy: ProxyClient) -> None:
    """One request on the general path, which opens the backend connection the lane then takes
    at once (the lane never waits for a connection)."""
    before = taken(proxy)
    resp = await post(proxy, simple_json())
    assert resp.status == 200, await resp.text()
    assert taken(proxy) == before  # a cold pool: declined


def outputs(answer: dict[str, Any]) -> dict[str, tuple[str, list[int], list[Any]]]:
    return {o["name"]: (o["datatype"], o["shape"], o["data"]) for o in answer["outputs"]}


async def test_the_lane_answers_what_the_decoded_path_answers(
    make_client: Factory, recorded: tuple[ProxyClient, list[Seen]]
) -> None:
    backend, seen = recorded
    lane = await lane_proxy(make_client, url_of(backend))  # type: ignore[arg-type]
    transcoded = await lane_proxy(make_client, url_of(backend), backend_encoding="binary")  # type: ignore[arg-type]
    await warm(lane)
    await warm(transcoded)
    body = simple_json(list(range(16)))
    resp = await post(lane, body, x_request_id="rid-7")
    assert resp.status == 200, await resp.text()
    assert taken(lane) == 1
    assert resp.headers["x-request-id"] == "rid-7"
    assert resp.content_type == "application/json"
    relayed = await resp.json()
    assert seen[-1].headers["x-request-id"] == "rid-7"  # passed on to the backend too
    assert seen[-1].headers["Content-Type"] == "application/json"
    resp = await post(transcoded, body)
    assert resp.status == 200
    assert taken(transcoded) == 1  # a binary backend: the lane transcodes it
    assert "Inference-Header-Content-Length" in seen[-1].headers
    decoded = await resp.json()
    assert outputs(relayed) == outputs(decoded)
    assert outputs(relayed)["OUTPUT0"] == ("INT32", [1, 16], [i + 1 for i in range(16)])
    assert outputs(relayed)["OUTPUT1"] == ("INT32", [1, 16], [i - 1 for i in range(16)])


async def test_a_json_body_to_a_binary_backend_is_transcoded_in_the_lane(
    make_client: Factory, recorded: tuple[ProxyClient, list[Seen]]
) -> None:
    """With ``--backend-encoding binary`` a JSON body is decoded by the full decoder in the lane,
    sent in binary tensors at once (``Backend.infer_now``) and its answer encoded as the general
    path encodes it: the same bytes, the same records; a malformed body, or one a stage applies
    to, is left to the general path."""
    backend, seen = recorded
    proxy = await lane_proxy(make_client, url_of(backend), backend_encoding="binary")  # type: ignore[arg-type]
    general = await lane_proxy(make_client, url_of(backend), backend_encoding="binary")  # type: ignore[arg-type]
    general.frontend.quick.speaks_rest = False  # the lane off: the general path's answer
    assert proxy.frontend.quick.takes_json is False
    await warm(proxy)
    await warm(general)
    asks_binary = json.loads(simple_json(list(range(16))))
    asks_binary["outputs"] = [{"name": "OUTPUT1", "parameters": {"binary_data": True}}]
    for body in (simple_json(list(range(16))), json.dumps(asks_binary).encode()):
        before = len(seen)
        resp = await post(proxy, body, x_request_id="t")
        assert resp.status == 200, await resp.text()
        assert resp.headers["x-request-id"] == "t"
        lane_answer, lane_type = await resp.read(), resp.headers["Content-Type"]
        assert "Inference-Header-Content-Length" in seen[before].headers  # sent binary
        assert seen[before].headers["x-request-id"] == "t"
        resp = await post(general, body, x_request_id="t")
        assert resp.status == 200
        assert (await resp.read(), resp.headers["Content-Type"]) == (lane_answer, lane_type)
    assert taken(proxy) == 2
    # OUTPUT1 asked in binary: a binary answer, as on the general path
    assert lane_type == "application/octet-stream"
    answer = json.loads(lane_answer[: int(resp.headers["Inference-Header-Content-Length"])])
    assert [o["name"] for o in answer["outputs"]] == ["OUTPUT1"]
    _, m = await scrape(proxy)
    assert (
        value(m, "v2proxy_transcode_duration_seconds_count", direction="decode", wire="json") == 3
    )
    assert (
        value(m, "v2proxy_transcode_duration_seconds_count", direction="encode", wire="json") == 2
    )
    assert (
        value(m, "v2proxy_transcode_duration_seconds_count", direction="encode", wire="binary") == 1
    )
    assert value(m, "v2proxy_backend_request_duration_seconds_count", operation="infer") == 3
    assert value(m, "v2proxy_requests_total", operation="infer", code_class="2xx") == 3
    assert value(m, "v2proxy_inflight_requests") == 0
    # malformed: the general path names the field at fault
    resp = await post(
        proxy, b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[2],"data":[1]}]}'
    )
    assert resp.status == 400
    assert "INPUT0" in (await resp.json())["error"]
    # a stage applies: an output classified by the proxy
    classified = json.loads(simple_json(list(range(16))))
    classified["outputs"] = [{"name": "OUTPUT0", "parameters": {"classification": 2}}]
    resp = await post(proxy, json.dumps(classified).encode())
    assert resp.status == 200, await resp.text()
    assert len((await resp.json())["outputs"][0]["data"]) == 2
    assert taken(proxy) == 2


async def test_the_lane_records_metrics_and_the_access_log(
    make_client: Factory,
    recorded: tuple[ProxyClient, list[Seen]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, _ = recorded
    proxy = await lane_proxy(make_client, url_of(backend), access_log=True)  # type: ignore[arg-type]
    await warm(proxy)
    with caplog.at_level(logging.INFO, logger="v2proxy.access"):
        for i in range(3):
            resp = await post(proxy, simple_json(), x_request_id=f"r{i}")
            assert resp.status == 200
    assert taken(proxy) == 3
    _, m = await scrape(proxy)  # (the warm-up request counts too)
    assert value(m, "v2proxy_requests_total", operation="infer", code_class="2xx") == 4
    assert value(m, "v2proxy_request_duration_seconds_count", operation="infer") == 4
    assert value(m, "v2proxy_backend_request_duration_seconds_count", operation="relay_infer") == 4
    assert value(m, "v2proxy_inflight_requests") == 0
    lines = [r.request for r in caplog.records if r.name == "v2proxy.access"]  # type: ignore[attr-defined]
    assert [(f["request_id"], f["status"], f["model"]) for f in lines][-3:] == [
        ("r0", 200, "simple"),
        ("r1", 200, "simple"),
        ("r2", 200, "simple"),
    ]


async def _backend(make_client: Factory, handler: Any) -> str:
    app = web.Application()
    app.router.add_post(INFER, handler)
    return url_of(await make_client(app))


async def test_a_backend_past_its_deadline_is_a_504(make_client: Factory) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.headers.get("x-sleep", "0")))
        return web.json_response({"model_name": "simple", "outputs": []})

    proxy = await lane_proxy(make_client, await _backend(make_client, slow), backend_timeout=0.3)
    await warm(proxy)
    resp = await post(proxy, simple_json(), x_sleep="2")
    assert resp.status == 504
    assert "--backend-timeout 0.3 s" in (await resp.json())["error"]
    assert taken(proxy) == 1
    assert (await post(proxy, simple_json())).status == 200  # and it serves on


@pytest.mark.parametrize(
    ("status", "answer", "expected", "message"),
    [
        (400, {"error": "bad input INPUT0"}, 400, "bad input INPUT0"),
        (404, {"error": "no such model"}, 404, "Request for unknown model: 'simple'"),
        (500, {"error": "boom"}, 500, "boom"),
        (200, "not json", 502, "invalid inference response"),
    ],
)
async def test_backend_answers_are_checked_as_on_the_general_path(
    make_client: Factory, status: int, answer: Any, expected: int, message: str
) -> None:
    async def infer(request: web.Request) -> web.Response:
        if request.headers.get("x-fail"):
            if isinstance(answer, str):
                return web.Response(body=answer.encode(), content_type="application/json")
            return web.json_response(answer, status=status)
        return web.json_response({"model_name": "simple", "outputs": []})

    proxy = await lane_proxy(make_client, await _backend(make_client, infer))
    await warm(proxy)
    resp = await post(proxy, simple_json(), x_fail="1", x_request_id="e")
    assert resp.status == expected
    assert message in (await resp.json())["error"]
    assert resp.headers["x-request-id"] == "e"
    assert taken(proxy) == 1


async def test_a_backend_that_breaks_off_is_a_502(make_client: Factory) -> None:
    async def infer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = 1000
        await resp.prepare(request)
        if request.headers.get("x-break"):
            await resp.write(b'{"outputs": [')
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write(b'{"model_name": "simple", "outputs": []}'.ljust(1000))
        return resp

    proxy = await lane_proxy(make_client, await _backend(make_client, infer))
    await warm(proxy)
    resp = await post(proxy, simple_json(), x_break="1")
    assert resp.status == 502
    assert "failed during inference" in (await resp.json())["error"]
    assert taken(proxy) == 1


async def test_a_large_answer_is_streamed_through(make_client: Factory) -> None:
    n = 200_000
    output = {"name": "X", "datatype": "INT32", "shape": [n], "data": [7] * n}
    big = {"model_name": "simple", "outputs": [output]}
    text = json.dumps(big).encode()

    async def infer(request: web.Request) -> web.Response:
        return web.Response(body=text, content_type="application/json")

    proxy = await lane_proxy(make_client, await _backend(make_client, infer))
    for _ in range(3):
        resp = await post(proxy, simple_json())
        assert resp.status == 200
        assert await resp.read() == text
    assert taken(proxy) == 2  # (the first on the general path: no connection yet)


async def test_restricted_inference_is_checked_on_the_general_path(
    make_client: Factory, recorded: tuple[ProxyClient, list[Seen]]
) -> None:
    backend, _ = recorded
    proxy = await lane_proxy(
        make_client,
        url_of(backend),  # type: ignore[arg-type]
        restricted_api="inference",
        restricted_api_header="x-key=k",
    )
    resp = await post(proxy, simple_json())
    assert resp.status == 403
    resp = await post(proxy, simple_json(), x_key="k")
    assert resp.status == 200
    assert taken(proxy) == 0


async def test_over_max_concurrency_is_a_503(make_client: Factory) -> None:
    release, holding = asyncio.Event(), asyncio.Event()

    async def infer(request: web.Request) -> web.Response:
        if request.headers.get("x-hold"):
            holding.set()
            await release.wait()
        return web.json_response({"model_name": "simple", "outputs": []})

    proxy = await lane_proxy(make_client, await _backend(make_client, infer), max_concurrency=1)
    await warm(proxy)
    held = asyncio.ensure_future(post(proxy, simple_json(), x_hold="1"))
    await asyncio.wait_for(holding.wait(), 5)
    resp = await post(proxy, simple_json())
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"
    release.set()
    assert (await held).status == 200
    assert taken(proxy) == 1


async def test_an_escaped_marker_is_never_relayed(
    make_client: Factory, recorded: tuple[ProxyClient, list[Seen]]
) -> None:
    """A shared-memory key spelled with escapes takes the decoded path: the shared-memory stage
    refuses the unknown region, and the backend sees nothing."""
    backend, seen = recorded
    proxy = await lane_proxy(make_client, url_of(backend))  # type: ignore[arg-type]
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],'
        b'"parameters":{"\\u0073hared_memory_region":"theirs","shared_memory_byte_size":64}},'
        b'{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'
    )
    await warm(proxy)
    before = len(seen)
    resp = await post(proxy, body)
    assert resp.status == 404  # as Triton answers an unknown region
    assert "theirs" in (await resp.json())["error"]
    assert taken(proxy) == 0
    assert [s for s in seen[before:] if s.path.endswith("/infer")] == []


async def test_a_client_asking_for_compression_is_left_to_the_general_path(
    make_client: Factory, recorded: tuple[ProxyClient, list[Seen]]
) -> None:
    backend, _ = recorded
    proxy = await lane_proxy(make_client, url_of(backend))  # type: ignore[arg-type]
    await warm(proxy)
    resp = await proxy.post(INFER, data=simple_json(), headers={"Accept-Encoding": "gzip"})
    assert resp.status == 200
    assert resp.headers["Content-Encoding"] == "gzip"
    assert outputs(await resp.json())["OUTPUT0"][2] == [2] * 16
    assert taken(proxy) == 0


async def test_pipelined_requests_are_answered_in_order(
    make_client: Factory, recorded: tuple[ProxyClient, list[Seen]]
) -> None:
    backend, _ = recorded
    proxy = await lane_proxy(make_client, url_of(backend))  # type: ignore[arg-type]
    await warm(proxy)
    body = simple_json(list(range(16)))
    one = (
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nx-request-id: %d\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.setblocking(False)
        await loop.sock_sendall(sock, b"".join(one % i + body for i in range(3)))
        got = b""
        while got.count(b"x-request-id") < 3 or not got.endswith(b"}"):
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
            assert chunk, got
            got += chunk
    ids = [int(part.split(b"\r\n", 1)[0]) for part in got.split(b"x-request-id: ")[1:]]
    assert ids == [0, 1, 2]
    assert got.count(b"HTTP/1.1 200 OK") == 3
    assert taken(proxy) == 1  # the first: the others came while it was served


@pytest.mark.from_source
async def test_a_failure_in_the_lane_loses_one_connection_not_the_proxy(
    make_client: Factory,
    recorded: tuple[ProxyClient, list[Seen]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, _ = recorded
    proxy = await lane_proxy(make_client, url_of(backend))  # type: ignore[arg-type]
    await warm(proxy)
    from v2proxy.http.response import HttpResponse

    real = HttpResponse.send_now

    def broken(self: HttpResponse, *args: Any) -> bool:
        raise RuntimeError("a bug")

    monkeypatch.setattr(HttpResponse, "send_now", broken)
    with pytest.raises(aiohttp.ClientError):
        await post(proxy, simple_json())
    assert taken(proxy) == 1
    assert "the quick lane failed" in caplog.text
    monkeypatch.setattr(HttpResponse, "send_now", real)
    assert (await post(proxy, simple_json())).status == 200
    _, m = await scrape(proxy)
    assert value(m, "v2proxy_requests_total", operation="infer", code_class="5xx") == 1
    assert value(m, "v2proxy_inflight_requests") == 0


async def test_a_binary_body_takes_the_lane_checked_by_the_decoder(
    make_client: Factory, recorded: tuple[ProxyClient, list[Seen]]
) -> None:
    """A binary-framed body (tritonclient's default) is checked by the full decoder and relayed
    as sent when no stage applies; its answer is the general path's; a malformed one, or one a
    stage applies to, is left to the general path (which names the field at fault)."""
    backend, seen = recorded
    proxy = await lane_proxy(make_client, url_of(backend), backend_encoding="binary")  # type: ignore[arg-type]
    general = await lane_proxy(make_client, url_of(backend), backend_encoding="binary")  # type: ignore[arg-type]
    general.frontend.quick.speaks_rest = False  # the lane off: the general path's answer
    body, headers = framed(BIN_HEADER, BLOB + BLOB)
    for client in (proxy, general):
        resp = await client.post(
            INFER, data=body, headers=headers, skip_auto_headers=["Accept-Encoding"]
        )
        assert resp.status == 200, await resp.text()
    assert taken(proxy) == 0  # a cold pool: the first on the general path
    before = len(seen)
    resp = await proxy.post(
        INFER,
        data=body,
        headers={**headers, "x-request-id": "b"},
        skip_auto_headers=["Accept-Encoding"],
    )
    assert resp.status == 200
    assert taken(proxy) == 1
    assert resp.headers["x-request-id"] == "b"
    lane_answer = await resp.read()
    assert (
        seen[before].headers["Inference-Header-Content-Length"]
        == headers["Inference-Header-Content-Length"]
    )
    resp = await general.post(
        INFER, data=body, headers=headers, skip_auto_headers=["Accept-Encoding"]
    )
    assert await resp.read() == lane_answer  # the backend's bytes, both ways
    _, m = await scrape(proxy)
    assert (
        value(m, "v2proxy_transcode_duration_seconds_count", direction="decode", wire="binary") == 2
    )
    # malformed: one byte short of its binary_data_size
    bad, bad_headers = framed(BIN_HEADER, BLOB + BLOB[:-1])
    resp = await proxy.post(
        INFER, data=bad, headers=bad_headers, skip_auto_headers=["Accept-Encoding"]
    )
    assert resp.status == 400
    assert taken(proxy) == 1
    # a stage applies: an output classified by the proxy
    classified = {
        **BIN_HEADER,
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}],
    }
    body, headers = framed(classified, BLOB + BLOB)
    resp = await proxy.post(
        INFER, data=body, headers=headers, skip_auto_headers=["Accept-Encoding"]
    )
    assert resp.status == 200, await resp.text()
    assert taken(proxy) == 1


async def test_the_lane_obeys_the_one_decision(
    make_client: Factory,
    recorded: tuple[ProxyClient, list[Seen]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lane decides with the core's one function (``relays``), from the backend's facts:
    when they say no JSON body goes as sent, a body the lane would relay goes to the general
    path, which asks them again and transcodes. (The compiled lane calls ``relays`` natively:
    the facts are what a test can change.)"""
    backend, _ = recorded
    proxy = await lane_proxy(make_client, url_of(backend))  # type: ignore[arg-type]
    await warm(proxy)
    asked: list[str] = []
    never_json = RelayFacts(True, False, 0, False, True, 0, False)
    assert relays(JSON, 1, never_json) is False

    def facts(model: str, version: str) -> RelayFacts:
        asked.append(model)
        return never_json

    monkeypatch.setattr(proxy.frontend.quick.backend, "relay_facts", facts)
    resp = await post(proxy, simple_json(list(range(16))))
    assert resp.status == 200, await resp.text()
    assert outputs(await resp.json())["OUTPUT0"][2] == [i + 1 for i in range(16)]
    assert taken(proxy) == 0
    # the lane's, then the general path's
    assert asked[:2] == ["simple", "simple"]
    _, m = await scrape(proxy)
    assert value(m, "v2proxy_backend_request_duration_seconds_count", operation="infer") == 1
