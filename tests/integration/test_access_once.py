"""The access policy (``--restricted-api``) is checked exactly once per request, by the frontend
as it admits it: on every route of the REST frontend (``v2proxy.frontends.routes``: MindIE's
``/infer`` and a passed-through request included, each once where its handler's order puts it)
and every RPC of the gRPC frontend (``v2proxy.frontends.grpc_routes``: a ``ModelStreamInfer``
stream once, however many messages it carries; ``grpc.health.v1`` ``Check`` once per call,
``Watch`` once per stream), never again on the way (the pipeline checks nothing: a mapped
generate, a MindIE or OpenAI generation, the proxy's own look-ups).

Both frontends run in this process in front of the builtin models, on loopback ports, with a
policy that counts its checks (:class:`Counting`: every group counted, the decision left to a
real :class:`~v2proxy.core.restricted.RestrictedPolicy`). Each route and RPC is driven once in
three ways: every group restricted and the client sending the header (served), every group
restricted without it (refused: 403 in the route's API's shape; gRPC ``PERMISSION_DENIED``;
health ``NOT_SERVING``; a stream's every message refused in band, or as its status), and
nothing restricted (served). Each time exactly one check, for the row's group.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from tests.integration.conftest import Factory, ProxyClient, settings
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy._proto import health_pb2
from v2proxy._proto.service import UNARY_RPCS
from v2proxy.app_core import build_pipeline
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.restricted import GROUPS, OPEN, Headers, RestrictedPolicy, passthrough_group
from v2proxy.frontends import routes
from v2proxy.frontends.grpc import GrpcFrontend
from v2proxy.frontends.grpc_routes import RPCS
from v2proxy.frontends.rest import RestFrontend

KEY, SECRET = "x-admin-key", "s3cret"
REFUSED = f"This API is restricted, expecting header '{KEY}'"
#: every group restricted, opened by the header
CLOSED = RestrictedPolicy(GROUPS, (KEY, SECRET))
#: the three ways: (the policy that decides, whether the client sends the header, served)
MODES = {
    "restricted+header": (CLOSED, True, True),
    "restricted": (CLOSED, False, False),
    "open": (OPEN, False, True),
}


class Counting:
    """An AccessPolicy that counts every check (``restricts`` is True for every group, so no
    check is skipped) and leaves the decision to ``inner``."""

    def __init__(self, inner: RestrictedPolicy) -> None:
        self.inner = inner
        self.checks: Counter[str] = Counter()

    def restricts(self, group: str) -> bool:
        return True

    def check(self, group: str, headers: Headers) -> None:
        self.checks[group] += 1
        self.inner.check(group, headers)

    def take(self) -> Counter[str]:
        checks, self.checks = self.checks, Counter()
        return checks


def _pipeline() -> Pipeline:
    return build_pipeline(settings(), BuiltinBackend(), cuda_adapter=None)


# --------------------------------------------------------------------------- REST

ONES = [1] * 16
SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": ONES},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": ONES},
    ]
}
_M = "/v2/models/{model}[/versions/{version}]"
_SHM = "/v2/{kind}sharedmemory[/region/{name}]"
_GENERATE = {"text_input": "one two", "max_tokens": 2}

#: (row template, method) -> (a path of it, a body: served when the client may use it)
REST: dict[tuple[str, str], tuple[str, Any]] = {
    (_M + "/infer", "POST"): ("/v2/models/simple/infer", SIMPLE),
    # mapped onto the llm's stream_infer (the builtin backend has no generate of its own)
    (_M + "/generate", "POST"): ("/v2/models/llm/generate", _GENERATE),
    (_M + "/generate_stream", "POST"): ("/v2/models/llm/generate_stream", _GENERATE),
    ("/v2/health/live", "GET"): ("/v2/health/live", None),
    ("/v2/health/ready", "GET"): ("/v2/health/ready", None),
    ("/v2[/]", "GET"): ("/v2", None),
    (_M + "/ready", "GET"): ("/v2/models/simple/ready", None),
    (_M + "/config", "GET"): ("/v2/models/simple/config", None),
    ("/v2/models[/{model}[/versions/{version}]]/stats", "GET"): ("/v2/models/stats", None),
    ("/v2/repository/index", "POST"): ("/v2/repository/index", {}),
    ("/v2/repository/models/{model}/{action}", "POST"): (
        "/v2/repository/models/simple/load",
        {},
    ),
    ("/v2[/models/{model}]/trace/setting", "GET"): ("/v2/trace/setting", None),
    ("/v2[/models/{model}]/trace/setting", "POST"): ("/v2/models/simple/trace/setting", {}),
    ("/v2/logging", "GET"): ("/v2/logging", None),
    ("/v2/logging", "POST"): ("/v2/logging", {"log_info": True}),
    (_M, "GET"): ("/v2/models/simple", None),
    (_SHM + "/status", "GET"): ("/v2/systemsharedmemory/status", None),
    # no such region: its 400 is the handler's, once the client was let in
    (_SHM + "/register", "POST"): (
        "/v2/systemsharedmemory/region/r/register",
        {"key": "/v2proxy_test_access_none", "offset": 0, "byte_size": 16},
    ),
    (_SHM + "/unregister", "POST"): ("/v2/cudasharedmemory/unregister", None),
    ("/infer", "POST"): ("/infer", {"inputs": "one two", "parameters": {"max_new_tokens": 2}}),
    ("/v1/models", "GET"): ("/v1/models", None),
    ("/v1/models/{id}", "GET"): ("/v1/models/llm", None),
    ("/v1/completions", "POST"): (
        "/v1/completions",
        {"model": "llm", "prompt": "one two", "max_tokens": 2},
    ),
    ("/v1/chat/completions", "POST"): (
        "/v1/chat/completions",
        {"model": "llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ),
    ("/openapi.json", "GET"): ("/openapi.json", None),
    # no row matches: passed through (the builtin backend has nothing to pass it to)
    (routes.PASSTHROUGH.template, "POST"): ("/v2/models/simple/extension", {}),
}


@dataclass(frozen=True)
class RestCase:
    route: routes.Route
    method: str
    path: str
    body: Any

    @property
    def id(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def group(self) -> str | None:
        if self.route is routes.PASSTHROUGH:
            return passthrough_group(self.path)
        return self.route.group


def _rest_cases() -> list[RestCase]:
    rows = {row.template: row for row in (*routes.ROUTES, routes.PASSTHROUGH)}
    return [
        RestCase(rows[template], method, path, body)
        for (template, method), (path, body) in REST.items()
    ]


def test_every_route_and_method_has_a_case() -> None:
    wanted = {(row.template, m) for row in routes.ROUTES for m in row.methods}
    assert set(REST) - {(routes.PASSTHROUGH.template, "POST")} == wanted


@pytest.fixture
async def rest(make_client: Factory) -> tuple[ProxyClient, Counting]:
    """The REST frontend in front of the builtin models, checking with a counting policy."""
    counting = Counting(CLOSED)
    s = settings()
    frontend = RestFrontend(_pipeline(), s.max_input_size, s.max_body_size, access=counting)
    return await make_client(frontend), counting


def _refusal(shape: str, answer: Any) -> str:
    """The message of a 403 in the shape of the route's API."""
    if shape == "openai":
        assert answer["error"]["type"] == "permission_error", answer
        return str(answer["error"]["message"])
    if shape == "mindie":
        assert set(answer) == {"error", "error_type"}, answer
    else:
        assert set(answer) == {"error"}, answer
    return str(answer["error"])


