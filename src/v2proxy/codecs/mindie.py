"""MindIE's native ``POST /infer`` request, validated as MindIE validates it
(docs/protocol.md, MindIE clients)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from v2proxy.codecs.json import dumps, loads
from v2proxy.core.errors import CodecError, InvalidText

FLT_MAX = 3.4028234663852886e38
INT32_MAX = 2**31 - 1
SEED_MAX = 2**63 - 1
#: media items a multimodal ``inputs`` list may hold (MindIE's MAX_MULTIMODAL_URL_NUM)
MAX_MEDIA = 20
MEDIA_TYPES = ("image_url", "video_url", "audio_url")
#: the upper bound of ``parameters.timeout`` in seconds (the documented (0, 3600]); a larger
#: configured default raises it
TIMEOUT_MAX = 3600


@dataclass(slots=True)
class MediaItem:
    """One media entry of a multimodal ``inputs`` list: its type and value (a string, or an
    OpenAI-style ``{"url": ...}`` object reduced to its url)."""

    kind: str
    url: str


@dataclass(slots=True)
class LlmRequest:
    """A validated generation request: MindIE's ``/infer`` parsed here, or an OpenAI request put so
    by the OpenAI frontend."""

    text: str
    stream: bool = False
    media: list[MediaItem] = field(default_factory=list)
    max_new_tokens: int = 20
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool | None = None
    seed: int = 0
    repetition_penalty: float | None = None
    watermark: bool | None = None
    priority: int = 5
    timeout: int = 600
    details: bool = False


def utf16_length(text: str) -> int:
    """Length in UTF-16 code units, as MindIE counts it (a non-BMP character counts 2)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2  # (parse_request refuses those)


def invalid(message: str) -> CodecError:
    return CodecError(message)


def _literal(value: Any) -> str:
    """The value as the client wrote it (JSON text), for messages."""
    try:
        return dumps(value).decode()
    except TypeError:
        return str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float)) and not isinstance(value, bool)


def _float(key: str, value: Any, low: float, high: float, closed_high: bool = True) -> float:
    if not _is_number(value) or (isinstance(value, float) and math.isnan(value)):
        raise invalid(f"{key} must be float type.")
    ok = low < value <= high if closed_high else low < value < high
    if not ok:
        close = "]" if closed_high else ")"
        bound = "3.40282e+38" if high == FLT_MAX else repr(float(high))
        raise invalid(
            f"Parameter {key} must be in ({float(low)!r},{bound}{close}, got {_literal(value)}."
        )
    return float(value)


def _int(key: str, value: Any, high: int) -> int:
    if not _is_int(value):
        raise invalid(f"{key} must be integer type.")
    if not 0 < value <= high:
        raise invalid(f"Parameter {key} must be in (0,{high}], got {value}.")
    return int(value)


