"""The webhook's decisions on real AdmissionReview v1 requests (tests/deploy/admission/): the JSON
patch applies (jsonpatch), the patched pod validates against the Pod schema of Kubernetes
1.29-1.33 (kubernetes-validate --strict), and a second pass over it changes nothing."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from tests.deploy.deploytools import schema_errors
from v2proxy.inject.patch import review
from v2proxy.inject.settings import AnnotationError, SidecarSettings, for_pod, load_defaults

HERE = Path(__file__).parent / "admission"
DEFAULTS = SidecarSettings(image="registry.example.com/v2proxy:0.1.0")


def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / name).read_text())


def answer(body: dict[str, Any], defaults: SidecarSettings = DEFAULTS) -> dict[str, Any]:
    out = review(body, defaults)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == body["request"]["uid"]
    return out["response"]


def patched(body: dict[str, Any], defaults: SidecarSettings = DEFAULTS) -> dict[str, Any]:
    """The pod after the webhook's patch (which must be there), checked against the schema."""
    resp = answer(body, defaults)
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    pod = jsonpatch.apply_patch(body["request"]["object"], ops)
    assert schema_errors(pod) == []
    # a second review of the result (reinvocation, or a pod re-created from it) does nothing
    again = copy.deepcopy(body)
    again["request"]["object"] = pod
    assert answer(again, defaults) == {"uid": body["request"]["uid"], "allowed": True}
    return pod


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [i for i in items if i["name"] == name]
    return found


def test_fixtures_are_valid_pods() -> None:
    for path in sorted(HERE.glob("*.json")):
        assert schema_errors(json.loads(path.read_text())["request"]["object"]) == [], path.name


def test_native_sidecar_and_new_shm_volume() -> None:
    body = load("review-triton.json")
    pod = patched(body)
    spec = pod["spec"]
    (sidecar,) = spec["initContainers"]
    assert sidecar["name"] == "v2proxy" and sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "registry.example.com/v2proxy:0.1.0"
    assert sidecar["args"] == [
        "serve",
        "--backend=http://127.0.0.1:8000",
        "--backend-encoding=auto",
        "--http-port=9000",
        "--grpc-port=9001",
        "--client-shm=local",
        "--backend-shm=auto",
        "--log-format=json",
        "--drain-timeout=30",
    ]
    assert [(p["name"], p["containerPort"]) for p in sidecar["ports"]] == [
        ("v2proxy-http", 9000),
        ("v2proxy-grpc", 9001),
    ]
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert sidecar["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert by_name(spec["volumes"], "v2proxy-shm")["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": "1Gi",
    }
    shm = {"name": "v2proxy-shm", "mountPath": "/dev/shm"}
    assert shm in sidecar["volumeMounts"]
    assert shm in by_name(spec["containers"], "triton")["volumeMounts"]
    assert len(spec["containers"]) == 1  # the app container untouched otherwise
    assert spec["terminationGracePeriodSeconds"] == 40  # 5 s pre-stop + 30 s drain + 5
    assert pod["metadata"]["annotations"]["v2proxy.io/injected"] == "native"
    assert pod["metadata"]["labels"] == {
        "app": "triton",
        "pod-template-hash": "7d9f8b6c5",
        "v2proxy.io/injected": "native",
    }


def test_classic_sidecar_for_old_clusters() -> None:
    body = load("review-triton.json")
    body["request"]["object"]["metadata"]["annotations"]["v2proxy.io/sidecar-mode"] = "classic"
    pod = patched(body)
    assert "initContainers" not in pod["spec"]
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["triton", "v2proxy"]
    assert "restartPolicy" not in pod["spec"]["containers"][1]
    assert pod["metadata"]["annotations"]["v2proxy.io/injected"] == "classic"


