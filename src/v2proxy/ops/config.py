"""Settings: parsed and validated once at start-up into frozen objects."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from v2proxy.core.restricted import RestrictedPolicy
from v2proxy.ops.config_sections import (
    ConfigError,
    MindieSettings,
    ModelSettings,
    OpenAISettings,
    parse_mindie,
    parse_models,
    parse_openai,
)
from v2proxy.ops.config_spec import DEFAULTS, SETTINGS
from v2proxy.ops.config_values import BackendTarget, parse_backend
from v2proxy.ops.tls import BackendTls, ListenerTls, TlsFileError
from v2proxy.ops.tls import check as check_tls

#: BackendTarget and parse_backend are re-exported from v2proxy.ops.config_values
__all__ = [
    "OTHER_VARIABLES",
    "PARSERS",
    "SECRET",
    "BackendTarget",
    "Settings",
    "load_settings",
    "parse_backend",
]


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of ``v2proxy serve`` (and of ``reference-server``)."""

    backend: BackendTarget = DEFAULTS["backend"]
    backend_encoding: str = DEFAULTS["backend_encoding"]
    http_port: int = DEFAULTS["http_port"]
    grpc_port: int = DEFAULTS["grpc_port"]
    host: str = DEFAULTS["host"]
    grpc_max_message_size: int = DEFAULTS["grpc_max_message_size"]
    max_input_size: int = DEFAULTS["max_input_size"]
    max_body_size: int = DEFAULTS["max_body_size"]
    max_tensors: int = DEFAULTS["max_tensors"]
    max_chat_messages: int = DEFAULTS["max_chat_messages"]
    max_stops: int = DEFAULTS["max_stops"]
    max_stop_length: int = DEFAULTS["max_stop_length"]
    max_concurrency: int = DEFAULTS["max_concurrency"]
    max_stream_in_flight: int = DEFAULTS["max_stream_in_flight"]
    max_health_watches: int = DEFAULTS["max_health_watches"]
    backend_timeout: float = DEFAULTS["backend_timeout"]
    backend_connect_timeout: float = DEFAULTS["backend_connect_timeout"]
    backend_connections: int = DEFAULTS["backend_connections"]
    backend_max_answer_size: int = DEFAULTS["backend_max_answer_size"]
    backend_resolve_interval: float = DEFAULTS["backend_resolve_interval"]
    client_header_timeout: float = DEFAULTS["client_header_timeout"]
    client_idle_timeout: float = DEFAULTS["client_idle_timeout"]
    client_body_timeout: float = DEFAULTS["client_body_timeout"]
    drain_timeout: float = DEFAULTS["drain_timeout"]
    event_loop: str = DEFAULTS["event_loop"]
    workers: int = DEFAULTS["workers"]
    log_level: str = DEFAULTS["log_level"]
    log_format: str = DEFAULTS["log_format"]
    access_log: bool = DEFAULTS["access_log"]
    metrics: bool = DEFAULTS["metrics"]
    reuse_large_buffers: bool = DEFAULTS["reuse_large_buffers"]
    server_name: str = "v2proxy"  # not a setting: reference-server's is v2proxy-reference
    client_shm: str = DEFAULTS["client_shm"]
    max_shm_regions: int = DEFAULTS["max_shm_regions"]
    backend_shm: str = DEFAULTS["backend_shm"]
    backend_shm_threshold: int = DEFAULTS["backend_shm_threshold"]
    #: --restricted-api (groups; default DEFAULTS["restricted_api"]) and --restricted-api-header
    restricted: RestrictedPolicy = field(
        default_factory=lambda: RestrictedPolicy(DEFAULTS["restricted_api"])
    )
    models: Mapping[str, ModelSettings] = field(default_factory=lambda: MappingProxyType({}))
    mindie: MindieSettings | None = None
    openai: OpenAISettings | None = None
    #: --tls-cert/--tls-key/--tls-client-ca (None: plain listeners); --backend-ca/-cert/-key
    tls: ListenerTls | None = None
    backend_tls: BackendTls = field(default_factory=BackendTls)


#: each setting's parser (text, or a YAML value -> value; ValueError says why not)
PARSERS: dict[str, Any] = {spec.name: spec.parser for spec in SETTINGS}
#: the settings whose values are never echoed in an error
SECRET = frozenset(spec.name for spec in SETTINGS if spec.secret)

