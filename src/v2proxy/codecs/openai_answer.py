"""OpenAI's answers, written from generated text (docs/guides/openai.md): the completion and chat
completion objects, their stream chunks and ``data: [DONE]``, the model list, the error shape
``{"error": {"message", "type", "param", "code"}}``, and the two rules the proxy applies to the
generated text itself: stop sequences (:class:`StopScanner`) and the finish reason
(:func:`finish_reason`).

Stop sequences are applied here, whatever the backend does with them: the text is cut before the
first occurrence of any of them and the generation ends (``finish_reason`` ``stop``). In a stream
the scanner holds back as many characters as a stop sequence could still need (its longest
length less one), so that no part of a stop sequence is ever sent. The first occurrence is the
one that begins first, however the text arrives: a stop sequence found while a longer one that
begins before it may still be completing (``b`` in ``ab`` with the stops ``abc`` and ``b``) ends
nothing until the text that follows decides.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from v2proxy.codecs.json import dumps

#: the last event of every stream
DONE = b"data: [DONE]\n\n"
#: the owner named in ``/v1/models``
OWNED_BY = "v2proxy"
#: backend finish reasons (as the MindIE mapping reads them) -> OpenAI's
_REASONS = {
    "length": "length",
    "eos_token": "stop",
    "stop": "stop",
    "stop_sequence": "stop",
    "abort": "stop",
}


class StopScanner:
    """Cuts generated text at the first stop sequence, fed piece by piece (:meth:`feed`); what it
    holds back is given by :meth:`flush` when the generation ends (up to a stop sequence it
    holds)."""

    __slots__ = ("held", "hold", "stopped", "stops")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that can be sent now; sets :attr:`stopped` when a stop sequence was found
        (nothing is sent from it on)."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        text = self.held + piece
        cut = self._first(text)
        if cut >= 0:
            # a longer stop sequence that begins before this one may still be under way
            # ("abc" when "b" is found in "ab"): wait for the text that decides
            under_way = self._under_way(text, cut)
            if under_way < 0:
                self.stopped = True
                self.held = ""
                return text[:cut]
            self.held = text[under_way:]
            return text[:under_way]
        keep = min(self.hold, len(text))
        if keep:
            self.held = text[-keep:]
            return text[:-keep]
        self.held = ""
        return text

    def flush(self) -> str:
        """What was held back, once the generation has ended, up to a stop sequence it holds
        (then :attr:`stopped` is set)."""
        held, self.held = self.held, ""
        cut = self._first(held)
        if cut >= 0:
            self.stopped = True
            return held[:cut]
        return held

    def _first(self, text: str) -> int:
        """Where the first occurrence of any stop sequence in ``text`` begins, or -1."""
        return min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)

    def _under_way(self, text: str, before: int) -> int:
        """The first position before ``before`` from which the rest of ``text`` is the start
        of a longer stop sequence (one that more text may complete), or -1."""
        for at in range(max(0, len(text) - self.hold), before):
            tail = text[at:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self.stops):
                return at
        return -1


def finish_reason(reported: str | None, stopped: bool, tokens: int, max_tokens: int) -> str:
    """``stop`` when a stop sequence ended the text; else the backend's reason in OpenAI's words
    when it gives one; else ``length`` when ``max_tokens`` were generated and ``stop`` otherwise
    (an approximation)."""
    if stopped:
        return "stop"
    if reported is not None and reported in _REASONS:
        return _REASONS[reported]
    return "length" if tokens >= max_tokens else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def whole(
    chat: bool, rid: str, created: int, model: str, text: str, reason: str, counts: dict[str, int]
) -> bytes:
    """The non-stream answer: a ``chat.completion`` (the text as the assistant's message) or a
    ``text_completion``."""
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    choice["logprobs"] = None
    choice["finish_reason"] = reason
    return dumps(
        {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": counts,
        }
    )


def event(obj: Any) -> bytes:
    """One server-sent event."""
    return b"data: " + dumps(obj) + b"\n\n"


class Chunks:
    """The chunks of one stream: completions (``text_completion``) or chat
    (``chat.completion.chunk``, the first carrying the assistant's role); with ``include_usage``
    every chunk has ``"usage": null`` and :meth:`usage` writes the last one, with no choices."""

    __slots__ = ("base", "chat", "include_usage", "started")

    def __init__(self, chat: bool, rid: str, created: int, model: str, include_usage: bool) -> None:
        self.chat = chat
        self.include_usage = include_usage
        self.started = False
        self.base: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }

    def _event(self, choice: dict[str, Any]) -> bytes:
        obj = dict(self.base)
        obj["choices"] = [choice]
        if self.include_usage:
            obj["usage"] = None
        return event(obj)

    def text(self, text: str) -> bytes:
        """A chunk of generated text."""
        if not self.chat:
            return self._event({"index": 0, "text": text, "logprobs": None, "finish_reason": None})
        delta: dict[str, Any] = {"content": text}
        if not self.started:
            delta = {"role": "assistant", "content": text}
            self.started = True
        return self._event({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})

    def finish(self, reason: str) -> bytes:
        """The chunk that carries the finish reason (chat: with an empty delta, or the role's
        when no text came)."""
        if not self.chat:
            return self._event({"index": 0, "text": "", "logprobs": None, "finish_reason": reason})
        delta: dict[str, Any] = {} if self.started else {"role": "assistant", "content": ""}
        self.started = True
        return self._event({"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason})

    def usage(self, counts: dict[str, int]) -> bytes:
        """The last chunk of a stream with ``include_usage``."""
        obj = dict(self.base)
        obj["choices"] = []
        obj["usage"] = counts
        return event(obj)


def models(ids: list[str], created: int) -> bytes:
    """``GET /v1/models``."""
    return dumps({"object": "list", "data": [model(i, created) for i in ids]})


def model(model_id: str, created: int) -> dict[str, Any]:
    """One model object (``GET /v1/models/{model}`` answers it alone)."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": OWNED_BY}


def error(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
