"""Fuzz target: the OpenAI-compatible routes' codecs. A client's ``/v1/completions`` or
``/v1/chat/completions`` body validated (codecs.openai: parse_completion, parse_chat); an accepted
chat's messages rendered by the default chat template and by a ChatML-like one compiled here
(codecs.chat_template); then, for every accepted request, a generated text cut by the request's
stop sequences (codecs.openai_answer.StopScanner) fed in pieces, and the answers written from
what it lets through (Chunks' stream events, the whole answer, finish_reason).

Input: three control bytes (little-endian), then the body. Control bits: 0 chat instead of
completions; 1 a small --max-input-size (16 bytes); 2 the generated text is the body's own bytes
(UTF-8, invalid bytes replaced: they hold the stop sequences themselves) instead of the prompt
(the completion's prompt, the chat's messages as the default template renders them); 3-5 the
piece size (PIECES), except 0: pieces of 1-4 characters, each size from two bits of bits 8-15 in
turn (with stop sequences the text is also fed one character at a time); 6-7 the finish reason
the backend reports (REPORTED). Bit 16: the stop scanner alone, no request: bits 17-18 give the
number of stop sequences less one, the body's first two bytes per stop sequence its offset
(modulo the text's length) and length (1-8 characters) in the text, which is the rest of the body
(UTF-8, invalid bytes replaced), less as many characters at its end as bits 19-21 say: stop
sequences that overlap and hold one another, and the text ending inside one, which request bodies
seldom bring.

Invariants: the parsers and each template's render return or raise InvalidField with a message
and a str ``field`` (any other error, a ProxyError subclass included, is a failure); an accepted
request holds what the parser promises (a prompt within the limit, at most 4 non-empty stop
sequences); the default template writes ``<role>: <content>`` lines then ``assistant:``; the
scanner's output, however the text is split, is the text cut before the first occurrence of any
stop sequence (``min(text.find(s))`` over those found), and it reports a stop exactly then; the
finish reason is ``stop`` or ``length`` (``stop`` when a stop sequence ended the text); every
stream event is ``data: <json>\\n\\n`` and the events' texts join to the scanner's output; the
non-stream objects and the error object are JSON holding the text and the message.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzzlib import expect, instrumented, main, take

with instrumented(__name__ == "__main__"):
    from v2proxy.codecs import chat_template as ct
    from v2proxy.codecs import openai as oc
    from v2proxy.codecs import openai_answer as answer
    from v2proxy.codecs.json import dumps
    from v2proxy.core.errors import InvalidField

DEFAULT = ct.default_template()
#: ChatML-like, refusing a system message anywhere but first (as many model templates do)
CHATML = ct.compile_template(
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('a system message must come first') }}"
    "{% endif %}"
    "<|im_start|>{{ m['role'] }}{% if m['name'] is defined %} {{ m['name'] }}{% endif %}\n"
    "{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "fuzz ChatML",
    bos_token="<s>",
)
SMALL = 16
LARGE = 1 << 20
PIECES = (0, 1, 2, 3, 5, 16, 64, 1 << 16)
REPORTED = (None, "length", "eos_token", "unknown")
T = TypeVar("T")


def refused(fn: Callable[..., T], *args: Any) -> T | None:
    """``fn``'s result, or None when it raised InvalidField (a fine answer, with a message and a
    str field); any other exception, other ProxyErrors included, propagates as a failure."""
    try:
        return fn(*args)
    except InvalidField as exc:
        expect(bool(exc.message), f"InvalidField without a message: {exc!r}")
        expect(isinstance(exc.field, str), f"InvalidField with a field {exc.field!r}")
        obj = json.loads(dumps(answer.error(exc.message, "invalid_request_error", exc.field, None)))
        expect(obj["error"]["message"] == exc.message, "the error object lost the message")
        return None


def pieces(text: str, control: int) -> list[str]:
    """``text`` split as control bits 3-5 (and 8-15) say."""
    size = PIECES[(control >> 3) & 7]
    if size:
        return [text[i : i + size] for i in range(0, len(text), size)] or [""]
    out, i, k = [], 0, 0
    while i < len(text):
        n = ((control >> (8 + 2 * (k % 4))) & 3) + 1
        out.append(text[i : i + n])
        i, k = i + n, k + 1
    return out or [""]


def expected(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def scan(parts: list[str], stops: tuple[str, ...]) -> tuple[list[str], bool]:
    """What the scanner lets through, piece by piece, as the frontend feeds it (until it
    stops; what it held back at the end), and whether it stopped."""
    scanner = answer.StopScanner(stops)
    out = []
    for part in parts:
        out.append(scanner.feed(part))
        if scanner.stopped:
            break
    if not scanner.stopped:
        out.append(scanner.flush())
    return [p for p in out if p], scanner.stopped


def payload(ev: bytes) -> Any:
    expect(ev.startswith(b"data: ") and ev.endswith(b"\n\n"), f"not an SSE event: {ev[:60]!r}")
    return json.loads(ev[6:-2])


def answers(req: oc.OpenAIRequest, sent: list[str], stopped: bool, reported: str | None) -> None:
    """The stream's events and the non-stream object written from the scanner's output."""
    text = "".join(sent)
    limit = req.max_tokens or 16
    reason = answer.finish_reason(reported, stopped, len(sent), limit)
    expect(reason in ("stop", "length"), f"finish reason {reason!r}")
    expect(reason == "stop" or not stopped, "a stop sequence ended the text, not 'stop'")
    counts = answer.usage(len(req.prompt.split()), len(sent))
    chunks = answer.Chunks(req.chat, "id-1", 7, req.model, req.include_usage)
    got = []
    for i, part in enumerate(sent):
        obj = payload(chunks.text(part))
        expect(obj["model"] == req.model, "a chunk lost the model")
        choice = obj["choices"][0]
        if req.chat:
            expect(("role" in choice["delta"]) == (i == 0), "the role is not in the first chunk")
            got.append(choice["delta"]["content"])
        else:
            got.append(choice["text"])
        expect(("usage" in obj) == req.include_usage, "usage null in a chunk")
    expect("".join(got) == text, "the chunks' texts do not join to the text")
    last = payload(chunks.finish(reason))
    expect(last["choices"][0]["finish_reason"] == reason, "the finish chunk lost the reason")
    if req.include_usage:
        expect(payload(chunks.usage(counts))["usage"] == counts, "the usage chunk lost the counts")
    whole = json.loads(answer.whole(req.chat, "id-1", 7, req.model, text, reason, counts))
    choice = whole["choices"][0]
    expect((choice["message"]["content"] if req.chat else choice["text"]) == text, "text lost")


def render(req: oc.OpenAIRequest) -> str | None:
    """The messages by both templates; the default's prompt (None when it refused them)."""
    prompt = refused(DEFAULT.render, req.messages)
    if prompt is not None:
        lines = "".join(f"{m['role']}: {m['content']}\n" for m in req.messages)
        expect(prompt == lines + "assistant:", f"the default template wrote {prompt[:80]!r}")
    chatml = refused(CHATML.render, req.messages)
    expect(chatml is None or isinstance(chatml, str), "ChatML rendered no text")
    return prompt