def test_server_default_mode_classic() -> None:
    pod = patched(load("review-triton.json"), load_defaults({"mode": "classic"}, DEFAULTS))
    assert [c["name"] for c in pod["spec"]["containers"]] == ["triton", "v2proxy"]
    # and the annotation still wins over the server's default
    body = load("review-triton.json")
    body["request"]["object"]["metadata"]["annotations"]["v2proxy.io/sidecar-mode"] = "native"
    pod = patched(body, load_defaults({"mode": "classic"}, DEFAULTS))
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["v2proxy"]


def test_existing_shm_reused_and_annotations_applied() -> None:
    pod = patched(load("review-mlserver-shm.json"))
    spec = pod["spec"]
    # dshm already mounted at /dev/shm by mlserver: shared with the sidecar, no new volume
    assert [v["name"] for v in spec["volumes"]] == [
        "dshm",
        "models",
        "v2proxy-tmp",
        "v2proxy-config",
    ]
    assert by_name(spec["volumes"], "v2proxy-config")["configMap"] == {"name": "mlserver-v2proxy"}
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-models", "v2proxy"]
    sidecar = spec["initContainers"][1]
    assert sidecar["args"] == [
        "serve",
        "--backend=http://127.0.0.1:8080",
        "--backend-encoding=json",
        "--http-port=9100",
        "--grpc-port=9101",
        "--client-shm=on",
        "--backend-shm=auto",
        "--log-format=json",
        "--drain-timeout=60",
        "--config=/etc/v2proxy/config.yaml",
        "--access-log",
        "--workers=2",
    ]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in sidecar["volumeMounts"]
    assert {"name": "v2proxy-config", "mountPath": "/etc/v2proxy", "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    # mlserver keeps its own mount; the log shipper had none and gets the shared one
    assert by_name(spec["containers"], "mlserver")["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "models", "mountPath": "/models"},
    ]
    assert by_name(spec["containers"], "log-shipper")["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"}
    ]
    assert spec["terminationGracePeriodSeconds"] == 70  # absent before: 5 + 60 + 5
    assert pod["metadata"]["labels"] == {"app": "mlserver", "v2proxy.io/injected": "native"}


def test_label_added_to_a_pod_without_labels() -> None:
    body = load("review-triton.json")
    del body["request"]["object"]["metadata"]["labels"]
    assert patched(body)["metadata"]["labels"] == {"v2proxy.io/injected": "native"}


def test_not_annotated_left_alone() -> None:
    body = load("review-plain.json")
    # "false" is not "true", and its other (invalid) annotation is not even read
    assert answer(body) == {"uid": body["request"]["uid"], "allowed": True}
    del body["request"]["object"]["metadata"]["annotations"]
    assert answer(body) == {"uid": body["request"]["uid"], "allowed": True}


def test_already_injected_left_alone() -> None:
    body = load("review-injected-classic.json")
    assert answer(body) == {"uid": body["request"]["uid"], "allowed": True}
    # the annotation alone also marks it
    body = load("review-triton.json")
    body["request"]["object"]["metadata"]["annotations"]["v2proxy.io/injected"] = "native"
    assert answer(body) == {"uid": body["request"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "backend",
            "tcp://triton:8000",
            "annotation v2proxy.io/backend: must be 'builtin', http://host:port",
        ),
        ("ports", "9000,9000", "annotation v2proxy.io/ports: the HTTP and gRPC ports must differ"),
        ("ports", "http", "annotation v2proxy.io/ports: expected an integer"),
        ("client-shm", "always", "annotation v2proxy.io/client-shm: must be one of off, local, on"),
        ("shm-size", "lots", "annotation v2proxy.io/shm-size: must be a Kubernetes quantity"),
        ("args", "--access-log", "annotation v2proxy.io/args: must be a JSON list of strings"),
        ("drain-timeout", "0", "annotation v2proxy.io/drain-timeout: must be an integer 1..3600"),
        ("backend-url", "http://x:1", "annotation v2proxy.io/backend-url: unknown (known: args,"),
    ],
)
def test_bad_annotation_refused_with_its_name(key: str, value: str, message: str) -> None:
    body = load("review-triton.json")
    body["request"]["object"]["metadata"]["annotations"][f"v2proxy.io/{key}"] = value
    resp = answer(body)
    assert resp["allowed"] is False and resp["status"]["code"] == 400
    assert resp["status"]["message"].startswith(message), resp["status"]["message"]
    assert "patch" not in resp


