"""The MindIE backend's mapping (``--backend mindie://host:port``): a v2 inference request for
the one model a MindIE server appears as, onto MindIE's native ``POST /infer``, and MindIE's
answers back (docs/protocol.md, MindIE: a MindIE server as backend). Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from v2proxy.codecs.dtypes import as_numpy, serialize_bytes
from v2proxy.codecs.json import loads
from v2proxy.core.errors import (
    BackendError,
    BackendUnavailable,
    BadGateway,
    CodecError,
    InvalidRequest,
    NotFound,
    ProxyError,
)
from v2proxy.core.model import Datatype, InferResponse, Tensor

OUTPUT = "text_output"
#: MindIE knobs a v2 request's parameters may give (``max_tokens`` is renamed)
PARAMETER_KNOBS = (
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "repetition_penalty",
    "do_sample",
    "typical_p",
    "watermark",
)
#: tensor name -> MindIE parameter
TENSOR_KNOBS = {
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "seed": "seed",
}
#: response parameters taken from MindIE's ``details``
DETAILS = ("finish_reason", "generated_tokens", "seed")


@dataclass(frozen=True, slots=True)
class InferCall:
    """What to send to MindIE's /infer: the JSON body and whether it streams."""

    body: dict[str, Any]
    stream: bool


def _scalar(tensor: Tensor) -> Any:
    values = as_numpy(tensor).reshape(-1)
    if values.size != 1:
        raise InvalidRequest(f"input '{tensor.name}' must hold one element, not {values.size}")
    value = values[0]
    if isinstance(value, np.floating):
        # the shortest text of the float32 value (0.95, not 0.949999988079071)
        return float(str(value))
    if isinstance(value, np.generic):
        return value.item()
    return value


def _prompt(tensor: Tensor) -> str | list[Any]:
    raw = _scalar(tensor)
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        raise InvalidRequest("input 'text_input' must hold UTF-8 text") from None
    if text.startswith("["):
        try:
            items = loads(text.encode(), what="text_input")
        except CodecError:
            return text
        if (
            isinstance(items, list)
            and items
            and all(isinstance(i, dict) and "type" in i for i in items)
        ):
            return items  # MindIE's multimodal list
    return text


def _normalise(params: dict[str, Any]) -> dict[str, Any]:
    """v2 LLM backends' "off" values, in the form MindIE takes."""
    out = dict(params)
    if out.get("temperature") == 0:
        del out["temperature"]
        out.setdefault("do_sample", False)
    if out.get("top_k") == 0:
        del out["top_k"]
    if out.get("top_p") == 1:
        del out["top_p"]
    return out


def infer_body(inputs: dict[str, Tensor], parameters: dict[str, Any]) -> InferCall:
    """The /infer call for a request's validated inputs (by name) and its parameters."""
    knobs: dict[str, Any] = {}
    for key, value in parameters.items():
        name = "max_new_tokens" if key == "max_tokens" else key
        if name in PARAMETER_KNOBS and value is not None:
            knobs[name] = value
    for name, knob in TENSOR_KNOBS.items():
        if name in inputs:
            knobs[knob] = _scalar(inputs[name])
    knobs = _normalise(knobs)
    knobs["details"] = True
    stream = bool(_scalar(inputs["stream"])) if "stream" in inputs else False
    body = {"inputs": _prompt(inputs["text_input"]), "stream": stream, "parameters": knobs}
    return InferCall(body, stream)


def text_response(
    model: str, request_id: str | None, text: str, parameters: dict[str, Any] | None = None
) -> InferResponse:
    """One response of the model: ``text_output`` [1] holding ``text``."""
    tensor = Tensor(OUTPUT, Datatype.BYTES, (1,), serialize_bytes([text.encode("utf-8")]))
    return InferResponse(
        model_name=model,
        outputs=[tensor],
        model_version="1",
        id=request_id,
        parameters=parameters or {},
    )


def _details(obj: dict[str, Any]) -> dict[str, Any]:
    details = obj.get("details")
    if not isinstance(details, dict):
        return {}
    return {k: details[k] for k in DETAILS if isinstance(details.get(k), str | int)}


