"""One invalidation reaches every cache of the backend's models: a repository load or unload
through the pipeline drops the pipeline's metadata, the backend's own knowledge (a gRPC
backend's decoupled models, the staging output sizes) and MindIE's discovered target."""

from __future__ import annotations

from typing import Any

import pytest

from v2proxy.backends.builtin import BuiltinBackend
from v2proxy.backends.grpc import GrpcBackend
from v2proxy.backends.staging import Stager
from v2proxy.core.pipeline import Pipeline


class Counting(BuiltinBackend):
    def __init__(self) -> None:
        super().__init__()
        self.invalidated = 0
        self.metadata_calls = 0

    def invalidate(self) -> None:
        self.invalidated += 1

    async def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        self.metadata_calls += 1
        return await super().model_metadata(model, version)


@pytest.mark.parametrize("load", [True, False])
async def test_a_repository_load_or_unload_forgets_everything(load: bool) -> None:
    backend = Counting()
    pipeline = Pipeline(backend, max_input_size=1 << 20)
    forgotten = []
    pipeline.on_invalidate(lambda: forgotten.append(1))
    await pipeline.info.shape_info("simple", "")
    await pipeline.info.shape_info("simple", "")
    assert backend.metadata_calls == 1  # cached
    await pipeline.repository_load("simple", load, {}, [])
    assert (backend.invalidated, forgotten) == (1, [1])
    if not load:  # back again, to be asked
        await pipeline.repository_load("simple", True, {}, [])
        assert (backend.invalidated, forgotten) == (2, [1, 1])
    await pipeline.info.shape_info("simple", "")
    assert backend.metadata_calls == 2  # asked again


def test_the_grpc_backend_forgets_decoupled_models_and_staged_sizes() -> None:
    stager = Stager("auto", 65536)
    backend = GrpcBackend("127.0.0.1:1", staging=stager)
    backend._decoupled[("llm", "")] = True
    stager._sizes[("m", "")] = {"O": 4}
    backend.invalidate()
    assert backend._decoupled == {} and stager._sizes == {}
