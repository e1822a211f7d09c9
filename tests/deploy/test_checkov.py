"""checkov (pinned and installed by deploy/install_checkov.sh) over every manifest the chart
tests render and over pods the webhook patched: no failed check but those skipped in
checkov_skips.yaml, each skip with its reason.

The renders are those of test_pod_security (every shape of test_chart, among them the
standalone tier at scale with its HPA, PDB and NetworkPolicies and the webhook with its own
policy, and test_chart_tls's TLS shapes), each written to its own file; the injected pods are an
app pod that passes checkov on its own, before and after the webhook's patch (native and
classic, with the sidecar config the chart renders). checkov runs once per session over all of
them, in the background from the end of collection on (Scan). What the skips leave out for
v2proxy's own containers is asserted here instead."""

from __future__ import annotations

import base64
import copy
import dataclasses
import fnmatch
import json
import os
import re
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.deploy.chartlib import one, render
from tests.deploy.deploytools import checkov
from tests.deploy.test_pod_security import RENDERS, pod_specs
from v2proxy.inject.patch import review
from v2proxy.inject.settings import SidecarSettings, load_defaults

HERE = Path(__file__).parent
SKIPS_FILE = HERE / "checkov_skips.yaml"
#: a key of the skip list: a check, and optionally KIND/NAME-GLOB of the resources it is for
SKIP_KEY = re.compile(r"^(?P<check>CKV2?_K8S_[0-9]+)(?: (?P<kind>[A-Za-z]+)/(?P<name>\S+))?$")
#: the containers that are v2proxy (the proxy, the webhook, the helm test pod's client)
OWN_CONTAINERS = {"v2proxy", "injector", "infer"}


@dataclass(frozen=True)
class Skip:
    check: str
    why: str
    kind: str | None = None
    name: str | None = None

    def covers(self, finding: Finding) -> bool:
        if finding.check != self.check:
            return False
        if self.kind is None or self.name is None:
            return True
        return finding.kind == self.kind and fnmatch.fnmatchcase(finding.name, self.name)


@dataclass(frozen=True)
class Finding:
    """One result of one check on one resource (checkov's resource id: KIND.NAMESPACE.NAME)."""

    check: str
    title: str
    resource: str
    file: str

    @property
    def kind(self) -> str:
        return self.resource.split(".", 1)[0]

    @property
    def name(self) -> str:
        parts = self.resource.split(".", 2)
        return parts[2] if len(parts) == 3 else parts[-1]

    def __str__(self) -> str:
        return f"{self.check} {self.title!r}: {self.resource} in {self.file}"


@dataclass(frozen=True)
class Report:
    failed: list[Finding]
    passed: list[Finding]
    parsing_errors: list[str]
    files: set[str]  # the files written for checkov


def load_skips() -> list[Skip]:
    raw = yaml.safe_load(SKIPS_FILE.read_text())
    assert isinstance(raw, dict) and raw, SKIPS_FILE
    skips = []
    for key, why in raw.items():
        m = SKIP_KEY.match(str(key))
        assert m, f"{SKIPS_FILE.name}: '{key}' is not CHECK or CHECK KIND/NAME"
        skips.append(Skip(m["check"], str(why), m["kind"], m["name"]))
    return skips


# ------------------------------------------------------------------ the injected pods


