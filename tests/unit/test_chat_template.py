"""Chat templates (codecs/chat_template.py): the default's exact prompts, a ChatML-style template,
the bos/eos tokens, the Hugging Face globals and filters (raise_exception, strftime_now, tojson,
loop controls), every render failure as InvalidField("messages"), the start-up checks as
TemplateProblem, the tokenizer_config.json forms, and the sandbox."""

from __future__ import annotations

import re
from typing import Any

import pytest

from v2proxy.codecs.chat_template import (
    DEFAULT_TEMPLATE,
    ChatTemplate,
    TemplateProblem,
    compile_template,
    default_template,
    from_tokenizer_config,
)
from v2proxy.core.errors import CodecError, InvalidField

ORIGIN = "models/chat.jinja"

SYSTEM = {"role": "system", "content": "S"}
USER = {"role": "user", "content": "U"}
ASSISTANT = {"role": "assistant", "content": "A"}

# A ChatML-style template, written for these tests.
CHATML = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A template that refuses a system message in its own words.
NO_SYSTEM = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}"
    "{% endif %}"
    "[{{ message['role'] }}] {{ message['content'] }}\n"
    "{% endfor %}"
)


def chat(text: str, bos: str = "", eos: str = "") -> ChatTemplate:
    return compile_template(text, ORIGIN, bos, eos)


def render_error(template: ChatTemplate, messages: list[dict[str, Any]]) -> InvalidField:
    with pytest.raises(InvalidField) as caught:
        template.render(messages)
    return caught.value


def problem(text: str) -> str:
    with pytest.raises(TemplateProblem) as caught:
        chat(text)
    return str(caught.value)


# --- the default ------------------------------------------------------------------------------

# (case id, messages, add_generation_prompt, the exact prompt)
DEFAULT_CASES: list[tuple[str, list[dict[str, Any]], bool, str]] = [
    ("user", [USER], True, "user: U\nassistant:"),
    ("user-no-prompt", [USER], False, "user: U\n"),
    ("system-user", [SYSTEM, USER], True, "system: S\nuser: U\nassistant:"),
    ("system-user-no-prompt", [SYSTEM, USER], False, "system: S\nuser: U\n"),
    ("three", [SYSTEM, USER, ASSISTANT], True, "system: S\nuser: U\nassistant: A\nassistant:"),
    ("three-no-prompt", [SYSTEM, USER, ASSISTANT], False, "system: S\nuser: U\nassistant: A\n"),
    (
        "multi-line-content",
        [{"role": "user", "content": "line 1\nline 2"}],
        True,
        "user: line 1\nline 2\nassistant:",
    ),
    ("null-content", [{"role": "assistant", "content": None}], False, "assistant: \n"),
    ("none", [], True, "assistant:"),
]


@pytest.mark.parametrize(
    ("messages", "prompt", "expected"),
    [case[1:] for case in DEFAULT_CASES],
    ids=[case[0] for case in DEFAULT_CASES],
)
def test_the_default_renders_exactly(
    messages: list[dict[str, Any]], prompt: bool, expected: str
) -> None:
    assert default_template().render(messages, add_generation_prompt=prompt) == expected


def test_the_default_is_named_and_has_no_tokens() -> None:
    template = default_template()
    assert (template.origin, template.bos_token, template.eos_token) == (
        "the default template",
        "",
        "",
    )


def test_the_docstring_shows_the_defaults_output() -> None:
    from v2proxy.codecs import chat_template

    assert chat_template.__doc__ is not None
    shown = '"system: S\\nuser: U\\nassistant:"'
    assert shown in chat_template.__doc__
    assert default_template().render([SYSTEM, USER]) == "system: S\nuser: U\nassistant:"


def test_the_generation_prompt_is_on_by_default() -> None:
    assert default_template().render([USER]).endswith("\nassistant:")


def test_default_template_text_compiles_as_given() -> None:
    assert compile_template(DEFAULT_TEMPLATE, "x").render([USER]) == "user: U\nassistant:"


# --- a template of a model's own --------------------------------------------------------------


def test_a_chatml_template_renders_exactly() -> None:
    template = chat(CHATML)
    assert template.render([SYSTEM, USER]) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render([SYSTEM, USER], add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
    )


def test_the_bos_and_eos_tokens_reach_the_template() -> None:
    text = "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
    template = chat(text, bos="<s>", eos="</s>")
    assert (template.bos_token, template.eos_token) == ("<s>", "</s>")
    assert template.render([USER, ASSISTANT]) == "<s>U</s>A</s>"


