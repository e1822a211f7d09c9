"""OpenAI's answers, written from generated text (docs/guides/openai.md): completion objects,
stream chunks, the model list, errors, stop sequences and the finish reason."""

from __future__ import annotations

from collections import deque
from typing import Any

from v2proxy.codecs.json import dumps

DONE = b"data: [DONE]\n\n"
OWNED_BY = "v2proxy"
#: backend finish reasons -> OpenAI's
_REASONS = {
    "length": "length",
    "eos_token": "stop",
    "stop": "stop",
    "stop_sequence": "stop",
    "abort": "stop",
}


class _Matcher:
    """One stop sequence's Knuth-Morris-Pratt state: ``q``, the length of its longest proper
    prefix ending the text so far; the failure table grows only as far as ``q`` has gone."""

    __slots__ = ("fail", "q", "stop")

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.q = 0
        #: fail[i]: the length of the longest proper prefix of stop[: i + 1] that ends it
        self.fail = [0]

    def _grow(self, upto: int) -> None:
        s, fail = self.stop, self.fail
        k = fail[-1]
        for i in range(len(fail), min(upto, len(s))):
            c = s[i]
            while k and s[k] != c:
                k = fail[k - 1]
            if s[k] == c:
                k += 1
            fail.append(k)

    def feed(self, piece: str, tail: str) -> int | None:
        """Where the first occurrence that ends in ``piece`` begins, from the piece's start
        (negative: in the text before it), or None."""
        s, n = self.stop, len(self.stop)
        if len(piece) < n - 1:
            q = self.q
            if q + len(piece) < n and s.startswith(piece, q):  # it carries a match on
                self.q = q + len(piece)
                self._grow(self.q)
                return None
            return self._step(piece, 0)
        window = tail + piece
        at = window.find(s)
        if at >= 0:
            return at - len(tail)
        self.q = 0
        self._step(window, len(window) - (n - 1))
        return None

    def _step(self, text: str, i: int) -> int | None:
        """The automaton run over ``text[i:]``: where an occurrence begins, or None."""
        s, n, fail = self.stop, len(self.stop), self.fail
        q, end = self.q, len(text)
        while i < end:
            if q == 0:
                i = text.find(s[0], i)
                if i < 0:
                    break
            c = text[i]
            while q and s[q] != c:
                q = fail[q - 1]
            if s[q] == c:
                q += 1
                if q == n:
                    self.q = 0
                    return i + 1 - n
                if len(fail) < q:
                    self._grow(q)
            i += 1
        self.q = q
        return None


class StopScanner:
    """Cuts generated text at the first stop sequence, fed piece by piece; :meth:`flush` gives
    what it held back when the generation ends."""

    __slots__ = (
        "first", "held", "hold", "live", "pos", "sent", "shortest", "skip", "stopped", "stops",
    )  # fmt: skip

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.shortest = min((len(s) for s in stops), default=1) - 1
        #: the text not sent yet: from ``skip`` in the first piece, from ``sent`` in the text
        self.held: deque[str] = deque()
        self.skip = 0
        self.sent = 0
        self.pos = 0
        self.live = [_Matcher(s) for s in stops]
        #: where the first stop sequence found begins (-1: none yet)
        self.first = -1
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that can be sent now; sets :attr:`stopped` when a stop sequence was found
        (nothing is sent from it on)."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        size = len(piece)
        tail = ""
        if size >= self.shortest:  # a long piece is searched with the text before it
            need = max((k for m in self.live if size >= (k := len(m.stop) - 1)), default=0)
            tail = self._last(need)
        for m in list(self.live):
            k = len(m.stop) - 1
            at = m.feed(piece, tail[max(0, len(tail) - k) :] if k and size >= k else "")
            if at is not None:
                self.live.remove(m)
                if self.first < 0 or self.pos + at < self.first:
                    self.first = self.pos + at
        self.pos += size
        self.held.append(piece)
        if self.first < 0:
            return self._take(self.pos - self.hold)
        # an earlier-starting longer sequence may still be under way ("abc" when "b" is found in
        # "ab"): send only what comes before it
        under_way = min(
            (b for m in self.live if m.q and (b := self.pos - m.q) < self.first), default=-1
        )
        if under_way < 0:
            self.stopped = True
            return self._take(self.first)
        return self._take(under_way)

    def flush(self) -> str:
        """What was held back, once the generation has ended, up to any stop sequence."""
        if self.first >= 0:
            self.stopped = True
            return self._take(self.first)
        return self._take(self.pos)

    def _take(self, upto: int) -> str:
        n = upto - self.sent
        if n <= 0:
            return ""
        self.sent = upto
        held, out = self.held, []
        while n:
            part, skip = held[0], self.skip
            left = len(part) - skip
            if left > n:
                out.append(part[skip : skip + n])
                self.skip += n
                break
            out.append(part[skip:] if skip else part)
            held.popleft()
            self.skip = 0
            n -= left
        return "".join(out)

    def _last(self, n: int) -> str:
        if n <= 0 or not self.held:
            return ""
        out: list[str] = []
        last = len(self.held) - 1
        for j, part in enumerate(reversed(self.held)):
            text = part[self.skip :] if j == last and self.skip else part
            out.append(text[-n:] if len(text) > n else text)
            n -= len(out[-1])
            if n <= 0:
                break
        return "".join(reversed(out))


def finish_reason(reported: str | None, stopped: bool, tokens: int, max_tokens: int) -> str:
    """``stop`` when a stop sequence ended the text; else the backend's reason; else ``length``
    when ``max_tokens`` were generated (an approximation)."""
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
    """The non-stream answer: a ``chat.completion`` or a ``text_completion``."""
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
    """The chunks of one stream; with ``include_usage`` every chunk has ``"usage": null`` and
    :meth:`usage` writes the last one."""

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
        if not self.chat:
            return self._event({"index": 0, "text": text, "logprobs": None, "finish_reason": None})
        delta: dict[str, Any] = {"content": text}
        if not self.started:
            delta = {"role": "assistant", "content": text}
            self.started = True
        return self._event({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})

    def finish(self, reason: str) -> bytes:
        """The chunk that carries the finish reason."""
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
    """One model object."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": OWNED_BY}


def error(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
