"""``--backend-encoding`` for one REST backend: which wire form its /infer requests take.

- ``json`` / ``binary``: fixed.
- ``auto``: binary tensors when the backend lists ``binary_tensor_data`` in ``GET /v2`` (its
  :class:`~v2proxy.codecs.backend_meta.ServerCaps` in the backend's knowledge). Then a JSON
  client body is relayed untouched while it is small, and sent as binary tensors (outputs asked
  binary, the client answered in the form it asked for) from :data:`AUTO_BINARY_MIN` bytes on,
  where the backend parsing JSON costs more than v2proxy's transcoding. A backend that does not
  list the extension may take binary tensors all the same (KServe 0.21 does, and refuses FP16 in
  JSON): for requests JSON cannot carry (FP16, BF16 inputs) v2proxy tries binary; an answer is
  kept once it says which: a 200 (taken), or a refusal that is about the binary body itself
  (:func:`refuses_binary`; that request then goes as JSON). Any other error (the model's, an
  unknown output, KServe's "... for output X" when its model writes FP16 outputs as JSON
  whatever was asked) is the client's answer and leaves the question open. A server whose
  capabilities say it never takes them
  (:attr:`~v2proxy.codecs.backend_meta.ServerCaps.binary_unlisted` False: MLServer) is never
  tried.

Everything ``auto`` knows, asked or learnt by trying, is kept in the backend's one
:class:`~v2proxy.core.knowledge.BackendKnowledge`, with its lifetime and its invalidation: once
the lifetime is over, the capabilities are asked again and binary tensors tried again. Nothing
is kept here but the log lines already written (each said once, again only when it changes).
"""

from __future__ import annotations

import contextlib
import logging

from v2proxy.core.errors import ProxyError
from v2proxy.core.knowledge import BackendKnowledge
from v2proxy.core.model import Datatype, InferRequest
from v2proxy.core.ports import RelayFacts

log = logging.getLogger(__name__)

#: with ``auto``, JSON bodies from this size on go to a backend that takes binary tensors as
#: binary rather than relayed: measured in front of Triton (identity_fp32, one request at a
#: time), relaying wins at 5 KB (0.7 x the binary time), binary at 20 KB (1.1 x), 40 KB
#: (1.7 x), 1.3 MB (7 x) and 21 MB (4 x)
AUTO_BINARY_MIN = 16 * 1024
_NOT_IN_JSON = (Datatype.FP16, Datatype.BF16)
#: the knowledge's key of whether the backend takes binary tensors it does not list
_UNLISTED = ("binary tensors unlisted",)

#: texts of a 422 from a FastAPI (pydantic) server that read the binary-framed body as JSON:
#: MLServer 1.7 ("JSON decode error", type json_invalid; or "Input should be a valid dictionary
#: or object to extract fields from", type model_attributes_type), KServe before 0.11
_UNPARSED_422 = ("json_invalid", "JSON decode error", "model_attributes_type", "valid dictionary")
#: texts of a 400 from a server that could not read the body it got: FastAPI's "There was an
#: error parsing the body", KServe's "Unrecognized request format: ...", and KServe's "received
#: byte inputs, but the 'inference-header-content-length' header is missing" (a hop on the way
#: dropped the header)
_UNPARSED_400 = (
    "error parsing the body",
    "Unrecognized request format",
    "inference-header-content-length",
)


def refuses_binary(status: int, message: str) -> bool:
    """Whether a backend's error answer to a binary-framed /infer request is about binary
    tensors themselves (the body could not be read), rather than about the request, the model
    or its outputs (e.g. KServe's "Sending FP16 data via JSON is not supported. Please use the
    binary data format for output OUTPUT0", or "Unexpected inference output 'X'")."""
    if status == 415:  # Unsupported Media Type: application/octet-stream
        return True
    if status == 422:
        return any(text in message for text in _UNPARSED_422)
    if status == 400:
        low = message.lower()
        return any(text.lower() in low for text in _UNPARSED_400)
    # Starlette's bare answer to an unhandled exception: MLServer 1.7 given a binary body that
    # is not UTF-8 (FP16 -1.25 is 00 BD)
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
        #: the last value of each log line written (said once, again when it changes)
        self._said: dict[str, bool] = {}
        #: the relay facts, per what is known of binary tensors
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
        """What the backend takes as sent, as known now (the core decides from it:
        :func:`v2proxy.core.relay.relays`); the backend's ``relay_facts`` (of every model)."""
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
        (it holds tensors JSON cannot carry, and the backend has not refused binary within
        the knowledge's lifetime)."""
        if self.setting != "auto":
            return False
        taken: bool | None = self._knowledge.recall(_UNLISTED)
        if taken is None:
            caps = self._knowledge.known_server()
            taken = None if caps is None else caps.binary_unlisted
        return taken is not False and any(t.datatype in _NOT_IN_JSON for t in request.inputs)

    def unlisted(self, taken: bool, why: str = "") -> None:
        """What the backend did with binary tensors it does not list (``why``: the log's words
        when it refused them), kept in the knowledge for its lifetime."""
        self._say("unlisted", taken, "takes binary tensors unlisted" if taken else why)
        self._knowledge.learn(_UNLISTED, taken)
