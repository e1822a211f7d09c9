"""OpenAI request bodies (v2proxy.codecs.openai) and answers (v2proxy.codecs.openai_answer):
table-driven, each malformed body named by the ``param`` OpenAI's error shape gives it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from v2proxy.codecs import openai_answer as answer
from v2proxy.codecs.openai import RequestLimits, messages_over, parse_chat, parse_completion
from v2proxy.codecs.openai_answer import Chunks, StopScanner, finish_reason
from v2proxy.core.errors import InvalidField

LIMIT = 1000


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def completion(**fields: Any) -> bytes:
    return body(**{"model": "m", "prompt": "hello", **fields})


def chat(**fields: Any) -> bytes:
    return body(**{"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_completion_defaults() -> None:
    req = parse_completion(completion(), LIMIT)
    assert (req.chat, req.model, req.prompt, req.stream, req.include_usage) == (
        False,
        "m",
        "hello",
        False,
        False,
    )
    assert (req.max_tokens, req.temperature, req.top_p, req.seed, req.stop) == (
        None,
        None,
        None,
        None,
        (),
    )


def test_completion_all_knobs() -> None:
    req = parse_completion(
        completion(
            prompt=["one prompt"],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=7,
            temperature=0.5,
            top_p=1,
            seed=42,
            stop="\n",
            n=1,
            best_of=1,
            logprobs=None,
            echo=False,
            presence_penalty=0,
            frequency_penalty=0.0,
            logit_bias={},
            user="someone",
            suffix="",
        ),
        LIMIT,
    )
    assert req.prompt == "one prompt"
    assert (req.stream, req.include_usage, req.max_tokens) == (True, True, 7)
    assert (req.temperature, req.top_p, req.seed, req.stop) == (0.5, 1.0, 42, ("\n",))


def test_chat_messages_and_max_completion_tokens_first() -> None:
    req = parse_chat(
        chat(
            messages=[
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None, "name": "bot"},
                {"role": "developer", "content": ""},
                {"role": "tool", "content": "42"},
            ],
            max_tokens=3,
            max_completion_tokens=9,
            stop=["x", "yy"],
            tool_choice="none",
            response_format={"type": "text"},
        ),
        LIMIT,
    )
    assert req.chat and req.max_tokens == 9 and req.stop == ("x", "yy")
    assert req.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "", "name": "bot"},
        {"role": "developer", "content": ""},
        {"role": "tool", "content": "42"},
    ]


#: (body, param, a fragment of the message)
COMPLETION_ERRORS: list[tuple[bytes, str, str]] = [
    (b"{", "", "not valid JSON"),
    (b"[1]", "", "JSON object"),
    (body(prompt="x"), "model", "'model' is required"),
    (body(model="", prompt="x"), "model", "non-empty string"),
    (body(model=3, prompt="x"), "model", "non-empty string"),
    (body(model="m"), "prompt", "'prompt' is required"),
    (completion(prompt=5), "prompt", "must be a string"),
    (completion(prompt=[1, 2, 3]), "prompt", "token ids"),
    (completion(prompt=["a", "b"]), "prompt", "batches"),
    (completion(prompt=[]), "prompt", "list of one string"),
    (completion(stream="yes"), "stream", "boolean"),
    (completion(stream_options={"include_usage": True}), "stream_options", "only allowed"),
    (completion(stream=True, stream_options=[]), "stream_options", "object"),
    (
        completion(stream=True, stream_options={"include_usage": 1}),
        "stream_options.include_usage",
        "boolean",
    ),
    (completion(max_tokens=0), "max_tokens", "at least 1"),
    (completion(max_tokens=1.5), "max_tokens", "integer"),
    (completion(max_tokens=True), "max_tokens", "integer"),
    (completion(temperature=2.5), "temperature", "between 0 and 2"),
    (completion(temperature="hot"), "temperature", "number"),
    (completion(top_p=-0.1), "top_p", "between 0 and 1"),
    (completion(seed=-1), "seed", "integer between 0"),
    (completion(seed=2**63), "seed", "integer between 0"),
    (completion(stop=5), "stop", "string or a list"),
    (completion(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
    (completion(stop="x" * 1025), "stop", "--max-stop-length"),
    (completion(stop=["a", "x" * 1025]), "stop[1]", "--max-stop-length"),
    (completion(stop=["a", ""]), "stop[1]", "non-empty string"),
    (completion(stop=""), "stop", "non-empty string"),
    (completion(n=2), "n", "must be 1"),
    (completion(n=True), "n", "must be 1"),
    (completion(best_of=3), "best_of", "must be 1"),
    (completion(logprobs=2), "logprobs", "log probabilities"),
    (completion(echo=True), "echo", "echoing"),
    (completion(suffix="end"), "suffix", "suffix"),
    (completion(logit_bias={"1": 2}), "logit_bias", "logit bias"),
    (completion(presence_penalty=0.5), "presence_penalty", "presence penalty"),
    (completion(frequency_penalty=-1), "frequency_penalty", "frequency penalty"),
    (completion(prompt="x" * (LIMIT + 1)), "prompt", "--max-input-size"),
    (b'{"model": "m", "prompt": "\\ud800"}', "prompt", "lone surrogate"),
]


@pytest.mark.parametrize(("raw", "param", "fragment"), COMPLETION_ERRORS)
def test_completion_errors_name_the_param(raw: bytes, param: str, fragment: str) -> None:
    with pytest.raises(InvalidField) as info:
        parse_completion(raw, LIMIT)
    assert info.value.field == param
    assert fragment in info.value.message
    assert info.value.http_status == 400


CHAT_ERRORS: list[tuple[bytes, str, str]] = [
    (body(model="m"), "messages", "'messages' is required"),
    (chat(messages=[]), "messages", "non-empty list"),
    (chat(messages="hi"), "messages", "non-empty list"),
    (chat(messages=["hi"]), "messages[0]", "object"),
    (chat(messages=[{"content": "x"}]), "messages[0].role", "one of system"),
    (chat(messages=[{"role": "god", "content": "x"}]), "messages[0].role", "one of system"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content", "content parts"),
    (
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages[0].content[0].type",
        "'text'",
    ),
    (
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        "messages[0].content[0].text",
        "string",
    ),
    (chat(messages=[{"role": "user", "content": ["x"]}]), "messages[0].content[0]", "object"),
    (chat(messages=[{"role": "user", "content": "x", "name": 1}]), "messages[0].name", "string"),
    (
        chat(messages=[{"role": "user", "content": "x" * (LIMIT + 1)}]),
        "messages",
        "--max-input-size",
    ),
    (chat(max_completion_tokens=0), "max_completion_tokens", "at least 1"),
    (chat(tools=[{"type": "function"}]), "tools", "tool calls"),
    (chat(tool_choice="auto"), "tool_choice", "tool calls"),
    (chat(response_format={"type": "json_object"}), "response_format", "text"),
    (chat(logprobs=True), "logprobs", "log probabilities"),
    (chat(top_logprobs=3), "top_logprobs", "log probabilities"),
]


def test_limits_are_the_deployments() -> None:
    limits = RequestLimits(max_chat_messages=2, max_stops=1, max_stop_length=3)
    assert parse_completion(completion(stop="abc"), LIMIT, limits).stop == ("abc",)
    for raw, fragment in [
        (completion(stop=["a", "b"]), "at most 1 sequences (--max-stops)"),
        (completion(stop="abcd"), "4 characters long, over the limit of 3 (--max-stop-length)"),
    ]:
        with pytest.raises(InvalidField) as info:
            parse_completion(raw, LIMIT, limits)
        assert info.value.field == "stop" and fragment in info.value.message
    two = [{"role": "user", "content": "x"}] * 2
    assert len(parse_chat(chat(messages=two), LIMIT, limits).messages) == 2
    with pytest.raises(InvalidField) as info:
        parse_chat(chat(messages=[*two, {"role": "user", "content": "y"}]), LIMIT, limits)
    assert info.value.field == "messages" and "at most 2 messages" in info.value.message


MESSAGE = {"role": "user", "content": "x"}


@pytest.mark.parametrize(
    ("doc", "limit", "over"),
    [
        ({"model": "m", "messages": [MESSAGE] * 3}, 2, True),
        ({"model": "m", "messages": [MESSAGE] * 2}, 2, False),
        ({"messages": [MESSAGE] * 3, "model": "m"}, 3, False),
        # braces elsewhere (strings, other fields) are not messages
        ({"model": "m", "user": "{{{{,,", "messages": [MESSAGE] * 2, "x": [{}] * 9}, 2, False),
        ({"model": "m", "x": {"messages": [MESSAGE] * 5}, "messages": [MESSAGE]}, 2, False),
        ({"model": "messages", "y": [[{}, {}, {}]], "messages": [MESSAGE] * 3}, 2, True),
        # items of any kind count: the parse refuses what is not a message
        ({"model": "m", "messages": [{}, 1, "a", [{}]]}, 1, True),
        ({"model": "m", "messages": [{"content": [{"type": "text", "text": "a"}] * 5}]}, 1, False),
    ],
)
def test_messages_over_counts_the_top_level_array(
    doc: dict[str, Any], limit: int, over: bool
) -> None:
    raw = json.dumps(doc).encode()
    for compact in (raw, json.dumps(doc, separators=(",", ":")).encode()):
        assert messages_over(compact, limit) is over
        assert messages_over(memoryview(compact), limit) is over


@pytest.mark.parametrize(("raw", "param", "fragment"), CHAT_ERRORS)
def test_chat_errors_name_the_param(raw: bytes, param: str, fragment: str) -> None:
    with pytest.raises(InvalidField) as info:
        parse_chat(raw, LIMIT)
    assert info.value.field == param
    assert fragment in info.value.message


# ---------------------------------------------------------------------- stop sequences


def _expected(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def _scan(pieces: list[str], stops: tuple[str, ...]) -> tuple[str, bool]:
    scanner = StopScanner(stops)
    out = []
    for piece in pieces:
        out.append(scanner.feed(piece))
        if scanner.stopped:
            break
    if not scanner.stopped:
        out.append(scanner.flush())
    return "".join(out), scanner.stopped


@pytest.mark.parametrize(
    ("pieces", "stops", "sent", "stopped"),
    [
        (["a b", " c d"], (), "a b c d", False),
        (["a b", " c d"], ("c",), "a b ", True),
        (["one tw", "o three"], ("two",), "one ", True),
        (["x", "y", "z"], ("yz", "q"), "x", True),
        (["abc"], ("abcd",), "abc", False),
        (["END"], ("END",), "", True),
        (["a", "b"], ("b", "ab"), "", True),  # the earliest occurrence wins
    ],
)
def test_stop_scanner_table(
    pieces: list[str], stops: tuple[str, ...], sent: str, stopped: bool
) -> None:
    assert _scan(pieces, stops) == (sent, stopped)


@given(
    st.text(alphabet="ab c", max_size=30),
    st.lists(st.integers(0, 30), max_size=6),
    st.lists(st.text(alphabet="ab c", min_size=1, max_size=4), max_size=4),
)
def test_stop_scanner_cuts_at_the_first_stop_however_the_text_is_split(
    text: str, cuts: list[int], stops: list[str]
) -> None:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[i:j] for i, j in zip([0, *points], [*points, len(text)], strict=True)]
    assert _scan(pieces, tuple(stops)) == _expected(text, tuple(stops))


class _Quadratic:
    """The scanner as it was (each position sliced again): the reference of what each piece
    sends, for small texts."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops, self.held, self.stopped = stops, "", False
        self.hold = max((len(s) for s in stops), default=1) - 1

    def _first(self, text: str) -> int:
        return min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        text = self.held + piece
        cut = self._first(text)
        if cut >= 0:
            for at in range(max(0, len(text) - self.hold), cut):
                tail = text[at:]
                if any(len(s) > len(tail) and s.startswith(tail) for s in self.stops):
                    self.held = tail
                    return text[:at]
            self.stopped, self.held = True, ""
            return text[:cut]
        keep = min(self.hold, len(text))
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        cut = self._first(held)
        if cut >= 0:
            self.stopped = True
            return held[:cut]
        return held


