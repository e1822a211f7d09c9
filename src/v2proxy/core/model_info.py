"""What the pipeline knows about the backend's models, cached for :data:`METADATA_TTL_S`.

- :meth:`ModelInfo.shape_info`: a model's metadata and its ``max_batch_size`` (from its config;
  None when the config cannot be had or names none), for raw bodies, classification batching and
  the generate mapping. Errors of the metadata call are raised, never cached.
- :meth:`ModelInfo.lists_classification`: whether the backend's server metadata lists the
  classification extension (a backend that cannot say does not).
- :meth:`ModelInfo.invalidate`: forget both (after a repository load or unload).

Pure with respect to I/O libraries: it awaits the backend only.
"""

from __future__ import annotations

import time
from typing import Any

from v2proxy.core.errors import ProxyError
from v2proxy.core.ports import Backend

METADATA_TTL_S = 30.0


class ModelInfo:
    """The cache in front of ``backend``'s metadata and config calls."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._metadata: dict[tuple[str, str], tuple[float, dict[str, Any], int | None]] = {}
        self._classifies: tuple[float, bool] | None = None

    def invalidate(self) -> None:
        self._metadata.clear()
        self._classifies = None

    async def shape_info(self, model: str, version: str) -> tuple[dict[str, Any], int | None]:
        key = (model, version)
        now = time.monotonic()
        hit = self._metadata.get(key)
        if hit is not None and now - hit[0] < METADATA_TTL_S:
            return hit[1], hit[2]
        metadata = await self.backend.model_metadata(model, version)
        max_batch_size: int | None = None
        try:
            config = await self.backend.model_config(model, version)
        except ProxyError:
            config = {}
        mbs = config.get("max_batch_size") if isinstance(config, dict) else None
        if isinstance(mbs, int) and not isinstance(mbs, bool):
            max_batch_size = mbs
        self._metadata[key] = (now, metadata, max_batch_size)
        return metadata, max_batch_size

    async def lists_classification(self) -> bool:
        now = time.monotonic()
        hit = self._classifies
        if hit is not None and now - hit[0] < METADATA_TTL_S:
            return hit[1]
        try:
            ext = (await self.backend.server_metadata()).get("extensions")
        except ProxyError:
            ext = None
        lists = isinstance(ext, list) and "classification" in ext
        self._classifies = (now, lists)
        return lists
