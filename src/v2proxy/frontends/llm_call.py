"""The backend side of the LLM routes (MindIE's ``/infer``, OpenAI's ``/v1``): which v2 model
serves a route, seen how, and over which transport (docs/protocol.md, MindIE;
docs/guides/mindie.md, profiles and transport)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from v2proxy.codecs import mindie_answer as answer
from v2proxy.codecs import mindie_map as mapping
from v2proxy.codecs.mindie import LlmRequest
from v2proxy.core.errors import ProxyError
from v2proxy.core.pipeline import Pipeline
from v2proxy.core.ports import Headers

log = logging.getLogger("v2proxy.mindie")

RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class Target:
    """The model and how it is reached."""

    view: mapping.ModelView
    profile: str
    seed_input: str
    http: bool  # through the generate extension
    #: how the backend's stream_infer reaches the server (``Backend.stream_call``)
    stream_call: str = ""

    @property
    def transport(self) -> str:
        return "HTTP generate/generate_stream" if self.http else self.stream_call


class LlmBackendSide:
    """The backend side of ``/infer``: its target, discovered on first use and kept
    (:meth:`target`), and the calls to it (:meth:`chunks`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        model: str,
        profile: str,
        seed_input: str,
        serves: str = "MindIE /infer",
        logger: logging.Logger = log,
    ) -> None:
        #: what this side serves, as its log lines name it, and the logger they go to
        self.serves = serves
        self.log = logger
        self.pipeline = pipeline
        self.model = model
        self.profile = profile
        self.seed_input = seed_input
        #: the knowledge's key of this side's target
        self._key = ("llm target", serves, model, profile, seed_input)
        self._failed_at = 0.0
        self._said = ""
        self._dropped: set[str] = set()

    async def target(self) -> Target:
        """The model and how it is reached: kept in the backend's knowledge, discovered
        there when it is not (its metadata and config, asked as the proxy's own questions)."""
        knowledge = self.pipeline.knowledge
        target: Target | None = knowledge.recall(self._key)
        if target is not None:
            return target
        try:
            meta = await knowledge.model(self.model, "")
            config = await knowledge.config(self.model, "")
        except ProxyError as exc:
            now = time.monotonic()
            if now - self._failed_at > RETRY_S:
                self.log.warning(
                    "%s: model '%s' not found: %s", self.serves, self.model, exc.message
                )
                self._failed_at = now
            raise
        target = self._discovered(mapping.view_of(self.model, meta, config))
        knowledge.learn(self._key, target)
        return target

    def _discovered(self, view: mapping.ModelView) -> Target:
        """The target of a model seen so, its line logged when it is new."""
        p = self.pipeline
        decoupled = view.decoupled
        # through the generate extension when the backend takes REST requests as they are
        http = p.backend.speaks_rest and (decoupled or self.profile == "generate")
        seed_input = self.seed_input
        if not view.has(seed_input):  # named the other way (MindIE renamed it in May 2025)
            other = "random_seed" if seed_input == "seed" else "seed"
            seed_input = other if view.has(other) else seed_input
        target = Target(view, self.profile, seed_input, http, p.backend.stream_call(decoupled))
        problems = mapping.profile_problems(self.profile, view)
        guess = mapping.guess_profile(view)
        line = (
            f"{self.serves} served by model '{self.model}' (profile {self.profile},"
            f" {'decoupled' if decoupled else 'not decoupled'}, {target.transport})"
        )
        level = logging.WARNING
        if problems:
            line = f"{line}: {'; '.join(problems)}; its inputs suggest profile {guess}"
        elif self.profile not in (guess, "generate"):
            line = f"{line}; its inputs suggest profile {guess}"
        else:
            level = logging.INFO
        if line != self._said:  # not again when rediscovered after the knowledge's lifetime
            self._said = line
            self.log.log(level, "%s", line)
        return target

    def dropped(self, names: list[str]) -> None:
        """Log, once per name, the knobs the model has no input for."""
        new = [n for n in names if n not in self._dropped]
        if new:
            self._dropped.update(new)
            self.log.info("%s: model '%s' has no input %s: not sent", self.serves, self.model, new)

    async def chunks(
        self, target: Target, req: LlmRequest, headers: Headers
    ) -> AsyncIterator[tuple[answer.Chunk, float]]:
        """Each backend response to ``req`` as a chunk, with its arrival time (perf_counter)."""
        view = target.view
        # A decoupled model is always asked to stream, whether the client streams or not: its
        # tokens are counted exactly, and a request that the deadline or the client's going away
        # ends is cancelled at its next token (Triton notices a closed connection only when it
        # writes, and does not cancel a /generate request at all).
        stream = req.stream or view.decoupled
        pipeline = self.pipeline
        if target.http or target.profile == "generate":
            body, dropped = mapping.generate_body(
                req, target.profile, view, target.seed_input, stream
            )
            self.dropped(dropped)
            objects = pipeline.generate_objects(view.name, "", body, headers, stream)
            try:
                async for obj in objects:
                    yield answer.chunk_from_generate(obj), time.perf_counter()
            finally:
                await objects.aclose()  # type: ignore[attr-defined]
            return
        values, dropped = mapping.select(
            mapping.candidate_values(req, target.profile, view, target.seed_input, stream), view
        )
        self.dropped(dropped)
        responses = pipeline.stream_infer(mapping.infer_request(values, view), headers)
        try:
            async for response in responses:
                yield answer.chunk_from_response(response), time.perf_counter()
        finally:
            await responses.aclose()  # type: ignore[attr-defined]