@given(
    st.text(alphabet="ab", max_size=80),
    st.lists(st.integers(0, 80), max_size=12),
    st.lists(st.text(alphabet="ab", min_size=1, max_size=12), max_size=4),
)
def test_stop_scanner_sends_what_the_quadratic_one_sent(
    text: str, cuts: list[int], stops: list[str]
) -> None:
    """Piece by piece, the linear scanner sends what the quadratic one sent (short pieces go
    through the automata, long ones through one search)."""
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[i:j] for i, j in zip([0, *points], [*points, len(text)], strict=True)]
    new, old = StopScanner(tuple(stops)), _Quadratic(tuple(stops))
    for piece in pieces:
        assert new.feed(piece) == old.feed(piece)
        assert new.stopped == old.stopped
        if new.stopped:
            break
    assert new.flush() == old.flush()
    assert new.stopped == old.stopped


def test_stop_scanner_work_follows_the_piece_not_the_stop() -> None:
    """A 1,000,000-character stop sequence that the text carries on for 300,000 characters, then
    breaks off, then a short one: the text is sent as before (was quadratic, then seconds per
    million characters)."""
    long = "ab" * 500_000
    scanner = StopScanner((long, "STOP"))
    sent = [scanner.feed("ab") for _ in range(150_000)]
    assert "".join(sent) == ""  # all of it may begin the long stop sequence
    assert scanner.feed("x") == ""
    sent = [scanner.feed(w) for w in (" one", " two", " STOP", " three")]
    assert "".join(sent) == "ab" * 150_000 + "x one two "
    assert scanner.stopped


