"""Helpers shared by the backends (the interface itself, :class:`v2proxy.pipeline.Backend`,
belongs to the pipeline that calls it)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from v2proxy.codecs.json import dumps, loads
from v2proxy.errors import ProxyError, Unsupported
from v2proxy.pipeline import Body, ForwardResponse

#: (method, path match, parsed JSON body) -> the JSON answer
SideHandler = Callable[[str, "re.Match[str]", Any], Awaitable[Any]]

_MV = r"(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"
#: The v2 REST side endpoints that a backend which does not speak REST answers itself:
#: (name, path pattern, methods). Each such backend maps the names to its handlers.
SIDE_ENDPOINTS: list[tuple[str, re.Pattern[str], frozenset[str]]] = [
    ("stats", re.compile(r"/v2/models/stats(?P<model>)(?P<version>)"), frozenset({"GET"})),
    ("stats", re.compile(rf"/v2/models/{_MV}/stats"), frozenset({"GET"})),
    ("index", re.compile(r"/v2/repository/index"), frozenset({"POST"})),
    (
        "load",
        re.compile(r"/v2/repository/models/(?P<model>[^/]+)/(?P<action>load|unload)"),
        frozenset({"POST"}),
    ),
    (
        "trace",
        re.compile(r"/v2/(?:models/(?P<model>[^/]+)/)?trace/setting"),
        frozenset({"GET", "POST"}),
    ),
    ("logging", re.compile(r"/v2/logging"), frozenset({"GET", "POST"})),
]


async def single_chunk(data: bytes) -> AsyncIterator[bytes]:
    """A body stream of one chunk."""
    yield data


class DecodedOnly:
    """For backends that take decoded requests only: nothing is relayed as bytes."""

    async def can_relay(self, binary: bool) -> bool:
        return False

    async def relay_infer(
        self, model: str, version: str, body: Body, ihcl: int | None, headers: dict[str, str]
    ) -> ForwardResponse:
        raise Unsupported("this backend takes decoded requests only")


def json_answer(status: int, obj: Any) -> ForwardResponse:
    """A complete JSON answer as a ForwardResponse."""
    return ForwardResponse(status, [("Content-Type", "application/json")], single_chunk(dumps(obj)))


async def answer_side(
    method: str,
    path_qs: str,
    body: bytes | bytearray,
    handlers: Mapping[str, SideHandler],
    other_v2: tuple[int, str] = (404, "Not Found"),
) -> ForwardResponse:
    """Answer a side endpoint with the backend's ``handlers``; errors become JSON answers with
    their status. Paths under /v2 that are not side endpoints get ``other_v2``."""
    path = path_qs.split("?", 1)[0]
    for name, pattern, methods in SIDE_ENDPOINTS:
        m = pattern.fullmatch(path)
        if m is None:
            continue
        if method not in methods:
            return json_answer(405, {"error": "Method Not Allowed"})
        try:
            obj = loads(body) if body.strip() else {}
            return json_answer(200, await handlers[name](method, m, obj))
        except ProxyError as exc:
            return json_answer(exc.http_status, {"error": exc.message})
    if path.startswith("/v2/"):
        return json_answer(other_v2[0], {"error": other_v2[1]})
    return json_answer(404, {"error": "Not Found"})
