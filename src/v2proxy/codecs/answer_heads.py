"""The JSON headers of a backend's binary-framed answers, each decoded once."""

from __future__ import annotations

from typing import Any, NamedTuple

from v2proxy.core.model import Buffer, Datatype, InferResponse, Tensor

#: headers longer than this are not kept (their key would cost what it saves)
MAX_HEAD = 4096


class _Known(NamedTuple):
    model_name: str
    model_version: str
    #: (name, datatype, shape, start, end in the body) of every output, in order
    outputs: tuple[tuple[str, Datatype, tuple[int, ...], int, int], ...]
    #: the binary section's length the header declares
    section: int


class AnswerHeads:
    """The binary-framed answers' JSON headers of one backend, each decoded once."""

    KEPT = 64

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: dict[bytes, _Known] = {}

    def decode(self, body: Buffer, ihcl: int) -> InferResponse | None:
        """The answer ``body`` (its JSON header the first ``ihcl`` bytes, within it) when its
        header is known and its binary section has the length it declares; None otherwise."""
        if ihcl > MAX_HEAD:
            return None
        head = body[:ihcl] if type(body) is bytes else bytes(memoryview(body)[:ihcl])
        known = self._known.get(head)
        if known is None:
            return None
        mv = memoryview(body)
        if len(mv) - ihcl != known.section:
            return None
        outputs = []
        for name, datatype, shape, start, end in known.outputs:
            outputs.append(Tensor(name, datatype, shape, mv[start:end], {}))
        return InferResponse(known.model_name, outputs, known.model_version, None, {})

    def learn(self, header: Buffer, obj: Any, response: InferResponse) -> None:
        """Keep what the full decoder made (``response``) of the JSON ``header`` (parsed:
        ``obj``), when it is an answer of the kind kept."""
        if len(header) > MAX_HEAD or response.id is not None or response.parameters:
            return
        raw = obj.get("outputs")
        if type(raw) is not list or len(raw) != len(response.outputs):
            return
        outputs = []
        start = len(header)
        for item, t in zip(raw, response.outputs, strict=True):
            params = item.get("parameters")
            # in the binary section: declared so, and nothing else among its parameters
            if t.parameters or type(params) is not dict or params.get("binary_data_size") is None:
                return
            end = start + memoryview(t.data).nbytes
            outputs.append((t.name, t.datatype, t.shape, start, end))
            start = end
        section = start - len(header)
        known = self._known
        if len(known) >= self.KEPT:
            del known[next(iter(known))]
        known[bytes(header)] = _Known(
            response.model_name, response.model_version, tuple(outputs), section
        )
