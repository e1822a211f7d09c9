"""`ensemble`: a toy LLM with TensorRT-LLM's ensemble tensors (see config.pbtxt).

It "generates" the words of the prompt in a cycle, `max_tokens` of them, space-separated. With
`stream` true: one response per token (the new piece only), then an empty final response;
otherwise one response holding the prompt, a space and the generated text, or the generated text
alone with `exclude_input_in_output`. With `return_log_probs`: `output_log_probs` [1, 1, n] and
`cum_log_probs` [1, 1] (n = tokens in that response). Like the real ensemble it reports neither a
finish reason nor token ids. Requests run on threads of their own, so that slow ones overlap.

Test knobs, words of the prompt (not generated):
  [delay=MS]      wait MS milliseconds before each token
  [fail_after=N]  after N tokens, fail the request (an INTERNAL error response)
  [cancelled?]    answer the number of requests seen cancelled so far (as text_output)
A request the client cancels (gRPC stream cancelled, HTTP connection closed) stops generating
at its next token and is counted.
"""

import re
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
KNOB = re.compile(r"^\[(delay|fail_after)=(\d+)\]$")
_counts = {"cancelled": 0}
_lock = threading.Lock()


class _Invalid(Exception):
    pass


#: the most tokens one request may ask for (the builtin llm's bound)
MAX_TOKENS = 1_000_000


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise _Invalid(f"input '{name}' of model 'ensemble' must hold one element")
    value = values[0]
    return value.item() if hasattr(value, "item") else value


def _response(text, log_probs=None):
    tensors = [pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_))]
    if log_probs is not None:
        probs = np.full((1, 1, log_probs), -0.5, dtype=np.float32)
        tensors.append(pb_utils.Tensor("output_log_probs", probs))
        tensors.append(
            pb_utils.Tensor("cum_log_probs", np.array([[probs.sum()]], dtype=np.float32))
        )
    return pb_utils.InferenceResponse(tensors)


def _is_cancelled(request, sender):
    for obj in (sender, request):
        check = getattr(obj, "is_cancelled", None)
        if check is not None and check():
            return True
    return False


def _count_cancel():
    with _lock:
        _counts["cancelled"] += 1


def _generate(request, sender):
    try:
        raw = _scalar(request, "text_input", b"")
        prompt = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        max_tokens = int(_scalar(request, "max_tokens", 16))
        if max_tokens < 1:
            raise _Invalid("input 'max_tokens' of model 'ensemble' must be at least 1")
        if max_tokens > MAX_TOKENS:  # as the builtin llm: a bounded generation
            raise _Invalid(f"input 'max_tokens' of model 'ensemble' must be at most {MAX_TOKENS}")
        stream = bool(_scalar(request, "stream", False))
        exclude_input = bool(_scalar(request, "exclude_input_in_output", False))
        log_probs = bool(_scalar(request, "return_log_probs", False))
    except _Invalid as exc:
        error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
        sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        return
    if prompt.strip() == "[cancelled?]":
        with _lock:
            count = _counts["cancelled"]
        sender.send(_response(str(count)), flags=FINAL)
        return
    knobs = {}
    words = []
    for word in prompt.split():
        m = KNOB.match(word)
        if m:
            knobs[m.group(1)] = int(m.group(2))
        else:
            words.append(word)
    words = words or ["token"]
    delay = knobs.get("delay", 0) / 1000.0
    fail_after = knobs.get("fail_after")
    pieces = []
    for i in range(max_tokens):
        if delay:
            time.sleep(delay)
        if _is_cancelled(request, sender):
            _count_cancel()
            sender.send(flags=FINAL)
            return
        if fail_after is not None and i == fail_after:
            error = pb_utils.TritonError(
                f"ensemble failed after {i} tokens", pb_utils.TritonError.INTERNAL
            )
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        piece = ("" if i == 0 else " ") + words[i % len(words)]
        pieces.append(piece)
        if stream:
            sender.send(_response(piece, 1 if log_probs else None))
    if stream:
        sender.send(flags=FINAL)
        return
    generated = "".join(pieces)
    text = generated if exclude_input else f"{prompt} {generated}"
    sender.send(_response(text, len(pieces) if log_probs else None), flags=FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            threading.Thread(target=_generate, args=(request, sender), daemon=True).start()