def _clean_app_pod() -> dict[str, Any]:
    """review-triton.json's pod made to pass checkov by itself: its own settings (non-root,
    read-only root, seccomp, no service account token, requests and limits, probes, a digest)."""
    body = json.loads((HERE / "admission" / "review-triton.json").read_text())
    pod = body["request"]["object"]
    pod["metadata"]["name"] = "triton-7d9f8b6c5-x2v9k"
    spec = pod["spec"]
    spec["automountServiceAccountToken"] = False
    spec["volumes"] = [v for v in spec["volumes"] if not v["name"].startswith("kube-api-access")]
    spec["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (c,) = spec["containers"]
    c["image"] = "nvcr.io/nvidia/tritonserver@sha256:" + "0" * 64
    c["volumeMounts"] = []
    c["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    c["resources"] = {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
    }
    c["readinessProbe"] = {"httpGet": {"path": "/v2/health/ready", "port": "http"}}
    c["livenessProbe"] = {"httpGet": {"path": "/v2/health/live", "port": "http"}}
    return body


def _chart_sidecar() -> SidecarSettings:
    """The webhook's defaults as the chart configures them (its --sidecar-config)."""
    cm = one(render(*RENDERS["injector-helm-certs"]), "ConfigMap", "rel-v2proxy-injector")
    return load_defaults(yaml.safe_load(cm["data"]["sidecar.yaml"]))


def injected_pods() -> dict[str, dict[str, Any]]:
    """The clean app pod before injection, and after it in either mode (with the chart's sidecar
    config), and with the webhook's own defaults (``v2proxy inject`` without --sidecar-config)."""
    body = _clean_app_pod()
    pods = {"app-pod": copy.deepcopy(body["request"]["object"])}
    defaults = _chart_sidecar()
    shapes = {mode: dataclasses.replace(defaults, mode=mode) for mode in ("native", "classic")}
    shapes["own-defaults"] = SidecarSettings()
    for mode, sidecar in shapes.items():
        resp = review(copy.deepcopy(body), sidecar)["response"]
        ops = json.loads(base64.b64decode(resp["patch"]))
        pod = jsonpatch.apply_patch(body["request"]["object"], ops)
        containers = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
        assert "v2proxy" in [c["name"] for c in containers], mode
        pods[f"injected-{mode}"] = pod
    return pods


# ------------------------------------------------------------------ one checkov run


class Scan:
    """The session's one checkov run, in a thread: started by tests/deploy/conftest.py as soon
    as collection is done, so that its ~15-20 s (checkov's start, its graph over ~140 objects)
    overlap the tests before this module's instead of adding to the session; the ``report``
    fixture waits for it. ``stop`` ends the checkov process if it is still running."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkov")
        self._future: Future[Report] | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> Future[Report]:
        if self._future is None:
            self._future = self._pool.submit(self._run)
        return self._future

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self) -> Report:
        with tempfile.TemporaryDirectory(prefix="v2proxy-checkov-") as name:
            return self._scan(Path(name))

    def _scan(self, folder: Path) -> Report:
        tool = checkov()  # fails under make test when missing, skips by hand
        files = set()
        for shape, args in sorted(RENDERS.items()):
            # each shape as a release of its own name: checkov's graph checks join a
            # NetworkPolicy to the pods its selector matches, in any file and namespace, so the
            # labels (instance) must differ from shape to shape
            docs = render(*args, release=shape)
            (folder / f"{shape}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
            files.add(f"/{shape}.yaml")
        for name, pod in injected_pods().items():
            (folder / f"{name}.yaml").write_text(yaml.safe_dump(pod, sort_keys=False))
            files.add(f"/{name}.yaml")
        # --skip-download: no request to Prisma Cloud (guidelines); nothing leaves the machine
        command = [tool, "--directory", str(folder), "--framework", "kubernetes"]
        command += ["--skip-download", "--output", "json"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "CKV_", "PRISMA_"))}
        with self._lock:
            if self._stopped:
                pytest.skip("the session ended before checkov ran")
            self._proc = subprocess.Popen(
                command,
                cwd=folder,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        try:
            out, err = self._proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, err = self._proc.communicate()
        # 0: nothing failed, 1: something failed (judged below); anything else: checkov broke
        if self._proc.returncode not in (0, 1) or not out.strip().startswith(("{", "[")):
            pytest.fail(f"{' '.join(command)} exited {self._proc.returncode}:\n{out}\n{err}")
        return _report(out, files)


def _report(out: str, files: set[str]) -> Report:
    data = json.loads(out)
    failed: list[Finding] = []
    passed: list[Finding] = []
    errors: list[str] = []
    for result in data if isinstance(data, list) else [data]:
        assert result["check_type"] == "kubernetes", result["check_type"]
        for bucket, key in ((failed, "failed_checks"), (passed, "passed_checks")):
            bucket += [
                Finding(r["check_id"], r["check_name"], r["resource"], r["file_path"])
                for r in result["results"][key]
            ]
        errors += result["results"]["parsing_errors"]
    return Report(failed, passed, errors, files)


SCAN = Scan()


@pytest.fixture(scope="session")
def report() -> Report:
    return SCAN.start().result(timeout=300)


# ------------------------------------------------------------------ the verdict


def test_checkov_finds_nothing_but_the_skipped(report: Report) -> None:
    skips = load_skips()
    left = sorted({str(f) for f in report.failed if not any(s.covers(f) for s in skips)})
    assert left == [], (
        "checkov failed (fix the chart, or skip with a reason in checkov_skips.yaml):\n"
        + "\n".join(left)
    )


def test_every_skip_is_still_needed(report: Report) -> None:
    unused = [s for s in load_skips() if not any(s.covers(f) for f in report.failed)]
    assert unused == [], f"no finding needs these any more: remove them from {SKIPS_FILE.name}"


def test_skips_say_why_in_one_line() -> None:
    for skip in load_skips():
        assert skip.why.strip() and "\n" not in skip.why and len(skip.why) <= 200, skip


def test_checkov_read_every_render(report: Report) -> None:
    assert report.parsing_errors == []
    assert {f.file for f in report.passed + report.failed} == report.files


def test_network_policy_check_passes_where_the_chart_renders_them(report: Report) -> None:
    """CKV2_K8S_6 (every pod has a NetworkPolicy) is skipped because the policies are opt-in;
    where they are on, the pods they are for pass it."""

    def pods(findings: list[Finding], passed: bool) -> set[tuple[str, str, bool]]:
        # a pod's resource: Pod.NAMESPACE.NAME (a Deployment's: NAME.its labels)
        return {(f.file, f.name.split(".")[0], passed) for f in findings if f.check == "CKV2_K8S_6"}

    verdicts = pods(report.passed, True) | pods(report.failed, False)
    assert ("/standalone-at-scale.yaml", "standalone-at-scale-v2proxy", True) in verdicts
    assert ("/injector-network-policy.yaml", "injector-network-policy-v2proxy-injector", True) in (
        verdicts
    )
    # and the check does fail a pod no policy selects (the shape without one)
    assert ("/standalone.yaml", "standalone-v2proxy", False) in verdicts


def test_own_containers_do_what_the_skips_leave_unchecked() -> None:
    """The skips above cover the model server and the helm test pod; v2proxy's own containers
    (the proxy, the webhook, the injected sidecar) keep a read-only root, probes, requests."""
    specs = {
        f"{shape} {key}": spec
        for shape, args in RENDERS.items()
        for key, spec in pod_specs(render(*args)).items()
    }
    specs |= {name: pod["spec"] for name, pod in injected_pods().items()}
    checked = 0
    for where, spec in specs.items():
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            if c["name"] not in OWN_CONTAINERS:
                continue
            checked += 1
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (where, c["name"])
            assert c["resources"]["requests"]["cpu"], (where, c["name"])
            assert c["resources"]["limits"]["memory"], (where, c["name"])
            if c["name"] != "infer":
                assert "livenessProbe" in c and "readinessProbe" in c, (where, c["name"])
    assert checked > len(RENDERS)
