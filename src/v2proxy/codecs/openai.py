"""OpenAI's ``POST /v1/completions`` and ``POST /v1/chat/completions`` request bodies, validated
before any backend is called (docs/guides/openai.md)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from v2proxy.codecs.json import loads
from v2proxy.core.errors import CodecError, InvalidField, InvalidText

ROLES = ("system", "developer", "user", "assistant", "tool")
#: OpenAI's limit
MAX_STOP = 4
SEED_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What the deployment bounds in a request beside its size (the settings of these names)."""

    max_chat_messages: int = 1024
    max_stops: int = MAX_STOP
    max_stop_length: int = 1024


LIMITS = RequestLimits()


@dataclass(slots=True)
class OpenAIRequest:
    """A validated completions or chat request."""

    chat: bool
    model: str
    #: completions: the prompt; chat: empty (rendered from ``messages`` by the chat template)
    prompt: str = ""
    #: chat: each ``{"role", "content"[, "name"]}`` with ``content`` a string
    messages: list[dict[str, Any]] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


def _literal(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and not (isinstance(value, float) and (math.isnan(value) or math.isinf(value)))
    )


def _number(doc: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if not _is_number(value):
        raise InvalidField(f"'{key}' must be a number, got {_literal(value)}", key)
    if not low <= value <= high:
        raise InvalidField(f"'{key}' must be between {low:g} and {high:g}, got {value}", key)
    return float(value)


def _bool(doc: dict[str, Any], key: str, where: str = "") -> bool | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise InvalidField(
            f"'{where}{key}' must be a boolean, got {_literal(value)}", f"{where}{key}"
        )
    return value


def _max_tokens(doc: dict[str, Any], chat: bool) -> int | None:
    key = (
        "max_completion_tokens"
        if chat and doc.get("max_completion_tokens") is not None
        else ("max_tokens")
    )
    value = doc.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise InvalidField(f"'{key}' must be an integer, got {_literal(value)}", key)
    if not 1 <= value <= 2**31 - 1:
        raise InvalidField(f"'{key}' must be at least 1 (and below 2**31), got {value}", key)
    return int(value)


def _seed(doc: dict[str, Any]) -> int | None:
    value = doc.get("seed")
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= SEED_MAX:
        raise InvalidField(
            f"'seed' must be an integer between 0 and {SEED_MAX}, got {_literal(value)}", "seed"
        )
    return int(value)


def _stop(doc: dict[str, Any], limits: RequestLimits) -> tuple[str, ...]:
    value = doc.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise InvalidField(
            f"'stop' must be a string or a list of strings, got {_literal(value)}", "stop"
        )
    if len(items) > limits.max_stops:
        most = limits.max_stops
        raise InvalidField(
            f"'stop' may hold at most {most} sequences (--max-stops), got {len(items)}", "stop"
        )
    longest = limits.max_stop_length
    for i, item in enumerate(items):
        where = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(item, str) or not item:
            raise InvalidField(f"'{where}' must be a non-empty string, got {_literal(item)}", where)
        if len(item) > longest:
            raise InvalidField(
                f"'{where}' is {len(item)} characters long, over the limit of {longest}"
                " (--max-stop-length)",
                where,
            )
    return tuple(items)


#: key -> what it asks for, refused unless it asks for nothing
_REFUSED: tuple[tuple[str, str], ...] = (
    ("logprobs", "log probabilities"),
    ("top_logprobs", "log probabilities"),
    ("echo", "echoing the prompt"),
    ("suffix", "a suffix"),
    ("logit_bias", "logit bias"),
    ("presence_penalty", "a presence penalty"),
    ("frequency_penalty", "a frequency penalty"),
    ("tools", "tool calls"),
    ("functions", "function calls"),
)


def _asks(value: Any) -> bool:
    return not (value is None or value is False or value in ("", [], {})) and (
        isinstance(value, bool) or value != 0
    )


def _one(doc: dict[str, Any], key: str) -> None:
    value = doc.get(key)
    if value is not None and (isinstance(value, bool) or value != 1):
        raise InvalidField(
            f"'{key}' must be 1: v2proxy generates one choice, got {_literal(value)}", key
        )


def _refuse_features(doc: dict[str, Any]) -> None:
    for key, what in _REFUSED:
        if _asks(doc.get(key)):
            raise InvalidField(f"'{key}': v2proxy does not support {what}", key)
    _one(doc, "n")
    _one(doc, "best_of")
    choice = doc.get("tool_choice")
    if choice is not None and choice != "none":
        raise InvalidField("'tool_choice': v2proxy does not support tool calls", "tool_choice")
    fmt = doc.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise InvalidField(
            '\'response_format\': v2proxy supports only {"type": "text"}', "response_format"
        )


def _body(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    try:
        doc = loads(body)
    except InvalidText as exc:
        where = exc.field or "body"
        raise InvalidField(
            f"'{where}' must be valid UTF-8 text, got a lone surrogate {exc.char}", exc.field
        ) from None
    except CodecError as exc:
        raise InvalidField(f"the body is not valid JSON: {exc.message}", "") from None
    if not isinstance(doc, dict):
        raise InvalidField("the body must be a JSON object", "")
    return doc


def _common(doc: dict[str, Any], chat: bool, limits: RequestLimits) -> OpenAIRequest:
    model = doc.get("model")
    if model is None:
        raise InvalidField("'model' is required", "model")
    if not isinstance(model, str) or not model:
        raise InvalidField(f"'model' must be a non-empty string, got {_literal(model)}", "model")
    req = OpenAIRequest(chat, model)
    req.stream = bool(_bool(doc, "stream"))
    options = doc.get("stream_options")
    if options is not None:
        if not req.stream:
            raise InvalidField(
                "'stream_options' is only allowed when 'stream' is true", "stream_options"
            )
        if not isinstance(options, dict):
            raise InvalidField(
                f"'stream_options' must be an object, got {_literal(options)}", "stream_options"
            )
        req.include_usage = bool(_bool(options, "include_usage", "stream_options."))
    req.max_tokens = _max_tokens(doc, chat)
    req.temperature = _number(doc, "temperature", 0.0, 2.0)
    req.top_p = _number(doc, "top_p", 0.0, 1.0)
    req.seed = _seed(doc)
    req.stop = _stop(doc, limits)
    _refuse_features(doc)
    return req


def too_large(what: str, size: int, limit: int) -> InvalidField:
    return InvalidField(
        f"'{what}' is {size} bytes, over the limit of {limit} bytes (--max-input-size)", what
    )


def parse_completion(
    body: bytes | bytearray | memoryview, max_input_size: int, limits: RequestLimits = LIMITS
) -> OpenAIRequest:
    """A validated ``/v1/completions`` body, or InvalidField naming the field at fault."""
    doc = _body(body)
    prompt = doc.get("prompt")
    if prompt is None:
        raise InvalidField("'prompt' is required", "prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            kind = "token ids" if prompt and not isinstance(prompt[0], str) else "batches"
            raise InvalidField(
                f"'prompt' must be a string or a list of one string: v2proxy takes no {kind}"
                f" (got a list of {len(prompt)})",
                "prompt",
            )
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidField(f"'prompt' must be a string, got {_literal(prompt)}", "prompt")
    req = _common(doc, False, limits)
    size = len(prompt.encode())
    if size > max_input_size:
        raise too_large("prompt", size, max_input_size)
    req.prompt = prompt
    return req


def _content(value: Any, where: str) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise InvalidField(
            f"'{where}' must be a string or a list of content parts, got {_literal(value)}", where
        )
    texts = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise InvalidField(f"'{at}' must be an object, got {_literal(part)}", at)
        kind = part.get("type")
        if kind != "text":
            raise InvalidField(
                f"'{at}.type' must be 'text': v2proxy passes text to the model,"
                f" got {_literal(kind)}",
                f"{at}.type",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidField(f"'{at}.text' must be a string, got {_literal(text)}", f"{at}.text")
        texts.append(text)
    return "\n".join(texts)


def _too_many(limit: int, got: str) -> InvalidField:
    return InvalidField(
        f"'messages' may hold at most {limit} messages, got {got} (--max-chat-messages)",
        "messages",
    )


def _messages(value: Any, max_input_size: int, limit: int) -> list[dict[str, Any]]:
    if value is None:
        raise InvalidField("'messages' is required", "messages")
    if not isinstance(value, list) or not value:
        raise InvalidField("'messages' must be a non-empty list of messages", "messages")
    if len(value) > limit:
        raise _too_many(limit, str(len(value)))
    out: list[dict[str, Any]] = []
    size = 0
    for i, message in enumerate(value):
        at = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidField(f"'{at}' must be an object, got {_literal(message)}", at)
        role = message.get("role")
        if role not in ROLES:
            raise InvalidField(
                f"'{at}.role' must be one of {', '.join(ROLES)}, got {_literal(role)}",
                f"{at}.role",
            )
        content = _content(message.get("content"), f"{at}.content")
        size += len(content.encode())
        item: dict[str, Any] = {"role": role, "content": content}
        name = message.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise InvalidField(
                    f"'{at}.name' must be a string, got {_literal(name)}", f"{at}.name"
                )
            item["name"] = name
        out.append(item)
    if size > max_input_size:
        raise too_large("messages", size, max_input_size)
    return out


def parse_chat(
    body: bytes | bytearray | memoryview, max_input_size: int, limits: RequestLimits = LIMITS
) -> OpenAIRequest:
    """A validated ``/v1/chat/completions`` body, or InvalidField naming the field at fault."""
    limit = limits.max_chat_messages
    if messages_over(body, limit):
        raise _too_many(limit, "more")
    doc = _body(body)
    messages = _messages(doc.get("messages"), max_input_size, limit)
    req = _common(doc, True, limits)
    req.messages = messages
    return req


#: JSON's tokens, as far as :func:`messages_over` needs them
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]|[^\[\]{}:,"]+')
_TOKENS_PER_MESSAGE = 32


def messages_over(body: bytes | bytearray | memoryview, limit: int) -> bool:
    """Whether the body's top-level ``messages`` array holds more than ``limit`` items, told from
    its bytes without parsing them into objects; False when it can't tell."""
    data = body.tobytes() if isinstance(body, memoryview) else body
    if data.count(b"{") <= limit:
        return False
    depth, key, items, inside = 0, b"", 0, False
    budget = _TOKENS_PER_MESSAGE * (limit + 1) + 1024
    for n, m in enumerate(_TOKENS.finditer(data)):
        if n > budget:
            return False
        tok = m.group()
        first = tok[0]
        if first in b"[{":
            depth += 1
            if depth == 2 and key == b'"messages"' and first == 91:  # "["
                inside, items = True, 0
            elif inside and depth == 3 and items == 0:
                items = 1
        elif first in b"]}":
            if inside and depth == 2:
                inside = False
            depth -= 1
        elif inside and depth == 2:
            if tok == b",":
                items += 1
                if items > limit:
                    return True
            elif items == 0 and not tok.isspace():
                items = 1
        elif depth == 1 and first == 34:  # '"': a key (or a value; the next key replaces it)
            key = tok
    return False
