"""An ``AdmissionReview`` (admission.k8s.io/v1) request in, its response out. Pure: no I/O."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from v2proxy.inject.settings import (
    INJECT,
    INJECTED,
    AnnotationError,
    SidecarSettings,
    for_pod,
)

NAME = "v2proxy"
SHM_VOLUME = "v2proxy-shm"
TMP_VOLUME = "v2proxy-tmp"
CONFIG_VOLUME = "v2proxy-config"
CONFIG_DIR = "/etc/v2proxy"
SHM_PATH = "/dev/shm"

Patch = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Decision:
    """``patch`` None: nothing to do (``reason`` says why); ``denied``: refuse with ``reason``."""

    patch: Patch | None
    reason: str
    denied: bool = False


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def container(s: SidecarSettings, shm_volume: str | None) -> dict[str, Any]:
    """The v2proxy container for settings ``s`` (mode decides ``restartPolicy``)."""
    args = [
        "serve",
        f"--backend={s.backend}",
        f"--backend-encoding={s.backend_encoding}",
        f"--http-port={s.http_port}",
        f"--grpc-port={s.grpc_port}",
        f"--client-shm={s.client_shm}",
        f"--backend-shm={s.backend_shm}",
        f"--log-format={s.log_format}",
        f"--drain-timeout={s.drain_timeout}",
    ]
    mounts: list[dict[str, Any]] = [{"name": TMP_VOLUME, "mountPath": "/tmp"}]
    if shm_volume:
        mounts.append({"name": shm_volume, "mountPath": SHM_PATH})
    if s.config_map:
        args.append(f"--config={CONFIG_DIR}/config.yaml")
        mounts.append({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True})
    args.extend(s.extra_args)

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": "v2proxy-http"},
            "periodSeconds": period,
            "timeoutSeconds": 2,
            "failureThreshold": failures,
        }

    c: dict[str, Any] = {
        "name": NAME,
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "args": args,
        "ports": [
            {"name": "v2proxy-http", "containerPort": s.http_port, "protocol": "TCP"},
            {"name": "v2proxy-grpc", "containerPort": s.grpc_port, "protocol": "TCP"},
        ],
        # the proxy's own loop: never the backend, which would restart the proxy for it
        "livenessProbe": probe("/v2/health/live", 10, 3),
        # the proxy answers ready only while the backend is ready (and not while draining)
        "readinessProbe": probe("/v2/health/ready", 5, 3),
        # live, not ready: a native sidecar must start before the backend it fronts
        "startupProbe": probe("/v2/health/live", 1, 30),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(s.pre_stop_sleep)]}}},
        "resources": dict(s.resources),
        # restricted on its own (settings.RESTRICTED_CONTEXT): the pod's context is not touched
        "securityContext": copy.deepcopy(dict(s.security_context)),
        "volumeMounts": mounts,
    }
    if s.mode == "native":
        c["restartPolicy"] = "Always"
    return c


def _shm_volume(spec: Mapping[str, Any]) -> str | None:
    """The volume an app container already mounts at /dev/shm, if any."""
    for c in spec.get("containers") or []:
        for m in c.get("volumeMounts") or []:
            if m.get("mountPath", "").rstrip("/") == SHM_PATH:
                return str(m["name"])
    return None


def _used_ports(spec: Mapping[str, Any]) -> dict[int, str]:
    used: dict[int, str] = {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for p in c.get("ports") or []:
            used.setdefault(int(p.get("containerPort", 0)), str(c.get("name")))
    return used


def _append(patch: Patch, spec: Mapping[str, Any], key: str, items: list[Any]) -> None:
    """Ops adding ``items`` at the end of ``/spec/<key>`` (created when absent)."""
    if not items:
        return
    if spec.get(key):
        patch.extend({"op": "add", "path": f"/spec/{key}/-", "value": i} for i in items)
    else:
        patch.append({"op": "add", "path": f"/spec/{key}", "value": items})


def pod_patch(pod: Mapping[str, Any], defaults: SidecarSettings) -> Decision:
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec: Mapping[str, Any] = pod.get("spec") or {}
    if str(annotations.get(INJECT, "")).strip().lower() != "true":
        return Decision(None, f"not annotated {INJECT}: true")
    names = {c.get("name") for c in [*(spec.get("initContainers") or []), *spec["containers"]]}
    if NAME in names or INJECTED in annotations:
        return Decision(None, "already injected")
    try:
        s = for_pod(defaults, annotations)
    except AnnotationError as exc:
        return Decision(None, str(exc), denied=True)
    used = _used_ports(spec)
    for p in (s.http_port, s.grpc_port):
        if p in used:
            return Decision(
                None,
                f"port {p} is already used by container {used[p]}: choose v2proxy's ports"
                " with the annotation v2proxy.io/ports: HTTP,GRPC",
                denied=True,
            )

    patch: Patch = []
    shm = _shm_volume(spec)
    volumes: list[dict[str, Any]] = []
    if shm is None:
        shm = SHM_VOLUME
        volumes.append({"name": shm, "emptyDir": {"medium": "Memory", "sizeLimit": s.shm_size}})
    volumes.append({"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}})
    if s.config_map:
        volumes.append({"name": CONFIG_VOLUME, "configMap": {"name": s.config_map}})
    _append(patch, spec, "volumes", volumes)
    for i, c in enumerate(spec["containers"]):
        mounts = c.get("volumeMounts") or []
        if any(m.get("mountPath", "").rstrip("/") == SHM_PATH for m in mounts):
            continue
        mount = {"name": shm, "mountPath": SHM_PATH}
        if mounts:
            patch.append(
                {"op": "add", "path": f"/spec/containers/{i}/volumeMounts/-", "value": mount}
            )
        else:
            patch.append(
                {"op": "add", "path": f"/spec/containers/{i}/volumeMounts", "value": [mount]}
            )
    _append(
        patch, spec, "initContainers" if s.mode == "native" else "containers", [container(s, shm)]
    )
    if int(spec.get("terminationGracePeriodSeconds", 30)) < s.grace_period():
        patch.append(
            {"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": s.grace_period()}
        )
    patch.append({"op": "add", "path": f"/metadata/annotations/{_esc(INJECTED)}", "value": s.mode})
    if meta.get("labels"):
        patch.append({"op": "add", "path": f"/metadata/labels/{_esc(INJECTED)}", "value": s.mode})
    else:
        patch.append({"op": "add", "path": "/metadata/labels", "value": {INJECTED: s.mode}})
    return Decision(patch, f"injected ({s.mode})")


def review(body: Mapping[str, Any], defaults: SidecarSettings) -> dict[str, Any]:
    """The AdmissionReview response to the AdmissionReview request ``body``;
    ValueError when it holds no ``request.uid`` (nobody to answer to)."""
    request = body.get("request")
    if body.get("kind") != "AdmissionReview" or not isinstance(request, Mapping):
        raise ValueError("not an AdmissionReview request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ValueError("the AdmissionReview has no request.uid")
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    try:
        decision = _decide(request, defaults)
    except Exception as exc:  # our own failure must never block a pod
        decision = Decision(None, f"v2proxy not injected: internal error ({type(exc).__name__})")
        response["warnings"] = [decision.reason]
    if decision.denied:
        response["allowed"] = False
        response["status"] = {"code": 400, "message": decision.reason}
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode()
    return {
        "apiVersion": body.get("apiVersion") or "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


def _decide(request: Mapping[str, Any], defaults: SidecarSettings) -> Decision:
    kind = request.get("kind") or {}
    if kind.get("kind") != "Pod" or request.get("operation") != "CREATE":
        return Decision(None, "not a pod creation")
    if request.get("subResource"):
        return Decision(None, "a subresource")
    pod = request.get("object")
    if not isinstance(pod, Mapping):
        raise TypeError("request.object is not a pod")
    return pod_patch(pod, defaults)
