"""What a v2 backend answers, read as generated text, and MindIE's answers written from it
(docs/protocol.md, MindIE; docs/guides/mindie.md for what is approximated)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from v2proxy.codecs.dtypes import as_numpy, deserialize_bytes
from v2proxy.codecs.json import dumps
from v2proxy.core.errors import BackendError, BadGateway, CodecError
from v2proxy.core.model import Datatype, InferResponse

#: MindIE's error types by HTTP status (docs/protocol.md, MindIE clients)
ERROR_TYPES = {
    413: "Input Validation Error",
    422: "Input Validation Error",
    424: "Generation Error",
    500: "Incomplete Generation",
    503: "Service Unavailable",
    404: "NotFoundError",
    400: "Bad Request",
}
#: what MindIE writes, raw (no ``data:``), into a stream whose deadline passed
STREAM_TIMEOUT = b"Engine callback timeout: client timeout"
#: MindIE's message of a non-stream request whose deadline passed (500)
TIMEOUT_MESSAGE = "Engine callback timeout: client timeout"
#: vLLM's finish reasons -> MindIE's (MindIE reports an abort as stop_sequence)
_VLLM_REASONS = {"stop": "eos_token", "length": "length", "abort": "stop_sequence"}


@dataclass(slots=True)
class Chunk:
    """One backend response: generated text (a delta when streaming), the tokens it reports
    (None: the backend does not say) and its finish reason (None: not the last, or unknown)."""

    text: str
    tokens: int | None = None
    finish_reason: str | None = None


def _reason(value: Any) -> str | None:
    if isinstance(value, list):
        value = value[-1] if value else None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or value in ("", "None"):
        return None
    return _VLLM_REASONS.get(value, value)


def chunk_from_response(response: InferResponse) -> Chunk:
    """The chunk of a v2 response: ``text_output`` (elements joined), the token count of
    ``num_output_tokens`` (vLLM, summed) or ``output_log_probs`` (TensorRT-LLM, its last
    dimension), ``finish_reason`` (vLLM)."""
    chunk = Chunk("")
    try:
        for t in response.outputs:
            if t.name == "text_output" and t.datatype is Datatype.BYTES:
                chunk.text = "".join(
                    e.decode("utf-8", "replace") for e in deserialize_bytes(t.data)
                )
            elif t.name == "num_output_tokens" and t.datatype is not Datatype.BYTES:
                chunk.tokens = int(as_numpy(t).sum())
            elif t.name == "output_log_probs" and t.shape and t.datatype is not Datatype.BYTES:
                chunk.tokens = int(t.shape[-1])
            elif t.name == "finish_reason" and t.datatype is Datatype.BYTES:
                chunk.finish_reason = _reason(list(deserialize_bytes(t.data)))
    except CodecError as exc:
        raise BadGateway(f"invalid response from backend: {exc}") from None
    return chunk


def _log_probs_length(value: Any) -> int | None:
    """Generated length from a JSON ``output_log_probs`` (flat or [beam][len])."""
    if not isinstance(value, list):
        return 1 if isinstance(value, int | float) else None
    if value and isinstance(value[-1], list):
        return len(value[-1])
    return len(value)


def _token_count(value: Any) -> int:
    """A JSON ``num_output_tokens``: a whole number, or one per beam (summed)."""
    values = value if isinstance(value, list) else [value]
    if not all(type(v) is int or (type(v) is float and v.is_integer()) for v in values):
        raise BadGateway("invalid generate response from backend: 'num_output_tokens' is no count")
    return sum(int(v) for v in values)


def chunk_from_generate(obj: Any) -> Chunk:
    """The chunk of a generate-extension answer (one JSON object); BackendError for
    ``{"error": ...}``."""
    if not isinstance(obj, dict):
        raise BadGateway("invalid generate response from backend: not a JSON object")
    if "error" in obj:
        message = str(obj["error"]) or "the backend's generate answer is an error without a text"
        raise BackendError(message, 500)
    text = obj.get("text_output", "")
    if isinstance(text, list):
        text = "".join(str(t) for t in text)
    chunk = Chunk(text if isinstance(text, str) else str(text))
    details = obj.get("details")
    if "num_output_tokens" in obj:
        chunk.tokens = _token_count(obj["num_output_tokens"])
    elif "output_log_probs" in obj:
        chunk.tokens = _log_probs_length(obj["output_log_probs"])
    elif isinstance(details, dict) and isinstance(details.get("logprobs"), list):
        chunk.tokens = len(details["logprobs"])
    reason = obj.get("finish_reason")
    if reason is None and isinstance(details, dict):
        reason = details.get("finish_reason")
    chunk.finish_reason = _reason(reason)
    return chunk


#: how many pieces :class:`TextParts` keeps apart before joining them
JOIN_EVERY = 1024


class TextParts:
    """The generated text kept for the answer, compact: the pieces are joined every
    :data:`JOIN_EVERY` (a million one-token strings would take ~60 MB, their text ~3 MB)."""

    __slots__ = ("count", "joined", "pending")

    def __init__(self) -> None:
        self.joined: list[str] = []
        self.pending: list[str] = []
        self.count = 0

    def append(self, piece: str) -> None:
        self.count += 1
        self.pending.append(piece)
        if len(self.pending) >= JOIN_EVERY:
            self.joined.append("".join(self.pending))
            self.pending.clear()

    def text(self) -> str:
        return "".join(self.joined) + "".join(self.pending)


def strip_echo(text: str, prompt: str) -> str:
    """The generated text of an answer that repeats the prompt first (a model that
    cannot be asked ``exclude_input_in_output``)."""
    if prompt and text.startswith(prompt):
        return text[len(prompt) :].removeprefix(" ")
    return text


def count_words(text: str) -> int:
    """Approximate token count of text whose backend reports none."""
    return len(text.split())


def finish_reason(reported: str | None, tokens: int, max_new_tokens: int) -> str:
    """The backend's reason when it gives one, else ``length`` when ``max_new_tokens`` were
    generated and ``eos_token`` otherwise (an approximation)."""
    if reported is not None:
        return reported
    return "length" if tokens >= max_new_tokens else "eos_token"


def details(reason: str, tokens: int, seed: int) -> dict[str, Any]:
    return {"finish_reason": reason, "generated_tokens": tokens, "seed": seed}


def text_answer(text: str, detail: dict[str, Any] | None) -> bytes:
    """The non-stream body; ``details`` only when the client asked for it."""
    if detail is None:
        return dumps({"generated_text": text})
    return dumps({"generated_text": text, "details": detail})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def token_event(prefill: float | None, decode: float | None, text: str, token_id: int = 0) -> bytes:
    """One token event; ``prefill`` (first token) or ``decode`` in seconds, the other None."""
    obj = {
        "prefill_time": _ms(prefill),
        "decode_time": _ms(decode),
        "token": {"id": token_id, "text": text},
    }
    return b"data: " + dumps(obj) + b"\n\n"


def final_event(
    prefill: float | None,
    decode: float | None,
    generated: str,
    detail: dict[str, Any] | None,
    token_id: int = 0,
) -> bytes:
    """The last event: the last token's times, the whole text, details or null, and
    ``token.text`` null."""
    obj = {
        "prefill_time": _ms(prefill),
        "decode_time": _ms(decode),
        "generated_text": generated,
        "details": detail,
        "token": {"id": token_id, "text": None},
    }
    return b"data: " + dumps(obj) + b"\n\n"


def error_body(message: str, error_type: str) -> bytes:
    return dumps({"error": message, "error_type": error_type})
