"""One invalidation reaches everything known of the backend: a repository load or unload
through the pipeline drops the one knowledge (metadata, a gRPC backend's decoupled models, the
staging output sizes, MindIE's discovered target), where everything is kept."""

from __future__ import annotations

from typing import Any

import pytest

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.backends.grpc import GrpcBackend
from v2proxy.backends.staging import Stager
from v2proxy.core.pipeline import Pipeline
from v2proxy.frontends.llm_call import LlmBackendSide


class Counting(BuiltinBackend):
    def __init__(self) -> None:
        super().__init__()
        self.metadata_calls = 0

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        self.metadata_calls += 1
        return await super().model_metadata(model, version)


@pytest.mark.parametrize("load", [True, False])
async def test_a_repository_load_or_unload_forgets_everything(load: bool) -> None:
    backend = Counting()
    pipeline = Pipeline(backend, max_input_size=1 << 20)
    side = LlmBackendSide(pipeline, "llm", "trtllm", "seed")
    await pipeline.knowledge.shape_info("simple", "")
    await pipeline.knowledge.shape_info("simple", "")
    target = await side.target()
    assert await side.target() is target
    assert backend.metadata_calls == 2  # cached
    await pipeline.repository_load("simple", load, {}, [])
    if not load:  # back again, to be asked
        await pipeline.repository_load("simple", True, {}, [])
    await pipeline.knowledge.shape_info("simple", "")
    assert backend.metadata_calls == 3  # asked again
    assert await side.target() is not target and backend.metadata_calls == 4  # discovered again


async def test_the_grpc_backend_forgets_decoupled_models_and_staged_sizes() -> None:
    """The gRPC backend's decoupled models and its stager's output sizes are kept in the one
    knowledge, which the pipeline's invalidation clears."""
    stager = Stager("auto", 65536)
    backend = GrpcBackend("127.0.0.1:1", staging=stager)
    asked: list[str] = []

    async def model_config(model: str, version: str) -> dict[str, Any]:
        asked.append(f"config {model}")
        return {"model_transaction_policy": {"decoupled": True}}

    async def model_metadata(model: str, version: str) -> dict[str, Any]:
        asked.append(f"metadata {model}")
        return {"name": model, "outputs": [{"name": "O", "datatype": "FP32", "shape": [1]}]}

    backend.model_config = model_config  # type: ignore[method-assign]
    backend.model_metadata = model_metadata  # type: ignore[method-assign]
    pipeline = Pipeline(backend, max_input_size=1 << 20)
    assert stager.knowledge is backend.knowledge is pipeline.knowledge
    for _ in range(2):
        assert await backend.is_decoupled("llm", "") is True
        assert (await pipeline.knowledge.model("m", "")).output("O") is not None
    assert asked == ["config llm", "metadata m"]  # kept
    pipeline.invalidate()
    assert await backend.is_decoupled("llm", "") is True
    await pipeline.knowledge.model("m", "")
    assert asked == ["config llm", "metadata m"] * 2  # asked again
