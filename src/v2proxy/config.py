"""Settings: parsed and validated once at start-up into frozen objects.

Precedence: command line > environment (``V2PROXY_<NAME>``) > YAML file (``--config``) >
defaults. A bad value stops the start with one clear line (:class:`ConfigError`). Nothing reads
configuration per request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import yaml

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
    event_loop: str = "uvloop"
    workers: int = 1
    log_level: str = "info"
    server_name: str = "v2proxy"
    models: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))


# key -> (parser, help); the same keys serve CLI options, env vars and YAML keys.
def _port(v: Any) -> int:
    n = _int(v)
    if not 0 <= n <= 65535:
        raise ValueError("must be a port number 0..65535")
    return n


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("must be an integer")
    return int(v)


def _positive_int(v: Any) -> int:
    n = _int(v)
    if n <= 0:
        raise ValueError("must be a positive integer")
    return n


def _positive_float(v: Any) -> float:
    x = float(v)
    if not x > 0:
        raise ValueError("must be a positive number")
    return x


def _choice(*options: str) -> Any:
    def parse(v: Any) -> str:
        s = str(v).lower()
        if s not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return s

    return parse


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
    "event_loop": _choice("uvloop", "asyncio"),
    "workers": _positive_int,
    "log_level": _choice("debug", "info", "warning", "error"),
}


def load_settings(
    cli: dict[str, Any], config_file: str | None, env: dict[str, str] | None = None, **base: Any
) -> Settings:
    """Merge the sources (CLI values of None mean "not given") into validated Settings."""
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = dict(base)
    models: dict[str, Any] = {}
    config_file = cli.get("config") or config_file or env.get("V2PROXY_CONFIG")
    if config_file:
        file_values = _read_yaml(config_file)
        models = file_values.pop("models", None) or {}
        if not isinstance(models, dict):
            raise ConfigError(f"{config_file}: 'models' must be a mapping of model names")
        for key, value in file_values.items():
            if key not in PARSERS:
                raise ConfigError(f"{config_file}: unknown setting '{key}'")
            values[key] = value
    for key in PARSERS:
        env_value = env.get(f"V2PROXY_{key.upper()}")
        if env_value is not None:
            values[key] = env_value
    for key, value in cli.items():
        if key in PARSERS and value is not None:
            values[key] = value
    parsed: dict[str, Any] = {}
    for key, value in values.items():
        try:
            parsed[key] = PARSERS[key](value) if key in PARSERS else value
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid value {value!r} for '{key}': {exc}") from None
    if parsed.get("workers", 1) > 1 and 0 in (parsed.get("http_port"), parsed.get("grpc_port")):
        raise ConfigError(
            "several workers need fixed ports: 'http_port'/'grpc_port' 0 is not allowed"
        )
    known = {f.name for f in fields(Settings)}
    return Settings(
        **{k: v for k, v in parsed.items() if k in known},
        models=MappingProxyType(models),
    )


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".splitlines()[0]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
