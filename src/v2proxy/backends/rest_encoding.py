"""``--backend-encoding`` for one REST backend: which wire form its /infer requests take.

``auto`` sends binary tensors when the backend lists ``binary_tensor_data`` in ``GET /v2``, for
JSON bodies from :data:`AUTO_BINARY_MIN` bytes on. A backend that does not list it may take
binary all the same (KServe 0.21 does, and refuses FP16 in JSON): for FP16/BF16 inputs binary is
tried, and the outcome kept in the backend's :class:`~v2proxy.core.knowledge.BackendKnowledge`
for its lifetime. MLServer (``binary_unlisted`` False) is never tried.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Final

from v2proxy.core.errors import ProxyError
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.model import Datatype, InferRequest
from v2proxy.core.ports import RelayFacts

log = logging.getLogger(__name__)

#: with ``auto``, JSON bodies from this size on go binary rather than relayed (measured in
#: front of Triton: relaying wins at 5 KB, binary from 20 KB on)
AUTO_BINARY_MIN: Final = 16 * 1024
_NOT_IN_JSON: Final = (Datatype.FP16, Datatype.BF16)
_UNLISTED: Final = ("binary tensors unlisted",)

#: a 422 from a FastAPI server that read the binary-framed body as JSON (MLServer 1.7, KServe
#: before 0.11)
_UNPARSED_422: Final = (
    "json_invalid",
    "JSON decode error",
    "model_attributes_type",
    "valid dictionary",
)
#: a 400 from a server that could not read the body (FastAPI, KServe; or a hop on the way
#: dropped the inference-header-content-length header)
_UNPARSED_400: Final = (
    "error parsing the body",
    "Unrecognized request format",
    "inference-header-content-length",
)


def refuses_binary(status: int, message: str) -> bool:
    """Whether a backend's error answer to a binary-framed /infer request is about binary
    tensors themselves (the body could not be read), rather than the request, model or
    outputs."""
    if status == 415:  # Unsupported Media Type: application/octet-stream
        return True
    if status == 422:
        return any(text in message for text in _UNPARSED_422)
    if status == 400:
        low = message.lower()
        return any(text.lower() in low for text in _UNPARSED_400)
    # Starlette's bare answer to an unhandled exception: MLServer 1.7 given non-UTF-8 binary
    return status == 500 and message == "Internal Server Error"


class Encoding:
    """The wire form of one backend's /infer requests."""

    __slots__ = ("_facts", "_knowledge", "_name", "_said", "fixed", "setting")

    def __init__(self, setting: str, name: str, knowledge: BackendKnowledge) -> None:
        self.setting = setting
        self._name = name
        self._knowledge = knowledge
        #: json or binary; None: ``auto``, the knowledge's answer
        self.fixed: bool | None = {"json": False, "binary": True}.get(setting)
        #: each log line is said once, again when its value changes
        self._said: dict[str, bool] = {}
        below, auto = {"json": (1 << 62, False), "binary": (0, False)}.get(
            setting, (AUTO_BINARY_MIN, True)
        )
        self._facts = {
            binary: RelayFacts(True, False, below, auto, binary, 0, False)
            for binary in (True, False, None)
        }

    def _say(self, key: str, value: bool, text: str) -> None:
        if self._said.get(key) is not value:
            self._said[key] = value
            log.info("backend %s %s", self._name, text)

    async def binary(self) -> bool:
        """Whether requests go binary: fixed by configuration, or the backend's capabilities."""
        if self.fixed is not None:
            return self.fixed
        caps = await self._knowledge.server()
        binary = caps.binary_tensors
        self._say("binary", binary, f"binary tensors: {binary}")
        if not binary and caps.binary_unlisted is False:
            self._say("unlisted", False, "(MLServer) has no binary tensors: FP16/BF16 go as JSON")
        return binary

    def facts(self, _model: str = "", _version: str = "") -> RelayFacts:
        """What the backend takes as sent, as known now: the backend's ``relay_facts``."""
        binary = self.fixed
        if binary is None:
            caps = self._knowledge.known_server()
            binary = None if caps is None else caps.binary_tensors
        return self._facts[binary]

    async def learn(self) -> RelayFacts:
        """:meth:`facts` once the backend's capabilities are asked (left unknown when it
        cannot say)."""
        with contextlib.suppress(ProxyError):
            await self.binary()
        return self.facts()

    def try_unlisted(self, request: InferRequest) -> bool:
        """Whether to send this request binary to a backend that does not list binary tensors
        (it holds FP16/BF16 and the backend has not refused binary lately)."""
        if self.setting != "auto":
            return False
        taken: bool | None = self._knowledge.recall(_UNLISTED)
        if taken is None:
            caps = self._knowledge.known_server()
            taken = None if caps is None else caps.binary_unlisted
        return taken is not False and any(t.datatype in _NOT_IN_JSON for t in request.inputs)

    def unlisted(self, taken: bool, why: str = "") -> None:
        """What the backend did with binary tensors it does not list (``why``: the log's words
        when it refused them)."""
        self._say("unlisted", taken, "takes binary tensors unlisted" if taken else why)
        self._knowledge.learn(_UNLISTED, taken)
