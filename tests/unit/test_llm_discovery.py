"""The MindIE/OpenAI target is discovered from the backend's one knowledge, as the proxy's own
questions (``v2proxy.frontends.llm_call``): never through the client-facing API with the
client's headers, so a restricted ``metadata`` or ``model-config`` group (refused to the client
by the REST frontend) changes nothing; the
target is kept in the knowledge, with its lifetime, and its log line is not said again when it
is rediscovered unchanged."""

from __future__ import annotations

import json
import logging

import pytest

from tests.unit.test_routes import FakeRequest, FakeResponse
from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.core.errors import Forbidden
from v2proxy.core.knowledge import KNOWLEDGE_TTL_S, BackendKnowledge
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import Headers
from v2proxy.frontends.llm_call import LlmBackendSide
from v2proxy.frontends.rest import RestFrontend
from v2proxy.ops.config_sections import OpenAIModel, OpenAISettings


class Restricting:
    """Refuses ``groups`` to every client (no header opens them)."""

    def __init__(self, *groups: str) -> None:
        self.groups = set(groups)

    def restricts(self, group: str) -> bool:
        return group in self.groups

    def check(self, group: str, headers: Headers) -> None:
        if group in self.groups:
            raise Forbidden(f"This API is restricted, expecting header 'x' ({group})")


class Counting(BuiltinBackend):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def model_metadata(self, model: str, version: str) -> dict[str, object]:
        self.asked.append("metadata")
        return await super().model_metadata(model, version)

    async def model_config(self, model: str, version: str) -> dict[str, object]:
        self.asked.append("config")
        return await super().model_config(model, version)


def _frontend(groups: tuple[str, ...], openai: OpenAISettings | None = None) -> RestFrontend:
    """The REST frontend in front of the builtin models, refusing ``groups`` to every client."""
    pipeline = Pipeline(BuiltinBackend(), 1 << 20)
    return RestFrontend(pipeline, 1 << 20, 1 << 20, openai=openai, access=Restricting(*groups))


async def _dispatch(frontend: RestFrontend, method: str, path: str, body: bytes) -> FakeResponse:
    response = FakeResponse()
    await frontend.dispatch(FakeRequest(method, path, body), response)  # type: ignore[arg-type]
    return response


@pytest.mark.parametrize("groups", [("model-config",), ("metadata", "model-config")])
async def test_discovery_ignores_the_clients_restricted_groups(groups: tuple[str, ...]) -> None:
    """The builtin ``llm`` is decoupled: found so whatever the restricted groups (a restricted
    ``model-config`` was read as "not decoupled", a restricted ``metadata`` as no model)."""
    frontend = _frontend(groups)
    # the client-facing API is still restricted
    assert (await _dispatch(frontend, "GET", "/v2/models/llm/config", b"")).status == 403
    target = await LlmBackendSide(frontend.pipeline, "llm", "trtllm", "seed").target()
    assert target.view.decoupled is True and target.view.has("text_input")
    assert target.transport == "builtin backend's stream_infer"


@pytest.mark.parametrize("groups", [(), ("model-config",), ("metadata", "model-config")])
async def test_openai_sees_the_decoupled_model_whatever_the_restricted_groups(
    groups: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    """Through the OpenAI frontend's start-up check and a completion (the inference group
    open): the line says the decoupled ``llm`` serves it, and the answer counts its tokens."""
    settings = OpenAISettings((OpenAIModel("llm", "llm"),))
    frontend = _frontend(groups, settings)
    with caplog.at_level(logging.INFO, logger="v2proxy.openai"):
        await frontend.openai.check()
    lines = [r.getMessage() for r in caplog.records]
    assert any("served by model 'llm' (profile trtllm, decoupled," in line for line in lines)
    assert not any("not found" in line for line in lines)
    raw = b'{"model": "llm", "prompt": "one two three", "max_tokens": 5}'
    response = await _dispatch(frontend, "POST", "/v1/completions", raw)
    assert response.status == 200, response.body
    assert json.loads(response.body)["usage"]["completion_tokens"] == 5


async def test_the_target_lives_in_the_knowledge(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    backend = Counting()
    pipeline = Pipeline(backend, 1 << 20, knowledge=BackendKnowledge(clock=lambda: now[0]))
    side = LlmBackendSide(pipeline, "llm", "trtllm", "seed")
    with caplog.at_level(logging.INFO, logger="v2proxy.mindie"):
        target = await side.target()
        assert await side.target() is target
        assert backend.asked == ["metadata", "config"]  # asked once within the lifetime
        now[0] += KNOWLEDGE_TTL_S  # the store's lifetime is over: discovered again
        again = await side.target()
    assert again == target and again is not target
    assert backend.asked == ["metadata", "config"] * 2
    lines = [r.getMessage() for r in caplog.records if "served by model 'llm'" in r.getMessage()]
    assert len(lines) == 1  # said once: the same target