def _unsigned(key: str, value: Any) -> int:
    if not _is_int(value) or value < 0:
        raise invalid(f"{key} must be unsigned integer type.")
    return int(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(f"{key} must be bool type.")
    return value


def _inputs_length_error(limit: int, length: int) -> CodecError:
    return invalid(
        "Inputs must be necessary and data type must be string and length in"
        f" (0, {limit}], but the length of inputs is {length}"
    )


def _parse_list(items: list[Any], limit: int) -> tuple[str, list[MediaItem]]:
    """A multimodal ``inputs`` list: its text items joined by newlines, and its media."""
    if not items:
        raise _inputs_length_error(limit, 0)
    texts: list[str] = []
    media: list[MediaItem] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid(f"inputs[{i}] must be object type.")
        kind = item.get("type")
        if kind == "text":
            text = item.get("text")
            if not isinstance(text, str):
                raise invalid(f"inputs[{i}].text must be string type.")
            texts.append(text)
        elif kind in MEDIA_TYPES:
            value = item.get(kind)
            if isinstance(value, dict):
                value = value.get("url")
            if value is None:
                raise invalid(f"inputs[{i}].{kind} must not be null.")
            if not isinstance(value, str) or not value:
                raise invalid(f"inputs[{i}].{kind} must be string type.")
            media.append(MediaItem(str(kind), value))
            if len(media) > MAX_MEDIA:
                raise invalid(f"The number of multimodal urls must be at most {MAX_MEDIA}.")
        else:
            raise invalid(f"inputs[{i}].type must be one of text, {', '.join(MEDIA_TYPES)}.")
    # MindIE applies the length limit to the list serialised again as one JSON string.
    length = utf16_length(dumps(items).decode())
    if length > limit:
        raise _inputs_length_error(limit, length)
    return "\n".join(texts), media


@dataclass(frozen=True, slots=True)
class Limits:
    """What the deployment decides: the defaults of absent knobs and the input bound."""

    max_input_chars: int = 4 * 1024 * 1024
    max_new_tokens: int = 20
    timeout: int = 600

    @property
    def timeout_max(self) -> int:
        return max(TIMEOUT_MAX, self.timeout)


#: knob -> (field, check) in the order MindIE checks them
_KNOBS: tuple[tuple[str, Callable[[str, Any, Limits], Any]], ...] = (
    ("temperature", lambda k, v, _: _float(k, v, 0.0, FLT_MAX)),
    ("top_k", lambda k, v, _: _int(k, v, INT32_MAX)),
    ("top_p", lambda k, v, _: _float(k, v, 0.0, 1.0, closed_high=False)),
    ("typical_p", lambda k, v, _: _float(k, v, 0.0, 1.0)),
    ("do_sample", lambda k, v, _: _bool(k, v)),
    ("seed", lambda k, v, _: _seed(v)),
    ("repetition_penalty", lambda k, v, _: _float(k, v, 0.0, FLT_MAX)),
    ("watermark", lambda k, v, _: _bool(k, v)),
    ("priority", lambda k, v, _: _priority(v)),
    ("timeout", lambda k, v, lim: _timeout(v, lim.timeout_max)),
    ("max_new_tokens", lambda k, v, _: _int(k, v, INT32_MAX)),
    ("details", lambda k, v, _: _bool(k, v)),
)


def _seed(value: Any) -> int:
    seed = _unsigned("seed", value)
    if seed > SEED_MAX:
        raise invalid(f"Parameter seed must be in [0,{SEED_MAX}], got {seed}.")
    return seed


def _priority(value: Any) -> int:
    p = _unsigned("priority", value)
    if not 1 <= p <= 5:
        raise invalid(f"Parameter priority must be in [1,5], got {p}.")
    return p


def _timeout(value: Any, high: int) -> int:
    t = _unsigned("timeout", value)
    if not 0 < t <= high:
        raise invalid(
            f"Parameter timeout must be strictly positive and small than {high} seconds, got {t}."
        )
    return t


def _text_error(exc: InvalidText) -> CodecError:
    """A string of the body that is no text (a lone surrogate escape), named in MindIE's
    words: ``inputs must be valid UTF-8 text, ...``."""
    if exc.in_key:
        where = f"keys of {exc.field}" if exc.field else "keys of the request body"
        return invalid(f"All {where} must be valid UTF-8 text, got a lone surrogate {exc.char}.")
    if not exc.field:
        return invalid("Request body must be json object type.")
    return invalid(f"{exc.field} must be valid UTF-8 text, got a lone surrogate {exc.char}.")


def parse_request(
    body: bytes | bytearray | memoryview, limits: Limits, draw_seed: Callable[[], int]
) -> LlmRequest:
    """The validated request, or CodecError with MindIE's message (the first rule broken)."""
    try:
        doc = loads(body)
    except InvalidText as exc:
        raise _text_error(exc) from None
    except CodecError:
        raise invalid("Request body is not a valid json.") from None
    if not isinstance(doc, dict):
        raise invalid("Request body must be json object type.")
    inputs = doc.get("inputs")
    if doc.get("input_id") is not None:
        if inputs is not None:
            raise invalid("Input conflict.")
        raise invalid("input_id is not supported: token ids cannot reach a v2 text model.")
    if inputs is None:
        raise invalid("Inputs must not be null.")
    limit = limits.max_input_chars
    media: list[MediaItem] = []
    if isinstance(inputs, str):
        length = utf16_length(inputs)
        if not 0 < length <= limit:
            raise _inputs_length_error(limit, length)
        text = inputs
    elif isinstance(inputs, list):
        text, media = _parse_list(inputs, limit)
    else:
        raise invalid("inputs must be string or list type.")
    req = LlmRequest(text, media=media)
    req.max_new_tokens = limits.max_new_tokens
    req.timeout = limits.timeout
    stream = doc.get("stream")
    if stream is not None:
        req.stream = _bool("stream", stream)
    params = doc.get("parameters")
    seed: int | None = None
    if params is not None:
        if not isinstance(params, dict):
            raise invalid("parameters must be object type.")
        for key, check in _KNOBS:
            value = params.get(key)
            if value is not None:
                checked = check(key, value, limits)
                if key == "seed":
                    seed = checked
                else:
                    setattr(req, key, checked)
    req.seed = draw_seed() if seed is None else seed
    return req
