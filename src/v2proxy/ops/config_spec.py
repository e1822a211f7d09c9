"""The settings of ``v2proxy serve``, each declared once (:data:`SETTINGS`): its default, its
parser, its help text and its metavar. The defaults, the parsers, the CLI options and
docs/settings.md are all built from this table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from v2proxy.core.restricted import DEFAULT_GROUPS, GROUPS, parse_groups, parse_header
from v2proxy.ops.config_values import (
    BackendTarget,
    MiB,
    byte_size,
    choice,
    non_negative_float,
    non_negative_int,
    parse_backend,
    port,
    positive_float,
    positive_int,
    switch,
)
from v2proxy.ops.config_values import text as path_text

_BINARY = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def human_size(n: int) -> str:
    """``65536`` -> ``64 KiB``, ``2**31 - 1`` -> ``2 GiB - 1``, ``1000`` -> ``1000 bytes``."""
    for exact in (n, n + 1):
        for unit, name in _BINARY:
            if exact >= unit and exact % unit == 0:
                text = f"{exact // unit} {name}"
                return text if exact == n else f"{text} - 1"
    return f"{n} byte{'s' if n != 1 else ''}"


#: gRPC's largest message
GRPC_MAX_MESSAGE = 2**31 - 1
_GRPC_MAX = human_size(GRPC_MAX_MESSAGE)


@dataclass(frozen=True, slots=True)
class SettingSpec:
    """One setting: its key, default (parsed), parser (text or YAML value -> value, ValueError with
    the reason), help and metavar (``SIZE``: a byte size, ``SECONDS``: a duration, ``a|b``: a
    choice). ``shown``: what a None default means; ``serve_only``: not of ``reference-server``;
    ``secret``: never echoed in an error; ``bare``: the value of the option given alone."""

    name: str
    default: Any
    parser: Callable[[Any], Any]
    help: str
    metavar: str
    shown: str = ""
    serve_only: bool = False
    secret: bool = False
    bare: str | None = None

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return f"V2PROXY_{self.name.upper()}"


SETTINGS: tuple[SettingSpec, ...] = (
    # the backend: options of `serve` only
    SettingSpec(
        "backend",
        BackendTarget("builtin"),
        parse_backend,
        "the model server: 'builtin' (the reference models in-process), http://host:port or"
        " https://host:port (a v2 REST server), grpc://host:port or grpcs://host:port (a v2 gRPC"
        " server; grpcs: over TLS) or mindie://host:port or mindies://host:port (a MindIE"
        " server's native /infer, mindies: over HTTPS; served as the v2 model that mindie.model"
        " names, llm when unset)",
        "URL",
        serve_only=True,
    ),
    SettingSpec(
        "backend_ca",
        None,
        path_text,
        "PEM CA bundle the certificate of an https://, grpcs:// or mindies:// backend must chain"
        " to; its host name is always checked",
        "FILE",
        shown="the system's trust store",
        serve_only=True,
    ),
    SettingSpec(
        "backend_cert",
        None,
        path_text,
        "PEM client certificate presented to an https://, grpcs:// or mindies:// backend, with"
        " --backend-key",
        "FILE",
        shown="none",
        serve_only=True,
    ),
    SettingSpec(
        "backend_key",
        None,
        path_text,
        "PEM private key of --backend-cert, unencrypted",
        "FILE",
        shown="none",
        serve_only=True,
    ),
    SettingSpec(
        "backend_encoding",
        "auto",
        choice("auto", "json", "binary"),
        "how tensors are sent to a REST backend: json, binary, or auto (ask its /v2 extensions)",
        "auto|json|binary",
        serve_only=True,
    ),
    SettingSpec(
        "backend_timeout",
        60.0,
        positive_float,
        "seconds to wait on the backend per request, 504 beyond it; for a body streamed to the"
        " backend as it arrives, the longest wait on the backend (a client's slow upload is not"
        " counted)",
        "SECONDS",
        serve_only=True,
    ),
    SettingSpec(
        "backend_connect_timeout",
        5.0,
        positive_float,
        "seconds to open a connection to the backend, 503 beyond it",
        "SECONDS",
        serve_only=True,
    ),
    SettingSpec(
        "backend_connections",
        100,
        positive_int,
        "most connections open to a REST backend at once (to each of its endpoints)",
        "N",
        serve_only=True,
    ),
    SettingSpec(
        "backend_max_answer_size",
        1 * MiB,
        byte_size(),
        "largest answer read from the backend to a health, metadata, config, statistics,"
        " repository, trace, logging or shared-memory call, REST, gRPC or MindIE; a larger one"
        " is a 502 (inference answers are bound by --max-body-size, over gRPC by"
        " --grpc-max-message-size)",
        "SIZE",
        serve_only=True,
    ),
    SettingSpec(
        "backend_resolve_interval",
        30.0,
        non_negative_float,
        "seconds between two resolutions of the backend's host names (a headless Service's"
        " addresses: requests are spread over all of them); 0: resolved once, at start",
        "SECONDS",
        serve_only=True,
    ),
    SettingSpec(
        "backend_shm",
        "auto",
        choice("off", "system", "auto"),
        "stage large tensors in the backend's own shared memory: off, system (always) or auto"
        " (when the backend lists system_shared_memory and can open v2proxy's regions)",
        "off|system|auto",
        serve_only=True,
    ),
    SettingSpec(
        "backend_shm_threshold",
        64 * 1024,
        byte_size(),
        "inputs and fixed-size outputs of at least this size are staged in the backend's shared"
        " memory",
        "SIZE",
        serve_only=True,
    ),
    # the listeners and the rest: options of `serve` and `reference-server`
    SettingSpec("http_port", 9000, port, "HTTP port (REST and /metrics)", "PORT"),
    SettingSpec("grpc_port", 9001, port, "gRPC port", "PORT"),
    SettingSpec("host", "0.0.0.0", str, "address to listen on, both ports", "ADDRESS"),
    SettingSpec(
        "grpc_max_message_size",
        GRPC_MAX_MESSAGE,
        byte_size(1, GRPC_MAX_MESSAGE, f" ({_GRPC_MAX}: gRPC's largest message)"),
        f"largest gRPC message either way, frontend and backend; at most {_GRPC_MAX}, the most"
        " gRPC allows",
        "SIZE",
    ),
    SettingSpec(
        "max_input_size",
        64 * MiB,
        byte_size(),
        "largest JSON header, JSON-decoded input, raw body or decompressed body, like Triton's"
        " --http-max-input-size; also the largest body of generate, MindIE /infer and the"
        " OpenAI routes (413 beyond it, refused while it is read)",
        "SIZE",
    ),
    SettingSpec(
        "max_body_size",
        2048 * MiB - 1,
        byte_size(),
        "hard cap on any HTTP request body, 413 beyond it; binary tensors inside a framed body"
        " are bound only by this, as in Triton",
        "SIZE",
    ),
    SettingSpec(
        "max_tensors",
        1024,
        positive_int,
        "most inputs, and most requested outputs, one inference request may name (400, gRPC"
        " INVALID_ARGUMENT beyond it)",
        "N",
    ),
    SettingSpec(
        "max_chat_messages",
        1024,
        positive_int,
        "most messages one OpenAI chat request may hold (400 naming 'messages' beyond it)",
        "N",
    ),
    SettingSpec(
        "max_stops",
        4,
        positive_int,
        "most stop sequences one OpenAI request may give (400 naming 'stop' beyond it)",
        "N",
    ),
    SettingSpec(
        "max_stop_length",
        1024,
        positive_int,
        "longest stop sequence, in characters, an OpenAI request may give (400 naming 'stop'"
        " beyond it)",
        "N",
    ),
    SettingSpec(
        "max_concurrency",
        1024,
        non_negative_int,
        "most requests in progress at once per worker, REST and gRPC together (a stream counts"
        " as one while open); beyond it 503 with Retry-After, gRPC RESOURCE_EXHAUSTED, but"
        " health, metadata and /metrics are never refused; 0: no limit",
        "N",
    ),
    SettingSpec(
        "max_stream_in_flight",
        16,
        positive_int,
        "most requests of one gRPC ModelStreamInfer stream served at once; while that many are,"
        " no further message of the stream is read, so a client that sends without reading its"
        " answers is held back by HTTP/2 flow control",
        "N",
    ),
    SettingSpec(
        "max_health_watches",
        100,
        non_negative_int,
        "most grpc.health.v1 Health.Watch streams open at once per worker, RESOURCE_EXHAUSTED"
        " beyond it; all of them read one readiness state, asked of the backend once a second"
        " while any is open; 0: no limit",
        "N",
    ),
    SettingSpec(
        "tls_cert",
        None,
        path_text,
        "PEM certificate chain: serve HTTPS and gRPC over TLS on both ports, with --tls-key",
        "FILE",
        shown="no TLS",
    ),
    SettingSpec(
        "tls_key",
        None,
        path_text,
        "PEM private key of --tls-cert, unencrypted",
        "FILE",
        shown="none",
    ),
    SettingSpec(
        "tls_client_ca",
        None,
        path_text,
        "PEM CA bundle: require client certificates signed by one of these CAs on both ports"
        " (mutual TLS)",
        "FILE",
        shown="no client certificates asked",
    ),
    SettingSpec(
        "client_shm",
        "local",
        choice("off", "local", "on"),
        "who may register and use shared memory (register, status, unregister and every"
        " inference naming a region): off, local (peers on loopback or a unix socket, the pod's"
        " boundary) or on (anyone)",
        "off|local|on",
    ),
    SettingSpec(
        "max_shm_regions",
        256,
        positive_int,
        "most shared-memory regions registered at once (each holds one file descriptor; kept to"
        " a quarter of the open-file limit, which v2proxy raises to its hard limit at start);"
        " beyond it a registration gets 400",
        "N",
    ),
    SettingSpec(
        "restricted_api",
        DEFAULT_GROUPS,
        parse_groups,
        "comma-separated API groups refused unless the request carries --restricted-api-header,"
        f" or 'none'; groups: {', '.join(sorted(GROUPS))}",
        "GROUPS",
    ),
    SettingSpec(
        "restricted_api_header",
        None,
        parse_header,
        "requests carrying header KEY (any case) with exactly VALUE may use the restricted"
        " groups; prefer the variable V2PROXY_RESTRICTED_API_HEADER, as command lines are"
        " visible to other users",
        "KEY=VALUE",
        shown="unset, so the restricted groups are refused to everyone",
        secret=True,
    ),
    SettingSpec(
        "client_header_timeout",
        10.0,
        positive_float,
        "a client must send a request's whole head within this from its first byte, and a new"
        " connection its first request (408 and closed beyond it)",
        "SECONDS",
    ),
    SettingSpec(
        "client_idle_timeout",
        5.0,
        positive_float,
        "an idle keep-alive connection between requests is closed after this",
        "SECONDS",
    ),
    SettingSpec(
        "client_body_timeout",
        60.0,
        positive_float,
        "a request body that stops arriving for this long gets 408 and its connection is"
        " closed; also the longest a client may take to read an answer",
        "SECONDS",
    ),
    SettingSpec(
        "drain_timeout",
        30.0,
        positive_float,
        "on SIGTERM/SIGINT: stop accepting, turn readiness false, and let requests in flight"
        " (REST, gRPC, streams) finish for up to this long before closing",
        "SECONDS",
    ),
    SettingSpec(
        "event_loop", "uvloop", choice("uvloop", "asyncio"), "event loop", "uvloop|asyncio"
    ),
    SettingSpec(
        "workers",
        1,
        positive_int,
        "processes serving the same ports (SO_REUSEPORT), supervised by the parent",
        "N",
    ),
    SettingSpec(
        "log_level",
        "info",
        choice("debug", "info", "warning", "error"),
        "log level",
        "debug|info|warning|error",
    ),
    SettingSpec(
        "log_format",
        "text",
        choice("text", "json"),
        "text lines, or json: one JSON object per line with ts (RFC 3339, UTC), level, logger,"
        " pid, message and the request's fields",
        "text|json",
    ),
    SettingSpec(
        "access_log",
        False,
        switch,
        "one INFO line per request (logger v2proxy.access): method, path, status, duration,"
        " bytes in and out, request id; --access-log alone turns it on",
        "on|off",
        bare="on",
    ),
    SettingSpec(
        "reuse_large_buffers",
        True,
        switch,
        "glibc only: malloc keeps large blocks' memory for the next request instead of mapping"
        " and unmapping it per block (a 64 MiB message otherwise pays a page fault per 4 KiB of"
        " each copy); the memory is given back once no request has come for 5-10 s; off:"
        " glibc's own behaviour",
        "on|off",
        bare="on",
    ),
    SettingSpec(
        "metrics",
        True,
        switch,
        "Prometheus metrics on GET /metrics of the HTTP port; off: nothing is recorded and"
        " /metrics answers 404",
        "on|off",
    ),
)

#: ``--config FILE``: an option of ``serve``, and ``V2PROXY_CONFIG``, but no setting (no YAML key)
CONFIG_OPTION = SettingSpec(
    "config",
    None,
    path_text,
    "YAML file with the same keys (underscores: backend_timeout), plus per-model settings"
    " (models: NAME: outputs: OUTPUT: labels: FILE), the mindie: and the openai: sections",
    "FILE",
    shown="none",
    serve_only=True,
)

#: each setting's default, by name
DEFAULTS: Mapping[str, Any] = MappingProxyType({s.name: s.default for s in SETTINGS})

#: what ``reference-server`` starts from instead of the defaults (unparsed, as from a source);
#: it reads no environment, no file, and has no ``serve_only`` option
REFERENCE_SERVER: Mapping[str, Any] = MappingProxyType(
    {
        "http_port": 8000,  # Triton's ports, beside serve's 9000/9001
        "grpc_port": 8001,
        "backend": "builtin",
        "server_name": "v2proxy-reference",
        "restricted_api": "none",  # like Triton
    }
)


@dataclass(frozen=True, slots=True)
class OptionGroup:
    """A group of options in ``serve --help`` and docs/settings.md: a title, a line about it and
    its settings' names, in the order shown."""

    title: str
    about: str
    names: tuple[str, ...]