@pytest.mark.parametrize("mode", list(MODES))
async def test_each_rest_request_is_checked_once(
    rest: tuple[ProxyClient, Counting], mode: str
) -> None:
    client, counting = rest
    counting.inner, header, served = MODES[mode]
    headers = {KEY: SECRET} if header else {}
    statuses: dict[str, int] = {}
    for case in _rest_cases():
        data = None if case.body is None else json.dumps(case.body).encode()
        async with client.request(case.method, case.path, data=data, headers=headers) as resp:
            status, body = resp.status, await resp.read()
        checks = counting.take()
        statuses[case.path] = status
        if case.group is None:  # the proxy's own document: no group
            assert (status, checks) == (200, Counter()), case.id
            continue
        assert checks == Counter({case.group: 1}), (case.id, checks)
        if served:
            assert status != 403, (case.id, body)
            assert status < 500 or status == 501, (case.id, status, body)
        else:
            assert status == 403, (case.id, status, body)
            assert _refusal(case.route.errors, json.loads(body)) == REFUSED, case.id
    if served:  # the inferences and generations went all the way
        llm = ("/v2/models/llm/generate", "/v2/models/llm/generate_stream", "/infer")
        for path in ("/v2/models/simple/infer", *llm, "/v1/completions", "/v1/chat/completions"):
            assert statuses[path] == 200, path


async def test_a_method_the_route_lacks_is_not_checked(
    rest: tuple[ProxyClient, Counting],
) -> None:
    client, counting = rest
    for path, method in (("/v2/models/simple/infer", "GET"), ("/v2/logging", "PUT")):
        async with client.request(method, path) as resp:
            assert resp.status == 405
        assert counting.take() == Counter()


# --------------------------------------------------------------------------- gRPC


@asynccontextmanager
async def _grpc(counting: Counting) -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(GrpcFrontend(_pipeline(), access=counting).handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)


def _infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(ONES)
    return request


