"""The Helm chart helm/v2proxy: `helm lint`, and `helm template` of each shape and of the values'
main combinations (the standalone tier at scale among them: its own checks in
test_chart_scale.py), every manifest valid for Kubernetes 1.29-1.33 (kubernetes-validate --strict),
plus what each shape must contain: the sidecar native or classic, the shared /dev/shm, probes,
grace period, monitors only with the Prometheus Operator's API, the webhook and its
certificates, the dashboard; the rendered arguments and config file (mindie: and openai:
sections, chat templates beside it) are accepted by v2proxy itself, and the webhook injects the
same container as the chart renders."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from cryptography import x509

from tests.deploy.chartlib import (
    NS,
    assert_valid,
    by_name,
    kinds,
    one,
    pod_spec,
    refusal,
    render,
    serve_args,
)
from tests.deploy.deploytools import (
    CHART,
    ROOT,
    helm,
    run,
)
from v2proxy.cli import parser
from v2proxy.inject.patch import review
from v2proxy.inject.settings import load_defaults
from v2proxy.ops.config import load_settings

PARENT = Path(__file__).parent / "charts" / "model-server"

# ------------------------------------------------------------------ lint and the matrix

SHAPES: dict[str, tuple[str, ...]] = {
    "standalone": (),
    "standalone-remote-grpc": (
        "--set=proxy.backend=grpc://triton.models.svc:8001",
        "--set=proxy.logFormat=text",
        "--set=proxy.workers=2",
        "--set=proxy.accessLog=true",
        "--set=proxy.extraArgs={--max-input-size=134217728}",
        "--set=service.type=LoadBalancer",
    ),
    "sidecar-native": (
        "--set=modelServer.enabled=true",
        "--set=proxy.backend=http://127.0.0.1:8000",
        "--kube-version=1.33.0",
    ),
    "sidecar-auto-old-cluster": (
        "--set=modelServer.enabled=true",
        "--set=proxy.backend=http://127.0.0.1:8000",
        "--kube-version=1.28.0",
    ),
    "sidecar-classic-forced": (
        "--set=modelServer.enabled=true",
        "--set=sidecar.mode=classic",
        "--set=proxy.backend=http://127.0.0.1:8000",
    ),
    "sidecar-no-shm": (
        "--set=modelServer.enabled=true",
        "--set=sharedMemory.enabled=false",
        "--set=proxy.clientShm=off",
        "--set=proxy.backendShm=off",
    ),
    "mindie-backend": (
        "--set=modelServer.enabled=true",
        "--set=proxy.backend=mindie://127.0.0.1:1025",
        "--set=proxy.mindie.model=mindie",
    ),
    "mindie": (
        "--set=proxy.backend=grpc://127.0.0.1:8001",
        "--set=proxy.mindie.model=ensemble",
        "--set=proxy.mindie.profile=trtllm",
        "--set=proxy.mindie.max_new_tokens=256",
        "--set=modelServer.enabled=true",
    ),
    # the chart's example of the OpenAI routes: proxy.openai (no mindie) and a chat template
    "openai": (f"--values={CHART / 'examples' / 'openai.yaml'}",),
    "monitoring-with-operator": (
        "--set=monitoring.podMonitor.enabled=true",
        "--set=monitoring.serviceMonitor.enabled=true",
        "--api-versions=monitoring.coreos.com/v1",
    ),
    "monitoring-without-operator": (
        "--set=monitoring.podMonitor.enabled=true",
        "--set=monitoring.serviceMonitor.enabled=true",
    ),
    "injector-helm-certs": ("--set=injector.enabled=true", "--set=deployment.enabled=false"),
    "injector-old-cluster": ("--set=injector.enabled=true", "--kube-version=1.28.0"),
    "injector-with-proxy-and-monitors": (
        "--set=injector.enabled=true",
        "--set=monitoring.podMonitor.enabled=true",
        "--set=monitoring.serviceMonitor.enabled=true",
        "--api-versions=monitoring.coreos.com/v1",
    ),
    "injector-cert-manager": (
        "--set=injector.enabled=true",
        "--set=injector.certificates.source=cert-manager",
        "--api-versions=cert-manager.io/v1",
    ),
    "injector-network-policy": (
        "--set=injector.enabled=true",
        "--set=deployment.enabled=false",
        "--set=injector.networkPolicy.enabled=true",
    ),
    # the chart's example of a standalone tier: HPA, PDB, topology spread, NetworkPolicy
    # (test_chart_scale.py)
    "standalone-at-scale": (f"--values={CHART / 'examples' / 'standalone-at-scale.yaml'}",),
}


def test_helm_lint() -> None:
    out = run(helm(), "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rendered_manifests_validate(shape: str) -> None:
    # helm lint cannot declare the cluster's APIs (--api-versions): cert-manager is linted by
    # rendering only (without its API the chart refuses to render, tested below)
    if "--api-versions=cert-manager.io/v1" not in SHAPES[shape]:
        lint_args = [a for a in SHAPES[shape] if not a.startswith("--api-versions")]
        run(helm(), "lint", "--strict", str(CHART), *lint_args)
    assert_valid(render(*SHAPES[shape]))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("proxy.backend=tcp://triton:8000", "at '/proxy/backend': 'tcp://triton:8000' does not"),
        ("sidecar.mode=sometimes", "at '/sidecar/mode': value must be one of"),
        ("sharedMemory.sizeLimit=lots", "at '/sharedMemory/sizeLimit': 'lots' does not match"),
        ("proxy.clientShm=maybe", "at '/proxy/clientShm': value must be one of"),
        ("proxy.mindie.profile=vllm", "at '/proxy/mindie': properties 'model' required"),
        (
            "proxy.mindie.model=m,proxy.mindie.profile=vllm,proxy.mindie.seed_input=seed",
            "at '/proxy/mindie/profile': value must be 'trtllm'",
        ),
        (
            "proxy.openai.models.llama.profile=tgi",
            "at '/proxy/openai/models/llama/profile': value must be one of",
        ),
        (
            "proxy.openai.models.llama.temperature=1",
            "at '/proxy/openai/models/llama': additional properties 'temperature' not allowed",
        ),
        (
            "proxy.openai.models.llama.profile=vllm,proxy.openai.models.llama.seed_input=seed",
            "at '/proxy/openai/models/llama/profile': value must be 'trtllm'",
        ),
        (
            "proxy.openai.models.llama.max_tokens=0",
            "at '/proxy/openai/models/llama/max_tokens': minimum: got 0, want 1",
        ),
        ("proxy.openai.llama.model=ensemble", "at '/proxy/openai': additional properties 'llama'"),
        (
            "proxy.chatTemplates.chat/ml=x",
            "at '/proxy/chatTemplates': additional properties 'chat/ml' not allowed",
        ),
        ("proxy.chatTemplates.\\.\\.x=x", "at '/proxy/chatTemplates': additional properties '..x'"),
        (
            "proxy.chatTemplates.config\\.yaml=x",
            "at '/proxy/chatTemplates/config.yaml': 'not' failed",
        ),
        ("injector.failurePolicy=Retry", "at '/injector/failurePolicy': value must be one of"),
        ("replicas=2", "additional properties 'replicas' not allowed"),
    ],
)
def test_values_schema_refuses(setting: str, message: str) -> None:
    stderr = refusal(f"--set={setting}")
    assert message in stderr, stderr


def test_values_file_is_the_schema_default() -> None:
    """values.yaml holds every key the schema knows at the top level (nothing undocumented)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) - {"global"} == set(values)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert values["image"]["tag"] == chart["appVersion"]