#: the groups, in order; each setting (and ``config``) is in exactly one, which
#: tests/unit/test_settings_doc.py checks: a new setting must be placed here
OPTION_GROUPS: tuple[OptionGroup, ...] = (
    OptionGroup(
        "listening",
        "where and how v2proxy serves its clients",
        ("http_port", "grpc_port", "host", "workers", "event_loop", "drain_timeout"),
    ),
    OptionGroup(
        "backend",
        "the model server behind v2proxy",
        (
            "backend",
            "backend_encoding",
            "backend_timeout",
            "backend_connect_timeout",
            "backend_connections",
            "backend_resolve_interval",
            "backend_max_answer_size",
        ),
    ),
    OptionGroup(
        "limits",
        "what one request, connection or process may take",
        (
            "max_body_size",
            "max_input_size",
            "grpc_max_message_size",
            "max_tensors",
            "max_concurrency",
            "max_stream_in_flight",
            "max_health_watches",
            "client_header_timeout",
            "client_idle_timeout",
            "client_body_timeout",
            "reuse_large_buffers",
        ),
    ),
    OptionGroup(
        "shared memory",
        "clients' regions, and staging in the backend's own",
        ("client_shm", "max_shm_regions", "backend_shm", "backend_shm_threshold"),
    ),
    OptionGroup(
        "security",
        "TLS on both sides and the restricted API groups",
        (
            "tls_cert",
            "tls_key",
            "tls_client_ca",
            "backend_ca",
            "backend_cert",
            "backend_key",
            "restricted_api",
            "restricted_api_header",
        ),
    ),
    OptionGroup(
        "observability",
        "logs and Prometheus metrics",
        ("log_level", "log_format", "access_log", "metrics"),
    ),
    OptionGroup(
        "configuration file and LLM routes",
        "the YAML file: the keys above, per-model labels (models:), and the MindIE /infer and"
        " OpenAI /v1 routes (the mindie: and openai: sections), and the limits of the OpenAI"
        " requests",
        ("config", "max_chat_messages", "max_stops", "max_stop_length"),
    ),
)