#: each unary RPC of inference.GRPCInferenceService -> a request that it serves
UNARY: dict[str, Any] = {
    "ServerLive": pb.ServerLiveRequest(),
    "ServerReady": pb.ServerReadyRequest(),
    "ModelReady": pb.ModelReadyRequest(name="simple"),
    "ServerMetadata": pb.ServerMetadataRequest(),
    "ModelMetadata": pb.ModelMetadataRequest(name="simple"),
    "ModelInfer": _infer_request(),
    "ModelConfig": pb.ModelConfigRequest(name="simple"),
    "ModelStatistics": pb.ModelStatisticsRequest(name="simple"),
    "RepositoryIndex": pb.RepositoryIndexRequest(),
    "RepositoryModelLoad": pb.RepositoryModelLoadRequest(model_name="simple"),
    "RepositoryModelUnload": pb.RepositoryModelUnloadRequest(model_name="identity_fp32"),
    "SystemSharedMemoryStatus": pb.SystemSharedMemoryStatusRequest(),
    "SystemSharedMemoryRegister": pb.SystemSharedMemoryRegisterRequest(
        name="r", key="/v2proxy_test_access_none", byte_size=16
    ),
    "SystemSharedMemoryUnregister": pb.SystemSharedMemoryUnregisterRequest(),
    "CudaSharedMemoryStatus": pb.CudaSharedMemoryStatusRequest(),
    "CudaSharedMemoryRegister": pb.CudaSharedMemoryRegisterRequest(name="c", byte_size=16),
    "CudaSharedMemoryUnregister": pb.CudaSharedMemoryUnregisterRequest(),
    "TraceSetting": pb.TraceSettingRequest(),
    "LogSettings": pb.LogSettingsRequest(),
}
#: the RPCs exercised below besides the unary ones of the table
STREAMS = {"ModelStreamInfer", "Check", "Watch"}


def test_every_rpc_has_a_case() -> None:
    assert set(UNARY) == set(UNARY_RPCS)
    assert set(UNARY) | STREAMS == set(RPCS)


def _metadata(header: bool, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return ((KEY, SECRET), *extra) if header else extra


async def unary(
    channel: grpc.aio.Channel, name: str, request: Any, metadata: tuple[tuple[str, str], ...]
) -> tuple[grpc.StatusCode, str]:
    """One call of the unary RPC ``name``: its status code and details."""
    _req, resp_type = UNARY_RPCS[name]
    call = channel.unary_unary(
        f"/inference.GRPCInferenceService/{name}",
        request_serializer=type(request).SerializeToString,
        response_deserializer=resp_type.FromString,
    )
    try:
        await call(request, metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("mode", list(MODES))
async def test_each_unary_rpc_is_checked_once(mode: str) -> None:
    inner, header, served = MODES[mode]
    counting = Counting(inner)
    async with _grpc(counting) as channel:
        for name, request in UNARY.items():
            code, details = await unary(channel, name, request, _metadata(header))
            assert counting.take() == Counter({RPCS[name].group: 1}), name
            if served:
                assert code != grpc.StatusCode.PERMISSION_DENIED, (name, details)
                assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), name
            else:
                assert (code, details) == (grpc.StatusCode.PERMISSION_DENIED, REFUSED), name


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("as_status", [False, True], ids=["in-band", "triton_grpc_error"])
async def test_a_stream_is_checked_once_whatever_it_carries(mode: str, as_status: bool) -> None:
    """Three messages on one ModelStreamInfer stream: one check, as the stream opens; refused,
    each message is answered with the refusal (in band), or the stream ends with it at the first
    message (the client then writes that one alone: a write racing the stream's end makes grpc's
    client report INTERNAL in place of the status it was given)."""
    inner, header, served = MODES[mode]
    counting = Counting(inner)
    extra = (("triton_grpc_error", "true"),) if as_status else ()
    async with _grpc(counting) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        metadata = _metadata(header, *extra)
        if as_status and not served:  # one message written, and no end of writing
            stream = call(None, metadata=metadata, timeout=10)
            await stream.write(_infer_request())
        else:
            stream = call(iter([_infer_request()] * 3), metadata=metadata, timeout=10)
        answers: list[pb.ModelStreamInferResponse] = []
        code = grpc.StatusCode.OK
        try:
            async for answer in stream:
                answers.append(answer)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details()
            assert (code, details) == (grpc.StatusCode.PERMISSION_DENIED, REFUSED)
    assert counting.take() == Counter({"inference": 1})
    if served:
        assert code == grpc.StatusCode.OK
        assert [a.error_message for a in answers] == [""] * 3
        assert all(a.infer_response.outputs[0].name == "OUTPUT0" for a in answers)
    elif as_status:
        assert code == grpc.StatusCode.PERMISSION_DENIED
    else:
        assert code == grpc.StatusCode.OK
        assert [a.error_message for a in answers] == [REFUSED] * 3


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize("mode", list(MODES))
async def test_health_is_checked_once_per_call_and_per_watch(mode: str) -> None:
    """A refused health caller is told NOT_SERVING (a probe's reading), not an error."""
    inner, header, served = MODES[mode]
    counting = Counting(inner)
    wanted = SERVING if served else NOT_SERVING
    async with _grpc(counting) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        answer = await check(health_pb2.HealthCheckRequest(), metadata=_metadata(header))
        assert answer.status == wanted
        assert counting.take() == Counter({"health": 1})
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        stream = watch(health_pb2.HealthCheckRequest(), metadata=_metadata(header))
        first = await asyncio.wait_for(stream.read(), 10)
        assert first.status == wanted
        stream.cancel()
    assert counting.take() == Counter({"health": 1})