def test_port_taken_by_the_app_refused() -> None:
    body = load("review-triton.json")
    body["request"]["object"]["metadata"]["annotations"]["v2proxy.io/ports"] = "8001"
    resp = answer(body)
    assert resp["allowed"] is False
    assert resp["status"]["message"] == (
        "port 8001 is already used by container triton: choose v2proxy's ports with the"
        " annotation v2proxy.io/ports: HTTP,GRPC"
    )


def test_one_port_means_grpc_next_to_it() -> None:
    body = load("review-triton.json")
    body["request"]["object"]["metadata"]["annotations"]["v2proxy.io/ports"] = "9500"
    (sidecar,) = patched(body)["spec"]["initContainers"]
    assert [p["containerPort"] for p in sidecar["ports"]] == [9500, 9501]


def test_internal_error_allows_the_pod_unchanged() -> None:
    body = load("review-triton.json")
    del body["request"]["object"]["spec"]["containers"]  # nothing the API server would send
    resp = answer(body)
    assert resp["allowed"] is True and "patch" not in resp
    assert resp["warnings"] == ["v2proxy not injected: internal error (KeyError)"]


def test_other_operations_and_kinds_pass() -> None:
    body = load("review-triton.json")
    body["request"]["operation"] = "UPDATE"
    assert answer(body) == {"uid": body["request"]["uid"], "allowed": True}
    body = load("review-triton.json")
    body["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert answer(body) == {"uid": body["request"]["uid"], "allowed": True}


def test_not_an_admission_review() -> None:
    with pytest.raises(ValueError, match="not an AdmissionReview request"):
        review({"kind": "Pod"}, DEFAULTS)
    with pytest.raises(ValueError, match=r"has no request\.uid"):
        review({"kind": "AdmissionReview", "request": {}}, DEFAULTS)


def test_sidecar_config_defaults() -> None:
    s = load_defaults(
        {
            "image": "r/v2proxy:1",
            "backend": "grpc://127.0.0.1:8001",
            "httpPort": 9100,
            "grpcPort": 9101,
            "drainTimeout": 45,
            "preStopSleepSeconds": 0,
            "shmSizeLimit": "4Gi",
            "resources": {"limits": {"memory": "1Gi"}},
            "extraArgs": ["--metrics=off"],
        }
    )
    assert (s.backend, s.http_port, s.grpc_port, s.shm_size) == (
        "grpc://127.0.0.1:8001",
        9100,
        9101,
        "4Gi",
    )
    assert s.grace_period() == 50 and s.extra_args == ("--metrics=off",)
    with pytest.raises(AnnotationError, match="sidecar config httpport: unknown"):
        load_defaults({"httpport": 1})
    with pytest.raises(AnnotationError, match="sidecar config resources: must be a mapping"):
        load_defaults({"resources": {"limit": {}}})
    # annotations override what the file set
    assert for_pod(s, {"v2proxy.io/ports": "7000,7001"}).http_port == 7000


def test_the_webhooks_own_defaults_have_the_charts_resources() -> None:
    """``v2proxy inject`` without --sidecar-config injects a sidecar with requests and a memory
    limit: the chart's defaults for v2proxy's container (values.yaml ``proxy.resources``)."""
    from pathlib import Path

    import yaml

    from v2proxy.inject.settings import SidecarSettings

    values = yaml.safe_load((Path(__file__).parents[2] / "helm/v2proxy/values.yaml").read_text())
    assert dict(SidecarSettings().resources) == values["proxy"]["resources"]
