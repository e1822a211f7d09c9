"""Settings: parsed and validated once at start-up into frozen objects.

Precedence: command line > environment (``V2PROXY_<NAME>``) > YAML file (``--config``) >
defaults. A bad value stops the start with one clear line (:class:`ConfigError`) naming the key;
an unknown key anywhere in the file is refused the same way. Nothing reads configuration per
request.
Every value is parsed by the same parser (:data:`PARSERS`) whichever its source: the command line
passes text, like the environment. Byte sizes (``max_input_size``, ``max_body_size``,
``grpc_max_message_size``, ``backend_shm_threshold``) take a unit: ``K``, ``M``, ``G``, ``T``
powers of 1000, ``Ki``, ``Mi``, ``Gi``, ``Ti`` powers of 1024, ``B`` optional (``64Mi``, ``1GB``;
:func:`v2proxy.config_values.byte_size`).
The environment holds only known ``V2PROXY_*`` names: a setting's ``V2PROXY_<KEY>``, or one of
:data:`OTHER_VARIABLES` (``V2PROXY_CONFIG``, and those of the project's own tests and benchmarks,
which the servers they start inherit); any other ``V2PROXY_*`` name, a misspelt setting most
likely, stops the start like an unknown key of the file, naming the closest setting.
The TLS files (``tls_*``, ``backend_ca/cert/key``) are read and checked here too
(:func:`v2proxy.tls.check`): a missing, unreadable or mismatched file is a ConfigError naming
the setting.

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

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import yaml

from v2proxy.config_sections import (
    ConfigError,
    MiB,
    MindieSettings,
    ModelSettings,
    parse_mindie,
    parse_models,
)
from v2proxy.config_values import (
    byte_size,
    choice,
    non_negative_int,
    port,
    positive_float,
    positive_int,
    switch,
)
from v2proxy.config_values import text as path_text
from v2proxy.restricted import DEFAULT_GROUPS, RestrictedPolicy, parse_groups, parse_header
from v2proxy.tls import BackendTls, ListenerTls, TlsFileError
from v2proxy.tls import check as check_tls


@dataclass(frozen=True, slots=True)
class BackendTarget:
    """Where the model server is: ``kind`` is builtin, http, https (``url`` the base URL), grpc
    or mindie (``url`` is then host:port); ``tls``: https://, grpcs:// (kind grpc) or mindies://
    (kind mindie: MindIE's server speaks HTTPS by default)."""

    kind: str
    url: str = ""
    tls: bool = False

    @property
    def display(self) -> str:
        """The backend as logs show it, always with its scheme: ``builtin``, the http(s) URL,
        ``grpc://``, ``grpcs://``, ``mindie://`` or ``mindies://`` host:port."""
        if self.kind in ("grpc", "mindie"):
            return f"{self.kind}{'s' if self.tls else ''}://{self.url}"
        return self.url or self.kind


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
    max_tensors: int = 1024
    max_concurrency: int = 1024
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
    max_shm_regions: int = 256
    backend_shm: str = "auto"
    backend_shm_threshold: int = 64 * 1024
    restricted: RestrictedPolicy = field(default_factory=RestrictedPolicy)
    models: Mapping[str, ModelSettings] = field(default_factory=lambda: MappingProxyType({}))
    mindie: MindieSettings | None = None
    #: --tls-cert/--tls-key/--tls-client-ca (None: plain listeners); --backend-ca/-cert/-key
    tls: ListenerTls | None = None
    backend_tls: BackendTls = field(default_factory=BackendTls)


#: the port an example names when a backend URL has none (the servers' usual ones)
_EXAMPLE_PORT = {"http": 8000, "https": 8000, "grpc": 8001, "grpcs": 8001, "mindie": 1025}
_EXAMPLE_PORT["mindies"] = _EXAMPLE_PORT["mindie"]


def parse_backend(v: Any) -> BackendTarget:
    text = str(v).strip()
    if text == "builtin":
        return BackendTarget("builtin")
    parts = urlsplit(text)
    if parts.scheme not in _EXAMPLE_PORT or not parts.hostname:
        raise ValueError(
            "must be 'builtin', http://host:port or https://host:port (a v2 REST server),"
            " grpc://host:port or grpcs://host:port (a v2 gRPC server) or mindie://host:port or"
            " mindies://host:port (a MindIE server's native /infer)"
        )
    address = parts.netloc.rpartition("@")[2]
    end = address.index("]") + 1 if address.startswith("[") and "]" in address else 0
    host, _, given = address[end:].partition(":")
    example = f"e.g. {parts.scheme}://{address[:end] or host}:{_EXAMPLE_PORT[parts.scheme]}"
    try:
        port_number = parts.port
    except ValueError:  # not a number, or beyond 65535
        port_number = -1
    if port_number is None:
        raise ValueError(f"has no port: give host:port, {example}")
    if not 0 < port_number <= 65535:
        raise ValueError(f"port '{given}' is not a port number 1..65535 ({example})")
    if parts.scheme in ("grpc", "grpcs", "mindie", "mindies"):
        secure = parts.scheme in ("grpcs", "mindies")
        kind = parts.scheme.removesuffix("s") if secure else parts.scheme
        return BackendTarget(kind, parts.netloc, secure)
    return BackendTarget(parts.scheme, text.rstrip("/"), parts.scheme == "https")


PARSERS: dict[str, Any] = {
    "backend": parse_backend,
    "backend_encoding": choice("auto", "json", "binary"),
    "http_port": port,
    "grpc_port": port,
    "host": str,
    "grpc_max_message_size": byte_size(1, 2**31 - 1, " (2 GiB - 1: gRPC's largest message)"),
    "max_input_size": byte_size(),
    "max_body_size": byte_size(),
    "max_tensors": positive_int,
    "max_concurrency": non_negative_int,
    "backend_timeout": positive_float,
    "backend_connect_timeout": positive_float,
    "backend_connections": positive_int,
    "client_header_timeout": positive_float,
    "client_idle_timeout": positive_float,
    "client_body_timeout": positive_float,
    "drain_timeout": positive_float,
    "event_loop": choice("uvloop", "asyncio"),
    "workers": positive_int,
    "log_level": choice("debug", "info", "warning", "error"),
    "log_format": choice("text", "json"),
    "access_log": switch,
    "metrics": switch,
    "client_shm": choice("off", "local", "on"),
    "max_shm_regions": positive_int,
    "backend_shm": choice("off", "system", "auto"),
    "backend_shm_threshold": byte_size(),
    "restricted_api": parse_groups,
    "restricted_api_header": parse_header,
    "tls_cert": path_text,
    "tls_key": path_text,
    "tls_client_ca": path_text,
    "backend_ca": path_text,
    "backend_cert": path_text,
    "backend_key": path_text,
}
SECRET = {"restricted_api_header"}  # never echoed in an error

#: ``V2PROXY_*`` variables that are not settings, which v2proxy accepts in its environment and
#: ignores, except V2PROXY_CONFIG (the --config file). The others belong to the project's own
#: tools, whose servers inherit them: tests/interop/peers (V2PROXY_PEER*), tests/deploy
#: (V2PROXY_DEPLOY_TOOLS), benchmarks (V2PROXY_BENCH_*, V2PROXY_SOAK_TRACEMALLOC*).
OTHER_VARIABLES = frozenset(
    {
        "V2PROXY_CONFIG",
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
