"""The Pod Security Standard ``restricted``: every pod the chart renders passes it (each shape of
test_chart and test_chart_tls, the helm test pod, the webhook's Deployment, a parent chart that
includes the sidecar), and the webhook keeps a compliant pod compliant: the injected sidecar
carries its own container-level settings (seccomp included), so it passes whether the pod sets
them at pod level or container by container.

:func:`violations` checks the rules of the ``baseline`` and ``restricted`` profiles as
https://kubernetes.io/docs/concepts/security/pod-security-standards/ lists them (what the
PodSecurity admission controller enforces), on a pod spec; it returns one line per violation."""

from __future__ import annotations

import base64
import copy
import json
import shutil
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.deploy.chartlib import render
from tests.deploy.deploytools import CHART, helm
from tests.deploy.test_chart import PARENT, SHAPES
from tests.deploy.test_chart_tls import MUTUAL_SIDECAR, TLS
from v2proxy.inject.patch import review
from v2proxy.inject.settings import SidecarSettings

ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SECCOMP_OK = {"RuntimeDefault", "Localhost"}
APPARMOR_OK = {"RuntimeDefault", "Localhost"}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *(spec.get("initContainers") or []),
        *(spec.get("containers") or []),
        *(spec.get("ephemeralContainers") or []),
    ]


def violations(spec: dict[str, Any]) -> list[str]:
    """What in pod spec ``spec`` the ``restricted`` profile (which includes ``baseline``)
    refuses; empty when it is admitted."""
    out: list[str] = []
    pod_sc: dict[str, Any] = spec.get("securityContext") or {}
    containers = _containers(spec)
    # baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"pod: {key}")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("pod: hostProcess")
    for s in pod_sc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"pod: sysctl {s.get('name')}")
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {v['name']}: type {sorted(kinds - ALLOWED_VOLUMES)}")
    for where, sc in [("pod", pod_sc)] + [
        (c["name"], c.get("securityContext") or {}) for c in containers
    ]:
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"{where}: seLinuxOptions {se}")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor is not None and apparmor not in APPARMOR_OK:
            out.append(f"{where}: appArmorProfile {apparmor}")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in SECCOMP_OK:
            out.append(f"{where}: seccompProfile {seccomp}")
        if sc.get("runAsNonRoot") is False:
            out.append(f"{where}: runAsNonRoot false")
    for c in containers:
        name = c["name"]
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{name}: hostProcess")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount {sc['procMount']}")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"{name}: hostPort {p['hostPort']}")
        # restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities do not drop ALL")
        added = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            out.append(f"{name}: capabilities add {sorted(added)}")
        if not (sc.get("runAsNonRoot") is True or pod_sc.get("runAsNonRoot") is True):
            out.append(f"{name}: runAsNonRoot is not true (pod or container)")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is None and (pod_sc.get("seccompProfile") or {}).get("type") not in SECCOMP_OK:
            out.append(f"{name}: no seccompProfile RuntimeDefault or Localhost (pod or container)")
    return out


def pod_specs(docs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    """Every pod (template) in the rendered manifests, by kind/name."""
    specs: dict[str, dict[str, Any]] = {}
    for d in docs:
        key = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Pod":
            specs[key] = d["spec"]
        elif d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            specs[key] = d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            specs[key] = d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return specs


# ------------------------------------------------------------------ the checker itself


def test_checker_refuses_what_restricted_refuses() -> None:
    ok = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "app",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                },
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    assert violations(ok) == []
    bad: list[tuple[str, Any]] = [
        ("/hostNetwork", True),
        ("/volumes/0", {"name": "host", "hostPath": {"path": "/"}}),
        ("/securityContext/runAsNonRoot", False),
        ("/securityContext/seccompProfile/type", "Unconfined"),
        ("/securityContext/runAsUser", 0),
        ("/containers/0/securityContext/privileged", True),
        ("/containers/0/securityContext/allowPrivilegeEscalation", True),
        ("/containers/0/securityContext/capabilities/add/0", "SYS_ADMIN"),
        ("/containers/0/securityContext/capabilities/drop", ["NET_RAW"]),
        ("/containers/0/ports", [{"containerPort": 80, "hostPort": 80}]),
    ]
    for path, value in bad:
        spec = jsonpatch.apply_patch(ok, [{"op": "add", "path": path, "value": value}])
        assert violations(spec), path
    for path in ("/securityContext/runAsNonRoot", "/securityContext/seccompProfile"):
        assert violations(jsonpatch.apply_patch(ok, [{"op": "remove", "path": path}])), path


# ------------------------------------------------------------------ the chart's pods

