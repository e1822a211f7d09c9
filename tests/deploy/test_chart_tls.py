"""The chart's TLS values (tls.*): the Secrets mounted read-only, v2proxy's --tls-* and
--backend-* arguments pointing into them (and accepted by v2proxy with real certificate files
in their place), probes over HTTPS (a TCP check under mutual TLS, where kubelet has no client
certificate), the monitors scraping over HTTPS, the `helm test` pod speaking HTTPS; every
manifest valid (helm lint --strict, kubernetes-validate) and the schema refusing half settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chartlib import (
    assert_valid,
    by_name,
    one,
    pod_spec,
    refusal,
    render,
    serve_args,
)
from tests.deploy.deploytools import CHART, helm, run
from tests.tlspki import Pki, make_pki
from v2proxy.ops.config import load_settings
from v2proxy.ops.tls import BackendTls, ListenerTls

TLS = (
    "--set=tls.secretName=v2proxy-tls",
    "--set=proxy.backend=https://triton.models.svc:8443",
    "--set=tls.backend.secretName=triton-trust",
    "--set=tls.backend.clientCertificate=true",
)
MUTUAL_SIDECAR = (
    "--set=modelServer.enabled=true",
    "--set=proxy.backend=grpcs://localhost:8001",
    "--set=tls.secretName=v2proxy-tls",
    "--set=tls.clientAuth=true",
    "--set=tls.clientCAKey=clients.pem",
    "--set=tls.backend.secretName=triton-trust",
    "--set=monitoring.podMonitor.enabled=true",
    "--set=monitoring.serviceMonitor.enabled=true",
    "--api-versions=monitoring.coreos.com/v1",
    "--kube-version=1.33.0",
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _mounted(pki: Pki) -> dict[str, Path]:
    """What each mounted Secret key would hold, as files of the test's certificates."""
    return {
        "/etc/v2proxy-tls/tls.crt": pki.server.cert,
        "/etc/v2proxy-tls/tls.key": pki.server.key,
        "/etc/v2proxy-tls/clients.pem": pki.ca,
        "/etc/v2proxy-backend-tls/ca.crt": pki.ca,
        "/etc/v2proxy-backend-tls/tls.crt": pki.client.cert,
        "/etc/v2proxy-backend-tls/tls.key": pki.client.key,
    }


def _accepted(container: dict[str, Any], pki: Pki) -> Any:
    """`v2proxy serve` loads the container's arguments with the Secrets' files in place."""
    args = serve_args(container)
    files = _mounted(pki)
    for key in (
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "backend_ca",
        "backend_cert",
        "backend_key",
    ):
        if args.get(key) is not None:
            args[key] = str(files[args[key]])
    return load_settings(args, None, env={})


@pytest.mark.parametrize("shape", [TLS, MUTUAL_SIDECAR], ids=["tls", "mutual-sidecar"])
def test_tls_manifests_validate(shape: tuple[str, ...]) -> None:
    run(helm(), "lint", "--strict", str(CHART), *[a for a in shape if "api-versions" not in a])
    assert_valid(render(*shape))