def non_stream_response(model: str, request_id: str | None, body: bytes) -> InferResponse:
    """The response to a non-stream /infer answered 200 with ``body``."""
    try:
        obj = loads(body, what="MindIE response")
    except CodecError as exc:
        raise BadGateway(f"invalid answer from MindIE to /infer: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("generated_text"), str):
        raise BadGateway("invalid answer from MindIE to /infer: no 'generated_text' string")
    return text_response(model, request_id, obj["generated_text"], _details(obj))


def error_message(body: bytes | bytearray, status: int) -> str:
    """MindIE's ``error`` text (its body's text when it is not MindIE's JSON shape)."""
    try:
        obj = loads(body, what="MindIE error")
    except CodecError:
        text = bytes(body).decode("utf-8", "replace").strip()
        return text[:1000] or f"MindIE answered HTTP {status}"
    if isinstance(obj, dict) and "error" in obj:
        value = obj["error"]
        return value if isinstance(value, str) else str(value)
    return str(obj)[:1000]


def error_for(status: int, body: bytes | bytearray) -> ProxyError:
    """The v2 error for a MindIE error answer."""
    message = error_message(body, status)
    if status in (400, 413, 422):
        return InvalidRequest(message)
    if status == 404:
        return NotFound(message)
    if status in (424, 500):
        return BackendError(message, 500, "INTERNAL")
    if status == 503:
        if not body:
            message = "MindIE is not ready (HTTP 503)"
        return BackendUnavailable(message)
    return BackendError(message, status if 400 <= status < 600 else 502)


@dataclass(slots=True)
class SseParser:
    """Events of a ``text/event-stream`` body fed in arbitrary pieces: each ``data:`` event's JSON
    (a dict), or the text of a block that is not a ``data:`` event (MindIE's raw error line)."""

    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[dict[str, Any] | str]:
        self._buffer += chunk
        data = self._buffer.replace(b"\r\n", b"\n")
        *blocks, rest = data.split(b"\n\n")
        self._buffer = bytearray(rest)
        return [e for b in blocks if (e := _event(bytes(b))) is not None]

    def finish(self) -> list[dict[str, Any] | str]:
        rest, self._buffer = bytes(self._buffer), bytearray()
        event = _event(rest.replace(b"\r\n", b"\n"))
        return [] if event is None else [event]


def _event(block: bytes) -> dict[str, Any] | str | None:
    text = block.decode("utf-8", "replace").strip("\n")
    if not text.strip():
        return None
    data = [line[5:].removeprefix(" ") for line in text.split("\n") if line.startswith("data:")]
    if not data:
        if all(line.startswith(":") for line in text.split("\n")):
            return None  # comments only
        return text.strip()
    payload = "\n".join(data)
    try:
        obj = loads(payload.encode(), what="MindIE stream event")
    except CodecError:
        return payload
    return obj if isinstance(obj, dict) else payload


@dataclass(slots=True)
class StreamMapper:
    """MindIE stream events -> the model's responses (one per token with text)."""

    model: str
    request_id: str | None
    sent: str = ""
    done: bool = False

    def map(self, event: dict[str, Any] | str) -> InferResponse | None:
        """The response for ``event`` (None when it adds no text); raises the stream's error."""
        if self.done:
            raise BadGateway("MindIE sent events after the final one")
        if isinstance(event, str):
            raise BackendError(f"MindIE stream failed: {event[:1000]}", 500, "INTERNAL")
        if "error" in event:
            message = event["error"]
            raise BackendError(f"MindIE stream failed: {message}", 500, "INTERNAL")
        token = event.get("token")
        if not isinstance(token, dict):
            raise BadGateway("invalid event from MindIE: no 'token' object")
        if "generated_text" in event:
            self.done = True
            full = event["generated_text"]
            if not isinstance(full, str):
                raise BadGateway("invalid final event from MindIE: 'generated_text' not text")
            text = token.get("text")
            if full.startswith(self.sent):
                delta = full[len(self.sent) :]
            else:
                delta = text if isinstance(text, str) else ""
            self.sent += delta
            details = _details(event)
            if not delta:
                return None
            return text_response(self.model, self.request_id, delta, details)
        text = token.get("text")
        if not isinstance(text, str):
            raise BadGateway("invalid event from MindIE: 'token.text' is not text")
        if not text:
            return None
        self.sent += text
        return text_response(self.model, self.request_id, text)

    def end(self) -> None:
        """The body ended: raise unless the final event came."""
        if not self.done:
            raise BadGateway("MindIE's stream ended before its final event")
