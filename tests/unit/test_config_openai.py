"""The ``openai:`` section of the config file (v2proxy.ops.config_sections.parse_openai): its
keys and defaults, the chat template files read, compiled and checked at start-up, and one line
naming the key for each mistake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from v2proxy.codecs.chat_template import DEFAULT_ORIGIN
from v2proxy.ops.config import load_settings
from v2proxy.ops.config_sections import OPENAI_KEYS, ConfigError, OpenAIModel


def load(tmp_path: Path, section: object) -> list[OpenAIModel]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"openai": section}))  # JSON is YAML
    settings = load_settings({}, str(cfg), env={})
    assert settings.openai is not None
    return list(settings.openai.models)


def test_defaults_and_keys(tmp_path: Path) -> None:
    a, b = load(
        tmp_path,
        {
            "models": {
                "a": None,
                "org/b": {"model": "vllm_model", "profile": "vllm", "max-tokens": 5, "timeout": 9},
            }
        },
    )
    assert (a.id, a.model, a.profile, a.seed_input) == ("a", "a", "trtllm", "seed")
    defaults = {spec.name: spec.default for spec in OPENAI_KEYS}
    assert (a.max_tokens, a.timeout) == (defaults["max_tokens"], defaults["timeout"]) == (16, 600)
    assert a.template.origin == DEFAULT_ORIGIN
    assert (b.id, b.model, b.profile, b.max_tokens, b.timeout) == (
        "org/b",
        "vllm_model",
        "vllm",
        5,
        9,
    )


def test_no_section_is_none(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("log_level: info\n")
    assert load_settings({}, str(cfg), env={}).openai is None


def test_template_file_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>"
    )
    (model,) = load(tmp_path, {"models": {"m": {"chat_template": "t.jinja"}}})
    assert model.template.origin == str(tmp_path / "t.jinja")
    assert model.template.render([{"role": "user", "content": "hi"}]) == "[user] hi\n>"


def test_template_from_a_tokenizer_config(tmp_path: Path) -> None:
    config = {
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}"
        "{% endfor %}",
        "bos_token": "<s>",
        "eos_token": {"content": "</s>"},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (model,) = load(tmp_path, {"models": {"m": {"chat_template": "tokenizer_config.json"}}})
    assert model.template.render([{"role": "user", "content": "x"}]) == "<s>x</s>"


@pytest.mark.parametrize(
    ("section", "files", "message"),
    [
        ([], {}, "openai: must be a mapping"),
        ({}, {}, "openai.models: missing"),
        ({"models": {}}, {}, "openai.models: names no model"),
        ({"model": {}}, {}, "openai.model: unknown key (known: models)"),
        ({"models": {"m": {"profile": "gpt"}}}, {}, "openai.models.m.profile:"),
        ({"models": {"m": {"max_tokens": 0}}}, {}, "openai.models.m.max_tokens:"),
        ({"models": {"m": {"temperature": 1}}}, {}, "openai.models.m.temperature: unknown key"),
        (
            {"models": {"m": {"profile": "vllm", "seed_input": "seed"}}},
            {},
            "openai.models.m.seed_input: only applies to profile 'trtllm'",
        ),
        (
            {"models": {"m": {"chat_template": "missing.jinja"}}},
            {},
            "openai.models.m.chat_template: cannot read 'missing.jinja'",
        ),
        (
            {"models": {"m": {"chat_template": "bad.jinja"}}},
            {"bad.jinja": "line one\n{% for m in messages %}"},
            "line 2",
        ),
        (
            {"models": {"m": {"chat_template": "empty.jinja"}}},
            {"empty.jinja": "{% if false %}x{% endif %}"},
            "renders nothing",
        ),
        (
            {"models": {"m": {"chat_template": "t.json"}}},
            {"t.json": "{not json"},
            "not valid JSON",
        ),
        (
            {"models": {"m": {"chat_template": "t.json"}}},
            {"t.json": '{"chat_template": 5}'},
            "chat_template",
        ),
    ],
)
def test_mistakes_are_one_line_naming_the_key(
    tmp_path: Path, section: object, files: dict[str, str], message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as info:
        load(tmp_path, section)
    text = str(info.value)
    assert "\n" not in text
    assert message in text, text
    assert text.startswith(str(tmp_path / "c.yaml"))
