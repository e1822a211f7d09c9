"""Chat templates: an OpenAI-style ``messages`` list rendered into one prompt string, by a Jinja2
template in the Hugging Face ``chat_template`` form.

A template is compiled and checked once, at start-up (:class:`TemplateProblem`), and rendered in
Jinja2's immutable sandbox; a failed render is :class:`~v2proxy.core.errors.InvalidField` for
``messages``. The default renders a system ``S`` and a user ``U`` message as
``"system: S\\nuser: U\\nassistant:"``. Pure: no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn

from jinja2 import Template, TemplateError, TemplateSyntaxError, Undefined
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from v2proxy.core.errors import InvalidField

DEFAULT_TEMPLATE = (
    "{% for message in messages %}\n"
    "{{ message['role'] }}: "
    "{{ message['content'] if message['content'] is not none else '' }}\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "assistant:\n"
    "{%- endif %}\n"
)

DEFAULT_ORIGIN = "the default template"

#: the messages of the start-up check: a template must render them to some text
TRIAL_MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "Hello"}]


class TemplateProblem(ValueError):
    """A chat template that cannot be used: one line naming its origin (and, for a syntax
    error, the line of the template at fault)."""


class _Raised(Exception):
    """What the templates' ``raise_exception(message)`` raises: the template refuses the
    messages, in its own words."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled, checked chat template; made by :func:`compile_template`,
    :func:`from_tokenizer_config` or :func:`default_template`."""

    #: where it came from: ``the default template``, or the path the caller gave
    origin: str
    bos_token: str
    eos_token: str
    template: Template = field(repr=False, compare=False)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt for ``messages``; :class:`InvalidField` (``messages``) when the template
        cannot render them."""
        try:
            return self._render(messages, add_generation_prompt)
        except Exception as exc:
            raise InvalidField(
                f"the chat template ({self.origin}) cannot render these messages: {_reason(exc)}",
                "messages",
            ) from exc

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            tools=None,
            documents=None,
        )


def compile_template(
    text: str, origin: str, bos_token: str = "", eos_token: str = ""
) -> ChatTemplate:
    """``text`` compiled and checked (syntax; a trial render of one user message ``Hello``
    with ``add_generation_prompt`` gives some text); :class:`TemplateProblem` when it fails."""
    try:
        template = _Sandbox().from_string(text)
    except TemplateSyntaxError as exc:
        raise TemplateProblem(
            f"{origin}, line {exc.lineno}: the chat template is not valid Jinja2:"
            f" {_one_line(exc.message or str(exc))}"
        ) from exc
    except Exception as exc:
        raise TemplateProblem(
            f"{origin}: the chat template is not valid Jinja2: {_reason(exc)}"
        ) from exc
    chat = ChatTemplate(origin, bos_token, eos_token, template)
    try:
        trial = chat._render(TRIAL_MESSAGES, True)
    except Exception as exc:
        raise TemplateProblem(
            f"{origin}: the chat template fails on one user message 'Hello': {_reason(exc)}"
        ) from exc
    if not trial.strip():
        raise TemplateProblem(
            f"{origin}: the chat template renders nothing for one user message 'Hello'"
            f" (the output is {trial!r})"
        )
    return chat


def from_tokenizer_config(obj: Any, origin: str) -> ChatTemplate:
    """The chat template of a parsed Hugging Face ``tokenizer_config.json`` and its bos and eos
    tokens, compiled and checked; :class:`TemplateProblem` naming the key at fault."""
    if not isinstance(obj, dict):
        raise TemplateProblem(f"{origin}: a tokenizer config is a JSON object, not {_kind(obj)}")
    if obj.get("chat_template") is None:
        raise TemplateProblem(f"{origin}: the tokenizer config has no chat_template")
    text = _template_text(obj["chat_template"], origin)
    bos = _token(obj, "bos_token", origin)
    eos = _token(obj, "eos_token", origin)
    return compile_template(text, origin, bos, eos)


def default_template() -> ChatTemplate:
    """:data:`DEFAULT_TEMPLATE`, compiled, with empty bos and eos tokens."""
    return compile_template(DEFAULT_TEMPLATE, DEFAULT_ORIGIN)


def _template_text(value: Any, origin: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise TemplateProblem(
            f"{origin}: chat_template must be a string or a list of"
            f' {{"name": ..., "template": ...}} objects, not {_kind(value)}'
        )
    names: list[str] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise TemplateProblem(
                f"{origin}: chat_template[{i}] must be an object with a name and a template,"
                f" not {_kind(entry)}"
            )
        for key in ("name", "template"):
            if not isinstance(entry.get(key), str):
                raise TemplateProblem(
                    f"{origin}: chat_template[{i}].{key} must be a string,"
                    f" not {_kind(entry.get(key), key in entry)}"
                )
        names.append(entry["name"])
    if "default" in names:
        text: str = value[names.index("default")]["template"]
        return text
    listed = ", ".join(repr(name) for name in names) or "none"
    raise TemplateProblem(
        f"{origin}: chat_template lists no template named 'default' (its names: {listed})"
    )


def _token(obj: dict[str, Any], key: str, origin: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        content = value.get("content")
        if isinstance(content, str):
            return content
        raise TemplateProblem(
            f"{origin}: {key}.content must be a string, not {_kind(content, 'content' in value)}"
        )
    raise TemplateProblem(
        f"{origin}: {key} must be a string or an object with a string content, not {_kind(value)}"
    )


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox with the Hugging Face form's globals and ``tojson``; an unsafe attribute is
    refused at once rather than read as undefined."""

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"],
            autoescape=False,
        )
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.filters["tojson"] = _tojson

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe"
        )


def _raise_exception(message: Any) -> NoReturn:
    raise _Raised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _Raised):
        return _one_line(exc.message)
    text = _one_line(str(exc))
    if isinstance(exc, TemplateError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _kind(value: Any, present: bool = True) -> str:
    """The JSON type of a parsed value, as an error message names it (``missing`` when the key
    is absent)."""
    if not present:
        return "missing"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"
