"""What the proxy knows about its backend: one cache, one lifetime, one invalidation.

:class:`BackendKnowledge` asks the backend's metadata calls and keeps their parsed answers
(:mod:`v2proxy.codecs.backend_meta`) for :data:`KNOWLEDGE_TTL_S` seconds, beside what backends
and frontends learn on their own terms (:meth:`~BackendKnowledge.learn`). Errors are raised,
never kept, except a model configuration's (kept as none). The ``known_*`` methods answer
without asking, for hot paths that must not await. :meth:`~BackendKnowledge.invalidate` (after
a repository load or unload) forgets all of it. It is bound to the undecorated backend: its
probes are not the clients' calls the metrics time. Pure: it awaits the backend only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, Final, Protocol

from v2proxy.codecs.backend_meta import (
    NO_CONFIG,
    ConfigFacts,
    ModelMeta,
    ServerCaps,
    config_facts,
    model_meta,
    server_caps,
)
from v2proxy.core.errors import BackendUnavailable, GatewayTimeout, ProxyError

#: how long anything learnt of the backend is kept (s)
KNOWLEDGE_TTL_S = 30.0
MAX_ENTRIES = 4096

_SERVER: Final = ("server",)
#: the server's metadata could not be had (for the questions that take that as a no)
_UNASKABLE = ("server unaskable",)


class MetadataSource(Protocol):
    """The backend's metadata calls (a :class:`~v2proxy.core.ports.Backend` has them)."""

    async def server_metadata(self) -> dict[str, Any]: ...
    async def model_metadata(self, model: str, version: str) -> dict[str, Any]: ...
    async def model_config(self, model: str, version: str) -> dict[str, Any]: ...


class BackendKnowledge:
    """The one cache of what is known about the backend."""

    def __init__(
        self,
        source: MetadataSource | None = None,
        ttl: float = KNOWLEDGE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.ttl = ttl
        self._clock = clock
        self._facts: dict[Hashable, tuple[float, Any]] = {}

    def bind(self, source: MetadataSource) -> None:
        """Ask ``source`` from now on."""
        self.source = source

    def _source(self) -> MetadataSource:
        if self.source is None:
            raise ProxyError("the backend's knowledge is not bound to a backend")
        return self.source

    def recall(self, key: Hashable) -> Any:
        """What was learnt under ``key`` within the lifetime, else None."""
        hit = self._facts.get(key)
        if hit is None:
            return None
        if self._clock() - hit[0] >= self.ttl:
            del self._facts[key]
            return None
        return hit[1]

    def learn(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` (not None) under ``key`` for the lifetime."""
        if len(self._facts) >= MAX_ENTRIES and key not in self._facts:
            self._facts.clear()
        self._facts[key] = (self._clock(), value)

    def invalidate(self) -> None:
        """Forget everything."""
        self._facts.clear()

    async def server(self) -> ServerCaps:
        """The server's capabilities (a failure raised, asked again next time)."""
        caps: ServerCaps | None = self.recall(_SERVER)
        if caps is None:
            caps = server_caps(await self._source().server_metadata())
            self.learn(_SERVER, caps)
        return caps

    async def model(self, model: str, version: str) -> ModelMeta:
        """A model's metadata (a failure raised, asked again next time)."""
        key = ("model", model, version)
        meta: ModelMeta | None = self.recall(key)
        if meta is None:
            meta = model_meta(await self._source().model_metadata(model, version))
            self.learn(key, meta)
        return meta

    async def config(self, model: str, version: str) -> ConfigFacts:
        """The facts of a model's configuration; an error answer counts as none, kept; a backend
        that could not be asked raises, and is asked again next time."""
        key = ("config", model, version)
        facts: ConfigFacts | None = self.recall(key)
        if facts is None:
            try:
                facts = config_facts(await self._source().model_config(model, version))
            except (BackendUnavailable, GatewayTimeout):
                raise
            except ProxyError:
                facts = NO_CONFIG
            self.learn(key, facts)
        return facts

    def known_server(self) -> ServerCaps | None:
        """The server's capabilities when known, nothing asked (:meth:`recall`, written out:
        asked on every relayed request)."""
        hit = self._facts.get(_SERVER)
        if hit is None or self._clock() - hit[0] >= self.ttl:
            return None  # (an expired one is dropped by the next recall)
        caps: ServerCaps = hit[1]
        return caps

    def known_config(self, model: str, version: str) -> ConfigFacts | None:
        """A model's configuration facts when known, nothing asked."""
        facts: ConfigFacts | None = self.recall(("config", model, version))
        return facts

    async def shape_info(self, model: str, version: str) -> tuple[dict[str, Any], int | None]:
        """A model's metadata as it came and its ``max_batch_size`` (None: no config, or it
        names none)."""
        meta = await self.model(model, version)
        facts = await self.config(model, version)
        return meta.raw, facts.max_batch_size

    async def lists_classification(self) -> bool:
        """Whether the backend lists the classification extension (one that cannot say does
        not)."""
        if self.recall(_UNASKABLE):
            return False
        try:
            return (await self.server()).classification
        except ProxyError:
            self.learn(_UNASKABLE, True)
            return False