def test_stop_scanner_never_sends_part_of_a_stop_sequence() -> None:
    scanner = StopScanner(("STOP",))
    assert scanner.feed("go ST") == "go"  # "ST" could begin STOP: held back
    assert scanner.feed("OR") == " S"
    assert scanner.flush() == "TOR"


# ---------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("reported", "stopped", "tokens", "limit", "reason"),
    [
        (None, True, 16, 16, "stop"),
        ("length", False, 3, 16, "length"),
        ("eos_token", False, 16, 16, "stop"),
        ("stop_sequence", False, 2, 16, "stop"),
        (None, False, 16, 16, "length"),
        (None, False, 3, 16, "stop"),
        ("something", False, 16, 16, "length"),
    ],
)
def test_finish_reason(
    reported: str | None, stopped: bool, tokens: int, limit: int, reason: str
) -> None:
    assert finish_reason(reported, stopped, tokens, limit) == reason


def test_completion_and_chat_objects() -> None:
    counts = answer.usage(3, 4)
    assert counts == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    doc = json.loads(answer.whole(False, "cmpl-1", 5, "m", "hi", "stop", counts))
    assert doc == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 5,
        "model": "m",
        "choices": [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}],
        "usage": counts,
    }
    doc = json.loads(answer.whole(True, "c-1", 5, "m", "hi", "length", counts))
    assert doc["object"] == "chat.completion"
    assert doc["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]


def _data(event: bytes) -> Any:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:-2])


