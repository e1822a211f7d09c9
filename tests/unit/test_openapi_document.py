"""The OpenAPI document of v2proxy's REST API (src/v2proxy/openapi.yaml): a valid OpenAPI 3.1
document (schemathesis' own loader and validator), naming exactly the routes of the REST
frontend's route table (``v2proxy.frontends.routes``), with the answers every operation can give
documented.

Also the regressions of what schemathesis found (tests/interop/test_openapi_schemathesis.py):
the builtin llm's bounded generation and the checked trace/log settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.codecs import settings, side
from v2proxy.codecs.generate import parse_body
from v2proxy.core.errors import InvalidRequest
from v2proxy.core.pipeline import Pipeline
from v2proxy.frontends import routes
from v2proxy.frontends.openapi import document, document_json
from v2proxy.frontends.rest import RestFrontend
from v2proxy.reference.models import LLM_MAX_OUTPUT_CHARS, LLM_MAX_TOKENS, iter_llm_tokens

#: a value for each path parameter when a documented path is turned into a request path
SAMPLES = {"model": "simple", "version": "1", "name": "region0", "id": "llm"}
#: routes outside the table: /metrics is answered before routing
OUTSIDE_TABLE = {("GET", "/metrics")}
#: groups that --restricted-api may restrict: every operation but these documents 403
NEVER_RESTRICTED = {"/metrics", "/openapi.json"}
#: routes answered by v2proxy from its own settings, never by the backend, and never refused by
#: --max-concurrency (the metadata group): no backend fault (502, 503, 504) to document
OWN_ANSWERS = {"/v1/models", "/v1/models/{id}"}
#: routes answered 400 by v2proxy itself whatever the request (no success, no backend call):
#: Triton's shared-memory register without a region name
ALWAYS_REFUSED = {
    ("POST", "/v2/systemsharedmemory/register"),
    ("POST", "/v2/cudasharedmemory/register"),
}
#: a frontend whose route table the documented operations are matched against
_FE = RestFrontend(Pipeline(BuiltinBackend(), 1 << 20), 1 << 20, 1 << 20)


@dataclass
class _Request:
    method: str
    path: str


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, ops in document()["paths"].items()
        for method, op in ops.items()
    ]


def _concrete(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: SAMPLES[m.group(1)], path)


def test_document_is_valid_openapi() -> None:
    doc = document()
    assert doc["openapi"].startswith("3.1")
    schema = schemathesis.openapi.from_dict(doc)
    schema.validate()  # the OpenAPI 3.1 meta-schema: raises on any violation
    ids = [op["operationId"] for _, _, op in _operations()]
    assert len(ids) == len(set(ids))


def test_served_json_is_the_document() -> None:
    import json

    assert json.loads(document_json()) == document()
    assert document_json() is document_json()  # encoded once


def test_every_documented_operation_is_routed() -> None:
    for method, path, _ in _operations():
        if (method, path) in OUTSIDE_TABLE:
            continue
        handler, match, _op = _FE.find(_Request(method, _concrete(path)))  # type: ignore[arg-type]
        assert match is not None, f"{method} {path} is passed through, not served"
        assert handler is not _FE.method_not_allowed, f"{method} {path} answers 405"


#: route template parameters the document spells out as their words
WORDS = {"{kind}": ("system", "cuda"), "{action}": ("load", "unload")}


def _documented_paths(template: str) -> set[str]:
    """The document's paths of a route template (``v2proxy.frontends.routes``): each optional
    ``[...]`` part taken and left out, ``{kind}`` and ``{action}`` spelled out as their words,
    the other parameters kept; a trailing ``[/]`` is tolerated, not documented."""
    template = template.removesuffix("[/]")
    i = template.find("[")
    if i < 0:
        paths = {template}
        for param, words in WORDS.items():
            paths = {p.replace(param, w) for p in paths for w in words}
        return paths
    depth = 0
    for j in range(i, len(template)):
        depth += {"[": 1, "]": -1}.get(template[j], 0)
        if depth == 0:
            break
    head, inner, rest = template[:i], template[i + 1 : j], template[j + 1 :]
    return _documented_paths(head + inner + rest) | _documented_paths(head + rest)


def test_documented_paths_of_a_template() -> None:
    assert _documented_paths("/v2/models[/{model}[/versions/{version}]]/stats") == {
        "/v2/models/stats",
        "/v2/models/{model}/stats",
        "/v2/models/{model}/versions/{version}/stats",
    }
    assert _documented_paths("/v2/{kind}sharedmemory[/region/{name}]/status") == {
        "/v2/systemsharedmemory/status",
        "/v2/cudasharedmemory/status",
        "/v2/systemsharedmemory/region/{name}/status",
        "/v2/cudasharedmemory/region/{name}/status",
    }
    assert _documented_paths("/v2[/]") == {"/v2"}


def test_the_document_has_exactly_the_route_tables_routes() -> None:
    # every (method, path) of the route table (and GET /metrics, answered before it) is in the
    # document, and the document has no other; HEAD is GET's head (RFC 9110), not documented
    table = {
        (method, path)
        for row in (*routes.ROUTES, routes.METRICS)
        for method in row.methods
        if method != "HEAD"
        for path in _documented_paths(row.template)
    }
    documented = {(m, p) for m, p, _ in _operations()}
    assert not table - documented, f"routes missing from the document: {sorted(table - documented)}"
    assert not documented - table, f"documented, not routed: {sorted(documented - table)}"


def test_answers_documented() -> None:
    for method, path, op in _operations():
        codes = set(op["responses"])
        assert "default" not in codes, f"{method} {path}: every status is listed"
        if (method, path) in ALWAYS_REFUSED:
            assert codes == {"400", "403", "413", "503"}, f"{method} {path}"
            continue
        assert any(c.startswith("2") for c in codes)
        if path in NEVER_RESTRICTED:
            assert "403" not in codes
            continue
        assert "403" in codes, f"{method} {path}: any API group may be restricted"
        if path in OWN_ANSWERS:
            assert not {"502", "503", "504"} & codes, f"{method} {path}: no backend call"
        elif path != "/infer":
            assert {"502", "503", "504"} <= codes, f"{method} {path}: backend faults"
        if "requestBody" in op:
            assert "413" in codes, f"{method} {path}: --max-body-size"


def test_binary_tensor_extension_described() -> None:
    op = document()["paths"]["/v2/models/{model}/infer"]["post"]
    assert set(op["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    names = {p.get("name") or p["$ref"].rsplit("/", 1)[1] for p in op["parameters"]}
    assert "InferenceHeaderContentLength" in names
    ok = op["responses"]["200"]
    assert set(ok["content"]) == {"application/json", "application/octet-stream"}
    assert "Inference-Header-Content-Length" in ok["headers"]
    stream = document()["paths"]["/v2/models/{model}/generate_stream"]["post"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    metrics = document()["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(metrics) == {"text/plain"}


# ------------------------------------------------------------------ regressions


def test_llm_generation_is_bounded() -> None:
    # max_tokens came unchecked from MindIE's /infer (up to INT32_MAX): the toy model built a
    # list of that many strings on the event loop, and the proxy stopped answering
    assert len(list(iter_llm_tokens("a b", LLM_MAX_TOKENS))) == LLM_MAX_TOKENS
    word = "w" * (LLM_MAX_OUTPUT_CHARS // 8)
    with pytest.raises(InvalidRequest, match="would generate"):
        list(iter_llm_tokens(word, 16))


async def test_builtin_llm_refuses_too_many_tokens() -> None:
    from v2proxy.backends.builtin import BuiltinBackend
    from v2proxy.codecs.dtypes import serialize_bytes
    from v2proxy.core.model import Datatype, InferRequest, Tensor

    backend = BuiltinBackend()
    request = InferRequest(
        model_name="llm",
        inputs=[
            Tensor("text_input", Datatype.BYTES, (1,), serialize_bytes([b"a"])),
            Tensor("max_tokens", Datatype.INT32, (1,), (2**31 - 1).to_bytes(4, "little")),
        ],
    )
    with pytest.raises(InvalidRequest, match="must be at most 1000000"):
        async for _ in backend.stream_infer(request, []):
            pass


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"log_format": {}}, "Invalid value for 'log_format'"),
        ({"log_format": ""}, "expected default or ISO8601"),
        ({"log_info": 1}, "Invalid value for 'log_info': expected a boolean"),
        ({"log_verbose_level": -1}, "Invalid value for 'log_verbose_level'"),
        ({"log_verbose_level": 2**70}, "Invalid value for 'log_verbose_level'"),
        ({"log_file": 5}, "Invalid value for 'log_file': expected a string"),
    ],
)
def test_log_settings_checked(update: dict[str, Any], message: str) -> None:
    for strict in (True, False):
        with pytest.raises(InvalidRequest, match=re.escape(message)):
            settings.log_update(update, strict=strict)


def test_log_settings_unknown_keys() -> None:
    with pytest.raises(InvalidRequest, match="Unknown log setting 'x'"):
        settings.log_update({"x": [{}]})
    assert settings.log_update({"x": [{}]}, strict=False) == {"x": [{}]}
    good = {"log_info": False, "log_verbose_level": 1, "log_format": "ISO8601"}
    assert settings.log_update(good) == good


def test_trace_settings_checked() -> None:
    with pytest.raises(InvalidRequest, match="Unknown trace setting 'x-schemathesis'"):
        settings.trace_update({"x-schemathesis": [{}]})
    with pytest.raises(InvalidRequest, match="'trace_level'"):
        settings.trace_update({"trace_level": ["LOUD"]})
    with pytest.raises(InvalidRequest, match="'trace_rate': expected a string"):
        settings.trace_update({"trace_rate": 5})
    assert settings.trace_update(
        {"trace_level": "TIMESTAMPS", "trace_rate": ["10"], "trace_file": None}
    ) == {"trace_level": ["TIMESTAMPS"], "trace_rate": "10"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "failed to parse"),
        (b"false", "the generate request must be a JSON object"),
        (b'{"parameters": []}', "Expected JSON object for keyword: 'parameters'"),
        (b'{"v\\u0000": 1}', "must not contain NUL"),
        (b'{"parameters": {"k\\u0000": 1}}', "must not contain NUL"),
    ],
)
def test_generate_bodies_triton_fails_on_are_refused(body: bytes, message: str) -> None:
    # passed through, Triton answers each of these with 500
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        parse_body(body)
    assert parse_body(b'{"text_input": "a", "parameters": {"k": 1}}')["parameters"] == {"k": 1}


def test_load_parameters_are_strings() -> None:
    # Triton's REST load answers a parameter that is no string with 500
    with pytest.raises(InvalidRequest, match="the value of 'config' must be a string"):
        side.check_load_parameters({"config": {"max_batch_size": 8}})
    side.check_load_parameters({"config": "{}", "file:1/model.py": "cHJpbnQ="})
