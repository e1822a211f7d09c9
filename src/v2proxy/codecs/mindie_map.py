"""A validated MindIE request mapped onto a v2 model, per backend profile (docs/protocol.md,
MindIE; the profiles: docs/guides/mindie.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from v2proxy.codecs.backend_meta import ConfigFacts, ModelMeta, config_facts, model_meta
from v2proxy.codecs.dtypes import NUMPY_DTYPE, from_numpy, serialize_bytes
from v2proxy.codecs.json import dumps
from v2proxy.codecs.mindie import LlmRequest, invalid
from v2proxy.core.errors import CodecError
from v2proxy.core.model import Datatype, InferRequest, RequestedOutput, Tensor

PROFILES = ("trtllm", "vllm", "generate")

#: the datatype of each input a profile may send, when the model does not say
DEFAULT_TYPES: dict[str, Datatype] = {
    "text_input": Datatype.BYTES,
    "max_tokens": Datatype.INT32,
    "stream": Datatype.BOOL,
    "exclude_input_in_output": Datatype.BOOL,
    "temperature": Datatype.FP32,
    "top_k": Datatype.INT32,
    "top_p": Datatype.FP32,
    "seed": Datatype.UINT64,
    "random_seed": Datatype.UINT64,
    "repetition_penalty": Datatype.FP32,
    "return_log_probs": Datatype.BOOL,
    "image_url_input": Datatype.BYTES,
    "image": Datatype.BYTES,
    "sampling_parameters": Datatype.BYTES,
    "return_finish_reason": Datatype.BOOL,
    "return_num_output_tokens": Datatype.BOOL,
}
#: outputs worth asking for, when the model has them
OUTPUTS = ("text_output", "output_log_probs", "finish_reason", "num_output_tokens")


@dataclass(frozen=True, slots=True)
class ModelView:
    """What the mapping needs to know of the v2 model (discovered once)."""

    name: str
    inputs: dict[str, Datatype]
    outputs: tuple[str, ...] = ("text_output",)
    batched: bool = False
    decoupled: bool = False

    def has(self, name: str) -> bool:
        return name in self.inputs


def model_view(name: str, metadata: dict[str, Any], config: dict[str, Any]) -> ModelView:
    """The view of a model from its v2 metadata and (Triton) config answers
    (:func:`view_of` their typed facts)."""
    return view_of(name, model_meta(metadata), config_facts(config))


def view_of(name: str, meta: ModelMeta, config: ConfigFacts) -> ModelView:
    """The view of a model from its metadata and the facts of its config; a config that names
    no ``max_batch_size`` (servers without one) leaves batching to the metadata's shapes."""
    inputs: dict[str, Datatype] = {}
    for t in meta.inputs:
        try:
            inputs[t.name] = Datatype(t.datatype)
        except ValueError:
            inputs[t.name] = DEFAULT_TYPES.get(t.name, Datatype.BYTES)
    text = meta.input("text_input")
    shape = text.shape if text is not None and text.shape is not None else ()
    if config.max_batch_size is not None:
        batched = config.max_batch_size > 0
    else:
        batched = len(shape) >= 2 and shape[0] == -1
    outputs = tuple(t.name for t in meta.outputs)
    return ModelView(name, inputs, outputs, batched, config.decoupled)


def guess_profile(view: ModelView) -> str:
    """The profile a model's inputs suggest (for the start-up check's log line)."""
    if view.has("sampling_parameters"):
        return "vllm"
    if view.has("text_input") and view.has("max_tokens"):
        return "trtllm"
    return "generate"


def profile_problems(profile: str, view: ModelView) -> list[str]:
    """Why ``profile`` cannot serve this model (empty: it can)."""
    problems = []
    if profile != "generate" and not view.has("text_input"):
        problems.append(f"model '{view.name}' has no input 'text_input'")
    if profile == "vllm" and not view.has("sampling_parameters"):
        problems.append(f"model '{view.name}' has no input 'sampling_parameters' (vLLM backend)")
    if profile == "trtllm" and not view.has("max_tokens"):
        problems.append(f"model '{view.name}' has no input 'max_tokens' (TensorRT-LLM ensemble)")
    if view.outputs and "text_output" not in view.outputs:
        problems.append(f"model '{view.name}' has no output 'text_output'")
    return problems


def _media_values(req: LlmRequest, view: ModelView, profile: str) -> dict[str, Any]:
    if not req.media:
        return {}
    urls = [m.url for m in req.media if m.kind == "image_url"]
    if len(urls) != len(req.media):
        raise invalid(f"model '{view.name}' takes no video or audio inputs.")
    if profile == "trtllm" and view.has("image_url_input"):
        return {"image_url_input": urls}
    if profile == "vllm" and view.has("image"):
        raw = []
        for url in urls:
            head, sep, data = url.partition(";base64,")
            if not sep or not head.startswith("data:image/"):
                raise invalid(
                    "image_url must be a data:image/...;base64 URL for a vLLM model (v2proxy"
                    " does not fetch images)."
                )
            raw.append(data)
        return {"image": raw}
    raise invalid(f"model '{view.name}' takes no image inputs.")