def grouped(specs: tuple[SettingSpec, ...]) -> list[tuple[OptionGroup, list[SettingSpec]]]:
    """``specs`` by group, in the groups' order (groups without any left out); a spec in no
    group comes last, under ``other``."""
    by_name = {spec.name: spec for spec in specs}
    out = [(g, [by_name[n] for n in g.names if n in by_name]) for g in OPTION_GROUPS]
    placed = {n for g in OPTION_GROUPS for n in g.names}
    out.append((OptionGroup("other", "", ()), [s for s in specs if s.name not in placed]))
    return [(g, members) for g, members in out if members]


def serve_options() -> tuple[SettingSpec, ...]:
    """The options of ``v2proxy serve`` in the order its help lists them: the backend's,
    ``--config``, then those it shares with ``reference-server``."""
    own = tuple(s for s in SETTINGS if s.serve_only)
    return (*own, CONFIG_OPTION, *(s for s in SETTINGS if not s.serve_only))


def reference_server_default(spec: SettingSpec) -> Any:
    """The default of ``spec`` under ``reference-server`` (parsed)."""
    if spec.name in REFERENCE_SERVER:
        return spec.parser(REFERENCE_SERVER[spec.name])
    return spec.default


#: :func:`show` without a value: the spec's default
_UNSET: Any = object()


def show(spec: SettingSpec, value: Any = _UNSET) -> str:
    """``value`` (by default the spec's default) as the help and the settings page write it."""
    if value is _UNSET:
        value = spec.default
    if value is None:
        return spec.shown or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, BackendTarget):
        return value.display
    if isinstance(value, frozenset):
        return ",".join(sorted(value)) or "none"
    if spec.metavar == "SIZE":
        return human_size(value)
    if spec.metavar == "SECONDS":
        return f"{value:g} s"
    return f"{value:g}" if isinstance(value, float) else str(value)
