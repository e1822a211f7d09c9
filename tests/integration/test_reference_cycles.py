"""What a closed connection and a failed gRPC call leave to the garbage collector: nothing of
v2proxy's. A reference cycle is freed only by the collector, whose full passes are rare in a
long-running process; meanwhile memory creeps up (the soak found this: a lost HTTP connection
kept its parser, which calls back into it; a failed gRPC call kept its exception, whose
traceback holds the handler's frame, and grpc's own call state kept the abort exception).

Each case does its work once (imports, caches), then again with ``gc.DEBUG_SAVEALL`` on, so
that every object a collection finds in a cycle is kept in ``gc.garbage`` to be looked at."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from types import FrameType, MethodType

import grpc
import pytest
import uvloop

from tests.integration.conftest import settings
from v2proxy._proto import grpc_service_pb2 as pb
from v2proxy.app import build_grpc_server
from v2proxy.app_core import build_pipeline
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.http.request import HttpRequest
from v2proxy.http.response import HttpResponse
from v2proxy.http.server import HttpServer, ServerLimits

LOOPS = {"uvloop": uvloop.run, "asyncio": asyncio.run}


def _name(o: object) -> str:
    if isinstance(o, FrameType):
        return f"frame {o.f_code.co_qualname}"
    if isinstance(o, MethodType):
        func = o.__func__  # (a compiled function has no __qualname__: its class and name)
        return f"method {getattr(func, '__qualname__', None) or type(o.__self__).__qualname__}"
    return type(o).__qualname__


def _cyclic_garbage(work: Callable[[], Awaitable[None]], run: Callable[..., None]) -> list[str]:
    """The type names of the objects collected from cycles while ``work`` runs (after it ran
    once before, unobserved)."""
    found: list[str] = []

    async def main() -> None:
        await work()
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            await work()
            await asyncio.sleep(0.1)
            gc.collect()
            found.extend(_name(o) for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    run(main())
    return found


async def _answer(req: HttpRequest, resp: HttpResponse) -> None:
    await req.read()
    await resp.send(200, [(b"content-type", b"text/plain")], b"ok")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_closed_http_connection_leaves_no_cycle(loop: str) -> None:
    async def work() -> None:
        server = HttpServer(_answer, ServerLimits())
        port = await server.start("127.0.0.1", 0)
        for _ in range(5):  # each on its own connection: three requests, then the client closes
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(3):
                writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi")
                assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 OK\r\n")
            writer.close()
            await writer.wait_closed()
        await asyncio.sleep(0.1)
        await server.close(1)

    garbage = _cyclic_garbage(work, LOOPS[loop])
    ours = {"Connection", "HttpRequestParser", "HttpRequest", "HttpResponse", "TimerHandle"}
    assert [name for name in garbage if name in ours] == []


def test_a_failed_grpc_call_leaves_no_cycle() -> None:
    async def work() -> None:
        s = settings()
        server = build_grpc_server(s, build_pipeline(s, BuiltinBackend()))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                request = pb.ModelInferRequest(model_name="nosuch").SerializeToString()
                for _ in range(5):
                    try:  # not pytest.raises: what it keeps makes a cycle of its own
                        await infer(request)
                        got = None
                    except grpc.aio.AioRpcError as exc:
                        got = (exc.code(), exc.details())
                    assert got == (
                        grpc.StatusCode.NOT_FOUND,
                        "Request for unknown model: 'nosuch' is not found",
                    )
        finally:
            await server.stop(0)

    garbage = _cyclic_garbage(work, uvloop.run)
    ours = {"NotFound", "AbortError", "traceback", "ModelInferRequest"}
    assert [name for name in garbage if name in ours or name.startswith("frame")] == []


@pytest.mark.parametrize("loop", LOOPS)
def test_the_quick_lane_leaves_no_cycle(loop: str) -> None:
    """Each request the quick lane relays leaves nothing to the collector: its exchange, the
    backend call and the callbacks between them let go of each other once it is answered."""
    from v2proxy.app import build_http_server, build_rest
    from v2proxy.app_core import build_backend

    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,'
        b'1,1,1,1,1,1,1,1]},{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,'
        b"1,1,1,1,1,1,1,1,1,1,1]}]}"
    )
    request = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s"

    async def work() -> None:
        s = settings()
        reference = HttpServer(build_rest(s, build_pipeline(s, BuiltinBackend())).dispatch)
        ref_port = await reference.start("127.0.0.1", 0)
        s = settings(backend=f"http://127.0.0.1:{ref_port}")
        frontend = build_rest(s, build_pipeline(s, build_backend(s)))
        await frontend.pipeline.backend.start()
        server = build_http_server(s, frontend)
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(5):
            writer.write(request % (len(body), body))
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        assert frontend.quick.taken >= 4  # (the first opens the backend connection)
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.1)
        await server.close(1)
        await frontend.pipeline.backend.close()
        await reference.close(1)

    garbage = _cyclic_garbage(work, LOOPS[loop])
    # (the frontends built and dropped by ``work`` are cycles of their own, with their handlers)
    per_request = ("_Exchange", "RelayCall", "HttpRequest", "ForwardResponse", "ClientResponse")
    assert [n for n in garbage if n.removeprefix("method ").startswith(per_request)] == []
