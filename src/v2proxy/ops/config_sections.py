"""The sections of the YAML config file besides the option keys, parsed and checked once at
start-up into frozen objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from v2proxy.codecs import chat_template
from v2proxy.codecs.chat_template import ChatTemplate, TemplateProblem
from v2proxy.codecs.json import loads
from v2proxy.core.errors import CodecError
from v2proxy.ops.config_spec import SettingSpec
from v2proxy.ops.config_values import MiB, choice, int_range, positive_int, text


class ConfigError(Exception):
    """A configuration value is invalid; the message is one line naming the key."""


@dataclass(frozen=True, slots=True)
class OutputSettings:
    """Settings of one output of one model: its class labels (line i = class i)."""

    labels: tuple[str, ...] = field(repr=False)
    labels_path: str = ""  # absolute


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """Per-model settings (``models.<name>`` in the YAML file)."""

    outputs: Mapping[str, OutputSettings] = field(default_factory=lambda: MappingProxyType({}))


MINDIE_KEYS: tuple[SettingSpec, ...] = (
    SettingSpec("model", None, text, "the v2 model that serves /infer", "NAME", shown="required"),
    SettingSpec(
        "profile",
        "trtllm",
        choice("trtllm", "vllm", "generate"),
        "how the text and the sampling knobs map to that model's tensors: trtllm (the"
        " TensorRT-LLM ensemble), vllm (Triton's vLLM backend) or generate (any server with the"
        " generate extension)",
        "trtllm|vllm|generate",
    ),
    SettingSpec(
        "max_new_tokens",
        20,
        int_range(1, 2**31 - 1),
        "tokens to generate when a request gives none (MindIE's default)",
        "N",
    ),
    SettingSpec(
        "max_input_chars",
        4 * MiB,
        positive_int,
        "longest inputs text, in UTF-16 code units (MindIE's documented limit)",
        "N",
    ),
    SettingSpec(
        "timeout",
        600,
        int_range(1, 65535),
        "seconds a request may take when it gives no timeout (MindIE's default)",
        "SECONDS",
    ),
    SettingSpec(
        "seed_input",
        "seed",
        choice("seed", "random_seed"),
        "the name of the TensorRT-LLM seed tensor: seed, or random_seed before May 2025 (profile"
        " trtllm only)",
        "seed|random_seed",
    ),
)
MINDIE_PARSERS: dict[str, Any] = {spec.name: spec.parser for spec in MINDIE_KEYS}
_MINDIE_DEFAULTS = {spec.name: spec.default for spec in MINDIE_KEYS}


@dataclass(frozen=True, slots=True)
class MindieSettings:
    """``mindie:`` — serving MindIE's native ``POST /infer`` from a v2 model."""

    model: str
    profile: str = _MINDIE_DEFAULTS["profile"]
    max_new_tokens: int = _MINDIE_DEFAULTS["max_new_tokens"]
    max_input_chars: int = _MINDIE_DEFAULTS["max_input_chars"]
    timeout: int = _MINDIE_DEFAULTS["timeout"]
    seed_input: str = _MINDIE_DEFAULTS["seed_input"]


OPENAI_KEYS: tuple[SettingSpec, ...] = (
    SettingSpec(
        "model",
        None,
        text,
        "the v2 model that serves this OpenAI model id",
        "NAME",
        shown="the id itself",
    ),
    *(spec for spec in MINDIE_KEYS if spec.name in ("profile", "seed_input")),
    SettingSpec(
        "chat_template",
        None,
        text,
        "the chat template of /v1/chat/completions: a Jinja2 file in the Hugging Face"
        " chat_template form, or a tokenizer_config.json that holds one (relative paths from the"
        " working directory, else from the config file's folder); checked at start-up",
        "FILE",
        shown="the plain default (docs/guides/openai.md)",
    ),
    SettingSpec(
        "max_tokens",
        16,
        int_range(1, 2**31 - 1),
        "tokens to generate when a request gives no max_tokens (OpenAI's completions default)",
        "N",
    ),
    SettingSpec(
        "timeout",
        600,
        int_range(1, 65535),
        "seconds a request may take, the proxy's own deadline",
        "SECONDS",
    ),
)
OPENAI_PARSERS: dict[str, Any] = {spec.name: spec.parser for spec in OPENAI_KEYS}
_OPENAI_DEFAULTS = {spec.name: spec.default for spec in OPENAI_KEYS}


@dataclass(frozen=True, slots=True)
class OpenAIModel:
    """One model id of the OpenAI routes and the v2 model behind it."""

    id: str
    model: str
    profile: str = _OPENAI_DEFAULTS["profile"]
    seed_input: str = _OPENAI_DEFAULTS["seed_input"]
    max_tokens: int = _OPENAI_DEFAULTS["max_tokens"]
    timeout: int = _OPENAI_DEFAULTS["timeout"]
    template: ChatTemplate = field(default_factory=chat_template.default_template, repr=False)


@dataclass(frozen=True, slots=True)
class OpenAISettings:
    """``openai:`` — the models of the OpenAI routes, in the file's order."""

    models: tuple[OpenAIModel, ...]