def test_tools_and_documents_are_none() -> None:
    template = chat("{% if tools is none and documents is none %}none{% else %}set{% endif %}")
    assert template.render([USER]) == "none"


def test_trim_and_lstrip_blocks_are_on() -> None:
    text = "{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m.content }}\n"
    template = chat(text + "    {% endif %}\n{% endfor %}\n")
    assert template.render([USER, ASSISTANT, USER]) == "U\nU\n"


# --- the Hugging Face form's globals and filters ----------------------------------------------


def test_raise_exception_is_invalid_field_with_the_templates_message() -> None:
    template = chat(NO_SYSTEM)
    assert template.render([USER]) == "[user] U\n"
    error = render_error(template, [SYSTEM, USER])
    assert error.field == "messages"
    assert error.message == (
        "the chat template (models/chat.jinja) cannot render these messages:"
        " System role not supported"
    )
    assert isinstance(error, CodecError)
    assert error.http_status == 400


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"k": "é", "n": [1, 2]}, '{"k": "é", "n": [1, 2]}'),
        ("日本語", '"日本語"'),
        (None, "null"),
    ],
    ids=["object", "string", "null"],
)
def test_tojson_keeps_non_ascii(value: Any, expected: str) -> None:
    template = chat("{{ messages[0].content|tojson }}")
    assert template.render([{"role": "user", "content": value}]) == expected


def test_tojson_takes_indent_separators_and_sort_keys() -> None:
    template = chat(
        "{{ messages[0].content|tojson(indent=2, sort_keys=True) }}|"
        "{{ messages[0].content|tojson(separators=(',', ':')) }}"
    )
    content = {"b": "ü", "a": 1}
    assert template.render([{"role": "user", "content": content}]) == (
        '{\n  "a": 1,\n  "b": "ü"\n}|{"b":"ü","a":1}'
    )


def test_tojson_escapes_no_html() -> None:
    template = chat("{{ messages[0].content|tojson }}")
    assert template.render([{"role": "user", "content": "<a href='x'>&"}]) == "\"<a href='x'>&\""


def test_loop_controls_work() -> None:
    template = chat(
        "{% for m in messages %}"
        "{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if m.role == 'assistant' %}{% break %}{% endif %}"
        "{{ m.content }};"
        "{% endfor %}"
    )
    assert template.render([SYSTEM, USER, USER, ASSISTANT, USER]) == "U;U;"


def test_strftime_now_gives_the_date() -> None:
    rendered = chat("{{ strftime_now('%Y-%m-%d') }}").render([USER])
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", rendered)


# --- render failures: always InvalidField("messages") -----------------------------------------

# (case id, a template the start-up check passes, messages it cannot render, the reason)
RENDER_FAILURES: list[tuple[str, str, list[dict[str, Any]], str]] = [
    (
        "type-error",
        "{% for m in messages %}{{ m.content + '!' }}{% endfor %}",
        [{"role": "user", "content": None}],
        "TypeError: unsupported operand type(s) for +: 'NoneType' and 'str'",
    ),
    (
        "undefined",
        "{% for m in messages %}{{ m.content }}{{ m.name.first if m.role == 'tool' }}{% endfor %}",
        [{"role": "tool", "content": "T"}],
        "'dict object' has no attribute 'name'",
    ),
    (
        "tojson-of-undefined",
        "{% for m in messages %}{{ m.content|tojson }}{% endfor %}",
        [{"role": "user", "content": {1, 2}}],
        "TypeError: Object of type set is not JSON serializable",
    ),
    (
        "raise-exception-multi-line",
        "{% if messages|length > 1 %}{{ raise_exception('one\nmessage\n  only') }}{% endif %}ok",
        [USER, USER],
        "one message only",
    ),
    (
        "unsafe-attribute",
        "{% if messages|length > 1 %}{{ messages.__class__ }}{% endif %}ok",
        [USER, USER],
        "access to attribute '__class__' of a 'list' object is unsafe",
    ),
    (
        "mutation",
        "{% if messages|length > 1 %}{{ messages.append(1) }}{% endif %}ok",
        [USER, USER],
        "access to attribute 'append' of a 'list' object is unsafe",
    ),
]


@pytest.mark.parametrize(
    ("text", "messages", "reason"),
    [case[1:] for case in RENDER_FAILURES],
    ids=[case[0] for case in RENDER_FAILURES],
)
def test_a_render_failure_is_invalid_field(
    text: str, messages: list[dict[str, Any]], reason: str
) -> None:
    error = render_error(chat(text), messages)
    assert error.field == "messages"
    assert error.message == (
        f"the chat template (models/chat.jinja) cannot render these messages: {reason}"
    )


