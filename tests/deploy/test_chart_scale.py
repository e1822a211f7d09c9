"""The standalone tier at scale (helm/v2proxy/examples/standalone-at-scale.yaml and the values
behind it): the HorizontalPodAutoscaler owns the replica count (the Deployment then sets none),
scales on CPU and on requests in flight, and names the Deployment; the PodDisruptionBudget, the
topology spread and both NetworkPolicies select exactly the pods they are for; the proxy's policy
lets clients reach its named ports and lets it out to the backend's ports (each of a comma list)
and DNS only; the webhook's lets the API server in and nothing out. The chart refuses half
settings with a line naming the value. Schema validation of these manifests for Kubernetes
1.29-1.33 is test_chart's (the shapes standalone-at-scale and injector-network-policy)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.deploy.chartlib import by_name, kinds, one, pod_spec, refusal, render, serve_args
from tests.deploy.test_chart import SHAPES, selects, spec_labels
from v2proxy.ops.config import load_settings

AT_SCALE = SHAPES["standalone-at-scale"]
DIGEST = "sha256:" + "ab" * 32


def _policy_ports(rule: dict[str, Any]) -> list[tuple[Any, str]]:
    return [(p["port"], p["protocol"]) for p in rule["ports"]]


def test_at_scale_renders_its_objects() -> None:
    docs = render(*AT_SCALE)
    assert kinds(docs) == [
        ("ConfigMap", "rel-v2proxy-dashboard"),
        ("Deployment", "rel-v2proxy"),
        ("HorizontalPodAutoscaler", "rel-v2proxy"),
        ("NetworkPolicy", "rel-v2proxy"),
        ("Pod", "rel-v2proxy-test-infer"),
        ("PodDisruptionBudget", "rel-v2proxy"),
        ("Service", "rel-v2proxy"),
    ]
    # every namespaced object names the release's namespace (helm template | kubectl apply)
    assert {d["metadata"]["namespace"] for d in docs} == {"serving"}


def test_headless_service_backend_is_accepted_by_v2proxy() -> None:
    (c,) = pod_spec(render(*AT_SCALE))["containers"]
    settings = load_settings(serve_args(c), None, env={})
    assert (settings.backend.kind, settings.backend.url) == (
        "grpc",
        "triton-headless.models.svc:8001",
    )


def test_hpa_owns_the_replica_count() -> None:
    docs = render(*AT_SCALE)
    deploy = one(docs, "Deployment")
    assert "replicas" not in deploy["spec"]
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deploy["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 70},
            },
        },
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "v2proxy_requests_in_flight"},
                "target": {"type": "AverageValue", "averageValue": "16"},
            },
        },
    ]
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 300}}
    # the CPU target is a percentage of this request
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["requests"]["cpu"] == "500m"


def test_without_hpa_the_deployment_sets_the_count() -> None:
    docs = render("--set=deployment.replicaCount=3")
    assert one(docs, "Deployment")["spec"]["replicas"] == 3
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]


@pytest.mark.parametrize(
    ("settings", "metrics"),
    [
        (("--set=autoscaling.enabled=true",), ["Resource"]),
        (
            (
                "--set=autoscaling.enabled=true",
                "--set=autoscaling.targetCPUUtilizationPercentage=0",
                "--set=autoscaling.requestsInFlight.enabled=true",
                "--set=autoscaling.requestsInFlight.averageValue=500m",
                "--set=autoscaling.requestsInFlight.selector.matchLabels.frontend=grpc",
            ),
            ["Pods"],
        ),
    ],
    ids=["cpu-only", "in-flight-only"],
)
def test_hpa_metrics_follow_the_values(settings: tuple[str, ...], metrics: list[str]) -> None:
    hpa = one(render(*settings), "HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == metrics
    if metrics == ["Pods"]:
        assert hpa["spec"]["metrics"][0]["pods"] == {
            "metric": {
                "name": "v2proxy_requests_in_flight",
                "selector": {"matchLabels": {"frontend": "grpc"}},
            },
            "target": {"type": "AverageValue", "averageValue": "500m"},
        }


def test_pdb_selects_the_proxy_pods() -> None:
    docs = render(*AT_SCALE)
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert selects(pdb["spec"]["selector"], spec_labels(docs))
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]


@pytest.mark.parametrize(
    ("settings", "spec"),
    [
        ((), {"minAvailable": 1}),
        (("--set=podDisruptionBudget.minAvailable=50%",), {"minAvailable": "50%"}),
        (("--set=podDisruptionBudget.maxUnavailable=25%",), {"maxUnavailable": "25%"}),
        (("--set=podDisruptionBudget.maxUnavailable=0",), {"maxUnavailable": 0}),
    ],
    ids=["default", "min-percent", "max-percent", "max-zero"],
)
def test_pdb_takes_one_bound(settings: tuple[str, ...], spec: dict[str, Any]) -> None:
    pdb = one(render("--set=podDisruptionBudget.enabled=true", *settings), "PodDisruptionBudget")
    assert {k: v for k, v in pdb["spec"].items() if k != "selector"} == spec


def test_topology_spread_selects_the_proxy_pods() -> None:
    docs = render(*AT_SCALE)
    spec = pod_spec(docs)
    constraints = spec["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"]) for c in constraints] == [
        ("kubernetes.io/hostname", "ScheduleAnyway", 1),
        ("topology.kubernetes.io/zone", "ScheduleAnyway", 1),
    ]
    for c in constraints:
        assert selects(c["labelSelector"], spec_labels(docs))
    # opt-in: off by default; on, the default spreads over nodes as a preference
    assert "topologySpreadConstraints" not in pod_spec(render())
    (default,) = pod_spec(render("--set=deployment.topologySpread.enabled=true"))[
        "topologySpreadConstraints"
    ]
    assert {k: v for k, v in default.items() if k != "labelSelector"} == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
    }


def test_topology_spread_keeps_a_given_selector() -> None:
    values = {
        "deployment": {
            "topologySpread": {
                "enabled": True,
                "constraints": [
                    {
                        "maxSkew": 2,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"tier": "edge"}},
                        "matchLabelKeys": ["pod-template-hash"],
                    }
                ],
            }
        }
    }
    spread = values["deployment"]["topologySpread"]
    (c,) = pod_spec(render(f"--set-json=deployment.topologySpread={_json(spread)}"))[
        "topologySpreadConstraints"
    ]
    assert c == values["deployment"]["topologySpread"]["constraints"][0]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def test_proxy_network_policy() -> None:
    docs = render(*AT_SCALE)
    policy = one(docs, "NetworkPolicy")
    spec = policy["spec"]
    assert selects(spec["podSelector"], spec_labels(docs))
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    clients, scrapers = spec["ingress"]
    (c,) = pod_spec(docs)["containers"]
    assert _policy_ports(clients) == [("v2proxy-http", "TCP"), ("v2proxy-grpc", "TCP")]
    for name, _ in _policy_ports(clients):
        by_name(c["ports"], name)  # the container has the named port
    assert clients["from"] == [
        {"podSelector": {}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}},
    ]
    assert _policy_ports(scrapers) == [("v2proxy-http", "TCP")]
    assert scrapers["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
    dns, backend = spec["egress"]
    assert _policy_ports(dns) == [(53, "UDP"), (53, "TCP")] and "to" not in dns
    assert _policy_ports(backend) == [(8001, "TCP")]
    assert backend["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "models"}},
            "podSelector": {"matchLabels": {"app": "triton"}},
        }
    ]


@pytest.mark.parametrize(
    ("settings", "ports"),
    [
        (("--set=proxy.backend=http://triton.models.svc:8000",), [8000]),
        # several endpoints of one backend: each port once
        (
            ("--set=proxy.backend=http://10.0.0.1:8000\\,10.0.0.2:8000\\,10.0.0.3:8010/",),
            [8000, 8010],
        ),
        (("--set=proxy.backend=grpcs://triton:8443",), [8443]),
        # a Service mapping 8001 to the pods' 9001: the policy sees the pod's port
        (
            ("--set=proxy.backend=grpc://triton:8001", "--set=networkPolicy.backendPorts={9001}"),
            [9001],
        ),
        # the builtin models: no backend, no egress but DNS
        ((), []),
    ],
    ids=["one", "comma-list", "tls", "ports-given", "builtin"],
)
def test_proxy_egress_reaches_the_backends_ports(
    settings: tuple[str, ...], ports: list[int]
) -> None:
    spec = one(render("--set=networkPolicy.enabled=true", *settings), "NetworkPolicy")["spec"]
    rules = spec["egress"]
    assert _policy_ports(rules[0]) == [(53, "UDP"), (53, "TCP")]
    assert [p for rule in rules[1:] for p, _ in _policy_ports(rule)] == ports
    # the default peers: the release's namespace; no metrics rule unless asked for
    (clients,) = spec["ingress"]
    assert clients["from"] == [{"podSelector": {}}]


def test_proxy_network_policy_extra_egress_and_dns_peers() -> None:
    dns_peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    extra = {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 4317}]}
    spec = one(
        render(
            "--set=networkPolicy.enabled=true",
            f"--set-json=networkPolicy.dnsTo=[{_json(dns_peer)}]",
            f"--set-json=networkPolicy.extraEgress=[{_json(extra)}]",
        ),
        "NetworkPolicy",
    )["spec"]
    assert spec["egress"] == [
        {
            "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
            "to": [dns_peer],
        },
        extra,
    ]


def test_injector_network_policy() -> None:
    docs = render(*SHAPES["injector-network-policy"])
    policy = one(docs, "NetworkPolicy", "rel-v2proxy-injector")
    pod = one(docs, "Deployment", "rel-v2proxy-injector")["spec"]["template"]
    assert selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = policy["spec"]["ingress"]
    assert _policy_ports(rule) == [("webhook", "TCP")] and "from" not in rule
    by_name(pod["spec"]["containers"][0]["ports"], "webhook")
    assert policy["spec"]["egress"] == []  # the webhook connects nowhere
    # off by default, and the proxy's policy is a separate switch
    assert not [d for d in render(*SHAPES["injector-helm-certs"]) if d["kind"] == "NetworkPolicy"]


def test_image_digest_pins_every_v2proxy_image() -> None:
    image = f"registry.example.com/v2proxy@{DIGEST}"
    docs = render(
        "--set=image.repository=registry.example.com/v2proxy",
        f"--set=image.digest={DIGEST}",
        "--set=injector.enabled=true",
    )
    (proxy,) = pod_spec(docs)["containers"]
    (webhook,) = pod_spec(docs, "rel-v2proxy-injector")["containers"]
    (test,) = one(docs, "Pod")["spec"]["containers"]
    sidecar = yaml.safe_load(one(docs, "ConfigMap", "rel-v2proxy-injector")["data"]["sidecar.yaml"])
    assert [proxy["image"], webhook["image"], test["image"], sidecar["image"]] == [image] * 4


def test_sidecar_model_server_has_probes_and_resources() -> None:
    spec = pod_spec(render(*SHAPES["sidecar-native"]))
    (server,) = spec["containers"]
    assert server["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert server["startupProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    # loading the models: 30 min before liveness may restart the server
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 1800
    by_name(server["ports"], "http")
    assert server["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "8Gi"},
    }


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ("autoscaling.enabled=true", "autoscaling.minReplicas=5", "autoscaling.maxReplicas=3"),
            "autoscaling.minReplicas (5) is above autoscaling.maxReplicas (3)",
        ),
        (
            ("autoscaling.enabled=true", "autoscaling.targetCPUUtilizationPercentage=0"),
            "autoscaling.enabled needs a metric",
        ),
        (
            ("autoscaling.enabled=true", "proxy.resources.requests=null"),
            "autoscaling.targetCPUUtilizationPercentage needs proxy.resources.requests.cpu",
        ),
        (
            ("autoscaling.enabled=true", "modelServer.enabled=true", "modelServer.resources=null"),
            "needs modelServer.resources.requests.cpu",
        ),
        (
            (
                "podDisruptionBudget.enabled=true",
                "podDisruptionBudget.minAvailable=",
                "podDisruptionBudget.maxUnavailable=",
            ),
            "podDisruptionBudget.enabled needs podDisruptionBudget.minAvailable or",
        ),
        (
            ("networkPolicy.enabled=true", "modelServer.enabled=true"),
            "networkPolicy.enabled is for the standalone shape",
        ),
        (("podDisruptionBudget.maxUnavailable=lots",), "at '/podDisruptionBudget/maxUnavailable'"),
        (("autoscaling.minReplicas=0",), "at '/autoscaling/minReplicas': minimum: got 0, want 1"),
        (("autoscaling.requestsInFlight.averageValue=many",), "at '/autoscaling/requestsInFlight"),
        (
            ("deployment.topologySpread.constraints[0].whenUnsatisfiable=Sometimes",),
            "at '/deployment/topologySpread/constraints/0/whenUnsatisfiable'",
        ),
        (("networkPolicy.backendPorts={70000}",), "at '/networkPolicy/backendPorts/0'"),
        (("networkPolicy.from[0].pods=all",), "additional properties 'pods' not allowed"),
        (("injector.networkPolicy.egress=true",), "additional properties 'egress' not allowed"),
        (("image.digest=latest",), "at '/image/digest': 'latest' does not match"),
        (("proxy.backend=mindie://a:1025\\,b:1025",), "at '/proxy/backend'"),
    ],
)
def test_chart_refuses_half_settings(settings: tuple[str, ...], message: str) -> None:
    stderr = refusal(*[f"--set={s}" for s in settings])
    assert message in stderr, stderr