def _yaml_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {str: "a string", list: "a list", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _mapping(value: Any, file: str, key: str, what: str, allowed: Any = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{file}: {key}: must be a mapping of {what}, not {_yaml_kind(value)}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if isinstance(k, bool) or not isinstance(k, str | int):
            raise ConfigError(f"{file}: {key}: {k!r} is not a valid name")
        name = str(k)
        if allowed is not None:  # spelt with - or _ as at the top level
            name = name.replace("-", "_")
            if name not in allowed:
                known = ", ".join(sorted(allowed))
                raise ConfigError(f"{file}: {key}.{k}: unknown key (known: {known})")
        out[name] = v
    return out


def parse_models(raw: Any, file: str, folder: Path) -> Mapping[str, ModelSettings]:
    models: dict[str, ModelSettings] = {}
    for name, value in _mapping(raw, file, "models", "model names").items():
        where = f"models.{name}"
        model = _mapping(value, file, where, "model settings", allowed={"outputs"})
        outputs: dict[str, OutputSettings] = {}
        for out_name, out_value in _mapping(
            model.get("outputs", {}), file, f"{where}.outputs", "output names"
        ).items():
            key = f"{where}.outputs.{out_name}"
            out = _mapping(out_value, file, key, "output settings", allowed={"labels"})
            if "labels" not in out:
                raise ConfigError(f"{file}: {key}.labels: missing (the path of a label file)")
            outputs[out_name] = _read_labels(out["labels"], file, f"{key}.labels", folder)
        models[name] = ModelSettings(MappingProxyType(outputs))
    return MappingProxyType(models)


def _read_file(raw: Any, file: str, key: str, folder: Path, what: str) -> tuple[Path, bytes]:
    """A file the config names: relative paths from the working directory, else ``folder``."""
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"{file}: {key}: must be the path of {what}")
    path = Path(raw).expanduser()
    where = ""
    if not path.is_absolute():
        here = Path.cwd() / path
        path = here if here.exists() else folder / path
        where = f" (looked in the working directory and in {folder})"
    try:
        return path, path.read_bytes()
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            where = ""
        raise ConfigError(f"{file}: {key}: cannot read '{raw}': {exc.strerror}{where}") from None


def _read_labels(raw: Any, file: str, key: str, folder: Path) -> OutputSettings:
    """One label per line, UTF-8."""
    path, data = _read_file(raw, file, key, folder, "a label file")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{file}: {key}: '{raw}' is not UTF-8 text"
            f" (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    labels = tuple(line.removesuffix("\r") for line in lines)
    if not any(labels):
        raise ConfigError(f"{file}: {key}: '{raw}' holds no labels")
    return OutputSettings(labels, str(path.absolute()))


def parse_mindie(raw: Any, file: str) -> MindieSettings:
    section = _mapping(raw, file, "mindie", "MindIE settings", allowed=set(MINDIE_PARSERS))
    if "model" not in section:
        raise ConfigError(f"{file}: mindie.model: missing (the v2 model that serves /infer)")
    values: dict[str, Any] = {}
    for key, value in section.items():
        try:
            values[key] = MINDIE_PARSERS[key](value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{file}: mindie.{key}: {exc} (got {value!r})") from None
    if "seed_input" in values and values.get("profile", _MINDIE_DEFAULTS["profile"]) != "trtllm":
        raise ConfigError(f"{file}: mindie.seed_input: only applies to profile 'trtllm'")
    return MindieSettings(**values)


def _read_template(raw: Any, file: str, key: str, folder: Path) -> ChatTemplate:
    """A chat template file, compiled: ``.json`` is a Hugging Face ``tokenizer_config.json``,
    anything else a Jinja2 template."""
    path, data = _read_file(raw, file, key, folder, "a chat template file")
    origin = str(path.absolute())
    try:
        if path.suffix.lower() == ".json":
            try:
                doc = loads(data, "tokenizer config")
            except CodecError as exc:
                raise TemplateProblem(f"{origin}: not valid JSON: {exc.message}") from None
            return chat_template.from_tokenizer_config(doc, origin)
        try:
            source = data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError:
            raise TemplateProblem(f"{origin}: not UTF-8 text") from None
        return chat_template.compile_template(source, origin)
    except TemplateProblem as exc:
        raise ConfigError(f"{file}: {key}: {exc}") from None


def parse_openai(raw: Any, file: str, folder: Path) -> OpenAISettings:
    section = _mapping(raw, file, "openai", "OpenAI settings", allowed={"models"})
    if "models" not in section:
        raise ConfigError(f"{file}: openai.models: missing (model id -> the v2 model behind it)")
    entries = _mapping(section["models"], file, "openai.models", "OpenAI model ids")
    if not entries:
        raise ConfigError(f"{file}: openai.models: names no model")
    models = []
    for model_id, value in entries.items():
        where = f"openai.models.{model_id}"
        keys = _mapping(
            {} if value is None else value,
            file,
            where,
            "model settings",
            allowed=set(OPENAI_PARSERS),
        )
        values: dict[str, Any] = {"model": model_id}
        template = None
        for key, item in keys.items():
            if key == "chat_template":
                template = _read_template(item, file, f"{where}.chat_template", folder)
                continue
            try:
                values[key] = OPENAI_PARSERS[key](item)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{file}: {where}.{key}: {exc} (got {item!r})") from None
        if "seed_input" in values and values.get("profile", "trtllm") != "trtllm":
            raise ConfigError(f"{file}: {where}.seed_input: only applies to profile 'trtllm'")
        if template is not None:
            values["template"] = template
        models.append(OpenAIModel(model_id, **values))
    return OpenAISettings(tuple(models))