def check_scanner(text: str, stops: tuple[str, ...], control: int) -> tuple[list[str], bool]:
    """The scanner's output for ``text`` in the pieces ``control`` says (and, with stop
    sequences, one character at a time) is the text cut at the first stop sequence."""
    want = expected(text, stops)
    if stops and len(text) > 1:  # every split point
        sent, stopped = scan(list(text), stops)
        expect(("".join(sent), stopped) == want, f"one by one: {sent!r} ({stopped}), {want!r}")
    sent, stopped = scan(pieces(text, control), stops)
    expect(("".join(sent), stopped) == want, f"scanner sent {sent!r} ({stopped}), want {want!r}")
    return sent, stopped


def scanner_alone(body: bytes, control: int) -> None:
    """Stop sequences cut from the text itself (so that they occur in it, overlapping)."""
    count = ((control >> 17) & 3) + 1
    head, text = body[: 2 * count], body[2 * count :].decode("utf-8", "replace")
    if len(head) < 2 * count or not text:
        return
    stops = []
    for i in range(count):
        at = head[2 * i] % len(text)
        stops.append(text[at : at + (head[2 * i + 1] & 7) + 1])
    text = text[: len(text) - ((control >> 19) & 7)]  # the end of a stop sequence may not come
    req = oc.OpenAIRequest(bool(control & 1), "m", stop=tuple(stops), include_usage=True)
    sent, stopped = check_scanner(text, req.stop, control)
    answers(req, sent, stopped, REPORTED[(control >> 6) & 3])


def test_one_input(data: bytes) -> None:
    control, body = take(data, 3)
    if control & (1 << 16):
        scanner_alone(body, control)
        return
    chat = bool(control & 1)
    limit = SMALL if control & 2 else LARGE
    req = refused(oc.parse_chat if chat else oc.parse_completion, body, limit)
    if req is None:
        return
    expect(req.chat == chat, "the request's kind changed")
    expect(len(req.stop) <= oc.MAX_STOP and all(req.stop), f"stop sequences {req.stop!r}")
    size = sum(len(m["content"].encode()) for m in req.messages) + len(req.prompt.encode())
    expect(size <= limit, "a prompt or messages over the limit were accepted")
    prompt = render(req) if chat else req.prompt
    if control & 4:
        text = body.decode("utf-8", "replace")
    elif prompt is not None:
        text = prompt
    else:
        return
    sent, stopped = check_scanner(text, req.stop, control)
    answers(req, sent, stopped, REPORTED[(control >> 6) & 3])


if __name__ == "__main__":
    main(test_one_input)