def test_chat_chunks_role_first_usage_last() -> None:
    out = Chunks(True, "c-1", 5, "m", include_usage=True)
    first, second = _data(out.text("a")), _data(out.text("b"))
    assert first["object"] == "chat.completion.chunk" and first["usage"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert second["choices"][0]["delta"] == {"content": "b"}
    end = _data(out.finish("stop"))
    assert end["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    last = _data(out.usage(answer.usage(1, 2)))
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 3
    assert answer.DONE == b"data: [DONE]\n\n"


def test_chat_chunk_of_a_stream_without_text_carries_the_role() -> None:
    out = Chunks(True, "c-1", 5, "m", include_usage=False)
    end = _data(out.finish("stop"))
    assert "usage" not in end
    assert end["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_completion_chunks() -> None:
    out = Chunks(False, "cmpl-1", 5, "m", include_usage=False)
    doc = _data(out.text("x"))
    assert doc["object"] == "text_completion" and "usage" not in doc
    assert doc["choices"] == [{"index": 0, "text": "x", "logprobs": None, "finish_reason": None}]
    assert _data(out.finish("length"))["choices"][0]["finish_reason"] == "length"


def test_models_and_error_shapes() -> None:
    assert json.loads(answer.models(["a", "b/c"], 7)) == {
        "object": "list",
        "data": [
            {"id": "a", "object": "model", "created": 7, "owned_by": "v2proxy"},
            {"id": "b/c", "object": "model", "created": 7, "owned_by": "v2proxy"},
        ],
    }
    assert answer.error("bad", "invalid_request_error", "n", None) == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": None}
    }


# ---------------------------------------------------------------------- found by fuzzing


@pytest.mark.parametrize(
    ("pieces", "stops", "sent", "stopped"),
    [
        # fuzz_openai: "b" complete in "ab" while "abc", which began first, may still come
        (["a", "b", "c"], ("abc", "b"), "", True),
        (["ab", "c"], ("abc", "b"), "", True),
        (["abc"], ("abc", "b"), "", True),
        (["ab", "x"], ("abc", "b"), "a", True),  # "abc" did not come: "b" ends the text
        (["ab"], ("abc", "b"), "a", True),  # the generation ended first: cut at "b" anyway
        (["x", "ab", "cd"], ("abcd", "c"), "x", True),
        (["Step 1\n###", " Instruction"], ("\n### Instruction", "###"), "Step 1", True),
        (["Step 1\n###", " Answer"], ("\n### Instruction", "###"), "Step 1\n", True),
    ],
)
def test_stop_scanner_waits_for_a_longer_stop_sequence_that_began_first(
    pieces: list[str], stops: tuple[str, ...], sent: str, stopped: bool
) -> None:
    assert _scan(pieces, stops) == (sent, stopped)
    assert _expected("".join(pieces), stops) == (sent, stopped)


def test_stop_scanner_flush_cuts_at_a_stop_sequence_it_held() -> None:
    scanner = StopScanner(("abc", "b"))
    assert scanner.feed("xab") == "x"  # "ab" may begin "abc": held, with "b" in it
    assert not scanner.stopped
    assert scanner.flush() == "a"
    assert scanner.stopped
