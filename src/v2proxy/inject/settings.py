"""What the injected sidecar looks like: defaults, and per-pod annotations over them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from v2proxy import __version__
from v2proxy.ops.config import parse_backend
from v2proxy.ops.config_values import choice, int_range, port

PREFIX = "v2proxy.io/"
INJECT = PREFIX + "inject"
INJECTED = PREFIX + "injected"  # set on the pods this webhook patched (value: the mode)
MODES = ("native", "classic")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


#: Pod Security Standard "restricted" on its own, so the sidecar passes a restricted namespace
#: whatever the pod sets (/tmp is an emptyDir under the read-only root)
RESTRICTED_CONTEXT: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


class AnnotationError(ValueError):
    """A ``v2proxy.io/`` annotation or sidecar setting is invalid; the message names it."""


def default_resources() -> dict[str, Any]:
    """The chart's defaults for v2proxy's container (values.yaml ``proxy.resources``)."""
    return {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}


@dataclass(frozen=True, slots=True)
class SidecarSettings:
    """The injected container's settings (defaults; annotations replace fields)."""

    #: this release's image, never a moving ``latest``
    image: str = f"v2proxy:{__version__}"
    image_pull_policy: str = "IfNotPresent"
    mode: str = "native"
    backend: str = "http://127.0.0.1:8000"
    backend_encoding: str = "auto"
    http_port: int = 9000
    grpc_port: int = 9001
    client_shm: str = "local"
    backend_shm: str = "auto"
    log_format: str = "json"
    drain_timeout: int = 30
    pre_stop_sleep: int = 5
    shm_size: str = "1Gi"
    config_map: str = ""
    extra_args: tuple[str, ...] = ()
    #: no CPU limit: CFS quotas throttle a proxy in bursts while the node has idle CPU
    resources: Mapping[str, Any] = field(default_factory=default_resources)
    security_context: Mapping[str, Any] = field(default_factory=lambda: dict(RESTRICTED_CONTEXT))

    def grace_period(self) -> int:
        """Seconds the pod needs to stop: the pre-stop pause, the drain, and a margin."""
        return self.pre_stop_sleep + self.drain_timeout + 5


def _backend(v: Any) -> str:
    text = str(v).strip()
    parse_backend(text)
    return text


def _ports(v: Any) -> tuple[int, int]:
    parts = [p.strip() for p in str(v).split(",")]
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ValueError("must be HTTP[,GRPC] port numbers, e.g. 9000,9001")
    nums = [port(p) for p in parts]
    if 0 in nums:
        raise ValueError("ports must be 1..65535")
    http = nums[0]
    grpc = nums[1] if len(nums) == 2 else http + 1
    if http == grpc or grpc > 65535:
        raise ValueError("the HTTP and gRPC ports must differ and be at most 65535")
    return http, grpc


def _quantity(v: Any) -> str:
    text = str(v).strip()
    if not _QUANTITY.match(text):
        raise ValueError("must be a Kubernetes quantity such as 512Mi or 2Gi")
    return text


def _name(v: Any) -> str:
    text = str(v).strip()
    if not _DNS_NAME.match(text):
        raise ValueError("must be a ConfigMap name (lower-case DNS subdomain)")
    return text


def _args(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            raise ValueError('must be a JSON list of strings, e.g. ["--access-log"]') from None
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise ValueError('must be a JSON list of strings, e.g. ["--access-log"]')
    return tuple(v)


def _text(v: Any) -> str:
    text = str(v).strip()
    if not text or any(c.isspace() for c in text):
        raise ValueError("must be a non-empty word")
    return text


def _pull_policy(v: Any) -> str:
    text = str(v).strip()
    if text not in ("Always", "IfNotPresent", "Never"):
        raise ValueError("must be one of Always, IfNotPresent, Never")
    return text


def _resources(v: Any) -> Mapping[str, Any]:
    if not isinstance(v, dict) or set(v) - {"requests", "limits"}:
        raise ValueError("must be a mapping with requests and/or limits")
    return v


def _security_context(v: Any) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise ValueError("must be a mapping (a container's securityContext)")
    return v


_Parser = Callable[[Any], Any]

#: annotation (after the prefix) -> (field of SidecarSettings, parser)
ANNOTATIONS: dict[str, tuple[str, _Parser]] = {
    "sidecar-mode": ("mode", choice(*MODES)),
    "backend": ("backend", _backend),
    "backend-encoding": ("backend_encoding", choice("auto", "json", "binary")),
    "ports": ("ports", _ports),
    "client-shm": ("client_shm", choice("off", "local", "on")),
    "backend-shm": ("backend_shm", choice("off", "system", "auto")),
    "shm-size": ("shm_size", _quantity),
    "log-format": ("log_format", choice("text", "json")),
    "drain-timeout": ("drain_timeout", int_range(1, 3600)),
    "config-map": ("config_map", _name),
    "args": ("extra_args", _args),
    "image": ("image", _text),
}

#: key of the --sidecar-config file -> (field, parser)
DEFAULT_KEYS: dict[str, tuple[str, _Parser]] = {
    "image": ("image", _text),
    "imagePullPolicy": ("image_pull_policy", _pull_policy),
    "mode": ("mode", choice(*MODES)),
    "backend": ("backend", _backend),
    "backendEncoding": ("backend_encoding", choice("auto", "json", "binary")),
    "httpPort": ("http_port", int_range(1, 65535)),
    "grpcPort": ("grpc_port", int_range(1, 65535)),
    "clientShm": ("client_shm", choice("off", "local", "on")),
    "backendShm": ("backend_shm", choice("off", "system", "auto")),
    "logFormat": ("log_format", choice("text", "json")),
    "drainTimeout": ("drain_timeout", int_range(1, 3600)),
    "preStopSleepSeconds": ("pre_stop_sleep", int_range(0, 600)),
    "shmSizeLimit": ("shm_size", _quantity),
    "extraArgs": ("extra_args", _args),
    "resources": ("resources", _resources),
    "securityContext": ("security_context", _security_context),
}
_FIXED = {INJECT, INJECTED}


def _apply(
    base: SidecarSettings,
    values: Mapping[str, Any],
    keys: Mapping[str, tuple[str, _Parser]],
    what: Callable[[str], str],
) -> SidecarSettings:
    changes: dict[str, Any] = {}
    for key, raw in values.items():
        if key not in keys:
            raise AnnotationError(f"{what(key)}: unknown (known: {', '.join(sorted(keys))})")
        name, parse = keys[key]
        try:
            value = parse(raw)
        except (TypeError, ValueError) as exc:
            raise AnnotationError(f"{what(key)}: {exc} (got {raw!r})") from None
        if name == "ports":
            changes["http_port"], changes["grpc_port"] = value
        else:
            changes[name] = value
    return replace(base, **changes)


def load_defaults(data: Mapping[str, Any], base: SidecarSettings | None = None) -> SidecarSettings:
    """The defaults from the sidecar-config mapping (unknown keys refused)."""
    return _apply(base or SidecarSettings(), data, DEFAULT_KEYS, lambda k: f"sidecar config {k}")


def for_pod(defaults: SidecarSettings, annotations: Mapping[str, str]) -> SidecarSettings:
    """``defaults`` with the pod's ``v2proxy.io/`` annotations applied."""
    ours = {
        k.removeprefix(PREFIX): v
        for k, v in annotations.items()
        if k.startswith(PREFIX) and k not in _FIXED
    }
    return _apply(defaults, ours, ANNOTATIONS, lambda k: f"annotation {PREFIX}{k}")
