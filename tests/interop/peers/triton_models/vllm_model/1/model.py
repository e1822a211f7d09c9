"""`vllm_model`: a toy LLM with the tensors of Triton's vLLM backend (see config.pbtxt).

It "generates" the words of the prompt in a cycle, `max_tokens` of them (vLLM's default 16),
read from the `sampling_parameters` JSON string; a key vLLM's SamplingParams does not know is
an error, as it is for the real backend. A word "<eos>" in the prompt ends generation there
(finish reason "stop"; else "length"). With `stream` true: one response per token (the new
piece), finish reason "None" until the last; the final flag comes with the last response.
Otherwise one response, the prompt prepended unless `exclude_input_in_output`. With
`return_finish_reason` / `return_num_output_tokens` those outputs are added (the token count
of each response: a delta when streaming)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
SAMPLING_KEYS = {
    "n",
    "best_of",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "max_tokens",
    "min_tokens",
    "logprobs",
    "prompt_logprobs",
    "skip_special_tokens",
}


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.item() if hasattr(value, "item") else value


def _response(text, reason, count, request):
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
    if _scalar(request, "return_finish_reason", False):
        tensors.append(pb_utils.Tensor("finish_reason", np.array([reason], dtype=np.object_)))
    if _scalar(request, "return_num_output_tokens", False):
        tensors.append(pb_utils.Tensor("num_output_tokens", np.array([count], dtype=np.uint32)))
    return pb_utils.InferenceResponse(tensors)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            raw = _scalar(request, "text_input", b"")
            prompt = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            params = json.loads(_scalar(request, "sampling_parameters", b"{}") or b"{}")
            unknown = sorted(set(params) - SAMPLING_KEYS)
            if unknown:
                error = pb_utils.TritonError(
                    f"SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'"
                )
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            max_tokens = int(params.get("max_tokens", 16))
            stream = bool(_scalar(request, "stream", False))
            exclude = bool(_scalar(request, "exclude_input_in_output", stream))
            words = prompt.split() or ["token"]
            pieces, reason = [], "length"
            for i in range(max_tokens):
                word = words[i % len(words)]
                if word == "<eos>":
                    reason = "stop"
                    break
                pieces.append(("" if i == 0 else " ") + word)
            if stream:
                for i, piece in enumerate(pieces):
                    last = i == len(pieces) - 1
                    resp = _response(piece, reason if last else "None", 1, request)
                    sender.send(resp, flags=FINAL if last else 0)
                if not pieces:
                    sender.send(_response("", reason, 0, request), flags=FINAL)
            else:
                text = "".join(pieces)
                text = text if exclude else prompt + text
                sender.send(_response(text, reason, len(pieces), request), flags=FINAL)