def _sampling(req: LlmRequest) -> dict[str, Any]:
    """The sampling knobs under their v2 names (None: not given)."""
    greedy = req.do_sample is False
    return {
        "temperature": None if greedy else req.temperature,
        "top_k": 1 if greedy else req.top_k,
        "top_p": req.top_p,
        "repetition_penalty": req.repetition_penalty,
    }


def candidate_values(
    req: LlmRequest,
    profile: str,
    view: ModelView,
    seed_input: str = "seed",
    stream: bool = False,
) -> dict[str, Any]:
    """Input name -> Python value (scalar, or list for a multi-element input) for the
    ``trtllm`` and ``vllm`` profiles, before filtering by what the model declares."""
    values: dict[str, Any] = {"text_input": req.text, "stream": stream}
    values["exclude_input_in_output"] = True
    if profile == "vllm":
        sampling: dict[str, Any] = {"max_tokens": req.max_new_tokens, "seed": req.seed}
        sampling.update({k: v for k, v in _sampling(req).items() if v is not None})
        if req.do_sample is False:
            sampling["temperature"] = 0.0
            sampling.pop("top_k", None)
        values["sampling_parameters"] = dumps(sampling).decode()
        values["return_finish_reason"] = True
        values["return_num_output_tokens"] = True
    else:
        values["max_tokens"] = req.max_new_tokens
        values.update({k: v for k, v in _sampling(req).items() if v is not None})
        values[seed_input] = req.seed
        if req.details:
            values["return_log_probs"] = True
    values.update(_media_values(req, view, profile))
    return values


def select(values: dict[str, Any], view: ModelView) -> tuple[dict[str, Any], list[str]]:
    """The values of the inputs the model declares, and the names it lacks."""
    kept = {k: v for k, v in values.items() if view.has(k)}
    return kept, [k for k in values if k not in kept]


def generate_body(
    req: LlmRequest, profile: str, view: ModelView, seed_input: str, stream: bool
) -> tuple[dict[str, Any], list[str]]:
    """The generate-extension body for ``/generate[_stream]`` and the knobs left out."""
    if profile != "generate":
        return select(candidate_values(req, profile, view, seed_input, stream), view)
    params: dict[str, Any] = {"max_tokens": req.max_new_tokens, "seed": req.seed}
    for key in ("temperature", "top_k", "top_p", "repetition_penalty", "typical_p"):
        value = getattr(req, key)
        if value is not None:
            params[key] = value
    for key in ("do_sample", "watermark"):
        value = getattr(req, key)
        if value is not None:
            params[key] = value
    if req.details:
        params["details"] = True
    body: dict[str, Any] = {"text_input": req.text, "parameters": params}
    if view.has("stream"):
        body["stream"] = stream
    if view.has("exclude_input_in_output"):
        body["exclude_input_in_output"] = True
    _media_values(req, view, profile)  # a generate body carries text only
    return body, []


def _array(name: str, datatype: Datatype, value: Any) -> Tensor:
    items = value if isinstance(value, list) else [value]
    if datatype is Datatype.BYTES:
        encoded = [v.encode() if isinstance(v, str) else str(v).encode() for v in items]
        return Tensor(name, datatype, (len(items),), serialize_bytes(encoded))
    if datatype is Datatype.BOOL:
        return from_numpy(name, datatype, np.array([bool(v) for v in items], dtype=np.bool_))
    try:
        array = np.array(items, dtype=NUMPY_DTYPE[datatype])
    except (OverflowError, ValueError, TypeError) as exc:
        raise CodecError(f"value of input '{name}' does not fit {datatype.value}: {exc}") from None
    return from_numpy(name, datatype, array)


def infer_request(
    values: dict[str, Any], view: ModelView, request_id: str | None = None
) -> InferRequest:
    """A v2 request of the model's declared inputs (shape [1, n] with a batch dimension, else
    [n]), asking for the outputs the mapping reads."""
    inputs = []
    for name, value in values.items():
        tensor = _array(name, view.inputs.get(name) or DEFAULT_TYPES[name], value)
        n = tensor.shape[0]
        tensor.shape = (1, n) if view.batched else (n,)
        inputs.append(tensor)
    wanted = [RequestedOutput(o) for o in OUTPUTS if o in view.outputs] or None
    return InferRequest(view.name, inputs, outputs=wanted, id=request_id)