# --- start-up checks: TemplateProblem ---------------------------------------------------------

# (case id, template text, the exact problem)
PROBLEMS: list[tuple[str, str, str]] = [
    (
        "syntax-line-1",
        "{% if %}",
        "models/chat.jinja, line 1: the chat template is not valid Jinja2:"
        " Expected an expression, got 'end of statement block'",
    ),
    (
        "syntax-line-3",
        "{% for m in messages %}\n{{ m.content }}\n{% endfo %}",
        "models/chat.jinja, line 3: the chat template is not valid Jinja2:"
        " Encountered unknown tag 'endfo'. Jinja was looking for the following tags: 'endfor'"
        " or 'else'. The innermost block that needs to be closed is 'for'.",
    ),
    (
        "unclosed-block",
        "{% for m in messages %}\n{{ m.content }}\n",
        "models/chat.jinja, line 2: the chat template is not valid Jinja2:"
        " Unexpected end of template. Jinja was looking for the following tags: 'endfor' or"
        " 'else'. The innermost block that needs to be closed is 'for'.",
    ),
    (
        "unknown-filter",
        "line 1\n{{ messages|shout }}",
        "models/chat.jinja, line 2: the chat template is not valid Jinja2: No filter named"
        " 'shout'.",
    ),
    (
        "empty",
        "",
        "models/chat.jinja: the chat template renders nothing for one user message 'Hello'"
        " (the output is '')",
    ),
    (
        "whitespace-only",
        "{% for m in messages %}  \n\t{% endfor %}",  # lstrip_blocks takes the tab
        "models/chat.jinja: the chat template renders nothing for one user message 'Hello'"
        " (the output is '  \\n')",
    ),
    (
        "refuses-a-user",
        "{% if messages[0].role == 'user' %}{{ raise_exception('Users are not welcome') }}"
        "{% endif %}",
        "models/chat.jinja: the chat template fails on one user message 'Hello':"
        " Users are not welcome",
    ),
    (
        "type-error-on-trial",
        "{{ messages[0].content + 1 }}",
        "models/chat.jinja: the chat template fails on one user message 'Hello':"
        ' TypeError: can only concatenate str (not "int") to str',
    ),
    (
        "undefined-variable",
        "{{ system_message.strip() }}",
        "models/chat.jinja: the chat template fails on one user message 'Hello':"
        " 'system_message' is undefined",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [case[1:] for case in PROBLEMS],
    ids=[case[0] for case in PROBLEMS],
)
def test_a_template_that_cannot_be_used_is_a_template_problem(text: str, expected: str) -> None:
    message = problem(text)
    assert message == expected
    assert "\n" not in message


def test_a_template_problem_is_a_value_error() -> None:
    assert issubclass(TemplateProblem, ValueError)


# --- the sandbox ------------------------------------------------------------------------------

# templates that reach for Python's internals; each must fail, naming no class it reached
ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}x",
    "{{ messages.__class__.__base__ }}x",
    "{{ raise_exception.__globals__ }}x",
    "{{ cycler.__init__.__globals__.os }}x",
    "{{ (messages|first).items.__self__.__class__ }}x",
]


@pytest.mark.parametrize("text", ESCAPES)
def test_the_sandbox_refuses_python_internals(text: str) -> None:
    with pytest.raises((TemplateProblem, InvalidField)) as caught:
        chat(text).render([USER, USER])
    message = str(caught.value)
    assert "is unsafe" in message
    assert "<class" not in message
    assert "<module" not in message
    assert "<function" not in message


def test_the_sandbox_refusal_at_render_leaks_nothing() -> None:
    template = chat("{% if messages|length > 1 %}{{ ''.__class__.__mro__ }}{% endif %}ok")
    assert template.render([USER]) == "ok"
    error = render_error(template, [USER, USER])
    assert error.field == "messages"
    assert "<class" not in error.message


# --- tokenizer_config.json --------------------------------------------------------------------

