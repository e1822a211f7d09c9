"""The shared-memory endpoints of the REST frontend (docs/protocol.md, shared memory), each one
call of the pipeline (group ``shared-memory``)."""

from __future__ import annotations

import re
from urllib.parse import unquote

from v2proxy.codecs import side
from v2proxy.codecs.json import dumps
from v2proxy.core.errors import InvalidRequest
from v2proxy.core.pipeline import Pipeline
from v2proxy.frontends.exchange import Exchange
from v2proxy.frontends.rest_answer import Answer
from v2proxy.frontends.rest_request import BodyReader, peer_of
from v2proxy.http.request import HttpRequest

_JSON = (b"content-type", b"application/json")


def _name(m: re.Match[str]) -> str:
    return unquote(m.group("name") or "")


class SharedMemoryEndpoints:
    """The shared-memory endpoints on top of the pipeline."""

    __slots__ = ("pipeline", "read_body")

    def __init__(self, pipeline: Pipeline, body: BodyReader) -> None:
        self.pipeline = pipeline
        self.read_body = body.read

    async def status(self, r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        kind, name = m.group("kind"), _name(m)
        regions = await self.pipeline.shm_status(kind, name, peer_of(r))
        return 200, [_JSON], dumps(regions)

    async def register(self, r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        name, kind = _name(m), m.group("kind")
        body = await self.read_body(r)
        if not name:
            raise InvalidRequest(
                f"'region name' is necessary to register {kind} shared memory region"
            )
        if kind == "cuda":
            handle, device_id, size = side.cuda_register_body(body)
            await self.pipeline.cuda_shm_register(name, handle, device_id, size, peer_of(r))
        else:
            key, offset, byte_size = side.shm_register_body(body)
            await self.pipeline.shm_register(name, key, offset, byte_size, peer_of(r))
        return 200, [_JSON], b""

    async def unregister(self, r: HttpRequest, m: re.Match[str], _x: Exchange) -> Answer:
        kind, name = m.group("kind"), _name(m)
        await self.pipeline.shm_unregister(kind, name, peer_of(r))
        return 200, [_JSON], b""
