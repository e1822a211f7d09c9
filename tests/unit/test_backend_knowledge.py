"""The one cache of what the proxy knows of its backend (``v2proxy.core.knowledge``): one
lifetime for every fact, one invalidation that forgets them all, the backends' learnt facts
too."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_backend_meta import SIMPLE, TRITON_EXTENSIONS
from v2proxy.backends.rest import RestBackend
from v2proxy.backends.staging import Stager
from v2proxy.core.decide import BINARY, relays
from v2proxy.core.errors import BackendUnavailable, NotFound, ProxyError
from v2proxy.core.knowledge import KNOWLEDGE_TTL_S, BackendKnowledge
from v2proxy.core.model import Datatype, InferRequest, Tensor
from v2proxy.core.pipeline import Pipeline

# --------------------------------------------------------------------------- the one cache


class Source:
    """A backend's metadata calls, counted; ``fail`` raises from the next call on."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.fail: Exception | None = None
        self.config_error: Exception | None = None

    async def server_metadata(self) -> dict[str, Any]:
        self.asked.append("server")
        if self.fail is not None:
            raise self.fail
        return {"name": "triton", "extensions": TRITON_EXTENSIONS}

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        self.asked.append(f"metadata {model}")
        if self.fail is not None:
            raise self.fail
        return dict(SIMPLE, name=model)

    async def model_config(self, model: str, version: str) -> dict[str, Any]:
        self.asked.append(f"config {model}")
        if self.config_error is not None:
            raise self.config_error
        return {"max_batch_size": 8}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _everything(k: BackendKnowledge) -> None:
    await k.server()
    await k.model("m", "")
    await k.config("m", "")
    if k.recall(("learnt",)) is None:
        k.learn(("learnt",), True)


async def test_one_lifetime_for_every_fact() -> None:
    source, clock = Source(), Clock()
    k = BackendKnowledge(source, clock=clock)
    assert k.ttl == KNOWLEDGE_TTL_S == 30.0
    await _everything(k)
    clock.now += KNOWLEDGE_TTL_S - 0.1
    await _everything(k)
    assert source.asked == ["server", "metadata m", "config m"]
    assert k.recall(("learnt",)) is True
    clock.now += 0.1  # the lifetime is over, for everything alike
    assert k.recall(("learnt",)) is None
    await _everything(k)
    assert source.asked == ["server", "metadata m", "config m"] * 2


async def test_one_invalidation_forgets_everything() -> None:
    source = Source()
    k = BackendKnowledge(source)
    await _everything(k)
    assert k.known_server() is not None and k.known_config("m", "") is not None
    k.invalidate()
    assert k.recall(("learnt",)) is None
    assert k.known_server() is None and k.known_config("m", "") is None
    await _everything(k)
    assert source.asked == ["server", "metadata m", "config m"] * 2


async def test_failures_are_not_kept_but_a_missing_config_is() -> None:
    source = Source()
    k = BackendKnowledge(source)
    source.fail = BackendUnavailable("down")
    for _ in range(2):
        with pytest.raises(BackendUnavailable):
            await k.server()
        with pytest.raises(BackendUnavailable):
            await k.model("m", "")
    assert source.asked == ["server", "metadata m"] * 2
    assert await k.lists_classification() is False  # cannot say: does not, for a lifetime
    assert await k.lists_classification() is False
    assert source.asked.count("server") == 3
    source.fail = None
    source.config_error = NotFound("no config here")  # KServe, MLServer
    assert await k.shape_info("m", "") == (dict(SIMPLE, name="m"), None)
    assert await k.shape_info("m", "") == (dict(SIMPLE, name="m"), None)
    assert source.asked.count("config m") == 1


async def test_an_unbound_knowledge_says_so() -> None:
    with pytest.raises(ProxyError):
        await BackendKnowledge().server()


async def test_a_rest_backend_shares_one_knowledge_and_forgets_what_it_learnt() -> None:
    """The REST backend's encoding (binary tensors, listed or learnt by trying), the stager's
    output sizes and the pipeline's facts live and die together."""
    stager = Stager("auto", 65536)
    backend = RestBackend("http://127.0.0.1:1", staging=stager)
    pipeline = Pipeline(backend, 1 << 20)
    assert pipeline.knowledge is backend.knowledge is stager.knowledge
    answers = [
        {"name": "kserve", "extensions": []},
        {"name": "triton", "extensions": ["binary_tensor_data"]},
    ]

    async def server_metadata() -> dict[str, Any]:
        return answers.pop(0)

    backend.server_metadata = server_metadata  # type: ignore[method-assign]
    encoding = backend.encoding
    fp16 = InferRequest("m", [Tensor("I", Datatype.FP16, [1], b"\0\0")])
    assert await encoding.binary() is False and encoding.try_unlisted(fp16) is True
    encoding.unlisted(False, "refused binary tensors")  # learnt by trying
    assert encoding.try_unlisted(fp16) is False
    assert relays(BINARY, 100, encoding.facts()) is False
    pipeline.invalidate()  # after a repository load or unload
    assert relays(BINARY, 100, encoding.facts()) is None  # to be asked again
    assert await encoding.binary() is True and answers == []
    assert relays(BINARY, 100, encoding.facts()) is True
    assert encoding.try_unlisted(fp16) is True  # what was learnt by trying is forgotten too


async def test_the_rest_encoding_answers_expire_with_the_stores_lifetime() -> None:
    """``--backend-encoding auto``: the server's binary-tensor answer and what was learnt by
    trying are the knowledge's, so they end with its lifetime (they were kept for ever)."""
    clock = Clock()
    knowledge = BackendKnowledge(clock=clock)
    backend = RestBackend("http://127.0.0.1:1", knowledge=knowledge)
    knowledge.bind(backend)
    answers = [{"name": "kserve", "extensions": []}, {"name": "kserve", "extensions": []}]

    async def server_metadata() -> dict[str, Any]:
        return answers.pop(0)

    backend.server_metadata = server_metadata  # type: ignore[method-assign]
    encoding = backend.encoding
    fp16 = InferRequest("m", [Tensor("I", Datatype.FP16, [1], b"\0\0")])
    assert await encoding.binary() is False and relays(BINARY, 100, encoding.facts()) is False
    encoding.unlisted(False, "refused binary tensors")
    assert encoding.try_unlisted(fp16) is False
    clock.now += KNOWLEDGE_TTL_S
    assert relays(BINARY, 100, encoding.facts()) is None  # to be asked again
    assert encoding.try_unlisted(fp16) is True  # tried again
    assert await encoding.binary() is False and answers == []
