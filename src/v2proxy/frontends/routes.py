"""The route table of the HTTP port: which paths the REST frontend serves, with which methods,
handlers, metrics ``operation`` label and ``--restricted-api`` group; ``openapi.yaml`` must
document exactly these routes (unit tests compare them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

#: what each template parameter matches
PARAMS = {
    "model": "[^/]+",
    "version": "[0-9]+",
    "name": "[^/]+",
    "kind": "system|cuda",
    "action": "load|unload",
    "path": ".*",
    "id": ".+",
}
_PART = re.compile(r"\{(\w+)\}|\[|\]|[^{}\[\]]+")


def compile_template(template: str) -> re.Pattern[str]:
    """The regular expression of a path template (``{param}``, ``[optional]``, literal text);
    ValueError when it is malformed."""
    out: list[str] = []
    depth = end = 0
    for part in _PART.finditer(template):
        if part.start() != end:
            break
        end = part.end()
        text, name = part.group(), part.group(1)
        if name is not None:
            if name not in PARAMS:
                raise ValueError(f"unknown parameter {{{name}}} in {template!r}")
            out.append(f"(?P<{name}>{PARAMS[name]})")
        elif text == "[":
            depth += 1
            out.append("(?:")
        elif text == "]":
            depth -= 1
            if depth < 0:
                break
            out.append(")?")
        else:
            out.append(re.escape(text))
    if end != len(template) or depth != 0:
        raise ValueError(f"malformed path template {template!r}")
    return re.compile("".join(out))


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """One row of the table: a path template, its handlers by method, the operation label and
    the API group."""

    template: str
    methods: Mapping[str, str]
    operation: str
    group: str | None
    #: the group is checked by the handler, not by the envelope as it admits the request
    deferred: bool = False
    #: the ``frontend`` label: ``rest`` or ``openai``
    frontend: str = "rest"
    #: the API whose shape its error answers take: ``v2``, ``mindie`` or ``openai``
    errors: str = "v2"
    pattern: re.Pattern[str] = field(init=False, repr=False)
    allow: bytes = field(init=False, repr=False)
    #: the group the envelope checks before the handler runs (None: none, or deferred)
    check_first: str | None = field(init=False, repr=False)
    names_model: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", compile_template(self.template))
        object.__setattr__(self, "allow", ", ".join(self.methods).encode())
        object.__setattr__(self, "check_first", None if self.deferred else self.group)
        object.__setattr__(self, "names_model", "model" in self.pattern.groupindex)


_M = "/v2/models/{model}[/versions/{version}]"
_SHM = "/v2/{kind}sharedmemory[/region/{name}]"
_GET_POST = ("GET", "POST")
_OA = "openai"

#: MindIE's native API validates the body before checking its group
MINDIE = Route(
    "/infer", {"POST": "mindie_infer"}, "mindie", "inference", deferred=True, errors="mindie"
)

#: in match order
ROUTES: tuple[Route, ...] = (
    Route(_M + "/infer", {"POST": "infer"}, "infer", "inference"),  # the hot one first
    Route(_M + "/generate", {"POST": "generate"}, "generate", "inference"),
    Route(_M + "/generate_stream", {"POST": "generate_stream"}, "generate", "inference"),
    Route("/v2/health/live", {"GET": "live"}, "health", "health"),
    Route("/v2/health/ready", {"GET": "ready"}, "health", "health"),
    Route("/v2[/]", {"GET": "server_metadata"}, "metadata", "metadata"),
    Route(_M + "/ready", {"GET": "model_ready"}, "health", "health"),
    Route(_M + "/config", {"GET": "model_config"}, "metadata", "model-config"),
    # before the model metadata: GET /v2/models/stats is every model's statistics
    Route(
        "/v2/models[/{model}[/versions/{version}]]/stats",
        {"GET": "statistics"},
        "side",
        "statistics",
    ),
    Route("/v2/repository/index", {"POST": "repository_index"}, "side", "model-repository"),
    Route(
        "/v2/repository/models/{model}/{action}",
        {"POST": "repository_load"},
        "side",
        "model-repository",
    ),
    Route(
        "/v2[/models/{model}]/trace/setting",
        dict.fromkeys(_GET_POST, "trace_settings"),
        "side",
        "trace",
    ),
    Route("/v2/logging", dict.fromkeys(_GET_POST, "log_settings"), "side", "logging"),
    Route(_M, {"GET": "model_metadata"}, "metadata", "metadata"),
    Route(_SHM + "/status", {"GET": "shm_status"}, "side", "shared-memory"),
    Route(_SHM + "/register", {"POST": "shm_register"}, "side", "shared-memory"),
    Route(_SHM + "/unregister", {"POST": "shm_unregister"}, "side", "shared-memory"),
    MINDIE,
    Route("/v1/models", {"GET": "openai_models"}, "metadata", "metadata", frontend=_OA, errors=_OA),
    Route(
        "/v1/models/{id}", {"GET": "openai_model"}, "metadata", "metadata", frontend=_OA, errors=_OA
    ),
    Route(
        "/v1/completions",
        {"POST": "openai_completions"},
        "openai",
        "inference",
        frontend=_OA,
        errors=_OA,
    ),
    Route(
        "/v1/chat/completions",
        {"POST": "openai_chat"},
        "openai",
        "inference",
        frontend=_OA,
        errors=_OA,
    ),
    Route("/openapi.json", {"GET": "openapi_document"}, "metadata", None),
)

#: ``GET /metrics``: answered before the table is consulted, never recorded or restricted
METRICS = Route("/metrics", {"GET": "scrape", "HEAD": "scrape"}, "", None)
#: a path no row matches, any method: passed through; its group is decided per request
PASSTHROUGH = Route("/{path}", {}, "passthrough", None, deferred=True)