def test_tls_standalone(pki: Pki) -> None:
    docs = render(*TLS)
    spec = pod_spec(docs)
    (c,) = spec["containers"]
    args = serve_args(c)
    assert (args["tls_cert"], args["tls_key"], args["tls_client_ca"]) == (
        "/etc/v2proxy-tls/tls.crt",
        "/etc/v2proxy-tls/tls.key",
        None,
    )
    assert (args["backend_ca"], args["backend_cert"], args["backend_key"]) == (
        "/etc/v2proxy-backend-tls/ca.crt",
        "/etc/v2proxy-backend-tls/tls.crt",
        "/etc/v2proxy-backend-tls/tls.key",
    )
    settings = _accepted(c, pki)
    assert settings.backend.kind == "https" and settings.backend.tls
    assert settings.tls == ListenerTls(str(pki.server.cert), str(pki.server.key))
    assert settings.backend_tls == BackendTls(
        str(pki.ca), str(pki.client.cert), str(pki.client.key)
    )
    for probe, path in (
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
        ("startupProbe", "/v2/health/live"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": "v2proxy-http", "scheme": "HTTPS"}
    assert by_name(spec["volumes"], "v2proxy-tls") == {
        "name": "v2proxy-tls",
        "secret": {"secretName": "v2proxy-tls"},
    }
    assert by_name(spec["volumes"], "v2proxy-backend-tls")["secret"] == {
        "secretName": "triton-trust"
    }
    assert {"name": "v2proxy-tls", "mountPath": "/etc/v2proxy-tls", "readOnly": True} in c[
        "volumeMounts"
    ]
    assert {
        "name": "v2proxy-backend-tls",
        "mountPath": "/etc/v2proxy-backend-tls",
        "readOnly": True,
    } in c["volumeMounts"]
    pod = one(docs, "Pod", "rel-v2proxy-test-infer")
    (t,) = pod["spec"]["containers"]
    assert t["env"] == [{"name": "URL", "value": "https://rel-v2proxy:9000/v2/models/simple/infer"}]
    assert "volumes" not in pod["spec"]
    compile(t["args"][0], "test-infer", "exec")


def test_tls_mutual_sidecar(pki: Pki) -> None:
    docs = render(*MUTUAL_SIDECAR)
    spec = pod_spec(docs)
    (side,) = spec["initContainers"]
    settings = _accepted(side, pki)
    assert settings.tls == ListenerTls(str(pki.server.cert), str(pki.server.key), str(pki.ca))
    assert settings.backend.kind == "grpc" and settings.backend.tls
    assert settings.backend_tls == BackendTls(str(pki.ca))
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert "httpGet" not in side[probe]
        assert side[probe]["tcpSocket"] == {"port": "v2proxy-http"}
    # the model server does not see v2proxy's keys
    (server,) = spec["containers"]
    assert all("tls" not in m["name"] for m in server.get("volumeMounts", []))
    tls_config = {
        "insecureSkipVerify": True,
        "cert": {"secret": {"name": "v2proxy-tls", "key": "tls.crt"}},
        "keySecret": {"name": "v2proxy-tls", "key": "tls.key"},
    }
    (endpoint,) = one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert (endpoint["scheme"], endpoint["tlsConfig"]) == ("https", tls_config)
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["scheme"], endpoint["tlsConfig"]) == ("https", tls_config)
    pod = one(docs, "Pod", "rel-v2proxy-test-infer")
    (t,) = pod["spec"]["containers"]
    assert {"name": "CLIENT_AUTH", "value": "1"} in t["env"]
    assert t["volumeMounts"] == [
        {"name": "v2proxy-tls", "mountPath": "/etc/v2proxy-tls", "readOnly": True}
    ]
    assert pod["spec"]["volumes"] == [
        {"name": "v2proxy-tls", "secret": {"secretName": "v2proxy-tls"}}
    ]


def test_no_tls_by_default() -> None:
    docs = render()
    (c,) = pod_spec(docs)["containers"]
    args = serve_args(c)
    assert all(args[k] is None for k in ("tls_cert", "tls_key", "backend_ca", "backend_cert"))
    assert "scheme" not in c["readinessProbe"]["httpGet"]
    assert not any("tls" in v["name"] for v in pod_spec(docs)["volumes"])


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("tls.clientAuth=true", "at '/tls/secretName': minLength: got 0, want 1"),
        (
            "tls.backend.clientCertificate=true",
            "at '/tls/backend/secretName': minLength: got 0, want 1",
        ),
        ("tls.secretName=Not_A_Name", "at '/tls/secretName': 'Not_A_Name' does not match"),
        ("tls.backend.caKey=a/b", "at '/tls/backend/caKey': 'a/b' does not match"),
    ],
)
def test_tls_schema_refuses(setting: str, message: str) -> None:
    stderr = refusal(f"--set={setting}")
    assert message in stderr, stderr
