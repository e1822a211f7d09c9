"""MindIE's /infer codec: every validation rule (docs/protocol.md, MindIE clients) as a table
case (MindIE's messages, checked in MindIE's order), UTF-16 length counting, the field map per
profile and the response map (non-stream body, stream events, backend answers read)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from v2proxy.codecs import mindie_answer as ans
from v2proxy.codecs import mindie_map as mp
from v2proxy.codecs.dtypes import as_numpy, serialize_bytes
from v2proxy.codecs.mindie import Limits, LlmRequest, parse_request, utf16_length
from v2proxy.core.errors import BackendError, BadGateway, CodecError
from v2proxy.core.model import Datatype, InferResponse, Tensor

LIMITS = Limits(max_input_chars=16, max_new_tokens=20, timeout=600)


def parse(doc: Any, limits: Limits = LIMITS) -> LlmRequest:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return parse_request(body, limits, lambda: 846930886)


def p(**params: Any) -> dict[str, Any]:
    return {"inputs": "hi", "parameters": params}


INPUTS_LEN = (
    "Inputs must be necessary and data type must be string and length in (0, 16], but the"
    " length of inputs is {}"
)

# (case id, body, MindIE's message) — one row per rule, in MindIE's order of checks
INVALID: list[tuple[str, Any, str]] = [
    ("body-not-json", b"{not json", "Request body is not a valid json."),
    ("body-not-object", ["hi"], "Request body must be json object type."),
    # a lone surrogate escape ("\ud800": no text) anywhere, named before any other rule
    (
        "inputs-lone-surrogate",
        {"inputs": "a\ud800"},
        "inputs must be valid UTF-8 text, got a lone surrogate \\ud800.",
    ),
    (
        "inputs-lone-surrogate-stream",
        {"inputs": "a\udc00", "stream": True},
        "inputs must be valid UTF-8 text, got a lone surrogate \\udc00.",
    ),
    (
        "list-text-lone-surrogate",
        {"inputs": [{"type": "text", "text": "ok"}, {"type": "text", "text": "\udbff"}]},
        "inputs[1].text must be valid UTF-8 text, got a lone surrogate \\udbff.",
    ),
    (
        "unknown-key-lone-surrogate",
        {"inputs": "a", "parameters": {"\ud800": 1}},
        "All keys of parameters must be valid UTF-8 text, got a lone surrogate \\ud800.",
    ),
    ("body-lone-surrogate", "\ud800", "Request body must be json object type."),
    ("inputs-absent", {"stream": False}, "Inputs must not be null."),
    ("inputs-null", {"inputs": None}, "Inputs must not be null."),
    ("input-conflict", {"inputs": "a", "input_id": [1, 2]}, "Input conflict."),
    (
        "input-id-unsupported",
        {"input_id": [1, 2]},
        "input_id is not supported: token ids cannot reach a v2 text model.",
    ),
    ("inputs-wrong-type", {"inputs": 5}, "inputs must be string or list type."),
    ("inputs-empty", {"inputs": ""}, INPUTS_LEN.format(0)),
    ("inputs-too-long", {"inputs": "x" * 17}, INPUTS_LEN.format(17)),
    ("inputs-too-long-utf16", {"inputs": "😀" * 8 + "x"}, INPUTS_LEN.format(17)),
    ("list-empty", {"inputs": []}, INPUTS_LEN.format(0)),
    ("list-item-not-object", {"inputs": ["a"]}, "inputs[0] must be object type."),
    (
        "list-item-type",
        {"inputs": [{"type": "file", "file": "x"}]},
        "inputs[0].type must be one of text, image_url, video_url, audio_url.",
    ),
    (
        "list-text-not-string",
        {"inputs": [{"type": "text", "text": 3}]},
        "inputs[0].text must be string type.",
    ),
    (
        "list-media-null",
        {"inputs": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": None}]},
        "inputs[1].image_url must not be null.",
    ),
    (
        "list-too-many-media",
        {"inputs": [{"type": "image_url", "image_url": "u"}] * 21},
        "The number of multimodal urls must be at most 20.",
    ),
    (
        "list-too-long",
        {"inputs": [{"type": "text", "text": "abc"}]},  # serialised: 28 code units
        INPUTS_LEN.format(len('[{"type":"text","text":"abc"}]')),
    ),
    ("stream-not-bool", {"inputs": "a", "stream": "true"}, "stream must be bool type."),
    (
        "parameters-not-object",
        {"inputs": "a", "parameters": [1]},
        "parameters must be object type.",
    ),
    (
        "temperature-zero",
        p(temperature=0),
        "Parameter temperature must be in (0.0,3.40282e+38], got 0.",
    ),
    (
        "temperature-over-flt-max",
        p(temperature=1e39),
        "Parameter temperature must be in (0.0,3.40282e+38], got 1e+39.",
    ),
    ("temperature-type", p(temperature="0.5"), "temperature must be float type."),
    ("top_k-zero", p(top_k=0), "Parameter top_k must be in (0,2147483647], got 0."),
    (
        "top_k-over-int32",
        p(top_k=2**31),
        "Parameter top_k must be in (0,2147483647], got 2147483648.",
    ),
    ("top_k-type", p(top_k=1.5), "top_k must be integer type."),
    ("top_p-zero", p(top_p=0.0), "Parameter top_p must be in (0.0,1.0), got 0.0."),
    ("top_p-one-is-open", p(top_p=1.0), "Parameter top_p must be in (0.0,1.0), got 1.0."),
    ("typical_p-over-one", p(typical_p=1.5), "Parameter typical_p must be in (0.0,1.0], got 1.5."),
    ("typical_p-zero", p(typical_p=0), "Parameter typical_p must be in (0.0,1.0], got 0."),
    ("do_sample-type", p(do_sample=1), "do_sample must be bool type."),
    ("seed-negative", p(seed=-1), "seed must be unsigned integer type."),
    ("seed-float", p(seed=1.5), "seed must be unsigned integer type."),
    (
        "seed-over-int64",
        p(seed=2**63),
        "Parameter seed must be in [0,9223372036854775807], got 9223372036854775808.",
    ),
    (
        "repetition_penalty-zero",
        p(repetition_penalty=0),
        "Parameter repetition_penalty must be in (0.0,3.40282e+38], got 0.",
    ),
    ("watermark-type", p(watermark="no"), "watermark must be bool type."),
    ("priority-zero", p(priority=0), "Parameter priority must be in [1,5], got 0."),
    ("priority-six", p(priority=6), "Parameter priority must be in [1,5], got 6."),
    ("priority-type", p(priority=-1), "priority must be unsigned integer type."),
    (
        "timeout-zero",
        p(timeout=0),
        "Parameter timeout must be strictly positive and small than 3600 seconds, got 0.",
    ),
    (
        "timeout-over-max",
        p(timeout=3601),
        "Parameter timeout must be strictly positive and small than 3600 seconds, got 3601.",
    ),
    (
        "max_new_tokens-zero",
        p(max_new_tokens=0),
        "Parameter max_new_tokens must be in (0,2147483647], got 0.",
    ),
    (
        "max_new_tokens-over-int32",
        p(max_new_tokens=2**31),
        "Parameter max_new_tokens must be in (0,2147483647], got 2147483648.",
    ),
    ("max_new_tokens-float", p(max_new_tokens=20.0), "max_new_tokens must be integer type."),
    ("details-type", p(details="yes"), "details must be bool type."),
    # the order: the first rule broken is the one reported
    (
        "order-inputs-before-parameters",
        {"inputs": "", "parameters": {"top_k": 0}},
        INPUTS_LEN.format(0),
    ),
    (
        "order-stream-before-parameters",
        {"inputs": "a", "stream": 1, "parameters": 3},
        "stream must be bool type.",
    ),
    (
        "order-temperature-before-top_k",
        p(top_k=0, temperature=0),
        "Parameter temperature must be in (0.0,3.40282e+38], got 0.",
    ),
    (
        "order-seed-before-max_new_tokens",
        p(max_new_tokens=0, seed=-5),
        "seed must be unsigned integer type.",
    ),
]


@pytest.mark.parametrize(("body", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_request_gets_mindie_message(body: Any, message: str) -> None:
    with pytest.raises(CodecError) as info:
        parse(body)
    assert info.value.message == message
    assert info.value.http_status == 400  # the MindIE frontend answers 422 (test below)


def test_defaults_null_and_unknown_keys() -> None:
    req = parse({"inputs": "hi", "parameters": {"seed": None, "top_k": None, "foo": 1}, "x": 2})
    assert req == LlmRequest("hi", seed=846930886, max_new_tokens=20, timeout=600)
    assert (req.stream, req.priority, req.details, req.temperature) == (False, 5, False, None)
    limits = Limits(16, max_new_tokens=7, timeout=30)
    req = parse_request(b'{"inputs": "hi", "stream": null}', limits, lambda: 5)
    assert (req.max_new_tokens, req.timeout, req.seed, req.stream) == (7, 30, 5, False)


def test_every_knob_read() -> None:
    req = parse(
        {
            "inputs": "My name is Olivier and I",
            "stream": True,
            "parameters": {
                "temperature": 0.5,
                "top_k": 10,
                "top_p": 0.95,
                "max_new_tokens": 20,
                "do_sample": True,
                "seed": 0,
                "repetition_penalty": 1.03,
                "details": True,
                "typical_p": 1,
                "watermark": False,
                "priority": 1,
                "timeout": 10,
            },
        },
        Limits(100),
    )
    assert req == LlmRequest(
        "My name is Olivier and I",
        stream=True,
        max_new_tokens=20,
        temperature=0.5,
        top_k=10,
        top_p=0.95,
        typical_p=1.0,
        do_sample=True,
        seed=0,
        repetition_penalty=1.03,
        watermark=False,
        priority=1,
        timeout=10,
        details=True,
    )


def test_multimodal_list() -> None:
    req = parse(
        {
            "inputs": [
                {"type": "text", "text": "Describe"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                {"type": "text", "text": "it"},
            ]
        },
        Limits(1000),
    )
    assert req.text == "Describe\nit"
    assert [(m.kind, m.url) for m in req.media] == [("image_url", "data:image/png;base64,QUJD")]


def test_a_larger_configured_timeout_raises_the_bound() -> None:
    req = parse(p(timeout=5000), Limits(16, timeout=7200))
    assert req.timeout == 5000


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("a", 1),
        ("héllo", 5),
        ("中文", 2),
        ("😀", 2),
        ("a😀b", 4),
        ("👨‍👩‍👧", 8),
        ("你好世界😀", 6),
        ("é\ud800", 2),
    ],
)
def test_utf16_length(text: str, units: int) -> None:
    assert utf16_length(text) == units


@pytest.mark.parametrize(
    ("text", "ok"), [("😀", True), ("😀a", False), ("中文", True), ("中文字", False), ("ab", True)]
)
def test_length_limit_counts_utf16_code_units(text: str, ok: bool) -> None:
    limits = Limits(max_input_chars=2)
    if ok:
        assert parse({"inputs": text}, limits).text == text
    else:
        with pytest.raises(CodecError, match=r"length in \(0, 2\], but the length of inputs is 3"):
            parse({"inputs": text}, limits)


# ---------------------------------------------------------------------- field map

ENSEMBLE_META = {
    "inputs": [
        {"name": n, "datatype": d, "shape": [-1, 1]}
        for n, d in [
            ("text_input", "BYTES"),
            ("max_tokens", "INT32"),
            ("stream", "BOOL"),
            ("exclude_input_in_output", "BOOL"),
            ("temperature", "FP32"),
            ("top_k", "INT32"),
            ("top_p", "FP32"),
            ("random_seed", "UINT64"),
            ("repetition_penalty", "FP32"),
            ("return_log_probs", "BOOL"),
            ("bad_words", "BYTES"),
        ]
    ],
    "outputs": [{"name": "text_output"}, {"name": "output_log_probs"}, {"name": "cum_log_probs"}],
}
ENSEMBLE_CONFIG = {"max_batch_size": 64, "model_transaction_policy": {"decoupled": True}}
VLLM_META = {
    "inputs": [
        {"name": n, "datatype": d, "shape": [1]}
        for n, d in [
            ("text_input", "BYTES"),
            ("stream", "BOOL"),
            ("sampling_parameters", "BYTES"),
            ("exclude_input_in_output", "BOOL"),
            ("return_finish_reason", "BOOL"),
            ("return_num_output_tokens", "BOOL"),
        ]
    ],
    "outputs": [{"name": "text_output"}, {"name": "finish_reason"}, {"name": "num_output_tokens"}],
}


def test_model_view_and_profile_checks() -> None:
    ens = mp.model_view("ensemble", ENSEMBLE_META, ENSEMBLE_CONFIG)
    assert (ens.batched, ens.decoupled, ens.inputs["random_seed"]) == (True, True, Datatype.UINT64)
    assert mp.guess_profile(ens) == "trtllm" and mp.profile_problems("trtllm", ens) == []
    assert mp.profile_problems("vllm", ens) == [
        "model 'ensemble' has no input 'sampling_parameters' (vLLM backend)"
    ]
    vllm = mp.model_view("vllm_model", VLLM_META, {})
    assert (vllm.batched, vllm.decoupled, mp.guess_profile(vllm)) == (False, False, "vllm")
    # no config: batching read from the metadata's shapes
    assert mp.model_view("e", ENSEMBLE_META, {}).batched is True
    simple = mp.model_view(
        "simple",
        {"inputs": [{"name": "INPUT0", "datatype": "INT32"}], "outputs": [{"name": "OUTPUT0"}]},
        {},
    )
    assert mp.profile_problems("trtllm", simple) == [
        "model 'simple' has no input 'text_input'",
        "model 'simple' has no input 'max_tokens' (TensorRT-LLM ensemble)",
        "model 'simple' has no output 'text_output'",
    ]


def _tensors(
    values: dict[str, Any], view: mp.ModelView
) -> dict[str, tuple[str, tuple[int, ...], list[Any]]]:
    req = mp.infer_request(values, view)
    out = {}
    for t in req.inputs:
        arr = as_numpy(t).reshape(-1).tolist()
        out[t.name] = (t.datatype.value, t.shape, arr)
    return out


def test_trtllm_ensemble_tensors() -> None:
    view = mp.model_view("ensemble", ENSEMBLE_META, ENSEMBLE_CONFIG)
    req = parse(
        p(
            temperature=0.5,
            top_k=10,
            top_p=0.95,
            repetition_penalty=1.03,
            details=True,
            typical_p=0.5,
            watermark=True,
            priority=2,
            seed=846930886,
        )
    )
    values, dropped = mp.select(mp.candidate_values(req, "trtllm", view, "random_seed", True), view)
    assert dropped == []
    got = _tensors(values, view)
    assert got == {
        "text_input": ("BYTES", (1, 1), [b"hi"]),
        "stream": ("BOOL", (1, 1), [True]),
        "exclude_input_in_output": ("BOOL", (1, 1), [True]),
        "max_tokens": ("INT32", (1, 1), [20]),
        "temperature": ("FP32", (1, 1), [pytest.approx(0.5)]),
        "top_k": ("INT32", (1, 1), [10]),
        "top_p": ("FP32", (1, 1), [pytest.approx(0.95)]),
        "repetition_penalty": ("FP32", (1, 1), [pytest.approx(1.03)]),
        "random_seed": ("UINT64", (1, 1), [846930886]),
        "return_log_probs": ("BOOL", (1, 1), [True]),
    }
    assert [o.name for o in mp.infer_request(values, view).outputs or []] == [
        "text_output",
        "output_log_probs",
    ]


def test_trtllm_greedy_and_unknown_inputs_dropped() -> None:
    llm = mp.model_view(
        "llm",
        {
            "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1]},
                {"name": "max_tokens", "datatype": "INT32", "shape": [1]},
                {"name": "top_k", "datatype": "INT32", "shape": [1]},
                {"name": "seed", "datatype": "UINT64", "shape": [1]},
            ],
            "outputs": [{"name": "text_output"}],
        },
        {"max_batch_size": 0},
    )
    req = parse(p(do_sample=False, temperature=0.7, top_k=50, seed=3))
    values, dropped = mp.select(mp.candidate_values(req, "trtllm", llm), llm)
    assert dropped == ["stream", "exclude_input_in_output"]
    assert _tensors(values, llm) == {
        "text_input": ("BYTES", (1,), [b"hi"]),
        "max_tokens": ("INT32", (1,), [20]),
        "top_k": ("INT32", (1,), [1]),  # greedy
        "seed": ("UINT64", (1,), [3]),
    }


def test_vllm_sampling_parameters() -> None:
    view = mp.model_view("vllm_model", VLLM_META, {})
    req = parse(
        p(
            temperature=0.5,
            top_k=10,
            top_p=0.95,
            seed=9,
            repetition_penalty=1.03,
            typical_p=0.5,
            watermark=True,
            details=True,
        )
    )
    values, dropped = mp.select(mp.candidate_values(req, "vllm", view, stream=True), view)
    assert dropped == []
    sampling = json.loads(values.pop("sampling_parameters"))
    assert sampling == {
        "max_tokens": 20,
        "seed": 9,
        "temperature": 0.5,
        "top_k": 10,
        "top_p": 0.95,
        "repetition_penalty": 1.03,
    }
    assert values == {
        "text_input": "hi",
        "stream": True,
        "exclude_input_in_output": True,
        "return_finish_reason": True,
        "return_num_output_tokens": True,
    }
    greedy = parse(p(do_sample=False, top_k=4))
    sampling = json.loads(mp.candidate_values(greedy, "vllm", view)["sampling_parameters"])
    assert sampling == {"max_tokens": 20, "seed": 846930886, "temperature": 0.0}


def test_generate_bodies() -> None:
    view = mp.model_view("ensemble", ENSEMBLE_META, ENSEMBLE_CONFIG)
    req = parse(p(temperature=0.5, seed=1, details=True))
    body, dropped = mp.generate_body(req, "trtllm", view, "random_seed", False)
    assert body == {
        "text_input": "hi",
        "stream": False,
        "exclude_input_in_output": True,
        "max_tokens": 20,
        "temperature": 0.5,
        "random_seed": 1,
        "return_log_probs": True,
    }
    assert dropped == []
    body, _ = mp.generate_body(req, "generate", view, "seed", True)
    assert body == {
        "text_input": "hi",
        "parameters": {"max_tokens": 20, "seed": 1, "temperature": 0.5, "details": True},
        "stream": True,
        "exclude_input_in_output": True,
    }


def test_media_mapping() -> None:
    mm = mp.model_view(
        "e",
        {
            "inputs": [
                {"name": "text_input", "datatype": "BYTES"},
                {"name": "image_url_input", "datatype": "BYTES"},
            ]
        },
        {},
    )
    req = parse(
        {
            "inputs": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": "http://x/y.png"},
            ]
        },
        Limits(999),
    )
    assert mp.candidate_values(req, "trtllm", mm)["image_url_input"] == ["http://x/y.png"]
    plain = mp.model_view("e", ENSEMBLE_META, {})
    with pytest.raises(CodecError, match=r"model 'e' takes no image inputs\."):
        mp.candidate_values(req, "trtllm", plain)
    vllm = mp.model_view(
        "v", {"inputs": [*VLLM_META["inputs"], {"name": "image", "datatype": "BYTES"}]}, {}
    )
    with pytest.raises(CodecError, match="data:image"):
        mp.candidate_values(req, "vllm", vllm)
    req.media[0].url = "data:image/png;base64,QUJD"
    assert mp.candidate_values(req, "vllm", vllm)["image"] == ["QUJD"]


def test_value_that_does_not_fit_is_a_codec_error() -> None:
    view = mp.ModelView("m", {"text_input": Datatype.BYTES, "max_tokens": Datatype.INT8})
    with pytest.raises(CodecError, match="max_tokens"):
        mp.infer_request({"max_tokens": 1000}, view)


# ---------------------------------------------------------------------- response map


def _text(*values: str, name: str = "text_output") -> Tensor:
    return Tensor(
        name, Datatype.BYTES, (len(values),), serialize_bytes([v.encode() for v in values])
    )


@pytest.mark.parametrize(
    ("outputs", "chunk"),
    [
        ([_text("你好")], ans.Chunk("你好")),
        ([_text("a", "b")], ans.Chunk("ab")),
        (
            [
                _text(" x"),
                Tensor("num_output_tokens", Datatype.UINT32, (1,), np.array([2], "<u4").tobytes()),
                _text("length", name="finish_reason"),
            ],
            ans.Chunk(" x", 2, "length"),
        ),
        (
            [_text("x"), Tensor("output_log_probs", Datatype.FP32, (1, 1, 3), bytes(12))],
            ans.Chunk("x", 3),
        ),
        ([_text(""), _text("None", name="finish_reason")], ans.Chunk("")),
        ([_text("."), _text("stop", name="finish_reason")], ans.Chunk(".", None, "eos_token")),
        ([_text("."), _text("abort", name="finish_reason")], ans.Chunk(".", None, "stop_sequence")),
        ([], ans.Chunk("")),
    ],
)
def test_chunk_from_response(outputs: list[Tensor], chunk: ans.Chunk) -> None:
    assert ans.chunk_from_response(InferResponse("m", outputs)) == chunk


@pytest.mark.parametrize(
    ("obj", "chunk"),
    [
        ({"model_name": "e", "model_version": "1", "text_output": " am"}, ans.Chunk(" am")),
        ({"text_output": ["a", "b"]}, ans.Chunk("ab")),
        ({"text_output": "x", "output_log_probs": [[0.1, 0.2]]}, ans.Chunk("x", 2)),
        ({"text_output": "x", "output_log_probs": [0.1, 0.2, 0.3]}, ans.Chunk("x", 3)),
        ({"text_output": "x", "output_log_probs": -0.5}, ans.Chunk("x", 1)),
        (
            {"text_output": "x", "num_output_tokens": 2, "finish_reason": "length"},
            ans.Chunk("x", 2, "length"),
        ),
        ({"text_output": "", "finish_reason": ["None"]}, ans.Chunk("")),
        (
            {"text_output": "x", "details": {"finish_reason": "eos_token", "logprobs": [{}, {}]}},
            ans.Chunk("x", 2, "eos_token"),
        ),
        ({"text_output": "x", "num_output_tokens": [2, 3.0]}, ans.Chunk("x", 5)),
        ({"text_output": "x", "num_output_tokens": 10**400}, ans.Chunk("x", 10**400)),
    ],
)
def test_chunk_from_generate(obj: Any, chunk: ans.Chunk) -> None:
    assert ans.chunk_from_generate(obj) == chunk


def test_generate_errors() -> None:
    with pytest.raises(BackendError, match="boom") as info:
        ans.chunk_from_generate({"error": "boom"})
    assert info.value.http_status == 500
    with pytest.raises(BadGateway):
        ans.chunk_from_generate([1])


# Found by fuzzing (tests/fuzz/targets/fuzz_mindie.py): a backend's generate answer with an empty
# error text gave an error without a message; a count that is no number raised ValueError,
# TypeError or OverflowError (a 500 'internal error' instead of the backend's fault).
@pytest.mark.parametrize("error", ["", None, 0])
def test_generate_error_always_has_a_text(error: Any) -> None:
    with pytest.raises(BackendError) as info:
        ans.chunk_from_generate({"error": error})
    assert info.value.message == (
        str(error) or "the backend's generate answer is an error without a text"
    )


@pytest.mark.parametrize("count", ["2", "x", None, {}, [1, "2"], 1.5, float("inf"), True, [[1]]])
def test_generate_token_count_not_a_number(count: Any) -> None:
    with pytest.raises(BadGateway, match="'num_output_tokens' is no count"):
        ans.chunk_from_generate({"text_output": "x", "num_output_tokens": count})


def test_mindie_answers_exactly() -> None:
    assert ans.text_answer("am a", None) == b'{"generated_text":"am a"}'
    detail = ans.details("length", 20, 846930886)
    assert json.loads(ans.text_answer("am", detail)) == {
        "generated_text": "am",
        "details": {"finish_reason": "length", "generated_tokens": 20, "seed": 846930886},
    }
    assert ans.token_event(0.04554, None, "am", 626) == (
        b'data: {"prefill_time":45.54,"decode_time":null,"token":{"id":626,"text":"am"}}\n\n'
    )
    assert ans.token_event(None, 0.0128, " a") == (
        b'data: {"prefill_time":null,"decode_time":12.8,"token":{"id":0,"text":" a"}}\n\n'
    )
    final = ans.final_event(None, 0.011, "am a", None)
    assert final.startswith(b"data: ") and final.endswith(b"}\n\n")
    assert json.loads(final[6:]) == {
        "prefill_time": None,
        "decode_time": 11.0,
        "generated_text": "am a",
        "details": None,
        "token": {"id": 0, "text": None},
    }
    assert ans.error_body("x", "Input Validation Error") == (
        b'{"error":"x","error_type":"Input Validation Error"}'
    )


@pytest.mark.parametrize(
    ("reported", "tokens", "max_new", "reason"),
    [
        (None, 20, 20, "length"),
        (None, 3, 20, "eos_token"),
        ("stop_sequence", 3, 20, "stop_sequence"),
    ],
)
def test_finish_reason(reported: str | None, tokens: int, max_new: int, reason: str) -> None:
    assert ans.finish_reason(reported, tokens, max_new) == reason


def test_prompt_echo_and_word_count() -> None:
    assert ans.strip_echo("My name is x y", "My name is") == "x y"
    assert ans.strip_echo("other", "My") == "other"
    assert ans.count_words(" a b  c") == 3
