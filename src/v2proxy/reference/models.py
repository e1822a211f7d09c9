"""The builtin reference models: their metadata, configuration and compute functions."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from v2proxy.codecs.dtypes import as_numpy, from_numpy, serialize_bytes
from v2proxy.core.errors import InvalidRequest
from v2proxy.core.model import Datatype, Tensor

PLATFORM = "v2proxy_builtin"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: Datatype
    dims: tuple[int, ...]
    label_filename: str | None = None
    optional: bool = False


#: each response's outputs, made as they are asked for (None: a pause); a generator, closed by
#: the caller when it stops early
Produced = Iterator[list[Tensor] | None]
Compute = Callable[[dict[str, Tensor]], Produced]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    compute: Compute
    decoupled: bool = False

    def metadata(self) -> dict[str, Any]:
        batch = [-1] if self.max_batch_size > 0 else []
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": PLATFORM,
            "inputs": [
                {"name": t.name, "datatype": t.datatype.value, "shape": [*batch, *t.dims]}
                for t in self.inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": t.datatype.value, "shape": [*batch, *t.dims]}
                for t in self.outputs
            ],
        }

    def config(self) -> dict[str, Any]:
        def entry(t: TensorSpec) -> dict[str, Any]:
            out: dict[str, Any] = {
                "name": t.name,
                "data_type": "TYPE_STRING"
                if t.datatype is Datatype.BYTES
                else f"TYPE_{t.datatype.value}",
                "dims": list(t.dims),
            }
            if t.label_filename:
                out["label_filename"] = t.label_filename
            if t.optional:
                out["optional"] = True
            return out

        config: dict[str, Any] = {
            "name": self.name,
            "platform": PLATFORM,
            "backend": "v2proxy",
            "max_batch_size": self.max_batch_size,
            "input": [entry(t) for t in self.inputs],
            "output": [entry(t) for t in self.outputs],
        }
        if self.decoupled:
            config["model_transaction_policy"] = {"decoupled": True}
        return config


def _simple(inputs: dict[str, Tensor]) -> Produced:
    a, b = as_numpy(inputs["INPUT0"]), as_numpy(inputs["INPUT1"])
    yield [
        from_numpy("OUTPUT0", Datatype.INT32, (a + b).astype("<i4")),
        from_numpy("OUTPUT1", Datatype.INT32, (a - b).astype("<i4")),
    ]


def _decimal(values: np.ndarray, name: str) -> np.ndarray:
    try:
        return np.array([int(v) for v in values.reshape(-1)], dtype=np.int64).reshape(values.shape)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest(
            f"input '{name}' of model 'simple_string' must hold decimal integers"
        ) from None


def _simple_string(inputs: dict[str, Tensor]) -> Produced:
    a = _decimal(as_numpy(inputs["INPUT0"]), "INPUT0")
    b = _decimal(as_numpy(inputs["INPUT1"]), "INPUT1")
    shape = inputs["INPUT0"].shape

    def strings(values: np.ndarray) -> bytes:
        return serialize_bytes([str(int(v)).encode() for v in values.reshape(-1)])

    yield [
        Tensor("OUTPUT0", Datatype.BYTES, shape, strings(a + b)),
        Tensor("OUTPUT1", Datatype.BYTES, shape, strings(a - b)),
    ]


def _identity(inputs: dict[str, Tensor]) -> Produced:
    t = inputs["INPUT0"]
    yield [Tensor("OUTPUT0", t.datatype, t.shape, t.data)]


_WEIGHTS = np.float32(2.0)
_BIAS = (np.arange(10, dtype=np.float32) * np.float32(0.125)).astype(np.float32)


def _classifier(inputs: dict[str, Tensor]) -> Produced:
    x = as_numpy(inputs["INPUT0"])
    scores = (x * _WEIGHTS + _BIAS).astype("<f4")
    yield [from_numpy("SCORES", Datatype.FP32, scores)]


LLM_DEFAULT_MAX_TOKENS = 16
#: bounds of one generation: a client cannot make the in-process toy model run for long or
#: hold much memory (max_tokens up to INT32_MAX reaches it unchecked from /infer)
LLM_MAX_TOKENS = 1_000_000
LLM_MAX_OUTPUT_CHARS = 1 << 24
#: tokens joined into a whole (non-stream) text between two pauses: well under a millisecond
LLM_SLICE_TOKENS = 4096


def _scalar(inputs: dict[str, Tensor], name: str, default: Any) -> Any:
    t = inputs.get(name)
    if t is None:
        return default
    values = as_numpy(t).reshape(-1)
    if values.size != 1:
        raise InvalidRequest(f"input '{name}' of model 'llm' must hold one element")
    return values[0].item() if hasattr(values[0], "item") else values[0]


def iter_llm_tokens(prompt: str, max_tokens: int) -> Iterator[str]:
    """The toy LLM's generation: the prompt's words in a cycle, space-separated pieces, made one at
    a time as they are taken. InvalidRequest when longer than :data:`LLM_MAX_OUTPUT_CHARS`."""
    words = prompt.split() or ["token"]
    cycles, rest = divmod(max_tokens, len(words))
    size = cycles * sum(map(len, words)) + sum(map(len, words[:rest])) + max_tokens - 1
    if size > LLM_MAX_OUTPUT_CHARS:
        raise InvalidRequest(
            f"model 'llm' would generate {size} characters, more than {LLM_MAX_OUTPUT_CHARS}:"
            " ask for fewer tokens or a shorter prompt"
        )
    return _cycle(words, max_tokens)


def _cycle(words: list[str], n: int) -> Iterator[str]:
    spaced = [" " + w for w in words]
    for i in range(n):
        yield spaced[i % len(words)] if i else words[0]


def _llm(inputs: dict[str, Tensor]) -> Produced:
    raw = _scalar(inputs, "text_input", b"")
    prompt = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    max_tokens = int(_scalar(inputs, "max_tokens", LLM_DEFAULT_MAX_TOKENS))
    if max_tokens < 1:
        raise InvalidRequest("input 'max_tokens' of model 'llm' must be at least 1")
    if max_tokens > LLM_MAX_TOKENS:
        raise InvalidRequest(f"input 'max_tokens' of model 'llm' must be at most {LLM_MAX_TOKENS}")
    stream = bool(_scalar(inputs, "stream", False))
    exclude_input = bool(_scalar(inputs, "exclude_input_in_output", stream))
    tokens = iter_llm_tokens(prompt, max_tokens)

    def text(value: str) -> list[Tensor]:
        return [Tensor("text_output", Datatype.BYTES, (1,), serialize_bytes([value.encode()]))]

    if stream:
        for token in tokens:
            yield text(token)
        return
    # the whole text, a slice at a time with a pause between (1,000,000 tokens joined at once
    # hold the event loop for a tenth of a second)
    slices: list[str] = []
    while piece := "".join(itertools.islice(tokens, LLM_SLICE_TOKENS)):
        slices.append(piece)
        yield None
    generated = "".join(slices)
    del slices
    yield text(generated if exclude_input else f"{prompt} {generated}")


def _spec(
    name: str, datatype: Datatype, *dims: int, label: str | None = None, optional: bool = False
) -> TensorSpec:
    return TensorSpec(name, datatype, tuple(dims), label, optional)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            "simple",
            (_spec("INPUT0", Datatype.INT32, 16), _spec("INPUT1", Datatype.INT32, 16)),
            (_spec("OUTPUT0", Datatype.INT32, 16), _spec("OUTPUT1", Datatype.INT32, 16)),
            8,
            _simple,
        ),
        ModelSpec(
            "simple_string",
            (_spec("INPUT0", Datatype.BYTES, 16), _spec("INPUT1", Datatype.BYTES, 16)),
            (_spec("OUTPUT0", Datatype.BYTES, 16), _spec("OUTPUT1", Datatype.BYTES, 16)),
            8,
            _simple_string,
        ),
        ModelSpec(
            "simple_identity",
            (_spec("INPUT0", Datatype.BYTES, -1),),
            (_spec("OUTPUT0", Datatype.BYTES, -1),),
            8,
            _identity,
        ),
        ModelSpec(
            "identity_fp32",
            (_spec("INPUT0", Datatype.FP32, -1),),
            (_spec("OUTPUT0", Datatype.FP32, -1),),
            0,
            _identity,
        ),
        ModelSpec(
            "classifier",
            (_spec("INPUT0", Datatype.FP32, 10),),
            (_spec("SCORES", Datatype.FP32, 10, label="classifier.txt"),),
            8,
            _classifier,
        ),
        ModelSpec(
            "llm",
            (
                _spec("text_input", Datatype.BYTES, 1),
                _spec("max_tokens", Datatype.INT32, 1, optional=True),
                _spec("stream", Datatype.BOOL, 1, optional=True),
                _spec("exclude_input_in_output", Datatype.BOOL, 1, optional=True),
                _spec("temperature", Datatype.FP32, 1, optional=True),
                _spec("top_k", Datatype.INT32, 1, optional=True),
                _spec("top_p", Datatype.FP32, 1, optional=True),
                _spec("seed", Datatype.UINT64, 1, optional=True),
            ),
            (_spec("text_output", Datatype.BYTES, -1),),
            0,
            _llm,
            decoupled=True,
        ),
    )
}