#: ``V2PROXY_*`` variables that are not settings and are accepted: V2PROXY_CONFIG (--config),
#: V2PROXY_PURE_PYTHON (the compiled modules imported from source: v2proxy/_compiled.py), and
#: those of the project's own tools, which their servers inherit
OTHER_VARIABLES = frozenset(
    {
        "V2PROXY_CONFIG",
        "V2PROXY_PURE_PYTHON",
        "V2PROXY_PEERS_DIR",
        "V2PROXY_PEER_START_TIMEOUT",
        "V2PROXY_PEER_LOG_DIR",
        "V2PROXY_PEER_PARENT_PID",
        "V2PROXY_DEPLOY_TOOLS",
        "V2PROXY_BENCH_ARGS",
        "V2PROXY_BENCH_REFERENCE_ARGS",
        "V2PROXY_SOAK_TRACEMALLOC",
        "V2PROXY_SOAK_TRACEMALLOC_FRAMES",
        "V2PROXY_SOAK_TRACEMALLOC_EVERY",
    }
)


def _check_environment(env: Mapping[str, str]) -> None:
    """Refuse a ``V2PROXY_*`` variable that is neither a setting nor one of OTHER_VARIABLES."""
    settings = {f"V2PROXY_{key.upper()}" for key in PARSERS}
    for name in sorted(env):
        if name.startswith("V2PROXY_") and name not in settings and name not in OTHER_VARIABLES:
            close = difflib.get_close_matches(name, sorted(settings | {"V2PROXY_CONFIG"}), 1, 0.8)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"{name}: unknown environment variable ({hint}v2proxy reads V2PROXY_<OPTION> for"
                " each option of 'v2proxy serve --help', e.g. V2PROXY_HTTP_PORT, and"
                " V2PROXY_CONFIG)"
            )


def load_settings(
    cli: dict[str, Any], config_file: str | None, env: dict[str, str] | None = None, **base: Any
) -> Settings:
    """Merge the sources (CLI values of None mean "not given") into validated Settings."""
    env = dict(os.environ) if env is None else env
    _check_environment(env)
    values: dict[str, Any] = dict(base)
    #: where each value came from, as an error names it (defaults are never wrong)
    origin: dict[str, str] = {}
    sections: dict[str, Any] = {}
    config_file = cli.get("config") or config_file or env.get("V2PROXY_CONFIG")
    if config_file:
        file_values = _read_yaml(config_file)
        folder = Path(config_file).absolute().parent
        if (models := file_values.pop("models", None)) is not None:
            sections["models"] = parse_models(models, config_file, folder)
        if (mindie := file_values.pop("mindie", None)) is not None:
            sections["mindie"] = parse_mindie(mindie, config_file)
        if (openai := file_values.pop("openai", None)) is not None:
            sections["openai"] = parse_openai(openai, config_file, folder)
        for key, value in file_values.items():
            if key not in PARSERS:
                keys = [*PARSERS, "models", "mindie", "openai"]
                close = difflib.get_close_matches(key, keys, 1, 0.6)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"{config_file}: unknown setting '{key}'{hint}")
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
        parsed.pop("restricted_api", DEFAULTS["restricted_api"]),
        parsed.pop("restricted_api_header", DEFAULTS["restricted_api_header"]),
    )
    _tls(parsed, origin)
    known = {f.name for f in fields(Settings)}
    return Settings(**{k: v for k, v in parsed.items() if k in known}, **sections)


def _tls(parsed: dict[str, Any], origin: dict[str, str]) -> None:
    """Check the TLS files (read and parsed once here) into ``tls`` and ``backend_tls``."""
    target = parsed.get("backend")
    try:
        parsed["tls"], parsed["backend_tls"] = check_tls(
            parsed, isinstance(target, BackendTarget) and target.tls
        )
    except TlsFileError as exc:
        where = origin.get(exc.key, f"{exc.key}={{}}").format(parsed.get(exc.key))
        raise ConfigError(f"{where}: {exc}") from None


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML{_yaml_where(exc, text)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _yaml_where(exc: yaml.YAMLError, text: str) -> str:
    """Where and why ``text`` is not valid YAML: `` at line L, column C: problem (context that
    starts at line L, column C)``, lines and columns counted from 1 (yaml's marks from 0)."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML refuses: a text offset
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        return f" at line {line}, column {column}: character #x{exc.character:04x} is not allowed"
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return ": " + " ".join(str(exc).split())
    mark = exc.problem_mark
    out = f" at line {mark.line + 1}, column {mark.column + 1}: {exc.problem or 'invalid'}"
    if exc.context:
        out += f" ({exc.context}"
        start = exc.context_mark
        if start is not None and (start.line, start.column) != (mark.line, mark.column):
            out += f" that starts at line {start.line + 1}, column {start.column + 1}"
        out += ")"
    return " " + " ".join(out.split())  # one line
