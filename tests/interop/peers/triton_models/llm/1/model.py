"""`llm`: the builtin toy LLM. It "generates" the words of the prompt in a cycle, `max_tokens`
of them (default 16), space-separated. With `stream` true, one response per token and then an
empty final one; otherwise one response, prefixed with the prompt unless
`exclude_input_in_output` (default: the value of `stream`). Errors carry the builtin model's
messages, as INVALID_ARG."""

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULT_MAX_TOKENS = 16
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


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
        raise _Invalid(f"input '{name}' of model 'llm' must hold one element")
    value = values[0]
    return value.item() if hasattr(value, "item") else value


def _tokens(prompt, max_tokens):
    words = prompt.split() or ["token"]
    return [("" if i == 0 else " ") + words[i % len(words)] for i in range(max_tokens)]


def _text(value):
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor("text_output", np.array([value.encode()], dtype=np.object_))]
    )


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                raw = _scalar(request, "text_input", b"")
                prompt = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                max_tokens = int(_scalar(request, "max_tokens", DEFAULT_MAX_TOKENS))
                if max_tokens < 1:
                    raise _Invalid("input 'max_tokens' of model 'llm' must be at least 1")
                if max_tokens > MAX_TOKENS:  # as the builtin llm: a bounded generation
                    raise _Invalid(
                        f"input 'max_tokens' of model 'llm' must be at most {MAX_TOKENS}"
                    )
                stream = bool(_scalar(request, "stream", False))
                exclude_input = bool(_scalar(request, "exclude_input_in_output", stream))
            except _Invalid as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            tokens = _tokens(prompt, max_tokens)
            if stream:
                for token in tokens:
                    sender.send(_text(token))
                sender.send(flags=FINAL)
            else:
                generated = "".join(tokens)
                sender.send(
                    _text(generated if exclude_input else f"{prompt} {generated}"), flags=FINAL
                )