# (case id, the parsed config, (bos, eos), the prompt for [USER])
CONFIGS: list[tuple[str, Any, tuple[str, str], str]] = [
    (
        "string",
        {"chat_template": CHATML, "bos_token": "<s>", "eos_token": "</s>"},
        ("<s>", "</s>"),
        "<s><|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "list-with-default",
        {
            "chat_template": [
                {"name": "tool_use", "template": "tools!"},
                {"name": "default", "template": CHATML},
                {"name": "rag", "template": "rag!"},
            ],
            "bos_token": "<s>",
        },
        ("<s>", ""),
        "<s><|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "added-token-objects",
        {
            "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
            "bos_token": {"__type": "AddedToken", "content": "<bos>", "lstrip": False},
            "eos_token": {"content": "<eos>", "normalized": True},
        },
        ("<bos>", "<eos>"),
        "<bos>U<eos>",
    ),
    (
        "null-tokens",
        {
            "chat_template": "[{{ bos_token }}{{ messages[0].content }}{{ eos_token }}]",
            "bos_token": None,
            "eos_token": None,
        },
        ("", ""),
        "[U]",
    ),
    (
        "no-tokens-and-other-keys",
        {"chat_template": "{{ messages[0].content }}", "model_max_length": 4096},
        ("", ""),
        "U",
    ),
]


@pytest.mark.parametrize(
    ("config", "tokens", "expected"),
    [case[1:] for case in CONFIGS],
    ids=[case[0] for case in CONFIGS],
)
def test_a_tokenizer_config_gives_its_template_and_tokens(
    config: Any, tokens: tuple[str, str], expected: str
) -> None:
    template = from_tokenizer_config(config, "models/tokenizer_config.json")
    assert template.origin == "models/tokenizer_config.json"
    assert (template.bos_token, template.eos_token) == tokens
    assert template.render([USER]) == expected


# (case id, the parsed config, the exact problem after "<origin>: ")
BAD_CONFIGS: list[tuple[str, Any, str]] = [
    ("not-an-object", ["x"], "a tokenizer config is a JSON object, not an array"),
    ("no-chat-template", {"bos_token": "<s>"}, "the tokenizer config has no chat_template"),
    ("null-chat-template", {"chat_template": None}, "the tokenizer config has no chat_template"),
    (
        "chat-template-number",
        {"chat_template": 3},
        'chat_template must be a string or a list of {"name": ..., "template": ...} objects,'
        " not a number",
    ),
    (
        "list-without-default",
        {
            "chat_template": [
                {"name": "tool_use", "template": "t"},
                {"name": "rag", "template": "r"},
            ]
        },
        "chat_template lists no template named 'default' (its names: 'tool_use', 'rag')",
    ),
    (
        "empty-list",
        {"chat_template": []},
        "chat_template lists no template named 'default' (its names: none)",
    ),
    (
        "entry-not-object",
        {"chat_template": [{"name": "default", "template": "t"}, "x"]},
        "chat_template[1] must be an object with a name and a template, not a string",
    ),
    (
        "entry-without-name",
        {"chat_template": [{"template": "t"}]},
        "chat_template[0].name must be a string, not missing",
    ),
    (
        "entry-template-not-string",
        {"chat_template": [{"name": "default", "template": ["t"]}]},
        "chat_template[0].template must be a string, not an array",
    ),
    (
        "bos-number",
        {"chat_template": "x", "bos_token": 1},
        "bos_token must be a string or an object with a string content, not a number",
    ),
    (
        "eos-boolean",
        {"chat_template": "x", "eos_token": True},
        "eos_token must be a string or an object with a string content, not a boolean",
    ),
    (
        "bos-object-without-content",
        {"chat_template": "x", "bos_token": {"lstrip": False}},
        "bos_token.content must be a string, not missing",
    ),
    (
        "eos-object-content-null",
        {"chat_template": "x", "eos_token": {"content": None}},
        "eos_token.content must be a string, not null",
    ),
    (
        "default-template-empty",
        {"chat_template": [{"name": "default", "template": "{# nothing #}"}]},
        "the chat template renders nothing for one user message 'Hello' (the output is '')",
    ),
]


@pytest.mark.parametrize(
    ("config", "expected"),
    [case[1:] for case in BAD_CONFIGS],
    ids=[case[0] for case in BAD_CONFIGS],
)
def test_a_bad_tokenizer_config_is_a_template_problem(config: Any, expected: str) -> None:
    with pytest.raises(TemplateProblem) as caught:
        from_tokenizer_config(config, "cfg.json")
    assert str(caught.value) == f"cfg.json: {expected}"


def test_a_syntax_error_in_a_tokenizer_config_names_it_and_the_line() -> None:
    config = {"chat_template": "{{ bos_token }}\n{% if messages %}"}
    with pytest.raises(TemplateProblem, match=r"^cfg\.json, line 2: the chat template is not"):
        from_tokenizer_config(config, "cfg.json")