RENDERS: dict[str, tuple[str, ...]] = {
    **SHAPES,
    "tls": TLS,
    "tls-mutual-sidecar": MUTUAL_SIDECAR,
    "overridden-uid": (
        "--set=deployment.podSecurityContext.runAsUser=20000",
        "--set=injector.enabled=true",
        "--set=injector.podSecurityContext.runAsUser=20000",
    ),
}


@pytest.mark.parametrize("shape", sorted(RENDERS))
def test_chart_pods_are_restricted(shape: str) -> None:
    specs = pod_specs(render(*RENDERS[shape]))
    assert specs
    assert {k: violations(s) for k, s in specs.items()} == {k: [] for k in specs}
    for spec in specs.values():
        # the image's user (Dockerfile: 10001:10001) or what the values chose, never root
        assert spec["securityContext"]["runAsUser"] >= 10000
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in _containers(spec):
            assert c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]


def test_proxy_root_file_system_is_read_only_with_tmp_writable() -> None:
    """--workers makes its folders with tempfile.mkdtemp (under /tmp): an emptyDir there."""
    spec = pod_specs(render(*SHAPES["standalone-remote-grpc"]))["Deployment/rel-v2proxy"]
    (c,) = spec["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in vol


@pytest.fixture(scope="module")
def parent_chart(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("charts") / "model-server"
    shutil.copytree(PARENT, folder)
    shutil.copytree(CHART, folder / "charts" / "v2proxy")
    return str(folder)


@pytest.mark.parametrize("kube", ["1.33.0", "1.28.0"])
def test_parent_chart_with_the_sidecar_is_restricted(parent_chart: str, kube: str) -> None:
    """A parent chart whose pod is compliant stays so with the included sidecar."""
    helm()  # skipped without helm
    specs = pod_specs(render(f"--kube-version={kube}", chart=parent_chart))
    assert {k: violations(s) for k, s in specs.items()} == {k: [] for k in specs}


def test_values_override_the_contexts() -> None:
    spec = pod_specs(
        render(
            "--set=modelServer.enabled=true",
            "--set=deployment.podSecurityContext.fsGroup=3000",
            "--set=modelServer.securityContext.readOnlyRootFilesystem=true",
            "--set=proxy.securityContext.seccompProfile.type=Localhost",
            "--set=proxy.securityContext.seccompProfile.localhostProfile=v2proxy.json",
            "--kube-version=1.33.0",
        )
    )["Deployment/rel-v2proxy"]
    assert spec["securityContext"]["fsGroup"] == 3000
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["initContainers"][0]["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "v2proxy.json",
    }
    assert violations(spec) == []


# ------------------------------------------------------------------ the injected pod

HERE = Path(__file__).parent / "admission"
CONTAINER_LEVEL = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_LEVEL = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "fsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _app_pod(level: str) -> dict[str, Any]:
    """review-triton.json made compliant, with the seccomp and non-root settings at pod level
    or on each container only."""
    body = json.loads((HERE / "review-triton.json").read_text())
    spec = body["request"]["object"]["spec"]
    if level == "pod":
        spec["securityContext"] = copy.deepcopy(POD_LEVEL)
        sc = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    else:
        spec["securityContext"] = {}
        sc = copy.deepcopy(CONTAINER_LEVEL)
    for c in spec["containers"]:
        c["securityContext"] = sc
    assert violations(spec) == []
    return body


@pytest.mark.parametrize("mode", ["native", "classic"])
@pytest.mark.parametrize("level", ["pod", "container"])
def test_injection_keeps_a_restricted_pod_restricted(level: str, mode: str) -> None:
    body = _app_pod(level)
    before = copy.deepcopy(body["request"]["object"]["spec"]["securityContext"])
    resp = review(body, SidecarSettings(image="v2proxy:0.1.0", mode=mode))["response"]
    ops = json.loads(base64.b64decode(resp["patch"]))
    pod = jsonpatch.apply_patch(body["request"]["object"], ops)
    assert violations(pod["spec"]) == []
    # the pod's own context is the user's: the webhook leaves it alone
    assert pod["spec"]["securityContext"] == before
    assert not [op for op in ops if op["path"].startswith("/spec/securityContext")]
    sidecar = next(c for c in _containers(pod["spec"]) if c["name"] == "v2proxy")
    assert sidecar["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True


def test_injector_chart_passes_its_security_context_to_the_webhook() -> None:
    """proxy.securityContext reaches the sidecar config (the injected container is the chart's)."""
    docs = render(*SHAPES["injector-helm-certs"])
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("injector")
    ]
    config = yaml.safe_load(cm["data"]["sidecar.yaml"])
    assert config["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
