"""Settings: parsed and validated once at start-up into frozen objects.

Precedence: command line > environment (``V2PROXY_<NAME>``) > YAML file (``--config``) >
defaults. A bad value stops the start with one clear line (:class:`ConfigError`) naming the key;
an unknown key anywhere in the file is refused the same way. Nothing reads configuration per
request.

Besides the option keys, the YAML file holds two sections (DESIGN.md "Product contract"):

- ``models``: model name -> ``{outputs: {output name -> {labels: FILE}}}``. Each label file is
  read here, once: UTF-8 (a BOM is dropped), one label per line (``\n`` or ``\r\n``; blank
  lines inside are kept, since a label's line number is its class index), not empty. A relative
  path is taken from the working directory when it exists there, else from the config file's
  folder. -> ``Settings.models[m].outputs[o].labels``.
- ``mindie``: how ``POST /infer`` (MindIE's native API) maps to a v2 model -> ``Settings.mindie``
  (:class:`MindieSettings`; keys in reference/mindie-adaptation.md §4).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import yaml

from v2proxy.restricted import DEFAULT_GROUPS, RestrictedPolicy, parse_groups, parse_header

MiB = 1024 * 1024


class ConfigError(Exception):
    """A configuration value is invalid; the message is one line naming the key."""


@dataclass(frozen=True, slots=True)
class BackendTarget:
    """Where the model server is: ``kind`` is builtin, http, https or grpc (``url`` is then
    host:port)."""

    kind: str
    url: str = ""


@dataclass(frozen=True, slots=True)
class OutputSettings:
    """Settings of one output of one model: its class labels (line i = class i)."""

    labels: tuple[str, ...] = field(repr=False)
    labels_path: str = ""  # the file they were read from, absolute


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """Per-model settings (``models.<name>`` in the YAML file)."""

    outputs: Mapping[str, OutputSettings] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class MindieSettings:
    """``mindie:`` — serving MindIE's native ``POST /infer`` from a v2 model.

    ``profile`` says how text and sampling knobs map to that model's tensors: ``trtllm`` (the
    TensorRT-LLM ``ensemble``), ``vllm`` (Triton's vLLM backend) or ``generate`` (any server with
    the generate extension). ``max_new_tokens`` and ``timeout`` (seconds) apply when a request
    gives none (MindIE's defaults: 20 and 600); ``max_input_chars`` bounds ``inputs`` in UTF-16
    code units (MindIE's documented 4 Mi); ``seed_input`` names the TensorRT-LLM seed tensor
    (``seed``, or ``random_seed`` before May 2025).
    """

    model: str
    profile: str = "trtllm"
    max_new_tokens: int = 20
    max_input_chars: int = 4 * MiB
    timeout: int = 600
    seed_input: str = "seed"


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of ``v2proxy serve`` (and of ``reference-server``)."""

    backend: BackendTarget = BackendTarget("builtin")
    backend_encoding: str = "auto"
    http_port: int = 9000
    grpc_port: int = 9001
    host: str = "0.0.0.0"
    grpc_max_message_size: int = 2**31 - 1
    max_input_size: int = 64 * MiB
    max_body_size: int = 2048 * MiB - 1
    backend_timeout: float = 60.0
    backend_connect_timeout: float = 5.0
    backend_connections: int = 100
    client_header_timeout: float = 10.0
    client_idle_timeout: float = 5.0
    client_body_timeout: float = 60.0
    drain_timeout: float = 30.0
    event_loop: str = "uvloop"
    workers: int = 1
    log_level: str = "info"
    log_format: str = "text"
    access_log: bool = False
    metrics: bool = True
    server_name: str = "v2proxy"
    client_shm: str = "local"
    backend_shm: str = "auto"
    backend_shm_threshold: int = 64 * 1024
    restricted: RestrictedPolicy = field(default_factory=RestrictedPolicy)
    models: Mapping[str, ModelSettings] = field(default_factory=lambda: MappingProxyType({}))
    mindie: MindieSettings | None = None


# key -> parser; the same keys serve CLI options, env vars and YAML keys.
def _port(v: Any) -> int:
    n = _int(v)
    if not 0 <= n <= 65535:
        raise ValueError("must be a port number 0..65535")
    return n


def _int(v: Any) -> int:
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError("expected an integer")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ValueError("expected an integer") from None


def _positive_int(v: Any) -> int:
    n = _int(v)
    if n <= 0:
        raise ValueError("must be a positive integer")
    return n


def _int_range(low: int, high: int) -> Any:
    def parse(v: Any) -> int:
        n = _int(v)
        if not low <= n <= high:
            raise ValueError(f"must be an integer {low}..{high}")
        return n

    return parse


def _positive_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("must be a positive number")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError("expected a positive number") from None
    if not 0 < x < float("inf"):
        raise ValueError("must be a positive number")
    return x


def _choice(*options: str) -> Any:
    def parse(v: Any) -> str:
        # YAML 1.1 reads a bare off/on as false/true.
        s = {False: "off", True: "on"}[v] if isinstance(v, bool) else str(v).strip().lower()
        if s not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return s

    return parse


def _switch(v: Any) -> bool:
    """on/off (YAML's bare on/off/true/false are booleans already; env vars are text)."""
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("on", "true", "yes", "1"):
        return True
    if s in ("off", "false", "no", "0"):
        return False
    raise ValueError("must be on or off")


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a non-empty string")
    return v.strip()


def parse_backend(v: Any) -> BackendTarget:
    text = str(v).strip()
    if text == "builtin":
        return BackendTarget("builtin")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https", "grpc") or not parts.hostname or not parts.port:
        raise ValueError(
            "must be 'builtin', http://host:port (a v2 REST server) or grpc://host:port"
        )
    if parts.scheme == "grpc":
        return BackendTarget("grpc", parts.netloc)
    return BackendTarget(parts.scheme, text.rstrip("/"))


PARSERS: dict[str, Any] = {
    "backend": parse_backend,
    "backend_encoding": _choice("auto", "json", "binary"),
    "http_port": _port,
    "grpc_port": _port,
    "host": str,
    "grpc_max_message_size": _positive_int,
    "max_input_size": _positive_int,
    "max_body_size": _positive_int,
    "backend_timeout": _positive_float,
    "backend_connect_timeout": _positive_float,
    "backend_connections": _positive_int,
    "client_header_timeout": _positive_float,
    "client_idle_timeout": _positive_float,
    "client_body_timeout": _positive_float,
    "drain_timeout": _positive_float,
    "event_loop": _choice("uvloop", "asyncio"),
    "workers": _positive_int,
    "log_level": _choice("debug", "info", "warning", "error"),
    "log_format": _choice("text", "json"),
    "access_log": _switch,
    "metrics": _switch,
    "client_shm": _choice("off", "local", "on"),
    "backend_shm": _choice("off", "system", "auto"),
    "backend_shm_threshold": _positive_int,
    "restricted_api": parse_groups,
    "restricted_api_header": parse_header,
}
SECRET = {"restricted_api_header"}  # never echoed in an error

MINDIE_PARSERS: dict[str, Any] = {
    "model": _text,
    "profile": _choice("trtllm", "vllm", "generate"),
    "max_new_tokens": _int_range(1, 2**31 - 1),
    "max_input_chars": _positive_int,
    "timeout": _int_range(1, 65535),
    "seed_input": _choice("seed", "random_seed"),
}


def load_settings(
    cli: dict[str, Any], config_file: str | None, env: dict[str, str] | None = None, **base: Any
) -> Settings:
    """Merge the sources (CLI values of None mean "not given") into validated Settings."""
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = dict(base)
    #: where each value came from, as an error names it (defaults are never wrong)
    origin: dict[str, str] = {}
    sections: dict[str, Any] = {}
    config_file = cli.get("config") or config_file or env.get("V2PROXY_CONFIG")
    if config_file:
        file_values = _read_yaml(config_file)
        folder = Path(config_file).absolute().parent
        if (models := file_values.pop("models", None)) is not None:
            sections["models"] = _parse_models(models, config_file, folder)
        if (mindie := file_values.pop("mindie", None)) is not None:
            sections["mindie"] = _parse_mindie(mindie, config_file)
        for key, value in file_values.items():
            if key not in PARSERS:
                raise ConfigError(f"{config_file}: unknown setting '{key}'")
            values[key] = value
            origin[key] = f"{config_file}: {key}={{}}"
    for key in PARSERS:
        env_value = env.get(f"V2PROXY_{key.upper()}")
        if env_value is not None:
            values[key] = env_value
            origin[key] = f"V2PROXY_{key.upper()}={{}}"
    for key, value in cli.items():
        if key in PARSERS and value is not None:
            values[key] = value
            origin[key] = f"--{key.replace('_', '-')}={{}}"
    parsed: dict[str, Any] = {}
    for key, value in values.items():
        try:
            parsed[key] = PARSERS[key](value) if key in PARSERS else value
        except (TypeError, ValueError) as exc:
            shown = "***" if key in SECRET else str(value)
            where = origin.get(key, f"{key}={{}}").format(shown)
            raise ConfigError(f"{where}: invalid value for '{key}': {exc}") from None
    if parsed.get("workers", 1) > 1 and 0 in (parsed.get("http_port"), parsed.get("grpc_port")):
        raise ConfigError(
            "several workers need fixed ports: 'http_port'/'grpc_port' 0 is not allowed"
        )
    parsed["restricted"] = RestrictedPolicy(
        parsed.pop("restricted_api", DEFAULT_GROUPS), parsed.pop("restricted_api_header", None)
    )
    known = {f.name for f in fields(Settings)}
    return Settings(**{k: v for k, v in parsed.items() if k in known}, **sections)


def _yaml_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {str: "a string", list: "a list", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _mapping(value: Any, file: str, key: str, what: str, allowed: Any = None) -> dict[str, Any]:
    """``value`` as a mapping with string keys (all in ``allowed`` when given), else one line."""
    if not isinstance(value, dict):
        raise ConfigError(f"{file}: {key}: must be a mapping of {what}, not {_yaml_kind(value)}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if isinstance(k, bool) or not isinstance(k, str | int):
            raise ConfigError(f"{file}: {key}: {k!r} is not a valid name")
        name = str(k)
        if allowed is not None:  # setting keys, spelt with - or _ as at the top level
            name = name.replace("-", "_")
            if name not in allowed:
                known = ", ".join(sorted(allowed))
                raise ConfigError(f"{file}: {key}.{k}: unknown key (known: {known})")
        out[name] = v
    return out


def _parse_models(raw: Any, file: str, folder: Path) -> Mapping[str, ModelSettings]:
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


def _read_labels(raw: Any, file: str, key: str, folder: Path) -> OutputSettings:
    """One label per line, UTF-8; relative paths from the working directory, else ``folder``."""
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"{file}: {key}: must be the path of a label file")
    path = Path(raw).expanduser()
    where = ""
    if not path.is_absolute():
        here = Path.cwd() / path
        path = here if here.exists() else folder / path
        where = f" (looked in the working directory and in {folder})"
    try:
        data = path.read_bytes()
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            where = ""
        raise ConfigError(f"{file}: {key}: cannot read '{raw}': {exc.strerror}{where}") from None
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{file}: {key}: '{raw}' is not UTF-8 text"
            f" (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last label
    labels = tuple(line.removesuffix("\r") for line in lines)
    if not any(labels):
        raise ConfigError(f"{file}: {key}: '{raw}' holds no labels")
    return OutputSettings(labels, str(path.absolute()))


def _parse_mindie(raw: Any, file: str) -> MindieSettings:
    section = _mapping(raw, file, "mindie", "MindIE settings", allowed=set(MINDIE_PARSERS))
    if "model" not in section:
        raise ConfigError(f"{file}: mindie.model: missing (the v2 model that serves /infer)")
    values: dict[str, Any] = {}
    for key, value in section.items():
        try:
            values[key] = MINDIE_PARSERS[key](value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{file}: mindie.{key}: {exc} (got {value!r})") from None
    if "seed_input" in values and values.get("profile", "trtllm") != "trtllm":
        raise ConfigError(f"{file}: mindie.seed_input: only applies to profile 'trtllm'")
    return MindieSettings(**values)


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".splitlines()[0]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