# ------------------------------------------------------------------ the shapes


def test_standalone() -> None:
    docs = render()
    assert kinds(docs) == [
        ("ConfigMap", "rel-v2proxy-dashboard"),
        ("Deployment", "rel-v2proxy"),
        ("Pod", "rel-v2proxy-test-infer"),
        ("Service", "rel-v2proxy"),
    ]
    spec = pod_spec(docs)
    assert "initContainers" not in spec
    (c,) = spec["containers"]
    assert c["name"] == "v2proxy" and "restartPolicy" not in c
    assert serve_args(c)["backend"] == "builtin"
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "v2proxy-http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "v2proxy-http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "v2proxy-http"}
    assert c["securityContext"]["runAsNonRoot"] is True
    # a proxy alone shares no memory: no /dev/shm volume
    assert [v["name"] for v in spec["volumes"]] == ["v2proxy-tmp"]
    assert spec["terminationGracePeriodSeconds"] == 5 + 30 + 5
    svc = one(docs, "Service")
    names = {p["name"] for p in c["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names
    assert svc["spec"]["selector"].items() <= spec_labels(docs).items()


def spec_labels(docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    labels: dict[str, str] = one(docs, "Deployment", "rel-v2proxy")["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


def test_settings_become_arguments_v2proxy_accepts() -> None:
    (c,) = pod_spec(render(*SHAPES["standalone-remote-grpc"]))["containers"]
    args = serve_args(c)
    settings = load_settings(args, None, env={})
    assert settings.backend.kind == "grpc" and settings.backend.url == "triton.models.svc:8001"
    assert (settings.log_format, settings.workers, settings.access_log) == ("text", 2, True)
    assert settings.max_input_size == 134217728 and settings.drain_timeout == 30


def test_sidecar_native() -> None:
    docs = render(*SHAPES["sidecar-native"])
    spec = pod_spec(docs)
    (side,) = spec["initContainers"]
    assert side["name"] == "v2proxy" and side["restartPolicy"] == "Always"
    (server,) = spec["containers"]
    assert server["name"] == "model-server"
    shm = {"name": "v2proxy-shm", "mountPath": "/dev/shm"}
    assert shm in server["volumeMounts"] and shm in side["volumeMounts"]
    assert by_name(spec["volumes"], "v2proxy-shm")["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": "1Gi",
    }
    assert load_settings(serve_args(side), None, env={}).backend.url == "http://127.0.0.1:8000"


@pytest.mark.parametrize("shape", ["sidecar-auto-old-cluster", "sidecar-classic-forced"])
def test_sidecar_classic(shape: str) -> None:
    spec = pod_spec(render(*SHAPES[shape]))
    assert "initContainers" not in spec
    assert [c["name"] for c in spec["containers"]] == ["model-server", "v2proxy"]
    assert "restartPolicy" not in spec["containers"][1]
    assert {"name": "v2proxy-shm", "mountPath": "/dev/shm"} in spec["containers"][1]["volumeMounts"]


def test_sidecar_without_shared_memory() -> None:
    spec = pod_spec(render(*SHAPES["sidecar-no-shm"]))
    assert "volumeMounts" not in spec["containers"][0]
    assert [v["name"] for v in spec["volumes"]] == ["v2proxy-tmp"]
    args = serve_args(spec["initContainers"][0])
    assert (args["client_shm"], args["backend_shm"]) == ("off", "off")


def test_mindie_config_file(tmp_path: Path) -> None:
    docs = render(*SHAPES["mindie"])
    cm = one(docs, "ConfigMap", "rel-v2proxy-config")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    spec = pod_spec(docs)
    side = spec["initContainers"][0]
    args = serve_args(side)
    assert args["config"] == "/etc/v2proxy/config.yaml"
    args["config"] = str(tmp_path / "config.yaml")  # where the ConfigMap would be mounted
    settings = load_settings(args, None, env={})
    assert settings.mindie is not None
    assert (settings.mindie.model, settings.mindie.profile, settings.mindie.max_new_tokens) == (
        "ensemble",
        "trtllm",
        256,
    )
    assert by_name(spec["volumes"], "v2proxy-config")["configMap"] == {
        "name": cm["metadata"]["name"]
    }
    assert {"name": "v2proxy-config", "mountPath": "/etc/v2proxy", "readOnly": True} in side[
        "volumeMounts"
    ]
    # a change of the file rolls the pods
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    other = one(render(*SHAPES["mindie"], "--set=proxy.mindie.max_new_tokens=64"), "Deployment")
    assert (
        annotations["checksum/config"]
        != (other["spec"]["template"]["metadata"]["annotations"]["checksum/config"])
    )


def test_openai_config_file(tmp_path: Path) -> None:
    """proxy.openai alone (no mindie) renders the config file, its ConfigMap, volume, mount and
    --config; the chat template is one more file beside config.yaml, where v2proxy finds the
    relative chat_template and compiles it."""
    docs = render(*SHAPES["openai"])
    cm = one(docs, "ConfigMap", "rel-v2proxy-config")
    example = yaml.safe_load((CHART / "examples" / "openai.yaml").read_text())["proxy"]
    assert set(cm["data"]) == {"config.yaml", "chatml.jinja"}
    assert cm["data"]["chatml.jinja"] == example["chatTemplates"]["chatml.jinja"]  # to the byte
    for name, text in cm["data"].items():  # laid out as the mount at /etc/v2proxy
        (tmp_path / name).write_text(text)
    assert "mindie" not in yaml.safe_load(cm["data"]["config.yaml"])
    settings = load_settings({}, str(tmp_path / "config.yaml"), env={})
    assert settings.mindie is None and settings.openai is not None
    assert [
        (m.id, m.model, m.profile, m.max_tokens, m.timeout) for m in settings.openai.models
    ] == [
        ("llama", "ensemble", "trtllm", 256, 600),
        ("llama-plain", "ensemble", "trtllm", 16, 120),
    ]
    llama, plain = settings.openai.models
    assert llama.template.origin == str(tmp_path / "chatml.jinja")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert llama.template.render(messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert plain.template.origin == "the default template"
    spec = pod_spec(docs)
    side = spec["initContainers"][0]
    assert serve_args(side)["config"] == "/etc/v2proxy/config.yaml"
    assert by_name(spec["volumes"], "v2proxy-config")["configMap"] == {
        "name": cm["metadata"]["name"]
    }
    assert {"name": "v2proxy-config", "mountPath": "/etc/v2proxy", "readOnly": True} in side[
        "volumeMounts"
    ]
    # a change of a template, not of config.yaml, rolls the pods too
    checksum = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    other = one(
        render(
            *SHAPES["openai"],
            '--set-json=proxy.chatTemplates={"chatml.jinja": "{{ messages[0].content }}"}',
        ),
        "Deployment",
    )["spec"]["template"]["metadata"]["annotations"]
    assert checksum["checksum/config"] != other["checksum/config"]


def test_openai_chat_template_from_the_image() -> None:
    """An absolute chat_template is a file of the image: no chatTemplates needed."""
    docs = render(
        "--set=proxy.openai.models.llama.chat_template=/opt/templates/llama.json",
        "--set=proxy.openai.models.llama.profile=vllm",
    )
    cm = one(docs, "ConfigMap", "rel-v2proxy-config")
    assert set(cm["data"]) == {"config.yaml"}
    assert yaml.safe_load(cm["data"]["config.yaml"]) == {
        "openai": {
            "models": {"llama": {"chat_template": "/opt/templates/llama.json", "profile": "vllm"}}
        }
    }
    assert serve_args(pod_spec(docs)["containers"][0])["config"] == "/etc/v2proxy/config.yaml"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ("--set=proxy.chatTemplates.chatml\\.jinja=x",),
            "proxy.chatTemplates (chatml.jinja) needs proxy.openai",
        ),
        (
            (
                "--set=proxy.mindie.model=ensemble",
                "--set=proxy.chatTemplates.chatml\\.jinja=x",
            ),
            "proxy.chatTemplates (chatml.jinja) needs proxy.openai",
        ),
        (
            (
                "--set=proxy.openai.models.llama.chat_template=chatml.jinja",
                "--set=proxy.chatTemplates.chat\\.jinja=x",
            ),
            "proxy.openai.models.llama.chat_template: 'chatml.jinja' is not a key of"
            " proxy.chatTemplates (chat.jinja)",
        ),
        (
            ("--set=proxy.openai.models.llama.chat_template=models/llama.jinja",),
            "proxy.openai.models.llama.chat_template: 'models/llama.jinja' is not a key of"
            " proxy.chatTemplates (none)",
        ),
        (
            ('--set-json=proxy.openai={"models": {}}',),
            "at '/proxy/openai/models': minProperties: got 0, want 1",
        ),
    ],
)
def test_openai_values_refused(settings: tuple[str, ...], message: str) -> None:
    """What v2proxy would refuse at start-up (or never read) stops the install instead."""
    stderr = refusal(*settings)
    assert message in stderr, stderr


def test_monitors_only_with_the_operator_api() -> None:
    assert not {"PodMonitor", "ServiceMonitor"} & {
        d["kind"] for d in render(*SHAPES["monitoring-without-operator"])
    }
    docs = render(*SHAPES["monitoring-with-operator"])
    labels = spec_labels(docs)
    pm = one(docs, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pm["spec"]["podMetricsEndpoints"] == [
        {"port": "v2proxy-http", "path": "/metrics", "interval": "30s"}
    ]
    sm = one(docs, "ServiceMonitor")
    assert (
        sm["spec"]["selector"]["matchLabels"].items()
        <= one(docs, "Service")["metadata"]["labels"].items()
    )
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]


def test_dashboard_configmap() -> None:
    cm = one(render(), "ConfigMap", "rel-v2proxy-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((ROOT / "config" / "grafana" / "v2proxy-dashboard.json").read_text())
    assert json.loads(cm["data"]["v2proxy-dashboard.json"]) == shipped
    titles = [p["title"] for p in shipped["panels"]]
    assert "Shared memory registered by clients" in titles
    assert "MindIE token timings (p50 / p99)" in titles
    assert "MindIE tokens generated" in titles


def test_helm_test_pod_sends_one_infer() -> None:
    pod = one(render(), "Pod", "rel-v2proxy-test-infer")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = pod["spec"]["containers"]
    assert c["env"] == [{"name": "URL", "value": "http://rel-v2proxy:9000/v2/models/simple/infer"}]
    compile(c["args"][0], "test-infer", "exec")  # the script is Python


# ------------------------------------------------------------------ the webhook


def webhook_parts(docs: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    mwc = one(docs, "MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["clientConfig"]["service"] == {
        "name": "rel-v2proxy-injector",
        "namespace": NS,
        "path": "/mutate",
        "port": 443,
    }
    assert hook["namespaceSelector"] == {"matchLabels": {"v2proxy.io/injection": "enabled"}}
    assert hook["rules"][0]["resources"] == ["pods"]
    assert hook["rules"][0]["operations"] == ["CREATE"]
    deploy = one(docs, "Deployment", "rel-v2proxy-injector")
    svc = one(docs, "Service", "rel-v2proxy-injector")
    pod = deploy["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    assert c["args"][0] == "inject"
    args = vars(parser().parse_args(c["args"]))
    assert args["port"] == c["ports"][0]["containerPort"]
    secret = by_name(pod["spec"]["volumes"], "tls")["secret"]["secretName"]
    assert secret == "rel-v2proxy-injector-tls"
    return hook, pod


def test_injector_with_chart_made_certificates() -> None:
    docs = render(*SHAPES["injector-helm-certs"])
    assert not [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rel-v2proxy"
    ]
    hook, _ = webhook_parts(docs)
    secret = one(docs, "Secret", "rel-v2proxy-injector-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"rel-v2proxy-injector.{NS}.svc" in names.get_values_for_type(x509.DNSName)


def test_injector_with_cert_manager() -> None:
    docs = render(*SHAPES["injector-cert-manager"])
    hook, _ = webhook_parts(docs)
    assert "caBundle" not in hook["clientConfig"]
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NS}/rel-v2proxy-injector"
    }
    cert = one(docs, "Certificate")
    assert cert["spec"]["secretName"] == "rel-v2proxy-injector-tls"
    assert f"rel-v2proxy-injector.{NS}.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"name": "rel-v2proxy-injector", "kind": "Issuer"}
    assert one(docs, "Issuer")["spec"] == {"selfSigned": {}}
    assert not [d for d in docs if d["kind"] == "Secret"]
    # without cert-manager's API the install stops with a clear line
    assert "needs cert-manager (API cert-manager.io/v1)" in refusal(
        *SHAPES["injector-cert-manager"][:2]
    )


def sidecar_defaults(docs: tuple[dict[str, Any], ...]) -> Any:
    cm = one(docs, "ConfigMap", "rel-v2proxy-injector")
    return load_defaults(yaml.safe_load(cm["data"]["sidecar.yaml"]))


@pytest.mark.parametrize(
    ("shape", "mode"), [("injector-helm-certs", "native"), ("injector-old-cluster", "classic")]
)
def test_injector_mode_from_cluster_version(shape: str, mode: str) -> None:
    assert sidecar_defaults(render(*SHAPES[shape])).mode == mode


def test_injected_sidecar_is_the_charts_sidecar() -> None:
    """The webhook (configured by the chart) injects the very container the chart renders."""
    chart = pod_spec(render(*SHAPES["sidecar-native"]))["initContainers"][0]
    defaults = sidecar_defaults(render(*SHAPES["injector-helm-certs"]))
    body = json.loads((Path(__file__).parent / "admission" / "review-triton.json").read_text())
    resp = review(body, defaults)["response"]
    pod = jsonpatch.apply_patch(
        body["request"]["object"], json.loads(base64.b64decode(resp["patch"]))
    )
    (injected,) = pod["spec"]["initContainers"]
    assert injected == chart


# ------------------------------------------------------------------ a chart that includes it


@pytest.fixture(scope="module")
def parent_chart(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("charts") / "model-server"
    shutil.copytree(PARENT, folder)
    shutil.copytree(CHART, folder / "charts" / "v2proxy")
    run(helm(), "lint", "--strict", str(folder))
    return str(folder)


@pytest.mark.parametrize(
    ("kube", "native"), [("1.33.0", True), ("1.29.0", True), ("1.28.0", False)]
)
def test_parent_chart_includes_the_sidecar(parent_chart: str, kube: str, native: bool) -> None:
    docs = render(
        f"--kube-version={kube}", "--set=v2proxy.proxy.mindie.model=ensemble", chart=parent_chart
    )
    assert_valid(docs)
    spec = pod_spec(docs, "rel-triton")
    if native:
        (side,) = spec["initContainers"]
        assert side["restartPolicy"] == "Always"
        assert [c["name"] for c in spec["containers"]] == ["triton"]
    else:
        assert "initContainers" not in spec
        assert [c["name"] for c in spec["containers"]] == ["triton", "v2proxy"]
        side = spec["containers"][1]
    assert {"name": "v2proxy-shm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    # the subchart's ConfigMap, under the name the sidecar mounts
    cm = one(docs, "ConfigMap")
    assert by_name(spec["volumes"], "v2proxy-config")["configMap"]["name"] == cm["metadata"]["name"]
    assert serve_args(side)["backend"] == "http://127.0.0.1:8000"
    assert spec["terminationGracePeriodSeconds"] == 40
    # the parent's own Deployment only: the subchart's is switched off
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == ["rel-triton"]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and Exists expressions) matches ``labels``."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "Exists"
        if e["key"] not in labels:
            return False
    return True


def test_proxy_and_injector_selectors_do_not_overlap() -> None:
    docs = render(*SHAPES["injector-with-proxy-and-monitors"])
    proxy = one(docs, "Deployment", "rel-v2proxy")
    injector = one(docs, "Deployment", "rel-v2proxy-injector")
    proxy_pod = proxy["spec"]["template"]["metadata"]["labels"]
    injector_pod = injector["spec"]["template"]["metadata"]["labels"]
    assert selects(proxy["spec"]["selector"], proxy_pod)
    assert not selects(proxy["spec"]["selector"], injector_pod)
    assert not selects(injector["spec"]["selector"], proxy_pod)
    svc = one(docs, "Service", "rel-v2proxy")
    assert not selects({"matchLabels": svc["spec"]["selector"]}, injector_pod)
    sm = one(docs, "ServiceMonitor")
    assert selects(sm["spec"]["selector"], svc["metadata"]["labels"])
    assert not selects(
        sm["spec"]["selector"], one(docs, "Service", "rel-v2proxy-injector")["metadata"]["labels"]
    )
    own = one(docs, "PodMonitor", "rel-v2proxy")
    assert selects(own["spec"]["selector"], proxy_pod)
    assert not selects(own["spec"]["selector"], injector_pod)
    # the injected pods, wherever they are: the webhook labels them
    injected = one(docs, "PodMonitor", "rel-v2proxy-injected")
    assert injected["spec"]["namespaceSelector"] == {"any": True}
    assert selects(injected["spec"]["selector"], {"app": "triton", "v2proxy.io/injected": "native"})
    assert not selects(injected["spec"]["selector"], proxy_pod)
    assert injected["spec"]["podMetricsEndpoints"][0]["port"] == "v2proxy-http"


def test_mindie_backend_accepted_by_v2proxy(tmp_path: Path) -> None:
    docs = render(*SHAPES["mindie-backend"])
    (tmp_path / "config.yaml").write_text(
        one(docs, "ConfigMap", "rel-v2proxy-config")["data"]["config.yaml"]
    )
    args = serve_args(pod_spec(docs)["initContainers"][0])
    args["config"] = str(tmp_path / "config.yaml")
    settings = load_settings(args, None, env={})
    assert (settings.backend.kind, settings.backend.url) == ("mindie", "127.0.0.1:1025")
    assert settings.mindie is not None and settings.mindie.model == "mindie"
